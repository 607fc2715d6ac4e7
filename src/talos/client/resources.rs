//! COSI resource reads: one resource or a list, the machine's status, its configs and type,
//! and the failed runtime sequences from its events.

use std::time::Duration;

use prost::Message;

use super::call::*;
use super::*;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine;
use crate::talos::api::talos::resource::definitions::runtime;
use crate::talos::error::{Rpc, TalosError};

impl TalosClient {
    /// COSI `State.Get` of one resource. `NotFound` comes back as `Remote { code: NotFound }`.
    pub async fn cosi_get(
        &self,
        namespace: &str,
        kind: &str,
        id: &str,
    ) -> Result<cosi::Resource, TalosError> {
        let req = cosi::GetRequest {
            namespace: namespace.to_owned(),
            r#type: kind.to_owned(),
            id: id.to_owned(),
            options: Some(cosi::GetOptions {}),
        };
        self.unary(Rpc::CosiGet, self.cosi(), req, |mut c, r| async move {
            c.get(r).await
        })
        .await
    }

    /// COSI `State.List` of every resource of a type.
    pub(crate) async fn cosi_list(
        &self,
        namespace: &str,
        kind: &str,
    ) -> Result<Vec<cosi::Resource>, TalosError> {
        let req = cosi::ListRequest {
            namespace: namespace.to_owned(),
            r#type: kind.to_owned(),
            options: Some(cosi::ListOptions::default()),
        };
        self.streamed(
            Rpc::CosiList,
            self.deadlines.call,
            self.cosi(),
            req,
            |mut c, r| async move { c.list(r).await },
            |mut stream| async move {
                let mut out = Vec::new();
                while let Some(item) = stream.message().await? {
                    if let Some(r) = item.resource {
                        out.push(r);
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    /// COSI `runtime/MachineStatuses.runtime.talos.dev/machine`: the machine's stage
    /// (booting, installing, maintenance, running, rebooting, resetting, ...) and readiness,
    /// as Talos's `runtime.MachineStatusController` sets them from its sequence, phase and
    /// task events (siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/controllers/runtime/machine_status.go`). Served in
    /// maintenance mode and configured alike.
    pub(crate) async fn machine_status(&self) -> Result<runtime::MachineStatusSpec, TalosError> {
        let res = self
            .cosi_get("runtime", "MachineStatuses.runtime.talos.dev", "machine")
            .await?;
        let ctx = self.ctx(Rpc::CosiGet, self.deadlines.call);
        decode_spec(&res, &ctx)
    }

    /// The failed runtime sequences of the node's current boot, oldest first, from `Events`
    /// with every past event (`tail_events = -1`). A failed sequence is published as a
    /// `SequenceEvent` with action NOOP and an error (code FATAL, message `sequence failed:
    /// ...`) by the sequencer (siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_controller.go`, `Run`); LOCKED and
    /// CANCELED errors are not failures (machined ignores them too, `internal/app/machined/main.go`).
    /// The stream never ends by itself (it keeps watching), so it is read until `idle` passes
    /// without a new event, under the call deadline.
    pub(crate) async fn sequence_failures(
        &self,
        idle: Duration,
    ) -> Result<Vec<SequenceFailure>, TalosError> {
        let req = machine::EventsRequest {
            tail_events: -1,
            tail_id: String::new(),
            tail_seconds: 0,
            with_actor_id: String::new(),
        };
        self.streamed(
            Rpc::Events,
            self.deadlines.call,
            self.machine(),
            req,
            |mut c, r| async move { c.events(r).await },
            |mut stream| async move {
                let mut out = Vec::new();
                while let Ok(next) = tokio::time::timeout(idle, stream.message()).await {
                    let Some(ev) = next? else { break };
                    let Some(any) = ev.data else { continue };
                    if any.type_url != "talos/runtime/machine.SequenceEvent" {
                        continue;
                    }
                    let Ok(seq) = machine::SequenceEvent::decode(any.value.as_slice()) else {
                        continue;
                    };
                    if let Some(err) = seq.error
                        && err.code == crate::talos::api::common::Code::Fatal as i32
                    {
                        out.push(SequenceFailure {
                            sequence: seq.sequence,
                            message: err.message,
                        });
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    /// The config the node runs: COSI `MachineConfigs.config.talos.dev` `v1alpha1` in
    /// namespace `config` (siderolabs/talos v1.13.9
    /// `pkg/machinery/resources/config/machine_config.go`), from the spec's
    /// `yaml_marshalled` (field 1), else the YAML spec.
    pub async fn machine_config(&self) -> Result<String, TalosError> {
        self.machine_config_id("v1alpha1").await
    }

    /// One `MachineConfigs.config.talos.dev` resource: `v1alpha1` (active) or `persistent`
    /// (on STATE, loaded at the next boot; differs after a staged apply).
    pub(crate) async fn machine_config_id(&self, id: &str) -> Result<String, TalosError> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct MachineConfigSpec {
            #[prost(bytes = "vec", tag = "1")]
            yaml_marshalled: Vec<u8>,
        }
        let r = self
            .cosi_get("config", "MachineConfigs.config.talos.dev", id)
            .await?;
        let spec = r.spec.unwrap_or_default();
        match <MachineConfigSpec as prost::Message>::decode(spec.proto_spec.as_slice()) {
            Ok(s) if !s.yaml_marshalled.is_empty() => {
                Ok(String::from_utf8_lossy(&s.yaml_marshalled).into_owned())
            }
            _ => Ok(spec.yaml_spec),
        }
    }

    /// COSI `config/MachineTypes.config.talos.dev/machine-type` (siderolabs/talos v1.13.9
    /// `pkg/machinery/resources/config/machine_type.go`; not sensitive, so a maintenance
    /// client may read it): `unknown` until the node's active config has a machine section,
    /// then its type. It is the one thing a maintenance client can read that tells whether a
    /// config has landed before apid leaves maintenance mode (the `MachineType` controller
    /// follows the active config). The spec is `MachineTypeSpec { MachineType machine_type =
    /// 1 }` (`api/resource/config/config.proto`); the YAML spec is the type's name.
    pub async fn machine_type(&self) -> Result<String, TalosError> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct MachineTypeSpec {
            #[prost(int32, tag = "1")]
            machine_type: i32,
        }
        let r = self
            .cosi_get("config", "MachineTypes.config.talos.dev", "machine-type")
            .await?;
        let spec = r.spec.unwrap_or_default();
        let by_number = <MachineTypeSpec as prost::Message>::decode(spec.proto_spec.as_slice())
            .ok()
            .and_then(|s| match s.machine_type {
                0 => Some("unknown"),
                1 => Some("init"),
                2 => Some("controlplane"),
                3 => Some("worker"),
                _ => None,
            });
        Ok(match by_number {
            Some(t) if !spec.proto_spec.is_empty() => t.to_owned(),
            _ => spec.yaml_spec.trim().to_owned(),
        })
    }
}
