//! The inventory's `power:` block: how talboot reaches a machine's power and boot-device
//! control (Redfish, IPMI 2.0 LAN, Proxmox VE, Wake-on-LAN, or none).
//!
//! A role may carry a default block and a node its own; the node's fields override the role
//! chain's field by field (root role first), and a layer naming another `kind` starts afresh,
//! so a rack-wide `{kind: ipmi, user: admin, passwordEnv: BMC_PASS}` on a role and
//! `{host: 10.0.50.11}` on each node make one IPMI target per node.
//!
//! Credentials are never written in the inventory: a field holds the *name* of where the
//! secret is (`passwordEnv: BMC_PASS`, or `passwordKey: rack1` in the age- or SOPS-encrypted
//! `credentialsFile`). A clear-text `password:` is an error that says how to move it, and the
//! error never repeats the value. Resolving a [`SecretRef`] into a
//! [`Credential`] happens only when a driver is built
//! ([`crate::power::credentials`]), so `talboot check` needs neither the environment nor an
//! age identity.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::diag::{Diagnostics, Loc, did_you_mean};
use super::model::{Firmware, Mac, Node, ResolvedRole};
use super::read;
use super::yaml::{Node as Y, Value, join};

/// Where a secret is kept; never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// In this environment variable of the talboot process.
    Env(String),
    /// Under `key` in the age- or SOPS-encrypted YAML mapping `file` (resolved against the
    /// inventory's folder).
    File {
        /// The encrypted credentials file.
        file: PathBuf,
        /// The key of the secret in that file's mapping.
        key: String,
    },
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env(v) => write!(f, "environment variable {v}"),
            Self::File { file, key } => write!(f, "key `{key}` of {}", file.display()),
        }
    }
}

/// A secret (BMC password, Proxmox API token secret). `Debug` and `Display` print a
/// placeholder so the value cannot reach a log or an error by formatting.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(zeroize::Zeroizing<String>);

impl Credential {
    pub fn new(secret: impl Into<String>) -> Self {
        Self(zeroize::Zeroizing::new(secret.into()))
    }

    /// The secret itself, for the one place that puts it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

impl std::fmt::Display for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The `BootSourceOverrideMode` a machine boots in (DMTF ComputerSystem schema, `Boot`
/// property `BootSourceOverrideMode`: `Legacy` or `UEFI`, "the BIOS boot mode to use when the
/// system boots from the BootSourceOverrideTarget boot source").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootMode {
    /// `UEFI`.
    Uefi,
    /// `Legacy` (BIOS).
    Legacy,
}

impl BootMode {
    /// The Redfish enum value.
    pub fn as_redfish(self) -> &'static str {
        match self {
            Self::Uefi => "UEFI",
            Self::Legacy => "Legacy",
        }
    }
}

/// How talboot logs in to a BMC (the inventory's `auth:` in a redfish `power:` block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AuthMode {
    /// A Redfish session when the service root advertises one (`Links.Sessions`), else, or
    /// when the login fails, HTTP Basic: what openstack/sushy's `SessionOrBasicAuth` (the
    /// default of ironic's Redfish driver) does.
    #[default]
    Auto,
    /// A Redfish session only; a failed login is an error.
    Session,
    /// HTTP Basic on every request, never a session.
    Basic,
}

impl AuthMode {
    /// The inventory spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Session => "session",
            Self::Basic => "basic",
        }
    }
}

/// A Redfish BMC. `P` is [`SecretRef`] in the inventory and [`Credential`] once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishTarget<P = Credential> {
    /// Service root, e.g. `https://10.0.50.11` (the driver appends `/redfish/v1`).
    pub endpoint: String,
    /// `Systems/<id>` member; discovered (the only member) when absent.
    pub system_id: Option<String>,
    /// Verify the BMC's TLS certificate (on unless the inventory turns it off).
    pub verify_tls: bool,
    /// CA bundle (PEM) the BMC's certificate chains to, instead of the system roots.
    pub ca: Option<PathBuf>,
    /// BMC user.
    pub user: String,
    /// BMC password.
    pub password: P,
    /// How talboot logs in (`auth: auto|session|basic`, `auto` when absent).
    pub auth: AuthMode,
    /// The `BootSourceOverrideMode` the node's network and disk boots are set with: from the
    /// node's `firmware:` (`bios` is `Legacy`, `uefi` and `http` are `UEFI`), `UEFI` for an
    /// arm64 node, else `None` (the BMC's mode is left as it is).
    pub boot_mode: Option<BootMode>,
}

/// The Redfish boot mode of a node: its `firmware:`, else UEFI for arm64 (which has no
/// legacy BIOS), else unknown.
pub fn redfish_boot_mode(node: &Node) -> Option<BootMode> {
    use super::model::{Arch, Firmware};
    match node.firmware {
        Some(Firmware::Bios) => Some(BootMode::Legacy),
        Some(Firmware::Uefi | Firmware::Http) => Some(BootMode::Uefi),
        None if node.arch == Some(Arch::Arm64) => Some(BootMode::Uefi),
        None => None,
    }
}

/// An IPMI 2.0 BMC reached over LAN (RMCP+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpmiTarget<P = Credential> {
    /// BMC address or name.
    pub host: String,
    /// UDP port (623 by default, RMCP's well-known port).
    pub port: u16,
    /// BMC user.
    pub user: String,
    /// BMC password.
    pub password: P,
    /// Ask for an EFI boot in the boot flags (the node's `firmware:` is `uefi` or `http`);
    /// otherwise the BMC sets up a legacy (PC compatible) boot.
    pub efi_boot: bool,
}

/// A Proxmox VE virtual machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxmoxTarget<P = Credential> {
    /// API base, e.g. `https://pve.lab:8006/api2/json`.
    pub api_url: String,
    /// Proxmox cluster node the VM lives on.
    pub node: String,
    /// VM id.
    pub vmid: u32,
    /// API token id, `user@realm!tokenname`.
    pub token_id: String,
    /// API token secret.
    pub token_secret: P,
    /// Verify the API's TLS certificate.
    pub verify_tls: bool,
    /// CA bundle (PEM) for the API's certificate.
    pub ca: Option<PathBuf>,
    /// The VM's shape for `talboot proxmox create` (`vm:`; home-lab defaults when absent).
    pub vm: VmShape,
}

/// The least memory `vm.memory` takes: the 2 GiB Talos's System Requirements page gives as the
/// minimum for a control-plane node (a smaller VM fails to boot the Talos image).
pub const TALOS_MIN_MEMORY_MIB: u32 = 2048;

/// The shape of the VM `talboot proxmox create` makes for a node (`power.vm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmShape {
    /// Memory in MiB (`memory`).
    pub memory_mib: u32,
    /// CPU cores (`cores`).
    pub cores: u32,
    /// GiB of the first disk, `scsi0` (`diskGib`).
    pub disk_gib: u32,
    /// Proxmox storage the disk is allocated on (`storage`).
    pub storage: String,
    /// Bridge per NIC, in NIC order; the last one is reused for further NICs (`bridges`).
    pub bridges: Vec<String>,
}

impl Default for VmShape {
    fn default() -> Self {
        Self {
            memory_mib: 4096,
            cores: 2,
            disk_gib: 32,
            storage: "local-lvm".into(),
            bridges: vec!["vmbr0".into()],
        }
    }
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

/// Wake-on-LAN: a magic packet to a broadcast address. Send-only: no state, no boot device.
/// `P` is [`SecretRef`] in the inventory and [`Credential`] once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WolTarget<P = Credential> {
    /// The NIC to wake (the node's first boot MAC unless written).
    pub mac: Mac,
    /// Where the packet goes (the node's subnet broadcast unless written).
    pub broadcast: Ipv4Addr,
    /// UDP port (9, "discard", by default).
    pub port: u16,
    /// The NIC's SecureOn password, appended to the magic packet (`secureOnEnv` or
    /// `secureOnKey`): six bytes `aa:bb:cc:dd:ee:ff` or four dotted `1.2.3.4`, as etherwake's
    /// `-p` takes it. Read and checked when the driver is built
    /// ([`crate::power::credentials`]).
    pub secure_on: Option<P>,
}

/// A node's power controller. `P` is [`SecretRef`] as loaded, [`Credential`] once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerConfig<P = SecretRef> {
    /// Redfish BMC.
    Redfish(RedfishTarget<P>),
    /// IPMI 2.0 LAN BMC.
    Ipmi(IpmiTarget<P>),
    /// Proxmox VE VM.
    Proxmox(ProxmoxTarget<P>),
    /// Wake-on-LAN.
    Wol(WolTarget<P>),
}

impl<P> PowerConfig<P> {
    /// The inventory spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redfish(_) => "redfish",
            Self::Ipmi(_) => "ipmi",
            Self::Proxmox(_) => "proxmox",
            Self::Wol(_) => "wol",
        }
    }

    /// Whether the controller can choose the boot device (Wake-on-LAN only wakes), known
    /// before any credential resolves: `rack up` and the power-on round plan by it, and
    /// flows skip that step otherwise.
    pub fn can_set_boot_device(&self) -> bool {
        !matches!(self, Self::Wol(_))
    }

    /// The controller's address for messages (never a credential).
    pub fn target(&self) -> String {
        match self {
            Self::Redfish(t) => t.endpoint.clone(),
            Self::Ipmi(t) => format!("ipmi://{}:{}", t.host, t.port),
            Self::Proxmox(t) => format!("{} vm {}/{}", t.api_url, t.node, t.vmid),
            Self::Wol(t) => format!("wol {} via {}:{}", t.mac, t.broadcast, t.port),
        }
    }

    /// The same controller with every secret mapped by `f` (how references become
    /// credentials).
    pub fn try_map_secrets<Q, E>(
        self,
        mut f: impl FnMut(P) -> Result<Q, E>,
    ) -> Result<PowerConfig<Q>, E> {
        Ok(match self {
            Self::Redfish(t) => PowerConfig::Redfish(RedfishTarget {
                endpoint: t.endpoint,
                system_id: t.system_id,
                verify_tls: t.verify_tls,
                ca: t.ca,
                user: t.user,
                password: f(t.password)?,
                auth: t.auth,
                boot_mode: t.boot_mode,
            }),
            Self::Ipmi(t) => PowerConfig::Ipmi(IpmiTarget {
                host: t.host,
                port: t.port,
                user: t.user,
                password: f(t.password)?,
                efi_boot: t.efi_boot,
            }),
            Self::Proxmox(t) => PowerConfig::Proxmox(ProxmoxTarget {
                api_url: t.api_url,
                node: t.node,
                vmid: t.vmid,
                token_id: t.token_id,
                token_secret: f(t.token_secret)?,
                verify_tls: t.verify_tls,
                ca: t.ca,
                vm: t.vm,
            }),
            Self::Wol(t) => PowerConfig::Wol(WolTarget {
                mac: t.mac,
                broadcast: t.broadcast,
                port: t.port,
                secure_on: t.secure_on.map(f).transpose()?,
            }),
        })
    }
}

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
    let out = match kind.as_str() {
        "redfish" => {
            let endpoint = m.url("endpoint", "https://10.0.50.11", d);
            let system_id = m.string("systemId", d).map(|(s, _)| s);
            let verify_tls = m.boolean("verifyTls", true, d);
            let ca = m.path("ca", base, d);
            let user = m.required("user", "the BMC user, e.g. user: admin", d);
            let password = m.secret("password", creds_file.as_ref(), d);
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
        "ipmi" => {
            let host = m.required("host", "the BMC's address, e.g. host: 10.0.50.11", d);
            let port = m.port(623, d);
            let user = m.required("user", "the BMC user, e.g. user: admin", d);
            let password = m.secret("password", creds_file.as_ref(), d);
            Some(PowerConfig::Ipmi(IpmiTarget {
                host: host?,
                port: port?,
                user: user?,
                password: password?,
                efi_boot: matches!(node.firmware, Some(Firmware::Uefi | Firmware::Http)),
            }))
        }
        "proxmox" => {
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
            let token_secret = m.secret("tokenSecret", creds_file.as_ref(), d);
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
        "wol" => {
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
            let secure_on =
                if m.fields.contains_key("secureOnEnv") || m.fields.contains_key("secureOnKey") {
                    m.secret("secureOn", creds_file.as_ref(), d).map(Some)
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
        _ => None,
    };
    m.finish(&kind, d);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::inventory::{LoadError, Loaded, load_with_env};

    const HEAD: &str = "\
cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.11:6443
network:
  interfaces: [eth0]
  subnet: 10.0.40.0/24
roles:
  rack:
    extends: worker
    power: {kind: ipmi, user: admin, passwordEnv: BMC_PASS}
nodes:
  - name: cp-1
    mac: aa:00:00:00:00:01
    role: controlplane
    address: 10.0.40.11/24
    installDisk: /dev/sda
";

    fn load(nodes: &str) -> (tempfile::TempDir, Result<Loaded, LoadError>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("talboot.yaml");
        std::fs::write(&p, format!("{HEAD}{nodes}")).unwrap();
        let r = load_with_env(&p, &BTreeMap::new());
        (dir, r)
    }

    fn errors(nodes: &str) -> Vec<String> {
        match load(nodes).1 {
            Ok(_) => panic!("loaded"),
            Err(LoadError::Invalid { diagnostics, .. }) => {
                diagnostics.sorted().iter().map(|d| d.to_string()).collect()
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_node_inherits_its_roles_block_and_overrides_fields() {
        let (_d, r) = load(
            "  - name: wk-1
    mac: aa:00:00:00:00:04
    role: rack
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {host: 10.0.50.21}
  - name: wk-2
    mac: aa:00:00:00:00:05
    macs: [aa:00:00:00:00:06]
    role: rack
    address: 10.0.40.22/24
    installDisk: /dev/sda
    power: {kind: wol}
  - name: wk-3
    mac: aa:00:00:00:00:07
    role: rack
    address: 10.0.40.23/24
    installDisk: /dev/sda
    power: none
",
        );
        let inv = r.unwrap().inventory;
        assert_eq!(inv.node("cp-1").unwrap().power, None);
        assert_eq!(
            inv.node("wk-1").unwrap().power,
            Some(PowerConfig::Ipmi(IpmiTarget {
                host: "10.0.50.21".into(),
                port: 623,
                user: "admin".into(),
                password: SecretRef::Env("BMC_PASS".into()),
                efi_boot: false,
            }))
        );
        // Another kind on the node starts afresh: the role's user and password are dropped.
        assert_eq!(
            inv.node("wk-2").unwrap().power,
            Some(PowerConfig::Wol(WolTarget {
                mac: "aa:00:00:00:00:05".parse().unwrap(),
                broadcast: "10.0.40.255".parse().unwrap(),
                port: 9,
                secure_on: None,
            }))
        );
        assert_eq!(inv.node("wk-3").unwrap().power, None);
    }

    #[test]
    fn all_four_kinds_read_their_fields() {
        let (dir, r) = load(
            "  - name: rf
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    firmware: uefi
    power:
      kind: redfish
      endpoint: https://10.0.50.21/
      ca: bmc-ca.pem
      user: root
      passwordKey: rf
      credentialsFile: power.sops.yaml
      auth: session
  - name: pve
    mac: aa:00:00:00:00:05
    role: worker
    address: 10.0.40.22/24
    installDisk: /dev/sda
    power:
      kind: proxmox
      apiUrl: https://pve.lab:8006/api2/json
      node: pve
      vmid: 101
      tokenId: talboot@pve!power
      tokenSecretEnv: PVE_TOKEN
      verifyTls: false
      vm: {memory: 8192, cores: 4, diskGib: 40, storage: fast, bridges: [vmbr0, vmbr1]}
  - name: wol
    mac: aa:00:00:00:00:06
    role: worker
    address: 10.0.40.23/24
    installDisk: /dev/sda
    power: {kind: wol, mac: aa:00:00:00:00:99, broadcast: 255.255.255.255, port: 7}
",
        );
        let inv = r.unwrap().inventory;
        assert_eq!(
            inv.node("rf").unwrap().power,
            Some(PowerConfig::Redfish(RedfishTarget {
                endpoint: "https://10.0.50.21".into(),
                system_id: None,
                verify_tls: true,
                ca: Some(dir.path().join("bmc-ca.pem")),
                user: "root".into(),
                password: SecretRef::File {
                    file: dir.path().join("power.sops.yaml"),
                    key: "rf".into()
                },
                auth: AuthMode::Session,
                boot_mode: Some(BootMode::Uefi),
            }))
        );
        assert_eq!(
            inv.node("pve").unwrap().power,
            Some(PowerConfig::Proxmox(ProxmoxTarget {
                api_url: "https://pve.lab:8006/api2/json".into(),
                node: "pve".into(),
                vmid: 101,
                token_id: "talboot@pve!power".into(),
                token_secret: SecretRef::Env("PVE_TOKEN".into()),
                verify_tls: false,
                ca: None,
                vm: VmShape {
                    memory_mib: 8192,
                    cores: 4,
                    disk_gib: 40,
                    storage: "fast".into(),
                    bridges: vec!["vmbr0".into(), "vmbr1".into()],
                },
            }))
        );
        assert_eq!(
            inv.node("wol").unwrap().power,
            Some(PowerConfig::Wol(WolTarget {
                mac: "aa:00:00:00:00:99".parse().unwrap(),
                broadcast: Ipv4Addr::BROADCAST,
                port: 7,
                secure_on: None,
            }))
        );
    }

    #[test]
    fn an_ipmi_node_asks_for_an_efi_boot_when_its_firmware_is_uefi() {
        let (_d, r) = load(
            "  - name: efi
    mac: aa:00:00:00:00:04
    role: rack
    address: 10.0.40.21/24
    installDisk: /dev/sda
    firmware: uefi
    power: {host: 10.0.50.21}
  - name: httpboot
    mac: aa:00:00:00:00:05
    role: rack
    address: 10.0.40.22/24
    installDisk: /dev/sda
    firmware: http
    power: {host: 10.0.50.22}
  - name: bios
    mac: aa:00:00:00:00:06
    role: rack
    address: 10.0.40.23/24
    installDisk: /dev/sda
    firmware: bios
    power: {host: 10.0.50.23}
  - name: nohint
    mac: aa:00:00:00:00:07
    role: rack
    address: 10.0.40.24/24
    installDisk: /dev/sda
    power: {host: 10.0.50.24}
",
        );
        let inv = r.unwrap().inventory;
        let efi = |n: &str| match &inv.node(n).unwrap().power {
            Some(PowerConfig::Ipmi(t)) => t.efi_boot,
            other => panic!("{n}: {other:?}"),
        };
        assert!(efi("efi"));
        assert!(efi("httpboot"));
        assert!(!efi("bios"));
        // No hint: the boot type ipmitool sends without `options=efiboot` (legacy).
        assert!(!efi("nohint"));
    }

    #[test]
    fn a_wol_block_reads_its_secureon_password_reference() {
        let (dir, r) = load(
            "  - name: env
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: wol, secureOnEnv: WOL_SOPASS}
  - name: file
    mac: aa:00:00:00:00:05
    role: worker
    address: 10.0.40.22/24
    installDisk: /dev/sda
    power: {kind: wol, secureOnKey: nuc, credentialsFile: power.sops.yaml}
",
        );
        let inv = r.unwrap().inventory;
        let secure_on = |n: &str| match &inv.node(n).unwrap().power {
            Some(PowerConfig::Wol(t)) => t.secure_on.clone(),
            other => panic!("{n}: {other:?}"),
        };
        assert_eq!(secure_on("env"), Some(SecretRef::Env("WOL_SOPASS".into())));
        assert_eq!(
            secure_on("file"),
            Some(SecretRef::File {
                file: dir.path().join("power.sops.yaml"),
                key: "nuc".into()
            })
        );
    }

    #[test]
    fn a_clear_text_secureon_password_is_refused_without_repeating_it() {
        let e = errors(
            "  - name: wk-1
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: wol, secureOn: '5e:c2:e7:0a:11:99'}
  - name: wk-2
    mac: aa:00:00:00:00:05
    role: worker
    address: 10.0.40.22/24
    installDisk: /dev/sda
    power: {kind: wol, secureOnKey: nuc}
",
        )
        .join("\n");
        assert!(
            e.contains("nodes[1].power.secureOn: a clear-text secret in the inventory is refused")
                && e.contains("secureOnEnv: VAR"),
            "{e}"
        );
        assert!(!e.contains("5e:c2"), "{e}");
        assert!(
            e.contains("nodes[2].power.secureOnKey: secureOnKey needs credentialsFile"),
            "{e}"
        );
    }

    #[test]
    fn a_clear_text_password_is_refused_without_repeating_it() {
        let e = errors(
            "  - name: wk-1
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: ipmi, host: 10.0.50.21, user: admin, password: hunter2-in-clear, passwordEnv: BMC_PASS}
",
        );
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains("talboot.yaml:24:")
                && e[0].contains("nodes[1].power.password")
                && e[0].contains("clear-text")
                && e[0].contains("passwordEnv")
                && e[0].contains("credentialsFile"),
            "{}",
            e[0]
        );
        assert!(!e[0].contains("hunter2"), "{}", e[0]);
    }

    #[test]
    fn problems_name_the_field_and_the_fix() {
        let e = errors(
            "  - name: wk-1
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: ipmy}
  - name: wk-2
    mac: aa:00:00:00:00:05
    role: rack
    address: 10.0.40.22/24
    installDisk: /dev/sda
  - name: wk-3
    mac: aa:00:00:00:00:06
    role: worker
    address: 10.0.40.23/24
    installDisk: /dev/sda
    power: {kind: ipmi, host: h, user: u, passwordKey: k, port: 70000}
  - name: wk-4
    mac: aa:00:00:00:00:07
    role: worker
    address: 10.0.40.24/24
    installDisk: /dev/sda
    power: {kind: wol, host: h}
  - name: pve
    mac: aa:00:00:00:00:08
    role: worker
    address: 10.0.40.25/24
    installDisk: /dev/sda
    power:
      kind: proxmox
      apiUrl: https://pve.lab:8006
      node: pve
      vmid: 101
      tokenId: talboot@pve!power
      tokenSecretEnv: PVE_TOKEN
      vm: {memory: 512, cores: 0, bridges: [], disk: 10}
  - name: rf
    mac: aa:00:00:00:00:09
    role: worker
    address: 10.0.40.26/24
    installDisk: /dev/sda
    power: {kind: redfish, endpoint: https://10.0.50.26, user: root, passwordEnv: P, auth: token}
",
        )
        .join("\n");
        for want in [
            "nodes[1].power.kind: `ipmy` is not a power kind\n  hint: did you mean `ipmi`?",
            "node wk-2.power.host: required field `host` is missing",
            "nodes[3].power.passwordKey: passwordKey needs credentialsFile",
            "nodes[3].power.port: `70000` is not a port",
            "nodes[4].power.host: unknown field `host`",
            "nodes[5].power.vm.memory: 512 MiB is below the 2048 MiB Talos needs",
            "nodes[5].power.vm.cores: `0` is not a core count",
            "nodes[5].power.vm.bridges: is empty",
            "nodes[5].power.vm.disk: unknown field `disk`\n  hint: did you mean `diskGib`?",
            "nodes[6].power.auth: `token` is not a Redfish login (auto, session or basic)",
        ] {
            assert!(e.contains(want), "missing {want:?} in\n{e}");
        }
    }

    #[test]
    fn a_credential_never_formats_its_secret() {
        let c = Credential::new("hunter2-bmc");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!format!("{c}").contains("hunter2"));
        assert_eq!(c.expose(), "hunter2-bmc");
    }
}
