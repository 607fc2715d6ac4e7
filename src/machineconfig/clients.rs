//! Admin client configs made offline from the secrets bundle: `talosconfig` and `kubeconfig`.
//!
//! Both mint a fresh client certificate on every call, as `talosctl` and talhelper do:
//! - talosconfig: Ed25519 key (same family as the OS CA), subject O=`os:admin`, EKU clientAuth
//!   only (apid rejects anything else), signed by the OS CA; context named after the cluster.
//! - kubeconfig: ECDSA P-256 key (same family as the Kubernetes CA), CN=`admin`,
//!   O=`system:masters`, signed by the Kubernetes CA; context `admin@<cluster>`.
//!
//! Rendering is pure (time passed in); [`write_private`] is the one file adapter, creating files
//! with mode 0600 atomically because both configs carry private keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use time::OffsetDateTime;

use super::pki::{LeafSpec, PkiError};
use super::secrets::{SecretsBundle, SecretsError};

/// Default lifetime of admin client certificates (Talos: one year for both files).
pub(crate) const DEFAULT_CLIENT_CERT_TTL: time::Duration = time::Duration::days(365);

/// Subject O= that grants full Talos API access.
pub(crate) const TALOS_ADMIN_ROLE: &str = "os:admin";
/// Subject O= that grants Kubernetes cluster-admin.
pub(crate) const KUBERNETES_ADMIN_GROUP: &str = "system:masters";
/// Subject CN= of the admin kubeconfig user.
pub(crate) const KUBERNETES_ADMIN_USER: &str = "admin";

/// Errors from building or writing client configs.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    /// A required input is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// The certificate lifetime is zero or negative.
    #[error("client certificate lifetime (--ttl) must be positive, got {0}")]
    Ttl(time::Duration),
    /// The kubeconfig server is not an https URL.
    #[error("Kubernetes API server `{0}` must be an https:// URL, e.g. https://10.0.0.10:6443")]
    ServerUrl(String),
    /// The bundle's CA cannot be loaded.
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    /// Issuing the client certificate failed.
    #[error("issuing the {what} client certificate failed: {source}")]
    Issue {
        /// Which config the certificate was for.
        what: &'static str,
        /// The underlying problem.
        #[source]
        source: PkiError,
    },
    /// YAML serialization failed.
    #[error("serializing the {what} failed: {reason}")]
    Yaml {
        /// Which config.
        what: &'static str,
        /// Serializer message.
        reason: String,
    },
    /// Writing a file failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Serialize)]
struct TalosConfig<'a> {
    context: &'a str,
    contexts: BTreeMap<&'a str, TalosContext<'a>>,
}

#[derive(Serialize)]
struct TalosContext<'a> {
    endpoints: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    nodes: &'a [String],
    ca: String,
    crt: String,
    key: String,
}

/// Renders an admin talosconfig (YAML) for `cluster_name` with a fresh `os:admin` client
/// certificate valid for `ttl` from `now`. `endpoints` are the apid addresses talosctl dials
/// (control-plane IPs or the VIP); `nodes` the default targets (may be empty).
pub fn talosconfig(
    cluster_name: &str,
    endpoints: &[String],
    nodes: &[String],
    bundle: &SecretsBundle,
    ttl: time::Duration,
    now: OffsetDateTime,
) -> Result<String, ClientConfigError> {
    if cluster_name.is_empty() {
        return Err(ClientConfigError::Empty("cluster name"));
    }
    if !ttl.is_positive() {
        return Err(ClientConfigError::Ttl(ttl));
    }
    let ca = bundle.os_authority()?;
    // Talos's admin certificate has no CN; the role is the O= value.
    let client = ca
        .issue(&LeafSpec::client(None, TALOS_ADMIN_ROLE, now, ttl))
        .map_err(|source| ClientConfigError::Issue {
            what: "talosconfig",
            source,
        })?;
    let config = TalosConfig {
        context: cluster_name,
        contexts: BTreeMap::from([(
            cluster_name,
            TalosContext {
                endpoints,
                nodes,
                ca: STANDARD.encode(ca.cert_pem()),
                crt: STANDARD.encode(&client.crt),
                key: STANDARD.encode(&client.key),
            },
        )]),
    };
    tracing::info!(
        cluster = cluster_name,
        endpoints = endpoints.len(),
        "issued an admin talosconfig client certificate"
    );
    yaml_serde::to_string(&config).map_err(|e| ClientConfigError::Yaml {
        what: "talosconfig",
        reason: e.to_string(),
    })
}

#[derive(Serialize)]
struct KubeConfig {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    clusters: Vec<NamedCluster>,
    users: Vec<NamedUser>,
    contexts: Vec<NamedContext>,
    #[serde(rename = "current-context")]
    current_context: String,
    preferences: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct NamedCluster {
    name: String,
    cluster: KubeCluster,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct KubeCluster {
    server: String,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct NamedUser {
    name: String,
    user: KubeUser,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct KubeUser {
    client_certificate_data: String,
    client_key_data: String,
}

#[derive(Serialize)]
struct NamedContext {
    name: String,
    context: KubeContext,
}

#[derive(Serialize)]
struct KubeContext {
    cluster: String,
    namespace: &'static str,
    user: String,
}

/// Renders an admin kubeconfig (YAML) for `cluster_name` pointing at `server_url` (the cluster
/// endpoint, e.g. `https://<vip>:6443`), with a fresh CN=admin, O=system:masters client
/// certificate signed by the Kubernetes CA and valid for `ttl` from `now`.
pub fn kubeconfig(
    cluster_name: &str,
    server_url: &str,
    bundle: &SecretsBundle,
    ttl: time::Duration,
    now: OffsetDateTime,
) -> Result<String, ClientConfigError> {
    if cluster_name.is_empty() {
        return Err(ClientConfigError::Empty("cluster name"));
    }
    if !server_url.starts_with("https://") || server_url.len() == "https://".len() {
        return Err(ClientConfigError::ServerUrl(server_url.to_owned()));
    }
    if !ttl.is_positive() {
        return Err(ClientConfigError::Ttl(ttl));
    }
    let ca = bundle.k8s_authority()?;
    let client = ca
        .issue(&LeafSpec::client(
            Some(KUBERNETES_ADMIN_USER),
            KUBERNETES_ADMIN_GROUP,
            now,
            ttl,
        ))
        .map_err(|source| ClientConfigError::Issue {
            what: "kubeconfig",
            source,
        })?;
    let user = format!("{KUBERNETES_ADMIN_USER}@{cluster_name}");
    let config = KubeConfig {
        api_version: "v1",
        kind: "Config",
        clusters: vec![NamedCluster {
            name: cluster_name.to_owned(),
            cluster: KubeCluster {
                server: server_url.to_owned(),
                certificate_authority_data: STANDARD.encode(ca.cert_pem()),
            },
        }],
        users: vec![NamedUser {
            name: user.clone(),
            user: KubeUser {
                client_certificate_data: STANDARD.encode(&client.crt),
                client_key_data: STANDARD.encode(&client.key),
            },
        }],
        contexts: vec![NamedContext {
            name: user.clone(),
            context: KubeContext {
                cluster: cluster_name.to_owned(),
                namespace: "default",
                user: user.clone(),
            },
        }],
        current_context: user,
        preferences: BTreeMap::new(),
    };
    tracing::info!(
        cluster = cluster_name,
        server = server_url,
        "issued an admin kubeconfig client certificate"
    );
    yaml_serde::to_string(&config).map_err(|e| ClientConfigError::Yaml {
        what: "kubeconfig",
        reason: e.to_string(),
    })
}

/// Writes `contents` to `path` so that the file only ever exists complete and with mode 0600:
/// a temporary file is created 0600 in the same directory, synced, and renamed over `path`.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), ClientConfigError> {
    crate::fsutil::write_atomic(path, contents, 0o600).map_err(|e| ClientConfigError::Write {
        path: path.to_owned(),
        source: e.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machineconfig::testutil::{
        assert_expires_in, cert_text, have_openssl, openssl_bundle_yaml, openssl_ok, shared_bundle,
    };
    use std::fs;
    use std::os::unix::fs::PermissionsExt as _;
    use yaml_serde::Value;

    fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
        path.iter().fold(v, |v, k| {
            v.get(*k)
                .unwrap_or_else(|| panic!("missing key {k} in {path:?}"))
        })
    }

    fn unb64(v: &Value) -> String {
        String::from_utf8(STANDARD.decode(v.as_str().unwrap()).unwrap()).unwrap()
    }

    fn pem_label(text: &str) -> String {
        pem::parse(text).unwrap().tag().to_owned()
    }

    const TTL_HOURS: i64 = 6;

    /// Checks a talosconfig against its bundle with openssl; returns the client cert text.
    fn check_talosconfig(bundle: &SecretsBundle, dir: &Path) -> String {
        let endpoints = vec!["10.5.0.10".to_owned(), "10.5.0.11".to_owned()];
        let nodes = vec!["10.5.0.10".to_owned(), "10.5.0.20".to_owned()];
        let now = OffsetDateTime::now_utc();
        let text = talosconfig(
            "lab",
            &endpoints,
            &nodes,
            bundle,
            time::Duration::hours(TTL_HOURS),
            now,
        )
        .unwrap();
        let v: Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(get(&v, &["context"]).as_str(), Some("lab"));
        let ctx = get(&v, &["contexts", "lab"]);
        let strings = |k: &str| -> Vec<String> {
            get(ctx, &[k])
                .as_sequence()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(strings("endpoints"), endpoints);
        assert_eq!(strings("nodes"), nodes);
        assert_eq!(unb64(get(ctx, &["ca"])), bundle.os_ca().crt);
        let crt = unb64(get(ctx, &["crt"]));
        let key = unb64(get(ctx, &["key"]));
        assert_eq!(pem_label(&key), "ED25519 PRIVATE KEY");

        if !have_openssl() {
            return String::new();
        }
        std::fs::write(dir.join("os-ca.crt"), &bundle.os_ca().crt).unwrap();
        let cert = cert_text(dir, "talos-client.crt", &crt);
        let v = openssl_ok(
            dir,
            &[
                "verify",
                "-CAfile",
                "os-ca.crt",
                "-purpose",
                "sslclient",
                "talos-client.crt",
            ],
        );
        assert!(v.contains("talos-client.crt: OK"), "{v}");
        // EKU is clientAuth only, so the same certificate is no server certificate.
        let as_server = crate::machineconfig::testutil::openssl(
            dir,
            &[
                "verify",
                "-CAfile",
                "os-ca.crt",
                "-purpose",
                "sslserver",
                "talos-client.crt",
            ],
        );
        assert!(!as_server.status.success());
        assert!(cert.contains("Public Key Algorithm: ED25519"), "{cert}");
        assert!(cert.contains("Subject: O = os:admin\n"), "{cert}");
        assert!(cert.contains("TLS Web Client Authentication"), "{cert}");
        assert!(!cert.contains("Server Authentication"), "{cert}");
        assert!(!cert.contains("CA:TRUE"), "{cert}");
        assert_expires_in(dir, "talos-client.crt", TTL_HOURS * 3600);
        // The key is the certificate's key (openssl needs the standard label to read it).
        std::fs::write(
            dir.join("talos-client.key"),
            key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"),
        )
        .unwrap();
        let from_key = openssl_ok(dir, &["pkey", "-in", "talos-client.key", "-pubout"]);
        let from_crt = openssl_ok(
            dir,
            &["x509", "-in", "talos-client.crt", "-noout", "-pubkey"],
        );
        assert_eq!(from_key, from_crt);
        cert
    }

    fn check_kubeconfig(bundle: &SecretsBundle, dir: &Path) {
        let now = OffsetDateTime::now_utc();
        let text = kubeconfig(
            "lab",
            "https://10.5.0.5:6443",
            bundle,
            time::Duration::hours(TTL_HOURS),
            now,
        )
        .unwrap();
        let v: Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(get(&v, &["apiVersion"]).as_str(), Some("v1"));
        assert_eq!(get(&v, &["kind"]).as_str(), Some("Config"));
        assert_eq!(get(&v, &["current-context"]).as_str(), Some("admin@lab"));
        let cluster = &get(&v, &["clusters"])[0];
        assert_eq!(get(cluster, &["name"]).as_str(), Some("lab"));
        assert_eq!(
            get(cluster, &["cluster", "server"]).as_str(),
            Some("https://10.5.0.5:6443")
        );
        assert_eq!(
            unb64(get(cluster, &["cluster", "certificate-authority-data"])),
            bundle.k8s_ca().crt
        );
        let context = &get(&v, &["contexts"])[0];
        assert_eq!(get(context, &["name"]).as_str(), Some("admin@lab"));
        assert_eq!(get(context, &["context", "cluster"]).as_str(), Some("lab"));
        assert_eq!(
            get(context, &["context", "user"]).as_str(),
            Some("admin@lab")
        );
        let user = &get(&v, &["users"])[0];
        assert_eq!(get(user, &["name"]).as_str(), Some("admin@lab"));
        let crt = unb64(get(user, &["user", "client-certificate-data"]));
        let key = unb64(get(user, &["user", "client-key-data"]));
        assert_eq!(pem_label(&key), "EC PRIVATE KEY");

        if !have_openssl() {
            return;
        }
        std::fs::write(dir.join("k8s-ca.crt"), &bundle.k8s_ca().crt).unwrap();
        let cert = cert_text(dir, "kube-client.crt", &crt);
        let v = openssl_ok(
            dir,
            &[
                "verify",
                "-CAfile",
                "k8s-ca.crt",
                "-purpose",
                "sslclient",
                "kube-client.crt",
            ],
        );
        assert!(v.contains("kube-client.crt: OK"), "{v}");
        assert!(
            cert.contains("Subject: O = system:masters, CN = admin\n"),
            "{cert}"
        );
        assert!(
            cert.contains("Public Key Algorithm: id-ecPublicKey"),
            "{cert}"
        );
        assert!(cert.contains("ASN1 OID: prime256v1"), "{cert}");
        assert!(cert.contains("TLS Web Client Authentication"), "{cert}");
        assert!(!cert.contains("Server Authentication"), "{cert}");
        assert_expires_in(dir, "kube-client.crt", TTL_HOURS * 3600);
        std::fs::write(dir.join("kube-client.key"), &key).unwrap();
        let check = openssl_ok(dir, &["ec", "-in", "kube-client.key", "-check", "-noout"]);
        assert!(check.contains("EC Key valid"), "{check}");
        let from_key = openssl_ok(dir, &["pkey", "-in", "kube-client.key", "-pubout"]);
        let from_crt = openssl_ok(
            dir,
            &["x509", "-in", "kube-client.crt", "-noout", "-pubkey"],
        );
        assert_eq!(from_key, from_crt);
    }

    #[test]
    fn talosconfig_client_cert_chains_to_the_os_ca() {
        let dir = tempfile::tempdir().unwrap();
        check_talosconfig(shared_bundle(), dir.path());
    }

    #[test]
    fn kubeconfig_client_cert_chains_to_the_k8s_ca() {
        let dir = tempfile::tempdir().unwrap();
        check_kubeconfig(shared_bundle(), dir.path());
    }

    #[test]
    fn client_configs_from_an_imported_openssl_bundle_chain() {
        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let bundle = SecretsBundle::from_yaml(&openssl_bundle_yaml(dir.path())).unwrap();
        check_talosconfig(&bundle, dir.path());
        check_kubeconfig(&bundle, dir.path());
    }

    #[test]
    fn each_talosconfig_gets_a_fresh_certificate_and_empty_nodes_are_omitted() {
        let b = shared_bundle();
        let now = OffsetDateTime::now_utc();
        let ttl = DEFAULT_CLIENT_CERT_TTL;
        let a = talosconfig("c", &[], &[], b, ttl, now).unwrap();
        let c = talosconfig("c", &[], &[], b, ttl, now).unwrap();
        assert_ne!(a, c);
        let v: Value = yaml_serde::from_str(&a).unwrap();
        let ctx = get(&v, &["contexts", "c"]);
        assert!(ctx.get("nodes").is_none(), "{a}");
        assert_eq!(
            get(ctx, &["endpoints"]).as_sequence().map(Vec::len),
            Some(0)
        );
    }

    #[test]
    fn bad_inputs_are_refused() {
        let b = shared_bundle();
        let now = OffsetDateTime::now_utc();
        let ttl = DEFAULT_CLIENT_CERT_TTL;
        assert!(matches!(
            talosconfig("", &[], &[], b, ttl, now),
            Err(ClientConfigError::Empty(_))
        ));
        assert!(matches!(
            talosconfig("c", &[], &[], b, time::Duration::ZERO, now),
            Err(ClientConfigError::Ttl(_))
        ));
        for url in ["http://10.0.0.1:6443", "10.0.0.1:6443", "https://"] {
            assert!(
                matches!(
                    kubeconfig("c", url, b, ttl, now),
                    Err(ClientConfigError::ServerUrl(_))
                ),
                "{url}"
            );
        }
        assert!(matches!(
            kubeconfig("c", "https://k:6443", b, time::Duration::hours(-1), now),
            Err(ClientConfigError::Ttl(_))
        ));
    }

    #[test]
    fn write_private_creates_0600_files_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("talosconfig");
        // An existing, world-readable file is replaced by a private one.
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"secret config").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret config");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("talosconfig")]);

        let missing = dir.path().join("no-such-dir").join("kubeconfig");
        let err = write_private(&missing, b"x").unwrap_err();
        assert!(err.to_string().contains("no-such-dir/kubeconfig"), "{err}");
    }
}
