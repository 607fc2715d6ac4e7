//! Helm release records, pure: the release JSON and the Secret Helm's storage driver keeps it
//! in (`sh.helm.release.v1.<name>.v<revision>`, type `helm.sh/release.v1`, data.release =
//! base64(gzip(JSON))), and decoding one back.
//!
//! talboot applies add-ons itself but writes the record Helm would have written, so that a
//! later `helm upgrade` (three-way merge from the stored manifest, or server-side apply in
//! Helm 4) or an Argo CD Application can take the release over. Everything here is
//! deterministic; the only clock reading is the timestamp passed in.

use std::io::{Read, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Secret `type` of Helm release records.
pub(crate) const RELEASE_SECRET_TYPE: &str = "helm.sh/release.v1";

/// The zero time as Helm 3 writes `info.deleted` for a live release.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Errors building or reading a release record.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The Secret has no `data.release`.
    #[error("Helm release Secret {0} has no data.release")]
    NoData(String),
    /// A layer of the encoding is broken.
    #[error("Helm release Secret {name}: {layer} decoding failed: {reason}")]
    Decode {
        /// Secret name.
        name: String,
        /// Which layer (`base64`, `gzip`, `JSON`).
        layer: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// A timestamp could not be formatted.
    #[error("cannot format the release timestamp: {0}")]
    Time(String),
}

/// Chart.yaml fields recorded in the release (`chart.metadata`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartMeta {
    /// Chart name, e.g. `cilium`.
    pub name: String,
    /// Chart version, without `v` (e.g. `1.18.0`).
    pub version: String,
    /// App version, e.g. `1.18.0` or `v3.4.4`.
    pub app_version: String,
    /// One-line description.
    pub description: String,
}

/// Everything a revision-1 `deployed` release record is made of. `Debug` leaves out the
/// values and manifest: they can hold Secrets and key material.
#[derive(Clone)]
pub(crate) struct ReleaseInput<'a> {
    /// Release name.
    pub name: &'a str,
    /// Release namespace (where the record Secret lives).
    pub namespace: &'a str,
    /// The chart.
    pub chart: &'a ChartMeta,
    /// The operator-visible values the manifest was rendered with (`config`).
    pub values: &'a Value,
    /// The manifest exactly as applied.
    pub manifest: &'a str,
    /// When the release was first deployed.
    pub first_deployed: OffsetDateTime,
    /// When it was last (re)written.
    pub(crate) last_deployed: OffsetDateTime,
}

impl std::fmt::Debug for ReleaseInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseInput")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("chart", &self.chart)
            .field("manifest_bytes", &self.manifest.len())
            .field("first_deployed", &self.first_deployed)
            .field("last_deployed", &self.last_deployed)
            .finish_non_exhaustive()
    }
}

/// Name of the record Secret of `release` at `revision`.
pub(crate) fn secret_name(release: &str, revision: u32) -> String {
    format!("sh.helm.release.v1.{release}.v{revision}")
}

fn rfc3339(t: OffsetDateTime) -> Result<String, ReleaseError> {
    t.format(&Rfc3339)
        .map_err(|e| ReleaseError::Time(e.to_string()))
}

/// The release JSON (Helm's `release.Release`) for revision 1, status `deployed`.
pub(crate) fn release_json(input: &ReleaseInput<'_>) -> Result<Value, ReleaseError> {
    Ok(json!({
        "name": input.name,
        "namespace": input.namespace,
        "version": 1,
        "info": {
            "first_deployed": rfc3339(input.first_deployed)?,
            "last_deployed": rfc3339(input.last_deployed)?,
            "deleted": GO_ZERO_TIME,
            "description": "Install complete",
            "status": "deployed",
            "notes": "",
        },
        "chart": {
            "metadata": {
                "name": input.chart.name,
                "version": input.chart.version,
                "appVersion": input.chart.app_version,
                "apiVersion": "v2",
                "description": input.chart.description,
                "type": "application",
            },
            "lock": null,
            "templates": [],
            "values": {},
            "schema": null,
            "files": [],
        },
        "config": input.values,
        "manifest": input.manifest,
        "hooks": [],
        // How Helm 4 continues the release: `helm upgrade` (`--server-side=auto`, the
        // default) uses server-side apply only when the record says "ssa", else its
        // client-side three-way merge against this manifest (helm/helm v4.1.4
        // pkg/action/upgrade.go, getUpgradeServerSideValue), which Helm 3 always uses. The
        // three-way merge writes Update operations, which never conflict, so any client of
        // Helm's SDK takes the release over whatever field-manager name it runs under; a
        // server-side upgrade by another manager name would conflict on every zero value the
        // typed round trip dropped. An explicit `--server-side=true` later first folds Helm's
        // Update entries into its `helm` Apply entry (pkg/kube/client.go,
        // upgradeClientSideFieldManager), the entry talboot's applies already are.
        "apply_method": "csa",
    }))
}

/// base64(gzip(JSON)), the byte string Helm stores under `data.release`.
pub(crate) fn encode_release(release: &Value) -> Vec<u8> {
    let json = serde_json::to_vec(release).expect("a JSON value always serialises");
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(&json).expect("writing to a Vec cannot fail");
    let zipped = gz.finish().expect("writing to a Vec cannot fail");
    STANDARD.encode(zipped).into_bytes()
}

/// The record Secret for revision 1, as a Kubernetes object ready to apply. Its
/// `data.release` is base64 of [`encode_release`]'s bytes (the API's own base64 of Secret
/// data, which is why `kubectl get -o yaml` shows the release base64'd twice).
pub(crate) fn release_secret(input: &ReleaseInput<'_>) -> Result<Value, ReleaseError> {
    let release = release_json(input)?;
    let stored = encode_release(&release);
    let created = input.first_deployed.unix_timestamp().to_string();
    let modified = input.last_deployed.unix_timestamp().to_string();
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(input.name, 1),
            "namespace": input.namespace,
            "labels": {
                "owner": "helm",
                "name": input.name,
                "status": "deployed",
                "version": "1",
                "createdAt": created,
                "modifiedAt": modified,
            },
        },
        "type": RELEASE_SECRET_TYPE,
        "data": { "release": STANDARD.encode(stored) },
    }))
}

/// Decodes a record Secret (as the API returns it) back into the release JSON: base64 (the
/// API's), base64 (Helm's), gzip if the magic says so, JSON.
pub fn decode_release_secret(secret: &Value) -> Result<Value, ReleaseError> {
    let name = secret["metadata"]["name"]
        .as_str()
        .unwrap_or("(unnamed)")
        .to_owned();
    let outer = secret["data"]["release"]
        .as_str()
        .ok_or_else(|| ReleaseError::NoData(name.clone()))?;
    let decode_err = |layer, reason: String| ReleaseError::Decode {
        name: name.clone(),
        layer,
        reason,
    };
    let helm_bytes = STANDARD
        .decode(outer)
        .map_err(|e| decode_err("base64 (API)", e.to_string()))?;
    decode_release_bytes(&helm_bytes).map_err(|(layer, reason)| decode_err(layer, reason))
}

/// Decodes Helm's `data.release` byte string: base64, optional gzip, JSON.
fn decode_release_bytes(bytes: &[u8]) -> Result<Value, (&'static str, String)> {
    let raw = STANDARD
        .decode(bytes)
        .map_err(|e| ("base64 (Helm)", e.to_string()))?;
    let json = if raw.starts_with(&[0x1f, 0x8b, 0x08]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| ("gzip", e.to_string()))?;
        out
    } else {
        raw
    };
    serde_json::from_slice(&json).map_err(|e| ("JSON", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> ChartMeta {
        ChartMeta {
            name: "cilium".into(),
            version: "1.18.0".into(),
            app_version: "1.18.0".into(),
            description: "eBPF-based Networking".into(),
        }
    }

    fn input<'a>(chart: &'a ChartMeta, values: &'a Value) -> ReleaseInput<'a> {
        ReleaseInput {
            name: "cilium",
            namespace: "kube-system",
            chart,
            values,
            manifest: "---\napiVersion: v1\nkind: ConfigMap\n",
            first_deployed: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            last_deployed: OffsetDateTime::from_unix_timestamp(1_700_000_100).unwrap(),
        }
    }

    #[test]
    fn secret_has_helm_name_type_and_labels() {
        let (c, v) = (chart(), json!({"ipam": {"mode": "kubernetes"}}));
        let s = release_secret(&input(&c, &v)).unwrap();
        assert_eq!(s["metadata"]["name"], "sh.helm.release.v1.cilium.v1");
        assert_eq!(s["metadata"]["namespace"], "kube-system");
        assert_eq!(s["type"], "helm.sh/release.v1");
        let l = &s["metadata"]["labels"];
        assert_eq!(
            (&l["owner"], &l["name"], &l["status"], &l["version"]),
            (
                &json!("helm"),
                &json!("cilium"),
                &json!("deployed"),
                &json!("1")
            )
        );
        assert_eq!(l["createdAt"], "1700000000");
        assert_eq!(l["modifiedAt"], "1700000100");
    }

    #[test]
    fn record_decodes_to_release_json() {
        let (c, v) = (chart(), json!({"a": 1}));
        let inp = input(&c, &v);
        let s = release_secret(&inp).unwrap();
        let rel = decode_release_secret(&s).unwrap();
        assert_eq!(rel, release_json(&inp).unwrap());
        assert_eq!(rel["manifest"], inp.manifest);
        assert_eq!(rel["info"]["status"], "deployed");
        assert_eq!(rel["info"]["first_deployed"], "2023-11-14T22:13:20Z");
        assert_eq!(rel["version"], 1);
        assert_eq!(rel["config"], v);
        assert_eq!(rel["chart"]["metadata"]["version"], "1.18.0");
        // Helm's layer is gzip at rest.
        let helm = STANDARD
            .decode(s["data"]["release"].as_str().unwrap())
            .unwrap();
        let raw = STANDARD.decode(helm).unwrap();
        assert_eq!(&raw[..3], &[0x1f, 0x8b, 0x08]);
    }

    #[test]
    fn uncompressed_records_decode_and_broken_ones_say_which_layer() {
        let plain = STANDARD.encode(br#"{"name":"x"}"#);
        let s = json!({"metadata":{"name":"r"},"data":{"release": STANDARD.encode(plain)}});
        assert_eq!(decode_release_secret(&s).unwrap()["name"], "x");
        let bad = json!({"metadata":{"name":"r"},"data":{"release": STANDARD.encode("!!")}});
        let err = decode_release_secret(&bad).unwrap_err().to_string();
        assert!(err.contains("base64 (Helm)"), "{err}");
        let none = json!({"metadata":{"name":"r"},"data":{}});
        assert!(matches!(
            decode_release_secret(&none),
            Err(ReleaseError::NoData(_))
        ));
    }
}
