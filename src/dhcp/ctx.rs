//! The inventory as the DHCP decision sees it: subnets with their options, known machines by
//! MAC, the unknown-machine policy and where boot files live.
//!
//! Built once per inventory load (`DecideCtx::from_inventory`) and shared read-only by every
//! socket task; the mutable half of DHCP state is the [`LeaseBook`](super::leases::LeaseBook).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::artifacts::{Catalog, Kind, SetId};
use crate::inventory::{
    Arch, Firmware, HttpBoot, Inventory, Ipv4Net, Mac, NetworkMode, Pool, UnknownPolicy,
};

use super::leases::{DEFAULT_OFFER_HOLD, DEFAULT_QUARANTINE, LeaseBookConfig};

/// One subnet talboot serves, directly attached or behind a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// The network.
    pub net: Ipv4Net,
    /// Reached through a DHCP relay (giaddr in this subnet).
    pub relayed: bool,
    /// Option 3.
    pub router: Option<Ipv4Addr>,
    /// Option 6.
    pub dns: Vec<Ipv4Addr>,
    /// Option 42 (only the inventory's NTP entries that are addresses).
    pub ntp: Vec<Ipv4Addr>,
    /// Option 15.
    pub domain: Option<String>,
    /// Dynamic range for machines without a usable reservation.
    pub pool: Option<Pool>,
    /// Option 51.
    pub lease_time: Duration,
}

/// A machine the inventory names, keyed by each of its boot MACs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Node name: option 12.
    pub name: String,
    /// Reserved address.
    pub ip: Ipv4Addr,
    /// The node's own gateway, overriding its subnet's router.
    pub gateway: Option<Ipv4Addr>,
    /// Architecture from the inventory, overriding DHCP classification.
    pub arch: Option<Arch>,
    /// Firmware hint, overriding DHCP classification.
    pub firmware: Option<Firmware>,
    /// `secureBoot: true`: only its boot set's signed UKI may be offered, never iPXE.
    pub secure_boot: bool,
}

/// The UKIs one architecture's boot set has in the artifact cache, and where they are: the
/// same `assets/<talos>/<schematic>/<arch>/` path over HTTP (`<http_base>/assets/...`) and
/// TFTP (the name relative to the TFTP root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UkiSet {
    /// `assets/<talos>/<schematic>/<arch>`, no trailing slash.
    pub(crate) dir: String,
    /// The plain UKI (`uki.efi`) is in the catalog.
    pub(crate) plain: bool,
    /// The Secure Boot signed UKI (`secureboot-uki.efi`) is in the catalog.
    pub(crate) signed: bool,
}

impl UkiSet {
    /// The path of `kind` in this set, relative to a server's root.
    pub(crate) fn path(&self, kind: Kind) -> String {
        format!("{}/{}", self.dir, kind.file_name())
    }
}

/// The UKIs of the inventory's boot sets (its Talos version and schematic, per architecture)
/// that `catalog` holds.
pub fn uki_sets(inv: &Inventory, catalog: &Catalog) -> BTreeMap<Arch, UkiSet> {
    [Arch::Amd64, Arch::Arm64]
        .into_iter()
        .filter_map(|arch| {
            let id = SetId::new(
                &inv.cluster.talos_version.value,
                inv.cluster.installer.schematic_id(),
                arch,
            );
            let entry = catalog.find(&id)?;
            let set = UkiSet {
                dir: format!("assets/{}/{}/{}", id.talos, id.schematic, id.arch),
                plain: entry.files.contains_key(&Kind::Uki),
                signed: entry.files.contains_key(&Kind::SecureBootUki),
            };
            (set.plain || set.signed).then_some((arch, set))
        })
        .collect()
}

/// Where first-stage boot files are fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootTargets {
    /// TFTP server for PXE firmware (siaddr, option 66).
    pub(crate) tftp_server: Ipv4Addr,
    /// Base URL of talboot's HTTP server, without trailing slash (e.g. `http://10.0.0.1:8080`).
    pub(crate) http_base: String,
    /// iPXE for legacy BIOS PXE ROMs.
    pub(crate) bios_file: String,
    /// iPXE for x86-64 UEFI (`ipxe.efi` or `snponly.efi`).
    pub(crate) uefi_x64_file: String,
    /// iPXE for arm64 UEFI.
    pub(crate) arm64_file: String,
    /// URL of the per-machine iPXE script; `mac` and `arch` query parameters are appended.
    pub(crate) ipxe_script_url: String,
}

impl BootTargets {
    /// The usual layout: files at the TFTP root and under `http_base`, script at `/boot.ipxe`.
    pub fn standard(server: Ipv4Addr, http_port: u16) -> Self {
        let http_base = if http_port == 80 {
            format!("http://{server}")
        } else {
            format!("http://{server}:{http_port}")
        };
        Self {
            tftp_server: server,
            ipxe_script_url: format!("{http_base}/boot.ipxe"),
            http_base,
            bios_file: crate::firststage::BIOS.into(),
            uefi_x64_file: crate::firststage::UEFI_X64.into(),
            arm64_file: crate::firststage::UEFI_ARM64.into(),
        }
    }
}

/// Everything `decide` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideCtx {
    /// Authoritative or proxy.
    pub mode: NetworkMode,
    /// Our address: option 54 and the source of replies.
    pub server_ip: Ipv4Addr,
    /// Served subnets; the first is the directly attached one.
    pub subnets: Vec<Subnet>,
    /// Known machines by boot MAC.
    pub hosts: BTreeMap<Mac, Host>,
    /// What to do with MACs not in `hosts`.
    pub unknown: UnknownPolicy,
    /// Boot files.
    pub boot: BootTargets,
    /// Architecture assumed when neither the inventory nor DHCP tells.
    pub default_arch: Arch,
    /// What a UEFI HTTP Boot client without Secure Boot gets (`boot.httpBoot`).
    pub http_boot: HttpBoot,
    /// The boot sets' UKIs by architecture ([`uki_sets`]); empty when the cache has none.
    pub ukis: BTreeMap<Arch, UkiSet>,
}

impl DecideCtx {
    /// The DHCP view of a validated inventory. `server_ip` is the resolved advertise address
    /// (the inventory's `network.advertise`, or the serving interface's address).
    pub fn from_inventory(inv: &Inventory, server_ip: Ipv4Addr, boot: BootTargets) -> Self {
        let net = &inv.network;
        let ntp: Vec<Ipv4Addr> = net.ntp.iter().filter_map(|s| s.parse().ok()).collect();
        let mut subnets = vec![Subnet {
            net: net.subnet.value,
            relayed: false,
            router: net.gateway.as_ref().map(|g| g.value),
            dns: net.dns.clone(),
            ntp: ntp.clone(),
            domain: net.domain.clone(),
            pool: net.pool.as_ref().map(|p| p.value),
            lease_time: net.lease_time,
        }];
        for r in &net.relays {
            subnets.push(Subnet {
                net: r.subnet.value,
                relayed: true,
                router: r.gateway.as_ref().map(|g| g.value),
                dns: if r.dns.is_empty() {
                    net.dns.clone()
                } else {
                    r.dns.clone()
                },
                ntp: ntp.clone(),
                domain: net.domain.clone(),
                pool: r.pool.as_ref().map(|p| p.value),
                lease_time: net.lease_time,
            });
        }
        let mut hosts = BTreeMap::new();
        for node in &inv.nodes {
            let host = Host {
                name: node.name.value.clone(),
                ip: node.address.value.addr(),
                gateway: node.gateway.as_ref().map(|g| g.value),
                arch: node.arch,
                firmware: node.firmware,
                secure_boot: node.secure_boot(),
            };
            for mac in &node.macs {
                hosts.insert(mac.value, host.clone());
            }
        }
        Self {
            mode: net.mode,
            server_ip,
            subnets,
            hosts,
            unknown: inv.boot.unknown_machines,
            boot,
            default_arch: inv.boot.default_arch,
            http_boot: inv.boot.http_boot,
            ukis: BTreeMap::new(),
        }
    }

    /// The same view with the boot sets' UKIs of `catalog` (see [`uki_sets`]).
    pub fn with_ukis(mut self, inv: &Inventory, catalog: &Catalog) -> Self {
        self.ukis = uki_sets(inv, catalog);
        self
    }

    /// Configuration for a [`LeaseBook`](super::leases::LeaseBook) matching this view, with
    /// default offer hold and quarantine times.
    pub fn lease_book_config(&self) -> LeaseBookConfig {
        LeaseBookConfig {
            reservations: self.hosts.iter().map(|(m, h)| (*m, h.ip)).collect(),
            hostnames: self
                .hosts
                .iter()
                .map(|(m, h)| (*m, h.name.clone()))
                .collect(),
            pools: self.subnets.iter().filter_map(|s| s.pool).collect(),
            offer_hold: DEFAULT_OFFER_HOLD,
            quarantine: DEFAULT_QUARANTINE,
        }
    }

    /// The subnet containing `ip`.
    pub(crate) fn subnet_of(&self, ip: Ipv4Addr) -> Option<&Subnet> {
        self.subnets.iter().find(|s| s.net.contains(&ip))
    }
}
