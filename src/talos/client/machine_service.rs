//! The MachineService calls: version, apply, bootstrap, kubeconfig, reset, reboot, the
//! service list and etcd membership.

use std::time::Duration;

use super::call::*;
use super::*;
use crate::talos::api::machine::{
    self, ApplyConfigurationRequest, BootstrapRequest, EtcdMemberListRequest, RebootRequest,
    ResetPartitionSpec, ResetRequest, apply_configuration_request, reboot_request, reset_request,
};
use crate::talos::archive;
use crate::talos::error::{Rpc, TalosError};

impl TalosClient {
    /// `Version`: the Talos version the node runs. Works in maintenance mode, so it doubles as
    /// the maintenance probe.
    pub async fn version(&self) -> Result<machine::Version, TalosError> {
        self.unary(Rpc::Version, self.machine(), (), |mut c, r| async move {
            c.version(r).await
        })
        .await
    }

    /// `ApplyConfiguration` with mode AUTO (never the zero value REBOOT, which Talos v1.14
    /// refuses on configured nodes) and no dry run. Made exactly once: a lost reply does not
    /// mean the config was not applied.
    pub async fn apply_configuration(&self, config: &[u8]) -> Result<ApplyOutcome, TalosError> {
        let req = ApplyConfigurationRequest {
            data: config.to_vec(),
            mode: apply_configuration_request::Mode::Auto as i32,
            dry_run: false,
            try_mode_timeout: None,
        };
        let entry = self
            .unary(
                Rpc::ApplyConfiguration,
                self.machine(),
                req,
                |mut c, r| async move { c.apply_configuration(r).await },
            )
            .await?;
        Ok(ApplyOutcome {
            mode: apply_configuration_request::Mode::try_from(entry.mode).ok(),
            mode_details: entry.mode_details,
            warnings: entry.warnings,
        })
    }

    /// `ApplyConfiguration` on a configured node with an explicit mode, optionally as a dry
    /// run (the node answers with its own diff in `mode_details` and changes nothing) and a
    /// `try_mode_timeout` for TRY. Made exactly once, as [`Self::apply_configuration`].
    pub(crate) async fn apply_configuration_with(
        &self,
        config: &[u8],
        mode: apply_configuration_request::Mode,
        dry_run: bool,
        try_timeout: Option<Duration>,
    ) -> Result<ApplyOutcome, TalosError> {
        let req = ApplyConfigurationRequest {
            data: config.to_vec(),
            mode: mode as i32,
            dry_run,
            try_mode_timeout: try_timeout.map(|d| prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
        };
        let entry = self
            .unary(
                Rpc::ApplyConfiguration,
                self.machine(),
                req,
                |mut c, r| async move { c.apply_configuration(r).await },
            )
            .await?;
        Ok(ApplyOutcome {
            mode: apply_configuration_request::Mode::try_from(entry.mode).ok(),
            mode_details: entry.mode_details,
            warnings: entry.warnings,
        })
    }

    /// `Bootstrap`: start etcd on this (first control-plane) node. Made exactly once;
    /// a second call answers [`TalosError::AlreadyBootstrapped`], which callers treat as done.
    pub async fn bootstrap(&self) -> Result<(), TalosError> {
        let req = BootstrapRequest::default();
        self.unary(Rpc::Bootstrap, self.machine(), req, |mut c, r| async move {
            c.bootstrap(r).await
        })
        .await?;
        Ok(())
    }

    /// `Kubeconfig`: reads the stream to the end under one deadline, joins the chunks and
    /// unpacks the `kubeconfig` file from the `.tar.gz` Talos sends. Each call mints a new
    /// client certificate on the node, so repeating it is harmless.
    pub async fn kubeconfig(&self) -> Result<Vec<u8>, TalosError> {
        let rpc = Rpc::Kubeconfig;
        let d = self.deadlines.kubeconfig;
        let chunks = self
            .streamed(
                rpc,
                d,
                self.machine(),
                (),
                |mut c, r| async move { c.kubeconfig(r).await },
                collect_data,
            )
            .await?;
        let ctx = self.ctx(rpc, d);
        let chunks = check_entries(chunks, &ctx)?;
        let bytes: Vec<u8> = chunks.into_iter().flat_map(|c| c.bytes).collect();
        archive::kubeconfig_from_archive(&bytes).map_err(|e| malformed(&ctx, &e.to_string()))
    }

    /// `Reset`: wipe the STATE and EPHEMERAL volumes (config and etcd/kubelet data; the node
    /// comes back in maintenance mode), then reboot (`reboot = true`) or power off.
    /// `graceful` makes the node leave etcd first; use false for a broken or one-node
    /// cluster. Made exactly once.
    pub async fn reset(&self, graceful: bool, reboot: bool) -> Result<(), TalosError> {
        let req = ResetRequest {
            graceful,
            reboot,
            system_partitions_to_wipe: ["STATE", "EPHEMERAL"]
                .into_iter()
                .map(|label| ResetPartitionSpec {
                    label: label.to_owned(),
                    wipe: true,
                })
                .collect(),
            user_disks_to_wipe: Vec::new(),
            // Only the listed system volumes: never touch user disks.
            mode: reset_request::WipeMode::SystemDisk as i32,
        };
        self.unary(Rpc::Reset, self.machine(), req, |mut c, r| async move {
            c.reset(r).await
        })
        .await?;
        Ok(())
    }

    /// `Reboot` (default mode: graceful). Made exactly once.
    pub async fn reboot(&self) -> Result<(), TalosError> {
        let req = RebootRequest {
            mode: reboot_request::Mode::Default as i32,
        };
        self.unary(Rpc::Reboot, self.machine(), req, |mut c, r| async move {
            c.reboot(r).await
        })
        .await?;
        Ok(())
    }

    /// `ServiceList`: the node's services and their health.
    pub async fn service_list(&self) -> Result<Vec<machine::ServiceInfo>, TalosError> {
        let entry = self
            .unary(
                Rpc::ServiceList,
                self.machine(),
                (),
                |mut c, r| async move { c.service_list(r).await },
            )
            .await?;
        Ok(entry.services)
    }

    /// `EtcdMemberList` (control planes only): the etcd members this node sees.
    pub async fn etcd_member_list(&self) -> Result<Vec<machine::EtcdMember>, TalosError> {
        let req = EtcdMemberListRequest { query_local: false };
        let entry = self
            .unary(
                Rpc::EtcdMemberList,
                self.machine(),
                req,
                |mut c, r| async move { c.etcd_member_list(r).await },
            )
            .await?;
        Ok(entry.members)
    }
}
