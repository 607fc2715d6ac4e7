//! Moves a rack's network onto loopback for the simulation.
//!
//! A simulated machine must own a real address that talboot can see as the source of its
//! HTTP and TFTP requests and that talboot can dial for the Talos API, yet an unprivileged
//! process can only use loopback. Linux routes all of 127.0.0.0/8 to `lo`, so every address
//! inside one of the inventory's subnets keeps its low 16 bits and moves to 127.0.0.0/16:
//! `10.20.0.11` becomes `127.0.0.11`, `10.20.1.41` becomes `127.0.1.41`. The inventory text
//! and its patch files are rewritten with that map, so DHCP leases, machine configs, the
//! cluster endpoint and the VIP all agree, and nothing in talboot proper knows it is being
//! simulated. Addresses outside the served subnets (upstream DNS, NTP) are left alone.

use std::net::Ipv4Addr;
use std::sync::LazyLock;

use ipnet::Ipv4Net;
use regex::Regex;

use crate::inventory::Inventory;

/// Why a rack cannot be moved onto loopback.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RelocateError {
    /// A subnet is larger than the 65 536 addresses 127.0.0.0/16 has room for.
    #[error(
        "subnet {0} is larger than a /16; the loopback simulation keeps the low 16 bits of \
         each address, so simulate a /16 or smaller subnet"
    )]
    TooLarge(Ipv4Net),
    /// Two subnets would land on the same loopback addresses.
    #[error(
        "subnets {0} and {1} would share loopback addresses (only the low 16 bits are kept); \
         give them different third octets to simulate them together"
    )]
    Overlap(Ipv4Net, Ipv4Net),
}

/// The rack-to-loopback address map of one inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocation {
    /// Rack subnet and its loopback image.
    subnets: Vec<(Ipv4Net, Ipv4Net)>,
}

const LOW16: u32 = 0xffff;
const LOOPBACK_BASE: u32 = 0x7f00_0000;

fn image(net: Ipv4Net) -> Ipv4Net {
    let addr = Ipv4Addr::from(LOOPBACK_BASE | (u32::from(net.network()) & LOW16));
    Ipv4Net::new(addr, net.prefix_len()).expect("prefix is unchanged and valid")
}

impl Relocation {
    /// The map for every subnet `inv` serves (the main one and the relayed ones).
    pub(crate) fn for_inventory(inv: &Inventory) -> Result<Self, RelocateError> {
        Self::for_subnets(inv.network.subnets().map(|s| s.value))
    }

    /// The map for these subnets.
    pub(crate) fn for_subnets(
        nets: impl IntoIterator<Item = Ipv4Net>,
    ) -> Result<Self, RelocateError> {
        let mut subnets: Vec<(Ipv4Net, Ipv4Net)> = Vec::new();
        for net in nets {
            if net.prefix_len() < 16 {
                return Err(RelocateError::TooLarge(net));
            }
            let lo = image(net);
            if let Some((other, _)) = subnets
                .iter()
                .find(|(_, l)| l.contains(&lo.network()) || lo.contains(&l.network()))
            {
                return Err(RelocateError::Overlap(*other, net));
            }
            subnets.push((net, lo));
        }
        Ok(Self { subnets })
    }

    /// The loopback image of a rack address, if it is inside a served subnet.
    pub(crate) fn to_loopback(&self, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        self.subnets
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map(|_| Ipv4Addr::from(LOOPBACK_BASE | (u32::from(ip) & LOW16)))
    }

    /// The rack address a loopback address stands for.
    pub(crate) fn to_rack(&self, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        self.subnets
            .iter()
            .find(|(_, lo)| lo.contains(&ip))
            .map(|(net, _)| {
                Ipv4Addr::from((u32::from(net.network()) & !LOW16) | (u32::from(ip) & LOW16))
            })
    }

    /// The loopback subnets, in inventory order.
    pub(crate) fn loopback_subnets(&self) -> impl Iterator<Item = (Ipv4Net, Ipv4Net)> + '_ {
        self.subnets.iter().copied()
    }

    /// `text` with every IPv4 literal inside a served subnet replaced by its loopback
    /// image; a literal followed by `/prefix` (a CIDR) is mapped the same way, the prefix
    /// kept. Anything that only looks like an address (a version `1.2.3.4.5`, a longer
    /// digit run) is left alone.
    pub fn rewrite(&self, text: &str) -> String {
        static IPV4: LazyLock<Regex> = LazyLock::new(|| {
            Regex::new(r"(?:^|[^0-9.])((?:[0-9]{1,3}\.){3}[0-9]{1,3})(?:$|[^0-9.])")
                .expect("valid regex")
        });
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        // Matches consume one delimiter on each side, so adjacent literals separated by a
        // single character need a second pass from the delimiter.
        let mut pos = 0;
        while let Some(c) = IPV4.captures_at(text, pos) {
            let m = c.get(1).expect("group 1 always participates");
            if let Ok(ip) = m.as_str().parse::<Ipv4Addr>()
                && let Some(lo) = self.to_loopback(ip)
            {
                out.push_str(&text[last..m.start()]);
                out.push_str(&lo.to_string());
                last = m.end();
            }
            pos = m.end();
        }
        out.push_str(&text[last..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn rack() -> Relocation {
        Relocation::for_subnets([net("10.20.0.0/24"), net("10.20.1.0/24")]).unwrap()
    }

    #[test]
    fn addresses_keep_their_low_sixteen_bits() {
        let r = rack();
        assert_eq!(
            r.to_loopback("10.20.0.11".parse().unwrap()),
            Some("127.0.0.11".parse().unwrap())
        );
        assert_eq!(
            r.to_loopback("10.20.1.41".parse().unwrap()),
            Some("127.0.1.41".parse().unwrap())
        );
        assert_eq!(r.to_loopback("10.20.2.1".parse().unwrap()), None);
        assert_eq!(r.to_loopback("1.1.1.1".parse().unwrap()), None);
        assert_eq!(
            r.to_rack("127.0.1.41".parse().unwrap()),
            Some("10.20.1.41".parse().unwrap())
        );
        assert_eq!(r.to_rack("127.0.7.1".parse().unwrap()), None);
    }

    #[test]
    fn rewrite_maps_literals_and_cidrs_inside_served_subnets_only() {
        let text = "endpoint: https://10.20.0.10:6443\nsubnet: 10.20.1.0/24\n\
                    dns: [10.20.0.1, 1.1.1.1]\nversion: 10.20.0.11.5\nimage: v1.10.20.0\n\
                    pair: 10.20.0.5,10.20.0.6\nfirst: 10.20.0.7";
        let out = rack().rewrite(text);
        assert_eq!(
            out,
            "endpoint: https://127.0.0.10:6443\nsubnet: 127.0.1.0/24\n\
             dns: [127.0.0.1, 1.1.1.1]\nversion: 10.20.0.11.5\nimage: v1.10.20.0\n\
             pair: 127.0.0.5,127.0.0.6\nfirst: 127.0.0.7"
        );
    }

    #[test]
    fn oversized_and_colliding_subnets_are_refused() {
        assert_eq!(
            Relocation::for_subnets([net("10.0.0.0/8")]),
            Err(RelocateError::TooLarge(net("10.0.0.0/8")))
        );
        assert_eq!(
            Relocation::for_subnets([net("10.20.0.0/24"), net("10.30.0.0/24")]),
            Err(RelocateError::Overlap(
                net("10.20.0.0/24"),
                net("10.30.0.0/24")
            ))
        );
        assert!(Relocation::for_subnets([net("192.168.0.0/16")]).is_ok());
    }
}
