//! What a node's hardware looks like: its disks (the storage service and COSI
//! `Disks.block.talos.dev`) and its system information.

use super::call::*;
use super::*;
use crate::talos::api::storage;
use crate::talos::api::talos::resource::definitions::{hardware, runtime};
use crate::talos::error::{Rpc, TalosError};

/// The COSI type of the security state resource (`SecurityStateType`, siderolabs/talos v1.14.0-rc.1
/// `pkg/machinery/resources/runtime/security_status.go`).
pub const SECURITY_STATE_TYPE: &str = "SecurityStates.talos.dev";
/// Its one resource ID (`SecurityStateID`).
pub const SECURITY_STATE_ID: &str = "securitystate";

impl TalosClient {
    /// `storage.Disks`: the node's disks (legacy API, served in maintenance mode too). Each
    /// `device_name` is the full path (`/dev/sda`): storaged sets it to
    /// `filepath.Join("/dev", id)` (siderolabs/talos v1.13.9 `internal/app/storaged/server.go`).
    pub async fn disks(&self) -> Result<Vec<storage::Disk>, TalosError> {
        let entry = self
            .unary(Rpc::Disks, self.storage(), (), |mut c, r| async move {
                c.disks(r).await
            })
            .await?;
        Ok(entry.disks)
    }

    /// COSI `hardware/SystemInformations.hardware.talos.dev/systeminformation`: SMBIOS facts
    /// (the system UUID identifies a machine across reinstalls). `None` when the node has no
    /// such resource: on a machine without SMBIOS tables Talos never creates it
    /// (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/hardware/system.go`:
    /// the controller fails on `GetSMBIOSInfo`), and COSI answers NotFound.
    pub async fn system_information(
        &self,
    ) -> Result<Option<hardware::SystemInformationSpec>, TalosError> {
        let res = match self
            .cosi_get(
                "hardware",
                "SystemInformations.hardware.talos.dev",
                "systeminformation",
            )
            .await
        {
            Ok(r) => r,
            Err(TalosError::Remote {
                code: tonic::Code::NotFound,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let ctx = self.ctx(Rpc::CosiGet, self.deadlines.call);
        decode_spec(&res, &ctx).map(Some)
    }

    /// COSI `runtime/SecurityStates.talos.dev/securitystate`: whether the node booted with
    /// Secure Boot enforced, from a UKI, and the fingerprint of the PCR signing key the UKI
    /// carried. The type is `SecurityStates.talos.dev` (no `runtime.` part; siderolabs/talos
    /// v1.13.9 and v1.14.0-rc.1 `pkg/machinery/resources/runtime/security_status.go`), in the
    /// `runtime` namespace. Not sensitive (its definition sets no `Sensitivity`), so a
    /// maintenance client (`os:reader`) may read it (`internal/app/resources/access.go`).
    /// `None` on NotFound: `runtime.SecurityStateController`
    /// (`internal/app/machined/pkg/controllers/runtime/security_state.go`) creates it once,
    /// after the `machined` service is up, so a node answering very early may not have it yet.
    pub async fn security_state(&self) -> Result<Option<runtime::SecurityStateSpec>, TalosError> {
        let res = match self
            .cosi_get("runtime", SECURITY_STATE_TYPE, SECURITY_STATE_ID)
            .await
        {
            Ok(r) => r,
            Err(TalosError::Remote {
                code: tonic::Code::NotFound,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let ctx = self.ctx(Rpc::CosiGet, self.deadlines.call);
        decode_spec(&res, &ctx).map(Some)
    }

    /// COSI `runtime/Disks.block.talos.dev`: the disks with the fields the disk selector
    /// matches on (transport, rotational, wwid, ...).
    pub async fn cosi_disks(&self) -> Result<Vec<CosiDisk>, TalosError> {
        let resources = self.cosi_list("runtime", "Disks.block.talos.dev").await?;
        let ctx = self.ctx(Rpc::CosiList, self.deadlines.call);
        resources
            .iter()
            .map(|r| {
                Ok(CosiDisk {
                    id: r
                        .metadata
                        .as_ref()
                        .map(|m| m.id.clone())
                        .unwrap_or_default(),
                    spec: decode_spec(r, &ctx)?,
                })
            })
            .collect()
    }
}
