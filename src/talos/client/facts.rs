//! What a node's hardware looks like: its disks (the storage service and COSI
//! `Disks.block.talos.dev`) and its system information.

use super::call::*;
use super::*;
use crate::talos::api::storage;
use crate::talos::api::talos::resource::definitions::hardware;
use crate::talos::error::{Rpc, TalosError};

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
