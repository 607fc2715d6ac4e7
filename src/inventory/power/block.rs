//! Reading `power:` blocks: each layer's fields as written, the role chain and the node merged
//! field by field, and the merged fields read into a [`PowerConfig`] of the block's kind.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::*;
use crate::inventory::diag::{Diagnostics, Loc, did_you_mean};
use crate::inventory::model::{Firmware, Node, ResolvedRole};
use crate::inventory::read;
use crate::inventory::yaml::{Node as Y, Value, join};

/// The kinds a `power:` block accepts.
const KINDS: &[&str] = &["redfish", "ipmi", "proxmox", "wol", "none"];

/// One `power:` block as written (on a role or a node), kept as its fields so a node's block
/// can be laid over its role's before the fields are read.
#[derive(Debug, Clone)]
pub(crate) struct PowerBlock {
    loc: Loc,
    path: String,
    fields: Vec<(String, Loc, Y)>,
}

impl PowerBlock {
    /// Keep the block at `path`; a block that is not a mapping is reported here.
    pub(crate) fn read(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Self> {
        match &n.value {
            Value::Map(entries) => Some(Self {
                loc: n.loc.clone(),
                path: path.to_owned(),
                fields: entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), k.loc.clone(), v.clone()))
                    .collect(),
            }),
            Value::Str(s) if s == "none" => Some(Self {
                loc: n.loc.clone(),
                path: path.to_owned(),
                fields: vec![("kind".into(), n.loc.clone(), n.clone())],
            }),
            _ => {
                d.error_hint(
                    &n.loc,
                    path,
                    format!("expected a mapping, found {}", n.kind()),
                    "e.g. power: {kind: ipmi, host: 10.0.50.11, user: admin, passwordEnv: BMC_PASS}",
                );
                None
            }
        }
    }

    fn kind(&self) -> Option<String> {
        self.fields
            .iter()
            .find(|(k, _, _)| k == "kind")
            .and_then(|(_, _, v)| v.scalar_text())
    }
}

/// A field of the merged block: its value and the path it was written at.
struct Field {
    path: String,
    loc: Loc,
    value: Y,
}

/// The fields each kind reads (secret references included).
fn fields_of(kind: &str) -> &'static [&'static str] {
    match kind {
        "redfish" => &[
            "kind",
            "endpoint",
            "systemId",
            "verifyTls",
            "ca",
            "user",
            "passwordEnv",
            "passwordKey",
            "credentialsFile",
            "auth",
        ],
        "ipmi" => &[
            "kind",
            "host",
            "port",
            "user",
            "passwordEnv",
            "passwordKey",
            "credentialsFile",
        ],
        "proxmox" => &[
            "kind",
            "apiUrl",
            "node",
            "vmid",
            "tokenId",
            "tokenSecretEnv",
            "tokenSecretKey",
            "credentialsFile",
            "verifyTls",
            "ca",
            "vm",
        ],
        "wol" => &[
            "kind",
            "mac",
            "broadcast",
            "port",
            "secureOnEnv",
            "secureOnKey",
            "credentialsFile",
        ],
        _ => &["kind"],
    }
}

/// Fields that would hold a secret in clear: refused, with the way to move it.
const CLEAR_SECRETS: &[(&str, &str)] = &[
    ("password", "password"),
    ("pass", "password"),
    ("tokenSecret", "tokenSecret"),
    ("token", "tokenSecret"),
    ("secret", "password"),
    ("secureOn", "secureOn"),
];

/// The merged fields of a node's blocks, role chain first.
struct Merged<'a> {
    fields: BTreeMap<String, Field>,
    /// Where the node's own block is, else the node's (for missing fields).
    loc: &'a Loc,
    path: String,
}

impl Merged<'_> {
    fn take(&mut self, key: &str) -> Option<Field> {
        self.fields
            .remove(key)
            .filter(|f| f.value.value != Value::Null)
    }

    fn string(&mut self, key: &str, d: &mut Diagnostics) -> Option<(String, Loc)> {
        let f = self.take(key)?;
        let s = read::string(&f.value, &f.path, d)?;
        if s.trim().is_empty() {
            d.error(&f.loc, &f.path, "must not be empty");
            return None;
        }
        Some((s.trim().to_owned(), f.loc))
    }

    fn required(&mut self, key: &str, hint: &str, d: &mut Diagnostics) -> Option<String> {
        match self.string(key, d) {
            Some((s, _)) => Some(s),
            None if self.fields.contains_key(key) => None,
            None => {
                read::missing(d, self.loc, &self.path, key, hint);
                None
            }
        }
    }

    fn boolean(&mut self, key: &str, default: bool, d: &mut Diagnostics) -> Option<bool> {
        match self.take(key) {
            Some(f) => read::boolean(&f.value, &f.path, d),
            None => Some(default),
        }
    }

    fn port(&mut self, default: u16, d: &mut Diagnostics) -> Option<u16> {
        let Some(f) = self.take("port") else {
            return Some(default);
        };
        read::parsed(&f.value, &f.path, d, "a port", "623", |s| {
            s.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or("expected a number from 1 to 65535")
        })
        .map(|p| p.value)
    }

    fn path(&mut self, key: &str, base: &Path, d: &mut Diagnostics) -> Option<PathBuf> {
        self.string(key, d).map(|(s, _)| base.join(s))
    }

    fn url(&mut self, key: &str, example: &str, d: &mut Diagnostics) -> Option<String> {
        let f = match self.take(key) {
            Some(f) => f,
            None => {
                read::missing(
                    d,
                    self.loc,
                    &self.path,
                    key,
                    &format!("e.g. {key}: {example}"),
                );
                return None;
            }
        };
        read::parsed(
            &f.value,
            &f.path,
            d,
            "an https:// or http:// URL",
            example,
            |s| {
                let rest = s
                    .strip_prefix("https://")
                    .or_else(|| s.strip_prefix("http://"))
                    .ok_or("must start with https:// (or http:// for a lab)")?;
                if rest.is_empty() || rest.starts_with('/') {
                    return Err("has no host");
                }
                if rest.contains('@') {
                    return Err("must not carry credentials; use the user and secret fields");
                }
                Ok(s.trim_end_matches('/').to_owned())
            },
        )
        .map(|s| s.value)
    }

    /// The reference for secret `field` (`<field>Env` or `<field>Key` + `credentialsFile`).
    fn secret(
        &mut self,
        field: &str,
        credentials_file: Option<&(PathBuf, Loc, String)>,
        d: &mut Diagnostics,
    ) -> Option<SecretRef> {
        let env_key = format!("{field}Env");
        let file_key = format!("{field}Key");
        let env = self.string(&env_key, d);
        let key = self.string(&file_key, d);
        match (env, key) {
            (Some((_, loc)), Some(_)) => {
                d.error_hint(
                    &loc,
                    join(&self.path, &env_key),
                    format!("both {env_key} and {file_key} are set"),
                    format!(
                        "keep one: {env_key} names an environment variable, {file_key} a key of credentialsFile"
                    ),
                );
                None
            }
            (Some((var, loc)), None) => {
                let valid = var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && !var.as_bytes()[0].is_ascii_digit();
                if !valid {
                    d.error_hint(
                        &loc,
                        join(&self.path, &env_key),
                        "is not an environment variable name",
                        format!("write the variable's name, e.g. {env_key}: BMC_PASS"),
                    );
                    return None;
                }
                Some(SecretRef::Env(var))
            }
            (None, Some((key, loc))) => match credentials_file {
                Some((file, _, _)) => Some(SecretRef::File {
                    file: file.clone(),
                    key,
                }),
                None => {
                    d.error_hint(
                        &loc,
                        join(&self.path, &file_key),
                        format!("{file_key} needs credentialsFile"),
                        "add credentialsFile: power.sops.yaml (an age- or SOPS-encrypted YAML mapping of key to secret), here or on the role",
                    );
                    None
                }
            },
            (None, None) => {
                d.error_hint(
                    self.loc,
                    join(&self.path, &env_key),
                    format!("no {field}: the secret is missing"),
                    format!(
                        "set {env_key}: VAR (an environment variable of talboot), or {file_key}: NAME with credentialsFile: FILE (age- or SOPS-encrypted)"
                    ),
                );
                None
            }
        }
    }

    /// Every field left is unknown for `kind`.
    fn finish(self, kind: &str, d: &mut Diagnostics) {
        let known = fields_of(kind);
        for (name, f) in self.fields {
            if let Some((_, secret)) = CLEAR_SECRETS.iter().find(|(k, _)| *k == name) {
                // Never quote the value: it is a secret.
                d.error_hint(
                    &f.loc,
                    &f.path,
                    "a clear-text secret in the inventory is refused (the value is not shown)",
                    format!(
                        "remove it, rotate it if the file was shared, and use {secret}Env: VAR (an environment variable) or {secret}Key: NAME with credentialsFile: FILE (an age- or SOPS-encrypted YAML mapping)"
                    ),
                );
                continue;
            }
            if known.contains(&name.as_str()) {
                continue;
            }
            let hint = match did_you_mean(&name, known) {
                Some(s) => format!(
                    "did you mean `{s}`? a {kind} power block has: {}",
                    known.join(", ")
                ),
                None => format!("a {kind} power block has: {}", known.join(", ")),
            };
            d.error_hint(&f.loc, &f.path, format!("unknown field `{name}`"), hint);
        }
    }
}

/// Lay the blocks over each other (role chain root first, the node's last): a layer that names
/// another kind drops what came before it.
fn merge(layers: &[&PowerBlock]) -> BTreeMap<String, Field> {
    let mut out: BTreeMap<String, Field> = BTreeMap::new();
    let mut kind: Option<String> = None;
    for layer in layers {
        if let Some(k) = layer.kind()
            && kind.as_deref().is_some_and(|old| old != k)
        {
            out.clear();
        }
        if let Some(k) = layer.kind() {
            kind = Some(k);
        }
        for (name, loc, value) in &layer.fields {
            out.insert(
                name.clone(),
                Field {
                    path: join(&layer.path, name),
                    loc: loc.clone(),
                    value: value.clone(),
                },
            );
        }
    }
    out
}

/// Resolve every node's `power:` (its own block over its role chain's) into
/// [`Node::power`]. Reports each problem at the field that has it.
pub(crate) fn resolve(
    nodes: &mut [Node],
    node_blocks: &BTreeMap<String, PowerBlock>,
    role_blocks: &BTreeMap<String, PowerBlock>,
    roles: &BTreeMap<String, ResolvedRole>,
    base: &Path,
    d: &mut Diagnostics,
) {
    for node in nodes {
        let mut layers: Vec<&PowerBlock> = Vec::new();
        if let Some(role) = roles.get(node.role.as_str()) {
            layers.extend(role.chain.iter().filter_map(|r| role_blocks.get(r)));
        }
        let own = node_blocks.get(node.name.as_str());
        layers.extend(own);
        if layers.is_empty() {
            continue;
        }
        let (loc, path) = match own {
            Some(b) => (&b.loc, b.path.clone()),
            None => (&node.name.loc, format!("node {}.power", node.name.as_str())),
        };
        let merged = Merged {
            fields: merge(&layers),
            loc,
            path,
        };
        node.power = config(merged, node, base, d);
    }
}

fn config(mut m: Merged<'_>, node: &Node, base: &Path, d: &mut Diagnostics) -> Option<PowerConfig> {
    let kind = match m.take("kind") {
        Some(f) => {
            let s = read::string(&f.value, &f.path, d)?;
            if !KINDS.contains(&s.as_str()) {
                let hint = match did_you_mean(&s, KINDS) {
                    Some(w) => format!("did you mean `{w}`? valid kinds: {}", KINDS.join(", ")),
                    None => format!("valid kinds: {}", KINDS.join(", ")),
                };
                d.error_hint(&f.loc, &f.path, format!("`{s}` is not a power kind"), hint);
                return None;
            }
            s
        }
        None => {
            read::missing(
                d,
                m.loc,
                &m.path,
                "kind",
                "one of redfish, ipmi, proxmox, wol, none",
            );
            m.finish("", d);
            return None;
        }
    };
    let creds_file = m
        .take("credentialsFile")
        .and_then(|f| read::string(&f.value, &f.path, d).map(|s| (base.join(s), f.loc, f.path)));
    let needs_file = matches!(kind.as_str(), "redfish" | "ipmi" | "proxmox" | "wol");
    if !needs_file && let Some((_, loc, path)) = &creds_file {
        d.error(
            loc,
            path,
            format!("a {kind} power block has no secret to read"),
        );
    }
    let creds = creds_file.as_ref();
    let out = match kind.as_str() {
        "redfish" => redfish(&mut m, node, base, creds, d),
        "ipmi" => ipmi(&mut m, node, creds, d),
        "proxmox" => proxmox(&mut m, base, creds, d),
        "wol" => wol(&mut m, node, creds, d),
        _ => None,
    };
    m.finish(&kind, d);
    out
}

/// The block's `credentialsFile`, its location and field path.
type CredentialsFile<'a> = Option<&'a (PathBuf, Loc, String)>;

/// The fields of a `kind: redfish` block.
fn redfish(
    m: &mut Merged<'_>,
    node: &Node,
    base: &Path,
    creds_file: CredentialsFile<'_>,
    d: &mut Diagnostics,
) -> Option<PowerConfig> {
    let endpoint = m.url("endpoint", "https://10.0.50.11", d);
    let system_id = m.string("systemId", d).map(|(s, _)| s);
    let verify_tls = m.boolean("verifyTls", true, d);
    let ca = m.path("ca", base, d);
    let user = m.required("user", "the BMC user, e.g. user: admin", d);
    let password = m.secret("password", creds_file, d);
    let auth = match m.take("auth") {
        Some(f) => read::parsed(
            &f.value,
            &f.path,
            d,
            "a Redfish login (auto, session or basic)",
            "auto",
            |s| match s {
                "auto" => Ok(AuthMode::Auto),
                "session" => Ok(AuthMode::Session),
                "basic" => Ok(AuthMode::Basic),
                _ => Err("expected auto (a session where the BMC has one, else HTTP Basic), session or basic"),
            },
        )
        .map(|a| a.value),
        None => Some(AuthMode::Auto),
    };
    Some(PowerConfig::Redfish(RedfishTarget {
        endpoint: endpoint?,
        system_id,
        verify_tls: verify_tls?,
        ca,
        user: user?,
        password: password?,
        auth: auth?,
        boot_mode: redfish_boot_mode(node),
    }))
}

/// The fields of a `kind: ipmi` block.
fn ipmi(
    m: &mut Merged<'_>,
    node: &Node,
    creds_file: CredentialsFile<'_>,
    d: &mut Diagnostics,
) -> Option<PowerConfig> {
    let host = m.required("host", "the BMC's address, e.g. host: 10.0.50.11", d);
    let port = m.port(623, d);
    let user = m.required("user", "the BMC user, e.g. user: admin", d);
    let password = m.secret("password", creds_file, d);
    Some(PowerConfig::Ipmi(IpmiTarget {
        host: host?,
        port: port?,
        user: user?,
        password: password?,
        efi_boot: matches!(node.firmware, Some(Firmware::Uefi | Firmware::Http)),
    }))
}

/// The fields of a `kind: proxmox` block.
fn proxmox(
    m: &mut Merged<'_>,
    base: &Path,
    creds_file: CredentialsFile<'_>,
    d: &mut Diagnostics,
) -> Option<PowerConfig> {
    let api_url = m.url("apiUrl", "https://pve.lab:8006/api2/json", d);
    let pve_node = m.required("node", "the Proxmox node the VM is on, e.g. node: pve", d);
    let vmid = match m.take("vmid") {
        Some(f) => read::parsed(&f.value, &f.path, d, "a VM id", "101", |s| {
            s.parse::<u32>()
                .ok()
                .filter(|v| (100..=999_999_999).contains(v))
                .ok_or("Proxmox VM ids are 100 to 999999999")
        })
        .map(|v| v.value),
        None => {
            read::missing(d, m.loc, &m.path, "vmid", "the VM id, e.g. vmid: 101");
            None
        }
    };
    let token_id = m.required(
        "tokenId",
        "the API token id, e.g. tokenId: talboot@pve!power",
        d,
    );
    let token_secret = m.secret("tokenSecret", creds_file, d);
    let verify_tls = m.boolean("verifyTls", true, d);
    let ca = m.path("ca", base, d);
    let vm = match m.take("vm") {
        Some(f) => vm_shape(&f, d),
        None => Some(VmShape::default()),
    };
    Some(PowerConfig::Proxmox(ProxmoxTarget {
        api_url: api_url?,
        node: pve_node?,
        vmid: vmid?,
        token_id: token_id?,
        token_secret: token_secret?,
        verify_tls: verify_tls?,
        ca,
        vm: vm?,
    }))
}

/// The fields of a `kind: wol` block.
fn wol(
    m: &mut Merged<'_>,
    node: &Node,
    creds_file: CredentialsFile<'_>,
    d: &mut Diagnostics,
) -> Option<PowerConfig> {
    let mac = match m.take("mac") {
        Some(f) => read::mac(&f.value, &f.path, d).map(|m| m.value),
        None => node.macs.first().map(|m| m.value),
    };
    let broadcast = match m.take("broadcast") {
        Some(f) => read::parsed(
            &f.value,
            &f.path,
            d,
            "an IPv4 broadcast address",
            "10.0.40.255",
            |s| s.parse::<Ipv4Addr>(),
        )
        .map(|b| b.value),
        None => Some(node.address.value.broadcast()),
    };
    let port = m.port(9, d);
    // Optional, unlike the other kinds' secrets: only a NIC set up with a SecureOn
    // password (`ethtool -s IF wol s sopass ...`) wants one.
    let secure_on = if m.fields.contains_key("secureOnEnv") || m.fields.contains_key("secureOnKey")
    {
        m.secret("secureOn", creds_file, d).map(Some)
    } else {
        Some(None)
    };
    Some(PowerConfig::Wol(WolTarget {
        mac: mac?,
        broadcast: broadcast?,
        port: port?,
        secure_on: secure_on?,
    }))
}

/// The fields a `vm:` block has.
const VM_FIELDS: &[&str] = &["memory", "cores", "diskGib", "storage", "bridges"];

/// Read a `power.vm` block over the defaults; each problem is reported at its field.
fn vm_shape(f: &Field, d: &mut Diagnostics) -> Option<VmShape> {
    let Value::Map(entries) = &f.value.value else {
        d.error_hint(
            &f.loc,
            &f.path,
            format!("expected a mapping, found {}", f.value.kind()),
            "e.g. vm: {memory: 4096, cores: 2, diskGib: 32, storage: local-lvm, bridges: [vmbr0]}",
        );
        return None;
    };
    let mut shape = VmShape::default();
    let mut ok = true;
    let number = |v: &Y, path: &str, d: &mut Diagnostics, what: &str, eg: &str| {
        read::parsed(v, path, d, what, eg, |s| {
            s.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or("expected a whole number above 0")
        })
        .map(|n| n.value)
    };
    for (k, v) in entries {
        let path = join(&f.path, &k.name);
        let got = match k.name.as_str() {
            "memory" => number(v, &path, d, "MiB of memory", "4096").and_then(|n| {
                if n < TALOS_MIN_MEMORY_MIB {
                    d.error_hint(
                        &v.loc,
                        &path,
                        format!("{n} MiB is below the {TALOS_MIN_MEMORY_MIB} MiB Talos needs"),
                        "give it at least 2048, e.g. memory: 4096 (MiB)",
                    );
                    return None;
                }
                shape.memory_mib = n;
                Some(())
            }),
            "cores" => number(v, &path, d, "a core count", "2").map(|n| shape.cores = n),
            "diskGib" => {
                number(v, &path, d, "a disk size in GiB", "32").map(|n| shape.disk_gib = n)
            }
            "storage" => read::string(v, &path, d).and_then(|s| {
                if s.trim().is_empty() {
                    d.error(&v.loc, &path, "must not be empty");
                    return None;
                }
                shape.storage = s.trim().to_owned();
                Some(())
            }),
            "bridges" => {
                let list = read::list(v, &path, d, true, read::string);
                if list.is_empty() {
                    d.error_hint(
                        &v.loc,
                        &path,
                        "is empty",
                        "give a bridge per NIC, e.g. bridges: [vmbr0]",
                    );
                    None
                } else {
                    shape.bridges = list;
                    Some(())
                }
            }
            other => {
                let hint = match did_you_mean(other, VM_FIELDS) {
                    Some(s) => format!(
                        "did you mean `{s}`? a vm block has: {}",
                        VM_FIELDS.join(", ")
                    ),
                    None => format!("a vm block has: {}", VM_FIELDS.join(", ")),
                };
                d.error_hint(&k.loc, &path, format!("unknown field `{other}`"), hint);
                None
            }
        };
        ok &= got.is_some();
    }
    ok.then_some(shape)
}
