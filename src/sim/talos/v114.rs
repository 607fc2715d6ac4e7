//! Which Talos minor the double behaves as, and what v1.14 changes in what it accepts.
//!
//! The node's running version (`Version`'s tag: [`super::FakeNodeConfig::talos_version`] at
//! first, the upgraded one after an upgrade and a reboot) picks [`TalosRules`]: v1.14.0 and
//! later follow v1.14's rules, anything older v1.13's (what the double always did). This
//! module owns the v1.14 side of ApplyConfiguration: the modes, the document kinds its config
//! loader registers, the documents' own checks the double models, and the conflicts between a
//! legacy v1alpha1 field and its new document; plus the facts the double reads from v1.14
//! documents (cluster name, endpoint, Kubernetes CA, the unattended install).
//!
//! Upstream (siderolabs/talos v1.14.0-rc.1):
//! - `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, ApplyConfiguration:
//!   on a configured node REBOOT (the proto's zero value, so also an unset mode) is refused with
//!   Unimplemented "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes
//!   instead" after the v1alpha1-document check and before validation; in maintenance it is
//!   turned into NO_REBOOT; AUTO is rewritten to NO_REBOOT and never reboots
//!   (`CanApplyImmediate` is gone), so AUTO, NO_REBOOT and TRY all reply "Applied
//!   configuration without a reboot" with mode NO_REBOOT; an unknown mode is InvalidArgument
//!   "incorrect mode '<M>' specified for the apply config call" (v1.13.9: a plain error).
//! - `pkg/machinery/config/container/validate.go`, `validate`: v1alpha1 errors (prefixed
//!   `v1alpha1.Config: `), then each document's own errors (prefixed with its ID), then every
//!   document's `V1Alpha1ConflictValidate` (not prefixed), all in one go-multierror.
//! - The conflict messages of [`CONFLICTS`], each from the named kind's
//!   `V1Alpha1ConflictValidate` under `pkg/machinery/config/types/{runtime,k8s,cluster,network}/`.
//! - `pkg/machinery/config/types/runtime/unattended_install.go`: `UnattendedInstallConfig`
//!   (`reboot`, `installer.image`, `provisioning.diskSelector.match`, `provisioning.wipe`),
//!   `Validate` (the "installer.image is not set" warning, "provisioning.volumeSelector.match
//!   is required").
//! - `pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`: `.machine.install` is no
//!   longer required; `.cluster.controlPlane` is optional (its endpoint is required only when
//!   it is there).

use tonic::Status;
use yaml_serde::Value;

use crate::talos::api::machine::apply_configuration_request::Mode;

/// The Talos version a new double claims to run when its config says nothing else.
pub const TALOS_V114_TAG: &str = "v1.14.0";

/// Which Talos minor's behaviour the double follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TalosRules {
    /// Talos v1.13 (and older): what the double modelled before v1.14.
    V113,
    /// Talos v1.14 and later.
    V114,
}

impl TalosRules {
    /// The rules of a version tag (`v1.14.0`, `v1.14.0-rc.1`, `v1.13.9`); one the double
    /// cannot read follows v1.13's.
    pub(crate) fn of(tag: &str) -> Self {
        let mut parts = tag.trim_start_matches('v').split(['.', '-']);
        let mut number = || -> u64 { parts.next().and_then(|p| p.parse().ok()).unwrap_or(0) };
        let (major, minor) = (number(), number());
        if (major, minor) >= (1, 14) {
            Self::V114
        } else {
            Self::V113
        }
    }
}

/// The document kinds the v1.14 config loader registers besides v1alpha1 (every kind
/// constant under `pkg/machinery/config/types/`, registered for apiVersion `v1alpha1`).
pub(super) const DOCUMENT_KINDS: &[&str] = &[
    "BGPInstanceConfig",
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "CRIBaseRuntimeSpecConfig",
    "CRICustomizationConfig",
    "ContainerConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DiscoveryIdentityConfig",
    "DiscoveryServiceConfig",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EtcFileConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "FilesystemScrubConfig",
    "FilesystemTrimConfig",
    "HCloudVIPConfig",
    "HTTPProbeConfig",
    "HostnameConfig",
    "ImageCacheConfig",
    "ImageVerificationConfig",
    "KernelModuleConfig",
    "KmsgLogConfig",
    "KubeAPIServerCAConfig",
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeClusterConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeCredentialProviderConfig",
    "KubeEtcdEncryptionConfig",
    "KubeExternalManifestConfig",
    "KubeFlannelCNIConfig",
    "KubeInlineManifestConfig",
    "KubeNetworkConfig",
    "KubeNodeConfig",
    "KubePrismConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "KubeStaticPodConfig",
    "KubeTalosAPIAccessConfig",
    "KubeletConfig",
    "LVMLogicalVolumeConfig",
    "LVMVolumeGroupConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RAIDArrayConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SecurityProfileConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "SysctlConfig",
    "SysfsConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UdevRulesConfig",
    "UnattendedInstallConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VethConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// What of a v1alpha1 field makes it conflict (the Go check behind each message).
#[derive(Clone, Copy)]
enum Test {
    /// A pointer, slice or map field that is set (`!= nil`): present and not null, even empty.
    Present,
    /// A string field that is not empty.
    NonEmpty,
    /// A `*bool` that is true (`pointer.SafeDeref`) or a bool that is true.
    True,
}

/// One check of a `V1Alpha1ConflictValidate`: the new document's kind, the v1alpha1 field
/// and the message. A kind's checks run in its validator's order; the first that hits is
/// its only error.
struct Conflict {
    kind: &'static str,
    path: &'static [&'static str],
    test: Test,
    message: &'static str,
}

/// The conflicts the double checks: those of the documents talboot's v1.14 renderer writes
/// (and a day-two patch could pair with a legacy field). Not modelled: `ResolverConfig`'s
/// hostDNS check (it depends on the document's own field), `KubeSpanConfig`, `VolumeConfig`
/// encryption, the admission/audit/authorizer/etcd-encryption/Talos-API-access ones.
// One row per upstream check; kept whole so the table reads in one place.
const CONFLICTS: &[Conflict] = &[
    // runtime/unattended_install.go
    Conflict {
        kind: "UnattendedInstallConfig",
        path: &["machine", "install"],
        test: Test::Present,
        message: "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
    },
    // k8s/kubelet.go
    Conflict {
        kind: "KubeletConfig",
        path: &["machine", "kubelet"],
        test: Test::Present,
        message: "kubelet config is already set in v1alpha1 config (.machine.kubelet)",
    },
    // k8s/cluster.go
    Conflict {
        kind: "KubeClusterConfig",
        path: &["cluster", "clusterName"],
        test: Test::NonEmpty,
        message: "cluster name is already set in the v1alpha1 config (.cluster.clusterName). \
                  Please remove it and use only the new KubeClusterConfig document to avoid \
                  conflicts",
    },
    Conflict {
        kind: "KubeClusterConfig",
        path: &["cluster", "controlPlane", "endpoint"],
        test: Test::Present,
        message: "cluster endpoint is already set in the v1alpha1 config \
                  (.cluster.controlPlane.endpoint). Please remove it and use only the new \
                  KubeClusterConfig document to avoid conflicts",
    },
    // k8s/network.go
    Conflict {
        kind: "KubeNetworkConfig",
        path: &["cluster", "network"],
        test: Test::Present,
        message: "cluster network config is already set in the v1alpha1 config \
                  (.machine.cluster.network). Please remove it and use only the new \
                  KubeNetworkConfig document to avoid conflicts",
    },
    // k8s/apiserver_ca.go
    Conflict {
        kind: "KubeAPIServerCAConfig",
        path: &["cluster", "ca"],
        test: Test::Present,
        message: "kube-apiserver CA is already set in v1alpha1 config (.cluster.ca)",
    },
    // k8s/aggregator_ca.go
    Conflict {
        kind: "KubeAggregatorCAConfig",
        path: &["cluster", "aggregatorCA"],
        test: Test::Present,
        message: "kube-apiserver aggregator CA is already set in v1alpha1 config \
                  (.cluster.aggregatorCA), please remove it and use the new \
                  KubeAggregatorCAConfig document instead",
    },
    // k8s/service_account.go
    Conflict {
        kind: "KubeServiceAccountConfig",
        path: &["cluster", "serviceAccount"],
        test: Test::Present,
        message: "service account is already set in v1alpha1 config (.cluster.serviceAccount)",
    },
    // k8s/apiserver.go
    Conflict {
        kind: "KubeAPIServerConfig",
        path: &["cluster", "apiServer"],
        test: Test::Present,
        message: "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)",
    },
    // k8s/controller_manager.go
    Conflict {
        kind: "KubeControllerManagerConfig",
        path: &["cluster", "controllerManager"],
        test: Test::Present,
        message: "kube-controller-manager config is already set in v1alpha1 config \
                  (.cluster.controllerManager)",
    },
    // k8s/scheduler.go
    Conflict {
        kind: "KubeSchedulerConfig",
        path: &["cluster", "scheduler"],
        test: Test::Present,
        message: "kube-scheduler config is already set in v1alpha1 config (.cluster.scheduler)",
    },
    // k8s/proxy.go
    Conflict {
        kind: "KubeProxyConfig",
        path: &["cluster", "proxy"],
        test: Test::Present,
        message: "cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used \
                  with KubeProxyConfig document, please remove it to avoid conflicts",
    },
    // k8s/coredns.go
    Conflict {
        kind: "KubeCoreDNSConfig",
        path: &["cluster", "coreDNS"],
        test: Test::Present,
        message: "CoreDNS config is already set in v1alpha1 config (.cluster.coreDNS)",
    },
    // k8s/kubeprism.go
    Conflict {
        kind: "KubePrismConfig",
        path: &["machine", "features", "kubePrism"],
        test: Test::Present,
        message: "KubePrism config in v1alpha1 config (.machine.features.kubePrism) can't be \
                  used with KubePrismConfig document, please remove it to avoid conflicts",
    },
    // k8s/node.go, in its order
    Conflict {
        kind: "KubeNodeConfig",
        path: &["cluster", "allowSchedulingOnControlPlanes"],
        test: Test::Present,
        message: ".cluster.allowSchedulingOnControlPlanes is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["cluster", "allowSchedulingOnMasters"],
        test: Test::Present,
        message: ".cluster.allowSchedulingOnMasters is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "kubelet", "skipNodeRegistration"],
        test: Test::Present,
        message: ".machine.kubelet.skipNodeRegistration is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "kubelet", "registerWithFQDN"],
        test: Test::Present,
        message: ".machine.kubelet.registerWithFQDN is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "kubelet", "nodeIP"],
        test: Test::Present,
        message: ".machine.kubelet.nodeIP is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "nodeLabels"],
        test: Test::Present,
        message: ".machine.nodeLabels is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "nodeAnnotations"],
        test: Test::Present,
        message: ".machine.nodeAnnotations is already set in v1alpha1 config",
    },
    Conflict {
        kind: "KubeNodeConfig",
        path: &["machine", "nodeTaints"],
        test: Test::Present,
        message: ".machine.nodeTaints is already set in v1alpha1 config",
    },
    // cluster/discovery_service.go
    Conflict {
        kind: "DiscoveryServiceConfig",
        path: &["cluster", "discovery"],
        test: Test::Present,
        message: "discovery service is already configured in .cluster.discovery of the v1alpha1 \
                  config",
    },
    // cluster/discovery_identity.go
    Conflict {
        kind: "DiscoveryIdentityConfig",
        path: &["cluster", "id"],
        test: Test::NonEmpty,
        message: "cluster identity is already configured in .cluster.id/.cluster.secret of the \
                  v1alpha1 config",
    },
    Conflict {
        kind: "DiscoveryIdentityConfig",
        path: &["cluster", "secret"],
        test: Test::NonEmpty,
        message: "cluster identity is already configured in .cluster.id/.cluster.secret of the \
                  v1alpha1 config",
    },
    // network/hostname.go (`Hostname()`, `AutoHostname()` in v1alpha1_network_bridge.go)
    Conflict {
        kind: "HostnameConfig",
        path: &["machine", "network", "hostname"],
        test: Test::NonEmpty,
        message: "static hostname is already set in v1alpha1 config",
    },
    Conflict {
        kind: "HostnameConfig",
        path: &["machine", "features", "stableHostname"],
        test: Test::True,
        message: "stable hostname is already set in v1alpha1 config",
    },
    // network/resolver.go, in its order (`SearchDomains().IsPresent()`, `Resolvers() != nil`,
    // `DisableSearchDomain()`)
    Conflict {
        kind: "ResolverConfig",
        path: &["machine", "network", "searchDomains"],
        test: Test::Present,
        message: ".machine.network.searchDomains is already set in v1alpha1 config",
    },
    Conflict {
        kind: "ResolverConfig",
        path: &["machine", "network", "nameservers"],
        test: Test::Present,
        message: ".machine.network.nameservers is already set in v1alpha1 config",
    },
    Conflict {
        kind: "ResolverConfig",
        path: &["machine", "network", "disableSearchDomain"],
        test: Test::True,
        message: ".machine.network.disableSearchDomain is already set in v1alpha1 config",
    },
];

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// The conflict errors of a config: for each new document, in document order, the first of
/// its kind's checks the v1alpha1 document fails.
pub(super) fn conflicts(v1alpha1: &Value, docs: &[Value]) -> Vec<String> {
    let mut errors = Vec::new();
    for doc in docs {
        let Some(kind) = doc.get("kind").and_then(Value::as_str) else {
            continue;
        };
        let hit = CONFLICTS.iter().filter(|c| c.kind == kind).find(|c| {
            let field = at(v1alpha1, c.path).filter(|v| !v.is_null());
            match c.test {
                Test::Present => field.is_some(),
                Test::NonEmpty => field.and_then(Value::as_str).is_some_and(|s| !s.is_empty()),
                Test::True => field.and_then(Value::as_bool) == Some(true),
            }
        });
        if let Some(c) = hit {
            errors.push(c.message.to_owned());
        }
    }
    errors
}

/// The unattended install a config asks for (`UnattendedInstallConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnattendedSpec {
    /// `provisioning.diskSelector.match`.
    pub(crate) selector: String,
    /// `installer.image` (empty: Talos derives it from the boot entry).
    pub(crate) image: String,
    /// `reboot`.
    pub(crate) reboot: Option<bool>,
}

impl UnattendedSpec {
    fn from_doc(doc: &Value) -> Self {
        let text = |path: &[&str]| {
            at(doc, path)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            selector: text(&["provisioning", "diskSelector", "match"]),
            image: text(&["installer", "image"]),
            reboot: doc.get("reboot").and_then(Value::as_bool),
        }
    }

    /// `shouldReboot` (controllers/runtime/unattended_install.go): `reboot` when set, else
    /// only when an installer image is configured.
    pub(crate) fn reboots(&self) -> bool {
        self.reboot.unwrap_or(!self.image.is_empty())
    }
}

/// The documents' own `Validate` where the double models it: errors (prefixed with the
/// document ID, as `container.validate` does) and warnings.
pub(super) fn document_checks(docs: &[Value]) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for doc in docs {
        if doc.get("kind").and_then(Value::as_str) != Some("UnattendedInstallConfig") {
            continue;
        }
        let spec = UnattendedSpec::from_doc(doc);
        if spec.image.is_empty() {
            warnings.push(
                "installer.image is not set, if Talos is not booted from asset built by Image \
                 Factory, installation will fail"
                    .to_owned(),
            );
        }
        if spec.selector.is_empty() {
            errors.push(
                "UnattendedInstallConfig: provisioning.volumeSelector.match is required".into(),
            );
        } else if let Err(e) = crate::talosfacts::disk_cel::compile(&spec.selector) {
            // Upstream prints cel-go's error here; the double prints its own evaluator's.
            errors.push(format!(
                "UnattendedInstallConfig: provisioning.volumeSelector.match: {e}"
            ));
        }
    }
    (errors, warnings)
}

/// The facts the double reads from the v1.14 documents, where v1.13 configs keep them in the
/// v1alpha1 document.
#[derive(Default)]
pub(super) struct DocumentFacts {
    /// `KubeClusterConfig.clusterName`.
    pub(super) cluster_name: Option<String>,
    /// `KubeClusterConfig.endpoint`.
    pub(super) endpoint: Option<String>,
    /// `KubeAPIServerCAConfig`: `issuingCA` (PEM certificate and key) on a control plane,
    /// the first of `acceptedCAs` on a worker.
    pub(super) cluster_ca: Option<(String, Option<String>)>,
    /// `UnattendedInstallConfig`.
    pub(super) unattended: Option<UnattendedSpec>,
}

impl DocumentFacts {
    pub(super) fn read(docs: &[Value]) -> Self {
        let mut facts = Self::default();
        let text =
            |v: &Value, path: &[&str]| at(v, path).and_then(Value::as_str).map(str::to_owned);
        for doc in docs {
            match doc.get("kind").and_then(Value::as_str) {
                Some("KubeClusterConfig") => {
                    facts.cluster_name = text(doc, &["clusterName"]);
                    facts.endpoint = text(doc, &["endpoint"]);
                }
                Some("KubeAPIServerCAConfig") => {
                    facts.cluster_ca = match text(doc, &["issuingCA", "cert"]) {
                        Some(crt) => Some((crt, text(doc, &["issuingCA", "key"]))),
                        None => doc
                            .get("acceptedCAs")
                            .and_then(Value::as_sequence)
                            .and_then(|s| s.first())
                            .and_then(Value::as_str)
                            .map(|crt| (crt.to_owned(), None)),
                    };
                }
                Some("UnattendedInstallConfig") => {
                    facts.unattended = Some(UnattendedSpec::from_doc(doc));
                }
                _ => {}
            }
        }
        facts
    }
}

/// The configured-node REBOOT refusal, checked after the v1alpha1-document check and before
/// validation.
pub(super) fn reboot_refused() -> Status {
    Status::unimplemented(
        "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
    )
}

/// The mode a v1.14 apply runs in and its reply's details: nothing needs a reboot any more.
pub(super) fn effective_mode(requested: Mode) -> (Mode, String) {
    match requested {
        Mode::Staged => (
            Mode::Staged,
            "Staged configuration to be applied after the next reboot".into(),
        ),
        Mode::Try => (Mode::Try, "Applied configuration without a reboot".into()),
        // AUTO is rewritten to NO_REBOOT; REBOOT never gets here (refused before).
        Mode::Auto | Mode::NoReboot | Mode::Reboot => (
            Mode::NoReboot,
            "Applied configuration without a reboot".into(),
        ),
    }
}

/// The unknown-mode refusal, InvalidArgument in v1.14 (after validation).
pub(super) fn unknown_mode(mode: i32) -> Status {
    Status::invalid_argument(format!(
        "incorrect mode '{mode}' specified for the apply config call"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_version_picks_the_rules() {
        assert_eq!(TalosRules::of("v1.13.9"), TalosRules::V113);
        assert_eq!(TalosRules::of("v1.14.0"), TalosRules::V114);
        assert_eq!(TalosRules::of("v1.14.0-rc.1"), TalosRules::V114);
        assert_eq!(TalosRules::of("v1.15.2"), TalosRules::V114);
        assert_eq!(TalosRules::of("v2.0.0"), TalosRules::V114);
        assert_eq!(TalosRules::of("garbage"), TalosRules::V113);
    }

    fn docs(text: &str) -> Vec<Value> {
        yaml_serde::Deserializer::from_str(text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .collect()
    }

    #[test]
    fn a_legacy_field_beside_its_document_conflicts_and_only_then() {
        let v1 =
            &docs("machine:\n  install: {}\n  nodeLabels: {a: b}\ncluster:\n  clusterName: c\n")[0];
        let new = docs(
            "kind: UnattendedInstallConfig\n---\nkind: KubeNodeConfig\n---\nkind: \
             KubeClusterConfig\n---\nkind: KubeletConfig\n",
        );
        assert_eq!(
            conflicts(v1, &new),
            [
                "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
                ".machine.nodeLabels is already set in v1alpha1 config",
                "cluster name is already set in the v1alpha1 config (.cluster.clusterName). Please \
                 remove it and use only the new KubeClusterConfig document to avoid conflicts",
            ]
        );
        let bare = &docs("machine:\n  install: null\ncluster:\n  clusterName: ''\n")[0];
        assert!(conflicts(bare, &new).is_empty());
    }

    #[test]
    fn a_reboot_is_due_when_asked_or_when_an_image_is_set() {
        let spec = |reboot, image: &str| UnattendedSpec {
            selector: "true".into(),
            image: image.into(),
            reboot,
        };
        assert!(spec(None, "img").reboots());
        assert!(!spec(None, "").reboots());
        assert!(spec(Some(true), "").reboots());
        assert!(!spec(Some(false), "img").reboots());
    }
}
