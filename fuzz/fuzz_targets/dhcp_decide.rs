//! DHCP decode + decide: arbitrary bytes through the whole pure DHCP chain (checked parse,
//! flood limiter, classification, decision, reply encoding) against a fixed inventory view.
//! It must never panic, every reply must be at least 300 bytes with its magic cookie, and the
//! lease book must stay consistent.
//!
//! The first input byte picks the mode (authoritative/proxy) and port (67/4011); the rest is
//! the datagram, handled twice so the second pass sees the lease state the first one left.

#![no_main]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant, SystemTime};

use libfuzzer_sys::fuzz_target;
use talboot::dhcp::{
    BootTargets, DecideCtx, DhcpCore, FloodConfig, Host, LeaseBook, Now, Outcome, ServerPort,
    Subnet,
};
use talboot::inventory::{Arch, Firmware, Mac, NetworkMode, Pool, UnknownPolicy};

fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

fn ctx(mode: NetworkMode) -> DecideCtx {
    let server = ip(10, 0, 0, 1);
    let mut hosts = BTreeMap::new();
    let host = |name: &str, addr: Ipv4Addr, firmware, arch| Host {
        name: name.to_string(),
        ip: addr,
        gateway: None,
        arch,
        firmware,
    };
    hosts.insert(
        Mac([0xbc, 0x24, 0x11, 0, 0, 1]),
        host("cp1", ip(10, 0, 0, 11), None, None),
    );
    // Two NICs of one node share a reservation inside the pool.
    hosts.insert(
        Mac([0xbc, 0x24, 0x11, 0, 0, 2]),
        host("w1", ip(10, 0, 0, 101), None, Some(Arch::Arm64)),
    );
    hosts.insert(
        Mac([0xbc, 0x24, 0x11, 0, 0, 3]),
        host("w1", ip(10, 0, 0, 101), None, Some(Arch::Arm64)),
    );
    hosts.insert(
        Mac([0xbc, 0x24, 0x11, 0, 0, 4]),
        host("r1", ip(10, 1, 0, 21), Some(Firmware::Http), None),
    );
    DecideCtx {
        mode,
        server_ip: server,
        subnets: vec![
            Subnet {
                net: "10.0.0.0/24".parse().expect("static subnet"),
                relayed: false,
                router: Some(ip(10, 0, 0, 254)),
                dns: vec![ip(10, 0, 0, 53)],
                ntp: vec![ip(10, 0, 0, 123)],
                domain: Some("lab.example".into()),
                pool: Some(Pool {
                    start: ip(10, 0, 0, 100),
                    end: ip(10, 0, 0, 103),
                }),
                lease_time: Duration::from_secs(3600),
            },
            Subnet {
                net: "10.1.0.0/24".parse().expect("static subnet"),
                relayed: true,
                router: Some(ip(10, 1, 0, 1)),
                dns: vec![],
                ntp: vec![],
                domain: None,
                pool: Some(Pool {
                    start: ip(10, 1, 0, 100),
                    end: ip(10, 1, 0, 101),
                }),
                lease_time: Duration::from_secs(u64::from(u32::MAX) + 10),
            },
        ],
        hosts,
        unknown: UnknownPolicy::Discover,
        boot: BootTargets::standard(server, 8080),
        default_arch: Arch::Amd64,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, packet)) = data.split_first() else {
        return;
    };
    let mode = if selector & 1 == 0 {
        NetworkMode::Authoritative
    } else {
        NetworkMode::Proxy
    };
    let port = if selector & 2 == 0 {
        ServerPort::Dhcp
    } else {
        ServerPort::PxeBoot
    };
    let c = ctx(mode);
    let book = LeaseBook::new(c.lease_book_config());
    let mut core = DhcpCore::new(c, book, FloodConfig::default());
    let mono = Instant::now();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
    for pass in 0..2u64 {
        let now = Now {
            wall: wall + Duration::from_secs(pass * 30),
            mono: mono + Duration::from_secs(pass),
        };
        let source = SocketAddrV4::new(ip(10, 0, 0, 50), 68);
        if let Outcome::Send { bytes, .. } = core.handle(packet, port, source, now) {
            assert!(bytes.len() >= 300, "reply shorter than the BOOTP minimum");
            assert_eq!(
                bytes[236..240],
                [99, 130, 83, 99],
                "reply lost its magic cookie"
            );
        }
        if let Err(e) = core.book.check_invariants() {
            panic!("lease book inconsistent: {e}");
        }
    }
});
