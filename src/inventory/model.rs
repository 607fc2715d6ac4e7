//! Typed inventory values.
//!
//! Everything an operator writes is parsed once into these types at load time, so the rest of
//! the program never re-parses a string: a MAC is a [`Mac`], an address with prefix is an
//! [`Ipv4Net`], a role reference is resolved into a [`ResolvedRole`]. Fields that take part in
//! cross-field validation keep their source location in a [`Spanned`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::ops::Deref;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use ipnet::Ipv4Net;

use thiserror::Error;

use super::diag::Loc;

/// A value with the place in the source it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned<T> {
    /// The value.
    pub value: T,
    /// Where it was written.
    pub(crate) loc: Loc,
}

impl<T> Spanned<T> {
    /// Pair a value with its location.
    pub fn new(value: T, loc: Loc) -> Self {
        Self { value, loc }
    }
}

impl<T> Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// An Ethernet hardware address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

/// Why a string is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a MAC address")]
pub struct MacParseError(pub String);

impl FromStr for Mac {
    type Err = MacParseError;
    /// Accepts `aa:bb:cc:dd:ee:ff` and `aa-bb-cc-dd-ee-ff`, any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError(s.to_string());
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut parts = s.split(sep);
        for byte in &mut out {
            let p = parts.next().ok_or_else(err)?;
            if p.len() != 2 {
                return Err(err());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Mac(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl serde::Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Defines a closed set of words that the inventory accepts for a field, with parsing,
/// display and the list of valid spellings for error hints.
macro_rules! word_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            /// Every accepted spelling, in declaration order.
            pub(crate) const WORDS: &'static [&'static str] = &[$($text),+];

            /// The inventory spelling of this value.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }

            /// Parse an inventory spelling.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some(Self::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

word_enum!(
    /// What kind of Talos machine a role produces.
    MachineType {
        /// Runs etcd and the Kubernetes control plane.
        ControlPlane = "controlplane",
        /// Runs workloads only.
        Worker = "worker",
    }
);

word_enum!(
    /// CPU architecture of a node, selecting which Talos kernel and initramfs it boots.
    Arch {
        /// x86-64.
        Amd64 = "amd64",
        /// 64-bit ARM.
        Arm64 = "arm64",
    }
);

word_enum!(
    /// How a node's firmware network-boots; picks the family (BIOS or UEFI) over what DHCP
    /// classification guesses. The transport (TFTP or HTTP) is the one the client asks for.
    Firmware {
        /// Legacy BIOS PXE: gets `undionly.kpxe` over TFTP.
        Bios = "bios",
        /// UEFI: gets an EFI iPXE binary (over TFTP, or as a URL when it asks for HTTP boot).
        Uefi = "uefi",
        /// UEFI HTTP boot: an EFI binary as an HTTP URL (over TFTP if it falls back to PXE).
        Http = "http",
    }
);

word_enum!(
    /// Whether talboot hands out addresses or only boot information.
    NetworkMode {
        /// talboot is the DHCP server for the subnet.
        Authoritative = "authoritative",
        /// Another DHCP server hands out addresses; talboot adds boot information (proxyDHCP).
        Proxy = "proxy",
    }
);

word_enum!(
    /// How a node receives its machine config.
    Delivery {
        /// talboot calls ApplyConfiguration on the node's maintenance API.
        Push = "push",
        /// The node fetches it through `talos.config=` with a one-time token.
        Pull = "pull",
    }
);

word_enum!(
    /// How an installed node's boot script sends it to its disk (the firmware's boot order
    /// stays network-first, so the script must end the network boot; see docs/inventory.md).
    LocalBoot {
        /// `exit`: iPXE returns to the firmware, which tries its next boot entry.
        Exit = "exit",
        /// `sanboot --no-describe --drive 0x80`: iPXE boots the first BIOS disk itself (for
        /// firmware that would not move on after `exit`); falls back to `exit`.
        Sanboot = "sanboot",
        /// The per-MAC script answers HTTP 404: the chain fails and iPXE exits to the firmware.
        Http404 = "http404",
    }
);

word_enum!(
    /// What a node without Secure Boot gets when its firmware asks by UEFI HTTP Boot (vendor
    /// class `HTTPClient`). A `secureBoot: true` node always gets its boot set's signed UKI.
    HttpBoot {
        /// iPXE (`ipxe.efi`/`snponly.efi`) as an `http://` URL; it then fetches its script.
        Ipxe = "ipxe",
        /// The boot set's plain UKI (`uki.efi`): kernel, initramfs and command line in one
        /// EFI binary, so no iPXE and no TFTP at all. Its command line is sealed: config by push.
        Uki = "uki",
    }
);

word_enum!(
    /// What happens to a machine whose MAC the inventory does not list.
    UnknownPolicy {
        /// It gets no answer at all.
        Ignore = "ignore",
        /// It boots Talos into maintenance mode and shows up as discovered.
        Discover = "discover",
    }
);

word_enum!(
    /// Kind of disk in an install disk selector (Talos `InstallDiskSelector.type`).
    DiskType {
        /// Solid-state SATA/SAS disk.
        Ssd = "ssd",
        /// Rotational disk.
        Hdd = "hdd",
        /// NVMe device.
        Nvme = "nvme",
        /// SD card / MMC.
        Sd = "sd",
    }
);

word_enum!(
    /// Kubernetes taint effect.
    TaintEffect {
        /// New pods without a toleration are not scheduled.
        NoSchedule = "NoSchedule",
        /// The scheduler avoids the node.
        PreferNoSchedule = "PreferNoSchedule",
        /// Running pods without a toleration are evicted.
        NoExecute = "NoExecute",
    }
);

/// A release version such as Talos `v1.13.9` or Kubernetes `1.36.3` (the `v` is optional).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub semver::Version);

impl FromStr for Version {
    type Err = semver::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        semver::Version::parse(s.strip_prefix('v').unwrap_or(s)).map(Version)
    }
}

impl fmt::Display for Version {
    /// Always with the leading `v`, as Talos and Kubernetes image tags spell it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Host part of the cluster endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointHost {
    /// An IPv4 literal.
    Ip(Ipv4Addr),
    /// A DNS name.
    Name(String),
}

/// The Kubernetes API endpoint, `https://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The host.
    pub host: EndpointHost,
    /// The port (6443 when not written).
    pub port: u16,
}

/// What is wrong with an endpoint (each message quotes the part at fault).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    /// Not `https://`.
    #[error("`{0}` must start with https://")]
    NotHttps(String),
    /// Something after the host and port.
    #[error("`{0}` must not have a path")]
    HasPath(String),
    /// The port is not 1-65535.
    #[error("`{0}` is not a port number")]
    BadPort(String),
    /// Nothing between `https://` and the port.
    #[error("`{0}` has no host")]
    NoHost(String),
    /// The host is neither an address nor a name.
    #[error("`{0}` is neither an IPv4 address nor a DNS name")]
    BadHost(String),
}

impl Endpoint {
    /// Parse `https://host[:port][/]`; the error says what is wrong otherwise.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        let rest = s
            .strip_prefix("https://")
            .ok_or_else(|| EndpointError::NotHttps(s.to_string()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            return Err(EndpointError::HasPath(s.to_string()));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| EndpointError::BadPort(p.to_string()))?,
            ),
            None => (rest, 6443),
        };
        if host.is_empty() {
            return Err(EndpointError::NoHost(s.to_string()));
        }
        let host = match host.parse::<Ipv4Addr>() {
            Ok(ip) => EndpointHost::Ip(ip),
            Err(_) if is_dns_name(host) => EndpointHost::Name(host.to_string()),
            Err(_) => return Err(EndpointError::BadHost(host.to_string())),
        };
        Ok(Self { host, port })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            EndpointHost::Ip(ip) => write!(f, "https://{ip}:{}", self.port),
            EndpointHost::Name(n) => write!(f, "https://{n}:{}", self.port),
        }
    }
}

/// True for an RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
pub(crate) fn is_dns_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// True for one RFC 1123 label (1–63 chars, alphanumerics and inner hyphens).
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A patch to a Talos machine config.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch {
    /// Where the patch came from (for error messages and provenance).
    pub(crate) origin: PatchOrigin,
    /// The patch content.
    pub body: PatchBody,
    /// Where each field and document of the patch is written (empty for patches talboot
    /// builds itself), for the checks that depend on the cluster's Talos contract.
    pub(crate) keys: PatchKeys,
}

/// Where the fields of a patch are written, for diagnostics that depend on the cluster's
/// machine-config contract (known only once the whole inventory is read).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PatchKeys {
    /// The inventory field the patch is listed under (`cluster.patches[0]`).
    pub(crate) at: String,
    /// v1alpha1 key paths at every depth, in source order, each with where it is written
    /// (JSON-patch operations: the pointer's path, at the operation).
    pub(crate) fields: Vec<(Vec<String>, super::diag::Loc)>,
    /// Kinds of the typed documents, each with where the document starts.
    pub(crate) kinds: Vec<(String, super::diag::Loc)>,
    /// The paths of JSON-patch operations (also in `fields`), each at its operation.
    pub(crate) ops: Vec<(Vec<String>, super::diag::Loc)>,
}

/// Where a patch was written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PatchOrigin {
    /// Inline in the inventory at this location.
    Inline(Loc),
    /// In this file (absolute, or relative to the working directory).
    File(PathBuf),
}

impl fmt::Display for PatchOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatchOrigin::Inline(loc) => write!(f, "inline patch at {loc}"),
            PatchOrigin::File(p) => write!(f, "patch file {}", p.display()),
        }
    }
}

/// The two kinds of patch Talos accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchBody {
    /// Strategic merge: one or more YAML documents (a v1alpha1 fragment and/or typed documents
    /// such as `UserVolumeConfig`), merged by Talos's rules.
    Merge(Vec<yaml_serde::Value>),
    /// RFC 6902 JSON patch operations against the v1alpha1 document.
    Json(Vec<yaml_serde::Value>),
}

/// A Kubernetes taint `key[=value]:Effect`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Optional value.
    pub value: Option<String>,
    /// Effect.
    pub(crate) effect: TaintEffect,
}

/// What is wrong with a taint (each message quotes the part at fault).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TaintError {
    /// No `:Effect`.
    #[error("`{0}` has no effect; write key=value:NoSchedule")]
    NoEffect(String),
    /// An effect Kubernetes does not know.
    #[error("`{0}` is not a taint effect; use one of {words}", words = TaintEffect::WORDS.join(", "))]
    BadEffect(String),
    /// The key is not a label key.
    #[error("`{0}` is not a valid taint key")]
    BadKey(String),
}

impl Taint {
    /// Parse kubectl's `key[=value]:Effect` syntax.
    pub fn parse(s: &str) -> Result<Self, TaintError> {
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| TaintError::NoEffect(s.to_string()))?;
        let effect =
            TaintEffect::parse(effect).ok_or_else(|| TaintError::BadEffect(effect.to_string()))?;
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if !is_label_key(key) {
            return Err(TaintError::BadKey(key.to_string()));
        }
        Ok(Self {
            key: key.to_string(),
            value,
            effect,
        })
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={}:{}", self.key, v, self.effect),
            None => write!(f, "{}:{}", self.key, self.effect),
        }
    }
}

/// True for a Kubernetes label/taint key: optional DNS prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
pub(crate) fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns_name)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

/// Talos `InstallDiskSelector`: the install disk is the one disk matching every given field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskSelector {
    /// Size, optionally with a comparison: `500GB`, `>= 1TB`, `<= 2TB`.
    pub size: Option<String>,
    /// Disk model (glob as Talos accepts it).
    pub model: Option<String>,
    /// Disk serial number.
    pub serial: Option<String>,
    /// Kind of disk.
    pub disk_type: Option<DiskType>,
    /// World-wide identifier.
    pub wwid: Option<String>,
    /// Kernel bus path, e.g. `/pci0000:00/0000:00:1f.2/ata1/*` — stable across NVMe renumbering.
    pub bus_path: Option<String>,
    /// The operator's own CEL expression (`match`, Talos v1.14 and later), checked against
    /// Talos's disk environment when the inventory loads; it replaces the fields above.
    pub expr: Option<Spanned<String>>,
}

impl DiskSelector {
    /// True when no field is set (such a selector would match every disk).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl fmt::Display for DiskSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let fields: [(&str, Option<String>); 6] = [
            ("model", self.model.clone()),
            ("serial", self.serial.clone()),
            ("size", self.size.clone()),
            ("type", self.disk_type.map(|t| t.to_string())),
            ("wwid", self.wwid.clone()),
            ("busPath", self.bus_path.clone()),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        }
        if let Some(e) = &self.expr {
            parts.push(format!("match={}", e.value));
        }
        write!(f, "selector({})", parts.join(", "))
    }
}

/// Where Talos installs itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallTarget {
    /// A device path such as `/dev/sda`.
    Disk(String),
    /// The one disk matching a selector.
    Selector(DiskSelector),
}

impl fmt::Display for InstallTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallTarget::Disk(d) => f.write_str(d),
            InstallTarget::Selector(s) => s.fmt(f),
        }
    }
}

/// A dynamic address range `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// First address handed out.
    pub start: Ipv4Addr,
    /// Last address handed out.
    pub end: Ipv4Addr,
}

impl Pool {
    /// True when `ip` is inside the range.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.start <= ip && ip <= self.end
    }

    /// Number of addresses in the range.
    pub fn len(&self) -> u64 {
        u64::from(u32::from(self.end)) - u64::from(u32::from(self.start)) + 1
    }

    /// Never true for a validated pool (start <= end); present for API completeness.
    pub fn is_empty(&self) -> bool {
        self.end < self.start
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// A subnet reached through a DHCP relay (giaddr), with its own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySubnet {
    /// The relayed subnet.
    pub subnet: Spanned<Ipv4Net>,
    /// Router option for that subnet.
    pub gateway: Option<Spanned<Ipv4Addr>>,
    /// Dynamic range in that subnet, if any.
    pub pool: Option<Spanned<Pool>>,
    /// DNS servers for that subnet (defaults to the main network's).
    pub dns: Vec<Ipv4Addr>,
}

/// The whole cluster-level configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Cluster name (talosconfig context, Talos `cluster.clusterName`).
    pub name: Spanned<String>,
    /// Talos version to boot and whose config contract to render.
    pub talos_version: Spanned<Version>,
    /// Kubernetes version.
    pub kubernetes_version: Spanned<Version>,
    /// Kubernetes API endpoint.
    pub endpoint: Spanned<Endpoint>,
    /// Shared virtual IP for the control planes (Talos layer-2 VIP).
    pub vip: Option<Spanned<Ipv4Addr>>,
    /// Pod networks.
    pub(crate) pod_subnets: Vec<Ipv4Net>,
    /// Service networks.
    pub(crate) service_subnets: Vec<Ipv4Net>,
    /// Kubernetes DNS domain.
    pub(crate) dns_domain: String,
    /// Whether control planes also run workloads.
    pub allow_scheduling_on_control_planes: bool,
    /// Secrets bundle location and age recipients.
    pub secrets: Secrets,
    /// Patches applied to every node, first.
    pub patches: Vec<Patch>,
    /// Installer image and Image Factory schematic.
    pub installer: Installer,
    /// The operator installs the CNI (talhelper's `cniConfig: {name: none}`): machine
    /// configs carry `cni: none` even when talboot's Cilium add-on is not enabled.
    pub(crate) external_cni: bool,
}

/// Where the cluster secrets bundle lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets {
    /// Path of the (age- or SOPS-encrypted) bundle, resolved against the inventory's folder.
    pub file: PathBuf,
    /// age recipients (`age1…`) the bundle is encrypted to.
    pub(crate) age_recipients: Vec<String>,
}

/// Installer image selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installer {
    /// Image Factory schematic ID (64 hex digits); the vanilla schematic when unset.
    pub schematic: Option<String>,
    /// Full installer image reference without tag, overriding the factory URL.
    pub image: Option<String>,
    /// Image Factory base URL (mirrors and air gaps set their own).
    pub(crate) factory_url: String,
}

/// The schematic ID of the empty schematic (`customization: {}`), i.e. vanilla Talos.
pub const VANILLA_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

impl Installer {
    /// The schematic in effect (vanilla when none is set).
    pub fn schematic_id(&self) -> &str {
        self.schematic.as_deref().unwrap_or(VANILLA_SCHEMATIC)
    }
}

/// The provisioning network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// Interfaces talboot listens on.
    pub interfaces: Vec<String>,
    /// Authoritative or proxy DHCP.
    pub mode: NetworkMode,
    /// The directly attached subnet.
    pub subnet: Spanned<Ipv4Net>,
    /// Default gateway handed to clients and nodes.
    pub gateway: Option<Spanned<Ipv4Addr>>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// NTP servers (addresses or names; DHCP hands out the addresses only).
    pub ntp: Vec<String>,
    /// DNS search domain handed out by DHCP.
    pub domain: Option<String>,
    /// Dynamic range for machines without a reservation (authoritative mode, `discover`).
    pub pool: Option<Spanned<Pool>>,
    /// Lease duration.
    pub lease_time: Duration,
    /// The address talboot puts in boot URLs and server identifiers.
    pub advertise: Option<Spanned<Ipv4Addr>>,
    /// Subnets behind DHCP relays.
    pub relays: Vec<RelaySubnet>,
}

impl Network {
    /// Every subnet talboot serves: the attached one, then the relayed ones.
    pub fn subnets(&self) -> impl Iterator<Item = &Spanned<Ipv4Net>> {
        std::iter::once(&self.subnet).chain(self.relays.iter().map(|r| &r.subnet))
    }
}

/// Boot behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// Push or pull config delivery.
    pub delivery: Delivery,
    /// Policy for MACs not in the inventory.
    pub(crate) unknown_machines: UnknownPolicy,
    /// Architecture assumed when neither the node nor DHCP says.
    pub default_arch: Arch,
    /// Extra kernel arguments for every node.
    pub(crate) kernel_args: Vec<String>,
    /// How installed nodes boot their disk, unless a node says otherwise.
    pub local_boot: LocalBoot,
    /// `httpBoot`: what a UEFI HTTP Boot client without Secure Boot is handed.
    pub http_boot: HttpBoot,
}

/// A role as written in the inventory (before `extends` is resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct RoleDef {
    /// The role's name.
    pub name: Spanned<String>,
    /// Machine type; inherited from the parent when absent.
    pub machine_type: Option<MachineType>,
    /// Parent role.
    pub(crate) extends: Option<Spanned<String>>,
    /// Patches of this role (applied after the parent's).
    pub patches: Vec<Patch>,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub(crate) taints: Vec<Taint>,
}

/// A role with its `extends` chain folded in.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRole {
    /// The role's name.
    pub name: String,
    /// Machine type.
    pub machine_type: MachineType,
    /// Role names from the root ancestor to this role.
    pub chain: Vec<String>,
    /// Patches in application order (root ancestor first).
    pub patches: Vec<Patch>,
    /// Labels, later roles overriding earlier ones.
    pub labels: BTreeMap<String, String>,
    /// Taints, union over the chain (a later role replaces an earlier taint with the same key
    /// and effect).
    pub(crate) taints: Vec<Taint>,
}

/// An additional NIC of a node (not used for booting), configured statically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraInterface {
    /// Hardware address selecting the NIC.
    pub mac: Spanned<Mac>,
    /// Addresses with prefix.
    pub addresses: Vec<Spanned<Ipv4Net>>,
    /// MTU.
    pub(crate) mtu: Option<u32>,
}

/// One machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Hostname (also the node's name everywhere in talboot).
    pub name: Spanned<String>,
    /// Boot NIC hardware addresses (the first one carries the static address).
    pub macs: Vec<Spanned<Mac>>,
    /// Role name (resolved in [`Inventory::roles`]).
    pub role: Spanned<String>,
    /// Static address with prefix on the boot NIC.
    pub address: Spanned<Ipv4Net>,
    /// Default gateway (the network's when absent).
    pub gateway: Option<Spanned<Ipv4Addr>>,
    /// Install disk or selector.
    pub install: InstallTarget,
    /// Architecture (the boot section's default when absent).
    pub arch: Option<Arch>,
    /// Firmware hint overriding DHCP classification.
    pub firmware: Option<Firmware>,
    /// Extra kernel arguments for this node.
    pub kernel_args: Vec<String>,
    /// How this node boots its disk once installed (the boot section's when absent).
    pub local_boot: Option<LocalBoot>,
    /// Node-specific patches (applied last).
    pub patches: Vec<Patch>,
    /// Extra labels for this node.
    pub labels: BTreeMap<String, String>,
    /// Extra taints for this node.
    pub taints: Vec<Taint>,
    /// Additional NICs.
    pub interfaces: Vec<ExtraInterface>,
    /// Power and boot-device control (the node's `power:` over its role's); `None` for
    /// `kind: none` or no block anywhere.
    pub power: Option<super::power::PowerConfig>,
    /// RAID install and dedicated system volumes (Talos v1.14 and later; the roles' volumes
    /// folded in at load).
    pub storage: super::storage::Storage,
    /// `secureBoot`: the node's own, else the nearest role's in its `extends` chain (folded in
    /// at load); `None` when neither sets it, which is off. Read it with
    /// [`Node::secure_boot`]; the span says where it was set, for refusals.
    pub secure_boot: Option<Spanned<bool>>,
}

impl Node {
    /// Whether the node boots with UEFI Secure Boot enforced: it is offered only the signed
    /// UKI of its boot set, configured by push, and gets its config only after its
    /// maintenance API reports that it booted securely.
    pub fn secure_boot(&self) -> bool {
        self.secure_boot.as_ref().is_some_and(|s| s.value)
    }
}

/// The Cilium add-on.
#[derive(Debug, Clone, PartialEq)]
pub struct CiliumAddon {
    /// Whether talboot installs it.
    pub enabled: bool,
    /// Chart version (no `v`).
    pub version: Spanned<Version>,
    /// Operator values merged over talboot's Talos values.
    pub values: yaml_serde::Value,
    /// Replace kube-proxy (and disable it in the machine config).
    pub kube_proxy_replacement: bool,
    /// Where `helm template` finds the chart; `None` means the upstream repository
    /// (<https://helm.cilium.io>).
    pub chart: Option<ChartRef>,
}

/// Where `helm template` finds an add-on's chart (`addons.<name>.chart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChartRef {
    /// A chart repository URL (`https://…`, passed as `--repo`); the chart keeps its usual
    /// name (`cilium`, `argo-cd`), e.g. a site mirror of the upstream repository.
    Repo(String),
    /// An OCI reference to the chart itself, e.g. `oci://quay.io/cilium/charts/cilium`.
    Oci(String),
    /// A chart directory or packaged `.tgz` on the talboot machine, for air-gapped sites;
    /// written relative to the inventory's folder.
    Local(std::path::PathBuf),
}

/// The ArgoCD add-on.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgoCdAddon {
    /// Whether talboot installs it.
    pub enabled: bool,
    /// Chart version (no `v`).
    pub version: Spanned<Version>,
    /// Operator values merged over talboot's.
    pub values: yaml_serde::Value,
    /// `global.domain`.
    pub domain: Option<String>,
    /// Set up KSOPS and the `sops-age` Secret.
    pub ksops: bool,
    /// `configs.params."server.insecure"`: the Argo CD server speaks plain HTTP because TLS
    /// is terminated at an ingress or gateway in front of it.
    pub insecure: bool,
    /// Optional root Application.
    pub root_app: Option<RootApp>,
    /// Where `helm template` finds the chart; `None` means the upstream repository
    /// (<https://argoproj.github.io/argo-helm>).
    pub chart: Option<ChartRef>,
}

/// The Application that starts the GitOps loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootApp {
    /// Git repository URL.
    pub repo_url: String,
    /// Path inside the repository.
    pub path: String,
    /// Branch, tag or commit.
    pub revision: String,
}

/// Cluster add-ons.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Addons {
    /// Cilium CNI.
    pub cilium: Option<CiliumAddon>,
    /// ArgoCD.
    pub argocd: Option<ArgoCdAddon>,
}

/// Which file format an inventory was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// talboot's own `talboot.yaml`.
    Talboot,
    /// talhelper's `talconfig.yaml`.
    Talhelper,
}

/// A loaded, validated inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct Inventory {
    /// The file it was loaded from.
    pub path: PathBuf,
    /// Its format.
    pub format: SourceFormat,
    /// Cluster settings.
    pub cluster: Cluster,
    /// Provisioning network.
    pub network: Network,
    /// Boot behaviour.
    pub boot: Boot,
    /// Roles with `extends` resolved, by name.
    pub roles: BTreeMap<String, ResolvedRole>,
    /// Machines, in file order.
    pub nodes: Vec<Node>,
    /// Add-ons.
    pub addons: Addons,
}

impl Inventory {
    /// The resolved role of `node`. Validation guarantees every node's role exists.
    pub fn role_of(&self, node: &Node) -> &ResolvedRole {
        &self.roles[node.role.as_str()]
    }

    /// Nodes whose role makes them control planes, in file order.
    pub(crate) fn control_planes(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .filter(|n| self.role_of(n).machine_type == MachineType::ControlPlane)
    }

    /// The node that owns boot MAC `mac`.
    pub(crate) fn node_by_mac(&self, mac: Mac) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.macs.iter().any(|m| m.value == mac))
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name.as_str() == name)
    }

    /// The architecture `node` boots.
    pub(crate) fn arch_of(&self, node: &Node) -> Arch {
        node.arch.unwrap_or(self.boot.default_arch)
    }

    /// How `node` boots its disk once installed.
    pub(crate) fn local_boot_of(&self, node: &Node) -> LocalBoot {
        node.local_boot.unwrap_or(self.boot.local_boot)
    }

    /// The gateway `node` uses (its own, else the network's).
    pub fn gateway_of(&self, node: &Node) -> Option<Ipv4Addr> {
        node.gateway
            .as_ref()
            .or(self.network.gateway.as_ref())
            .map(|g| g.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_both_separators_and_prints_lowercase() {
        let m: Mac = "BC:24:11:0A:0b:0C".parse().unwrap();
        assert_eq!(m.to_string(), "bc:24:11:0a:0b:0c");
        assert_eq!("bc-24-11-0a-0b-0c".parse::<Mac>().unwrap(), m);
        for bad in [
            "bc:24:11:0a:0b",
            "bc:24:11:0a:0b:0c:0d",
            "zz:24:11:0a:0b:0c",
            "b:24:11:0a:0b:0c0",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoint_parsing() {
        let e = Endpoint::parse("https://10.0.40.101:6443").unwrap();
        assert_eq!(e.host, EndpointHost::Ip("10.0.40.101".parse().unwrap()));
        assert_eq!(e.port, 6443);
        let e = Endpoint::parse("https://k8s.example.com/").unwrap();
        assert_eq!(e.port, 6443);
        assert!(Endpoint::parse("http://10.0.0.1:6443").is_err());
        assert!(Endpoint::parse("https://10.0.0.1:0").is_err());
        assert!(Endpoint::parse("https://bad_host:6443").is_err());
    }

    #[test]
    fn taints_parse_kubectl_syntax() {
        let t = Taint::parse("dedicated=monitoring:NoSchedule").unwrap();
        assert_eq!(t.key, "dedicated");
        assert_eq!(t.value.as_deref(), Some("monitoring"));
        assert_eq!(t.effect, TaintEffect::NoSchedule);
        assert_eq!(t.to_string(), "dedicated=monitoring:NoSchedule");
        assert!(Taint::parse("dedicated=monitoring").is_err());
        assert!(Taint::parse("dedicated:Sometimes").is_err());
    }

    #[test]
    fn versions_accept_an_optional_v() {
        let v: Version = "v1.13.9".parse().unwrap();
        assert_eq!(v, "1.13.9".parse().unwrap());
        assert_eq!(v.to_string(), "v1.13.9");
        assert!("1.13".parse::<Version>().is_err());
    }

    #[test]
    fn label_keys() {
        assert!(is_label_key("node-role.kubernetes.io/storage"));
        assert!(is_label_key("pool"));
        assert!(!is_label_key("-pool"));
        assert!(!is_label_key("bad prefix/x"));
    }
}
