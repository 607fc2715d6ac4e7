//! Turning the inventory's secret references into [`Credential`]s: an environment variable of
//! the talboot process, or a key of an age- or SOPS-encrypted YAML mapping (the credentials
//! file, decrypted with the same identities as the cluster secrets bundle). Plaintext
//! credentials files are refused. Errors name the variable, file and key, never a value.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::crypto::age::{self, Identities, IdentitySources};
use crate::crypto::sops;
use crate::inventory::{PowerConfig, SecretRef, WolTarget};

use crate::inventory::Credential;

/// Why a secret could not be resolved. Never carries a secret.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CredentialError {
    /// The environment variable the inventory names is not set.
    #[error(
        "node {node}: environment variable {var} (its power secret) is not set; export it before running talboot"
    )]
    EnvMissing {
        /// The node.
        node: String,
        /// The variable.
        var: String,
    },
    /// The credentials file could not be read.
    #[error("cannot read the power credentials file {}: {reason}", .file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// The file is not encrypted: refused.
    #[error(
        "{} holds power credentials in plaintext; encrypt it (`sops encrypt --age <recipient> -i {}`, or age-encrypt it to a `.age` file) and delete the plaintext copy",
        .file.display(), .file.display()
    )]
    Plaintext {
        /// The file.
        file: PathBuf,
    },
    /// No identity decrypted it.
    #[error(
        "cannot decrypt the power credentials file {}: {reason}. Pass --age-identity FILE, or set SOPS_AGE_KEY_FILE or SOPS_AGE_KEY",
        .file.display()
    )]
    Decrypt {
        /// The file.
        file: PathBuf,
        /// Why (from the age/SOPS decoder, which never prints plaintext).
        reason: String,
    },
    /// The decrypted content is not a mapping of names to strings.
    #[error("{}: the decrypted content must be a YAML mapping of key to secret string ({what})", .file.display())]
    Shape {
        /// The file.
        file: PathBuf,
        /// What is off (never a value).
        what: String,
    },
    /// The Wake-on-LAN SecureOn password is not 6 hex or 4 dotted bytes.
    #[error("node {node}: power.{field} ({from}) {reason}")]
    SecureOn {
        /// The node.
        node: String,
        /// The inventory field that names the secret.
        field: &'static str,
        /// Where the secret was read (variable, or file and key), never its value.
        from: String,
        /// What is wrong with it (never the value).
        reason: super::wol::SecureOnError,
    },
    /// The key is not in the file.
    #[error("node {node}: key `{key}` is not in {}; add it (sops edit) or fix passwordKey/tokenSecretKey", .file.display())]
    KeyMissing {
        /// The node.
        node: String,
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
    },
}

/// Resolves secret references, decrypting each credentials file once.
pub(crate) struct Resolver<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    sources: IdentitySources,
    files: HashMap<PathBuf, BTreeMap<String, Credential>>,
}

impl<'a> Resolver<'a> {
    /// Env values from `env`, identities for credentials files from `sources`.
    pub fn new(env: &'a dyn Fn(&str) -> Option<String>, sources: IdentitySources) -> Self {
        Self {
            env,
            sources,
            files: HashMap::new(),
        }
    }

    /// One reference, for node `node` (named in errors).
    pub(crate) fn resolve(
        &mut self,
        node: &str,
        r: &SecretRef,
    ) -> Result<Credential, CredentialError> {
        match r {
            SecretRef::Env(var) => (self.env)(var)
                .filter(|v| !v.is_empty())
                .map(Credential::new)
                .ok_or_else(|| CredentialError::EnvMissing {
                    node: node.to_owned(),
                    var: var.clone(),
                }),
            SecretRef::File { file, key } => {
                if !self.files.contains_key(file) {
                    let map = read_file(file, &self.sources)?;
                    self.files.insert(file.clone(), map);
                }
                self.files[file]
                    .get(key)
                    .cloned()
                    .ok_or_else(|| CredentialError::KeyMissing {
                        node: node.to_owned(),
                        file: file.clone(),
                        key: key.clone(),
                    })
            }
        }
    }

    /// A node's whole power config with its references resolved; a Wake-on-LAN SecureOn
    /// password is checked here, before anything is sent.
    pub fn config(
        &mut self,
        node: &str,
        c: &PowerConfig,
    ) -> Result<PowerConfig<Credential>, CredentialError> {
        let resolved = c.clone().try_map_secrets(|r| self.resolve(node, &r))?;
        if let (
            PowerConfig::Wol(t),
            PowerConfig::Wol(WolTarget {
                secure_on: Some(from),
                ..
            }),
        ) = (&resolved, c)
            && let Some(pw) = &t.secure_on
        {
            super::wol::SecureOn::from_credential(pw).map_err(|reason| {
                CredentialError::SecureOn {
                    node: node.to_owned(),
                    field: match from {
                        SecretRef::Env(_) => "secureOnEnv",
                        SecretRef::File { .. } => "secureOnKey",
                    },
                    from: from.to_string(),
                    reason,
                }
            })?;
        }
        Ok(resolved)
    }
}

/// Decrypts a credentials file (age, or SOPS YAML) into its key → secret mapping.
fn read_file(
    file: &Path,
    sources: &IdentitySources,
) -> Result<BTreeMap<String, Credential>, CredentialError> {
    let bytes = std::fs::read(file).map_err(|e| CredentialError::Read {
        file: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    let decrypt = |reason: String| CredentialError::Decrypt {
        file: file.to_path_buf(),
        reason,
    };
    let is_age = file.extension().is_some_and(|e| e == "age")
        || bytes.starts_with(b"age-encryption.org/")
        || bytes.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----");
    let ids = || Identities::load(sources).map_err(|e| decrypt(e.to_string()));
    let doc: yaml_serde::Value = if is_age {
        let plain = age::decrypt(&bytes, &ids()?).map_err(|e| decrypt(e.to_string()))?;
        let text = std::str::from_utf8(plain.expose()).map_err(|_| CredentialError::Shape {
            file: file.to_path_buf(),
            what: "not UTF-8".into(),
        })?;
        yaml_serde::from_str(text).map_err(|_| CredentialError::Shape {
            file: file.to_path_buf(),
            what: "not YAML".into(),
        })?
    } else {
        let text = String::from_utf8(bytes).map_err(|_| CredentialError::Plaintext {
            file: file.to_path_buf(),
        })?;
        crate::nesting::check_yaml(&text).map_err(|e| CredentialError::Shape {
            file: file.to_path_buf(),
            what: e.to_string(),
        })?;
        let first: Option<yaml_serde::Value> = yaml_serde::from_str(&text).ok();
        if !first.as_ref().is_some_and(sops::is_sops_file) {
            return Err(CredentialError::Plaintext {
                file: file.to_path_buf(),
            });
        }
        let docs = sops::decrypt_yaml(&text, file, &ids()?).map_err(|e| decrypt(e.to_string()))?;
        docs.documents()
            .first()
            .cloned()
            .unwrap_or(yaml_serde::Value::Null)
    };
    let yaml_serde::Value::Mapping(m) = doc else {
        return Err(CredentialError::Shape {
            file: file.to_path_buf(),
            what: "not a mapping".into(),
        });
    };
    let mut out = BTreeMap::new();
    for (k, v) in m {
        match (k, v) {
            (yaml_serde::Value::String(k), yaml_serde::Value::String(v)) => {
                out.insert(k, Credential::new(v));
            }
            (yaml_serde::Value::String(k), _) if k == "sops" => {}
            (k, _) => {
                return Err(CredentialError::Shape {
                    file: file.to_path_buf(),
                    what: format!(
                        "the value of {} is not a string",
                        match k {
                            yaml_serde::Value::String(s) => format!("`{s}`"),
                            _ => "a non-string key".into(),
                        }
                    ),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "BMC_PASS").then(|| "s3cret-from-env".to_owned())
    }

    #[test]
    fn env_references_resolve_and_missing_ones_name_the_variable() {
        let mut r = Resolver::new(&env, IdentitySources::default());
        let c = r.resolve("n1", &SecretRef::Env("BMC_PASS".into())).unwrap();
        assert_eq!(c.expose(), "s3cret-from-env");
        let e = r
            .resolve("n1", &SecretRef::Env("OTHER".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTHER") && e.contains("n1"), "{e}");
    }

    #[test]
    fn a_bad_secureon_password_names_the_field_and_not_the_value() {
        let wol = |var: &str| {
            PowerConfig::Wol(WolTarget {
                mac: "aa:00:00:00:00:21".parse().unwrap(),
                broadcast: std::net::Ipv4Addr::BROADCAST,
                port: 9,
                secure_on: Some(SecretRef::Env(var.into())),
            })
        };
        let env = |name: &str| match name {
            "GOOD" => Some("5e:c2:07:0a:01:ff".to_owned()),
            "BAD" => Some("hunter2-sopass".to_owned()),
            _ => None,
        };
        let mut r = Resolver::new(&env, IdentitySources::default());
        let Ok(PowerConfig::Wol(t)) = r.config("nuc", &wol("GOOD")) else {
            panic!("a good password resolves")
        };
        assert_eq!(t.secure_on.unwrap().expose(), "5e:c2:07:0a:01:ff");
        let e = r.config("nuc", &wol("BAD")).unwrap_err().to_string();
        assert!(
            e.contains(
                "node nuc: power.secureOnEnv (environment variable BAD) is not a SecureOn password"
            ) && e.contains("aa:bb:cc:dd:ee:ff"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn an_age_file_resolves_and_a_plaintext_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let id = ::age::x25519::Identity::generate();
        let key = dir.path().join("key.txt");
        {
            use ::age::secrecy::ExposeSecret;
            std::fs::write(&key, id.to_string().expose_secret()).unwrap();
        }
        let file = dir.path().join("power.age");
        age::write_encrypted(
            &file,
            b"rack1: bmc-pass-xyzzy\n",
            &[id.to_public().to_string()],
        )
        .unwrap();
        let sources = IdentitySources {
            explicit: Some(key),
            ..Default::default()
        };
        let mut r = Resolver::new(&env, sources);
        let c = r
            .resolve(
                "n1",
                &SecretRef::File {
                    file: file.clone(),
                    key: "rack1".into(),
                },
            )
            .unwrap();
        assert_eq!(c.expose(), "bmc-pass-xyzzy");
        let e = r
            .resolve(
                "n1",
                &SecretRef::File {
                    file,
                    key: "rack2".into(),
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("rack2") && !e.contains("xyzzy"), "{e}");

        let plain = dir.path().join("plain.yaml");
        std::fs::write(&plain, "rack1: clear-pass-plugh\n").unwrap();
        let e = r
            .resolve(
                "n1",
                &SecretRef::File {
                    file: plain,
                    key: "rack1".into(),
                },
            )
            .unwrap_err();
        assert!(matches!(e, CredentialError::Plaintext { .. }), "{e}");
        assert!(!e.to_string().contains("plugh"));
    }
}
