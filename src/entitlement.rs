//! Who may receive a node's machine config: the one rule both delivery paths use.
//!
//! A machine config carries the cluster's CA keys. It goes only to the address that talboot's
//! own DHCP exchange bound to one of the node's MACs:
//! - **authoritative** mode: the node's current lease, `bound` and not expired;
//! - **proxy** mode: the site's DHCP server hands out addresses, so talboot has no lease; the
//!   binding is the client address seen in the PXE exchange talboot answered (the ProxyDHCP
//!   request that carries `ciaddr`, recorded by the DHCP server with
//!   [`record_proxy_binding`]).
//!
//! Nothing else counts: not the address a script was last requested from, not an inventory
//! address, not an HTTP header. The HTTP pull path ([`crate::http`]: script, token, config) and
//! the push provisioner ([`crate::provision`]: ApplyConfiguration) both call [`bound_address`]
//! and [`judge`]; a request from any other address is refused and recorded as an
//! [`EventKind::EntitlementRefused`](crate::events::EventKind::EntitlementRefused) event on the
//! node's timeline, naming the requester, never a token.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::inventory::{Mac, NetworkMode};
use crate::store::{Lease, LeaseState, MetaWriter, Store, StoreError};

/// How a binding was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A DHCP lease talboot handed out (authoritative mode).
    Lease,
    /// The client address of a ProxyDHCP exchange talboot answered (proxy mode).
    Proxy,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Self::Lease => "DHCP lease",
            Self::Proxy => "ProxyDHCP binding",
        }
    }
}

/// The address a node's config may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The MAC the binding belongs to.
    pub mac: Mac,
    /// The address.
    pub ip: Ipv4Addr,
    /// Where talboot learnt it.
    pub source: Source,
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} of {})", self.ip, self.source.label(), self.mac)
    }
}

/// A persisted ProxyDHCP binding: MAC to the client address seen in the exchange. Replaced by
/// the MAC's next exchange; it has no expiry of its own because the site's DHCP server, not
/// talboot, decides how long the address lasts, and a node installed from it still needs to be
/// found for its secured API calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyBinding {
    /// The client's MAC (chaddr).
    pub mac: Mac,
    /// The client's address (ciaddr of its ProxyDHCP request).
    pub ip: Ipv4Addr,
    /// When it was seen, seconds since the epoch.
    pub(crate) seen_at_unix: u64,
}

fn proxy_key(mac: Mac) -> String {
    format!("proxy-binding/{mac}")
}

/// Persist the ProxyDHCP binding of `mac` to `ip` (the DHCP server's proxy path calls this
/// before its reply leaves, so the script request that follows finds it); returns what was
/// stored, for the read view.
pub fn record_proxy_binding(
    store: &MetaWriter,
    mac: Mac,
    ip: Ipv4Addr,
    now_unix: u64,
) -> Result<ProxyBinding, StoreError> {
    let rec = ProxyBinding {
        mac,
        ip,
        seen_at_unix: now_unix,
    };
    let json = serde_json::to_vec(&rec).map_err(|source| StoreError::Encode {
        what: format!("ProxyDHCP binding of {mac}"),
        source,
    })?;
    store.put_meta(&proxy_key(mac), &json)?;
    Ok(rec)
}

/// The persisted ProxyDHCP binding of `mac`.
pub fn proxy_binding(store: &dyn Store, mac: Mac) -> Result<Option<ProxyBinding>, StoreError> {
    Ok(store
        .get_meta(&proxy_key(mac))?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// The client address a ProxyDHCP request carries, if it has one worth binding: its `ciaddr`,
/// else (not relayed) the source address of the datagram. A request from `0.0.0.0` with no
/// `ciaddr` (the broadcast DISCOVER before the client has an address) binds nothing.
pub(crate) fn proxy_client_address(
    ciaddr: Ipv4Addr,
    giaddr: Ipv4Addr,
    source: Ipv4Addr,
) -> Option<Ipv4Addr> {
    let usable = |ip: Ipv4Addr| !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast());
    if usable(ciaddr) {
        return Some(ciaddr);
    }
    (giaddr.is_unspecified() && usable(source)).then_some(source)
}

/// Pure: the binding among `leases` (authoritative) or `proxies` (proxy) of a node, in the
/// order of the node's MACs. Only a `bound`, unexpired lease counts: an offer is not a binding.
pub(crate) fn choose(
    mode: NetworkMode,
    leases: &[Lease],
    proxies: &[ProxyBinding],
    now_unix: u64,
) -> Option<Bound> {
    match mode {
        NetworkMode::Authoritative => leases
            .iter()
            .find(|l| l.state == LeaseState::Bound && l.expires_at_unix > now_unix)
            .map(|l| Bound {
                mac: l.mac,
                ip: l.ip,
                source: Source::Lease,
            }),
        NetworkMode::Proxy => proxies.iter().next().map(|p| Bound {
            mac: p.mac,
            ip: p.ip,
            source: Source::Proxy,
        }),
    }
}

/// The address a node with `macs` may receive its config at, read from the store.
pub(crate) fn bound_address(
    store: &dyn Store,
    mode: NetworkMode,
    macs: &[Mac],
    now_unix: u64,
) -> Result<Option<Bound>, StoreError> {
    match mode {
        NetworkMode::Authoritative => {
            let mut leases = Vec::new();
            for &mac in macs {
                if let Some(l) = store.lease(mac)? {
                    leases.push(l);
                }
            }
            Ok(choose(mode, &leases, &[], now_unix))
        }
        NetworkMode::Proxy => {
            let mut proxies = Vec::new();
            for &mac in macs {
                if let Some(p) = proxy_binding(store, mac)? {
                    proxies.push(p);
                }
            }
            // The most recent exchange wins when the node booted from more than one NIC.
            proxies.sort_by_key(|p| std::cmp::Reverse(p.seen_at_unix));
            Ok(choose(mode, &[], &proxies, now_unix))
        }
    }
}

/// Why a requester is not entitled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// talboot's DHCP has bound no address to the node.
    #[error("talboot's DHCP has bound no address to this node")]
    NoBinding,
    /// The request came from another address than the binding.
    #[error("the node is bound to {bound}")]
    WrongAddress {
        /// The binding.
        bound: Bound,
    },
    /// The request came over IPv6 (talboot binds IPv4 addresses only).
    #[error("the request did not come over IPv4")]
    NotIpv4,
}

/// Pure: may `requester` receive the node's script, token or config, given its binding?
pub(crate) fn judge(bound: Option<Bound>, requester: Option<Ipv4Addr>) -> Result<Bound, Refusal> {
    let bound = bound.ok_or(Refusal::NoBinding)?;
    let requester = requester.ok_or(Refusal::NotIpv4)?;
    if requester != bound.ip {
        return Err(Refusal::WrongAddress { bound });
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> Mac {
        Mac([0xbc, 0x24, 0x11, 0, 0, n])
    }

    fn lease(n: u8, state: LeaseState, expires: u64) -> Lease {
        Lease {
            mac: mac(n),
            ip: Ipv4Addr::new(10, 0, 0, n),
            hostname: None,
            state,
            expires_at_unix: expires,
            updated_at_unix: 0,
        }
    }

    #[test]
    fn only_a_bound_unexpired_lease_binds_in_authoritative_mode() {
        let auth = NetworkMode::Authoritative;
        assert_eq!(choose(auth, &[], &[], 100), None);
        for bad in [
            lease(1, LeaseState::Offered, 200),
            lease(1, LeaseState::Released, 200),
            lease(1, LeaseState::Declined, 200),
            lease(1, LeaseState::Bound, 100),
        ] {
            assert_eq!(
                choose(auth, std::slice::from_ref(&bad), &[], 100),
                None,
                "{bad:?}"
            );
        }
        let got = choose(auth, &[lease(2, LeaseState::Bound, 200)], &[], 100).unwrap();
        assert_eq!(
            (got.ip, got.source),
            (Ipv4Addr::new(10, 0, 0, 2), Source::Lease)
        );
        // A proxy binding means nothing in authoritative mode, and a lease nothing in proxy.
        let p = ProxyBinding {
            mac: mac(3),
            ip: Ipv4Addr::new(10, 0, 0, 3),
            seen_at_unix: 1,
        };
        assert_eq!(choose(auth, &[], std::slice::from_ref(&p), 100), None);
        assert_eq!(
            choose(
                NetworkMode::Proxy,
                &[lease(2, LeaseState::Bound, 200)],
                &[],
                100
            ),
            None
        );
        assert_eq!(
            choose(NetworkMode::Proxy, &[], &[p], 100).map(|b| b.source),
            Some(Source::Proxy)
        );
    }

    #[test]
    fn judge_refuses_every_requester_but_the_binding() {
        let b = Bound {
            mac: mac(1),
            ip: Ipv4Addr::new(10, 0, 0, 1),
            source: Source::Lease,
        };
        assert_eq!(judge(Some(b), Some(b.ip)), Ok(b));
        assert_eq!(
            judge(Some(b), Some(Ipv4Addr::new(10, 0, 0, 9))),
            Err(Refusal::WrongAddress { bound: b })
        );
        assert_eq!(
            judge(None, Some(Ipv4Addr::new(10, 0, 0, 1))),
            Err(Refusal::NoBinding)
        );
        assert_eq!(judge(Some(b), None), Err(Refusal::NotIpv4));
    }

    #[test]
    fn proxy_client_address_is_ciaddr_or_an_unrelayed_source() {
        let z = Ipv4Addr::UNSPECIFIED;
        let a = Ipv4Addr::new(10, 0, 0, 5);
        let relay = Ipv4Addr::new(10, 9, 0, 1);
        assert_eq!(proxy_client_address(a, z, z), Some(a));
        assert_eq!(proxy_client_address(z, z, a), Some(a));
        assert_eq!(proxy_client_address(z, relay, relay), None);
        assert_eq!(proxy_client_address(z, z, z), None);
        assert_eq!(proxy_client_address(z, z, Ipv4Addr::BROADCAST), None);
    }

    #[test]
    fn proxy_bindings_persist_and_the_newest_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (store, w) = crate::store::open(dir.path()).unwrap().split();
        let proxy = NetworkMode::Proxy;
        assert_eq!(bound_address(&store, proxy, &[mac(1)], 0).unwrap(), None);
        record_proxy_binding(&w.meta, mac(1), Ipv4Addr::new(10, 0, 0, 1), 10).unwrap();
        record_proxy_binding(&w.meta, mac(2), Ipv4Addr::new(10, 0, 0, 2), 20).unwrap();
        let got = bound_address(&store, proxy, &[mac(1), mac(2)], 30)
            .unwrap()
            .unwrap();
        assert_eq!(got.ip, Ipv4Addr::new(10, 0, 0, 2));
        record_proxy_binding(&w.meta, mac(1), Ipv4Addr::new(10, 0, 0, 7), 40).unwrap();
        let got = bound_address(&store, proxy, &[mac(1), mac(2)], 50)
            .unwrap()
            .unwrap();
        assert_eq!(got.ip, Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(
            bound_address(&store, NetworkMode::Authoritative, &[mac(1)], 50).unwrap(),
            None
        );
    }
}
