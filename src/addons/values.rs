//! Chart values, pure: the Cilium values Talos needs, the Argo CD values talboot sets
//! (domain, insecure server, KSOPS on the repo-server), Helm-style deep merge of the
//! operator's values on top, and the extra objects Argo CD gets (the `sops-age` Secret and an
//! optional root Application).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use crate::crypto::age::{Identities, Secret};

/// KubePrism: the node-local API server load balancer Talos runs on every node.
pub(crate) const KUBEPRISM_HOST: &str = "localhost";
/// KubePrism's port.
pub(crate) const KUBEPRISM_PORT: u16 = 7445;

/// Deep-merges `overlay` into `base` as Helm coalesces values: maps merge key by key, anything
/// else in `overlay` replaces what `base` had, and a `null` in `overlay` deletes the key.
pub(crate) fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                    continue;
                }
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => deep_merge(slot, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// How Cilium runs on this cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CiliumOptions {
    /// Replace kube-proxy (Talos `cluster.proxy.disabled: true`); Cilium then reaches the
    /// API server through KubePrism.
    pub kube_proxy_replacement: bool,
}

/// The values Talos prescribes for Cilium: Kubernetes IPAM, cgroup v2 already mounted by
/// Talos at `/sys/fs/cgroup`, and capabilities without `SYS_MODULE` (Talos forbids loading
/// kernel modules from workloads). With kube-proxy replacement the agent talks to
/// KubePrism (`localhost:7445`), because there is no kube-proxy to route the service IP.
pub(crate) fn cilium_talos_values(opts: CiliumOptions) -> Value {
    let mut v = json!({
        "ipam": { "mode": "kubernetes" },
        "kubeProxyReplacement": opts.kube_proxy_replacement,
        "securityContext": { "capabilities": {
            "ciliumAgent": [
                "CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN",
                "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"
            ],
            "cleanCiliumState": ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"],
        }},
        "cgroup": { "autoMount": { "enabled": false }, "hostRoot": "/sys/fs/cgroup" },
    });
    if opts.kube_proxy_replacement {
        v["k8sServiceHost"] = json!(KUBEPRISM_HOST);
        v["k8sServicePort"] = json!(KUBEPRISM_PORT);
    }
    v
}

/// Cilium values: the Talos settings with the operator's values merged on top (operator wins).
pub(crate) fn cilium_values(opts: CiliumOptions, operator: Option<&Value>) -> Value {
    let mut v = cilium_talos_values(opts);
    if let Some(o) = operator {
        deep_merge(&mut v, o);
    }
    v
}

/// Name of the Secret holding the age identity for KSOPS.
pub(crate) const SOPS_AGE_SECRET: &str = "sops-age";
/// Where the age identity is mounted in the repo-server.
const SOPS_AGE_DIR: &str = "/.config/sops/age";

/// KSOPS (SOPS-encrypted Secrets in kustomize builds) on the Argo CD repo-server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KsopsOptions {
    /// The KSOPS image providing `ksops` and `kustomize`, e.g. `viaductoss/ksops:v4.5.1`.
    pub image: String,
}

/// What talboot sets in the Argo CD chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgoCdOptions {
    /// `global.domain`: the host name Argo CD is reached at.
    pub domain: String,
    /// `configs.params."server.insecure"`: TLS ends at the ingress or gateway.
    pub insecure: bool,
    /// KSOPS settings, when SOPS decryption is enabled.
    pub ksops: Option<KsopsOptions>,
}

/// Argo CD values from the options, per the argo-cd chart and the KSOPS README: alpha
/// plugins and exec enabled for kustomize, an init container copying `ksops` and `kustomize`
/// into a shared `custom-tools` volume mounted over `/usr/local/bin`, and the `sops-age`
/// Secret mounted with `SOPS_AGE_KEY_FILE` pointing at it.
pub(crate) fn argocd_talboot_values(opts: &ArgoCdOptions) -> Value {
    let mut v = json!({
        "global": { "domain": opts.domain },
        "configs": { "params": { "server.insecure": opts.insecure } },
    });
    if let Some(k) = &opts.ksops {
        v["configs"]["cm"] = json!({
            "kustomize.buildOptions": "--enable-alpha-plugins --enable-exec",
        });
        v["repoServer"] = json!({
            "volumes": [
                { "name": "custom-tools", "emptyDir": {} },
                { "name": "sops-age", "secret": { "secretName": SOPS_AGE_SECRET } },
            ],
            "initContainers": [{
                "name": "install-ksops",
                "image": k.image,
                "command": ["/bin/sh", "-c"],
                "args": ["echo \"Installing KSOPS...\"; \
                          /usr/local/bin/ksops install --with-kustomize /custom-tools"],
                "volumeMounts": [{ "mountPath": "/custom-tools", "name": "custom-tools" }],
            }],
            "volumeMounts": [
                { "mountPath": "/usr/local/bin/kustomize", "name": "custom-tools",
                  "subPath": "kustomize" },
                { "mountPath": "/usr/local/bin/ksops", "name": "custom-tools",
                  "subPath": "ksops" },
                { "mountPath": SOPS_AGE_DIR, "name": "sops-age" },
            ],
            "env": [
                { "name": "SOPS_AGE_KEY_FILE", "value": format!("{SOPS_AGE_DIR}/keys.txt") },
                { "name": "XDG_CONFIG_HOME", "value": "/.config" },
            ],
        });
    }
    v
}

/// Argo CD values: talboot's settings with the operator's values merged on top.
pub(crate) fn argocd_values(opts: &ArgoCdOptions, operator: Option<&Value>) -> Value {
    let mut v = argocd_talboot_values(opts);
    if let Some(o) = operator {
        deep_merge(&mut v, o);
    }
    v
}

/// Errors building Argo CD's extra objects.
#[derive(Debug, thiserror::Error)]
pub enum ExtraError {
    /// The age identity text holds no usable key.
    #[error(
        "the age identity for the sops-age Secret is unusable: {0} \
         (give an age-keygen identity file with an AGE-SECRET-KEY-1… line)"
    )]
    AgeIdentity(String),
    /// A root Application field is empty.
    #[error("the root Application needs a non-empty {0}")]
    RootApp(&'static str),
}

/// The `sops-age` Secret (key `keys.txt`) in Argo CD's namespace, from the operator's age
/// identity text. The text is checked to hold at least one identity first, so a wrong file
/// fails here rather than as a decryption error inside Argo CD much later.
pub(crate) fn sops_age_secret(namespace: &str, identity: &Secret) -> Result<Value, ExtraError> {
    let text = std::str::from_utf8(identity.expose())
        .map_err(|_| ExtraError::AgeIdentity("it is not UTF-8 text".into()))?;
    let ids = Identities::from_text("sops-age identity", text)
        .map_err(|e| ExtraError::AgeIdentity(e.to_string()))?;
    if ids.recipients().is_empty() {
        return Err(ExtraError::AgeIdentity("it contains no identity".into()));
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": SOPS_AGE_SECRET, "namespace": namespace },
        "type": "Opaque",
        "data": { "keys.txt": STANDARD.encode(identity.expose()) },
    }))
}

/// The root Application ("app of apps") Argo CD syncs the rest of the cluster from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootApp {
    /// Application name.
    pub name: String,
    /// Git repository URL.
    pub repo_url: String,
    /// Path inside the repository.
    pub path: String,
    /// Branch, tag or commit.
    pub revision: String,
}

/// The root Application object in Argo CD's namespace, syncing automatically into the
/// cluster it runs in.
pub(crate) fn root_application(argocd_namespace: &str, app: &RootApp) -> Result<Value, ExtraError> {
    for (field, value) in [
        ("name", &app.name),
        ("repository URL", &app.repo_url),
        ("path", &app.path),
        ("revision", &app.revision),
    ] {
        if value.trim().is_empty() {
            return Err(ExtraError::RootApp(field));
        }
    }
    Ok(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": { "name": app.name, "namespace": argocd_namespace },
        "spec": {
            "project": "default",
            "source": {
                "repoURL": app.repo_url,
                "path": app.path,
                "targetRevision": app.revision,
            },
            "destination": {
                "server": "https://kubernetes.default.svc",
                "namespace": argocd_namespace,
            },
            "syncPolicy": { "automated": { "prune": true, "selfHeal": true } },
        },
    }))
}

/// Why operator values could not be read; each message starts with the values' source name.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// The text nests deeper than talboot parses.
    #[error("{source_name}: {source}")]
    TooDeep {
        /// Where the values came from.
        source_name: String,
        /// How deep.
        source: crate::nesting::TooDeep,
    },
    /// The text is not YAML.
    #[error("{source_name}: {source}")]
    Yaml {
        /// Where the values came from.
        source_name: String,
        /// The parser's description and position.
        source: yaml_serde::Error,
    },
    /// The values are not a mapping.
    #[error("{source_name}: values must be a mapping at the top")]
    NotMapping {
        /// Where the values came from.
        source_name: String,
    },
}

/// Converts operator values read from YAML into JSON values (maps only at the top).
pub fn values_from_yaml(source_name: &str, text: &str) -> Result<Value, ValuesError> {
    crate::nesting::check_yaml(text).map_err(|source| ValuesError::TooDeep {
        source_name: source_name.to_owned(),
        source,
    })?;
    let v: Value = yaml_serde::from_str(text).map_err(|source| ValuesError::Yaml {
        source_name: source_name.to_owned(),
        source,
    })?;
    match v {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::Object(_) => Ok(v),
        _ => Err(ValuesError::NotMapping {
            source_name: source_name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_merge_operator_wins_and_null_deletes() {
        let mut base = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x", "e": 1});
        deep_merge(
            &mut base,
            &json!({"a": {"c": [3]}, "d": {"n": 1}, "e": null, "f": true}),
        );
        assert_eq!(
            base,
            json!({"a": {"b": 1, "c": [3]}, "d": {"n": 1}, "f": true})
        );
    }

    #[test]
    fn cilium_values_carry_the_talos_settings() {
        let v = cilium_values(
            CiliumOptions {
                kube_proxy_replacement: true,
            },
            None,
        );
        assert_eq!(v["ipam"]["mode"], "kubernetes");
        assert_eq!(v["kubeProxyReplacement"], true);
        assert_eq!(v["k8sServiceHost"], "localhost");
        assert_eq!(v["k8sServicePort"], 7445);
        assert_eq!(v["cgroup"]["autoMount"]["enabled"], false);
        assert_eq!(v["cgroup"]["hostRoot"], "/sys/fs/cgroup");
        let caps = &v["securityContext"]["capabilities"];
        let agent: Vec<&str> = caps["ciliumAgent"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert!(!agent.contains(&"SYS_MODULE"));
        assert!(agent.contains(&"NET_ADMIN") && agent.contains(&"SYS_ADMIN"));
        assert_eq!(
            caps["cleanCiliumState"],
            json!(["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"])
        );
        let with_proxy = cilium_values(
            CiliumOptions {
                kube_proxy_replacement: false,
            },
            None,
        );
        assert_eq!(with_proxy["kubeProxyReplacement"], false);
        assert!(with_proxy.get("k8sServiceHost").is_none());
    }

    #[test]
    fn operator_values_override_cilium_defaults() {
        let op = json!({"ipam": {"operator": {"clusterPoolIPv4PodCIDRList": ["10.0.0.0/8"]}},
                        "hubble": {"enabled": true}, "k8sServicePort": 6443});
        let v = cilium_values(
            CiliumOptions {
                kube_proxy_replacement: true,
            },
            Some(&op),
        );
        assert_eq!(v["ipam"]["mode"], "kubernetes");
        assert_eq!(
            v["ipam"]["operator"]["clusterPoolIPv4PodCIDRList"][0],
            "10.0.0.0/8"
        );
        assert_eq!(v["hubble"]["enabled"], true);
        assert_eq!(v["k8sServicePort"], 6443);
    }

    #[test]
    fn argocd_values_with_and_without_ksops() {
        let mut opts = ArgoCdOptions {
            domain: "argocd.lab".into(),
            insecure: true,
            ksops: None,
        };
        let v = argocd_values(&opts, None);
        assert_eq!(v["global"]["domain"], "argocd.lab");
        assert_eq!(v["configs"]["params"]["server.insecure"], true);
        assert!(v.get("repoServer").is_none());
        opts.ksops = Some(KsopsOptions {
            image: "viaductoss/ksops:v4.5.1".into(),
        });
        let v = argocd_values(&opts, Some(&json!({"global": {"domain": "cd.example"}})));
        assert_eq!(v["global"]["domain"], "cd.example");
        assert_eq!(
            v["configs"]["cm"]["kustomize.buildOptions"],
            "--enable-alpha-plugins --enable-exec"
        );
        let rs = &v["repoServer"];
        assert_eq!(rs["initContainers"][0]["image"], "viaductoss/ksops:v4.5.1");
        assert_eq!(rs["volumes"][1]["secret"]["secretName"], "sops-age");
        assert!(rs["env"].as_array().unwrap().iter().any(
            |e| e["name"] == "SOPS_AGE_KEY_FILE" && e["value"] == "/.config/sops/age/keys.txt"
        ));
        assert!(
            rs["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["subPath"] == "ksops")
        );
    }

    #[test]
    fn sops_age_secret_checks_the_identity() {
        let id = ::age::x25519::Identity::generate();
        use ::age::secrecy::ExposeSecret;
        let text = format!("# created: now\n{}\n", id.to_string().expose_secret());
        let s = sops_age_secret("argocd", &Secret::new(text.clone().into_bytes())).unwrap();
        assert_eq!(s["metadata"]["name"], "sops-age");
        assert_eq!(s["metadata"]["namespace"], "argocd");
        let stored = STANDARD
            .decode(s["data"]["keys.txt"].as_str().unwrap())
            .unwrap();
        assert_eq!(stored, text.as_bytes());
        let err = sops_age_secret("argocd", &Secret::new(b"# nothing\n".to_vec())).unwrap_err();
        assert!(err.to_string().contains("AGE-SECRET-KEY-1"), "{err}");
    }

    #[test]
    fn root_application_needs_every_field() {
        let mut app = RootApp {
            name: "root".into(),
            repo_url: "https://git.example/cluster.git".into(),
            path: "apps".into(),
            revision: "main".into(),
        };
        let a = root_application("argocd", &app).unwrap();
        assert_eq!(a["kind"], "Application");
        assert_eq!(a["spec"]["source"]["targetRevision"], "main");
        app.path = " ".into();
        assert!(matches!(
            root_application("argocd", &app),
            Err(ExtraError::RootApp("path"))
        ));
    }

    #[test]
    fn values_from_yaml_wants_a_mapping() {
        assert_eq!(values_from_yaml("v", "").unwrap(), json!({}));
        assert_eq!(values_from_yaml("v", "a: 1\n").unwrap(), json!({"a": 1}));
        assert!(
            values_from_yaml("v", "- 1\n")
                .unwrap_err()
                .to_string()
                .contains("mapping")
        );
    }
}
