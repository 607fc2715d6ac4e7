//! Cluster add-ons (Cilium, Argo CD) installed through the Kubernetes API the way Helm would
//! leave them, so Helm or Argo CD can take over later.
//!
//! [`install_addon`] applies a rendered manifest set with server-side apply (the release's
//! objects as field manager `helm`, as `helm install` leaves them, so `helm upgrade` takes
//! over without conflicts; talboot's own extras and the release Namespace it creates as
//! `talboot`): Namespaces first, then CRDs (waiting until Established and refreshing
//! discovery), then everything else; waits for Deployments, DaemonSets and StatefulSets (and, for the CNI,
//! all Nodes) within timeouts; and records a revision-1 `deployed` Helm release whose
//! manifest is exactly what was applied. Every release object carries Helm's ownership
//! markers. Re-running changes nothing: server-side apply of an unchanged object does not
//! bump its resourceVersion (every applied object owns at least one field, so its
//! managedFields do not move either), and the release record is rewritten only when the
//! manifest digest changes. The API server's warnings are collected per object
//! ([`AddonOutcome::warnings`]).
//!
//! Submodules: [`manifest`] (parse, order, markers, digest), [`helm`] (release records),
//! [`values`] (Cilium/Argo CD values, sops-age Secret, root Application), [`policy`]
//! (upstream charts, `helm template` pinning, images, Argo CD setup), [`source`]
//! (`helm template` or a rendered directory), [`kube`] (the API adapter and waits).

pub mod helm;
pub mod kube;
pub mod kyaml;
pub mod manifest;
pub(crate) mod policy;
pub mod source;
pub mod values;
pub mod warnings;

use std::time::Duration;

use serde_json::{Value, json};
use time::OffsetDateTime;

use self::helm::{ChartMeta, ReleaseInput};
use self::kube::{Applied, Kube, KubeError};
use self::manifest::{ObjectRef, Phase};
use self::source::{ManifestSource, SourceError};
use self::values::{ArgoCdOptions, CiliumOptions, ExtraError, RootApp};
use crate::crypto::age::Secret;

/// Errors installing an add-on.
#[derive(Debug, thiserror::Error)]
pub enum AddonError {
    /// The Kubernetes API refused or timed out.
    #[error("add-on {release}: {source}")]
    Kube {
        /// Release name.
        release: String,
        /// What failed.
        #[source]
        source: KubeError,
    },
    /// The release record could not be built or read.
    #[error("add-on {release}: {source}")]
    Release {
        /// Release name.
        release: String,
        /// What failed.
        #[source]
        source: helm::ReleaseError,
    },
    /// The manifest could not be rendered or read.
    #[error("add-on {release}: {source}")]
    Source {
        /// Release name.
        release: String,
        /// What failed.
        #[source]
        source: SourceError,
    },
    /// An extra object (sops-age Secret, root Application) could not be built.
    #[error("add-on {release}: {source}")]
    Extra {
        /// Release name.
        release: String,
        /// What failed.
        #[source]
        source: ExtraError,
    },
    /// KSOPS is enabled but no age identity was given.
    #[error(
        "add-on {0}: KSOPS is enabled but no age identity was given for the sops-age Secret \
         (set the age identity, or disable KSOPS)"
    )]
    KsopsWithoutIdentity(String),
    /// Helm (or someone) already upgraded the release past revision 1.
    #[error(
        "add-on {release}: Helm release {namespace}/{release} is already at revision 2 or \
         later, so it is managed with helm now; talboot leaves it alone (upgrade it with \
         `helm upgrade`)"
    )]
    TakenOver {
        /// Release name.
        release: String,
        /// Release namespace.
        namespace: String,
    },
}

/// Timeouts for the waits of one add-on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Per CRD, until Established.
    pub crd: Duration,
    /// Per Deployment, DaemonSet or StatefulSet, until rolled out; also for all Nodes Ready.
    pub rollout: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            crd: Duration::from_secs(60),
            rollout: Duration::from_secs(600),
        }
    }
}

/// One add-on to install. `Debug` shows names and counts only: values and objects can hold
/// Secrets (the age identity, TLS keys).
#[derive(Clone)]
pub struct AddonSpec {
    /// Helm release name (e.g. `cilium`).
    pub release: String,
    /// Release namespace; namespaced objects without a namespace land here.
    pub namespace: String,
    /// The chart the manifest was rendered from.
    pub chart: ChartMeta,
    /// The values it was rendered with (recorded as the release's `config`).
    pub values: Value,
    /// The rendered objects: the release's manifest.
    pub objects: Vec<Value>,
    /// Objects outside the release applied right after the Namespaces, before anything that
    /// may need them (the `sops-age` Secret the repo-server mounts).
    pub before: Vec<Value>,
    /// Objects outside the release applied once everything is ready (the root Application,
    /// which needs Argo CD's CRD and controller).
    pub after: Vec<Value>,
    /// Also wait for every Node to be Ready (a CNI).
    pub wait_nodes_ready: bool,
}

impl AddonSpec {
    /// The spec with its release manifest: what `source` renders for its release, namespace
    /// and values.
    async fn with_objects_from(mut self, source: &ManifestSource) -> Result<Self, AddonError> {
        self.objects = source
            .objects(&self.release, &self.namespace, &self.values)
            .await
            .map_err(|source| AddonError::Source {
                release: self.release.clone(),
                source,
            })?;
        Ok(self)
    }
}

impl std::fmt::Debug for AddonSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddonSpec")
            .field("release", &self.release)
            .field("namespace", &self.namespace)
            .field("chart", &self.chart)
            .field("objects", &self.objects.len())
            .field("before", &self.before.len())
            .field("after", &self.after.len())
            .field("wait_nodes_ready", &self.wait_nodes_ready)
            .finish_non_exhaustive()
    }
}

/// What an install did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddonOutcome {
    /// Objects created or changed.
    pub applied: Vec<ObjectRef>,
    /// Objects already as wanted.
    pub unchanged: Vec<ObjectRef>,
    /// Whether the Helm release record was (re)written.
    pub release_written: bool,
    /// The API server's warnings, by the object whose apply drew them (PodSecurity
    /// findings, deprecations), in the order they came.
    pub warnings: Vec<(ObjectRef, String)>,
}

impl AddonOutcome {
    fn record(&mut self, a: &Applied) {
        if a.changed {
            self.applied.push(a.reference.clone());
        } else {
            self.unchanged.push(a.reference.clone());
        }
        for w in &a.warnings {
            self.warnings.push((a.reference.clone(), w.clone()));
        }
    }
}

/// The Cilium add-on: release `cilium` in `kube-system`, Talos values with the operator's on
/// top, manifest from `source`, and a wait for every Node to be Ready (the CNI makes them so).
pub async fn cilium_addon(
    source: &ManifestSource,
    chart: ChartMeta,
    options: CiliumOptions,
    operator_values: Option<&Value>,
) -> Result<AddonSpec, AddonError> {
    let (release, namespace) = ("cilium", "kube-system");
    AddonSpec {
        release: release.into(),
        namespace: namespace.into(),
        chart,
        values: values::cilium_values(options, operator_values),
        objects: Vec::new(),
        before: Vec::new(),
        after: Vec::new(),
        wait_nodes_ready: true,
    }
    .with_objects_from(source)
    .await
}

/// How Argo CD is set up. `Debug` leaves out the age identity.
#[derive(Clone)]
pub struct ArgoCdSetup {
    /// Release name (usually `argocd`).
    pub release: String,
    /// Namespace (usually `argocd`).
    pub namespace: String,
    /// talboot's settings.
    pub options: ArgoCdOptions,
    /// The operator's values, merged on top.
    pub operator_values: Option<Value>,
    /// The age identity (keys.txt text) for the `sops-age` Secret; required with KSOPS.
    pub age_identity: Option<std::sync::Arc<Secret>>,
    /// The root Application, if any.
    pub root_app: Option<RootApp>,
}

impl std::fmt::Debug for ArgoCdSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgoCdSetup")
            .field("release", &self.release)
            .field("namespace", &self.namespace)
            .field("options", &self.options)
            .field(
                "age_identity",
                &self.age_identity.as_ref().map(|_| "[REDACTED]"),
            )
            .field("root_app", &self.root_app)
            .finish_non_exhaustive()
    }
}

/// The Argo CD add-on: values (domain, insecure server, KSOPS) with the operator's on top, a
/// `sops-age` Secret applied before the workloads when an identity is given, and the root
/// Application applied once Argo CD is ready.
pub async fn argocd_addon(
    source: &ManifestSource,
    chart: ChartMeta,
    setup: &ArgoCdSetup,
) -> Result<AddonSpec, AddonError> {
    let release = setup.release.as_str();
    let ns = setup.namespace.as_str();
    let extra = |source| AddonError::Extra {
        release: release.into(),
        source,
    };
    let values = values::argocd_values(&setup.options, setup.operator_values.as_ref());
    let mut before = Vec::new();
    match &setup.age_identity {
        Some(id) => before.push(values::sops_age_secret(ns, id).map_err(extra)?),
        None if setup.options.ksops.is_some() => {
            return Err(AddonError::KsopsWithoutIdentity(release.into()));
        }
        None => {}
    }
    let after = match &setup.root_app {
        Some(app) => vec![values::root_application(ns, app).map_err(extra)?],
        None => Vec::new(),
    };
    AddonSpec {
        release: release.into(),
        namespace: ns.into(),
        chart,
        values,
        objects: Vec::new(),
        before,
        after,
        wait_nodes_ready: false,
    }
    .with_objects_from(source)
    .await
}

/// Installs (or re-confirms) one add-on; see the module docs for the steps. `now` stamps the
/// release record when it is written.
pub async fn install_addon(
    kube: &Kube,
    spec: &AddonSpec,
    timeouts: Timeouts,
    now: OffsetDateTime,
) -> Result<AddonOutcome, AddonError> {
    let release = spec.release.as_str();
    let ns = spec.namespace.as_str();
    let kerr = |source| AddonError::Kube {
        release: release.to_owned(),
        source,
    };
    refuse_taken_over(kube, spec).await?;
    let mut outcome = AddonOutcome::default();
    let applied_release = apply_release_objects(kube, spec, timeouts, &mut outcome)
        .await
        .map_err(kerr)?;
    wait_rolled_out(kube, spec, &applied_release, timeouts)
        .await
        .map_err(kerr)?;

    outcome.release_written = write_release(kube, spec, &applied_release, now).await?;

    for obj in &spec.after {
        outcome.record(&kube.apply(obj, ns).await.map_err(kerr)?);
    }
    tracing::info!(
        release,
        changed = outcome.applied.len(),
        unchanged = outcome.unchanged.len(),
        release_written = outcome.release_written,
        "add-on installed"
    );
    Ok(outcome)
}

/// Refuses a release Helm (or someone) already upgraded past revision 1: its second
/// revision's Secret exists.
async fn refuse_taken_over(kube: &Kube, spec: &AddonSpec) -> Result<(), AddonError> {
    let release = spec.release.as_str();
    let ns = spec.namespace.as_str();
    let secret_ref = |revision| ObjectRef {
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: Some(ns.to_owned()),
        name: helm::secret_name(release, revision),
    };
    let second = kube
        .get(&secret_ref(2))
        .await
        .map_err(|source| AddonError::Kube {
            release: release.to_owned(),
            source,
        })?;
    if second.is_some() {
        return Err(AddonError::TakenOver {
            release: release.to_owned(),
            namespace: ns.to_owned(),
        });
    }
    Ok(())
}

/// Applies the release's objects in install order: its Namespace (made when the manifest
/// brings none), the manifest's Namespaces, the `before` objects, the CRDs (waited for until
/// established), then the rest. Answers the applied bodies (the release record's manifest).
async fn apply_release_objects(
    kube: &Kube,
    spec: &AddonSpec,
    timeouts: Timeouts,
    outcome: &mut AddonOutcome,
) -> Result<Vec<Value>, KubeError> {
    let release = spec.release.as_str();
    let ns = spec.namespace.as_str();
    let mut objects = manifest::apply_order(spec.objects.clone());
    for obj in &mut objects {
        manifest::stamp_markers(obj, release, ns);
    }
    let mut applied_release = Vec::with_capacity(objects.len());

    // The release namespace itself, unless the manifest brings it (`helm template` never
    // renders it).
    let has_own_ns = objects
        .iter()
        .any(|o| manifest::phase(o) == Phase::Namespace && o["metadata"]["name"] == ns);
    if !has_own_ns {
        ensure_namespace(kube, ns, outcome).await?;
    }

    let (namespaces, rest): (Vec<Value>, Vec<Value>) = objects
        .into_iter()
        .partition(|o| manifest::phase(o) == Phase::Namespace);
    for obj in &namespaces {
        let a = apply_release_object(kube, obj, ns).await?;
        outcome.record(&a);
        applied_release.push(a.body);
    }
    for obj in &spec.before {
        outcome.record(&kube.apply(obj, ns).await?);
    }

    let (crds, rest): (Vec<Value>, Vec<Value>) = rest
        .into_iter()
        .partition(|o| manifest::phase(o) == Phase::Crd);
    for obj in &crds {
        let a = apply_release_object(kube, obj, ns).await?;
        outcome.record(&a);
        applied_release.push(a.body);
    }
    for obj in &crds {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        kube.wait_crd_established(name, timeouts.crd).await?;
    }
    if !crds.is_empty() {
        // A discovery snapshot from before knows none of the new kinds.
        kube.refresh_discovery();
    }

    for mut obj in rest {
        keep_live_tls(kube, &mut obj, release, ns).await?;
        let a = apply_release_object(kube, &obj, ns).await?;
        outcome.record(&a);
        applied_release.push(a.body);
    }
    Ok(applied_release)
}

/// A rendered TLS Secret that is already live as this release's keeps its live material
/// ([`manifest::carry_tls_material`]), so a re-render does not rotate it.
async fn keep_live_tls(
    kube: &Kube,
    obj: &mut Value,
    release: &str,
    ns: &str,
) -> Result<(), KubeError> {
    if manifest::is_tls_secret(obj)
        && let Some(r) = ObjectRef::of(obj)
    {
        let r = ObjectRef {
            namespace: r.namespace.or_else(|| Some(ns.to_owned())),
            ..r
        };
        if let Some(live) = kube.get(&r).await?
            && manifest::carry_tls_material(obj, &live, release, ns)
        {
            tracing::info!(object = %r, "kept the live TLS material");
        }
    }
    Ok(())
}

/// Waits for every Deployment, DaemonSet and StatefulSet the release applied to roll out,
/// then, where the spec says so, for the nodes to be Ready.
async fn wait_rolled_out(
    kube: &Kube,
    spec: &AddonSpec,
    applied_release: &[Value],
    timeouts: Timeouts,
) -> Result<(), KubeError> {
    let ns = spec.namespace.as_str();
    for body in applied_release {
        let Some(r) = ObjectRef::of(body) else {
            continue;
        };
        let obj_ns = r.namespace.as_deref().unwrap_or(ns);
        match (r.api_version.as_str(), r.kind.as_str()) {
            ("apps/v1", "Deployment") => {
                kube.wait_deployment(obj_ns, &r.name, timeouts.rollout)
                    .await?
            }
            ("apps/v1", "DaemonSet") => {
                kube.wait_daemonset(obj_ns, &r.name, timeouts.rollout)
                    .await?
            }
            ("apps/v1", "StatefulSet") => {
                kube.wait_statefulset(obj_ns, &r.name, timeouts.rollout)
                    .await?
            }
            _ => {}
        }
    }
    if spec.wait_nodes_ready {
        kube.wait_nodes_ready(timeouts.rollout).await?;
    }
    Ok(())
}

/// The label Helm's `--create-namespace` gives the Namespace it creates (helm/helm v4.1.4
/// pkg/action/install.go, `Labels: {"name": <namespace>}`).
const NAMESPACE_NAME_LABEL: &str = "name";

/// Creates the release Namespace if it is missing, the way `helm install --create-namespace`
/// does: server-side applied with the label `name: <namespace>`, which gives talboot a field
/// to own. (A Namespace applied as a bare name owns nothing; structured-merge-diff drops a
/// manager that owns nothing, so the next apply would record it again and move
/// resourceVersion, a change on every re-run.) An existing Namespace talboot did not create
/// (`kube-system`, or one the operator made) is left as it is; one talboot created is
/// re-applied, which changes nothing.
async fn ensure_namespace(
    kube: &Kube,
    ns: &str,
    outcome: &mut AddonOutcome,
) -> Result<(), KubeError> {
    let r = ObjectRef {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        namespace: None,
        name: ns.to_owned(),
    };
    let ns_obj = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {NAMESPACE_NAME_LABEL: ns}}});
    match kube.get(&r).await? {
        Some(live) if !managed_by(&live, kube::FIELD_MANAGER) => {
            tracing::debug!(
                namespace = ns,
                "the release namespace exists; left as it is"
            );
            outcome.unchanged.push(r);
        }
        _ => outcome.record(&kube.apply(&ns_obj, ns).await?),
    }
    Ok(())
}

/// Whether `manager` has an Apply entry in the object's managedFields.
fn managed_by(obj: &Value, manager: &str) -> bool {
    obj["metadata"]["managedFields"]
        .as_array()
        .is_some_and(|m| {
            m.iter()
                .any(|e| e["manager"] == manager && e["operation"] == "Apply")
        })
}

/// Applies one release object as Helm's field manager ([`kube::HELM_FIELD_MANAGER`]). An
/// object an older talboot applied as `talboot` still lists that manager for every field
/// (two appliers of the same value share it); talboot then applies an empty configuration
/// as `talboot`, which releases its fields to `helm` without removing any, since `helm` now
/// owns them all (the documented way to give up fields, kubernetes.io "Server-Side Apply",
/// "Transferring ownership"). After that `helm upgrade` meets no conflict with talboot.
async fn apply_release_object(kube: &Kube, obj: &Value, ns: &str) -> Result<Applied, KubeError> {
    let mut a = kube.apply_as(obj, ns, kube::HELM_FIELD_MANAGER).await?;
    if let Some(live) = kube.get(&a.reference).await?
        && managed_by(&live, kube::FIELD_MANAGER)
    {
        let mut bare = json!({"apiVersion": a.reference.api_version, "kind": a.reference.kind,
            "metadata": {"name": a.reference.name}});
        if let Some(obj_ns) = &a.reference.namespace {
            bare["metadata"]["namespace"] = json!(obj_ns);
        }
        let released = kube.apply(&bare, ns).await?;
        tracing::info!(object = %a.reference, "handed talboot's fields to the helm field manager");
        a.changed |= released.changed;
    }
    Ok(a)
}

/// Writes the revision-1 release record unless one with the same manifest exists. A changed
/// manifest rewrites revision 1 in place (first-deployed time kept): talboot owns the release
/// until Helm writes revision 2, and the record must describe what is live.
async fn write_release(
    kube: &Kube,
    spec: &AddonSpec,
    applied: &[Value],
    now: OffsetDateTime,
) -> Result<bool, AddonError> {
    let release = spec.release.as_str();
    let ns = spec.namespace.as_str();
    let text = manifest::manifest_text(applied);
    let digest = manifest::digest(&text);
    let r = ObjectRef {
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: Some(ns.to_owned()),
        name: helm::secret_name(release, 1),
    };
    let kerr = |source| AddonError::Kube {
        release: release.to_owned(),
        source,
    };
    let rerr = |source| AddonError::Release {
        release: release.to_owned(),
        source,
    };
    let mut first_deployed = now;
    if let Some(live) = kube.get(&r).await.map_err(kerr)? {
        let old = helm::decode_release_secret(&live).map_err(rerr)?;
        let old_manifest = old["manifest"].as_str().unwrap_or_default();
        if manifest::digest(old_manifest) == digest && old["config"] == spec.values {
            tracing::debug!(release, "release record already up to date");
            return Ok(false);
        }
        if let Some(t) = old["info"]["first_deployed"].as_str()
            && let Ok(t) = OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        {
            first_deployed = t;
        }
    }
    let input = ReleaseInput {
        name: release,
        namespace: ns,
        chart: &spec.chart,
        values: &spec.values,
        manifest: &text,
        first_deployed,
        last_deployed: now,
    };
    let secret = helm::release_secret(&input).map_err(rerr)?;
    kube.apply(&secret, ns).await.map_err(kerr)?;
    tracing::info!(release, namespace = ns, %digest, "wrote the Helm release record");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> ChartMeta {
        ChartMeta {
            name: "argo-cd".into(),
            version: "10.1.1".into(),
            app_version: "v3.4.4".into(),
            description: String::new(),
        }
    }

    fn setup() -> ArgoCdSetup {
        ArgoCdSetup {
            release: "argocd".into(),
            namespace: "argocd".into(),
            options: ArgoCdOptions {
                domain: "cd.lab".into(),
                insecure: false,
                ksops: Some(values::KsopsOptions {
                    image: "viaductoss/ksops:v4.5.1".into(),
                }),
            },
            operator_values: None,
            age_identity: None,
            root_app: None,
        }
    }

    #[tokio::test]
    async fn ksops_needs_an_identity_and_debug_redacts_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        )
        .unwrap();
        let src = ManifestSource::Dir(dir.path().to_owned());
        let mut s = setup();
        let err = argocd_addon(&src, chart(), &s).await.unwrap_err();
        assert!(matches!(err, AddonError::KsopsWithoutIdentity(_)), "{err}");

        use ::age::secrecy::ExposeSecret;
        let id = ::age::x25519::Identity::generate();
        let key = id.to_string().expose_secret().to_owned();
        s.age_identity = Some(std::sync::Arc::new(Secret::new(key.clone().into_bytes())));
        let spec = argocd_addon(&src, chart(), &s).await.unwrap();
        assert_eq!(spec.before.len(), 1);
        assert!(spec.after.is_empty());
        assert_eq!(spec.values["global"]["domain"], "cd.lab");
        let shown = format!("{s:?} {spec:?}");
        assert!(
            !shown.contains(&key) && !shown.contains("AGE-SECRET-KEY"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn cilium_addon_waits_for_nodes_and_carries_talos_values() {
        let dir = tempfile::tempdir().unwrap();
        let src = ManifestSource::Dir(dir.path().to_owned());
        let err = cilium_addon(
            &src,
            chart(),
            CiliumOptions {
                kube_proxy_replacement: true,
            },
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AddonError::Source { .. }), "{err}");
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        )
        .unwrap();
        let spec = cilium_addon(
            &src,
            chart(),
            CiliumOptions {
                kube_proxy_replacement: true,
            },
            None,
        )
        .await
        .unwrap();
        assert!(spec.wait_nodes_ready);
        assert_eq!(
            (spec.release.as_str(), spec.namespace.as_str()),
            ("cilium", "kube-system")
        );
        assert_eq!(spec.values["k8sServicePort"], 7445);
    }
}
