//! Add-on installs against the strict Kubernetes API double: ordering, Helm ownership
//! markers, the release record, idempotency, stable TLS material, the Argo CD extras, waits
//! that honour their timeouts, and the double's own strictness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use talboot::addons::helm::{self, ChartMeta};
use talboot::addons::kube::{self as k, Kube, KubeError};
use talboot::addons::manifest::{self, ObjectRef};
use talboot::addons::source::ManifestSource;
use talboot::addons::values::{ArgoCdOptions, CiliumOptions, KsopsOptions, RootApp};
use talboot::addons::{
    AddonError, AddonSpec, ArgoCdSetup, Timeouts, argocd_addon, cilium_addon, install_addon,
};
use talboot::crypto::age::Secret;
use time::OffsetDateTime;

use talboot::sim::kube::{DoubleOptions, KubeDouble};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/addons")
        .join(name)
}

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap()
}

fn timeouts() -> Timeouts {
    Timeouts {
        crd: Duration::from_secs(20),
        rollout: Duration::from_secs(20),
    }
}

async fn session(double: &KubeDouble) -> Kube {
    let client = k::client_from_kubeconfig(double.kubeconfig().as_bytes())
        .await
        .expect("client from the double's kubeconfig");
    Kube::new(client, Duration::from_millis(20))
}

async fn cilium_spec() -> AddonSpec {
    cilium_addon(
        &ManifestSource::Dir(fixture("cilium")),
        ChartMeta {
            name: "cilium".into(),
            version: "1.18.0".into(),
            app_version: "1.18.0".into(),
            description: "eBPF-based Networking, Security, and Observability".into(),
        },
        CiliumOptions {
            kube_proxy_replacement: true,
        },
        Some(&json!({"hubble": {"relay": {"enabled": true}}})),
    )
    .await
    .unwrap()
}

/// Strips what the server owns, leaving what was applied.
fn applied_content(mut obj: Value) -> Value {
    let meta = obj["metadata"].as_object_mut().unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
    ] {
        meta.remove(k);
    }
    obj.as_object_mut().unwrap().remove("status");
    obj
}

fn live(double: &KubeDouble, r: &ObjectRef) -> Value {
    double
        .object(
            &r.api_version,
            &r.kind,
            r.namespace.as_deref().unwrap_or(""),
            &r.name,
        )
        .unwrap_or_else(|| panic!("{r} is not in the cluster"))
}

#[tokio::test]
async fn cilium_set_installs_in_order_with_markers_and_a_release_record() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let spec = cilium_spec().await;

    let outcome = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    assert!(outcome.release_written);
    assert_eq!(outcome.applied.len(), 7, "{outcome:?}"); // 6 objects + the CRD
    // kube-system already existed; re-asserting it changes nothing.
    assert_eq!(outcome.unchanged.len(), 1, "{outcome:?}");

    // Every apply was server-side and forced: the release's objects as Helm's field manager
    // (so `helm upgrade` meets no conflict), the release record itself as talboot.
    let log = double.applies();
    assert!(log.iter().all(|a| a.force), "{log:?}");
    for a in &log {
        let record = a.kind == "Secret" && a.name.starts_with("sh.helm.release.v1.");
        let want = if record { "talboot" } else { "helm" };
        assert_eq!(a.field_manager, want, "{a:?}");
    }
    // The custom resource came only after its CRD was Established.
    let established = double
        .crd_established_at("ciliumloadbalancerippools.cilium.io")
        .unwrap();
    let pool = log
        .iter()
        .find(|a| a.kind == "CiliumLoadBalancerIPPool")
        .unwrap();
    assert!(pool.at >= established);
    let crd_pos = log
        .iter()
        .position(|a| a.kind == "CustomResourceDefinition")
        .unwrap();
    let pool_pos = log
        .iter()
        .position(|a| a.kind == "CiliumLoadBalancerIPPool")
        .unwrap();
    assert!(crd_pos < pool_pos);

    // The release record: right name, type, labels; decodes to exactly what was applied.
    let secret = double
        .object(
            "v1",
            "Secret",
            "kube-system",
            "sh.helm.release.v1.cilium.v1",
        )
        .expect("release record");
    assert_eq!(secret["type"], "helm.sh/release.v1");
    let labels = &secret["metadata"]["labels"];
    assert_eq!(labels["owner"], "helm");
    assert_eq!(labels["name"], "cilium");
    assert_eq!(labels["status"], "deployed");
    assert_eq!(labels["version"], "1");
    assert_eq!(labels["createdAt"], "1790000000");
    let release = helm::decode_release_secret(&secret).unwrap();
    assert_eq!(release["info"]["status"], "deployed");
    assert_eq!(release["version"], 1);
    assert_eq!(release["namespace"], "kube-system");
    assert_eq!(release["chart"]["metadata"]["version"], "1.18.0");
    assert_eq!(release["config"], spec.values);
    // The recorded values are the Talos settings with the operator's on top.
    let config = &release["config"];
    assert_eq!(config["ipam"]["mode"], "kubernetes");
    assert_eq!(config["k8sServiceHost"], "localhost");
    assert_eq!(config["k8sServicePort"], 7445);
    assert_eq!(config["cgroup"]["autoMount"]["enabled"], false);
    assert_eq!(config["cgroup"]["hostRoot"], "/sys/fs/cgroup");
    let agent_caps = config["securityContext"]["capabilities"]["ciliumAgent"]
        .as_array()
        .unwrap();
    assert!(!agent_caps.contains(&json!("SYS_MODULE")));
    assert_eq!(config["hubble"]["relay"]["enabled"], true);
    let docs = manifest::parse_documents("release manifest", release["manifest"].as_str().unwrap())
        .unwrap();
    assert_eq!(docs.len(), spec.objects.len());
    for doc in &docs {
        let r = ObjectRef::of(doc).unwrap();
        assert!(
            manifest::has_markers(doc, "cilium", "kube-system"),
            "{r} lacks Helm's markers"
        );
        assert_eq!(
            &applied_content(live(&double, &r)),
            doc,
            "{r} differs from the record"
        );
    }
    // The ConfigMap without a namespace landed in the release namespace.
    assert!(
        docs.iter()
            .any(|d| d["kind"] == "ConfigMap" && d["metadata"]["namespace"] == "kube-system")
    );
    // The release namespace itself is not part of the release.
    assert!(!docs.iter().any(|d| d["kind"] == "Namespace"));
}

#[tokio::test]
async fn second_run_changes_nothing_even_with_fresh_certificates() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let spec = cilium_spec().await;
    install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    let before = double.resource_versions();
    let applies_before = double.applies().len();

    let later = now() + time::Duration::hours(1);
    let again = install_addon(&kube, &spec, timeouts(), later)
        .await
        .unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert!(!again.release_written);
    assert_eq!(double.resource_versions(), before);
    assert!(
        double.applies()[applies_before..]
            .iter()
            .all(|a| !a.changed)
    );

    // A re-render mints new TLS material (as Cilium's chart does offline): the live
    // certificates are kept, so nothing churns.
    let mut rerendered = spec.clone();
    for obj in &mut rerendered.objects {
        if obj["metadata"]["name"] == "hubble-server-certs" {
            obj["data"] = json!({"ca.crt": STANDARD.encode("RENDER-2-CA"),
                "tls.crt": STANDARD.encode("RENDER-2-CERT"), "tls.key": STANDARD.encode("RENDER-2-KEY")});
        }
    }
    let third = install_addon(&kube, &rerendered, timeouts(), later)
        .await
        .unwrap();
    assert!(third.applied.is_empty(), "{third:?}");
    assert!(!third.release_written);
    assert_eq!(double.resource_versions(), before);
    let certs = double
        .object("v1", "Secret", "kube-system", "hubble-server-certs")
        .unwrap();
    assert_eq!(certs["data"]["ca.crt"], STANDARD.encode("RENDER-1-CA"));

    // A real change is applied and the record rewritten (same revision, first deploy kept).
    let mut changed = spec.clone();
    for obj in &mut changed.objects {
        if obj["metadata"]["name"] == "cilium-config" {
            obj["data"]["debug"] = json!("true");
        }
    }
    let fourth = install_addon(&kube, &changed, timeouts(), later)
        .await
        .unwrap();
    assert_eq!(fourth.applied.len(), 1, "{fourth:?}");
    assert_eq!(fourth.applied[0].name, "cilium-config");
    assert!(fourth.release_written);
    let secret = double
        .object(
            "v1",
            "Secret",
            "kube-system",
            "sh.helm.release.v1.cilium.v1",
        )
        .unwrap();
    let release = helm::decode_release_secret(&secret).unwrap();
    assert!(release["manifest"].as_str().unwrap().contains("debug"));
    assert_eq!(release["info"]["first_deployed"], "2026-09-21T14:13:20Z");
    assert_eq!(secret["metadata"]["labels"]["modifiedAt"], "1790003600");
}

#[tokio::test]
async fn argocd_set_gets_sops_age_and_root_application() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let opts = ArgoCdOptions {
        domain: "argocd.lab.example".into(),
        insecure: true,
        ksops: Some(KsopsOptions {
            image: "viaductoss/ksops:v4.5.1".into(),
        }),
    };
    let identity = {
        use age::secrecy::ExposeSecret;
        let id = age::x25519::Identity::generate();
        format!(
            "# public key: {}\n{}\n",
            id.to_public(),
            id.to_string().expose_secret()
        )
    };
    let setup = ArgoCdSetup {
        release: "argocd".into(),
        namespace: "argocd".into(),
        options: opts,
        operator_values: Some(json!({"server": {"replicas": 1}})),
        age_identity: Some(Arc::new(Secret::new(identity.clone().into_bytes()))),
        root_app: Some(RootApp {
            name: "root".into(),
            repo_url: "https://git.example/cluster.git".into(),
            path: "apps".into(),
            revision: "main".into(),
        }),
    };
    let chart = ChartMeta {
        name: "argo-cd".into(),
        version: "10.1.1".into(),
        app_version: "v3.4.4".into(),
        description: "A Helm chart for Argo CD".into(),
    };
    let spec = argocd_addon(&ManifestSource::Dir(fixture("argocd")), chart, &setup)
        .await
        .unwrap();
    let outcome = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    assert!(outcome.release_written);

    // Namespace first although its file sorts last; sops-age before the workloads.
    let log = double.applies();
    assert_eq!(log[0].kind, "Namespace");
    let pos = |kind: &str, name: &str| {
        log.iter()
            .position(|a| a.kind == kind && a.name == name)
            .unwrap()
    };
    assert!(pos("Secret", "sops-age") < pos("Deployment", "argocd-repo-server"));
    assert!(pos("StatefulSet", "argocd-application-controller") > pos("Namespace", "argocd"));
    assert!(pos("Application", "root") > pos("Secret", "sh.helm.release.v1.argocd.v1"));

    let secret = double.object("v1", "Secret", "argocd", "sops-age").unwrap();
    let keys = STANDARD
        .decode(secret["data"]["keys.txt"].as_str().unwrap())
        .unwrap();
    assert_eq!(keys, identity.as_bytes());
    assert!(
        !manifest::has_markers(&secret, "argocd", "argocd"),
        "sops-age is not Helm's"
    );

    let app = double
        .object("argoproj.io/v1alpha1", "Application", "argocd", "root")
        .unwrap();
    assert_eq!(
        app["spec"]["source"]["repoURL"],
        "https://git.example/cluster.git"
    );
    assert_eq!(app["spec"]["source"]["path"], "apps");
    assert_eq!(app["spec"]["source"]["targetRevision"], "main");

    let record = double
        .object("v1", "Secret", "argocd", "sh.helm.release.v1.argocd.v1")
        .unwrap();
    let release = helm::decode_release_secret(&record).unwrap();
    assert_eq!(release["config"]["global"]["domain"], "argocd.lab.example");
    assert_eq!(
        release["config"]["configs"]["params"]["server.insecure"],
        true
    );
    let docs = manifest::parse_documents("m", release["manifest"].as_str().unwrap()).unwrap();
    assert!(
        docs.iter()
            .all(|d| manifest::has_markers(d, "argocd", "argocd"))
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Application" || d["metadata"]["name"] == "sops-age")
    );

    let before = double.resource_versions();
    let again = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    assert!(
        again.applied.is_empty() && !again.release_written,
        "{again:?}"
    );
    assert_eq!(double.resource_versions(), before);
}

#[tokio::test]
async fn a_deployment_that_never_becomes_ready_fails_at_the_timeout() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    double.never_ready("kube-system", "cilium-operator");
    let kube = session(&double).await;
    let spec = cilium_spec().await;
    let short = Timeouts {
        crd: Duration::from_secs(20),
        rollout: Duration::from_millis(400),
    };
    let err = install_addon(&kube, &spec, short, now()).await.unwrap_err();
    match &err {
        AddonError::Kube {
            source: KubeError::Timeout { what, last, .. },
            ..
        } => {
            assert!(what.contains("cilium-operator"), "{err}");
            assert!(last.contains("0 available of 2"), "{err}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
    // No release is recorded for an install that did not come up.
    assert!(
        double
            .object(
                "v1",
                "Secret",
                "kube-system",
                "sh.helm.release.v1.cilium.v1"
            )
            .is_none()
    );
}

#[tokio::test]
async fn nodes_ready_wait_follows_the_nodes() {
    let double = KubeDouble::start(DoubleOptions {
        nodes: vec![("cp1".into(), true), ("w1".into(), false)],
        ..DoubleOptions::default()
    })
    .await
    .unwrap();
    let kube = session(&double).await;
    let err = kube
        .wait_nodes_ready(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not Ready: w1"), "{err}");
    double.set_node_ready("w1", true);
    kube.wait_nodes_ready(Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_release_upgraded_by_helm_is_left_alone() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let spec = cilium_spec().await;
    let v2 = json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
        "metadata": {"name": "sh.helm.release.v1.cilium.v2", "namespace": "kube-system"},
        "data": {"release": STANDARD.encode("x")}});
    kube.apply(&v2, "kube-system").await.unwrap();
    let err = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap_err();
    assert!(matches!(err, AddonError::TakenOver { .. }), "{err}");
    assert!(err.to_string().contains("helm upgrade"));
}

#[tokio::test]
async fn the_double_is_strict_like_the_api_server() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;

    // A custom resource whose CRD is not there is an unknown kind.
    let pool = json!({"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": "p"}});
    let err = kube.apply(&pool, "default").await.unwrap_err();
    assert!(matches!(err, KubeError::UnknownKind { .. }), "{err}");

    // A namespaced object in a missing Namespace is NotFound.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "nowhere"}});
    let err = kube.apply(&cm, "default").await.unwrap_err().to_string();
    assert!(
        err.contains("namespaces \"nowhere\" not found") && err.contains("404"),
        "{err}"
    );

    // Secret data must be base64.
    let bad = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "default"}, "data": {"k": "not base64!"}});
    let err = kube.apply(&bad, "default").await.unwrap_err().to_string();
    assert!(
        err.contains("illegal base64 data at input byte 3") && err.contains("400"),
        "{err}"
    );

    // Raw PATCHes: the apply content type and a field manager are required.
    let client = k::client_from_kubeconfig(double.kubeconfig().as_bytes())
        .await
        .unwrap();
    let body_with = |value: &str| {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"}, "data": {"k": value}}))
        .unwrap()
    };
    let patch_with = |ctype: &str, query: &str, body: Vec<u8>| {
        axum::http::Request::builder()
            .method("PATCH")
            .uri(format!("/api/v1/namespaces/default/configmaps/c{query}"))
            .header("content-type", ctype)
            .body(body)
            .unwrap()
    };
    let patch = |ctype: &str, query: &str| patch_with(ctype, query, body_with("1"));
    let code = |r: Result<Value, kube::Error>| match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    };
    // A merge patch of an object that does not exist is NotFound; an unknown patch type 415.
    let merge = client
        .request::<Value>(patch(
            "application/merge-patch+json",
            "?fieldManager=talboot",
        ))
        .await;
    assert_eq!(code(merge), 404);
    let unknown = client
        .request::<Value>(patch("text/plain", "?fieldManager=talboot"))
        .await;
    assert_eq!(code(unknown), 415);
    let unmanaged = client
        .request::<Value>(patch("application/apply-patch+yaml", ""))
        .await;
    assert_eq!(code(unmanaged), 422);
    client
        .request::<Value>(patch(
            "application/apply-patch+yaml",
            "?fieldManager=someone",
        ))
        .await
        .unwrap();
    // Another manager applying the same value shares the field; a different value without
    // force conflicts; talboot forces.
    client
        .request::<Value>(patch("application/apply-patch+yaml", "?fieldManager=other"))
        .await
        .unwrap();
    let conflict = client
        .request::<Value>(patch_with(
            "application/apply-patch+yaml",
            "?fieldManager=other",
            body_with("2"),
        ))
        .await;
    assert_eq!(code(conflict), 409);
    let taken = kube
        .apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "b"}}),
            "default",
        )
        .await
        .unwrap();
    assert!(taken.changed);

    // The body must name the object the URL addresses (upstream checkName wording).
    let other_name = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "d", "namespace": "default"}}))
    .unwrap();
    let mismatch = client
        .request::<Value>(
            axum::http::Request::builder()
                .method("PATCH")
                .uri("/api/v1/namespaces/default/configmaps/c?fieldManager=talboot&force=true")
                .header("content-type", "application/apply-patch+yaml")
                .body(other_name)
                .unwrap(),
        )
        .await;
    match mismatch {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 400);
            assert_eq!(
                s.message,
                "the name of the object (d) does not match the name on the URL (c)"
            );
        }
        other => panic!("expected a 400, got {other:?}"),
    }

    // Without the kubeconfig's client certificate there is no connection at all.
    let no_cert: String = double
        .kubeconfig()
        .lines()
        .filter(|l| !l.contains("client-certificate-data") && !l.contains("client-key-data"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("  user:\n", "  user: {}\n");
    let anon = Kube::new(
        k::client_from_kubeconfig(no_cert.as_bytes()).await.unwrap(),
        Duration::from_millis(10),
    );
    assert!(anon.apply(&cm, "default").await.is_err());
}

#[tokio::test]
async fn custom_resources_wait_for_an_established_crd() {
    // A CRD that never becomes Established within the test: its kind stays unknown.
    let double = KubeDouble::start(DoubleOptions {
        crd_delay: Duration::from_secs(3600),
        ..DoubleOptions::default()
    })
    .await
    .unwrap();
    let kube = session(&double).await;
    let crd = manifest::parse_documents(
        "c-crds.yaml",
        &std::fs::read_to_string(fixture("cilium").join("c-crds.yaml")).unwrap(),
    )
    .unwrap()
    .remove(0);
    kube.apply(&crd, "default").await.unwrap();
    let pool = json!({"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": "p"}});
    let err = kube.apply(&pool, "default").await.unwrap_err();
    assert!(matches!(err, KubeError::UnknownKind { .. }), "{err}");
    let err = kube
        .wait_crd_established(
            "ciliumloadbalancerippools.cilium.io",
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Established=\"False\""), "{err}");

    // The whole install fails at the CRD wait, before any custom resource is sent.
    let spec = cilium_spec().await;
    let short = Timeouts {
        crd: Duration::from_millis(200),
        rollout: Duration::from_secs(20),
    };
    let err = install_addon(&kube, &spec, short, now()).await.unwrap_err();
    assert!(err.to_string().contains("to be Established"), "{err}");
    assert!(
        !double
            .applies()
            .iter()
            .any(|a| a.kind == "CiliumLoadBalancerIPPool")
    );
}

/// The Argo CD fixture without its Namespace: the release namespace is talboot's to create,
/// as with the real chart, which renders none.
fn argocd_without_namespace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["argocd.yaml", "crds.yaml"] {
        std::fs::copy(fixture("argocd").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

async fn argocd_spec(dir: &std::path::Path) -> AddonSpec {
    let setup = ArgoCdSetup {
        release: "argocd".into(),
        namespace: "argocd".into(),
        options: ArgoCdOptions {
            domain: "cd.lab".into(),
            insecure: true,
            ksops: None,
        },
        operator_values: None,
        age_identity: None,
        root_app: None,
    };
    let chart = ChartMeta {
        name: "argo-cd".into(),
        version: "10.1.1".into(),
        app_version: "v3.4.4".into(),
        description: String::new(),
    };
    argocd_addon(&ManifestSource::Dir(dir.to_owned()), chart, &setup)
        .await
        .unwrap()
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap().to_owned(),
                e["operation"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Issue 31, item 2: the release Namespace talboot creates is owned through a label (Helm's
/// `name` label), so a second install changes no object; a bare-name Namespace owned
/// nothing, the server then recorded `before-first-apply`, and the Namespace's
/// resourceVersion moved on the second run.
#[tokio::test]
async fn a_second_install_leaves_the_release_namespace_untouched() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let dir = argocd_without_namespace();
    let spec = argocd_spec(dir.path()).await;
    let first = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    assert!(
        first.applied.iter().any(|r| r.kind == "Namespace"),
        "{first:?}"
    );
    let before = double.resource_versions_but_kubelets();
    for run in 2..=3 {
        let again = install_addon(&kube, &spec, timeouts(), now())
            .await
            .unwrap();
        assert!(again.applied.is_empty(), "run {run}: {again:?}");
        assert_eq!(double.resource_versions_but_kubelets(), before, "run {run}");
    }
    let ns = double.object("v1", "Namespace", "", "argocd").unwrap();
    assert_eq!(ns["metadata"]["labels"]["name"], "argocd");
    assert_eq!(managers(&ns), [("talboot".to_owned(), "Apply".to_owned())]);
    // kube-system (not talboot's) is not touched at all by the Cilium install.
    let ks = double.object("v1", "Namespace", "", "kube-system").unwrap();
    install_addon(&kube, &cilium_spec().await, timeouts(), now())
        .await
        .unwrap();
    assert_eq!(
        double.object("v1", "Namespace", "", "kube-system").unwrap(),
        ks
    );
}

/// The take-over fixture's release, installed by talboot.
async fn takeover_install(double: &KubeDouble, kube: &Kube) -> (AddonSpec, Vec<Value>) {
    let spec = AddonSpec {
        release: "relay".into(),
        namespace: "hubble".into(),
        chart: ChartMeta {
            name: "relay".into(),
            version: "0.1.0".into(),
            app_version: "1.18.0".into(),
            description: String::new(),
        },
        values: json!({}),
        objects: ManifestSource::Dir(fixture("takeover"))
            .objects("relay", "hubble", &json!({}))
            .await
            .unwrap(),
        before: Vec::new(),
        after: Vec::new(),
        wait_nodes_ready: false,
    };
    install_addon(kube, &spec, timeouts(), now()).await.unwrap();
    let record = double
        .object("v1", "Secret", "hubble", "sh.helm.release.v1.relay.v1")
        .unwrap();
    let release = helm::decode_release_secret(&record).unwrap();
    // Helm 4 continues the release with its three-way merge unless told otherwise.
    assert_eq!(release["apply_method"], "csa");
    let docs = manifest::parse_documents("release", release["manifest"].as_str().unwrap()).unwrap();
    (spec, docs)
}

/// Issue 31, item 3: Helm v4's server-side upgrade applies the release manifest as field
/// manager `helm` without force (helm/helm v4.1.4 pkg/kube/client.go,
/// patchResourceServerSide). Against talboot's objects that conflicted wherever the stored
/// value differs from the manifest (zero values dropped, server defaults in atomic structs);
/// talboot now applies release objects as `helm`, so there is nothing to conflict with.
#[tokio::test]
async fn helm_server_side_upgrade_of_a_talboot_release_meets_no_conflict() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = session(&double).await;
    let (_, docs) = takeover_install(&double, &kube).await;
    assert_eq!(docs.len(), 3);
    let client = k::client_from_kubeconfig(double.kubeconfig().as_bytes())
        .await
        .unwrap();
    for doc in &docs {
        let r = ObjectRef::of(doc).unwrap();
        let live_obj = live(&double, &r);
        let body = serde_json::to_vec(doc).unwrap();
        let path = match r.kind.as_str() {
            "Deployment" => format!("/apis/apps/v1/namespaces/hubble/deployments/{}", r.name),
            "ConfigMap" => format!("/api/v1/namespaces/hubble/configmaps/{}", r.name),
            _ => format!(
                "/apis/networking.k8s.io/v1/namespaces/hubble/networkpolicies/{}",
                r.name
            ),
        };
        let applied: Value = client
            .request(
                axum::http::Request::builder()
                    .method("PATCH")
                    .uri(format!("{path}?fieldManager=helm&force=false"))
                    .header("content-type", "application/apply-patch+yaml")
                    .body(body)
                    .unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("{r}: {e}"));
        // Nothing changed: the same manager applied the same manifest.
        assert_eq!(
            applied["metadata"]["resourceVersion"], live_obj["metadata"]["resourceVersion"],
            "{r}"
        );
        assert_eq!(
            managers(&applied),
            [("helm".to_owned(), "Apply".to_owned())],
            "{r}"
        );
    }
    // What an older talboot left (everything also owned by `talboot`) conflicts with Helm on
    // exactly the fields — and the next talboot run hands those fields over.
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    kube.apply(deploy, "hubble").await.unwrap();
    let other_manager = serde_json::to_vec(deploy).unwrap();
    let err = client
        .request::<Value>(
            axum::http::Request::builder()
                .method("PATCH")
                .uri("/apis/apps/v1/namespaces/hubble/deployments/relay?fieldManager=python3&force=false")
                .header("content-type", "application/apply-patch+yaml")
                .body(other_manager.clone())
                .unwrap(),
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    for field in [
        ".spec.template.metadata.annotations",
        "].readinessProbe.initialDelaySeconds",
        "].volumeMounts[mountPath=\"/etc/hubble-relay\"].readOnly",
        "].valueFrom.fieldRef",
        ".spec.template.spec.priorityClassName",
    ] {
        assert!(message.contains(field), "{field} not in {message}");
    }
    assert!(message.contains("conflicts with \"talboot\":"), "{message}");
    takeover_install(&double, &kube).await;
    let relay = double
        .object("apps/v1", "Deployment", "hubble", "relay")
        .unwrap();
    assert_eq!(managers(&relay), [("helm".to_owned(), "Apply".to_owned())]);
}

/// Issue 31, item 4: the server's `Warning` headers (here PodSecurity `restricted` findings
/// in a Namespace labelled to warn) reach the install's outcome, per object.
#[tokio::test]
async fn server_warnings_reach_the_outcome() {
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = k::Kube::from_kubeconfig(double.kubeconfig().as_bytes(), Duration::from_millis(20))
        .await
        .unwrap();
    // The operator made the namespace, labelled for PodSecurity warnings, before the install.
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(
        k::client_from_kubeconfig(double.kubeconfig().as_bytes())
            .await
            .unwrap(),
    );
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "argocd",
            "labels": {"pod-security.kubernetes.io/warn": "restricted"}}}))
        .unwrap();
    namespaces
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .unwrap();
    double.warn_on(
        "ConfigMap",
        "argocd",
        "argocd-cmd-params-cm",
        Some("a \"quoted\" warning – für dich"),
    );
    let dir = argocd_without_namespace();
    let spec = argocd_spec(dir.path()).await;
    let out = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    let on = |name: &str| -> Vec<&String> {
        out.warnings
            .iter()
            .filter(|(r, _)| r.name == name)
            .map(|(_, w)| w)
            .collect()
    };
    let server = on("argocd-server");
    assert_eq!(server.len(), 1, "{:?}", out.warnings);
    assert!(
        server[0].starts_with(
            "would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false \
             (container \"server\" must set securityContext.allowPrivilegeEscalation=false)"
        ),
        "{}",
        server[0]
    );
    assert_eq!(
        on("argocd-cmd-params-cm"),
        [&"a \"quoted\" warning – für dich".to_owned()]
    );
    assert!(on("argocd-application-controller")[0].contains("runAsNonRoot != true"));
}
