//! The inventory as the DHCP decision sees it: subnets with their options, known machines by
//! MAC, the unknown-machine policy and where boot files live.
//!
//! Built once per inventory load (`DecideCtx::from_inventory`) and shared read-only by every
//! socket task; the mutable half of DHCP state is the [`LeaseBook`](super::leases::LeaseBook).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::inventory::{Arch, Firmware, Inventory, Ipv4Net, Mac, NetworkMode, Pool, UnknownPolicy};

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
        }
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
