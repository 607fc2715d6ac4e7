//! Decision tests: every message type in each mode, relays, boot-file choice, and the whole
//! bytes-in/bytes-out chain including hostile input.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, Message, MessageType, OptionCode, UnknownOption,
};
use dhcproto::{Decodable, Encodable};
use proptest::prelude::*;

use super::*;
use crate::inventory::{Arch, Firmware, Loc, Mac, NetworkMode, Pool, Spanned, UnknownPolicy};
use crate::store::LeaseState;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CP1: Mac = Mac([0xbc, 0x24, 0x11, 0, 0, 1]);
const W1: Mac = Mac([0xbc, 0x24, 0x11, 0, 0, 2]);
const ARM: Mac = Mac([0xbc, 0x24, 0x11, 0, 0, 3]);
const HTTPNODE: Mac = Mac([0xbc, 0x24, 0x11, 0, 0, 4]);
const STRANGER: Mac = Mac([0x02, 0, 0, 0, 0, 9]);
const LEASE: Duration = Duration::from_secs(3600);

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + secs)
}

fn host(name: &str, addr: &str) -> Host {
    Host {
        name: name.into(),
        ip: ip(addr),
        gateway: None,
        arch: None,
        firmware: None,
        secure_boot: false,
    }
}

fn ctx(mode: NetworkMode, unknown: UnknownPolicy) -> DecideCtx {
    let mut hosts = BTreeMap::new();
    hosts.insert(CP1, host("cp1", "10.0.0.11"));
    hosts.insert(W1, host("w1", "10.1.0.21"));
    hosts.insert(
        ARM,
        Host {
            arch: Some(Arch::Arm64),
            ..host("arm1", "10.0.0.13")
        },
    );
    hosts.insert(
        HTTPNODE,
        Host {
            firmware: Some(Firmware::Http),
            ..host("h1", "10.0.0.14")
        },
    );
    DecideCtx {
        mode,
        server_ip: SERVER,
        subnets: vec![
            Subnet {
                net: "10.0.0.0/24".parse().unwrap(),
                relayed: false,
                router: Some(ip("10.0.0.254")),
                dns: vec![ip("10.0.0.53")],
                ntp: vec![ip("10.0.0.123")],
                domain: Some("lab.example".into()),
                pool: Some(Pool {
                    start: ip("10.0.0.100"),
                    end: ip("10.0.0.103"),
                }),
                lease_time: LEASE,
            },
            Subnet {
                net: "10.1.0.0/24".parse().unwrap(),
                relayed: true,
                router: Some(ip("10.1.0.1")),
                dns: vec![ip("10.0.0.53")],
                ntp: vec![],
                domain: None,
                pool: Some(Pool {
                    start: ip("10.1.0.100"),
                    end: ip("10.1.0.110"),
                }),
                lease_time: LEASE,
            },
        ],
        hosts,
        unknown,
        boot: BootTargets::standard(SERVER, 8080),
        default_arch: Arch::Amd64,
        http_boot: crate::inventory::HttpBoot::Ipxe,
        ukis: BTreeMap::new(),
    }
}

fn auth() -> (DecideCtx, LeaseBook) {
    let c = ctx(NetworkMode::Authoritative, UnknownPolicy::Discover);
    let b = LeaseBook::new(c.lease_book_config());
    (c, b)
}

fn proxy() -> (DecideCtx, LeaseBook) {
    let c = ctx(NetworkMode::Proxy, UnknownPolicy::Discover);
    let b = LeaseBook::new(c.lease_book_config());
    (c, b)
}

/// A client message of `kind` from `mac`.
fn m(kind: MessageType, mac: Mac) -> Message {
    let mut msg = Message::new_with_id(
        0xdead_beef,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac.0,
    );
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    msg
}

fn with(mut msg: Message, opts: impl IntoIterator<Item = DhcpOption>) -> Message {
    for o in opts {
        msg.opts_mut().insert(o);
    }
    msg
}

fn pxe(arch: u16) -> [DhcpOption; 2] {
    [
        DhcpOption::ClientSystemArchitecture(Architecture(arch)),
        DhcpOption::ClassIdentifier(format!("PXEClient:Arch:{arch:05}:UNDI:003016").into_bytes()),
    ]
}

fn http(arch: u16) -> [DhcpOption; 2] {
    [
        DhcpOption::ClientSystemArchitecture(Architecture(arch)),
        DhcpOption::ClassIdentifier(format!("HTTPClient:Arch:{arch:05}:UNDI:003000").into_bytes()),
    ]
}

fn ipxe_user_class() -> DhcpOption {
    DhcpOption::UserClass(b"iPXE".to_vec())
}

fn sid(addr: Ipv4Addr) -> DhcpOption {
    DhcpOption::ServerIdentifier(addr)
}

fn want(addr: &str) -> DhcpOption {
    DhcpOption::RequestedIpAddress(ip(addr))
}

fn from_client() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)
}

fn run(c: &DecideCtx, b: &mut LeaseBook, msg: Message, now: SystemTime) -> Decision {
    run_on(c, b, msg, ServerPort::Dhcp, from_client(), now)
}

fn run_on(
    c: &DecideCtx,
    b: &mut LeaseBook,
    msg: Message,
    port: ServerPort,
    source: SocketAddrV4,
    now: SystemTime,
) -> Decision {
    let req = Request::from_message(msg, port, source).unwrap();
    let d = decide(c, b, &req, now);
    b.check_invariants().unwrap();
    d
}

struct Got {
    msg: Message,
    to: ReplyTarget,
    changes: Vec<LeaseChange>,
    relay: Option<Vec<u8>>,
}

fn reply(d: Decision) -> Got {
    match d {
        Decision::Reply {
            reply,
            to,
            lease_changes,
            ..
        } => Got {
            msg: reply.message,
            to,
            changes: lease_changes,
            relay: reply.relay_agent_info,
        },
        other => panic!("expected a reply, got {other:?}"),
    }
}

impl Got {
    fn kind(&self) -> Option<MessageType> {
        self.msg.opts().msg_type()
    }
    fn opt(&self, code: OptionCode) -> Option<&DhcpOption> {
        self.msg.opts().get(code)
    }
    fn bytes(&self, code: OptionCode) -> Option<Vec<u8>> {
        match self.opt(code)? {
            DhcpOption::BootfileName(v)
            | DhcpOption::ClassIdentifier(v)
            | DhcpOption::TFTPServerName(v)
            | DhcpOption::VendorExtensions(v) => Some(v.clone()),
            other => panic!("not a byte option: {other:?}"),
        }
    }
    fn file(&self) -> Option<String> {
        self.msg
            .fname_str()
            .map(|s| s.unwrap().trim_end_matches('\0').to_string())
    }
    fn bootfile(&self) -> Option<String> {
        self.bytes(OptionCode::BootfileName)
            .map(|v| String::from_utf8(v).unwrap())
    }
}

fn lease_state(changes: &[LeaseChange], addr: &str) -> Option<LeaseState> {
    changes.iter().find_map(|c| match c {
        LeaseChange::Upsert(l) if l.ip == ip(addr) => Some(l.state),
        _ => None,
    })
}

// ---------- authoritative ----------

#[test]
fn discover_from_known_pxe_machine_offers_its_reservation_with_every_option() {
    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), pxe(0)),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Offer));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    assert_eq!(g.msg.xid(), 0xdead_beef);
    assert_eq!(g.msg.chaddr(), &CP1.0);
    assert_eq!(g.opt(OptionCode::ServerIdentifier), Some(&sid(SERVER)));
    assert_eq!(
        g.opt(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(3600))
    );
    assert_eq!(g.opt(OptionCode::Renewal), Some(&DhcpOption::Renewal(1800)));
    assert_eq!(
        g.opt(OptionCode::Rebinding),
        Some(&DhcpOption::Rebinding(3150))
    );
    assert_eq!(
        g.opt(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(ip("255.255.255.0")))
    );
    assert_eq!(
        g.opt(OptionCode::Router),
        Some(&DhcpOption::Router(vec![ip("10.0.0.254")]))
    );
    assert_eq!(
        g.opt(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![ip("10.0.0.53")]))
    );
    assert_eq!(
        g.opt(OptionCode::NtpServers),
        Some(&DhcpOption::NtpServers(vec![ip("10.0.0.123")]))
    );
    assert_eq!(
        g.opt(OptionCode::DomainName),
        Some(&DhcpOption::DomainName("lab.example".into()))
    );
    assert_eq!(
        g.opt(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("cp1".into()))
    );
    // BIOS PXE: iPXE's BIOS build over TFTP, both in the header and in options 66/67.
    assert_eq!(g.msg.siaddr(), SERVER);
    assert_eq!(g.file().as_deref(), Some("undionly.kpxe"));
    assert_eq!(g.bootfile().as_deref(), Some("undionly.kpxe"));
    assert_eq!(
        g.bytes(OptionCode::TFTPServerName),
        Some(b"10.0.0.1".to_vec())
    );
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"PXEClient".to_vec())
    );
    assert_eq!(
        g.bytes(OptionCode::VendorExtensions),
        Some(vec![6, 1, 8, 255])
    );
    assert_eq!(
        g.to,
        ReplyTarget::UnicastToHardware {
            addr: SocketAddrV4::new(ip("10.0.0.11"), 68),
            mac: CP1
        }
    );
    assert_eq!(
        lease_state(&g.changes, "10.0.0.11"),
        Some(LeaseState::Offered)
    );
}

#[test]
fn broadcast_flag_gets_a_broadcast_offer() {
    let (c, mut b) = auth();
    let mut msg = m(MessageType::Discover, CP1);
    msg.set_flags(Flags::default().set_broadcast());
    let g = reply(run(&c, &mut b, msg, t(0)));
    assert_eq!(g.to, ReplyTarget::Broadcast);
    assert!(g.msg.flags().broadcast());
}

#[test]
fn plain_dhcp_client_gets_no_boot_options() {
    let (c, mut b) = auth();
    let g = reply(run(&c, &mut b, m(MessageType::Discover, CP1), t(0)));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    assert_eq!(g.file(), None);
    assert!(g.opt(OptionCode::BootfileName).is_none());
    assert!(g.opt(OptionCode::ClassIdentifier).is_none());
    assert!(g.opt(OptionCode::VendorExtensions).is_none());
    assert_eq!(g.msg.siaddr(), Ipv4Addr::UNSPECIFIED);
}

#[test]
fn request_selecting_us_is_acked_and_bound() {
    let (c, mut b) = auth();
    reply(run(&c, &mut b, m(MessageType::Discover, CP1), t(0)));
    let g = reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, CP1),
            [sid(SERVER), want("10.0.0.11")],
        ),
        t(1),
    ));
    assert_eq!(g.kind(), Some(MessageType::Ack));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    assert_eq!(
        g.opt(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("cp1".into()))
    );
    assert_eq!(
        lease_state(&g.changes, "10.0.0.11"),
        Some(LeaseState::Bound)
    );
    assert_eq!(b.holder(ip("10.0.0.11"), t(2)), Some(CP1));
}

#[test]
fn request_for_a_wrong_address_is_naked() {
    let (c, mut b) = auth();
    // A known machine asking for a pool address while its reservation is free.
    let g = reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, CP1),
            [sid(SERVER), want("10.0.0.100")],
        ),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Nak));
    assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(g.opt(OptionCode::AddressLeaseTime).is_none());
    assert!(g.opt(OptionCode::Message).is_some());
    assert_eq!(g.to, ReplyTarget::Broadcast);
    assert!(g.changes.is_empty());
    // Someone else's reservation.
    let g = reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, STRANGER),
            [sid(SERVER), want("10.0.0.11")],
        ),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Nak));
    assert_eq!(b.get(ip("10.0.0.11")), None);
}

#[test]
fn request_selecting_another_server_withdraws_our_offer() {
    let (c, mut b) = auth();
    let g = reply(run(&c, &mut b, m(MessageType::Discover, STRANGER), t(0)));
    let offered = g.msg.yiaddr();
    assert!(b.get(offered).is_some());
    let d = run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, STRANGER),
            [sid(ip("10.0.0.2")), want("10.0.0.77")],
        ),
        t(1),
    );
    assert_eq!(
        d,
        Decision::Silent {
            reason: Silence::OtherServerSelected,
            lease_changes: vec![LeaseChange::Remove(offered)]
        }
    );
    assert!(b.get(offered).is_none());
}

#[test]
fn init_reboot_is_acked_for_the_right_address_and_naked_off_network() {
    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Request, CP1), [want("10.0.0.11")]),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Ack));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Request, CP1), [want("192.168.5.5")]),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Nak));
}

#[test]
fn renew_is_unicast_to_ciaddr_and_rebind_of_a_taken_address_is_naked() {
    let (c, mut b) = auth();
    reply(run(
        &c,
        &mut b,
        with(m(MessageType::Request, CP1), [want("10.0.0.11")]),
        t(0),
    ));
    let mut renew = m(MessageType::Request, CP1);
    renew.set_ciaddr(ip("10.0.0.11"));
    let g = reply(run(&c, &mut b, renew, t(1800)));
    assert_eq!(g.kind(), Some(MessageType::Ack));
    assert_eq!(g.msg.ciaddr(), ip("10.0.0.11"));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    assert_eq!(
        g.to,
        ReplyTarget::Unicast(SocketAddrV4::new(ip("10.0.0.11"), 68))
    );
    assert!(matches!(&g.changes[..], [LeaseChange::Upsert(l)] if l.expires() == t(1800) + LEASE));

    // Rebinding (broadcast) a pool address another client holds.
    let g = reply(run(&c, &mut b, m(MessageType::Discover, STRANGER), t(0)));
    let taken = g.msg.yiaddr();
    reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, STRANGER),
            [sid(SERVER), DhcpOption::RequestedIpAddress(taken)],
        ),
        t(0),
    ));
    let mut rebind = m(MessageType::Request, Mac([2, 0, 0, 0, 0, 0x42]));
    rebind
        .set_ciaddr(taken)
        .set_flags(Flags::default().set_broadcast());
    let g = reply(run(&c, &mut b, rebind, t(10)));
    assert_eq!(g.kind(), Some(MessageType::Nak));
    assert_eq!(g.to, ReplyTarget::Broadcast);
    assert_eq!(b.holder(taken, t(10)), Some(STRANGER));
}

#[test]
fn release_returns_the_address() {
    let (c, mut b) = auth();
    reply(run(
        &c,
        &mut b,
        with(m(MessageType::Request, CP1), [want("10.0.0.11")]),
        t(0),
    ));
    let mut rel = with(m(MessageType::Release, CP1), [sid(SERVER)]);
    rel.set_ciaddr(ip("10.0.0.11"));
    let d = run(&c, &mut b, rel.clone(), t(5));
    let Decision::Silent {
        reason: Silence::Released,
        lease_changes,
    } = d
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        lease_state(&lease_changes, "10.0.0.11"),
        Some(LeaseState::Released)
    );
    assert_eq!(b.holder(ip("10.0.0.11"), t(6)), None);
    // A second release has nothing to release.
    assert_eq!(
        run(&c, &mut b, rel, t(7)),
        Decision::Drop {
            reason: DropReason::NoRecord
        }
    );
}

#[test]
fn decline_quarantines_and_the_next_discover_gets_another_address() {
    let (c, mut b) = auth();
    let first = reply(run(&c, &mut b, m(MessageType::Discover, STRANGER), t(0)))
        .msg
        .yiaddr();
    assert_eq!(first, ip("10.0.0.100"));
    reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, STRANGER),
            [sid(SERVER), DhcpOption::RequestedIpAddress(first)],
        ),
        t(1),
    ));
    let d = run(
        &c,
        &mut b,
        with(
            m(MessageType::Decline, STRANGER),
            [sid(SERVER), DhcpOption::RequestedIpAddress(first)],
        ),
        t(2),
    );
    let Decision::Silent {
        reason: Silence::Declined,
        lease_changes,
    } = d
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        lease_state(&lease_changes, "10.0.0.100"),
        Some(LeaseState::Declined)
    );
    let next = reply(run(&c, &mut b, m(MessageType::Discover, STRANGER), t(3)))
        .msg
        .yiaddr();
    assert_ne!(next, first);
    assert!(c.subnets[0].pool.unwrap().contains(next));
    // Another client cannot decline addresses it does not hold.
    assert_eq!(
        run(
            &c,
            &mut b,
            with(
                m(MessageType::Decline, W1),
                [DhcpOption::RequestedIpAddress(next)]
            ),
            t(4)
        ),
        Decision::Drop {
            reason: DropReason::NoRecord
        }
    );
}

#[test]
fn inform_gets_options_but_no_lease() {
    let (c, mut b) = auth();
    let mut inf = m(MessageType::Inform, STRANGER);
    inf.set_ciaddr(ip("10.0.0.200"));
    let g = reply(run(&c, &mut b, inf, t(0)));
    assert_eq!(g.kind(), Some(MessageType::Ack));
    assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(g.msg.ciaddr(), ip("10.0.0.200"));
    assert!(g.opt(OptionCode::AddressLeaseTime).is_none());
    assert!(g.opt(OptionCode::SubnetMask).is_some());
    assert!(g.changes.is_empty());
    assert_eq!(
        g.to,
        ReplyTarget::Unicast(SocketAddrV4::new(ip("10.0.0.200"), 68))
    );
    assert_eq!(b.iter().count(), 0);
}

#[test]
fn unknown_machines_follow_the_policy() {
    let c = ctx(NetworkMode::Authoritative, UnknownPolicy::Ignore);
    let mut b = LeaseBook::new(c.lease_book_config());
    assert_eq!(
        run(
            &c,
            &mut b,
            with(m(MessageType::Discover, STRANGER), pxe(7)),
            t(0)
        ),
        Decision::Drop {
            reason: DropReason::UnknownMachine
        }
    );
    // Known machines are still served under `ignore`.
    assert_eq!(
        reply(run(&c, &mut b, m(MessageType::Discover, CP1), t(0)))
            .msg
            .yiaddr(),
        ip("10.0.0.11")
    );

    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), pxe(7)),
        t(0),
    ));
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.100"));
    assert!(g.opt(OptionCode::Hostname).is_none());
    assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
}

#[test]
fn pool_exhaustion_and_unsupported_types_are_dropped() {
    let (c, mut b) = auth();
    for n in 0..4u8 {
        reply(run(
            &c,
            &mut b,
            m(MessageType::Discover, Mac([2, 0, 0, 0, 1, n])),
            t(0),
        ));
    }
    assert_eq!(
        run(&c, &mut b, m(MessageType::Discover, STRANGER), t(0)),
        Decision::Drop {
            reason: DropReason::NoAddress
        }
    );
    assert_eq!(
        run(&c, &mut b, m(MessageType::Offer, CP1), t(0)),
        Decision::Drop {
            reason: DropReason::UnsupportedMessageType
        }
    );
}

// ---------- boot file choice ----------

#[test]
fn ipxe_gets_the_script_url_never_another_binary() {
    for (c, mut b) in [auth(), proxy()] {
        let via_user_class = with(m(MessageType::Discover, CP1), pxe(7)).clone();
        let via_user_class = with(via_user_class, [ipxe_user_class()]);
        let via_175 = with(
            m(MessageType::Discover, CP1),
            [DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(175),
                vec![0x13, 1, 1, 0x24, 1, 1],
            ))],
        );
        for msg in [via_user_class, via_175] {
            let g = reply(run(&c, &mut b, msg, t(0)));
            let url = "http://10.0.0.1:8080/boot.ipxe?mac=bc:24:11:00:00:01&arch=amd64";
            assert_eq!(g.bootfile().as_deref(), Some(url), "{:?}", c.mode);
            assert_eq!(g.file().as_deref(), Some(url));
            assert!(g.opt(OptionCode::TFTPServerName).is_none());
        }
    }
}

#[test]
fn uefi_pxe_gets_the_efi_binary_for_its_arch() {
    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), pxe(7)),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), pxe(11)),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe-arm64.efi"));
    // The inventory's arch wins over the packet's.
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, ARM), pxe(7)),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe-arm64.efi"));
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, ARM), [ipxe_user_class()]),
        t(0),
    ));
    assert!(g.bootfile().unwrap().ends_with("&arch=arm64"));
}

#[test]
fn http_boot_gets_an_http_url_and_httpclient_echo() {
    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), http(16)),
        t(0),
    ));
    assert_eq!(
        g.bootfile().as_deref(),
        Some("http://10.0.0.1:8080/ipxe.efi")
    );
    assert_eq!(g.file().as_deref(), Some("http://10.0.0.1:8080/ipxe.efi"));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"HTTPClient".to_vec())
    );
    assert!(g.opt(OptionCode::VendorExtensions).is_none());
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), http(19)),
        t(0),
    ));
    assert_eq!(
        g.bootfile().as_deref(),
        Some("http://10.0.0.1:8080/ipxe-arm64.efi")
    );
    // The firmware hint picks the family, the client picks the transport: a `firmware: http`
    // node that falls back to PXE gets the EFI binary over TFTP with the PXEClient echo (a
    // PXE ROM cannot fetch an http:// file name)...
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, HTTPNODE), pxe(7)),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"PXEClient".to_vec())
    );
    // ...and a `firmware: uefi` node whose firmware asks for HTTP boot (OVMF's HTTPv4 boot
    // option after PXE failed) gets the URL and the HTTPClient echo it waits for.
    let mut c = c;
    c.hosts.get_mut(&HTTPNODE).unwrap().firmware = Some(Firmware::Uefi);
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, HTTPNODE), http(16)),
        t(0),
    ));
    assert_eq!(
        g.bootfile().as_deref(),
        Some("http://10.0.0.1:8080/ipxe.efi")
    );
    assert_eq!(g.file().as_deref(), Some("http://10.0.0.1:8080/ipxe.efi"));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"HTTPClient".to_vec())
    );
}

#[test]
fn a_long_script_url_goes_in_option_67_only() {
    let (mut c, mut b) = auth();
    c.boot.ipxe_script_url = format!("http://10.0.0.1:8080/{}", "x".repeat(150));
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), [ipxe_user_class()]),
        t(0),
    ));
    assert_eq!(g.file(), None);
    assert!(g.bootfile().unwrap().len() > 128);
}

// ---------- proxy ----------

#[test]
fn proxy_offers_boot_information_only() {
    let (c, mut b) = proxy();
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), pxe(7)),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Offer));
    assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    for code in [
        OptionCode::AddressLeaseTime,
        OptionCode::Renewal,
        OptionCode::Rebinding,
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::Hostname,
    ] {
        assert!(
            g.opt(code).is_none(),
            "{code:?} must not be in a proxy offer"
        );
    }
    assert_eq!(g.opt(OptionCode::ServerIdentifier), Some(&sid(SERVER)));
    assert_eq!(g.msg.siaddr(), SERVER);
    assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"PXEClient".to_vec())
    );
    assert_eq!(
        g.bytes(OptionCode::VendorExtensions),
        Some(vec![6, 1, 8, 255])
    );
    assert_eq!(g.to, ReplyTarget::Broadcast);
    assert!(g.changes.is_empty());
    assert_eq!(b.iter().count(), 0, "proxy mode keeps no leases");

    // HTTP boot through proxy.
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, STRANGER), http(16)),
        t(0),
    ));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"HTTPClient".to_vec())
    );
    assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
}

#[test]
fn proxy_ignores_everything_that_is_not_its_business() {
    let (c, mut b) = proxy();
    assert_eq!(
        run(&c, &mut b, m(MessageType::Discover, CP1), t(0)),
        Decision::Drop {
            reason: DropReason::NotNetbootClient
        }
    );
    assert_eq!(
        run(
            &c,
            &mut b,
            with(
                m(MessageType::Request, CP1),
                [&pxe(0)[..], &[sid(ip("10.0.0.2")), want("10.0.0.50")]].concat()
            ),
            t(0)
        ),
        Decision::Drop {
            reason: DropReason::OtherServer
        }
    );
    let mut rel = with(m(MessageType::Release, CP1), pxe(0));
    rel.set_ciaddr(ip("10.0.0.50"));
    assert_eq!(
        run(&c, &mut b, rel, t(0)),
        Decision::Drop {
            reason: DropReason::OtherServer
        }
    );
    let mut inf = with(m(MessageType::Inform, CP1), pxe(0));
    inf.set_ciaddr(ip("10.0.0.50"));
    assert_eq!(
        run(&c, &mut b, inf, t(0)),
        Decision::Drop {
            reason: DropReason::NotAnswered
        }
    );
    // A REQUEST addressed to us gets the boot ACK.
    let g = reply(run(
        &c,
        &mut b,
        with(
            m(MessageType::Request, CP1),
            [&pxe(0)[..], &[sid(SERVER)]].concat(),
        ),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Ack));
    assert_eq!(g.file().as_deref(), Some("undionly.kpxe"));
    let c = ctx(NetworkMode::Proxy, UnknownPolicy::Ignore);
    assert_eq!(
        run(
            &c,
            &mut b,
            with(m(MessageType::Discover, STRANGER), pxe(7)),
            t(0)
        ),
        Decision::Drop {
            reason: DropReason::UnknownMachine
        }
    );
}

#[test]
fn boot_server_port_4011_answers_unicast_with_the_boot_item_in_both_modes() {
    for (c, mut b) in [proxy(), auth()] {
        let item = [PXE_BOOT_ITEM_FOR_TEST, 4, 0x80, 0x00, 0, 0];
        let mut req = with(
            m(MessageType::Request, CP1),
            [
                &pxe(7)[..],
                &[DhcpOption::VendorExtensions([&item[..], &[255]].concat())],
            ]
            .concat(),
        );
        req.set_ciaddr(ip("10.0.0.50"));
        let source = SocketAddrV4::new(ip("10.0.0.50"), 68);
        let g = reply(run_on(&c, &mut b, req, ServerPort::PxeBoot, source, t(0)));
        assert_eq!(g.kind(), Some(MessageType::Ack));
        assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(g.msg.ciaddr(), ip("10.0.0.50"));
        assert_eq!(g.to, ReplyTarget::Unicast(source));
        assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
        assert!(g.opt(OptionCode::AddressLeaseTime).is_none());
        assert!(g.opt(OptionCode::SubnetMask).is_none());
        assert_eq!(
            g.bytes(OptionCode::VendorExtensions),
            Some([&[6, 1, 8][..], &item, &[255]].concat())
        );
        assert!(g.changes.is_empty());
        // DISCOVER is not a 4011 message; plain clients are not served there.
        let d = run_on(
            &c,
            &mut b,
            with(m(MessageType::Discover, CP1), pxe(7)),
            ServerPort::PxeBoot,
            source,
            t(0),
        );
        assert_eq!(
            d,
            Decision::Drop {
                reason: DropReason::NotAnswered
            }
        );
        let mut plain = m(MessageType::Request, CP1);
        plain.set_ciaddr(ip("10.0.0.50"));
        let d = run_on(&c, &mut b, plain, ServerPort::PxeBoot, source, t(0));
        assert_eq!(
            d,
            Decision::Drop {
                reason: DropReason::NotNetbootClient
            }
        );
    }
}

const PXE_BOOT_ITEM_FOR_TEST: u8 = 71;

// ---------- relays ----------

fn relayed(mut msg: Message, giaddr: &str) -> Message {
    msg.set_giaddr(ip(giaddr)).set_hops(1);
    let mut info = dhcproto::v4::relay::RelayAgentInformation::default();
    info.insert(dhcproto::v4::relay::RelayInfo::AgentCircuitId(
        b"sw1/port7".to_vec(),
    ));
    msg.opts_mut()
        .insert(DhcpOption::RelayAgentInformation(info));
    msg
}

#[test]
fn relayed_discover_uses_the_relay_subnet_and_is_answered_to_the_relay() {
    let (c, mut b) = auth();
    let g = reply(run(
        &c,
        &mut b,
        relayed(with(m(MessageType::Discover, W1), pxe(7)), "10.1.0.1"),
        t(0),
    ));
    assert_eq!(g.msg.yiaddr(), ip("10.1.0.21"));
    assert_eq!(g.msg.giaddr(), ip("10.1.0.1"));
    assert_eq!(
        g.opt(OptionCode::Router),
        Some(&DhcpOption::Router(vec![ip("10.1.0.1")]))
    );
    assert_eq!(
        g.to,
        ReplyTarget::Relay(SocketAddrV4::new(ip("10.1.0.1"), 67))
    );
    assert_eq!(
        g.relay.as_deref(),
        Some(&[1, 9, b's', b'w', b'1', b'/', b'p', b'o', b'r', b't', b'7'][..])
    );
    // Unknown machines behind the relay get the relay subnet's pool.
    let g = reply(run(
        &c,
        &mut b,
        relayed(m(MessageType::Discover, STRANGER), "10.1.0.1"),
        t(0),
    ));
    assert_eq!(g.msg.yiaddr(), ip("10.1.0.100"));
}

#[test]
fn relay_edge_cases() {
    let (c, mut b) = auth();
    assert_eq!(
        run(
            &c,
            &mut b,
            relayed(m(MessageType::Discover, W1), "172.16.0.1"),
            t(0)
        ),
        Decision::Drop {
            reason: DropReason::UnknownSubnet
        }
    );
    // cp1's reservation is on the attached subnet, not behind this relay.
    assert_eq!(
        run(
            &c,
            &mut b,
            relayed(m(MessageType::Discover, CP1), "10.1.0.1"),
            t(0)
        ),
        Decision::Drop {
            reason: DropReason::ReservationOffSubnet
        }
    );
    // A NAK through a relay asks the relay to broadcast it.
    let g = reply(run(
        &c,
        &mut b,
        relayed(
            with(m(MessageType::Request, W1), [want("10.0.0.99")]),
            "10.1.0.1",
        ),
        t(0),
    ));
    assert_eq!(g.kind(), Some(MessageType::Nak));
    assert!(g.msg.flags().broadcast());
    assert_eq!(
        g.to,
        ReplyTarget::Relay(SocketAddrV4::new(ip("10.1.0.1"), 67))
    );
    assert!(g.relay.is_some());
}

#[test]
fn proxy_answers_through_relays_too() {
    let (c, mut b) = proxy();
    let g = reply(run(
        &c,
        &mut b,
        relayed(with(m(MessageType::Discover, W1), pxe(0)), "10.1.0.1"),
        t(0),
    ));
    assert_eq!(g.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        g.to,
        ReplyTarget::Relay(SocketAddrV4::new(ip("10.1.0.1"), 67))
    );
    assert!(g.relay.is_some());
    assert_eq!(g.file().as_deref(), Some("undionly.kpxe"));
}

// ---------- whole chain ----------

fn core(mode: NetworkMode) -> DhcpCore {
    let c = ctx(mode, UnknownPolicy::Discover);
    let b = LeaseBook::new(c.lease_book_config());
    DhcpCore::new(c, b, FloodConfig::default())
}

fn now(mono: Instant, secs: u64) -> Now {
    Now {
        wall: t(secs),
        mono: mono + Duration::from_secs(secs),
    }
}

#[test]
fn bytes_in_bytes_out_with_padding_and_verbatim_option_82() {
    let mut core = core(NetworkMode::Authoritative);
    let mono = Instant::now();
    let mut raw = m(MessageType::Discover, W1);
    raw.set_giaddr(ip("10.1.0.1"));
    let mut bytes = raw.to_vec().unwrap();
    assert_eq!(bytes.pop(), Some(255));
    // Option 82 with a sub-option dhcproto does not model (0x97) that must come back as is.
    let opt82 = [1, 2, b'p', b'7', 0x97, 3, 1, 2, 3];
    bytes.extend_from_slice(&[82, opt82.len() as u8]);
    bytes.extend_from_slice(&opt82);
    bytes.push(255);
    let Outcome::Send {
        bytes: out,
        to,
        lease_changes,
        ..
    } = core.handle(
        &bytes,
        ServerPort::Dhcp,
        SocketAddrV4::new(ip("10.1.0.1"), 67),
        now(mono, 0),
    )
    else {
        panic!("expected a reply")
    };
    assert!(out.len() >= 300, "{} bytes", out.len());
    assert_eq!(
        to,
        ReplyTarget::Relay(SocketAddrV4::new(ip("10.1.0.1"), 67))
    );
    assert_eq!(
        lease_state(&lease_changes, "10.1.0.21"),
        Some(LeaseState::Offered)
    );
    let pos = out
        .windows(opt82.len() + 2)
        .position(|w| w[0] == 82 && w[2..] == opt82);
    assert!(pos.is_some(), "option 82 not echoed verbatim");
    let back = Message::from_bytes(&out).unwrap();
    assert_eq!(back.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(back.yiaddr(), ip("10.1.0.21"));
    assert_eq!(core.stats.replies, 1);
}

#[test]
fn malformed_packets_are_dropped_and_counted_and_floods_are_limited() {
    let mut core = core(NetworkMode::Authoritative);
    let mono = Instant::now();
    let src = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68);
    assert_eq!(
        core.handle(&[1, 2, 3], ServerPort::Dhcp, src, now(mono, 0)),
        Outcome::Dropped(DropReason::TooShort)
    );
    let mut unterminated = m(MessageType::Discover, CP1).to_vec().unwrap();
    unterminated.pop();
    assert_eq!(
        core.handle(&unterminated, ServerPort::Dhcp, src, now(mono, 0)),
        Outcome::Dropped(DropReason::MissingEnd)
    );
    assert_eq!(core.stats.malformed(), 2);

    let discover = m(MessageType::Discover, STRANGER).to_vec().unwrap();
    let burst = FloodConfig::default().burst;
    for _ in 0..burst {
        assert!(matches!(
            core.handle(&discover, ServerPort::Dhcp, src, now(mono, 1)),
            Outcome::Send { .. }
        ));
    }
    assert_eq!(
        core.handle(&discover, ServerPort::Dhcp, src, now(mono, 1)),
        Outcome::Dropped(DropReason::RateLimited)
    );
    assert_eq!(core.stats.dropped.get(&DropReason::RateLimited), Some(&1));
    // Other MACs are unaffected, and the flooder recovers with time.
    assert!(matches!(
        core.handle(
            &m(MessageType::Discover, CP1).to_vec().unwrap(),
            ServerPort::Dhcp,
            src,
            now(mono, 1)
        ),
        Outcome::Send { .. }
    ));
    assert!(matches!(
        core.handle(&discover, ServerPort::Dhcp, src, now(mono, 5)),
        Outcome::Send { .. }
    ));
}

/// Valid requests of every kind, as raw bytes, for mutation.
fn seed_packets() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for kind in [
        MessageType::Discover,
        MessageType::Request,
        MessageType::Decline,
        MessageType::Release,
        MessageType::Inform,
    ] {
        for mac in [CP1, W1, STRANGER] {
            let mut msg = with(m(kind, mac), pxe(7));
            msg.opts_mut().insert(sid(SERVER));
            msg.opts_mut().insert(want("10.0.0.100"));
            msg.opts_mut().insert(ipxe_user_class());
            out.push(msg.to_vec().unwrap());
            out.push(
                relayed(with(m(kind, mac), http(16)), "10.1.0.1")
                    .to_vec()
                    .unwrap(),
            );
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700), port4011 in any::<bool>()) {
        let mut core = core(NetworkMode::Authoritative);
        let port = if port4011 { ServerPort::PxeBoot } else { ServerPort::Dhcp };
        let _ = core.handle(&bytes, port, SocketAddrV4::new(ip("10.0.0.50"), 68), now(Instant::now(), 0));
        prop_assert!(core.book.check_invariants().is_ok());
    }

    #[test]
    fn mutated_valid_packets_never_panic_and_keep_the_book_consistent(
        seed in 0usize..30,
        edits in proptest::collection::vec((240usize..400, any::<u8>()), 1..8),
        cut in proptest::option::of(240usize..400),
        proxy_mode in any::<bool>(),
    ) {
        let seeds = seed_packets();
        let mut bytes = seeds[seed % seeds.len()].clone();
        for (pos, val) in edits {
            if pos < bytes.len() {
                bytes[pos] = val;
            }
        }
        if let Some(c) = cut {
            bytes.truncate(c);
        }
        let mode = if proxy_mode { NetworkMode::Proxy } else { NetworkMode::Authoritative };
        let mut core = core(mode);
        let mono = Instant::now();
        // Run it twice: the second sees the lease state the first left.
        for i in 0..2 {
            if let Outcome::Send { bytes: out, .. } = core.handle(&bytes, ServerPort::Dhcp, SocketAddrV4::new(ip("10.0.0.50"), 68), now(mono, i)) {
                prop_assert!(out.len() >= 300);
                prop_assert!(Message::from_bytes(&out).is_ok());
            }
            prop_assert!(core.book.check_invariants().is_ok());
        }
    }
}

// ---------- from the inventory ----------

fn sp<T>(v: T) -> Spanned<T> {
    Spanned::new(v, Loc::file_only(Path::new("talboot.yaml")))
}

#[test]
fn view_from_inventory() {
    use crate::inventory::*;
    let node = |name: &str, mac: Mac, addr: &str, fw: Option<Firmware>| Node {
        name: sp(name.to_string()),
        macs: vec![sp(mac)],
        role: sp("cp".to_string()),
        address: sp(addr.parse::<Ipv4Net>().unwrap()),
        gateway: None,
        install: InstallTarget::Disk("/dev/sda".into()),
        arch: None,
        firmware: fw,
        kernel_args: vec![],
        local_boot: None,
        patches: vec![],
        labels: BTreeMap::new(),
        taints: vec![],
        interfaces: vec![],
        power: None,
        storage: Default::default(),
        secure_boot: None,
    };
    let inv = Inventory {
        path: PathBuf::from("talboot.yaml"),
        format: SourceFormat::Talboot,
        cluster: Cluster {
            name: sp("lab".into()),
            talos_version: sp("v1.13.9".parse().unwrap()),
            kubernetes_version: sp("1.36.3".parse().unwrap()),
            endpoint: sp(Endpoint::parse("https://10.0.0.10:6443").unwrap()),
            vip: None,
            pod_subnets: vec![],
            service_subnets: vec![],
            dns_domain: "cluster.local".into(),
            allow_scheduling_on_control_planes: false,
            secrets: Secrets {
                file: PathBuf::from("secrets.age"),
                age_recipients: vec![],
            },
            patches: vec![],
            installer: Installer {
                schematic: None,
                image: None,
                factory_url: "https://factory.talos.dev".into(),
            },
            external_cni: false,
        },
        network: Network {
            interfaces: vec!["eth0".into()],
            mode: NetworkMode::Authoritative,
            subnet: sp("10.0.0.0/24".parse().unwrap()),
            gateway: Some(sp(ip("10.0.0.254"))),
            dns: vec![ip("10.0.0.53")],
            ntp: vec!["time.example".into(), "10.0.0.123".into()],
            domain: Some("lab.example".into()),
            pool: Some(sp(Pool {
                start: ip("10.0.0.100"),
                end: ip("10.0.0.110"),
            })),
            lease_time: Duration::from_secs(7200),
            advertise: None,
            relays: vec![RelaySubnet {
                subnet: sp("10.1.0.0/24".parse().unwrap()),
                gateway: Some(sp(ip("10.1.0.1"))),
                pool: None,
                dns: vec![],
            }],
        },
        boot: Boot {
            delivery: Delivery::Push,
            unknown_machines: UnknownPolicy::Ignore,
            default_arch: Arch::Arm64,
            kernel_args: vec![],
            local_boot: LocalBoot::Exit,
            http_boot: crate::inventory::HttpBoot::Ipxe,
        },
        roles: BTreeMap::new(),
        nodes: vec![
            node("cp1", CP1, "10.0.0.11/24", None),
            node("w1", W1, "10.1.0.21/24", Some(Firmware::Uefi)),
        ],
        addons: Addons::default(),
    };
    let c = DecideCtx::from_inventory(&inv, SERVER, BootTargets::standard(SERVER, 80));
    assert_eq!(c.boot.ipxe_script_url, "http://10.0.0.1/boot.ipxe");
    assert_eq!(c.subnets.len(), 2);
    assert_eq!(
        c.subnets[0].ntp,
        vec![ip("10.0.0.123")],
        "names are not DHCP NTP servers"
    );
    assert_eq!(
        c.subnets[1].dns,
        vec![ip("10.0.0.53")],
        "relays inherit DNS"
    );
    assert!(c.subnets[1].relayed && c.subnets[1].pool.is_none());
    assert_eq!(c.subnets[1].lease_time, Duration::from_secs(7200));
    assert_eq!(c.hosts[&W1].ip, ip("10.1.0.21"));
    assert_eq!(c.hosts[&W1].firmware, Some(Firmware::Uefi));
    assert_eq!(c.default_arch, Arch::Arm64);
    let cfg = c.lease_book_config();
    assert_eq!(cfg.reservations.len(), 2);
    assert_eq!(cfg.pools.len(), 1);

    // And it drives a decision: the unknown-machine policy from the inventory applies.
    let mut b = LeaseBook::new(cfg);
    assert_eq!(
        run(&c, &mut b, m(MessageType::Discover, STRANGER), t(0)),
        Decision::Drop {
            reason: DropReason::UnknownMachine
        }
    );
    // PXE without option 93: no arch from the packet, so the inventory's default applies, and
    // the node's `firmware: uefi` hint turns the BIOS guess into UEFI.
    let no_arch = [DhcpOption::ClassIdentifier(b"PXEClient".to_vec())];
    let g = reply(run(
        &c,
        &mut b,
        relayed(with(m(MessageType::Discover, W1), no_arch), "10.1.0.1"),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe-arm64.efi"));
}

// ---------- ProxyDHCP as iPXE and EDK2 read it ----------

mod ha;
mod overload;
mod proxy_conformance;
mod secure_boot;
