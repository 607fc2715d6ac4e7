//! The Talos machine-config contract a cluster is rendered for.
//!
//! Talos versions its config *shape* separately from the running OS: `talosctl gen config
//! --talos-version vX.Y` passes a `VersionContract` to the generator, whose switches
//! (`pkg/machinery/config/contract.go`, siderolabs/talos) decide which documents are written.
//! [`Contract`] is that choice for the minors talboot renders, with one method per switch that
//! differs between them; each cites its upstream switch. Everything here is pure.
//!
//! Talos v1.14 still *accepts* a v1.13-shaped config (the legacy fields are kept, deprecated),
//! but `gen config` for v1.14 writes the new documents, v1.14's JSON schema leaves the legacy
//! fields out, and only the new documents offer the CEL install-disk selector. So a cluster
//! whose `talosVersion` is v1.14.x renders the v1.14 contract; v1.13.x renders v1.13's.

use std::fmt;

/// A machine-config contract talboot renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contract {
    /// Talos v1.13: the v1alpha1 document carries Kubernetes, install, sysctls, discovery.
    V1_13,
    /// Talos v1.14: those move to their own documents (`Kube*Config`,
    /// `UnattendedInstallConfig`, `SysctlConfig`, `Discovery*Config`, ...).
    V1_14,
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Contract::V1_13 => "v1.13",
            Contract::V1_14 => "v1.14",
        })
    }
}

impl Contract {
    /// Every contract talboot renders, oldest first.
    pub const ALL: [Contract; 2] = [Contract::V1_13, Contract::V1_14];

    /// The contract for a Talos release, as `ParseContractFromVersion` reads it (major and
    /// minor only); `None` for a minor talboot does not render.
    pub fn for_version(v: &semver::Version) -> Option<Contract> {
        match (v.major, v.minor) {
            (1, 13) => Some(Contract::V1_13),
            (1, 14) => Some(Contract::V1_14),
            _ => None,
        }
    }

    /// The Talos minor (`13`, `14`).
    pub fn minor(self) -> u64 {
        match self {
            Contract::V1_13 => 13,
            Contract::V1_14 => 14,
        }
    }

    /// `contract.Greater(TalosVersion1_13)`: the condition of every v1.14 switch below.
    fn after_1_13(self) -> bool {
        self > Contract::V1_13
    }

    /// `UnattendedInstallConfig()`: `.machine.install` is left out and an
    /// `UnattendedInstallConfig` document is written (`generate/init.go`, `worker.go`).
    pub(crate) fn unattended_install_config(self) -> bool {
        self.after_1_13()
    }

    /// `MultidocKubernetesConfigSupported()`: kubelet, node labels/taints, cluster name and
    /// endpoint, network, CAs, control-plane components and KubePrism move out of v1alpha1
    /// into `Kube*Config` documents (`generate/init.go`, `kubernetes.go`).
    pub(crate) fn multidoc_kubernetes_config_supported(self) -> bool {
        self.after_1_13()
    }

    /// `HostDNSMultidocConfig()`: host DNS is `ResolverConfig.hostDNS`, not
    /// `.machine.features.hostDNS` (`generate/init.go`).
    pub(crate) fn host_dns_multidoc_config(self) -> bool {
        self.after_1_13()
    }

    /// `DiscoveryServiceMultidocConfig()`: discovery is a `DiscoveryServiceConfig` document,
    /// not `.cluster.discovery` (`generate/init.go`).
    pub(crate) fn discovery_service_multidoc_config(self) -> bool {
        self.after_1_13()
    }

    /// `DiscoveryIdentityMultidocConfig()`: `.cluster.id`/`.secret`/`.clusterName` stay empty
    /// and a `DiscoveryIdentityConfig` document carries the identity (`generate/init.go`).
    pub(crate) fn discovery_identity_multidoc_config(self) -> bool {
        self.after_1_13()
    }

    /// `MultidocSysctlConfigSupported()`: sysctls are a `SysctlConfig` document, not
    /// `.machine.sysctls` (`generate/init.go`, `worker.go`).
    pub fn multidoc_sysctl_config_supported(self) -> bool {
        self.after_1_13()
    }

    /// `FilesystemTrimEnabledByDefault()`: `VolumeConfig EPHEMERAL` with `mount.secure` and a
    /// weekly `FilesystemTrimConfig` are written (`generate/block.go`).
    pub(crate) fn filesystem_trim_enabled_by_default(self) -> bool {
        self.after_1_13()
    }

    /// `WorkloadIsolationEnabledByDefault()`: `SecurityProfileConfig` with
    /// `workloadIsolation: true` is written (`generate/security_profile.go`).
    pub(crate) fn workload_isolation_enabled_by_default(self) -> bool {
        self.after_1_13()
    }

    /// `MultidocKernelModuleConfigSupported()`: not read by the generator (only upstream's
    /// stability test uses it); kernel modules in a patch are translated into a
    /// `KernelModuleConfig` document when this holds.
    pub fn multidoc_kernel_module_config_supported(self) -> bool {
        self.after_1_13()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> semver::Version {
        s.parse::<crate::inventory::Version>().unwrap().0
    }

    #[test]
    fn contract_follows_major_and_minor_only() {
        assert_eq!(Contract::for_version(&v("v1.13.9")), Some(Contract::V1_13));
        assert_eq!(Contract::for_version(&v("1.14.0")), Some(Contract::V1_14));
        assert_eq!(
            Contract::for_version(&v("v1.14.0-rc.1")),
            Some(Contract::V1_14)
        );
        assert_eq!(Contract::for_version(&v("v1.12.6")), None);
        assert_eq!(Contract::for_version(&v("v2.14.0")), None);
    }

    #[test]
    fn every_v1_14_switch_is_off_for_v1_13_and_on_for_v1_14() {
        // contract.go: each is `contract.Greater(TalosVersion1_13)`.
        for c in Contract::ALL {
            let on = c == Contract::V1_14;
            for (name, value) in [
                ("UnattendedInstallConfig", c.unattended_install_config()),
                (
                    "MultidocKubernetesConfigSupported",
                    c.multidoc_kubernetes_config_supported(),
                ),
                ("HostDNSMultidocConfig", c.host_dns_multidoc_config()),
                (
                    "DiscoveryServiceMultidocConfig",
                    c.discovery_service_multidoc_config(),
                ),
                (
                    "DiscoveryIdentityMultidocConfig",
                    c.discovery_identity_multidoc_config(),
                ),
                (
                    "MultidocSysctlConfigSupported",
                    c.multidoc_sysctl_config_supported(),
                ),
                (
                    "FilesystemTrimEnabledByDefault",
                    c.filesystem_trim_enabled_by_default(),
                ),
                (
                    "WorkloadIsolationEnabledByDefault",
                    c.workload_isolation_enabled_by_default(),
                ),
                (
                    "MultidocKernelModuleConfigSupported",
                    c.multidoc_kernel_module_config_supported(),
                ),
            ] {
                assert_eq!(value, on, "{name} for {c}");
            }
        }
    }
}
