//! The DHCP decision: one checked request in, one reply plan (or a reason for silence) out.
//!
//! Three ways of serving, all from the same function:
//! - **authoritative** (UDP 67): addresses from inventory reservations, a dynamic pool for
//!   unknown machines when the policy is `discover`, the full DORA exchange, RELEASE,
//!   DECLINE (quarantine), INFORM, renew and rebind (RFC 2131 §4.3);
//! - **proxy** (UDP 67): the site's DHCP server hands out addresses; talboot answers only
//!   network-booting clients, with boot information and no `yiaddr` (PXE 2.1 §2.2.3);
//! - **PXE boot server** (UDP 4011, either mode): a client that already has an address asks
//!   for its boot file; the ACK goes unicast back to where the request came from.
//!
//! Relayed requests (giaddr set) choose their subnet by giaddr, get option 82 back verbatim and
//! are answered to the relay. What a client boots is chosen here so that iPXE always gets the
//! HTTP script (never another iPXE binary: no chain-load loop), PXE firmware gets the iPXE
//! binary for its architecture over TFTP, and UEFI HTTP boot gets it as an `http://` URL.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, SystemTime};

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use tracing::debug;

use crate::artifacts::Kind;
use crate::inventory::{Arch, HttpBoot, NetworkMode, UnknownPolicy};

use super::classify::{BootKind, ClientInfo, apply_node_hints, classify};
use super::ctx::{DecideCtx, Host, Subnet};
use super::leases::LeaseBook;
use super::reply::{Reply, ReplyTarget, reply_target};
use super::wire::{DropReason, Request, ServerPort};
use crate::store::LeaseChange;

/// PXE vendor option 43: PXE_DISCOVERY_CONTROL (6) = bit 3, "boot the file named in this
/// reply, skip boot server discovery" (PXE 2.1 §2.4.3.1).
const PXE_DISCOVERY_CONTROL: [u8; 3] = [6, 1, 0x08];
/// PXE vendor sub-option PXE_BOOT_ITEM, echoed on 4011 (PXE 2.1 §2.2.5).
const PXE_BOOT_ITEM: u8 = 71;
/// Longest boot file name that fits the 128-byte `file` field with its terminating NUL.
const FILE_FIELD_MAX: usize = 127;

/// Why a well-formed message was processed but gets no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Silence {
    /// RELEASE: the address went back to the book.
    Released,
    /// DECLINE: the address is quarantined.
    Declined,
    /// REQUEST naming another server: our offer was withdrawn.
    OtherServerSelected,
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send `reply` to `to`; persist `lease_changes` first.
    Reply {
        /// The reply.
        reply: Reply,
        /// Where to send it.
        to: ReplyTarget,
        /// Lease records changed by this decision.
        lease_changes: Vec<LeaseChange>,
        /// Who the client is (for events: arch, firmware, UUID).
        client: Box<ClientInfo>,
    },
    /// Processed; the protocol wants no reply. Persist `lease_changes`.
    Silent {
        /// Why nothing is sent.
        reason: Silence,
        /// Lease records changed by this decision.
        lease_changes: Vec<LeaseChange>,
    },
    /// Not answered.
    Drop {
        /// Why.
        reason: DropReason,
    },
}

fn drop_(reason: DropReason) -> Decision {
    Decision::Drop { reason }
}

/// Decide what to do with `req` at `now`, updating `book`.
pub fn decide(ctx: &DecideCtx, book: &mut LeaseBook, req: &Request, now: SystemTime) -> Decision {
    let msg = &req.msg;
    if msg.opcode() != Opcode::BootRequest {
        return drop_(DropReason::NotBootRequest);
    }
    let Some(kind) = msg.opts().msg_type() else {
        return drop_(DropReason::NoMessageType);
    };
    let host = ctx.hosts.get(&req.mac);
    if host.is_none() && ctx.unknown == UnknownPolicy::Ignore {
        return drop_(DropReason::UnknownMachine);
    }
    let mut client = classify(req.mac, msg);
    if let Some(h) = host {
        client = apply_node_hints(client, h.firmware, h.arch);
    }
    let subnet = match select_subnet(ctx, msg) {
        Some(s) => s,
        None => return drop_(DropReason::UnknownSubnet),
    };
    let d = Decider {
        ctx,
        req,
        host,
        subnet,
        client,
    };
    let decision = match (req.port, ctx.mode) {
        (ServerPort::PxeBoot, _) => d.boot_server(kind),
        (ServerPort::Dhcp, NetworkMode::Proxy) => d.proxy(kind),
        (ServerPort::Dhcp, NetworkMode::Authoritative) => d.authoritative(kind, book, now),
    };
    match &decision {
        Decision::Reply { reply, to, .. } => debug!(
            mac = %req.mac,
            request = ?kind,
            reply = ?reply.message.opts().msg_type(),
            yiaddr = %reply.message.yiaddr(),
            file = ?reply.message.fname_str(),
            to = ?to,
            "dhcp reply"
        ),
        Decision::Silent { reason, .. } => {
            debug!(mac = %req.mac, request = ?kind, ?reason, "dhcp handled")
        }
        Decision::Drop { reason } => {
            debug!(mac = %req.mac, request = ?kind, %reason, "dhcp dropped")
        }
    }
    decision
}

/// RFC 2131 §4.3.1: the subnet is the relay's (giaddr), else the one the client says it is in
/// (ciaddr, for renewals unicast straight to us), else the directly attached one.
fn select_subnet<'a>(ctx: &'a DecideCtx, msg: &Message) -> Option<&'a Subnet> {
    if !msg.giaddr().is_unspecified() {
        return ctx.subnet_of(msg.giaddr());
    }
    if !msg.ciaddr().is_unspecified() {
        return ctx.subnet_of(msg.ciaddr());
    }
    ctx.subnets.first()
}

fn requested_ip(msg: &Message) -> Option<Ipv4Addr> {
    match msg.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) if !ip.is_unspecified() => Some(*ip),
        _ => None,
    }
}

fn server_id(msg: &Message) -> Option<Ipv4Addr> {
    match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    }
}

fn secs(d: Duration) -> u32 {
    // 0xffffffff means "infinite" (RFC 2131 §3.3); a finite lease must stay below it.
    u32::try_from(d.as_secs())
        .unwrap_or(u32::MAX - 1)
        .min(u32::MAX - 1)
}

/// Append `?mac=..&arch=..` (or `&...` when the URL already has a query).
fn script_url(base: &str, client: &ClientInfo, arch: Arch) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}mac={}&arch={arch}", client.mac)
}

/// What the boot fields of a reply name.
enum BootFile {
    /// Nothing: the client is not network-booting.
    None,
    /// A file name (TFTP) or URL.
    File {
        /// The name or URL.
        name: String,
        /// Fetched over TFTP (siaddr and option 66 set).
        tftp: bool,
    },
    /// Nothing, although the client asked: nothing it may boot exists for it (the reason).
    Refused(String),
}

struct Decider<'a> {
    ctx: &'a DecideCtx,
    req: &'a Request,
    host: Option<&'a Host>,
    subnet: &'a Subnet,
    client: ClientInfo,
}

impl Decider<'_> {
    /// Authoritative mode: which server a message is for decides first (RFC 2131 §4.3), then
    /// each message type's rules, in the method of its name.
    fn authoritative(self, kind: MessageType, book: &mut LeaseBook, now: SystemTime) -> Decision {
        let ours = server_id(&self.req.msg).is_none_or(|s| s == self.ctx.server_ip);
        match kind {
            MessageType::Discover => self.discover(book, now),
            // SELECTING another server's offer (RFC 2131 §4.3.2): withdraw ours.
            MessageType::Request if !ours => Decision::Silent {
                reason: Silence::OtherServerSelected,
                lease_changes: book.cancel_offer(self.req.mac),
            },
            MessageType::Request => self.request(book, now),
            MessageType::Decline | MessageType::Release if !ours => drop_(DropReason::OtherServer),
            MessageType::Decline => self.decline(book, now),
            MessageType::Release => self.release(book, now),
            MessageType::Inform => self.inform(),
            _ => drop_(DropReason::UnsupportedMessageType),
        }
    }

    /// A DISCOVER: offer the reservation (which must lie on the client's subnet, or the
    /// inventory and the network disagree) or a pool address, as the book allows.
    fn discover(&self, book: &mut LeaseBook, now: SystemTime) -> Decision {
        let mac = self.req.mac;
        if let Some(h) = self.host
            && !self.subnet.net.contains(&h.ip)
        {
            return drop_(DropReason::ReservationOffSubnet);
        }
        match book.offer(
            mac,
            self.subnet.net,
            self.subnet.pool,
            requested_ip(&self.req.msg),
            now,
        ) {
            Ok((ip, changes)) => self.reply(
                MessageType::Offer,
                Some((ip, self.subnet.lease_time)),
                changes,
            ),
            Err(e) => {
                debug!(%mac, error = %e, "no address to offer");
                drop_(DropReason::NoAddress)
            }
        }
    }

    /// A REQUEST addressed to us (or to no server): bind the address it names and ACK it,
    /// or NAK so that the client starts over.
    fn request(&self, book: &mut LeaseBook, now: SystemTime) -> Decision {
        let msg = &self.req.msg;
        let mac = self.req.mac;
        let ciaddr = msg.ciaddr();
        let Some(ip) = requested_ip(msg).or((!ciaddr.is_unspecified()).then_some(ciaddr)) else {
            return drop_(DropReason::NoRecord);
        };
        if !self.subnet.net.contains(&ip) {
            // The client moved to another network: tell it to start over.
            return self.nak("requested address is not on this network");
        }
        match book.bind(mac, ip, self.subnet.lease_time, now) {
            // A fresh binding has the whole lease time left; a reused one (a
            // retransmission, see `LeaseBook::bind`) what remains of it, rounded up
            // so that a retransmitted REQUEST gets the ACK it got the first time.
            Ok(changes) => {
                let left = book.remaining(ip, now);
                let left = Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0));
                self.reply(MessageType::Ack, Some((ip, left)), changes)
            }
            Err(e) => {
                debug!(%mac, %ip, error = %e, "request refused");
                self.nak(&e.to_string())
            }
        }
    }

    /// A DECLINE: the client found the address in use, so it is quarantined; nothing is
    /// answered.
    fn decline(&self, book: &mut LeaseBook, now: SystemTime) -> Decision {
        let mac = self.req.mac;
        let Some(ip) = requested_ip(&self.req.msg) else {
            return drop_(DropReason::NoRecord);
        };
        match book.decline(mac, ip, now) {
            Ok(changes) => {
                tracing::warn!(%mac, %ip, "address declined: another device is using it; quarantined");
                Decision::Silent {
                    reason: Silence::Declined,
                    lease_changes: changes,
                }
            }
            Err(_) => drop_(DropReason::NoRecord),
        }
    }

    /// A RELEASE: the client gives its address back; nothing is answered.
    fn release(&self, book: &mut LeaseBook, now: SystemTime) -> Decision {
        match book.release(self.req.mac, self.req.msg.ciaddr(), now) {
            Ok(changes) => Decision::Silent {
                reason: Silence::Released,
                lease_changes: changes,
            },
            Err(_) => drop_(DropReason::NoRecord),
        }
    }

    /// An INFORM: a client with an address configured elsewhere asks for options only, so
    /// the ACK carries no lease.
    fn inform(&self) -> Decision {
        if self.req.msg.ciaddr().is_unspecified() {
            return drop_(DropReason::NoRecord);
        }
        self.reply(MessageType::Ack, None, Vec::new())
    }

    fn proxy(self, kind: MessageType) -> Decision {
        if !self.client.boot.is_netboot() {
            return drop_(DropReason::NotNetbootClient);
        }
        match kind {
            MessageType::Discover => self.reply(MessageType::Offer, None, Vec::new()),
            // Only a REQUEST addressed to us; the others belong to the site's DHCP server.
            MessageType::Request if server_id(&self.req.msg) == Some(self.ctx.server_ip) => {
                self.reply(MessageType::Ack, None, Vec::new())
            }
            MessageType::Request | MessageType::Decline | MessageType::Release => {
                drop_(DropReason::OtherServer)
            }
            MessageType::Inform => drop_(DropReason::NotAnswered),
            _ => drop_(DropReason::UnsupportedMessageType),
        }
    }

    fn boot_server(self, kind: MessageType) -> Decision {
        if !self.client.boot.is_netboot() {
            return drop_(DropReason::NotNetbootClient);
        }
        match kind {
            MessageType::Request | MessageType::Inform => {
                self.reply(MessageType::Ack, None, Vec::new())
            }
            MessageType::Discover | MessageType::Decline | MessageType::Release => {
                drop_(DropReason::NotAnswered)
            }
            _ => drop_(DropReason::UnsupportedMessageType),
        }
    }

    /// The header every reply shares (RFC 2131 §4.3.1 table 3).
    fn base(&self, kind: MessageType) -> Message {
        let req = &self.req.msg;
        let mut m = Message::default();
        m.set_opcode(Opcode::BootReply)
            .set_htype(HType::Eth)
            .set_chaddr(req.chaddr())
            .set_xid(req.xid())
            .set_flags(req.flags())
            .set_giaddr(req.giaddr());
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(self.ctx.server_ip));
        m
    }

    fn nak(&self, why: &str) -> Decision {
        let mut m = self.base(MessageType::Nak);
        if !self.req.msg.giaddr().is_unspecified() {
            // §4.3.2: a NAK through a relay asks it to broadcast to the client.
            m.set_flags(Flags::default().set_broadcast());
        }
        m.opts_mut()
            .insert(DhcpOption::Message(why.chars().take(200).collect()));
        self.finish(m, Vec::new())
    }

    /// Build an OFFER or ACK. `yiaddr` is the address leased and the lease time it announces
    /// (None for proxy, 4011 and INFORM replies, which carry no lease).
    fn reply(
        &self,
        kind: MessageType,
        yiaddr: Option<(Ipv4Addr, Duration)>,
        changes: Vec<LeaseChange>,
    ) -> Decision {
        let req = &self.req.msg;
        let mut m = self.base(kind);
        let authoritative = !self.is_proxy_path();
        if kind == MessageType::Ack {
            m.set_ciaddr(req.ciaddr());
        }
        if let Some((ip, lease)) = yiaddr {
            m.set_yiaddr(ip);
            let lease = secs(lease);
            m.opts_mut().insert(DhcpOption::AddressLeaseTime(lease));
            m.opts_mut().insert(DhcpOption::Renewal(lease / 2));
            m.opts_mut()
                .insert(DhcpOption::Rebinding((u64::from(lease) * 7 / 8) as u32));
        }
        if authoritative {
            self.add_network_options(&mut m);
        }
        let refused = self.add_boot_options(&mut m);
        self.finish_refused(m, changes, refused)
    }

    /// A ProxyDHCP answer (port 67 in proxy mode) or a PXE boot-server answer (port 4011):
    /// boot information only, beside someone else's address lease.
    fn is_proxy_path(&self) -> bool {
        self.req.port == ServerPort::PxeBoot || self.ctx.mode == NetworkMode::Proxy
    }

    fn add_network_options(&self, m: &mut Message) {
        let s = self.subnet;
        let o = m.opts_mut();
        o.insert(DhcpOption::SubnetMask(s.net.netmask()));
        if let Some(r) = self.host.and_then(|h| h.gateway).or(s.router) {
            o.insert(DhcpOption::Router(vec![r]));
        }
        if !s.dns.is_empty() {
            o.insert(DhcpOption::DomainNameServer(s.dns.clone()));
        }
        if !s.ntp.is_empty() {
            o.insert(DhcpOption::NtpServers(s.ntp.clone()));
        }
        if let Some(d) = &s.domain {
            o.insert(DhcpOption::DomainName(d.clone()));
        }
        if let Some(h) = self.host {
            o.insert(DhcpOption::Hostname(h.name.clone()));
        }
    }

    /// The boot file for this client (see [`BootFile`]).
    fn boot_file(&self) -> BootFile {
        let c = &self.client;
        let boot = &self.ctx.boot;
        let arch = c.arch.unwrap_or(self.ctx.default_arch);
        let efi_file = match arch {
            Arch::Arm64 => &boot.arm64_file,
            Arch::Amd64 => &boot.uefi_x64_file,
        };
        let http = |path: &str| BootFile::File {
            name: format!("{}/{path}", boot.http_base.trim_end_matches('/')),
            tftp: false,
        };
        match (c.boot, self.host) {
            (BootKind::NotPxe, _) => BootFile::None,
            (BootKind::Ipxe { .. }, _) => BootFile::File {
                name: script_url(&boot.ipxe_script_url, c, arch),
                tftp: false,
            },
            (BootKind::BiosPxe | BootKind::UefiPxe | BootKind::UefiHttp, Some(h))
                if h.secure_boot =>
            {
                self.secure_boot_file(h, c.arch)
            }
            (BootKind::UefiHttp, _) if self.ctx.http_boot == HttpBoot::Uki => {
                match self.ctx.ukis.get(&arch).filter(|u| u.plain) {
                    Some(set) => http(&set.path(Kind::Uki)),
                    None => BootFile::Refused(format!(
                        "boot.httpBoot is uki but the {arch} boot set has no plain UKI; \
                         pull it (`talboot images pull`) or set `boot.httpBoot: ipxe`"
                    )),
                }
            }
            (BootKind::UefiHttp, _) => http(efi_file),
            (BootKind::BiosPxe, _) => BootFile::File {
                name: boot.bios_file.clone(),
                tftp: true,
            },
            (BootKind::UefiPxe, _) => BootFile::File {
                name: efi_file.clone(),
                tftp: true,
            },
        }
    }

    /// A `secureBoot: true` node's firmware asked for a boot file: its boot set's signed UKI
    /// (UEFI HTTP Boot: as a `.efi` URL; UEFI PXE: over TFTP), or a refusal. Never iPXE: it is
    /// not signed, and the firmware would refuse it silently.
    ///
    /// What the firmware does with it (tianocore/edk2 at edk2-stable202211, Debian 12's OVMF):
    /// an HTTP Boot offer counts only with option 60 `HTTPClient` and a boot URI, read from
    /// option 67 before the `file` field (`NetworkPkg/HttpBootDxe/HttpBootDhcp4.c`,
    /// `HttpBootParseDhcp4Packet`; the echo is added for every `UefiHttp` client in
    /// `ClientInfo::echo_vendor_class`); a UKI URL is longer than the 127 bytes of `file`, so
    /// option 67 carries it alone. An image loaded from a network device path (a MAC node)
    /// is verified as `IMAGE_FROM_REMOVABLE_MEDIA`, deny on violation
    /// (`SecurityPkg/Library/DxeImageVerificationLib/DxeImageVerificationLib.c`,
    /// `GetImageType`), for PXE and HTTP Boot alike: the signed UKI over TFTP boots, an
    /// unsigned one does not (tests/secureboot_qemu.rs).
    fn secure_boot_file(&self, h: &Host, arch: Option<Arch>) -> BootFile {
        let c = &self.client;
        let name = &h.name;
        if c.boot == BootKind::BiosPxe {
            return BootFile::Refused(format!(
                "{name} is secureBoot: true but booted legacy BIOS PXE (client arch {}): BIOS has \
                 no Secure Boot; switch the machine to UEFI",
                c.arch_code.unwrap_or(0)
            ));
        }
        let Some(arch) = arch else {
            return BootFile::Refused(format!(
                "{name} is secureBoot: true but its client architecture {} has no Talos Secure \
                 Boot UKI (only x64 and arm64 UEFI)",
                c.arch_code.map_or("(none)".into(), |a| a.to_string())
            ));
        };
        let Some(set) = self.ctx.ukis.get(&arch).filter(|u| u.signed) else {
            return BootFile::Refused(format!(
                "{name} is secureBoot: true but the {arch} boot set has no Secure Boot UKI; \
                 pull it with `talboot images pull` (or import the Secure Boot ISO)"
            ));
        };
        let path = set.path(Kind::SecureBootUki);
        if c.boot == BootKind::UefiHttp {
            BootFile::File {
                name: format!("{}/{path}", self.ctx.boot.http_base.trim_end_matches('/')),
                tftp: false,
            }
        } else {
            BootFile::File {
                name: path,
                tftp: true,
            }
        }
    }

    /// Fill the reply's boot fields; returns why a network-booting client gets none.
    fn add_boot_options(&self, m: &mut Message) -> Option<String> {
        let c = &self.client;
        let boot = &self.ctx.boot;
        let (file, tftp) = match self.boot_file() {
            BootFile::None => return None,
            BootFile::Refused(why) => return Some(why),
            BootFile::File { name, tftp } => (name, tftp),
        };
        if tftp {
            m.set_siaddr(boot.tftp_server);
            m.opts_mut().insert(DhcpOption::TFTPServerName(
                boot.tftp_server.to_string().into_bytes(),
            ));
        } else if self.is_proxy_path() && matches!(c.boot, BootKind::Ipxe { .. }) {
            // iPXE takes a ProxyDHCP OFFER, or the ACK to its ProxyDHCPREQUEST on 4011, only
            // when the packet "has PXE options": siaddr non-zero and a boot file (or a PXE boot
            // menu, option 43.9). Without siaddr the OFFER sends it to 4011 and every ACK there
            // is dropped; it then ends DHCP with no file ("Nothing to boot").
            // ipxe/ipxe src/net/udp/dhcp.c dhcp_has_pxeopts(), dhcp_request_rx(),
            // dhcp_proxy_rx(), at 36a4c85 (Debian 12's ipxe 1.0.0+git-20190125.36a4c85) and
            // unchanged on master (0ab2277c4). The URL is absolute, so siaddr is never used to
            // fetch it (src/core/uri.c pxe_uri()); it names our TFTP server.
            m.set_siaddr(boot.tftp_server);
        }
        if file.len() <= FILE_FIELD_MAX {
            m.set_fname_str(&file);
        }
        m.opts_mut()
            .insert(DhcpOption::BootfileName(file.into_bytes()));
        if let Some(vc) = c.echo_vendor_class() {
            m.opts_mut()
                .insert(DhcpOption::ClassIdentifier(vc.to_vec()));
            if vc == b"PXEClient" {
                m.opts_mut()
                    .insert(DhcpOption::VendorExtensions(self.pxe_vendor_options()));
            }
        }
        None
    }

    /// Option 43 for PXE clients: skip discovery and boot our file; on 4011 also echo the boot
    /// item the client asked for, which some ROMs insist on.
    fn pxe_vendor_options(&self) -> Vec<u8> {
        let mut v = PXE_DISCOVERY_CONTROL.to_vec();
        if self.req.port == ServerPort::PxeBoot
            && let Some(DhcpOption::VendorExtensions(ext)) =
                self.req.msg.opts().get(OptionCode::VendorExtensions)
            && let Some(item) = find_sub_option(ext, PXE_BOOT_ITEM)
        {
            v.extend_from_slice(&[PXE_BOOT_ITEM, item.len() as u8]);
            v.extend_from_slice(item);
        }
        v.push(255);
        v
    }

    fn finish(&self, m: Message, lease_changes: Vec<LeaseChange>) -> Decision {
        self.finish_refused(m, lease_changes, None)
    }

    fn finish_refused(
        &self,
        m: Message,
        lease_changes: Vec<LeaseChange>,
        boot_refused: Option<String>,
    ) -> Decision {
        let to = match self.req.port {
            ServerPort::PxeBoot if !self.req.source.ip().is_unspecified() => {
                ReplyTarget::Unicast(self.req.source)
            }
            ServerPort::PxeBoot if !self.req.msg.ciaddr().is_unspecified() => ReplyTarget::Unicast(
                SocketAddrV4::new(self.req.msg.ciaddr(), self.req.source.port()),
            ),
            _ => reply_target(&self.req.msg, &m, self.req.mac),
        };
        Decision::Reply {
            reply: Reply {
                message: m,
                relay_agent_info: self.req.relay_agent_info.clone(),
                boot_refused,
            },
            to,
            lease_changes,
            client: Box::new(self.client.clone()),
        }
    }
}

/// Find a TLV sub-option in an encapsulated option (43 or 175 style).
fn find_sub_option(data: &[u8], code: u8) -> Option<&[u8]> {
    super::wire::option_values(data)
        .find(|(c, _)| *c == code)
        .map(|(_, value)| value)
}
