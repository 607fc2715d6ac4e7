//! Cross-field rules over a decoded inventory: role resolution (`extends` chains), uniqueness
//! of MACs, hostnames and addresses, address plans (subnets, pools, gateways, VIP, endpoint),
//! and control-plane counts.
//!
//! Each rule reports at the location of the offending value and, for duplicates, names where
//! the first occurrence is.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use super::diag::{Diagnostics, Loc, did_you_mean};
use super::model::*;
use super::parts::Parts;

mod contract;
mod roles;

use contract::contract_rules;

pub(crate) use roles::resolve_roles;

fn unknown_role(d: &mut Diagnostics, loc: &Loc, path: &str, name: &str, known: &[&str]) {
    let hint = match did_you_mean(name, known) {
        Some(s) => format!("did you mean `{s}`? defined roles: {}", known.join(", ")),
        None => format!(
            "defined roles: {}; define it under `roles:`",
            known.join(", ")
        ),
    };
    d.error_hint(loc, path, format!("unknown role `{name}`"), hint);
}

/// Run every cross-field rule.
pub fn check(parts: &Parts, roles: &BTreeMap<String, ResolvedRole>, d: &mut Diagnostics) {
    let nodes = &parts.nodes;
    let role_names: Vec<&str> = roles.keys().map(String::as_str).collect();
    let defined: Vec<&str> = parts
        .roles
        .iter()
        .map(|r| r.name.as_str())
        .chain(MachineType::WORDS.iter().copied())
        .collect();

    // Roles referenced by nodes (also those that could not be read completely).
    for (path, role) in &parts.role_refs {
        if !roles.contains_key(role.as_str()) && !defined.contains(&role.as_str()) {
            unknown_role(d, &role.loc, path, role.as_str(), &role_names);
        }
    }
    let all_nodes_read = parts.nodes_written == nodes.len();

    let delivery = parts.boot.as_ref().map_or(Delivery::Push, |b| b.delivery);
    for (i, n) in nodes.iter().enumerate() {
        secure_boot_rules(i, n, delivery, d);
        if let Some(role) = roles.get(n.role.as_str())
            && role.machine_type == MachineType::Worker
        {
            restricted_labels(i, n, role, d);
        }
    }

    unique_names(nodes, d);
    unique_macs(nodes, d);
    unique_addresses(nodes, parts.cluster.as_ref(), d);

    if let Some(net) = &parts.network {
        network_rules(net, parts, d);
        for (i, n) in nodes.iter().enumerate() {
            node_address_rules(i, n, net, d);
        }
    }

    let cps: Vec<(usize, &Node)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            roles
                .get(n.role.as_str())
                .is_some_and(|r| r.machine_type == MachineType::ControlPlane)
        })
        .collect();
    let nodes_loc = parts
        .nodes_loc
        .clone()
        .unwrap_or_else(|| Loc::file_only(std::path::Path::new("")));
    let all_roles_known = nodes.iter().all(|n| roles.contains_key(n.role.as_str()));
    if !(all_nodes_read && all_roles_known) {
        // Counting control planes over a partial list would only add misleading messages.
    } else if cps.is_empty() && parts.nodes_loc.is_some() {
        d.error_hint(
            &nodes_loc,
            "nodes",
            "no control-plane node: a cluster needs at least one",
            "give one or three nodes a role whose type is controlplane",
        );
    } else if !cps.is_empty() && cps.len().is_multiple_of(2) {
        d.warning(
            &nodes_loc,
            "nodes",
            format!(
                "{} control-plane nodes: an even number adds no etcd fault tolerance over {}",
                cps.len(),
                cps.len() - 1
            ),
            Some("run an odd number of control planes (1, 3 or 5)".into()),
        );
    }

    if let Some(cluster) = &parts.cluster {
        cluster_rules(cluster, parts.network.as_ref(), &cps, d);
        contract_rules(cluster, parts, d);
    }
}

/// `secureBoot: true` combinations that cannot boot: the signed UKI's command line is sealed,
/// so there is no `talos.config=` for pull delivery; and legacy BIOS has no Secure Boot.
fn secure_boot_rules(i: usize, n: &Node, delivery: Delivery, d: &mut Diagnostics) {
    let Some(sb) = n.secure_boot.as_ref().filter(|s| s.value) else {
        return;
    };
    let name = n.name.as_str();
    if delivery == Delivery::Pull {
        d.error_hint(
            &sb.loc,
            format!("nodes[{i}].secureBoot"),
            format!(
                "{name} boots with Secure Boot but boot.delivery is pull: the signed UKI's \
                 kernel command line is sealed, so it can carry no talos.config= URL"
            ),
            "set `boot.delivery: push` (talboot applies the config over the maintenance API), \
             or `secureBoot: false` on this node",
        );
    }
    if n.firmware == Some(Firmware::Bios) {
        d.error_hint(
            &sb.loc,
            format!("nodes[{i}].secureBoot"),
            format!(
                "{name} boots with Secure Boot but its firmware is `bios`: legacy BIOS has no \
                 Secure Boot"
            ),
            format!(
                "set `firmware: uefi` (or `http`) on nodes[{i}] and UEFI mode in its setup, or \
                 `secureBoot: false`"
            ),
        );
    }
}

fn unique_names(nodes: &[Node], d: &mut Diagnostics) {
    let mut seen: HashMap<&str, (usize, &Loc)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if let Some((j, first)) = seen.get(n.name.as_str()) {
            d.error_hint(
                &n.name.loc,
                format!("nodes[{i}].name"),
                format!(
                    "duplicate hostname `{}` (also nodes[{j}] at {first})",
                    n.name.as_str()
                ),
                "every node needs its own hostname",
            );
        } else {
            seen.insert(n.name.as_str(), (i, &n.name.loc));
        }
    }
}

fn unique_macs(nodes: &[Node], d: &mut Diagnostics) {
    let mut seen: HashMap<Mac, (String, &Loc)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let boot = n
            .macs
            .iter()
            .enumerate()
            .map(|(k, m)| (m, format!("nodes[{i}].macs[{k}]")));
        let extra = n
            .interfaces
            .iter()
            .enumerate()
            .map(|(k, x)| (&x.mac, format!("nodes[{i}].interfaces[{k}].mac")));
        for (m, path) in boot.chain(extra) {
            if let Some((first_path, first)) = seen.get(&m.value) {
                d.error_hint(
                    &m.loc,
                    path,
                    format!("duplicate MAC {} (also {first_path} at {first})", m.value),
                    "a hardware address identifies one NIC of one node; check for a copy-paste",
                );
            } else {
                seen.insert(m.value, (path, &m.loc));
            }
        }
    }
}

fn unique_addresses(nodes: &[Node], cluster: Option<&Cluster>, d: &mut Diagnostics) {
    let mut seen: HashMap<Ipv4Addr, (String, &Loc)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let main = std::iter::once((&n.address, format!("nodes[{i}].address")));
        let extra = n.interfaces.iter().enumerate().flat_map(|(k, x)| {
            x.addresses
                .iter()
                .enumerate()
                .map(move |(a, addr)| (addr, format!("nodes[{i}].interfaces[{k}].addresses[{a}]")))
        });
        for (addr, path) in main.chain(extra) {
            let ip = addr.value.addr();
            if let Some((first_path, first)) = seen.get(&ip) {
                d.error_hint(
                    &addr.loc,
                    path,
                    format!("duplicate address {ip} (also {first_path} at {first})"),
                    "every node needs its own address",
                );
            } else {
                seen.insert(ip, (path, &addr.loc));
            }
        }
    }
    if let Some(vip) = cluster.and_then(|c| c.vip.as_ref())
        && let Some((path, at)) = seen.get(&vip.value)
    {
        d.error_hint(
            &vip.loc,
            "cluster.vip",
            format!("VIP {} is also the address of {path} (at {at})", vip.value),
            "the VIP must be a free address that floats between control planes",
        );
    }
}

fn subnet_list(net: &Network) -> String {
    net.subnets()
        .map(|s| s.value.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn network_rules(net: &Network, parts: &Parts, d: &mut Diagnostics) {
    let subnet = net.subnet.value;
    if let Some(gw) = &net.gateway
        && !subnet.contains(&gw.value)
    {
        d.error_hint(
            &gw.loc,
            "network.gateway",
            format!("gateway {} is outside the subnet {subnet}", gw.value),
            format!("use an address in {subnet}"),
        );
    }
    pool_rules(
        net.pool.as_ref(),
        subnet,
        "network.pool",
        net.gateway.as_ref(),
        d,
    );
    if let Some(pool) = &net.pool
        && net.mode == NetworkMode::Proxy
    {
        d.warning(
            &pool.loc,
            "network.pool",
            "a pool is ignored in proxy mode: the site's DHCP server hands out addresses",
            Some("remove `pool`, or set `mode: authoritative`".into()),
        );
    }
    if net.mode == NetworkMode::Authoritative
        && net.pool.is_none()
        && parts
            .boot
            .as_ref()
            .is_some_and(|b| b.unknown_machines == UnknownPolicy::Discover)
    {
        d.error_hint(
            &net.subnet.loc,
            "network.pool",
            "boot.unknownMachines is `discover` but there is no dynamic pool to give unknown machines an address",
            "add `pool: {start: ..., end: ...}` to network, or set unknownMachines: ignore",
        );
    }
    if let Some(adv) = &net.advertise
        && !net.subnets().any(|s| s.value.contains(&adv.value))
    {
        d.warning(
            &adv.loc,
            "network.advertise",
            format!("advertised address {} is not in any served subnet ({})", adv.value, subnet_list(net)),
            Some("clients must reach talboot at this address; usually it is talboot's own address on the provisioning subnet".into()),
        );
    }
    relay_rules(net, d);
}

/// Each relayed subnet: distinct from every other served subnet, with its gateway and pool
/// inside it.
fn relay_rules(net: &Network, d: &mut Diagnostics) {
    for (i, relay) in net.relays.iter().enumerate() {
        let path = format!("network.relays[{i}]");
        let rs = relay.subnet.value;
        for (j, other) in net.subnets().enumerate() {
            if j != i + 1
                && (other.value.contains(&rs.network()) || rs.contains(&other.value.network()))
            {
                d.error_hint(
                    &relay.subnet.loc,
                    format!("{path}.subnet"),
                    format!("relayed subnet {rs} overlaps {}", other.value),
                    "each served subnet must be distinct, since giaddr selects exactly one",
                );
                break;
            }
        }
        if let Some(gw) = &relay.gateway
            && !rs.contains(&gw.value)
        {
            d.error_hint(
                &gw.loc,
                format!("{path}.gateway"),
                format!("gateway {} is outside the relayed subnet {rs}", gw.value),
                format!("use an address in {rs}"),
            );
        }
        pool_rules(
            relay.pool.as_ref(),
            rs,
            &format!("{path}.pool"),
            relay.gateway.as_ref(),
            d,
        );
    }
}

fn pool_rules(
    pool: Option<&Spanned<Pool>>,
    subnet: Ipv4Net,
    path: &str,
    gateway: Option<&Spanned<Ipv4Addr>>,
    d: &mut Diagnostics,
) {
    let Some(pool) = pool else { return };
    let p = pool.value;
    if !subnet.contains(&p.start) || !subnet.contains(&p.end) {
        d.error_hint(
            &pool.loc,
            path,
            format!("pool {p} is not inside the subnet {subnet}"),
            format!(
                "choose a range between {} and {}",
                first_host(subnet),
                last_host(subnet)
            ),
        );
        return;
    }
    if p.contains(subnet.network()) || p.contains(subnet.broadcast()) {
        d.error_hint(
            &pool.loc,
            path,
            format!("pool {p} includes the network or broadcast address of {subnet}"),
            format!(
                "choose a range between {} and {}",
                first_host(subnet),
                last_host(subnet)
            ),
        );
    }
    if let Some(gw) = gateway
        && p.contains(gw.value)
    {
        d.error_hint(
            &pool.loc,
            path,
            format!("pool {p} contains the gateway {}", gw.value),
            "exclude the gateway from the dynamic range",
        );
    }
}

fn first_host(net: Ipv4Net) -> Ipv4Addr {
    net.hosts().next().unwrap_or(net.network())
}

fn last_host(net: Ipv4Net) -> Ipv4Addr {
    net.hosts().last().unwrap_or(net.broadcast())
}

fn node_address_rules(i: usize, n: &Node, net: &Network, d: &mut Diagnostics) {
    let ip = n.address.value.addr();
    let containing = net.subnets().find(|s| s.value.contains(&ip));
    let Some(subnet) = containing else {
        d.error_hint(
            &n.address.loc,
            format!("nodes[{i}].address"),
            if net.relays.is_empty() {
                format!("address {ip} is outside the subnet {}", net.subnet.value)
            } else {
                format!(
                    "address {ip} is outside every served subnet ({})",
                    subnet_list(net)
                )
            },
            "use an address in the provisioning subnet, or add its subnet under network.relays",
        );
        return;
    };
    let subnet = subnet.value;
    if ip == subnet.network() || ip == subnet.broadcast() {
        d.error_hint(
            &n.address.loc,
            format!("nodes[{i}].address"),
            format!("address {ip} is the network or broadcast address of {subnet}"),
            format!(
                "use a host address between {} and {}",
                first_host(subnet),
                last_host(subnet)
            ),
        );
    }
    if n.address.value.prefix_len() != subnet.prefix_len() {
        d.warning(
            &n.address.loc,
            format!("nodes[{i}].address"),
            format!(
                "prefix /{} differs from the subnet's /{}",
                n.address.value.prefix_len(),
                subnet.prefix_len()
            ),
            Some(format!("write {ip}/{}", subnet.prefix_len())),
        );
    }
    node_pool_rules(i, n, net, d);
    node_gateway_rules(i, n, subnet, net, d);
}

/// Under an authoritative server, a node's reserved address must lie outside every dynamic
/// pool.
fn node_pool_rules(i: usize, n: &Node, net: &Network, d: &mut Diagnostics) {
    let ip = n.address.value.addr();
    let pools = std::iter::once(net.pool.as_ref())
        .chain(net.relays.iter().map(|r| r.pool.as_ref()))
        .flatten();
    for pool in pools {
        if pool.value.contains(ip) && net.mode == NetworkMode::Authoritative {
            d.error_hint(
                &n.address.loc,
                format!("nodes[{i}].address"),
                format!("address {ip} is inside the dynamic pool {} (at {})", pool.value, pool.loc),
                "reserved addresses must be outside the pool, or an unknown machine could get it first",
            );
        }
    }
}

/// The node's own gateway lies in its subnet, and no gateway (its own, else its subnet's) is
/// the node's address.
fn node_gateway_rules(i: usize, n: &Node, subnet: Ipv4Net, net: &Network, d: &mut Diagnostics) {
    let ip = n.address.value.addr();
    let gw = n.gateway.as_ref().or(if subnet == net.subnet.value {
        net.gateway.as_ref()
    } else {
        net.relays
            .iter()
            .find(|r| r.subnet.value == subnet)
            .and_then(|r| r.gateway.as_ref())
    });
    if let Some(g) = n.gateway.as_ref()
        && !subnet.contains(&g.value)
    {
        d.error_hint(
            &g.loc,
            format!("nodes[{i}].gateway"),
            format!("gateway {} is outside the node's subnet {subnet}", g.value),
            format!("use an address in {subnet}"),
        );
    }
    if let Some(g) = gw
        && g.value == ip
    {
        d.error(
            &n.address.loc,
            format!("nodes[{i}].address"),
            format!("address {ip} is the gateway's address"),
        );
    }
}

fn cluster_rules(
    cluster: &Cluster,
    net: Option<&Network>,
    cps: &[(usize, &Node)],
    d: &mut Diagnostics,
) {
    if let (Some(vip), Some(net)) = (&cluster.vip, net) {
        if !net.subnet.value.contains(&vip.value) {
            d.error_hint(
                &vip.loc,
                "cluster.vip",
                format!(
                    "VIP {} is not in the subnet {}",
                    vip.value, net.subnet.value
                ),
                "a layer-2 VIP must be on the control planes' own subnet",
            );
        } else if net
            .pool
            .as_ref()
            .is_some_and(|p| p.value.contains(vip.value))
        {
            d.error_hint(
                &vip.loc,
                "cluster.vip",
                format!("VIP {} is inside the dynamic pool", vip.value),
                "choose an address outside network.pool",
            );
        }
    }
    if let EndpointHost::Ip(host) = cluster.endpoint.host {
        let is_vip = cluster.vip.as_ref().is_some_and(|v| v.value == host);
        let is_cp = cps.iter().any(|(_, n)| n.address.value.addr() == host);
        if !is_vip && !is_cp && !cps.is_empty() {
            let cp_addrs: Vec<String> = cps
                .iter()
                .map(|(_, n)| n.address.value.addr().to_string())
                .collect();
            let hint = match &cluster.vip {
                Some(v) => format!(
                    "use the VIP ({}) or a control-plane address ({})",
                    v.value,
                    cp_addrs.join(", ")
                ),
                None => format!(
                    "use a control-plane address ({}) or set cluster.vip",
                    cp_addrs.join(", ")
                ),
            };
            d.error_hint(
                &cluster.endpoint.loc,
                "cluster.endpoint",
                format!("endpoint host {host} is neither the VIP nor a control-plane address"),
                hint,
            );
        }
    }
}

/// Kubernetes' NodeRestriction admission lets a kubelet set labels under `kubernetes.io` and
/// `k8s.io` only for a few well-known keys, and Talos applies worker labels with the kubelet's
/// credentials: anything else is refused at run time, so it is refused here first.
fn restricted_labels(i: usize, n: &Node, role: &ResolvedRole, d: &mut Diagnostics) {
    const ALLOWED_PREFIXES: &[&str] = &["kubelet.kubernetes.io/", "node.kubernetes.io/"];
    const ALLOWED_KEYS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let keys = role.labels.keys().chain(n.labels.keys());
    for key in keys {
        let Some((prefix, _)) = key.rsplit_once('/') else {
            continue;
        };
        let reserved = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|r| prefix == *r || prefix.ends_with(&format!(".{r}")));
        let allowed = ALLOWED_KEYS.contains(&key.as_str())
            || ALLOWED_PREFIXES.iter().any(|p| key.starts_with(p));
        if reserved && !allowed {
            d.error_hint(
                &n.role.loc,
                format!("nodes[{i}].labels"),
                format!(
                    "label `{key}` on worker `{}` would be refused by Kubernetes' NodeRestriction admission",
                    n.name.as_str()
                ),
                "use a label outside kubernetes.io/k8s.io (e.g. talboot.dev/role: storage), or node.kubernetes.io/...",
            );
        }
    }
}
