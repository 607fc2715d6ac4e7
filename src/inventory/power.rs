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

use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::model::{Mac, Node};

mod block;

pub(crate) use block::{PowerBlock, resolve};

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
    pub(crate) fn as_redfish(self) -> &'static str {
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
pub(crate) fn redfish_boot_mode(node: &Node) -> Option<BootMode> {
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
    pub(crate) fn can_set_boot_device(&self) -> bool {
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
    pub(crate) fn try_map_secrets<Q, E>(
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
