//! The Talos double's config loader and validator: what ApplyConfiguration accepts, refused with
//! Talos's own wording, and the [`ParsedConfig`] the node keeps.

use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use yaml_serde::Value;

use super::v114::{self, DocumentFacts, TalosRules, UnattendedSpec};

/// A config that passed the double's validation.
#[derive(Clone, Debug)]
pub(super) struct ParsedConfig {
    pub(super) machine_type: String,
    /// `machine.token`: what trustd authenticates workers with.
    pub(super) token: String,
    /// `cluster.ca` (PEM certificate, PEM key if present): the Kubernetes CA the
    /// kubeconfig names.
    pub(super) cluster_ca: Option<(String, Option<String>)>,
    pub(super) ca_cert_pem: String,
    pub(super) ca_key_pem: Option<String>,
    pub(super) cluster_name: String,
    pub(super) endpoint: String,
    /// `.machine.install` is set (the legacy install path).
    pub(super) legacy_install: bool,
    /// The `UnattendedInstallConfig` document (v1.14; see [`super::unattended`]).
    pub(super) unattended: Option<UnattendedSpec>,
    /// Validation warnings, for the apply reply.
    pub(super) warnings: Vec<String>,
}

impl ParsedConfig {
    pub(super) fn is_control_plane(&self) -> bool {
        matches!(self.machine_type.as_str(), "init" | "controlplane")
    }
}
/// The document kinds `configloader` knows besides v1alpha1, each registered for apiVersion
/// `v1alpha1` only (every `registry.Register` under `pkg/machinery/config/types/`,
/// siderolabs/talos v1.13.9).
const DOCUMENT_KINDS: &[&str] = &[
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "HCloudVIPConfig",
    "HostnameConfig",
    "ImageVerificationConfig",
    "KmsgLogConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// hashicorp/go-multierror's default format (`ListFormatFunc`), which Talos's validation
/// errors carry verbatim into the gRPC message.
fn multierror(errors: &[String]) -> String {
    if let [one] = errors {
        return format!("1 error occurred:\n\t* {one}\n\n");
    }
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    format!(
        "{} errors occurred:\n\t{}\n\n",
        errors.len(),
        points.join("\n\t")
    )
}

/// siderolabs/net v0.4.0 `ValidateEndpointURI` on `cluster.controlPlane.endpoint` (after
/// Go's lenient `url.Parse`): a host is required, a port must be numeric and in 1..=65535,
/// an IPv6 host must be bracketed. The scheme is not checked.
/// Why `ValidateEndpointURI` refuses an endpoint, in its wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum EndpointError {
    #[error("IPv6 addresses MUST be enclosed by square brackets")]
    UnbracketedIpv6,
    #[error("hostname must not be blank")]
    BlankHost,
    #[error("port number must be numeric")]
    PortNotNumeric,
    #[error("port number must be between 1 and 65535")]
    PortRange,
}

fn validate_endpoint(ep: &str) -> Result<(), EndpointError> {
    let rest = ep.split_once("://").map_or("", |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.matches(':').count() > 2 && !(host_port.contains('[') && host_port.contains(']')) {
        return Err(EndpointError::UnbracketedIpv6);
    }
    let (host, port) = if let Some(r) = host_port.strip_prefix('[') {
        let (h, tail) = r.split_once(']').unwrap_or((r, ""));
        (h, tail.strip_prefix(':').unwrap_or(""))
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => (host_port, ""),
        }
    };
    if host.is_empty() {
        return Err(EndpointError::BlankHost);
    }
    if !port.is_empty() {
        let n: u64 = port.parse().map_err(|_| EndpointError::PortNotNumeric)?;
        if !(1..=65535).contains(&n) {
            return Err(EndpointError::PortRange);
        }
    }
    Ok(())
}

/// Why the double's config loader and validator refuse a config: the message, in Talos's
/// wording and multierror layout, that Talos puts in its InvalidArgument status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(super) struct ConfigRefused {
    message: String,
    /// Refused by validation (the config loaded): v1.14 checks the apply mode between
    /// loading and validating.
    validation: bool,
}

impl ConfigRefused {
    /// A validation refusal (as opposed to one of the loader's).
    fn invalid(message: String) -> Self {
        Self {
            message,
            validation: true,
        }
    }

    /// Whether validation refused it (the config itself loaded).
    pub(super) fn is_validation(&self) -> bool {
        self.validation
    }
}

impl From<String> for ConfigRefused {
    fn from(message: String) -> Self {
        Self {
            message,
            validation: false,
        }
    }
}

impl From<&str> for ConfigRefused {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// What the double's loader is checking against: the node's Talos minor and whether the
/// machine must install (the platform mode's `RequiresInstall` on a machine not installed
/// yet: metal, first config).
#[derive(Clone, Copy, Debug)]
pub(super) struct LoadRules {
    pub(super) version: TalosRules,
    pub(super) requires_install: bool,
}

/// Loads and validates a machine config as `ApplyConfiguration` does before anything is
/// applied (siderolabs/talos v1.13.9, and v1.14.0-rc.1 under [`TalosRules::V114`]):
/// `configloader.NewFromBytes` (`pkg/machinery/config/configloader/configloader.go`,
/// `configloader/internal/decoder/decoder.go`), then `Validate`
/// (`pkg/machinery/config/container/validate.go`,
/// `pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`). The error is the message
/// Talos puts in its InvalidArgument status. `Ok(None)` is a config with no v1alpha1
/// document (the caller decides whether that is allowed).
///
/// Modelled: document detection and kinds (each minor's registry), duplicate documents,
/// unknown top-level v1alpha1 keys, the machine/cluster/install/CA/machine-type/persist rules
/// and the endpoint check, with upstream's wording and multierror layout; under v1.14 also
/// the `UnattendedInstallConfig` checks and the legacy-field conflicts (see [`v114`]). Not
/// modelled (deliberately; talboot's own schema validation covers the fields it renders):
/// unknown keys below the top level, the other typed documents' own validation,
/// network/disk/CNI rules. Line numbers are those of the document's start. Stricter than
/// Talos, because the double needs them to serve TLS: `machine.ca.crt` must be one PEM
/// certificate (Talos only fails later, at boot).
pub(super) fn parse_config(
    data: &[u8],
    rules: LoadRules,
) -> Result<Option<ParsedConfig>, ConfigRefused> {
    let text = std::str::from_utf8(data)
        .map_err(|_| "decode error: yaml: invalid leading UTF-8 octet".to_owned())?;
    let (Some(value), others) = documents(text, rules.version)? else {
        return Ok(None);
    };
    let doc = Doc(&value);
    let cas = Cas::decode(&doc)?;
    let machine_type = doc.text(&["machine", "type"]).unwrap_or_default();
    // `machine.ParseType` (`pkg/machinery/config/machine/machine.go`): "" and the legacy
    // "join" are workers (with a warning, not simulated).
    let machine_type = match machine_type.as_str() {
        "" | "join" => "worker".to_owned(),
        _ => machine_type,
    };
    let errors = validate(&doc, &machine_type, &cas, rules);
    let mut all = Vec::new();
    if !errors.is_empty() {
        // `container.Validate` prefixes the v1alpha1 errors and collects them again.
        all.push(format!("v1alpha1.Config: {}", multierror(&errors)));
    }
    let mut warnings = Vec::new();
    if rules.version == TalosRules::V114 {
        let (doc_errors, doc_warnings) = v114::document_checks(&others);
        all.extend(doc_errors);
        all.extend(v114::conflicts(&value, &others));
        warnings = doc_warnings;
    }
    if !all.is_empty() {
        return Err(ConfigRefused::invalid(multierror(&all)));
    }
    let facts = DocumentFacts::read(&others);

    // What the double itself needs to serve TLS with this config.
    let ca_cert_pem = cas
        .machine_crt
        .ok_or("the test double needs machine.ca.crt (acceptedCAs alone are not simulated)")?;
    if CertificateDer::pem_slice_iter(ca_cert_pem.as_bytes())
        .next()
        .is_none_or(|c| c.is_err())
    {
        return Err("machine.ca.crt: no PEM certificate".into());
    }
    Ok(Some(ParsedConfig {
        cluster_name: doc
            .text(&["cluster", "clusterName"])
            .or(facts.cluster_name)
            .unwrap_or_default(),
        endpoint: doc
            .text(&["cluster", "controlPlane", "endpoint"])
            .or(facts.endpoint)
            .unwrap_or_default(),
        token: doc.text(&["machine", "token"]).unwrap_or_default(),
        cluster_ca: cas.cluster.or(facts.cluster_ca),
        legacy_install: doc
            .at(&["machine", "install"])
            .is_some_and(|i| !i.is_null()),
        unattended: facts.unattended,
        warnings,
        machine_type,
        ca_cert_pem,
        ca_key_pem: cas.machine_key,
    }))
}

/// `configloader.NewFromBytes`'s pass over the documents: each must be a mapping, unique by
/// apiVersion/kind/name, and of a kind the node's Talos registers; the v1alpha1 document
/// (the one with a legacy top-level key, or no kind) may only have v1alpha1.Config's
/// top-level fields. Returns that document (`None` when there is none) and the others.
fn documents(
    text: &str,
    version: TalosRules,
) -> Result<(Option<Value>, Vec<Value>), ConfigRefused> {
    let kinds = match version {
        TalosRules::V113 => DOCUMENT_KINDS,
        TalosRules::V114 => v114::DOCUMENT_KINDS,
    };
    // The line each document starts at (after a `---` separator), for the messages.
    let mut doc_lines = vec![1];
    doc_lines.extend(
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with("---"))
            .map(|(i, _)| i + 2),
    );
    let str_at = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut v1alpha1 = None;
    let mut others = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let line = doc_lines.get(i).copied().unwrap_or(1);
        let value = <Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| format!("decode error: yaml: {e}"))?;
        let map = match &value {
            Value::Null => continue,
            Value::Mapping(m) => m,
            _ => return Err(format!("expected a YAML document at line {line}").into()),
        };
        let api_version = str_at(&value, "apiVersion").unwrap_or_default();
        let kind = str_at(&value, "kind").unwrap_or_default();
        let id = format!(
            "{api_version}/{}/{}",
            if kind.is_empty() { "v1alpha1" } else { &kind },
            str_at(&value, "name").unwrap_or_default()
        );
        if !seen.insert(id.clone()) {
            return Err(format!("duplicate document {id} is not allowed (line {line})").into());
        }
        let fail = |e: String| {
            ConfigRefused::from(format!("error decoding document {id} (line {line}): {e}"))
        };
        // The v1alpha1 document is the one with any of its legacy top-level keys.
        let legacy = ["machine", "cluster", "debug", "persist"]
            .iter()
            .any(|k| map.contains_key(*k));
        let version = if legacy { "v1alpha1" } else { &api_version };
        if version == "v1alpha1" && kind.is_empty() {
            const FIELDS: &[&str] = &["version", "debug", "persist", "machine", "cluster"];
            if let Some(unknown) = map
                .keys()
                .filter_map(Value::as_str)
                .find(|k| !FIELDS.contains(k))
            {
                return Err(fail(format!(
                    "error decoding  to *v1alpha1.Config: yaml: unmarshal errors:\n  line \
                     {line}: field {unknown} not found in type v1alpha1.Config"
                )));
            }
            v1alpha1 = Some(value);
            continue;
        } else if kind.is_empty() {
            return Err(fail("missing kind".into()));
        } else if version.is_empty() {
            return Err(fail("missing apiVersion".into()));
        } else if version != "v1alpha1" || !kinds.contains(&kind.as_str()) {
            return Err(fail(format!("{kind:?} {version:?}: not registered")));
        }
        others.push(value);
    }
    if seen.is_empty() {
        return Err("config not found".into());
    }
    Ok((v1alpha1, others))
}

/// The v1alpha1 document, read by path.
struct Doc<'a>(&'a Value);

impl<'a> Doc<'a> {
    fn at(&self, path: &[&str]) -> Option<&'a Value> {
        let mut v = self.0;
        for key in path {
            v = v.get(*key)?;
        }
        Some(v)
    }

    fn text(&self, path: &[&str]) -> Option<String> {
        self.at(path).and_then(Value::as_str).map(str::to_owned)
    }

    /// Whether `path` holds a non-empty string.
    fn has_text(&self, path: &[&str]) -> bool {
        self.text(path).is_some_and(|k| !k.is_empty())
    }
}

/// The CA certificates and keys of the document as PEM text. Decoding them comes first:
/// Talos's typed decode of the base64 fields fails before `Validate` runs.
struct Cas {
    /// `machine.ca.crt`.
    machine_crt: Option<String>,
    /// `machine.ca.key`.
    machine_key: Option<String>,
    /// `cluster.ca.crt` and `cluster.ca.key`.
    cluster: Option<(String, Option<String>)>,
}

impl Cas {
    fn decode(doc: &Doc<'_>) -> Result<Self, ConfigRefused> {
        let decode_error = |e: String| {
            format!(
                "error decoding document /v1alpha1/ (line 1): error decoding  to \
                 *v1alpha1.Config: {e}"
            )
        };
        let b64 = |field: &str, s: &str| -> Result<String, ConfigRefused> {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s.trim())
                .map_err(|e| {
                    ConfigRefused::from(decode_error(format!("{field}: illegal base64 data: {e}")))
                })?;
            String::from_utf8(bytes)
                .map_err(|_| ConfigRefused::from(format!("{field}: not PEM text")))
        };
        let ca_crt = doc
            .text(&["machine", "ca", "crt"])
            .filter(|c| !c.is_empty());
        let ca_key = doc
            .text(&["machine", "ca", "key"])
            .filter(|k| !k.is_empty());
        let machine_crt = ca_crt
            .as_deref()
            .map(|c| b64("machine.ca.crt", c))
            .transpose()?;
        let cluster = match doc
            .text(&["cluster", "ca", "crt"])
            .filter(|c| !c.is_empty())
        {
            Some(crt) => Some((
                b64("cluster.ca.crt", &crt)?,
                doc.text(&["cluster", "ca", "key"])
                    .filter(|k| !k.is_empty())
                    .map(|k| b64("cluster.ca.key", &k))
                    .transpose()?,
            )),
            None => None,
        };
        let machine_key = ca_key
            .as_deref()
            .map(|k| b64("machine.ca.key", k))
            .transpose()?;
        Ok(Cas {
            machine_crt,
            machine_key,
            cluster,
        })
    }
}

/// `Config.Validate` (`v1alpha1_validation.go`), in its order: the messages of every rule the
/// document breaks.
fn validate(doc: &Doc<'_>, machine_type: &str, cas: &Cas, rules: LoadRules) -> Vec<String> {
    let mut errors: Vec<String> = Vec::new();
    if doc.at(&["machine"]).filter(|m| !m.is_null()).is_none() {
        errors.push("machine instructions are required".into());
        return errors;
    }
    let is_control_plane = matches!(machine_type, "init" | "controlplane");
    validate_cluster(doc, is_control_plane, rules.version, &mut errors);
    if rules.requires_install {
        validate_install(doc, rules.version, &mut errors);
    }
    validate_cas(doc, machine_type, cas, &mut errors);
    if doc.at(&["persist"]).and_then(Value::as_bool) == Some(false) {
        errors.push(".persist should be enabled".into());
    }
    errors
}

/// `ClusterConfig.Validate`: a cluster section with a valid control-plane endpoint, and no
/// Kubernetes CA key on a worker. v1.14 requires the endpoint only when
/// `.cluster.controlPlane` is there (the endpoint may live in `KubeClusterConfig`).
fn validate_cluster(
    doc: &Doc<'_>,
    is_control_plane: bool,
    version: TalosRules,
    errors: &mut Vec<String>,
) {
    let endpoint = doc.text(&["cluster", "controlPlane", "endpoint"]);
    let control_plane = doc
        .at(&["cluster", "controlPlane"])
        .is_some_and(|c| !c.is_null());
    let optional = version == TalosRules::V114 && !control_plane;
    match (doc.at(&["cluster"]).filter(|c| !c.is_null()), &endpoint) {
        (None, _) => errors.push("cluster instructions are required".into()),
        (Some(_), None) if optional => {}
        (Some(_), None) => errors.push("cluster controlplane endpoint is required".into()),
        (Some(_), Some(ep)) => {
            if let Err(e) = validate_endpoint(ep) {
                errors.push(format!("invalid controlplane endpoint: {e}"));
            }
            if !is_control_plane && doc.has_text(&["cluster", "ca", "key"]) {
                errors.push(
                    "cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)".into(),
                );
            }
        }
    }
}

/// The platform's `RequiresInstall`: an install section naming a disk or a disk selector.
/// v1.14 no longer requires the section (`UnattendedInstallConfig` replaces it) but still
/// checks one that is there.
fn validate_install(doc: &Doc<'_>, version: TalosRules, errors: &mut Vec<String>) {
    match doc.at(&["machine", "install"]).filter(|i| !i.is_null()) {
        None if version == TalosRules::V114 => {}
        None => errors.push("install instructions are required in \"metal\" mode".into()),
        Some(install) => {
            let disk = install.get("disk").and_then(Value::as_str).unwrap_or("");
            let selector = install.get("diskSelector").filter(|s| !s.is_null());
            if disk.is_empty() && selector.is_none() {
                errors.push("either install disk or diskSelector should be defined".into());
            }
        }
    }
}

/// The machine-type rules on CAs: a control plane issues (CA and key), a worker only trusts
/// (certificates, no keys), and the machine type must be one Talos knows.
fn validate_cas(doc: &Doc<'_>, machine_type: &str, cas: &Cas, errors: &mut Vec<String>) {
    let accepted_cas = doc
        .at(&["machine", "acceptedCAs"])
        .and_then(Value::as_sequence)
        .is_some_and(|s| !s.is_empty());
    let has_ca = doc.at(&["machine", "ca"]).is_some_and(|c| !c.is_null());
    if !has_ca && !accepted_cas {
        errors.push(
            "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)"
                .into(),
        );
    }
    match machine_type {
        "init" | "controlplane" => {
            if !has_ca {
                errors.push("issuing CA is required (.machine.ca)".into());
            } else if cas.machine_key.is_none() {
                errors.push(
                    "issuing CA key is required for controlplane nodes (.machine.ca.key)".into(),
                );
            }
        }
        "worker" => {
            if has_ca {
                if cas.machine_key.is_some() {
                    errors.push(
                        "issuing Talos API CA key is not allowed on non-controlplane \
                         nodes (.machine.ca)"
                            .into(),
                    );
                }
                if cas.machine_crt.is_none() && !accepted_cas {
                    errors.push(
                        "trusted CA certificates are required on non-controlplane nodes \
                         (.machine.ca.crt, .machine.acceptedCAs)"
                            .into(),
                    );
                }
            }
            if doc.has_text(&["cluster", "ca", "key"]) {
                errors.push(
                    "issuing Kubernetes API CA key is not allowed on non-controlplane \
                     nodes (.cluster.ca)"
                        .into(),
                );
            }
        }
        other => errors.push(format!("unknown machine type {other:?}")),
    }
}
