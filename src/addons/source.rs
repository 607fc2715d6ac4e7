//! Where an add-on's manifest comes from: `helm template` with a pinned chart version (when
//! the operator configured a `helm` binary), or a directory of pre-rendered YAML files.
//!
//! The argument list for `helm template` is built by a pure function; running it and reading
//! the directory are thin adapters. See `docs/addons.md` for how to make the directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::manifest::{self, ManifestError};

/// A pinned chart rendered with `helm template`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmTemplate {
    /// The `helm` binary to run.
    pub helm_bin: PathBuf,
    /// Chart reference: `oci://…`, `repo/chart` or a local path.
    pub chart: String,
    /// Repository URL for `--repo`, if the chart is a bare name.
    pub repo: Option<String>,
    /// Pinned chart version (`--version`).
    pub version: String,
    /// Kubernetes version to render for (`--kube-version`), e.g. `1.33.0`.
    pub(crate) kube_version: String,
    /// Extra API versions the cluster serves (`--api-versions`), e.g.
    /// `monitoring.coreos.com/v1`; charts guard optional objects with
    /// `.Capabilities.APIVersions.Has` and silently drop them otherwise.
    pub(crate) api_versions: Vec<String>,
}

/// The source of an add-on's rendered manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestSource {
    /// Render with `helm template`.
    HelmTemplate(HelmTemplate),
    /// Read every `*.yaml`/`*.yml` file of a directory, in file-name order.
    Dir(PathBuf),
}

/// Errors getting a manifest.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file or directory could not be read.
    #[error("cannot read the rendered manifests at {path}: {reason}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The directory holds no manifest files.
    #[error(
        "{0} holds no .yaml or .yml files; render the chart into it with `helm template` \
         (see docs/addons.md)"
    )]
    Empty(PathBuf),
    /// `helm` could not be run or failed.
    #[error("`helm template` for chart {chart} failed: {reason}")]
    Helm {
        /// The chart.
        chart: String,
        /// Why (helm's stderr).
        reason: String,
    },
    /// A local chart is not the pinned version (helm ignores `--version` for local charts).
    #[error(
        "the local chart {chart} is version {found}, but the inventory pins version {pinned} \
         (addons.<name>.version); put the chart of that version there or change the pin"
    )]
    VersionMismatch {
        /// The chart path.
        chart: String,
        /// The version in its Chart.yaml.
        found: String,
        /// The pinned version.
        pinned: String,
    },
    /// The manifest text is not a valid object set.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The `version` of a chart's Chart.yaml text (as `helm show chart` prints it).
pub(crate) fn chart_yaml_version(text: &str) -> Option<String> {
    let doc: yaml_serde::Value = yaml_serde::from_str(text).ok()?;
    match doc.get("version")? {
        yaml_serde::Value::String(s) => Some(s.clone()),
        // An unquoted `version: 1.18` reads as a number.
        yaml_serde::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `helm template` argument list (without the binary) for `release` in `namespace`, with
/// values read from `values_file`. Hooks stay in (argo-cd creates its Redis secret in one)
/// and CRDs are included, so the output is everything the chart would install.
pub(crate) fn helm_template_args(
    t: &HelmTemplate,
    release: &str,
    namespace: &str,
    values_file: &Path,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "template".into(),
        release.into(),
        t.chart.clone().into(),
        "--version".into(),
        t.version.clone().into(),
        "--namespace".into(),
        namespace.into(),
        "--kube-version".into(),
        t.kube_version.clone().into(),
        "--include-crds".into(),
        "--values".into(),
        values_file.as_os_str().to_owned(),
    ];
    if let Some(repo) = &t.repo {
        args.push("--repo".into());
        args.push(repo.clone().into());
    }
    for api in &t.api_versions {
        args.push("--api-versions".into());
        args.push(api.clone().into());
    }
    args
}

impl ManifestSource {
    /// Produces the objects of the add-on: renders with `helm` (values written to a private
    /// temporary file) or reads the directory. `values` is ignored for a directory: it was
    /// rendered with them already.
    pub async fn objects(
        &self,
        release: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Vec<Value>, SourceError> {
        match self {
            ManifestSource::Dir(dir) => read_dir(dir).await,
            ManifestSource::HelmTemplate(t) => {
                let text = run_helm(t, release, namespace, values).await?;
                Ok(manifest::parse_documents(
                    &format!("helm template {}", t.chart),
                    &text,
                )?)
            }
        }
    }
}

async fn read_dir(dir: &Path) -> Result<Vec<Value>, SourceError> {
    let read_err = |path: &Path, e: std::io::Error| SourceError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| read_err(dir, e))?;
    let mut files = Vec::new();
    while let Some(entry) = entries.next_entry().await.map_err(|e| read_err(dir, e))? {
        let path = entry.path();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if is_yaml && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(SourceError::Empty(dir.to_owned()));
    }
    files.sort();
    let mut objects = Vec::new();
    for path in files {
        let text = tokio::fs::read_to_string(&path)
            .await
            .map_err(|e| read_err(&path, e))?;
        objects.extend(manifest::parse_documents(
            &path.display().to_string(),
            &text,
        )?);
    }
    Ok(objects)
}

async fn run_helm(
    t: &HelmTemplate,
    release: &str,
    namespace: &str,
    values: &Value,
) -> Result<String, SourceError> {
    let helm_err = |reason: String| SourceError::Helm {
        chart: t.chart.clone(),
        reason,
    };
    // Values can hold secrets: a private temporary file, removed on drop.
    let mut file = tempfile::Builder::new()
        .prefix("talboot-values-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| helm_err(format!("cannot create a values file: {e}")))?;
    {
        use std::io::Write;
        serde_json::to_writer(&mut file, values)
            .map_err(|e| helm_err(format!("cannot write the values file: {e}")))?;
        file.flush()
            .map_err(|e| helm_err(format!("cannot write the values file: {e}")))?;
    }
    if t.repo.is_none() && Path::new(&t.chart).exists() {
        check_local_version(t).await?;
    }
    let args = helm_template_args(t, release, namespace, file.path());
    tracing::info!(chart = %t.chart, version = %t.version, "rendering with helm template");
    let stdout = helm_output(t, &args).await?;
    String::from_utf8(stdout).map_err(|_| helm_err("output is not UTF-8".into()))
}

/// Runs `helm` with `args` and returns what it printed; a failed run is an error carrying
/// its stderr.
async fn helm_output<S: AsRef<std::ffi::OsStr>>(
    t: &HelmTemplate,
    args: &[S],
) -> Result<Vec<u8>, SourceError> {
    let helm_err = |reason: String| SourceError::Helm {
        chart: t.chart.clone(),
        reason,
    };
    let out = tokio::process::Command::new(&t.helm_bin)
        .args(args)
        .output()
        .await
        .map_err(|e| helm_err(format!("cannot run {}: {e}", t.helm_bin.display())))?;
    if !out.status.success() {
        return Err(helm_err(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(out.stdout)
}

/// Helm renders a local chart (directory or `.tgz`) whatever `--version` says, so the pin is
/// checked against its Chart.yaml (`helm show chart`, which reads both forms).
async fn check_local_version(t: &HelmTemplate) -> Result<(), SourceError> {
    let helm_err = |reason: String| SourceError::Helm {
        chart: t.chart.clone(),
        reason,
    };
    let out = helm_output(t, &["show", "chart", t.chart.as_str()]).await?;
    let found = chart_yaml_version(&String::from_utf8_lossy(&out))
        .ok_or_else(|| helm_err("its Chart.yaml has no version".into()))?;
    if found != t.version {
        return Err(SourceError::VersionMismatch {
            chart: t.chart.clone(),
            found,
            pinned: t.version.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> HelmTemplate {
        HelmTemplate {
            helm_bin: "/usr/local/bin/helm".into(),
            chart: "oci://quay.io/cilium/charts/cilium".into(),
            repo: None,
            version: "1.18.0".into(),
            kube_version: "1.33.0".into(),
            api_versions: vec![
                "monitoring.coreos.com/v1".into(),
                "gateway.networking.k8s.io/v1".into(),
            ],
        }
    }

    #[test]
    fn helm_template_args_pin_everything() {
        let args = helm_template_args(&t(), "cilium", "kube-system", Path::new("/tmp/v.json"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "template",
                "cilium",
                "oci://quay.io/cilium/charts/cilium",
                "--version",
                "1.18.0",
                "--namespace",
                "kube-system",
                "--kube-version",
                "1.33.0",
                "--include-crds",
                "--values",
                "/tmp/v.json",
                "--api-versions",
                "monitoring.coreos.com/v1",
                "--api-versions",
                "gateway.networking.k8s.io/v1",
            ]
        );
        let mut with_repo = t();
        with_repo.chart = "argo-cd".into();
        with_repo.repo = Some("https://argoproj.github.io/argo-helm".into());
        with_repo.api_versions.clear();
        let args = helm_template_args(&with_repo, "argocd", "argocd", Path::new("v"));
        let tail: Vec<&str> = args[args.len() - 2..]
            .iter()
            .map(|a| a.to_str().unwrap())
            .collect();
        assert_eq!(tail, ["--repo", "https://argoproj.github.io/argo-helm"]);
    }

    #[tokio::test]
    async fn dir_source_reads_yaml_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("a.yml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("README.md"), "not yaml").unwrap();
        let src = ManifestSource::Dir(dir.path().to_owned());
        let objs = src.objects("r", "ns", &Value::Null).await.unwrap();
        let names: Vec<&str> = objs
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);

        let empty = tempfile::tempdir().unwrap();
        let err = ManifestSource::Dir(empty.path().to_owned())
            .objects("r", "ns", &Value::Null)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("docs/addons.md"), "{err}");
    }

    #[test]
    fn chart_yaml_version_reads_strings_and_numbers() {
        let chart = "apiVersion: v2\nname: cilium\nversion: 1.18.0\nappVersion: 1.18.0\n";
        assert_eq!(chart_yaml_version(chart).as_deref(), Some("1.18.0"));
        assert_eq!(
            chart_yaml_version("name: x\nversion: 1.5\n").as_deref(),
            Some("1.5")
        );
        assert_eq!(chart_yaml_version("name: x\n"), None);
        assert_eq!(chart_yaml_version(": not yaml: ["), None);
    }

    #[tokio::test]
    async fn failing_helm_reports_stderr() {
        // `false` stands in for a helm that fails: the error names the chart.
        let mut bad = t();
        bad.helm_bin = "/bin/false".into();
        let err = ManifestSource::HelmTemplate(bad)
            .objects("cilium", "kube-system", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("oci://quay.io/cilium/charts/cilium"),
            "{err}"
        );
    }
}
