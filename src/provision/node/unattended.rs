//! What Talos v1.14's `UnattendedInstallStatus` tells the install watch. On v1.14 a config with
//! `UnattendedInstallConfig` installs through `UnattendedInstallController`, not the install
//! sequence, so neither machine stage `installing` nor a failed `install` sequence ever shows:
//! a failed install is phase `failed` (with the installer's error, the controller retrying),
//! a selector that matches nothing is phase `pending` with "no disk matched the selector".
//!
//! Upstream (siderolabs/talos v1.14.0-rc.1): `pkg/machinery/resources/runtime/
//! unattended_install_status.go` (namespace `runtime`, type
//! `UnattendedInstallStatuses.runtime.talos.dev`, ID `unattended-install`; NotFound without
//! the document), spec `UnattendedInstallStatusSpec { string image = 1;
//! RuntimeUnattendedInstallPhase phase = 2; string error = 3; }`
//! (`api/resource/definitions/runtime/runtime.proto`), phases pending 0, installing 1,
//! installed 2, waiting-for-reboot 3, failed 4 (`api/resource/definitions/enums/enums.proto`);
//! `internal/app/machined/pkg/controllers/runtime/unattended_install.go` sets them.

use prost::Message;

use crate::provision::core::Outcome;
use crate::talos::TalosClient;

/// `UnattendedInstallStatusSpec`, the phase as its number (talboot's protos predate it).
#[derive(Clone, PartialEq, prost::Message)]
struct UnattendedInstallStatusSpec {
    #[prost(string, tag = "1")]
    image: String,
    #[prost(int32, tag = "2")]
    phase: i32,
    #[prost(string, tag = "3")]
    error: String,
}

const PHASE_PENDING: i32 = 0;
const PHASE_FAILED: i32 = 4;

/// What the status says that the watch acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Unattended {
    /// Phase `failed`: the install failed with this error.
    Failed(String),
    /// Phase `pending` with this reason (e.g. "no disk matched the selector").
    Pending(String),
}

/// Whether the node's Talos has the resource at all (v1.14 and later).
fn has_status(tag: &str) -> bool {
    tag.parse::<crate::inventory::Version>()
        .is_ok_and(|v| (v.0.major, v.0.minor) >= (1, 14))
}

/// What to make of a status resource's spec: failed, pending with a reason, or nothing to
/// act on (installing, installed, waiting for its reboot, or not decodable).
fn judge(proto_spec: &[u8]) -> Option<Unattended> {
    let spec = UnattendedInstallStatusSpec::decode(proto_spec).ok()?;
    match spec.phase {
        PHASE_FAILED => Some(Unattended::Failed(spec.error)),
        PHASE_PENDING if !spec.error.is_empty() => Some(Unattended::Pending(spec.error)),
        _ => None,
    }
}

/// The node's unattended install status, when it says something to act on. Absent (a
/// config with `.machine.install`) or unreadable is None: the machine stage still decides.
async fn unattended_install(client: &TalosClient) -> Option<Unattended> {
    let res = client
        .cosi_get(
            "runtime",
            "UnattendedInstallStatuses.runtime.talos.dev",
            "unattended-install",
        )
        .await
        .ok()?;
    judge(&res.spec?.proto_spec)
}

/// The install watch's outcome for a node that does not run yet, in machine stage `stage`:
/// failed or pending as its unattended install status says (read only from a Talos that has
/// it, `tag` v1.14 or later), else the stage.
pub(super) async fn outcome(client: &TalosClient, tag: &str, stage: &str) -> Outcome {
    if has_status(tag) {
        match unattended_install(client).await {
            Some(Unattended::Failed(error)) => {
                return Outcome::InstallFailed {
                    cause: format!("UnattendedInstallStatus failed: {error}"),
                };
            }
            Some(Unattended::Pending(why)) => {
                return Outcome::Stage {
                    name: format!("{stage}; UnattendedInstallStatus pending: {why}"),
                };
            }
            None => {}
        }
    }
    Outcome::Stage {
        name: stage.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(phase: i32, error: &str) -> Vec<u8> {
        UnattendedInstallStatusSpec {
            image: "factory.talos.dev/metal-installer/x:v1.14.0".into(),
            phase,
            error: error.into(),
        }
        .encode_to_vec()
    }

    #[test]
    fn failed_and_pending_with_a_reason_are_acted_on_the_rest_is_not() {
        assert_eq!(
            judge(&spec(4, "task \"upgrade\" failed: exit code 1")),
            Some(Unattended::Failed(
                "task \"upgrade\" failed: exit code 1".into()
            ))
        );
        assert_eq!(
            judge(&spec(0, "no disk matched the selector")),
            Some(Unattended::Pending("no disk matched the selector".into()))
        );
        for phase in [0, 1, 2, 3] {
            assert_eq!(judge(&spec(phase, "")), None, "phase {phase}");
        }
        assert!(has_status("v1.14.0") && has_status("v1.15.1"));
        assert!(!has_status("v1.13.9") && !has_status("unknown"));
    }
}
