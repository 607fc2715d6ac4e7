//! ProxyDHCP as real firmware accepts it: talboot's encoded replies, read back the way iPXE
//! and EDK2 read them.
//!
//! The two client models below are written from the upstream sources (cited per function),
//! not from talboot's code, and take the reply as bytes on the wire:
//! - iPXE: ipxe/ipxe `src/net/udp/dhcp.c` and `src/net/dhcppkt.c` at 36a4c85, the build
//!   Debian 12 ships (ipxe and ipxe-qemu 1.0.0+git-20190125.36a4c85: /usr/lib/ipxe and QEMU's
//!   NIC ROMs). The ProxyDHCP paths quoted here are the same on master (0ab2277c4).
//! - EDK2 (OVMF's PXE base code): tianocore/edk2 `NetworkPkg/UefiPxeBcDxe/PxeBcDhcp4.c`,
//!   `PxeBcDhcp4.h`, `PxeBcBoot.c` and `NetworkPkg/Dhcp4Dxe/Dhcp4Io.c` at edk2-stable202211,
//!   the release Debian 12's ovmf 2022.11 is built from.
//!
//! docs/conformance.md, "DHCP: ProxyDHCP as iPXE and EDK2 accept it", lists each rule.

use super::*;

/// UDP source port of a 4011 reply: the server sends it from the socket the request came in
/// on (`server/handle.rs`, `Adapter::handle` hands the receiving socket to the reply).
const PXE_PORT: u16 = 4011;

/// A BOOTP/DHCP packet split the way RFC 2131 §2 lays it out, with the options as TLVs.
struct Wire {
    op: u8,
    hlen: u8,
    xid: u32,
    ciaddr: Ipv4Addr,
    yiaddr: Ipv4Addr,
    siaddr: Ipv4Addr,
    chaddr: [u8; 16],
    file: [u8; 128],
    options: Vec<(u8, Vec<u8>)>,
}

impl Wire {
    fn parse(b: &[u8]) -> Wire {
        assert!(b.len() >= 240, "short packet");
        assert_eq!(&b[236..240], &[99, 130, 83, 99], "magic cookie");
        let addr = |i: usize| Ipv4Addr::new(b[i], b[i + 1], b[i + 2], b[i + 3]);
        let mut options = Vec::new();
        let mut i = 240;
        while i < b.len() {
            match b[i] {
                0 => i += 1,
                255 => break,
                code => {
                    let len = usize::from(b[i + 1]);
                    options.push((code, b[i + 2..i + 2 + len].to_vec()));
                    i += 2 + len;
                }
            }
        }
        Wire {
            op: b[0],
            hlen: b[2],
            xid: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            ciaddr: addr(12),
            yiaddr: addr(16),
            siaddr: addr(20),
            chaddr: b[28..44].try_into().unwrap(),
            file: b[108..236].try_into().unwrap(),
            options,
        }
    }

    fn opt(&self, code: u8) -> Option<&[u8]> {
        self.options
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v.as_slice())
    }

    fn msg_type(&self) -> Option<u8> {
        self.opt(53).and_then(|v| v.first().copied())
    }

    fn server_id(&self) -> Option<Ipv4Addr> {
        self.opt(54)
            .filter(|v| v.len() == 4)
            .map(|v| Ipv4Addr::new(v[0], v[1], v[2], v[3]))
    }

    /// Sub-option `code` of the PXE vendor options (43).
    fn pxe_sub(&self, code: u8) -> Option<&[u8]> {
        let data = self.opt(43)?;
        let mut i = 0;
        while i < data.len() {
            match data[i] {
                0 => i += 1,
                255 => return None,
                c => {
                    let len = usize::from(*data.get(i + 1)?);
                    let v = data.get(i + 2..i + 2 + len)?;
                    if c == code {
                        return Some(v);
                    }
                    i += 2 + len;
                }
            }
        }
        None
    }
}

fn strnlen(field: &[u8]) -> usize {
    field.iter().position(|b| *b == 0).unwrap_or(field.len())
}

// ---------- iPXE (ipxe/ipxe at 36a4c85) ----------

/// `dhcppkt_fetch()` (src/net/dhcppkt.c): the `file` header field when it is non-empty
/// (`used_len_string`), else option 67.
fn ipxe_filename(w: &Wire) -> Option<Vec<u8>> {
    let n = strnlen(&w.file);
    if n > 0 {
        return Some(w.file[..n].to_vec());
    }
    w.opt(67).map(<[u8]>::to_vec)
}

/// `dhcp_has_pxeopts()` (src/net/udp/dhcp.c): next-server (siaddr) and a boot file name,
/// or a PXE boot menu (option 43 sub-option 9, `DHCP_PXE_BOOT_MENU`).
fn ipxe_has_pxeopts(w: &Wire) -> bool {
    (!w.siaddr.is_unspecified() && ipxe_filename(w).is_some_and(|f| !f.is_empty()))
        || w.pxe_sub(9).is_some_and(|m| !m.is_empty())
}

/// `dhcp_deliver()`: the server pseudo-ID is option 54, else siaddr, else the sender.
fn ipxe_pseudo_id(w: &Wire, peer: Ipv4Addr) -> Ipv4Addr {
    match w.server_id() {
        Some(id) if !id.is_unspecified() => id,
        _ if !w.siaddr.is_unspecified() => w.siaddr,
        _ => peer,
    }
}

/// `dhcp_deliver()`: a reply for this session has its xid and the NIC's MAC in chaddr.
fn ipxe_matches_session(w: &Wire, xid: u32, mac: Mac) -> bool {
    w.xid == xid && w.chaddr[..6] == mac.0
}

/// `dhcp_discovery_rx()`: a reply to DISCOVER is kept as the ProxyDHCP offer when it has a
/// pseudo-ID and option 60 starts with the 9 bytes "PXEClient" (any port, any type).
fn ipxe_takes_as_proxy_offer(w: &Wire, peer: Ipv4Addr) -> bool {
    !ipxe_pseudo_id(w, peer).is_unspecified()
        && w.opt(60).is_some_and(|v| v.starts_with(b"PXEClient"))
}

/// `dhcp_proxy_rx()`: the answer to the ProxyDHCPREQUEST must come from port 4011, be an
/// OFFER or ACK, carry the proxy server's pseudo-ID and have PXE options; otherwise iPXE
/// keeps retrying for `DHCP_REQ_PROXY_TIMEOUT_SEC` (2 s, src/config/dhcp.h) and ends DHCP
/// without a boot file.
fn ipxe_proxy_rx_accepts(w: &Wire, peer: SocketAddrV4, proxy_server: Ipv4Addr) -> bool {
    peer.port() == PXE_PORT
        && matches!(w.msg_type(), Some(2 | 5))
        && ipxe_pseudo_id(w, *peer.ip()) == proxy_server
        && ipxe_has_pxeopts(w)
}

// ---------- EDK2 (tianocore/edk2 at edk2-stable202211) ----------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edk2OfferType {
    DhcpOnly,
    DhcpPxe10,
    DhcpBinl,
    ProxyPxe10,
    ProxyBinl,
    Bootp,
    /// Dropped by PxeBcParseDhcp4Packet (WfM11a multicast offer, BOOTP without a file).
    Discarded,
}

/// Dhcp4Io.c `DhcpInput()`: a BOOTREPLY with the session's xid and the chaddr bytes the
/// client sent (compared over the reply's hlen), then `DhcpHandleSelect()`: while selecting,
/// a DHCP reply counts only as an OFFER that carries a server identifier.
fn edk2_takes_in_selecting(w: &Wire, xid: u32, mac: Mac) -> bool {
    let mut sent = [0u8; 16];
    sent[..6].copy_from_slice(&mac.0);
    let hlen = usize::from(w.hlen).min(16);
    w.op == 2
        && w.xid == xid
        && w.chaddr[..hlen] == sent[..hlen]
        && w.msg_type() == Some(2)
        && w.server_id().is_some()
}

/// PxeBcDhcp4.h `IS_VALID_DISCOVER_VENDOR_OPTION`: any of sub-options 6 (discovery
/// control), 7 (multicast address), 8 (boot servers), 9 (boot menu), 10 (menu prompt).
fn edk2_has_discover_vendor_option(w: &Wire) -> bool {
    [6, 7, 8, 9, 10].into_iter().any(|c| w.pxe_sub(c).is_some())
}

/// PxeBcDhcp4.c `PxeBcParseDhcp4Packet()`: option 67, else a non-empty `file` field (the
/// fields are not overloaded in talboot's replies, checked by the caller).
fn edk2_bootfile(w: &Wire) -> Option<Vec<u8>> {
    if let Some(v) = w.opt(67) {
        return Some(v.split(|b| *b == 0).next().unwrap_or_default().to_vec());
    }
    (w.file[0] != 0).then(|| w.file[..strnlen(&w.file)].to_vec())
}

/// PxeBcDhcp4.c `PxeBcParseDhcp4Packet()`: proxy = yiaddr 0; PXE = option 60 begins with
/// "PXEClient" (vendor options are parsed only then); the type follows.
fn edk2_offer_type(w: &Wire) -> Edk2OfferType {
    assert!(w.opt(52).is_none(), "talboot never overloads file/sname");
    let proxy = w.yiaddr.octets()[0] == 0;
    let pxe = w
        .opt(60)
        .is_some_and(|v| v.len() >= 9 && &v[..9] == b"PXEClient");
    if w.msg_type().is_none_or(|t| t == 0) {
        return if edk2_bootfile(w).is_some() {
            Edk2OfferType::Bootp
        } else {
            Edk2OfferType::Discarded
        };
    }
    if pxe && edk2_has_discover_vendor_option(w) {
        if proxy {
            Edk2OfferType::ProxyPxe10
        } else {
            Edk2OfferType::DhcpPxe10
        }
    } else if pxe && (1..=5).all(|c| w.pxe_sub(c).is_some()) {
        Edk2OfferType::Discarded
    } else if pxe {
        if proxy {
            Edk2OfferType::ProxyBinl
        } else {
            Edk2OfferType::DhcpBinl
        }
    } else {
        Edk2OfferType::DhcpOnly
    }
}

/// PxeBcBoot.c `PxeBcSelectBootPrompt()`: the prompt, menu and boot-server discovery are
/// skipped only when option 43.6 has bit 3 set and the offer names a boot file. Otherwise,
/// with no menu (43.9) the default boot type stays 0 (PXE bootstrap), which
/// `PxeBcDiscoverBootFile()` answers with EFI_ABORTED: no boot.
fn edk2_boots_offer_file_directly(w: &Wire) -> bool {
    let ctrl = w.pxe_sub(6).and_then(|v| v.first().copied()).unwrap_or(0);
    ctrl & 0x08 != 0 && edk2_bootfile(w).is_some()
}

/// PxeBcBoot.c `PxeBcDhcp4BootInfo()`: the TFTP server is the first boot server (43.8) when
/// prompting is disabled and a list is present, else siaddr, else option 54.
fn edk2_tftp_server(w: &Wire) -> Option<Ipv4Addr> {
    let ctrl = w.pxe_sub(6).and_then(|v| v.first().copied()).unwrap_or(0);
    if ctrl & 0x08 != 0
        && let Some(list) = w.pxe_sub(8)
        && list.len() >= 7
        && list[2] > 0
    {
        return Some(Ipv4Addr::new(list[3], list[4], list[5], list[6]));
    }
    if !w.siaddr.is_unspecified() {
        return Some(w.siaddr);
    }
    w.server_id()
}

// ---------- the clients' requests, as captured from the Debian 12 firmware ----------

const XID: u32 = 0xbfb5_e26e;

/// iPXE's DISCOVER (the ROM in SeaBIOS: arch 0, UNDI 2.1; ipxe.efi: arch 7, UNDI 3.10), with
/// user class "iPXE" and its feature option 175.
fn ipxe_discover(mac: Mac, arch: u16) -> Message {
    let undi = if arch == 0 { "002001" } else { "003010" };
    let mut msg = m(MessageType::Discover, mac);
    msg.set_xid(XID);
    with(
        msg,
        [
            DhcpOption::ClientSystemArchitecture(Architecture(arch)),
            DhcpOption::ClassIdentifier(
                format!("PXEClient:Arch:{arch:05}:UNDI:{undi}").into_bytes(),
            ),
            ipxe_user_class(),
            DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(175),
                vec![0x13, 1, 1, 0x15, 1, 1],
            )),
        ],
    )
}

/// iPXE's ProxyDHCPREQUEST (`dhcp_proxy_tx()`): the same xid, ciaddr = the address the
/// router just leased, option 54 = the proxy's pseudo-ID, unicast to it on 4011 from the
/// DHCP socket's port 68 (`start_dhcp()` binds `BOOTPC_PORT`, `dhcp_tx()` sends from it).
fn ipxe_proxy_request(
    mac: Mac,
    arch: u16,
    leased: Ipv4Addr,
    proxy: Ipv4Addr,
) -> (Message, SocketAddrV4) {
    let discover = ipxe_discover(mac, arch);
    let mut msg = discover.clone();
    msg.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    msg.opts_mut().insert(DhcpOption::ServerIdentifier(proxy));
    msg.set_ciaddr(leased);
    (msg, SocketAddrV4::new(leased, 68))
}

/// OVMF's PXE DISCOVER: arch 7, UNDI 3.0, client UUID (97), no user class.
fn ovmf_discover(mac: Mac) -> Message {
    let mut msg = m(MessageType::Discover, mac);
    msg.set_xid(XID);
    let mut guid = vec![0u8];
    guid.extend_from_slice(&[0x11; 16]);
    with(
        msg,
        [
            DhcpOption::ClientSystemArchitecture(Architecture(7)),
            DhcpOption::ClassIdentifier(b"PXEClient:Arch:00007:UNDI:003000".to_vec()),
            DhcpOption::ClientMachineIdentifier(guid),
        ],
    )
}

/// decide + encode: the reply's bytes and destination, as `DhcpCore::handle` sends them.
fn wire(
    c: &DecideCtx,
    b: &mut LeaseBook,
    msg: Message,
    port: ServerPort,
    source: SocketAddrV4,
) -> (Wire, ReplyTarget) {
    match run_on(c, b, msg, port, source, t(0)) {
        Decision::Reply { reply, to, .. } => (
            Wire::parse(&super::super::reply::encode(&reply).unwrap()),
            to,
        ),
        other => panic!("expected a reply, got {other:?}"),
    }
}

const LEASED: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 101);

// ---------- rules ----------

#[test]
fn ipxe_takes_the_proxy_offer_as_it_is_without_a_4011_request() {
    // Rule: a ProxyDHCP OFFER with siaddr and a boot file is used directly
    // (dhcp_request_rx: "PXE options already present"); without siaddr iPXE must ask 4011.
    let (c, mut b) = proxy();
    for arch in [0, 7] {
        let (w, to) = wire(
            &c,
            &mut b,
            ipxe_discover(CP1, arch),
            ServerPort::Dhcp,
            from_client(),
        );
        assert_eq!(to, ReplyTarget::Broadcast);
        assert!(ipxe_matches_session(&w, XID, CP1));
        assert!(ipxe_takes_as_proxy_offer(&w, SERVER), "arch {arch}");
        assert!(
            ipxe_has_pxeopts(&w),
            "arch {arch}: iPXE would not use this offer's boot file (siaddr {}, file {:?})",
            w.siaddr,
            ipxe_filename(&w).map(|f| String::from_utf8_lossy(&f).into_owned())
        );
        let file = String::from_utf8(ipxe_filename(&w).unwrap()).unwrap();
        assert!(file.starts_with("http://10.0.0.1:8080/"), "{file}");
        assert!(file.contains("mac=bc:24:11:00:00:01"), "{file}");
        assert_eq!(
            w.yiaddr,
            Ipv4Addr::UNSPECIFIED,
            "iPXE must not take it as an address offer"
        );
    }
}

#[test]
fn ipxe_takes_the_ack_to_its_proxydhcp_request_on_4011() {
    // Rule: dhcp_proxy_rx keeps an answer from port 4011 only if it is an OFFER or ACK with
    // the proxy's pseudo-ID and PXE options (siaddr + boot file).
    let (c, mut b) = proxy();
    for arch in [0, 7] {
        let (offer, _) = wire(
            &c,
            &mut b,
            ipxe_discover(CP1, arch),
            ServerPort::Dhcp,
            from_client(),
        );
        let proxy_server = ipxe_pseudo_id(&offer, SERVER);
        let (req, source) = ipxe_proxy_request(CP1, arch, LEASED, proxy_server);
        let (w, to) = wire(&c, &mut b, req, ServerPort::PxeBoot, source);
        assert!(ipxe_matches_session(&w, XID, CP1));
        assert!(
            ipxe_proxy_rx_accepts(&w, SocketAddrV4::new(SERVER, PXE_PORT), proxy_server),
            "arch {arch}: iPXE drops this 4011 answer (type {:?}, siaddr {}, option 54 {:?})",
            w.msg_type(),
            w.siaddr,
            w.server_id()
        );
        assert_eq!(w.ciaddr, LEASED);
        assert_eq!(w.yiaddr, Ipv4Addr::UNSPECIFIED);
        // iPXE listens on the port it sent from (68), at the address it just leased.
        assert_eq!(to, ReplyTarget::Unicast(source));
    }
}

#[test]
fn edk2_selects_the_proxy_offer_as_proxy_pxe10_and_boots_its_file_from_siaddr() {
    // Rules: DhcpHandleSelect needs an OFFER with option 54; PxeBcParseDhcp4Packet makes it a
    // ProxyPxe10 offer (yiaddr 0, "PXEClient", a discovery sub-option), which
    // PxeBcSelectDhcp4Offer pairs with the router's DhcpOnly offer (its case 3); bit 3 of
    // 43.6 with a boot file skips prompt, menu and discovery; TFTP goes to siaddr.
    let (c, mut b) = proxy();
    let (w, to) = wire(
        &c,
        &mut b,
        ovmf_discover(CP1),
        ServerPort::Dhcp,
        from_client(),
    );
    assert_eq!(to, ReplyTarget::Broadcast);
    assert!(edk2_takes_in_selecting(&w, XID, CP1));
    assert_eq!(edk2_offer_type(&w), Edk2OfferType::ProxyPxe10);
    assert!(edk2_boots_offer_file_directly(&w));
    assert_eq!(edk2_bootfile(&w).as_deref(), Some(&b"ipxe.efi"[..]));
    assert_eq!(edk2_tftp_server(&w), Some(c.boot.tftp_server));
    // A boot menu or prompt would make EDK2 show it instead of booting (PxeBcSelectBootMenu).
    assert!(w.pxe_sub(9).is_none() && w.pxe_sub(10).is_none());
    // The router's plain offer is DhcpOnly: no "PXEClient" (dnsmasq without boot options).
    let mut router = w.options.clone();
    router.retain(|(c, _)| ![43, 60, 66, 67].contains(c));
    let plain = Wire {
        yiaddr: LEASED,
        siaddr: Ipv4Addr::UNSPECIFIED,
        file: [0; 128],
        options: router,
        ..w
    };
    assert_eq!(edk2_offer_type(&plain), Edk2OfferType::DhcpOnly);
}

#[test]
fn edk2_boot_server_request_from_port_4011_is_answered_to_that_port() {
    // Rule: PxeBcDhcp4Discover sends a unicast boot-server request with RemotePort 4011 and
    // listens on StationIp:4011 (ListenPoints), so the answer goes to the request's source,
    // not to port 68; it carries the boot file (PxeBcRetryBinlOffer needs option 67 or a
    // discovery option) and the xid of that request.
    let (c, mut b) = proxy();
    let mut req = ovmf_discover(CP1);
    req.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    req.set_ciaddr(LEASED);
    let source = SocketAddrV4::new(LEASED, PXE_PORT);
    let (w, to) = wire(&c, &mut b, req, ServerPort::PxeBoot, source);
    assert_eq!(to, ReplyTarget::Unicast(source));
    assert_eq!(w.xid, XID);
    assert_eq!(edk2_offer_type(&w), Edk2OfferType::ProxyPxe10);
    assert_eq!(edk2_bootfile(&w).as_deref(), Some(&b"ipxe.efi"[..]));
    assert_eq!(edk2_tftp_server(&w), Some(c.boot.tftp_server));
}

#[test]
fn proxy_never_answers_the_request_meant_for_the_router() {
    // Rule: after selecting, both clients take the ACK only from the server they chose (iPXE
    // dhcp_request_rx: server_id must match; EDK2 DhcpHandleRequest: ServerId must match, a
    // different yiaddr from it is DECLINEd), so the proxy stays out of REQUEST on port 67.
    let (c, mut b) = proxy();
    let mut req = ipxe_discover(CP1, 0);
    req.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(ip("10.0.0.254")));
    req.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(LEASED));
    assert_eq!(
        run(&c, &mut b, req, t(0)),
        Decision::Drop {
            reason: DropReason::OtherServer
        }
    );
    // And nothing of the router's job: no lease, no address.
    let (w, _) = wire(
        &c,
        &mut b,
        ovmf_discover(CP1),
        ServerPort::Dhcp,
        from_client(),
    );
    for code in [1, 3, 6, 51, 58, 59] {
        assert!(w.opt(code).is_none(), "option {code} in a proxy offer");
    }
    assert_eq!(b.iter().count(), 0);
}
