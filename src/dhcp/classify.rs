//! Who is asking: PXE firmware, UEFI HTTP boot, an already running iPXE, or a plain DHCP
//! client, and for which CPU architecture.
//!
//! The inputs are the options firmware sends: 93 client system architecture (RFC 4578 §2.1,
//! IANA "Processor Architecture Types"), 60 vendor class (`PXEClient:Arch:...` or
//! `HTTPClient:Arch:...`), 77 user class (iPXE sends the bare string `iPXE`), 175 iPXE
//! encapsulated options (feature flags, version) and 97 client machine identifier (the SMBIOS
//! UUID). An iPXE client is recognised by 77 *or* 175 so that it is always handed the HTTP
//! script and never another iPXE binary: that is what prevents chain-load loops. The inventory's
//! per-node firmware hint overrides the firmware guess (RPi EEPROMs send arch 0, some UEFI
//! ROMs lie), but never hides the fact that iPXE is already running.

use std::collections::BTreeMap;

use dhcproto::v4::{DhcpOption, Message, OptionCode};

use crate::inventory::{Arch, Firmware, Mac};

/// Option code of the iPXE encapsulated options.
const OPT_IPXE: u8 = 175;

/// iPXE feature sub-option codes inside option 175 (iPXE `include/ipxe/features.h`).
mod ipxe_feature {
    pub const HTTP: u8 = 0x13;
    pub(crate) const HTTPS: u8 = 0x14;
    pub const TFTP: u8 = 0x15;
    pub const DNS: u8 = 0x17;
    pub const BZIMAGE: u8 = 0x18;
    pub const PXE: u8 = 0x21;
    pub const EFI: u8 = 0x24;
    /// iPXE version: major, minor, patch.
    pub(crate) const VERSION: u8 = 0xeb;
}

/// How the client boots, which decides what boot file it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootKind {
    /// Legacy BIOS PXE ROM: gets `undionly.kpxe` over TFTP.
    BiosPxe,
    /// UEFI PXE: gets an EFI iPXE binary over TFTP.
    UefiPxe,
    /// UEFI HTTP boot: gets the EFI iPXE binary as an `http://` URL.
    UefiHttp,
    /// iPXE is already running: gets the HTTP boot script URL.
    Ipxe {
        /// Whether this iPXE is an EFI build.
        efi: bool,
    },
    /// Not network-booting (an OS's DHCP client, e.g. Talos itself).
    NotPxe,
}

impl BootKind {
    /// True for every kind that wants boot information.
    pub(crate) fn is_netboot(self) -> bool {
        self != Self::NotPxe
    }
}

/// What iPXE told us about itself in option 175.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpxeFeatures {
    /// Every sub-option code present, with its value (feature flags carry a version byte).
    pub(crate) sub_options: BTreeMap<u8, Vec<u8>>,
}

impl IpxeFeatures {
    /// Parse the TLV sub-options of option 175, tolerating a truncated tail.
    pub fn parse(data: &[u8]) -> Self {
        let sub_options = super::wire::option_values(data)
            .map(|(code, value)| (code, value.to_vec()))
            .collect();
        Self { sub_options }
    }

    fn has(&self, code: u8) -> bool {
        self.sub_options.contains_key(&code)
    }

    /// iPXE was built with HTTP.
    pub fn http(&self) -> bool {
        self.has(ipxe_feature::HTTP)
    }
    /// iPXE was built with HTTPS.
    pub fn https(&self) -> bool {
        self.has(ipxe_feature::HTTPS)
    }
    /// iPXE was built with TFTP.
    pub fn tftp(&self) -> bool {
        self.has(ipxe_feature::TFTP)
    }
    /// iPXE was built with DNS.
    pub fn dns(&self) -> bool {
        self.has(ipxe_feature::DNS)
    }
    /// iPXE can boot Linux bzImage kernels.
    pub fn bzimage(&self) -> bool {
        self.has(ipxe_feature::BZIMAGE)
    }
    /// iPXE can load PXE images.
    pub fn pxe(&self) -> bool {
        self.has(ipxe_feature::PXE)
    }
    /// iPXE is an EFI build.
    pub fn efi(&self) -> bool {
        self.has(ipxe_feature::EFI)
    }
    /// iPXE version (major, minor, patch), when sent.
    pub fn version(&self) -> Option<(u8, u8, u8)> {
        match self.sub_options.get(&ipxe_feature::VERSION)?.as_slice() {
            [a, b, c, ..] => Some((*a, *b, *c)),
            _ => None,
        }
    }
}

/// Everything talboot learns about a client from one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// Hardware address.
    pub mac: Mac,
    /// Raw option 93 value (first architecture listed), if sent.
    pub(crate) arch_code: Option<u16>,
    /// The Talos architecture this code maps to, if any.
    pub arch: Option<Arch>,
    /// How it boots.
    pub boot: BootKind,
    /// Option 60, as sent.
    pub(crate) vendor_class: Option<Vec<u8>>,
    /// Option 77, as sent.
    pub(crate) user_class: Option<Vec<u8>>,
    /// Option 97 GUID (16 bytes after the type byte), in wire byte order.
    pub uuid: Option<[u8; 16]>,
    /// Option 175 contents, when the client is iPXE and sent them.
    pub ipxe: Option<IpxeFeatures>,
}

impl ClientInfo {
    /// The vendor class to echo in replies, as PXE 2.1 and UEFI HTTP boot require.
    pub(crate) fn echo_vendor_class(&self) -> Option<&'static [u8]> {
        match self.boot {
            BootKind::UefiHttp => Some(b"HTTPClient"),
            BootKind::BiosPxe | BootKind::UefiPxe => Some(b"PXEClient"),
            // iPXE sends PXEClient and uses the echo to recognise ProxyDHCP offers.
            BootKind::Ipxe { .. } if self.vendor_class_starts_with(b"PXEClient") => {
                Some(b"PXEClient")
            }
            BootKind::Ipxe { .. } if self.vendor_class_starts_with(b"HTTPClient") => {
                Some(b"HTTPClient")
            }
            BootKind::Ipxe { .. } | BootKind::NotPxe => None,
        }
    }

    fn vendor_class_starts_with(&self, prefix: &[u8]) -> bool {
        self.vendor_class
            .as_deref()
            .is_some_and(|v| v.starts_with(prefix))
    }
}

/// What option 93 says about the firmware: (is HTTP boot, is EFI, Talos arch).
fn arch_code_meaning(code: u16) -> (bool, bool, Option<Arch>) {
    match code {
        // x86 BIOS. Talos only ships amd64 for x86.
        0 => (false, false, Some(Arch::Amd64)),
        // EFI IA32: an x86 machine, but no 64-bit EFI binary will run on it.
        6 => (false, true, None),
        // EFI x86-64 (7) and EFI BC (9, historically used by x86-64 firmware).
        7 | 9 => (false, true, Some(Arch::Amd64)),
        // EFI ARM 32-bit: not a Talos architecture.
        10 => (false, true, None),
        11 => (false, true, Some(Arch::Arm64)),
        // HTTP boot: x86 UEFI (15), x64 UEFI (16), arm32 (18), arm64 (19).
        15 => (true, true, None),
        16 => (true, true, Some(Arch::Amd64)),
        18 => (true, true, None),
        19 => (true, true, Some(Arch::Arm64)),
        // Anything else we do not know how to boot; treat it as EFI of unknown arch.
        _ => (false, true, None),
    }
}

fn raw_option(msg: &Message, code: u8) -> Option<&[u8]> {
    match msg.opts().get(OptionCode::from(code))? {
        DhcpOption::Unknown(u) => Some(u.data()),
        _ => None,
    }
}

/// True when option 77 names iPXE, either as the bare string iPXE sends or as an RFC 3004
/// length-prefixed class list containing it.
fn user_class_is_ipxe(uc: &[u8]) -> bool {
    if uc == b"iPXE" {
        return true;
    }
    let mut i = 0;
    while i < uc.len() {
        let len = usize::from(uc[i]);
        match uc.get(i + 1..i + 1 + len) {
            Some(b"iPXE") => return true,
            Some(_) => i += 1 + len,
            None => return false,
        }
    }
    false
}

/// Classify the client that sent `msg` (whose hardware address is `mac`).
pub fn classify(mac: Mac, msg: &Message) -> ClientInfo {
    let arch_code = match msg.opts().get(OptionCode::ClientSystemArchitecture) {
        Some(DhcpOption::ClientSystemArchitecture(a)) => Some(a.0),
        _ => None,
    };
    let vendor_class = match msg.opts().get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(v)) => Some(v.clone()),
        _ => None,
    };
    let user_class = match msg.opts().get(OptionCode::UserClass) {
        Some(DhcpOption::UserClass(v)) => Some(v.clone()),
        _ => None,
    };
    let uuid = match msg.opts().get(OptionCode::ClientMachineIdentifier) {
        // RFC 4578 §2.3: type 0 followed by a 16-byte GUID.
        Some(DhcpOption::ClientMachineIdentifier(v)) if v.len() == 17 && v[0] == 0 => {
            let mut g = [0u8; 16];
            g.copy_from_slice(&v[1..]);
            // All-zero and all-ones GUIDs are placeholders some firmware sends.
            (g != [0; 16] && g != [0xff; 16]).then_some(g)
        }
        _ => None,
    };
    let ipxe = raw_option(msg, OPT_IPXE).map(IpxeFeatures::parse);

    let (arch_http, arch_efi, arch) = match arch_code {
        Some(c) => arch_code_meaning(c),
        None => (false, false, None),
    };
    let vc = vendor_class.as_deref().unwrap_or_default();
    let is_ipxe = ipxe.is_some() || user_class.as_deref().is_some_and(user_class_is_ipxe);

    let boot = if is_ipxe {
        // Option 93 is what the firmware says; the EFI feature flag only fills in when it is
        // missing.
        let efi = match arch_code {
            Some(_) => arch_efi,
            None => ipxe.as_ref().is_some_and(IpxeFeatures::efi),
        };
        BootKind::Ipxe { efi }
    } else if vc.starts_with(b"HTTPClient") || arch_http {
        BootKind::UefiHttp
    } else if vc.starts_with(b"PXEClient") || arch_code.is_some() {
        if arch_efi {
            BootKind::UefiPxe
        } else {
            BootKind::BiosPxe
        }
    } else {
        BootKind::NotPxe
    };

    ClientInfo {
        mac,
        arch_code,
        arch,
        boot,
        vendor_class,
        user_class,
        uuid,
        ipxe,
    }
}

/// Apply what the inventory says about a node over what the packet suggested: its firmware
/// hint picks the architecture family (BIOS or UEFI), its architecture picks the binary. The
/// transport is the one the client asked for, never the hint's:
/// - a UEFI HTTP-boot client (vendor class `HTTPClient`, or arch 15/16/18/19) only accepts an
///   offer that echoes `HTTPClient` and names an `http://` URI (EDK2
///   `NetworkPkg/HttpBootDxe/HttpBootDhcp4.c`, `HttpBootParseDhcp4Packet`), so turning it
///   into a PXE client with a TFTP file name makes it rediscover for ever; HTTP boot exists
///   only in UEFI, so it stays HTTP boot whatever the hint;
/// - a PXE client (`PXEClient`) is served over TFTP; a `firmware: http` hint on it means UEFI
///   (the machine may fall back to PXE, and a PXE ROM cannot fetch an `http://` file name).
///
/// A running iPXE stays iPXE (so it still gets the script, not another binary), and a plain
/// DHCP client stays a plain client (the hint is about firmware, not about the installed OS).
pub fn apply_node_hints(
    mut info: ClientInfo,
    firmware: Option<Firmware>,
    arch: Option<Arch>,
) -> ClientInfo {
    if let Some(fw) = firmware {
        info.boot = match (info.boot, fw) {
            (BootKind::Ipxe { .. }, Firmware::Bios) => BootKind::Ipxe { efi: false },
            (BootKind::Ipxe { .. }, Firmware::Uefi | Firmware::Http) => {
                BootKind::Ipxe { efi: true }
            }
            (BootKind::NotPxe, _) => BootKind::NotPxe,
            (BootKind::UefiHttp, _) => BootKind::UefiHttp,
            (BootKind::BiosPxe | BootKind::UefiPxe, Firmware::Bios) => BootKind::BiosPxe,
            (BootKind::BiosPxe | BootKind::UefiPxe, Firmware::Uefi | Firmware::Http) => {
                BootKind::UefiPxe
            }
        };
    }
    if arch.is_some() {
        info.arch = arch;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::{self, Architecture, UnknownOption};
    use std::net::Ipv4Addr;

    const MAC: Mac = Mac([0xbc, 0x24, 0x11, 0xaa, 0xbb, 0xcc]);

    fn msg(opts: Vec<DhcpOption>) -> Message {
        let mut m = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &MAC.0,
        );
        m.opts_mut()
            .insert(DhcpOption::MessageType(v4::MessageType::Discover));
        for o in opts {
            m.opts_mut().insert(o);
        }
        m
    }

    fn pxe(arch: u16) -> Vec<DhcpOption> {
        vec![
            DhcpOption::ClientSystemArchitecture(Architecture(arch)),
            DhcpOption::ClassIdentifier(
                format!("PXEClient:Arch:{arch:05}:UNDI:003016").into_bytes(),
            ),
        ]
    }

    fn http(arch: u16) -> Vec<DhcpOption> {
        vec![
            DhcpOption::ClientSystemArchitecture(Architecture(arch)),
            DhcpOption::ClassIdentifier(
                format!("HTTPClient:Arch:{arch:05}:UNDI:003016").into_bytes(),
            ),
        ]
    }

    #[test]
    fn classification_table() {
        let ipxe_175 = DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(175),
            vec![0x13, 1, 1, 0x24, 1, 1, 0xeb, 3, 1, 21, 0],
        ));
        let cases: Vec<(&str, Vec<DhcpOption>, BootKind, Option<Arch>)> = vec![
            ("bios", pxe(0), BootKind::BiosPxe, Some(Arch::Amd64)),
            ("efi ia32", pxe(6), BootKind::UefiPxe, None),
            ("efi x64", pxe(7), BootKind::UefiPxe, Some(Arch::Amd64)),
            ("efi bc", pxe(9), BootKind::UefiPxe, Some(Arch::Amd64)),
            ("efi arm32", pxe(10), BootKind::UefiPxe, None),
            ("efi arm64", pxe(11), BootKind::UefiPxe, Some(Arch::Arm64)),
            ("http x86", http(15), BootKind::UefiHttp, None),
            ("http x64", http(16), BootKind::UefiHttp, Some(Arch::Amd64)),
            (
                "http arm64",
                http(19),
                BootKind::UefiHttp,
                Some(Arch::Arm64),
            ),
            // Arch code says HTTP even when the vendor class is missing.
            (
                "http x64 no vc",
                vec![DhcpOption::ClientSystemArchitecture(Architecture(16))],
                BootKind::UefiHttp,
                Some(Arch::Amd64),
            ),
            // Vendor class says HTTPClient even without option 93.
            (
                "httpclient vc",
                vec![DhcpOption::ClassIdentifier(b"HTTPClient".to_vec())],
                BootKind::UefiHttp,
                None,
            ),
            (
                "ipxe bios user class",
                [pxe(0), vec![DhcpOption::UserClass(b"iPXE".to_vec())]].concat(),
                BootKind::Ipxe { efi: false },
                Some(Arch::Amd64),
            ),
            (
                "ipxe efi user class",
                [pxe(7), vec![DhcpOption::UserClass(b"iPXE".to_vec())]].concat(),
                BootKind::Ipxe { efi: true },
                Some(Arch::Amd64),
            ),
            (
                "ipxe rfc3004 user class",
                [pxe(11), vec![DhcpOption::UserClass(b"\x04iPXE".to_vec())]].concat(),
                BootKind::Ipxe { efi: true },
                Some(Arch::Arm64),
            ),
            (
                "ipxe option 175 only",
                vec![ipxe_175.clone()],
                BootKind::Ipxe { efi: true },
                None,
            ),
            (
                "ipxe 175 with other user class",
                [
                    pxe(0),
                    vec![DhcpOption::UserClass(b"talboot".to_vec()), ipxe_175],
                ]
                .concat(),
                BootKind::Ipxe { efi: false },
                Some(Arch::Amd64),
            ),
            ("plain dhcp client", vec![], BootKind::NotPxe, None),
            (
                "other vendor class",
                vec![DhcpOption::ClassIdentifier(b"MSFT 5.0".to_vec())],
                BootKind::NotPxe,
                None,
            ),
            (
                "user class that is not ipxe",
                vec![DhcpOption::UserClass(b"iPXEX".to_vec())],
                BootKind::NotPxe,
                None,
            ),
        ];
        for (name, opts, boot, arch) in cases {
            let info = classify(MAC, &msg(opts));
            assert_eq!(info.boot, boot, "{name}");
            assert_eq!(info.arch, arch, "{name}");
            assert_eq!(info.mac, MAC, "{name}");
        }
    }

    #[test]
    fn vendor_class_echo_follows_boot_kind() {
        assert_eq!(
            classify(MAC, &msg(pxe(7))).echo_vendor_class(),
            Some(&b"PXEClient"[..])
        );
        assert_eq!(
            classify(MAC, &msg(http(16))).echo_vendor_class(),
            Some(&b"HTTPClient"[..])
        );
        assert_eq!(classify(MAC, &msg(vec![])).echo_vendor_class(), None);
        let ipxe = [pxe(7), vec![DhcpOption::UserClass(b"iPXE".to_vec())]].concat();
        assert_eq!(
            classify(MAC, &msg(ipxe)).echo_vendor_class(),
            Some(&b"PXEClient"[..])
        );
    }

    #[test]
    fn ipxe_features_are_parsed() {
        let data = [
            0x13, 1, 1, 0x14, 1, 1, 0x24, 1, 1, 0xeb, 3, 1, 21, 0, 0xb1, 5, 1, 2,
        ];
        let f = IpxeFeatures::parse(&data);
        assert!(f.http() && f.https() && f.efi());
        assert!(!f.tftp() && !f.pxe() && !f.bzimage() && !f.dns());
        assert_eq!(f.version(), Some((1, 21, 0)));
        // The truncated bus-id tail (0xb1) is ignored rather than misread.
        assert!(!f.sub_options.contains_key(&0xb1));
    }

    #[test]
    fn uuid_from_option_97() {
        let guid: Vec<u8> = (1..=16).collect();
        let with =
            |v: Vec<u8>| classify(MAC, &msg(vec![DhcpOption::ClientMachineIdentifier(v)])).uuid;
        assert_eq!(
            with([vec![0], guid.clone()].concat()).map(|g| g.to_vec()),
            Some(guid.clone())
        );
        assert_eq!(
            with([vec![1], guid.clone()].concat()),
            None,
            "type must be 0"
        );
        assert_eq!(with(guid), None, "must be 17 bytes");
        assert_eq!(
            with([vec![0], vec![0; 16]].concat()),
            None,
            "all-zero placeholder"
        );
    }

    #[test]
    fn node_hints_override_firmware_but_not_ipxe() {
        let bios = classify(MAC, &msg(pxe(0)));
        assert_eq!(
            apply_node_hints(bios.clone(), Some(Firmware::Uefi), None).boot,
            BootKind::UefiPxe
        );
        // The hint picks the family, not the transport: a PXE client stays on TFTP.
        assert_eq!(
            apply_node_hints(bios.clone(), Some(Firmware::Http), None).boot,
            BootKind::UefiPxe
        );
        let arm = apply_node_hints(bios, None, Some(Arch::Arm64));
        assert_eq!((arm.boot, arm.arch), (BootKind::BiosPxe, Some(Arch::Arm64)));

        let ipxe = classify(
            MAC,
            &msg([pxe(0), vec![DhcpOption::UserClass(b"iPXE".to_vec())]].concat()),
        );
        assert_eq!(
            apply_node_hints(ipxe, Some(Firmware::Uefi), None).boot,
            BootKind::Ipxe { efi: true }
        );
        // OVMF's HTTP-boot fallback (HTTPClient:Arch:00016) on a `firmware: uefi` node
        // still gets HTTP boot: a PXE answer is one it never accepts.
        let ovmf_http = classify(MAC, &msg(http(16)));
        for fw in [Firmware::Uefi, Firmware::Bios, Firmware::Http] {
            let hinted = apply_node_hints(ovmf_http.clone(), Some(fw), None);
            assert_eq!(hinted.boot, BootKind::UefiHttp, "{fw:?}");
            assert_eq!(
                hinted.echo_vendor_class(),
                Some(&b"HTTPClient"[..]),
                "{fw:?}"
            );
        }
        let uefi_pxe = classify(MAC, &msg(pxe(7)));
        assert_eq!(
            apply_node_hints(uefi_pxe, Some(Firmware::Bios), None).boot,
            BootKind::BiosPxe
        );
        let plain = classify(MAC, &msg(vec![]));
        assert_eq!(
            apply_node_hints(plain, Some(Firmware::Http), None).boot,
            BootKind::NotPxe
        );
    }
}
