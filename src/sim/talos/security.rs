//! The double's `SecurityState` (COSI `runtime/SecurityStates.talos.dev/securitystate`), as
//! Talos fills it (siderolabs/talos v1.13.9 and v1.14.0-rc.1, identical,
//! `internal/app/machined/pkg/controllers/runtime/security_state.go`): once per boot, after
//! the `machined` service exists, so it is there whenever apid answers, in maintenance mode
//! and configured alike. `secureBoot` is the firmware's SecureBoot variable *and not*
//! SetupMode; `bootedWithUKI` and the `.pcrpkey` fingerprint are what the boot loader and
//! systemd-stub left behind; `ukiSigningKeyFingerprint` is never filled at either tag.
//! What the machine's firmware and boot media are is [`SimSecurity`], set per double.

use prost::Message;
use tonic::Status;

use super::Shared;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::talos::resource::definitions::runtime::SecurityStateSpec;
use crate::talos::{SECURITY_STATE_ID, SECURITY_STATE_TYPE};

/// The machine's firmware and boot media, as the security state controller would find them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimSecurity {
    /// The EFI `SecureBoot` variable (the firmware enforces signatures).
    pub firmware_secure_boot: bool,
    /// The EFI `SetupMode` variable (no platform key enrolled: nothing is enforced, and
    /// Talos reports Secure Boot off).
    pub setup_mode: bool,
    /// Booted from a Talos UKI (systemd-boot's `LoaderEntryDefault` or the stub's image
    /// identifier starts with `Talos-`).
    pub booted_with_uki: bool,
    /// The SHA-256 fingerprint (Talos's format) of the `.pcrpkey` the UKI carried; `None`
    /// when no UKI put `/.extra/tpm2-pcr-public-key.pem` there.
    pub pcr_signing_key_fingerprint: Option<String>,
    /// `false`: the controller has not filled the resource (COSI answers NotFound).
    pub filled: bool,
}

impl Default for SimSecurity {
    /// A machine network-booted the usual way (iPXE, kernel and initramfs): no Secure Boot,
    /// no UKI, no PCR key.
    fn default() -> Self {
        Self {
            firmware_secure_boot: false,
            setup_mode: false,
            booted_with_uki: false,
            pcr_signing_key_fingerprint: None,
            filled: true,
        }
    }
}

impl SimSecurity {
    /// A machine whose firmware enforces Secure Boot and that booted a Talos UKI carrying the
    /// PCR key with this fingerprint.
    pub fn secure_boot(pcr_signing_key_fingerprint: &str) -> Self {
        Self {
            firmware_secure_boot: true,
            booted_with_uki: true,
            pcr_signing_key_fingerprint: Some(pcr_signing_key_fingerprint.to_owned()),
            ..Self::default()
        }
    }

    /// The spec the controller writes (SELinux and FIPS off, as on a stock metal image).
    pub(crate) fn spec(&self) -> SecurityStateSpec {
        SecurityStateSpec {
            secure_boot: self.firmware_secure_boot && !self.setup_mode,
            booted_with_uki: self.booted_with_uki,
            pcr_signing_key_fingerprint: self
                .pcr_signing_key_fingerprint
                .clone()
                .unwrap_or_default(),
            ..SecurityStateSpec::default()
        }
    }
}

/// The YAML `talosctl get securitystate -o yaml` shows: field names of
/// `pkg/machinery/resources/runtime/security_status.go`, `omitempty` ones left out when empty
/// (`secureBoot` never is).
fn yaml(spec: &SecurityStateSpec) -> String {
    let mut y = format!("secureBoot: {}\n", spec.secure_boot);
    if !spec.pcr_signing_key_fingerprint.is_empty() {
        y += &format!(
            "pcrSigningKeyFingerprint: {}\n",
            spec.pcr_signing_key_fingerprint
        );
    }
    if spec.booted_with_uki {
        y += "bootedWithUKI: true\n";
    }
    y
}

/// COSI Get of the security state; None for any other resource.
pub(super) fn cosi_get(
    shared: &Shared,
    r: &cosi::GetRequest,
) -> Option<Result<cosi::GetResponse, Status>> {
    if (r.namespace.as_str(), r.r#type.as_str()) != ("runtime", SECURITY_STATE_TYPE) {
        return None;
    }
    shared
        .stats
        .security_state_reads
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let sec = &shared.cfg.security;
    if r.id != SECURITY_STATE_ID || !sec.filled {
        return Some(Err(Status::not_found(format!(
            "resource {}({}/{}@undefined) doesn't exist",
            r.r#type, r.namespace, r.id
        ))));
    }
    let spec = sec.spec();
    let y = yaml(&spec);
    Some(Ok(cosi::GetResponse {
        resource: Some(super::resource(
            &r.namespace,
            &r.r#type,
            &r.id,
            spec.encode_to_vec(),
            y,
        )),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{maintenance, node_cfg, rendered, secured};
    use super::super::{FakeCluster, FakeTalosNode, Phase};
    use super::SimSecurity;

    const KEY: &str = "AB:CD";

    #[tokio::test]
    async fn served_in_maintenance_and_configured_as_the_controller_fills_it() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(171, "rack1-cp-01");
        cfg.security = SimSecurity::secure_boot(KEY);
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        let spec = maintenance(node.addr())
            .security_state()
            .await
            .unwrap()
            .unwrap();
        assert!(spec.secure_boot && spec.booted_with_uki);
        assert_eq!(spec.pcr_signing_key_fingerprint, KEY);
        assert_eq!(
            spec.uki_signing_key_fingerprint, "",
            "never filled upstream"
        );
        maintenance(node.addr())
            .apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        let again = secured(node.addr()).security_state().await.unwrap();
        assert_eq!(
            again,
            Some(spec),
            "filled once per boot, the same when configured"
        );
        assert_eq!(node.security_state_reads(), 2);
    }

    #[tokio::test]
    async fn setup_mode_reports_secure_boot_off_and_an_unfilled_one_is_not_found() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut setup = node_cfg(172, "rack1-cp-02");
        setup.security = SimSecurity {
            setup_mode: true,
            ..SimSecurity::secure_boot(KEY)
        };
        let mut unfilled = node_cfg(173, "rack1-cp-03");
        unfilled.security.filled = false;
        let setup = FakeTalosNode::start(setup, &cluster).await.unwrap();
        let unfilled = FakeTalosNode::start(unfilled, &cluster).await.unwrap();
        let spec = maintenance(setup.addr())
            .security_state()
            .await
            .unwrap()
            .unwrap();
        assert!(!spec.secure_boot && spec.booted_with_uki);
        assert_eq!(
            maintenance(unfilled.addr()).security_state().await.unwrap(),
            None
        );
    }
}
