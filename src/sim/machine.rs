//! A simulated bare-metal machine's network boot, on the wire as the real one does it:
//!
//! 1. the firmware's DHCP exchange (DISCOVER with option 93 and the `PXEClient` vendor
//!    class, OFFER, REQUEST, ACK), which names the first-stage iPXE binary;
//! 2. that binary over TFTP (RRQ with `blksize`/`tsize`, OACK, DATA/ACK lock-step);
//! 3. iPXE's own DHCP exchange (user class `iPXE`), which names the HTTP boot script;
//! 4. the scripts over HTTP, followed as iPXE would ([`super::ipxe`]): `chain` to the
//!    per-machine script, then `kernel` + `initrd` + `boot`, or `exit` to the local disk.
//!
//! Every request leaves from the machine's own loopback address once DHCP gave it one, so
//! talboot sees the source address it leased. A machine behind a relay sends its DHCP
//! requests as its relay agent would: giaddr set, one hop, from the relay's address.
//! The machine also owns its hardware facts: the disks it reports once Talos runs, shaped
//! so that its inventory entry's install disk (path or selector) is really there.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use dhcproto::v4::{Architecture, DhcpOption, Flags, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use tokio::net::UdpSocket;

use super::disks::SimDisk;
use super::ipxe::{self, Command};
use crate::inventory::size::parse_size_expr;
use crate::inventory::{
    Arch, DiskSelector, DiskType, Firmware, InstallTarget, Inventory, Mac, Node,
};
use crate::tftp::packet::{Mode, Options, Packet};

/// How long to wait for a DHCP or TFTP reply before sending again.
const RETRANSMIT: Duration = Duration::from_millis(1500);
/// Sends before giving up (firmware gives up after about four).
const ATTEMPTS: u32 = 5;
/// The block size a PXE ROM asks for on a 1500-byte MTU.
const TFTP_BLKSIZE: u16 = 1468;
/// How many `chain`s a boot may follow before it is called a loop.
const MAX_CHAINS: usize = 8;

/// Why a network boot failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BootError {
    /// A socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What the machine was doing.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No (usable) reply.
    #[error("{0}")]
    NoReply(String),
    /// The server answered with something the firmware cannot use.
    #[error("{0}")]
    Refused(String),
    /// An HTTP fetch failed.
    #[error("GET {url}: {reason}")]
    Http {
        /// What was fetched.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// A boot script could not be followed.
    #[error("script {url}: {source}")]
    Script {
        /// Where it came from.
        url: String,
        /// What is wrong with it.
        #[source]
        source: ipxe::ScriptError,
    },
}

/// An HTTP fetch of `url` that failed.
fn http_err(url: &str, e: reqwest::Error) -> BootError {
    BootError::Http {
        url: url.to_owned(),
        reason: e.to_string(),
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BootError {
    let what = what.into();
    move |source| BootError::Io { what, source }
}

/// Where talboot's servers are; the DHCP port and TFTP port are the simulation's (talboot
/// runs unprivileged), everything else the machine learns from DHCP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wire {
    /// talboot's DHCP socket.
    pub dhcp: SocketAddrV4,
    /// The TFTP port on the next-server DHCP names.
    pub(crate) tftp_port: u16,
}

/// One simulated machine: its identity and hardware as its inventory entry describes it.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Inventory name (the simulation's label; the machine itself only knows its MAC).
    pub name: String,
    /// The NIC that boots.
    pub mac: Mac,
    /// CPU architecture.
    pub arch: Arch,
    /// How the firmware network-boots.
    pub firmware: Firmware,
    /// The relay agent's address (loopback image of the relayed subnet's gateway), when the
    /// machine sits behind a DHCP relay.
    pub relay: Option<Ipv4Addr>,
    /// SMBIOS system UUID.
    pub uuid: String,
    /// Its disks, as Talos's `block.Disk` resources describe them once Talos runs.
    pub disks: Vec<SimDisk>,
}

/// How a network boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Booted {
    /// A kernel and initramfs were loaded and started.
    Kernel {
        /// The leased address.
        address: Ipv4Addr,
        /// The kernel command line the script gave.
        cmdline: String,
        /// Kernel size.
        kernel_bytes: u64,
        /// Initramfs size.
        initramfs_bytes: u64,
    },
    /// iPXE exited: the firmware boots the next device, the installed disk.
    LocalDisk {
        /// The leased address.
        address: Ipv4Addr,
    },
}

impl Booted {
    /// The address DHCP leased for this boot.
    pub fn address(&self) -> Ipv4Addr {
        match self {
            Booted::Kernel { address, .. } | Booted::LocalDisk { address } => *address,
        }
    }
}

/// What a DHCP exchange ended with.
#[derive(Debug, Clone)]
struct Ack {
    address: Ipv4Addr,
    next_server: Ipv4Addr,
    file: String,
}

impl Machine {
    /// The machine an inventory node describes; `relay` is the loopback address of its
    /// relay agent if its address is in a relayed subnet.
    pub fn from_inventory(inv: &Inventory, node: &Node, relay: Option<Ipv4Addr>) -> Self {
        let mac = node.macs[0].value;
        let m = mac.0;
        Machine {
            name: node.name.value.clone(),
            mac,
            arch: inv.arch_of(node),
            firmware: node.firmware.unwrap_or(Firmware::Uefi),
            relay,
            uuid: format!(
                "4c4c4544-0000-4000-8000-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
            disks: disks_for(&node.name.value, &node.install),
        }
    }

    /// RFC 4578 / IANA processor architecture type of this firmware.
    fn arch_code(&self) -> u16 {
        match (self.firmware, self.arch) {
            (Firmware::Bios, _) => 0,
            (Firmware::Uefi, Arch::Amd64) => 7,
            (Firmware::Uefi, Arch::Arm64) => 11,
            (Firmware::Http, Arch::Amd64) => 16,
            (Firmware::Http, Arch::Arm64) => 19,
        }
    }

    /// iPXE's `${buildarch}` and `${platform}` for the binary this firmware loads.
    fn ipxe_build(&self) -> (&'static str, &'static str) {
        match (self.firmware, self.arch) {
            (Firmware::Bios, _) => ("i386", "pcbios"),
            (_, Arch::Amd64) => ("x86_64", "efi"),
            (_, Arch::Arm64) => ("arm64", "efi"),
        }
    }

    /// One complete network boot: firmware DHCP, first stage, iPXE DHCP, scripts, images.
    pub(crate) async fn network_boot(&self, wire: Wire) -> Result<Booted, BootError> {
        let first = self.dhcp(wire, false).await?;
        if first.file.ends_with(".efi") && first.file.contains("uki") {
            return self.boot_uki(wire, &first).await;
        }
        let script_url = if first.file.starts_with("http://") {
            // UEFI HTTP boot: the firmware fetched iPXE over HTTP itself.
            self.fetch(first.address, &first.file).await?;
            self.dhcp(wire, true).await?.file
        } else {
            if first.file.is_empty() {
                return Err(BootError::Refused(format!(
                    "DHCP ACK for {} names no boot file",
                    self.mac
                )));
            }
            let tftp = SocketAddrV4::new(first.next_server, wire.tftp_port);
            self.tftp_get(first.address, tftp, &first.file).await?;
            self.dhcp(wire, true).await?.file
        };
        let ack_address = first.address;
        if !script_url.starts_with("http://") {
            return Err(BootError::Refused(format!(
                "iPXE was handed {script_url:?} instead of an HTTP script URL (a chain-load loop)"
            )));
        }
        self.run_scripts(ack_address, &script_url).await
    }

    /// The firmware loads a UKI it was offered (over HTTP Boot, or over TFTP from PXE) and
    /// starts it: kernel, initramfs and command line are sealed in the one file, so there is
    /// no iPXE, no second DHCP and no script (the firmware's own signature check is what
    /// `tests/secureboot_qemu.rs` proves on real OVMF; the stand-in UKI is not verified here).
    async fn boot_uki(&self, wire: Wire, ack: &Ack) -> Result<Booted, BootError> {
        let bytes = if ack.file.starts_with("http://") {
            self.fetch(ack.address, &ack.file).await?
        } else {
            let tftp = SocketAddrV4::new(ack.next_server, wire.tftp_port);
            self.tftp_get(ack.address, tftp, &ack.file).await?
        };
        Ok(Booted::Kernel {
            address: ack.address,
            cmdline: String::new(),
            kernel_bytes: bytes.len() as u64,
            initramfs_bytes: 0,
        })
    }

    /// A DHCP DISCOVER/OFFER/REQUEST/ACK exchange, as the firmware (or, with `ipxe`, as
    /// iPXE) sends it.
    async fn dhcp(&self, wire: Wire, ipxe: bool) -> Result<Ack, BootError> {
        let local = self.relay.unwrap_or(Ipv4Addr::LOCALHOST);
        let sock = UdpSocket::bind(SocketAddrV4::new(local, 0))
            .await
            .map_err(io(format!("bind a DHCP socket on {local}")))?;
        let xid: u32 = rand_u32(self.mac, ipxe);
        let discover = self.dhcp_message(xid, MessageType::Discover, ipxe, None);
        let offer = self
            .exchange(&sock, wire.dhcp, &discover, xid, MessageType::Offer)
            .await?;
        let server_id = match offer.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => *ip,
            _ => {
                return Err(BootError::Refused(
                    "OFFER without a server identifier".into(),
                ));
            }
        };
        let request = self.dhcp_message(
            xid,
            MessageType::Request,
            ipxe,
            Some((offer.yiaddr(), server_id)),
        );
        let ack = self
            .exchange(&sock, wire.dhcp, &request, xid, MessageType::Ack)
            .await?;
        let file = ack
            .fname_str()
            .and_then(Result::ok)
            // The field is NUL-terminated on the wire; the decoder keeps the NUL.
            .map(|f| f.trim_end_matches('\0').to_owned())
            .filter(|f| !f.is_empty())
            .or_else(|| match ack.opts().get(OptionCode::BootfileName) {
                Some(DhcpOption::BootfileName(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .unwrap_or_default();
        let next_server = match (ack.siaddr(), ack.opts().get(OptionCode::TFTPServerName)) {
            (s, _) if !s.is_unspecified() => s,
            (_, Some(DhcpOption::TFTPServerName(n))) => {
                String::from_utf8_lossy(n).parse().unwrap_or(server_id)
            }
            _ => server_id,
        };
        Ok(Ack {
            address: ack.yiaddr(),
            next_server,
            file,
        })
    }

    fn dhcp_message(
        &self,
        xid: u32,
        kind: MessageType,
        ipxe: bool,
        request: Option<(Ipv4Addr, Ipv4Addr)>,
    ) -> Message {
        let giaddr = self.relay.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let mut msg = Message::new_with_id(
            xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            giaddr,
            &self.mac.0,
        );
        // PXE ROMs ask for broadcast replies: they cannot take unicast before configuring IP.
        msg.set_flags(Flags::default().set_broadcast());
        if self.relay.is_some() {
            msg.set_hops(1);
        }
        let arch = self.arch_code();
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        opts.insert(DhcpOption::MaxMessageSize(1472));
        opts.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(
            arch,
        )));
        let class = if self.firmware == Firmware::Http {
            format!("HTTPClient:Arch:{arch:05}:UNDI:003016")
        } else {
            format!("PXEClient:Arch:{arch:05}:UNDI:003016")
        };
        opts.insert(DhcpOption::ClassIdentifier(class.into_bytes()));
        let mut uuid = vec![0u8];
        uuid.extend(uuid_bytes(&self.uuid));
        opts.insert(DhcpOption::ClientMachineIdentifier(uuid));
        opts.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::DomainName,
            OptionCode::TFTPServerName,
            OptionCode::BootfileName,
        ]));
        if ipxe {
            opts.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
        }
        if let Some((ip, server)) = request {
            opts.insert(DhcpOption::RequestedIpAddress(ip));
            opts.insert(DhcpOption::ServerIdentifier(server));
        }
        msg
    }

    /// Sends `msg` until a reply of `want` for `xid` and this MAC arrives.
    async fn exchange(
        &self,
        sock: &UdpSocket,
        server: SocketAddrV4,
        msg: &Message,
        xid: u32,
        want: MessageType,
    ) -> Result<Message, BootError> {
        let bytes = msg
            .to_vec()
            .map_err(|e| BootError::Refused(format!("cannot encode DHCP message: {e}")))?;
        let mut buf = vec![0u8; 1500];
        for _ in 0..ATTEMPTS {
            sock.send_to(&bytes, server)
                .await
                .map_err(io(format!("send DHCP to {server}")))?;
            let deadline = tokio::time::Instant::now() + RETRANSMIT;
            loop {
                let got = tokio::time::timeout_at(deadline, sock.recv_from(&mut buf)).await;
                let Ok(got) = got else { break };
                let (n, _) = got.map_err(io("receive DHCP"))?;
                let Ok(reply) = Message::decode(&mut Decoder::new(&buf[..n])) else {
                    continue;
                };
                if reply.xid() != xid || reply.chaddr().get(..6) != Some(&self.mac.0[..]) {
                    continue;
                }
                match reply.opts().msg_type() {
                    Some(t) if t == want => return Ok(reply),
                    Some(MessageType::Nak) => {
                        return Err(BootError::Refused(format!(
                            "DHCP NAK for {}: {}",
                            self.mac,
                            match reply.opts().get(OptionCode::Message) {
                                Some(DhcpOption::Message(m)) => m.clone(),
                                _ => "no reason given".into(),
                            }
                        )));
                    }
                    _ => continue,
                }
            }
        }
        Err(BootError::NoReply(format!(
            "no DHCP {want:?} for {} from {server} after {ATTEMPTS} tries",
            self.mac
        )))
    }

    /// Reads `file` from the TFTP server at `server` into memory, from `local`.
    async fn tftp_get(
        &self,
        local: Ipv4Addr,
        server: SocketAddrV4,
        file: &str,
    ) -> Result<Vec<u8>, BootError> {
        let sock = UdpSocket::bind(SocketAddrV4::new(local, 0))
            .await
            .map_err(io(format!("bind a TFTP socket on {local}")))?;
        let mut transfer = TftpRead::new(file, server);
        let mut buf = vec![0u8; 65536];
        let mut peer: Option<SocketAddr> = None;
        let mut dest = SocketAddr::V4(server);
        let mut tries = 0;
        loop {
            // The request, the ACK of what just arrived, or a retransmission of either.
            sock.send_to(&transfer.last_sent, dest)
                .await
                .map_err(io(format!("send TFTP to {dest}")))?;
            let got = tokio::time::timeout(RETRANSMIT, sock.recv_from(&mut buf)).await;
            let (n, from) = match got {
                Err(_) => {
                    tries += 1;
                    if tries >= ATTEMPTS {
                        return Err(BootError::NoReply(format!(
                            "TFTP {file} from {server}: no reply after {ATTEMPTS} tries"
                        )));
                    }
                    continue;
                }
                Ok(r) => r.map_err(io("receive TFTP"))?,
            };
            // The first reply fixes the server's transfer ID (RFC 1350 §4).
            if peer.is_some_and(|p| p != from) {
                continue;
            }
            let packet = match Packet::parse(&buf[..n]) {
                Ok(p) => p,
                Err(_) => continue,
            };
            peer = Some(from);
            dest = from;
            tries = 0;
            if transfer.on_packet(packet)? {
                sock.send_to(&transfer.last_sent, dest)
                    .await
                    .map_err(io(format!("send TFTP to {dest}")))?;
                return Ok(transfer.data);
            }
        }
    }

    /// GETs `url` from `local`; returns the body.
    async fn fetch(&self, local: Ipv4Addr, url: &str) -> Result<Vec<u8>, BootError> {
        let resp = self.get(local, url).await?;
        let body = resp.bytes().await.map_err(|e| http_err(url, e))?;
        Ok(body.to_vec())
    }

    /// GETs `url` from `local` and returns how many bytes the body had, without keeping it:
    /// a kernel or an initramfs is only counted, and a rack powered on at once held every
    /// machine's whole initramfs (8 MiB each) in the simulation's memory at the same time.
    async fn fetch_len(&self, local: Ipv4Addr, url: &str) -> Result<u64, BootError> {
        let mut resp = self.get(local, url).await?;
        let mut len = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| http_err(url, e))? {
            len += chunk.len() as u64;
        }
        Ok(len)
    }

    /// The response to a GET of `url` from `local`, when it succeeded.
    async fn get(&self, local: Ipv4Addr, url: &str) -> Result<reqwest::Response, BootError> {
        let client = reqwest::Client::builder()
            .local_address(IpAddr::V4(local))
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .user_agent("iPXE/1.21.1+ (talboot simulation)")
            // The simulated firmware fetches plain http:// only; without this each client
            // built loaded the system's root certificates (a fifth of the simulation's CPU
            // when a 1,000-node rack boots at once, measured with perf).
            .tls_certs_only(Vec::new())
            .build()
            .map_err(|e| http_err(url, e))?;
        let resp = client.get(url).send().await.map_err(|e| http_err(url, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(BootError::Http {
                url: url.to_owned(),
                reason: format!("HTTP {status}"),
            });
        }
        Ok(resp)
    }

    /// Follows the boot scripts from `url` as iPXE does.
    async fn run_scripts(&self, address: Ipv4Addr, url: &str) -> Result<Booted, BootError> {
        let (buildarch, platform) = self.ipxe_build();
        let settings: ipxe::Settings = [
            ("netX/mac", self.mac.to_string()),
            ("netX/mac:hexhyp", self.mac.to_string().replace(':', "-")),
            ("net0/mac", self.mac.to_string()),
            ("net0/mac:hexhyp", self.mac.to_string().replace(':', "-")),
            ("buildarch", buildarch.to_owned()),
            ("platform", platform.to_owned()),
            ("uuid", self.uuid.clone()),
            ("ip", address.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut url = url.to_owned();
        let mut kernel: Option<(u64, String)> = None;
        let mut initramfs: Option<u64> = None;
        for _ in 0..MAX_CHAINS {
            let body = self.fetch(address, &url).await?;
            let text = String::from_utf8_lossy(&body);
            let commands =
                ipxe::commands(&text, &settings).map_err(|source| BootError::Script {
                    url: url.clone(),
                    source,
                })?;
            let mut next = None;
            for c in commands {
                match c {
                    Command::Chain { url } => next = Some(url),
                    Command::Kernel { url, cmdline } => {
                        kernel = Some((self.fetch_len(address, &url).await?, cmdline));
                    }
                    Command::Initrd { url } => {
                        initramfs = Some(self.fetch_len(address, &url).await?);
                    }
                    Command::Boot => {
                        let (Some((kernel_bytes, cmdline)), Some(initramfs_bytes)) =
                            (kernel.take(), initramfs.take())
                        else {
                            return Err(BootError::Refused(format!(
                                "{url}: `boot` without a kernel and an initrd"
                            )));
                        };
                        return Ok(Booted::Kernel {
                            address,
                            cmdline,
                            kernel_bytes,
                            initramfs_bytes,
                        });
                    }
                    Command::Exit => return Ok(Booted::LocalDisk { address }),
                    Command::Echo(line) => tracing::debug!(machine = %self.name, "iPXE: {line}"),
                }
            }
            match next {
                Some(n) => url = n,
                None => {
                    return Err(BootError::Refused(format!(
                        "{url}: the script ended without booting, chaining or exiting"
                    )));
                }
            }
        }
        Err(BootError::Refused(format!(
            "more than {MAX_CHAINS} chained scripts from {url}: a chain-load loop"
        )))
    }
}

/// A transaction ID; distinct per machine and stage, fresh per call.
fn rand_u32(mac: Mac, ipxe: bool) -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        let m = mac.0;
        return u32::from_be_bytes([m[2], m[3], m[4], m[5] ^ u8::from(ipxe)]);
    }
    u32::from_ne_bytes(b)
}

fn uuid_bytes(uuid: &str) -> Vec<u8> {
    let hex: String = uuid.chars().filter(char::is_ascii_hexdigit).collect();
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

const GB: u64 = 1_000_000_000;

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The disk a kernel would name `dev` (`nvme0n1`, `sdb`, `vda`, `mmcblk0`), with plausible
/// facts for its bus.
fn disk_named(dev: &str, serial: &str) -> SimDisk {
    let index = |s: &str| s.chars().next().map(|c| c as u8);
    if let Some(n) = dev
        .strip_prefix("nvme")
        .and_then(|r| r.strip_suffix("n1"))
        .and_then(|n| n.parse().ok())
    {
        SimDisk::nvme(n, "SAMSUNG MZVL2512HCJQ-00B00", serial, 512_110_190_592)
    } else if let Some(n) = dev.strip_prefix("mmcblk").and_then(|n| n.parse().ok()) {
        SimDisk::mmc(n, serial, 64 * GB)
    } else if let Some(c) = dev
        .strip_prefix("sd")
        .and_then(index)
        .filter(u8::is_ascii_lowercase)
    {
        SimDisk::sata(
            c - b'a',
            "INTEL SSDSC2KB480G8",
            serial,
            480_103_981_056,
            false,
        )
    } else if let Some(c) = dev
        .strip_prefix("vd")
        .and_then(index)
        .filter(u8::is_ascii_lowercase)
    {
        SimDisk::virtio(c - b'a', serial, 480 * GB)
    } else {
        SimDisk::sata(0, "INTEL SSDSC2KB480G8", serial, 480_103_981_056, false).renamed(dev)
    }
}

/// The client's side of one RFC 1350 read (with the RFC 2347 options talboot's server
/// answers): what to send next and what has arrived, kept apart from the socket so that
/// [`Machine::tftp_get`]'s loop only sends, waits and retransmits.
struct TftpRead<'a> {
    file: &'a str,
    server: SocketAddrV4,
    /// The block size the server agreed to (512 without an OACK).
    blksize: usize,
    /// The next DATA block wanted.
    expected: u16,
    /// The file so far.
    data: Vec<u8>,
    /// The packet to (re)send: the RRQ, then the ACK of the last block received.
    last_sent: Vec<u8>,
}

impl<'a> TftpRead<'a> {
    /// A read of `file` that starts with an RRQ asking for talboot's block size and the size.
    fn new(file: &'a str, server: SocketAddrV4) -> Self {
        let rrq = Packet::Rrq {
            filename: file.to_owned(),
            mode: Mode::Octet,
            options: Options {
                blksize: Some(TFTP_BLKSIZE),
                tsize: Some(0),
                ..Options::default()
            },
        }
        .to_bytes();
        Self {
            file,
            server,
            blksize: 512,
            expected: 1,
            data: Vec::new(),
            last_sent: rrq,
        }
    }

    /// Takes one packet from the server: true when the file is complete (a short block, whose
    /// ACK is `last_sent`); an ERROR or anything a server does not send refuses the read.
    fn on_packet(&mut self, packet: Packet) -> Result<bool, BootError> {
        let (file, server) = (self.file, self.server);
        match packet {
            Packet::Oack { options } => {
                self.blksize = usize::from(options.blksize.unwrap_or(512));
                self.last_sent = Packet::Ack { block: 0 }.to_bytes();
            }
            Packet::Data { block, data: chunk } if block == self.expected => {
                self.data.extend_from_slice(&chunk);
                self.last_sent = Packet::Ack { block }.to_bytes();
                self.expected = self.expected.wrapping_add(1);
                return Ok(chunk.len() < self.blksize);
            }
            // A duplicate: our ACK was lost; the caller's resend repeats it.
            Packet::Data { .. } => {}
            Packet::Error { code, message } => {
                return Err(BootError::Refused(format!(
                    "TFTP {file} from {server}: error {code:?}: {message}"
                )));
            }
            other => {
                return Err(BootError::Refused(format!(
                    "TFTP {file} from {server}: unexpected {other:?}"
                )));
            }
        }
        Ok(false)
    }
}

/// The disks a machine reports: its install disk as the inventory describes it (a device
/// path, a `/dev/disk/...` link of one of its disks, or one disk matching the selector as
/// Talos matches it) and a second drive that is *not* it, so the provisioner's disk check
/// has a real choice to make.
pub(crate) fn disks_for(name: &str, target: &InstallTarget) -> Vec<SimDisk> {
    let serial = |n: u8| format!("S{:08X}{n}", fnv(name) as u32);
    match target {
        InstallTarget::Disk(path) => disks_for_path(path, &serial(0), &serial(1)),
        InstallTarget::Selector(sel) => disks_for_selector(sel, &serial(0), &serial(1)),
    }
}

/// The second drive of a machine whose install disk is given by path: an NVMe data disk.
fn data_disk(index: u8, serial: &str) -> SimDisk {
    SimDisk::nvme(
        index,
        "SAMSUNG MZQL21T9HCJR-00A07",
        serial,
        1_920_383_410_176,
    )
}

/// For `installDisk`: the disk with that device name, or the boot SSD carrying that udev
/// link, then a data disk under the other NVMe name.
fn disks_for_path(path: &str, serial_0: &str, serial_1: &str) -> Vec<SimDisk> {
    let mut install = match path.strip_prefix("/dev/disk/") {
        // A udev link: the boot SSD carries it.
        Some(_) => {
            let mut d = disk_named("sda", serial_0);
            d.spec.symlinks.push(path.to_owned());
            d.spec.symlinks.sort();
            d
        }
        None => disk_named(path.trim_start_matches("/dev/"), serial_0),
    };
    install.spec.model = install.spec.model.trim().to_owned();
    let other = if install.id == "nvme1n1" { 0 } else { 1 };
    vec![install, data_disk(other, serial_1)]
}

/// For `diskSelector`: a disk that meets every criterion, and before it (so names are not
/// what decides) one that fails them.
fn disks_for_selector(sel: &DiskSelector, serial_0: &str, serial_1: &str) -> Vec<SimDisk> {
    let expr = sel.size.as_deref().and_then(|s| parse_size_expr(s).ok());
    let (size, other_size) = selector_sizes(expr);
    let serial_0 = sel
        .serial
        .clone()
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('*', "0"))
        .unwrap_or_else(|| serial_0.to_owned());
    let model = sel
        .model
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| m.replace('*', " 500GB"))
        .unwrap_or_else(|| "Samsung SSD 980 PRO 500GB".into());
    let mut install = disk_of_type(sel.disk_type, 1, &model, &serial_0, size);
    if let Some(p) = sel.bus_path.as_deref().filter(|p| !p.is_empty()) {
        install.spec.bus_path = p.replace('*', "0");
    }
    if let Some(p) = sel.wwid.as_deref().filter(|p| !p.is_empty()) {
        install.spec.wwid = p.replace('*', "0");
    }
    // With a size the other drive fails, it can be of the same kind (two NVMe drives
    // whose names swap); otherwise it must fail the type.
    let other_kind = match sel.disk_type {
        t if expr.is_some() => t,
        Some(DiskType::Ssd) => Some(DiskType::Hdd),
        Some(DiskType::Hdd) => Some(DiskType::Nvme),
        Some(DiskType::Nvme | DiskType::Sd) => Some(DiskType::Ssd),
        None => None,
    };
    // The other drive enumerates first, to show names are not what decides.
    let other = disk_of_type(
        other_kind,
        0,
        "WDC WDS200T1X0E-00AFY0",
        serial_1,
        other_size,
    );
    vec![other, install]
}

/// A size the selector's `size` holds for the install disk and one it does not for the
/// other drive (500 GB and 2000 GB without a size).
fn selector_sizes(expr: Option<crate::inventory::size::SizeExpr>) -> (u64, u64) {
    let candidates = |b: u64| {
        [
            500 * GB,
            b,
            b / 2,
            b.saturating_mul(2),
            b + 1,
            b.saturating_sub(1),
        ]
    };
    let size = expr
        .and_then(|e| {
            candidates(e.bytes)
                .into_iter()
                .find(|&c| c > 0 && e.holds(c))
        })
        .unwrap_or(500 * GB);
    // The other drive fails every criterion the selector has.
    let other_size = expr
        .and_then(|e| {
            candidates(e.bytes)
                .into_iter()
                .find(|&c| c > 0 && !e.holds(c))
        })
        .unwrap_or(2000 * GB);
    (size, other_size)
}

/// A disk of Talos's `type`: nvme and sd are transports, hdd/ssd only (not) rotational.
fn disk_of_type(
    kind: Option<DiskType>,
    index: u8,
    model: &str,
    serial: &str,
    size: u64,
) -> SimDisk {
    match kind {
        Some(DiskType::Nvme) => SimDisk::nvme(index, model, serial, size),
        Some(DiskType::Sd) => {
            let mut d = SimDisk::mmc(index, serial, size);
            d.spec.model = model.to_owned();
            d
        }
        Some(DiskType::Hdd) => SimDisk::sata(index, model, serial, size, true),
        Some(DiskType::Ssd) | None => SimDisk::sata(index, model, serial, size, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::DiskSelector;
    use crate::provision::disks::choose_install_disk;
    use crate::sim::disks::talos_install_disk;
    use crate::store::DiskFacts;
    use crate::talos::client::CosiDisk;

    /// The `machine.install` section talboot renders for a target (render.rs `node_patch`).
    fn install_yaml(t: &InstallTarget) -> yaml_serde::Value {
        let text = match t {
            InstallTarget::Disk(p) => format!("disk: {p}"),
            InstallTarget::Selector(s) => {
                let mut lines = vec!["diskSelector:".to_owned()];
                for (k, v) in [
                    ("model", s.model.clone()),
                    ("serial", s.serial.clone()),
                    ("size", s.size.clone()),
                    ("type", s.disk_type.map(|t| t.as_str().to_owned())),
                    ("wwid", s.wwid.clone()),
                    ("busPath", s.bus_path.clone()),
                ] {
                    if let Some(v) = v {
                        lines.push(format!("  {k}: {v:?}"));
                    }
                }
                lines.join("\n")
            }
        };
        yaml_serde::from_str(&text).unwrap()
    }

    #[test]
    fn every_install_target_finds_exactly_its_disk_and_it_is_talos_pick() {
        let targets = [
            InstallTarget::Disk("/dev/nvme0n1".into()),
            InstallTarget::Disk("/dev/sda".into()),
            InstallTarget::Disk("/dev/vdb".into()),
            InstallTarget::Disk("/dev/disk/by-id/wwn-0x5002538e40a1b2c3".into()),
            InstallTarget::Selector(DiskSelector {
                model: Some("Samsung SSD 980 PRO*".into()),
                size: Some("<= 600GB".into()),
                disk_type: Some(DiskType::Nvme),
                ..DiskSelector::default()
            }),
            InstallTarget::Selector(DiskSelector {
                size: Some("> 1TB".into()),
                disk_type: Some(DiskType::Hdd),
                ..DiskSelector::default()
            }),
            InstallTarget::Selector(DiskSelector {
                disk_type: Some(DiskType::Ssd),
                ..DiskSelector::default()
            }),
            InstallTarget::Selector(DiskSelector {
                disk_type: Some(DiskType::Sd),
                ..DiskSelector::default()
            }),
        ];
        for t in targets {
            let disks = disks_for("n1", &t);
            let legacy: Vec<_> = disks.iter().map(|d| d.legacy(false)).collect();
            let cosi: Vec<_> = disks
                .iter()
                .map(|d| CosiDisk {
                    id: d.id.clone(),
                    spec: d.spec.clone(),
                })
                .collect();
            let facts = DiskFacts::collect(&legacy, &cosi);
            let chosen = choose_install_disk(&t, &facts);
            let talos = talos_install_disk(&install_yaml(&t), &disks);
            assert!(chosen.is_ok(), "{t}: {chosen:?}");
            assert_eq!(chosen.ok(), talos.ok(), "{t}");
        }
        let sel = InstallTarget::Selector(DiskSelector {
            model: Some("Samsung SSD 980 PRO*".into()),
            size: Some("<= 600GB".into()),
            disk_type: Some(DiskType::Nvme),
            ..DiskSelector::default()
        });
        let disks = disks_for("n1", &sel);
        assert_eq!(
            talos_install_disk(&install_yaml(&sel), &disks).unwrap(),
            "/dev/nvme1n1"
        );
    }

    #[test]
    fn firmware_sends_its_architecture_and_vendor_class() {
        let m = Machine {
            name: "n".into(),
            mac: Mac([0x3c, 0xec, 0xef, 0x20, 0, 2]),
            arch: Arch::Amd64,
            firmware: Firmware::Bios,
            relay: Some(Ipv4Addr::new(127, 0, 1, 1)),
            uuid: "4c4c4544-0000-4000-8000-3cecef200002".into(),
            disks: Vec::new(),
        };
        let msg = m.dhcp_message(7, MessageType::Discover, false, None);
        assert_eq!(msg.giaddr(), Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(msg.hops(), 1);
        assert_eq!(
            msg.opts().get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(
                b"PXEClient:Arch:00000:UNDI:003016".to_vec()
            ))
        );
        assert!(msg.opts().get(OptionCode::UserClass).is_none());
        let ipxe = m.dhcp_message(7, MessageType::Discover, true, None);
        assert_eq!(
            ipxe.opts().get(OptionCode::UserClass),
            Some(&DhcpOption::UserClass(b"iPXE".to_vec()))
        );
        assert_eq!(m.ipxe_build(), ("i386", "pcbios"));
    }
}
