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
}

/// The Kubernetes versions each Talos minor runs, as talosctl v1.13.9 knows them
/// (siderolabs/talos v1.13.9 `pkg/machinery/compatibility/talos1{10,11,12,13}/*.go`,
/// `MinimumKubernetesVersion` and `MaximumKubernetesVersion`): (Talos minor, lowest, the
/// first version that is too new). Older minors are not listed here.
/// major, minor, patch.
type Triple = (u64, u64, u64);

const TALOS_K8S: [(u64, Triple, Triple); 4] = [
    (10, (1, 28, 0), (1, 33, 99)),
    (11, (1, 29, 0), (1, 34, 99)),
    (12, (1, 30, 0), (1, 35, 99)),
    (13, (1, 31, 0), (1, 36, 99)),
];

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
        assert_eq!(
            supported_with(&v("1.36.4"), "v1.14.0")
                .unwrap_err()
                .to_string(),
            "compatibility with version 1.14.0 is not supported"
        );
    }
}
