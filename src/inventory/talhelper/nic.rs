//! One entry of a node's `networkInterfaces`: its MAC, addresses, default route, VIP and MTU.

use std::net::Ipv4Addr;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::read::{self};
use crate::inventory::yaml::{MapReader, Node as Y, Value, index, join};

pub(super) struct Nic {
    pub(super) mac: Option<Spanned<Mac>>,
    pub(super) addresses: Vec<Spanned<Ipv4Net>>,
    pub(super) gateway: Option<Spanned<Ipv4Addr>>,
    pub(super) vip: Option<Spanned<Ipv4Addr>>,
    pub(super) mtu: Option<u32>,
}

pub(super) fn nic(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Nic> {
    let mut r = MapReader::new(n, path, d)?;
    let mut out = Nic {
        mac: None,
        addresses: Vec::new(),
        gateway: None,
        vip: None,
        mtu: None,
    };
    if let Some(sel) = r.get("deviceSelector") {
        out.mac = hardware_addr(sel, path, d);
    }
    if let Some(a) = r.get("addresses") {
        out.addresses = read::list(a, &join(path, "addresses"), d, true, read::ipv4_net);
    }
    if let Some(routes) = r.get("routes") {
        out.gateway = default_route(routes, path, d);
    }
    if let Some(v) = r.get("vip") {
        let vp = join(path, "vip");
        if let Some(mut vr) = MapReader::new(v, &vp, d) {
            out.vip = vr
                .get("ip")
                .and_then(|ip| read::ipv4(ip, &join(&vp, "ip"), d));
            vr.finish(&["ip"], d);
        }
    }
    if let Some(m) = r.get("mtu") {
        out.mtu = read::parsed(m, &join(path, "mtu"), d, "an MTU", "1500", |s| {
            s.parse::<u32>()
        })
        .map(|s| s.value);
    }
    // The NIC name and DHCP switch are superseded by talboot's static boot-NIC config.
    r.get("interface");
    r.get("dhcp");
    ignored_fields(&mut r, n, path, d);
    Some(out)
}

/// `deviceSelector.hardwareAddr`; the other selector fields are named in a warning.
fn hardware_addr(sel: &Y, path: &str, d: &mut Diagnostics) -> Option<Spanned<Mac>> {
    let mut mac = None;
    let sp = join(path, "deviceSelector");
    if let Some(mut s) = MapReader::new(sel, &sp, d) {
        mac = s
            .get("hardwareAddr")
            .and_then(|m| read::mac(m, &join(&sp, "hardwareAddr"), d));
        if let Value::Map(es) = &sel.value {
            for (k, _) in es {
                if k.name != "hardwareAddr" {
                    d.warning(&k.loc, join(&sp, &k.name), format!("deviceSelector field `{}` is ignored; talboot selects NICs by hardwareAddr", k.name), None);
                    s.get(&k.name);
                }
            }
        }
    }
    mac
}

/// The gateway of the NIC's first default route; other routes are named in a warning.
fn default_route(routes: &Y, path: &str, d: &mut Diagnostics) -> Option<Spanned<Ipv4Addr>> {
    let mut gateway = None;
    let Value::Seq(items) = &routes.value else {
        return gateway;
    };
    for (i, route) in items.iter().enumerate() {
        let rp = index(&join(path, "routes"), i);
        let Some(mut rr) = MapReader::new(route, &rp, d) else {
            continue;
        };
        let net = rr.get("network").and_then(|v| v.scalar_text());
        let gw = rr
            .get("gateway")
            .and_then(|v| read::ipv4(v, &join(&rp, "gateway"), d));
        if matches!(net.as_deref(), Some("0.0.0.0/0") | None) {
            gateway = gateway.or(gw);
        } else {
            d.warning(
                &route.loc,
                rp.clone(),
                "only default routes carry over; other routes are ignored",
                Some("add them with a node patch".into()),
            );
        }
        rr.get("metric");
        rr.finish(&["network", "gateway", "metric"], d);
    }
    gateway
}

/// NIC fields talboot has no place for, named in a warning each.
fn ignored_fields(r: &mut MapReader<'_>, n: &Y, path: &str, d: &mut Diagnostics) {
    if let Value::Map(es) = &n.value {
        for (k, _) in es {
            if ![
                "deviceSelector",
                "addresses",
                "routes",
                "vip",
                "mtu",
                "interface",
                "dhcp",
            ]
            .contains(&k.name.as_str())
            {
                d.warning(
                    &k.loc,
                    join(path, &k.name),
                    format!(
                        "talhelper field `{}` is not supported by talboot and is ignored",
                        k.name
                    ),
                    Some("express it as a node patch".into()),
                );
                r.get(&k.name);
            }
        }
    }
}
