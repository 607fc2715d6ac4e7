//! Legacy v1alpha1 fields under the v1.14 contract, as tables: the mutual exclusions Talos
//! enforces between a legacy field and the document that replaced it, and the fields talboot
//! moves into their v1.14 documents.
//!
//! Talos v1.14 still accepts the v1.13 fields, but refuses a config that sets one next to the
//! document that replaced it: every new document implements `V1Alpha1ConflictValidate`
//! (siderolabs/talos v1.14.0-rc.1 `pkg/machinery/config/types/*`, run by
//! `pkg/machinery/config/container/validate.go` whenever a v1alpha1 document exists).
//! [`CONFLICTS`] is the upstream table and [`TRANSLATED`] what talboot's renderer moves; the
//! renderer (`machineconfig::legacy`) acts on both, and [`classify`] tells the inventory
//! checker what happens to a field a patch sets, so it can warn or refuse at the patch's file
//! and line.

use super::contract::Contract;

/// A legacy field Talos refuses next to a document (`V1Alpha1ConflictValidate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conflict {
    /// The document kind.
    pub kind: &'static str,
    /// The v1alpha1 path that must be unset (non-nil / non-empty counts as set).
    pub path: &'static [&'static str],
    /// The upstream file implementing the check (under `pkg/machinery/config/types/`).
    pub source: &'static str,
    /// The first contract whose Talos enforces it.
    pub since: Contract,
}

const fn c(
    kind: &'static str,
    path: &'static [&'static str],
    source: &'static str,
    since: Contract,
) -> Conflict {
    Conflict {
        kind,
        path,
        source,
        since,
    }
}

use Contract::{V1_13, V1_14};

/// Every `V1Alpha1ConflictValidate` talboot's documents can trip (v1.13.9 for the first five
/// network ones, v1.14.0-rc.1 for the rest).
pub(crate) const CONFLICTS: &[Conflict] = &[
    c(
        "ResolverConfig",
        &["machine", "network", "nameservers"],
        "network/resolver.go",
        V1_13,
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "searchDomains"],
        "network/resolver.go",
        V1_13,
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "disableSearchDomain"],
        "network/resolver.go",
        V1_13,
    ),
    c(
        "HostnameConfig",
        &["machine", "network", "hostname"],
        "network/hostname.go",
        V1_13,
    ),
    c(
        "HostnameConfig",
        &["machine", "features", "stableHostname"],
        "network/hostname.go",
        V1_13,
    ),
    c(
        "KubeSpanConfig",
        &["machine", "network", "kubespan"],
        "network/kubespan.go",
        V1_13,
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "servers"],
        "network/time_sync.go",
        V1_13,
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "bootTimeout"],
        "network/time_sync.go",
        V1_13,
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "disabled"],
        "network/time_sync.go",
        V1_13,
    ),
    c(
        "UnattendedInstallConfig",
        &["machine", "install"],
        "runtime/unattended_install.go",
        V1_14,
    ),
    c(
        "KubeletConfig",
        &["machine", "kubelet"],
        "k8s/kubelet.go",
        V1_14,
    ),
    c(
        "KubeCredentialProviderConfig",
        &["machine", "kubelet"],
        "k8s/credential_provider.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeLabels"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeAnnotations"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeTaints"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "nodeIP"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "skipNodeRegistration"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "registerWithFQDN"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["cluster", "allowSchedulingOnControlPlanes"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeNodeConfig",
        &["cluster", "allowSchedulingOnMasters"],
        "k8s/node.go",
        V1_14,
    ),
    c(
        "KubeClusterConfig",
        &["cluster", "clusterName"],
        "k8s/cluster.go",
        V1_14,
    ),
    c(
        "KubeClusterConfig",
        &["cluster", "controlPlane", "endpoint"],
        "k8s/cluster.go",
        V1_14,
    ),
    c(
        "KubeNetworkConfig",
        &["cluster", "network"],
        "k8s/network.go",
        V1_14,
    ),
    c(
        "KubeFlannelCNIConfig",
        &["cluster", "network"],
        "k8s/flannel.go",
        V1_14,
    ),
    c(
        "KubePrismConfig",
        &["machine", "features", "kubePrism"],
        "k8s/kubeprism.go",
        V1_14,
    ),
    c(
        "ResolverConfig",
        &["machine", "features", "hostDNS"],
        "network/resolver.go",
        V1_14,
    ),
    c(
        "DiscoveryServiceConfig",
        &["cluster", "discovery"],
        "cluster/discovery_service.go",
        V1_14,
    ),
    c(
        "DiscoveryIdentityConfig",
        &["cluster", "id"],
        "cluster/discovery_identity.go",
        V1_14,
    ),
    c(
        "DiscoveryIdentityConfig",
        &["cluster", "secret"],
        "cluster/discovery_identity.go",
        V1_14,
    ),
    c(
        "KubeAPIServerConfig",
        &["cluster", "apiServer"],
        "k8s/apiserver.go",
        V1_14,
    ),
    c(
        "KubeAPIServerConfig",
        &["cluster", "controlPlane", "localAPIServerPort"],
        "k8s/apiserver.go",
        V1_14,
    ),
    c(
        "KubeAPIServerCAConfig",
        &["cluster", "ca"],
        "k8s/apiserver_ca.go",
        V1_14,
    ),
    c(
        "KubeAggregatorCAConfig",
        &["cluster", "aggregatorCA"],
        "k8s/aggregator_ca.go",
        V1_14,
    ),
    c(
        "KubeServiceAccountConfig",
        &["cluster", "serviceAccount"],
        "k8s/service_account.go",
        V1_14,
    ),
    c(
        "KubeEtcdEncryptionConfig",
        &["cluster", "secretboxEncryptionSecret"],
        "k8s/etcd_encryption.go",
        V1_14,
    ),
    c(
        "KubeEtcdEncryptionConfig",
        &["cluster", "aescbcEncryptionSecret"],
        "k8s/etcd_encryption.go",
        V1_14,
    ),
    c(
        "KubeControllerManagerConfig",
        &["cluster", "controllerManager"],
        "k8s/controller_manager.go",
        V1_14,
    ),
    c(
        "KubeControllerManagerConfig",
        &["machine", "controlPlane", "controllerManager"],
        "k8s/controller_manager.go",
        V1_14,
    ),
    c(
        "KubeSchedulerConfig",
        &["cluster", "scheduler"],
        "k8s/scheduler.go",
        V1_14,
    ),
    c(
        "KubeSchedulerConfig",
        &["machine", "controlPlane", "scheduler"],
        "k8s/scheduler.go",
        V1_14,
    ),
    c(
        "KubeProxyConfig",
        &["cluster", "proxy"],
        "k8s/proxy.go",
        V1_14,
    ),
    c(
        "KubeCoreDNSConfig",
        &["cluster", "coreDNS"],
        "k8s/coredns.go",
        V1_14,
    ),
    c(
        "KubeTalosAPIAccessConfig",
        &["machine", "features", "kubernetesTalosAPIAccess"],
        "k8s/talos_api_access.go",
        V1_14,
    ),
    c(
        "ImageCacheConfig",
        &["machine", "features", "imageCache"],
        "cri/image_cache.go",
        V1_14,
    ),
    c(
        "CRIBaseRuntimeSpecConfig",
        &["machine", "baseRuntimeSpecOverrides"],
        "cri/base_runtime_spec.go",
        V1_14,
    ),
];

/// Fields the renderer moves under the v1.14 contract (`machineconfig::legacy::translate`) (a path and everything below it), and
/// the document each lands in. Intermediate keys (`machine.kubelet`) are not listed: what is
/// left under them after translation stays.
pub(crate) const TRANSLATED: &[(&[&str], &str)] = &[
    (&["machine", "install", "disk"], "UnattendedInstallConfig"),
    (
        &["machine", "install", "diskSelector"],
        "UnattendedInstallConfig",
    ),
    (&["machine", "install", "image"], "UnattendedInstallConfig"),
    (&["machine", "install", "wipe"], "UnattendedInstallConfig"),
    (
        &["machine", "install", "grubUseUKICmdline"],
        "UnattendedInstallConfig",
    ),
    (&["machine", "kubelet", "image"], "KubeletConfig"),
    (&["machine", "kubelet", "extraArgs"], "KubeletConfig"),
    (&["machine", "kubelet", "extraConfig"], "KubeletConfig"),
    (&["machine", "kubelet", "clusterDNS"], "KubeletConfig"),
    (
        &["machine", "kubelet", "defaultRuntimeSeccompProfileEnabled"],
        "KubeletConfig",
    ),
    (
        &["machine", "kubelet", "disableManifestsDirectory"],
        "KubeletConfig",
    ),
    (&["machine", "kubelet", "nodeIP"], "KubeNodeConfig"),
    (
        &["machine", "kubelet", "skipNodeRegistration"],
        "KubeNodeConfig",
    ),
    (
        &["machine", "kubelet", "registerWithFQDN"],
        "KubeNodeConfig",
    ),
    (&["machine", "nodeLabels"], "KubeNodeConfig"),
    (&["machine", "nodeAnnotations"], "KubeNodeConfig"),
    (&["machine", "nodeTaints"], "KubeNodeConfig"),
    (&["machine", "sysctls"], "SysctlConfig"),
    (&["machine", "sysfs"], "SysfsConfig"),
    (&["machine", "kernel", "modules"], "KernelModuleConfig"),
    (&["machine", "features", "kubePrism"], "KubePrismConfig"),
    (&["machine", "features", "hostDNS"], "ResolverConfig"),
    (&["cluster", "network", "dnsDomain"], "KubeNetworkConfig"),
    (&["cluster", "network", "podSubnets"], "KubeNetworkConfig"),
    (
        &["cluster", "network", "serviceSubnets"],
        "KubeNetworkConfig",
    ),
    (&["cluster", "network", "cni"], "KubeFlannelCNIConfig"),
    (&["cluster", "clusterName"], "KubeClusterConfig"),
    (
        &["cluster", "controlPlane", "endpoint"],
        "KubeClusterConfig",
    ),
    (
        &["cluster", "controlPlane", "localAPIServerPort"],
        "KubeAPIServerConfig",
    ),
    (&["cluster", "id"], "DiscoveryIdentityConfig"),
    (&["cluster", "secret"], "DiscoveryIdentityConfig"),
    (
        &["cluster", "discovery", "enabled"],
        "DiscoveryServiceConfig",
    ),
    (
        &["cluster", "discovery", "registries", "service"],
        "DiscoveryServiceConfig",
    ),
    (
        &["cluster", "discovery", "registries", "kubernetes"],
        "DiscoveryServiceConfig",
    ),
    (
        &["cluster", "allowSchedulingOnControlPlanes"],
        "KubeNodeConfig",
    ),
    (&["cluster", "allowSchedulingOnMasters"], "KubeNodeConfig"),
    (&["cluster", "apiServer", "image"], "KubeAPIServerConfig"),
    (
        &["cluster", "apiServer", "extraArgs"],
        "KubeAPIServerConfig",
    ),
    (&["cluster", "apiServer", "env"], "KubeAPIServerConfig"),
    (
        &["cluster", "apiServer", "resources"],
        "KubeAPIServerConfig",
    ),
    (&["cluster", "apiServer", "certSANs"], "KubeAPIServerConfig"),
    (
        &["cluster", "apiServer", "disablePodSecurityPolicy"],
        "KubeAPIServerConfig",
    ),
    (
        &["cluster", "apiServer", "admissionControl"],
        "KubeAdmissionControlConfig",
    ),
    (
        &["cluster", "apiServer", "auditPolicy"],
        "KubeAuditPolicyConfig",
    ),
    (
        &["cluster", "controllerManager", "image"],
        "KubeControllerManagerConfig",
    ),
    (
        &["cluster", "controllerManager", "extraArgs"],
        "KubeControllerManagerConfig",
    ),
    (
        &["cluster", "controllerManager", "env"],
        "KubeControllerManagerConfig",
    ),
    (
        &["cluster", "controllerManager", "resources"],
        "KubeControllerManagerConfig",
    ),
    (&["cluster", "scheduler", "image"], "KubeSchedulerConfig"),
    (
        &["cluster", "scheduler", "extraArgs"],
        "KubeSchedulerConfig",
    ),
    (&["cluster", "scheduler", "env"], "KubeSchedulerConfig"),
    (
        &["cluster", "scheduler", "resources"],
        "KubeSchedulerConfig",
    ),
    (&["cluster", "scheduler", "config"], "KubeSchedulerConfig"),
    (&["cluster", "proxy", "disabled"], "KubeProxyConfig"),
    (&["cluster", "proxy", "image"], "KubeProxyConfig"),
    (&["cluster", "proxy", "mode"], "KubeProxyConfig"),
    (&["cluster", "proxy", "extraArgs"], "KubeProxyConfig"),
    (&["cluster", "coreDNS", "disabled"], "KubeCoreDNSConfig"),
    (&["cluster", "coreDNS", "image"], "KubeCoreDNSConfig"),
];

/// What happens under `contract` to a v1alpha1 field a patch sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The contract's schema has it: nothing to say.
    Current,
    /// Moved into this document.
    Translated(&'static str),
    /// Stays, under a field Talos refuses next to this document, which talboot renders.
    Refused(Conflict),
    /// Stays, deprecated (not in the contract's schema).
    Deprecated,
}

/// Documents talboot always renders for a contract (any node), which make their
/// [`CONFLICTS`] fields fatal.
fn always_rendered(contract: Contract, kind: &str) -> bool {
    match contract {
        // HostnameConfig on every node; ResolverConfig and TimeSyncConfig depend on the
        // inventory and are checked on the rendered bundle instead.
        Contract::V1_13 => kind == "HostnameConfig",
        Contract::V1_14 => !matches!(
            kind,
            "KubeSpanConfig"
                | "TimeSyncConfig"
                | "KubeCredentialProviderConfig"
                | "KubeTalosAPIAccessConfig"
                | "ImageCacheConfig"
                | "CRIBaseRuntimeSpecConfig"
                | "KubeFlannelCNIConfig"
        ),
    }
}

/// The fate of `path` (a v1alpha1 field set by a patch) under `contract`; `in_schema` says
/// whether the contract's schema knows the path.
pub(crate) fn classify(contract: Contract, path: &[&str], in_schema: bool) -> Fate {
    if contract >= Contract::V1_14
        && let Some((_, kind)) = TRANSLATED
            .iter()
            .find(|(p, _)| path.len() >= p.len() && &path[..p.len()] == *p)
    {
        return Fate::Translated(kind);
    }
    if let Some(conflict) = CONFLICTS.iter().find(|c| {
        c.since <= contract
            && always_rendered(contract, c.kind)
            && path.len() >= c.path.len()
            && &path[..c.path.len()] == c.path
    }) {
        return Fate::Refused(*conflict);
    }
    if in_schema {
        Fate::Current
    } else {
        Fate::Deprecated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_names_translated_refused_and_deprecated_fields() {
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        let fate = |c, s: &str, schema| {
            let path = p(s);
            let refs: Vec<&str> = path.iter().map(String::as_str).collect();
            classify(c, &refs, schema)
        };
        assert_eq!(
            fate(V1_14, "machine.sysctls", false),
            Fate::Translated("SysctlConfig")
        );
        assert_eq!(
            fate(V1_14, "machine.kubelet.extraArgs.foo", false),
            Fate::Translated("KubeletConfig")
        );
        assert!(matches!(
            fate(V1_14, "machine.kubelet.extraMounts", false),
            Fate::Refused(Conflict {
                kind: "KubeletConfig",
                ..
            })
        ));
        assert!(matches!(
            fate(V1_14, "machine.network.nameservers", false),
            Fate::Refused(Conflict {
                kind: "ResolverConfig",
                ..
            })
        ));
        assert_eq!(fate(V1_14, "machine.files", false), Fate::Deprecated);
        assert_eq!(fate(V1_14, "cluster.etcd.extraArgs", true), Fate::Current);
        // v1.13: nothing translates; the kubelet is current.
        assert_eq!(
            fate(V1_13, "machine.kubelet.extraArgs", true),
            Fate::Current
        );
        assert!(matches!(
            fate(V1_13, "machine.network.hostname", false),
            Fate::Refused(Conflict {
                kind: "HostnameConfig",
                ..
            })
        ));
    }
}
