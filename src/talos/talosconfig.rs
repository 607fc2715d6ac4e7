//! Reading admin credentials out of a talosconfig file (`context`, `contexts.<name>.ca/crt/key`,
//! each base64 of PEM), so the provisioner can talk mTLS to configured nodes.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::client::ClientCreds;
use super::error::TalosError;

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, Context>,
}

#[derive(Deserialize)]
struct Context {
    #[serde(default)]
    ca: String,
    #[serde(default)]
    crt: String,
    #[serde(default)]
    key: String,
}

impl ClientCreds {
    /// The credentials of `context` (or the file's current `context` when `None`) in a
    /// talosconfig. Errors name the part that is missing or unreadable, never key material.
    pub(crate) fn from_talosconfig(yaml: &str, context: Option<&str>) -> Result<Self, TalosError> {
        let bad = |what: &'static str, reason: String| TalosError::Credentials { what, reason };
        crate::nesting::check_yaml(yaml)
            .map_err(|e| bad("talosconfig", format!("not a talosconfig YAML file: {e}")))?;
        let file: File = yaml_serde::from_str(yaml)
            .map_err(|e| bad("talosconfig", format!("not a talosconfig YAML file: {e}")))?;
        let name = context
            .map(str::to_owned)
            .or(file.context.clone())
            .ok_or_else(|| {
                bad(
                    "talosconfig",
                    "no `context` set and none asked for; name the context to use".into(),
                )
            })?;
        let ctx = file.contexts.get(&name).ok_or_else(|| {
            bad(
                "talosconfig",
                format!(
                    "context {name:?} not found (contexts: {})",
                    file.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let decode = |what: &'static str, value: &str| -> Result<Vec<u8>, TalosError> {
            if value.trim().is_empty() {
                return Err(bad(what, format!("empty in context {name:?}")));
            }
            STANDARD
                .decode(value.trim())
                .map_err(|e| bad(what, format!("not base64 in context {name:?}: {e}")))
        };
        Ok(ClientCreds {
            ca_pem: decode("CA certificate", &ctx.ca)?,
            crt_pem: decode("client certificate", &ctx.crt)?,
            key_pem: decode("client key", &ctx.key)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    #[test]
    fn reads_current_and_named_context() {
        let yaml = format!(
            "context: lab\ncontexts:\n  lab:\n    endpoints: []\n    ca: {}\n    crt: {}\n    key: {}\n  other:\n    ca: {}\n    crt: {}\n    key: {}\n",
            b64("CA1"),
            b64("CRT1"),
            b64("KEY1"),
            b64("CA2"),
            b64("CRT2"),
            b64("KEY2")
        );
        let c = ClientCreds::from_talosconfig(&yaml, None).unwrap();
        assert_eq!(c.ca_pem, b"CA1");
        assert_eq!(c.key_pem, b"KEY1");
        let c = ClientCreds::from_talosconfig(&yaml, Some("other")).unwrap();
        assert_eq!(c.crt_pem, b"CRT2");
        let err = ClientCreds::from_talosconfig(&yaml, Some("nope")).unwrap_err();
        assert!(err.to_string().contains("lab, other"), "{err}");
    }

    #[test]
    fn errors_name_the_part_without_secrets() {
        let yaml = format!(
            "context: lab\ncontexts:\n  lab:\n    ca: {}\n    crt: {}\n    key: \"!!notbase64 secret\"\n",
            b64("CA"),
            b64("CRT")
        );
        let err = ClientCreds::from_talosconfig(&yaml, None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("client key"), "{msg}");
        assert!(!msg.contains("secret"), "{msg}");
        assert!(ClientCreds::from_talosconfig("contexts: {}\n", None).is_err());
    }
}
