//! Which Kubernetes versions talosctl lets `talboot upgrade --kubernetes` go to: the upgrade
//! path (one minor at a time) and the Kubernetes versions each Talos minor runs, with
//! talosctl's refusal texts. Pure; [`super::upgrade_k8s`] checks both before and during an
//! upgrade.

use crate::inventory::Version;

/// The upgrade path talosctl accepts (siderolabs/go-kubernetes `kubernetes/upgrade/path.go`,
/// `IsSupported`: every listed path is `1.N->1.N` or `1.N->1.N+1`). Downgrades are refused too.
pub(crate) fn path_supported(from: &Version, to: &Version) -> Result<(), VersionError> {
    let (f, t) = (&from.0, &to.0);
    let ok = f.major == t.major && (t.minor == f.minor || t.minor == f.minor + 1) && t >= f;
    if ok {
        Ok(())
    } else {
        Err(VersionError::Path {
            current: from.clone(),
            target: to.clone(),
        })
    }
}

/// Why talosctl would refuse a Kubernetes version, with talosctl's texts.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error(
        "unsupported upgrade path {}.{}->{}.{} (from {current} to {target}): Kubernetes \
         upgrades go one minor version at a time; upgrade to v{}.{}.x first",
        current.0.major,
        current.0.minor,
        target.0.major,
        target.0.minor,
        current.0.major,
        current.0.minor + 1
    )]
    Path { current: Version, target: Version },
    #[error("Talos version {tag:?}: {reason}")]
    TalosTag { tag: String, reason: semver::Error },
    #[error("compatibility with version {0} is not supported")]
    NoTable(semver::Version),
    #[error("version of Kubernetes {k8s} is too old to be used with Talos {talos}")]
    TooOld {
        k8s: semver::Version,
        talos: semver::Version,
    },
    #[error("version of Kubernetes {k8s} is too new to be used with Talos {talos}")]
    TooNew {
        k8s: semver::Version,
        talos: semver::Version,
    },
    #[error("upgrades to version {0} are not supported")]
    NoUpgradeTable(semver::Version),
    #[error("host version {host} is too old to upgrade to Talos {talos}")]
    HostTooOld {
        host: semver::Version,
        talos: semver::Version,
    },
    #[error("host version {host} is too new to downgrade to Talos {talos}")]
    HostTooNew {
        host: semver::Version,
        talos: semver::Version,
    },
}

/// The Kubernetes versions each Talos minor runs, as talosctl v1.14 knows them
/// (siderolabs/talos v1.14.0-rc.1 `pkg/machinery/compatibility/talos1{10,11,12,13,14}/*.go`,
/// `MinimumKubernetesVersion` and `MaximumKubernetesVersion`; the rows of 1.10 to 1.13 are
/// the same at v1.13.9): (Talos minor, lowest, the first version that is too new). Older
/// minors are not listed here.
/// major, minor, patch.
type Triple = (u64, u64, u64);

const TALOS_K8S: [(u64, Triple, Triple); 5] = [
    (10, (1, 28, 0), (1, 33, 99)),
    (11, (1, 29, 0), (1, 34, 99)),
    (12, (1, 30, 0), (1, 35, 99)),
    (13, (1, 31, 0), (1, 36, 99)),
    (14, (1, 32, 0), (1, 37, 99)),
];

/// Which running Talos versions the installer of each Talos minor upgrades (siderolabs/talos
/// v1.14.0-rc.1 `pkg/machinery/compatibility/talos1{12,13,14}/*.go`,
/// `MinimumHostUpgradeVersion` and `MaximumHostDowngradeVersion`; none has
/// `DeniedHostUpgradeVersions`): (target minor, the oldest host, the first host that is too
/// new). The installer's pre-flight check (`cmd/installer/pkg/install/preflight.go`,
/// `talosVersion`) refuses any other host on the node itself, after the upgrade has begun.
const TALOS_HOST_UPGRADE: [(u64, Triple, Triple); 3] = [
    (12, (1, 10, 0), (1, 14, 0)),
    (13, (1, 11, 0), (1, 15, 0)),
    (14, (1, 12, 0), (1, 16, 0)),
];

/// Whether the installer of Talos `target` upgrades a node that runs Talos `host`, with the
/// installer's texts (`pkg/machinery/compatibility/talos_version.go`, `UpgradeableFrom`:
/// the host's major.minor.patch below the minimum is "too old", at or above the maximum
/// "too new", a target minor without a table "not supported"). Pre-release tags compare by
/// their numbers only, as upstream's `ordered.MakeTriple` does.
pub(crate) fn upgradeable_from(target_tag: &str, host_tag: &str) -> Result<(), VersionError> {
    let parse = |tag: &str| {
        tag.parse::<Version>()
            .map_err(|reason| VersionError::TalosTag {
                tag: tag.to_owned(),
                reason,
            })
    };
    let (target, host) = (parse(target_tag)?, parse(host_tag)?);
    let t = &target.0;
    let row = TALOS_HOST_UPGRADE
        .iter()
        .find(|(minor, _, _)| t.major == 1 && t.minor == *minor);
    let Some((_, min, max)) = row else {
        return Err(VersionError::NoUpgradeTable(target.0));
    };
    let h = (host.0.major, host.0.minor, host.0.patch);
    if h < *min {
        return Err(VersionError::HostTooOld {
            host: host.0,
            talos: target.0,
        });
    }
    if h >= *max {
        return Err(VersionError::HostTooNew {
            host: host.0,
            talos: target.0,
        });
    }
    Ok(())
}

/// Whether Kubernetes `k8s` may run on a node with Talos `talos_tag`, with talosctl's texts
/// (`pkg/machinery/compatibility/kubernetes_version.go`, `SupportedWith`: below the minimum is
/// "too old", at or above the maximum "too new", a Talos minor it has no table for "not
/// supported").
pub(crate) fn supported_with(k8s: &Version, talos_tag: &str) -> Result<(), VersionError> {
    let talos: Version = talos_tag.parse().map_err(|reason| VersionError::TalosTag {
        tag: talos_tag.to_owned(),
        reason,
    })?;
    let t = &talos.0;
    let row = TALOS_K8S
        .iter()
        .find(|(minor, _, _)| t.major == 1 && t.minor == *minor);
    let Some((_, min, max)) = row else {
        return Err(VersionError::NoTable(talos.0));
    };
    let v = (k8s.0.major, k8s.0.minor, k8s.0.patch);
    if v < *min {
        return Err(VersionError::TooOld {
            k8s: k8s.0.clone(),
            talos: talos.0,
        });
    }
    if v >= *max {
        return Err(VersionError::TooNew {
            k8s: k8s.0.clone(),
            talos: talos.0,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn talosctls_upgrade_paths() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        assert!(path_supported(&v("1.36.3"), &v("1.36.4")).is_ok());
        assert!(path_supported(&v("1.36.3"), &v("1.37.0")).is_ok());
        let err = path_supported(&v("1.36.3"), &v("1.38.0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("1.36->1.38"), "{err}");
        assert!(path_supported(&v("1.36.3"), &v("1.35.0")).is_err());
        assert!(path_supported(&v("1.36.3"), &v("2.0.0")).is_err());
    }

    #[test]
    fn talosctls_compatibility_table() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        assert!(supported_with(&v("1.36.4"), "v1.13.9").is_ok());
        assert!(supported_with(&v("1.31.0"), "v1.13.0").is_ok());
        assert_eq!(
            supported_with(&v("1.37.0"), "v1.13.9")
                .unwrap_err()
                .to_string(),
            "version of Kubernetes 1.37.0 is too new to be used with Talos 1.13.9"
        );
        assert_eq!(
            supported_with(&v("1.30.5"), "v1.13.9")
                .unwrap_err()
                .to_string(),
            "version of Kubernetes 1.30.5 is too old to be used with Talos 1.13.9"
        );
        assert!(supported_with(&v("1.35.2"), "v1.12.4").is_ok());
        assert!(supported_with(&v("1.36.0"), "v1.12.4").is_err());
        // Talos v1.14 runs Kubernetes 1.32.0 up to 1.37.x.
        assert!(supported_with(&v("1.36.4"), "v1.14.0").is_ok());
        assert!(supported_with(&v("1.37.5"), "v1.14.1").is_ok());
        assert!(supported_with(&v("1.32.0"), "v1.14.0-rc.1").is_ok());
        assert_eq!(
            supported_with(&v("1.31.9"), "v1.14.0")
                .unwrap_err()
                .to_string(),
            "version of Kubernetes 1.31.9 is too old to be used with Talos 1.14.0"
        );
        assert_eq!(
            supported_with(&v("1.38.0"), "v1.14.0")
                .unwrap_err()
                .to_string(),
            "version of Kubernetes 1.38.0 is too new to be used with Talos 1.14.0"
        );
        assert_eq!(
            supported_with(&v("1.36.4"), "v1.15.0")
                .unwrap_err()
                .to_string(),
            "compatibility with version 1.15.0 is not supported"
        );
    }

    /// The host versions each installer accepts, from `talos1{12,13,14}` at v1.14.0-rc.1, with
    /// the installer's texts.
    #[test]
    fn the_installers_host_version_table() {
        assert!(upgradeable_from("v1.14.0", "v1.13.9").is_ok());
        assert!(upgradeable_from("v1.14.0", "v1.12.0").is_ok());
        assert!(
            upgradeable_from("v1.14.0", "v1.15.3").is_ok(),
            "a downgrade from 1.15"
        );
        assert!(upgradeable_from("v1.13.9", "v1.11.0").is_ok());
        assert!(upgradeable_from("v1.14.0-rc.1", "v1.13.9").is_ok());
        let err = |t: &str, h: &str| upgradeable_from(t, h).unwrap_err().to_string();
        assert_eq!(
            err("v1.14.0", "v1.11.6"),
            "host version 1.11.6 is too old to upgrade to Talos 1.14.0"
        );
        assert_eq!(
            err("v1.14.0", "v1.16.0"),
            "host version 1.16.0 is too new to downgrade to Talos 1.14.0"
        );
        assert_eq!(
            err("v1.13.9", "v1.15.0"),
            "host version 1.15.0 is too new to downgrade to Talos 1.13.9"
        );
        assert_eq!(
            err("v1.15.0", "v1.14.0"),
            "upgrades to version 1.15.0 are not supported"
        );
        assert!(err("v1.14.0", "garbage").contains("garbage"));
    }
}
