//! Add-on chart policy: which upstream chart each add-on comes from, how `helm template` is
//! invoked for it (pinned chart version, the inventory's Kubernetes version, the API
//! versions the cluster serves), the images talboot adds (KSOPS) and Argo CD's setup. Pure
//! functions of the inventory; the cluster steps ([`crate::provision::steps`]) only call them.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::ArgoCdSetup;
use super::helm::ChartMeta;
use super::source::HelmTemplate;
use super::values::{ArgoCdOptions, KsopsOptions, RootApp};
use crate::crypto::age::Secret;
use crate::inventory::{ArgoCdAddon, ChartRef, Version};

/// KSOPS image used when the inventory enables KSOPS.
pub const KSOPS_IMAGE: &str = "viaductoss/ksops:v4.5.1";
/// An add-on's upstream chart: what `helm template` renders unless `addons.<name>.chart`
/// says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamChart {
    /// The inventory key and manifest subdirectory (`cilium`, `argocd`).
    pub addon: &'static str,
    /// The chart's name in its repository.
    pub name: &'static str,
    /// The upstream chart repository.
    pub repo: &'static str,
}

/// Cilium's chart (`cilium/cilium`).
pub const CILIUM_CHART: UpstreamChart = UpstreamChart {
    addon: "cilium",
    name: "cilium",
    repo: "https://helm.cilium.io",
};

/// Argo CD's chart (`argo/argo-cd`).
pub const ARGOCD_CHART: UpstreamChart = UpstreamChart {
    addon: "argocd",
    name: "argo-cd",
    repo: "https://argoproj.github.io/argo-helm",
};

/// What `helm template` renders for an add-on: the chart from `chart` (a repository URL
/// keeps the chart's upstream name; an OCI reference or a local path is the chart itself)
/// or else the upstream repository, at the pinned `version`, for Kubernetes `kube_version`
/// with the cluster's `api_versions`.
pub fn helm_template(
    helm: &Path,
    upstream: &UpstreamChart,
    chart: Option<&ChartRef>,
    version: &Version,
    kube_version: &Version,
    api_versions: Vec<String>,
) -> HelmTemplate {
    let (chart, repo) = match chart {
        None => (upstream.name.to_owned(), Some(upstream.repo.to_owned())),
        Some(ChartRef::Repo(url)) => (upstream.name.to_owned(), Some(url.clone())),
        Some(ChartRef::Oci(r)) => (r.clone(), None),
        Some(ChartRef::Local(p)) => (p.to_string_lossy().into_owned(), None),
    };
    HelmTemplate {
        helm_bin: helm.to_owned(),
        chart,
        repo,
        // Chart versions carry no `v`; `Version`'s Display adds one.
        version: version.0.to_string(),
        kube_version: kube_version.0.to_string(),
        api_versions,
    }
}

/// How Argo CD is set up from its inventory entry and the operator's KSOPS age identity.
pub fn argocd_setup(a: &ArgoCdAddon, age_identity: Option<Arc<Secret>>) -> ArgoCdSetup {
    ArgoCdSetup {
        release: "argocd".into(),
        namespace: "argocd".into(),
        options: ArgoCdOptions {
            domain: a.domain.clone().unwrap_or_default(),
            insecure: a.insecure,
            ksops: a.ksops.then(|| KsopsOptions {
                image: KSOPS_IMAGE.into(),
            }),
        },
        operator_values: operator_values(&a.values),
        age_identity,
        root_app: a.root_app.as_ref().map(|r| RootApp {
            name: "root".into(),
            repo_url: r.repo_url.clone(),
            path: r.path.clone(),
            revision: r.revision.clone(),
        }),
    }
}

/// Chart metadata for the release record; Helm chart versions carry no `v`.
pub(crate) fn chart_meta(name: &str, version: &semver::Version) -> ChartMeta {
    ChartMeta {
        name: name.into(),
        version: version.to_string(),
        app_version: version.to_string(),
        description: String::new(),
    }
}

/// The operator's `values` of an add-on as JSON (`None` when empty).
pub fn operator_values(v: &yaml_serde::Value) -> Option<Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) if !m.is_empty() => Some(Value::Object(m)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::addons::AddonError;
    use crate::addons::argocd_addon;
    use crate::addons::source::ManifestSource;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn helm_template_pins_chart_version_kube_version_and_chart_source() {
        let helm = Path::new("/opt/helm/helm");
        let apis = vec!["cilium.io/v2".to_owned()];
        let t = helm_template(
            helm,
            &ARGOCD_CHART,
            None,
            &v("10.1.1"),
            &v("v1.36.3"),
            apis.clone(),
        );
        assert_eq!(
            t,
            HelmTemplate {
                helm_bin: helm.into(),
                chart: "argo-cd".into(),
                repo: Some("https://argoproj.github.io/argo-helm".into()),
                version: "10.1.1".into(),
                kube_version: "1.36.3".into(),
                api_versions: apis.clone(),
            }
        );
        let mirror = ChartRef::Repo("https://mirror.lab/cilium".into());
        let t = helm_template(
            helm,
            &CILIUM_CHART,
            Some(&mirror),
            &v("1.18.0"),
            &v("1.36.3"),
            Vec::new(),
        );
        assert_eq!(
            (t.chart.as_str(), t.repo.as_deref()),
            ("cilium", Some("https://mirror.lab/cilium"))
        );
        let default = helm_template(helm, &CILIUM_CHART, None, &v("1.18.0"), &v("1.36.3"), apis);
        assert_eq!(default.repo.as_deref(), Some("https://helm.cilium.io"));
        let oci = ChartRef::Oci("oci://quay.io/cilium/charts/cilium".into());
        let t = helm_template(
            helm,
            &CILIUM_CHART,
            Some(&oci),
            &v("1.18.0"),
            &v("1.36.3"),
            vec![],
        );
        assert_eq!(
            (t.chart.as_str(), t.repo),
            ("oci://quay.io/cilium/charts/cilium", None)
        );
        let local = ChartRef::Local("/srv/charts/cilium-1.18.0.tgz".into());
        let t = helm_template(
            helm,
            &CILIUM_CHART,
            Some(&local),
            &v("1.18.0"),
            &v("1.36.3"),
            vec![],
        );
        assert_eq!(
            (t.chart.as_str(), t.repo),
            ("/srv/charts/cilium-1.18.0.tgz", None)
        );
    }

    fn argocd(insecure: bool, ksops: bool) -> ArgoCdAddon {
        ArgoCdAddon {
            enabled: true,
            version: crate::inventory::Spanned::new(
                v("10.1.1"),
                crate::inventory::Loc {
                    file: Arc::new(PathBuf::from("t.yaml")),
                    line: 1,
                    column: 1,
                },
            ),
            values: yaml_serde::Value::Mapping(Default::default()),
            domain: Some("cd.lab".into()),
            ksops,
            insecure,
            root_app: None,
            chart: None,
        }
    }

    #[tokio::test]
    async fn argocd_setup_follows_insecure_and_passes_the_ksops_identity() {
        for insecure in [false, true] {
            let setup = argocd_setup(&argocd(insecure, false), None);
            assert_eq!(setup.options.insecure, insecure);
            let values = crate::addons::values::argocd_values(
                &setup.options,
                setup.operator_values.as_ref(),
            );
            assert_eq!(values["configs"]["params"]["server.insecure"], insecure);
        }

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        )
        .unwrap();
        let src = ManifestSource::Dir(dir.path().to_owned());
        let meta = chart_meta("argo-cd", &v("10.1.1").0);
        // Without an identity KSOPS cannot be set up ...
        let err = argocd_addon(
            &src,
            meta.clone(),
            &argocd_setup(&argocd(false, true), None),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AddonError::KsopsWithoutIdentity(_)), "{err}");
        // ... with one, it becomes the sops-age Secret applied before the workloads.
        use ::age::secrecy::ExposeSecret;
        let key = ::age::x25519::Identity::generate()
            .to_string()
            .expose_secret()
            .to_owned();
        let id = Arc::new(Secret::new(format!("# test\n{key}\n").into_bytes()));
        let setup = argocd_setup(&argocd(false, true), Some(id));
        let spec = argocd_addon(&src, meta, &setup).await.unwrap();
        assert_eq!(spec.before.len(), 1);
        assert_eq!(spec.before[0]["metadata"]["name"], "sops-age");
        let shown = format!("{setup:?} {spec:?}");
        assert!(!shown.contains(&key), "{shown}");
    }
}
