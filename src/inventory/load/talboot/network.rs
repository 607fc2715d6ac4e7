//! The `network` section of `talboot.yaml`: the provisioning network, its pool and relays.

use std::net::Ipv4Addr;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::parts::DEFAULT_LEASE;
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y};

const NETWORK: &[&str] = &[
    "interfaces",
    "mode",
    "subnet",
    "gateway",
    "dns",
    "ntp",
    "domain",
    "pool",
    "leaseTime",
    "advertise",
    "relays",
];

pub(super) fn network(node: &Y, d: &mut Diagnostics) -> Option<Network> {
    let mut r = MapReader::new(node, "network", d)?;
    let p = |k: &str| format!("network.{k}");
    let loc = r.loc().clone();
    let interfaces = match r.get("interfaces") {
        Some(n) => read::list(n, &p("interfaces"), d, true, interface_name),
        None => {
            missing(d, &loc, "network", "interfaces", "e.g. interfaces: [eth0]");
            Vec::new()
        }
    };
    let mode = match r.get("mode") {
        Some(n) => read::word(n, &p("mode"), d, NetworkMode::WORDS, NetworkMode::parse),
        None => Some(NetworkMode::Authoritative),
    };
    let subnet = match r.get("subnet") {
        Some(n) => read::ipv4_subnet(n, &p("subnet"), d),
        None => {
            missing(d, &loc, "network", "subnet", "e.g. subnet: 10.0.40.0/24");
            None
        }
    };
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &p("gateway"), d));
    let dns = r
        .get("dns")
        .map(|n| {
            read::list(n, &p("dns"), d, true, |n, p, d| {
                read::ipv4(n, p, d).map(|s| s.value)
            })
        })
        .unwrap_or_default();
    let ntp = r
        .get("ntp")
        .map(|n| read::list(n, &p("ntp"), d, true, ntp_server))
        .unwrap_or_default();
    let domain = r.get("domain").and_then(|n| {
        read::parsed(n, &p("domain"), d, "a DNS domain", "lab.example.com", |s| {
            if is_dns_name(s) {
                Ok(s.to_string())
            } else {
                Err("not a DNS name")
            }
        })
        .map(|s| s.value)
    });
    let pool = r.get("pool").and_then(|n| pool(n, &p("pool"), d));
    let lease_time = match r.get("leaseTime") {
        Some(n) => read::duration(n, &p("leaseTime"), d),
        None => Some(DEFAULT_LEASE),
    };
    let advertise = r
        .get("advertise")
        .and_then(|n| read::ipv4(n, &p("advertise"), d));
    let relays = r
        .get("relays")
        .map(|n| read::list(n, &p("relays"), d, false, relay))
        .unwrap_or_default();
    r.finish(NETWORK, d);
    Some(Network {
        interfaces,
        mode: mode?,
        subnet: subnet?,
        gateway,
        dns,
        ntp,
        domain,
        pool,
        lease_time: lease_time?,
        advertise,
        relays,
    })
}

/// One entry of `network.interfaces`: a Linux interface name.
fn interface_name(n: &Y, p: &str, d: &mut Diagnostics) -> Option<String> {
    read::parsed(n, p, d, "an interface name", "eth0", |s| {
        if !s.is_empty() && s.len() <= 15 && !s.contains(['/', ' ', '\t']) && s != "." && s != ".."
        {
            Ok(s.to_string())
        } else {
            Err("Linux interface names are 1-15 characters without '/' or spaces")
        }
    })
    .map(|s| s.value)
}

/// One entry of `network.ntp`: an IPv4 address or a DNS name.
fn ntp_server(n: &Y, p: &str, d: &mut Diagnostics) -> Option<String> {
    read::parsed(
        n,
        p,
        d,
        "an NTP server address or name",
        "pool.ntp.org",
        |s| {
            if s.parse::<Ipv4Addr>().is_ok() || is_dns_name(s) {
                Ok(s.to_string())
            } else {
                Err("neither an IPv4 address nor a DNS name")
            }
        },
    )
    .map(|s| s.value)
}

fn pool(node: &Y, path: &str, d: &mut Diagnostics) -> Option<Spanned<Pool>> {
    let mut r = MapReader::new(node, path, d)?;
    let start = match r.get("start") {
        Some(n) => read::ipv4(n, &format!("{path}.start"), d),
        None => {
            missing(d, r.loc(), path, "start", "e.g. start: 10.0.40.200");
            None
        }
    };
    let end = match r.get("end") {
        Some(n) => read::ipv4(n, &format!("{path}.end"), d),
        None => {
            missing(d, r.loc(), path, "end", "e.g. end: 10.0.40.250");
            None
        }
    };
    r.finish(&["start", "end"], d);
    let (start, end) = (start?, end?);
    if start.value > end.value {
        d.error_hint(
            &node.loc,
            path,
            format!("pool start {} is after its end {}", start.value, end.value),
            "swap start and end",
        );
        return None;
    }
    Some(Spanned::new(
        Pool {
            start: start.value,
            end: end.value,
        },
        node.loc.clone(),
    ))
}

fn relay(node: &Y, path: &str, d: &mut Diagnostics) -> Option<RelaySubnet> {
    let mut r = MapReader::new(node, path, d)?;
    let subnet = match r.get("subnet") {
        Some(n) => read::ipv4_subnet(n, &format!("{path}.subnet"), d),
        None => {
            missing(d, r.loc(), path, "subnet", "e.g. subnet: 10.0.50.0/24");
            None
        }
    };
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &format!("{path}.gateway"), d));
    let pool = r
        .get("pool")
        .and_then(|n| pool(n, &format!("{path}.pool"), d));
    let dns = r
        .get("dns")
        .map(|n| {
            read::list(n, &format!("{path}.dns"), d, true, |n, p, d| {
                read::ipv4(n, p, d).map(|s| s.value)
            })
        })
        .unwrap_or_default();
    r.finish(&["subnet", "gateway", "pool", "dns"], d);
    Some(RelaySubnet {
        subnet: subnet?,
        gateway,
        pool,
        dns,
    })
}
