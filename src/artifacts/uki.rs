//! Reading a unified kernel image (UKI): what its PE/COFF file says about itself, so the
//! catalog can record it and `images list`, `serve` and the provisioner can use it without
//! parsing again. Pure and bounded: bytes (or a seekable reader) in, [`UkiFacts`] or a typed
//! [`UkiError`] out; nothing here panics on malformed input, and only the headers, the
//! Certificate Table and the small text sections are read, never the kernel or initramfs.
//!
//! Where the facts sit:
//! - The Authenticode signature: the PE optional header's data directory 4 (Certificate
//!   Table, whose "address" is a file offset, not an RVA) points at a list of `WIN_CERTIFICATE`
//!   entries, each 8-byte aligned (Microsoft PE Format, "The Attribute Certificate Table
//!   (Image Only)"); a `WIN_CERT_TYPE_PKCS_SIGNED_DATA` (2) entry holds a PKCS#7 / CMS
//!   `ContentInfo` of type `signedData` (RFC 5652 sections 3 and 5) whose one `SignerInfo`
//!   names its certificate by issuer and serial number (Authenticode: "Windows Authenticode
//!   Portable Executable Signature Format", SignerInfo). The signer is that certificate.
//! - `.pcrpkey`: the PEM public key systemd-stub copies to `/.extra/tpm2-pcr-public-key.pem`
//!   (systemd's UKI specification `docs/UKI.md`, systemd-stub(7) "Initrd Resources"; siderolabs/talos v1.14.0-rc.1
//!   `internal/pkg/uki/generate.go` `generatePCRPublicKey`). Talos's `SecurityState` reports
//!   `pcrSigningKeyFingerprint` as SHA-256 over the DER inside that PEM block, uppercase hex
//!   pairs joined by `:` (v1.14.0-rc.1 `internal/app/machined/pkg/controllers/runtime/
//!   security_state.go`, `x509CertFingerprint`); [`fingerprint`] is the same format, so the
//!   two compare as strings.
//! - `.osrel`: an os-release file; its `VERSION_ID` is the Talos version for Talos's UKIs
//!   (`generateOSRel`).

use std::io::{Read, Seek};

use object::pe;
use object::pe::{ImageNtHeaders32, ImageNtHeaders64};
use object::read::pe::ImageNtHeaders;
use object::{LittleEndian as LE, ReadRef};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use x509_parser::asn1_rs::{Any, Class, FromBer, Tag};
use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};

/// The largest Certificate Table read; real ones hold a few KiB (a signature and a chain).
pub const MAX_CERTIFICATE_TABLE: u64 = 1 << 20;
/// The largest `.pcrpkey` or `.osrel` section read (a PEM key or an os-release file).
pub const MAX_TEXT_SECTION: u64 = 64 << 10;

/// `WIN_CERTIFICATE.wCertificateType` of an Authenticode PKCS#7 SignedData.
const WIN_CERT_TYPE_PKCS_SIGNED_DATA: u16 = 2;

/// What a UKI's PE file says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UkiFacts {
    /// The architecture from the COFF header's machine (`amd64`, `arm64`, or
    /// `machine 0x....` for others).
    pub arch: String,
    /// The section names in table order (`.linux`, `.initrd`, `.cmdline`, `.osrel`, ...).
    pub sections: Vec<String>,
    /// The Authenticode signer; `None` when the file is unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<Signer>,
    /// The `.pcrpkey` fingerprint in Talos's format; `None` without that section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcr_key_fingerprint: Option<String>,
    /// `VERSION_ID` of the `.osrel` section (Talos writes its version there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl UkiFacts {
    /// Whether the file has the section a UKI is made of (the kernel).
    pub fn has_section(&self, name: &str) -> bool {
        self.sections.iter().any(|s| s == name)
    }
}

/// The certificate an Authenticode signature was made with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    /// The certificate's subject, e.g. `CN=Talos UKI Signing Key`.
    pub subject: String,
    /// SHA-256 of the certificate's DER, uppercase hex pairs joined by `:` (as
    /// `openssl x509 -fingerprint -sha256` prints it).
    pub sha256_fingerprint: String,
}

/// Why a file could not be read as a UKI.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    /// The file could not be read.
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    /// Not a PE/COFF image at all.
    #[error("is not a PE/COFF image (an EFI program starts with MZ and a PE header)")]
    NotPe,
    /// A PE/COFF image whose headers are malformed.
    #[error("is not a valid PE/COFF image ({0})")]
    Pe(object::read::Error),
    /// The reader failed below the PE parser (a file read error through the cache).
    #[error("cannot read it (read error or unknown length)")]
    Unreadable,
    /// A section's data or the Certificate Table lies past the end of the file.
    #[error("is cut short: {what} ends at byte {end} but the file has {len} bytes")]
    Truncated {
        /// Which part.
        what: String,
        /// Where it should end.
        end: u64,
        /// The file's length.
        len: u64,
    },
    /// A part is larger than any real UKI's.
    #[error("has a {what} of {size} bytes (at most {max} are read)")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Its size.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// The Certificate Table's entries do not fit together.
    #[error("has a malformed Certificate Table ({0})")]
    CertificateTable(&'static str),
    /// The PKCS#7 SignedData is malformed.
    #[error("has a malformed Authenticode signature (reading {0})")]
    Signature(&'static str),
    /// The signature names a certificate it does not carry, or that does not parse.
    #[error("has an Authenticode signature whose signer certificate {0}")]
    SignerCertificate(&'static str),
    /// `.pcrpkey` holds no PEM block.
    #[error("has a .pcrpkey section that is not a PEM block")]
    PcrKey,
}

impl From<object::read::Error> for UkiError {
    fn from(e: object::read::Error) -> Self {
        UkiError::Pe(e)
    }
}

/// Why a readable UKI is not taken for a boot set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `.linux` section: some other EFI program.
    #[error("has no .linux section, so it is not a unified kernel image")]
    NotUki,
    /// The Secure Boot slot needs a signed file.
    #[error("carries no Authenticode signature, which Secure Boot firmware refuses")]
    Unsigned,
    /// Built for another architecture than the set's.
    #[error("is built for {found}, not {expected}")]
    WrongArch {
        /// What the PE header says.
        found: String,
        /// The set's architecture.
        expected: String,
    },
}

/// Whether `facts` may fill a set's UKI slot of architecture `arch`; `signed` for the Secure
/// Boot slot.
pub fn check(facts: &UkiFacts, signed: bool, arch: &str) -> Result<(), Refusal> {
    if !facts.has_section(".linux") {
        return Err(Refusal::NotUki);
    }
    if facts.arch != arch {
        return Err(Refusal::WrongArch {
            found: facts.arch.clone(),
            expected: arch.to_string(),
        });
    }
    if signed && facts.signer.is_none() {
        return Err(Refusal::Unsigned);
    }
    Ok(())
}

/// SHA-256 of `der` as uppercase hex pairs joined by `:` (Talos's `x509CertFingerprint`).
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The fingerprint of the first PEM block in `text` (Go's `pem.Decode` skips what comes
/// before it, and systemd-stub hands the section over as is, padding included).
pub fn pem_fingerprint(text: &[u8]) -> Option<String> {
    let start = text.windows(11).position(|w| w == b"-----BEGIN ")?;
    let text = &text[start..];
    let end_marker = text.windows(9).position(|w| w == b"-----END ")?;
    let line_end = text[end_marker..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(text.len(), |i| end_marker + i + 1);
    let block = pem::parse(&text[..line_end]).ok()?;
    Some(fingerprint(block.contents()))
}

/// Read the facts of a UKI held in memory.
pub fn inspect(bytes: &[u8]) -> Result<UkiFacts, UkiError> {
    inspect_data(bytes)
}

/// Read the facts of a UKI from a seekable reader (a file), reading only what is needed.
pub fn inspect_reader<R: Read + Seek>(reader: R) -> Result<UkiFacts, UkiError> {
    let cache = object::read::ReadCache::new(reader);
    inspect_data(&cache)
}

/// Read the facts of the UKI at `path`.
pub fn inspect_file(path: &std::path::Path) -> Result<UkiFacts, UkiError> {
    inspect_reader(std::fs::File::open(path)?)
}

fn inspect_data<'d, R: ReadRef<'d>>(data: R) -> Result<UkiFacts, UkiError> {
    match object::FileKind::parse(data).map_err(|_| UkiError::NotPe)? {
        object::FileKind::Pe64 => inspect_nt::<ImageNtHeaders64, R>(data),
        object::FileKind::Pe32 => inspect_nt::<ImageNtHeaders32, R>(data),
        _ => Err(UkiError::NotPe),
    }
}

fn arch_name(machine: u16) -> String {
    match machine {
        pe::IMAGE_FILE_MACHINE_AMD64 => "amd64".into(),
        pe::IMAGE_FILE_MACHINE_ARM64 => "arm64".into(),
        m => format!("machine 0x{m:04x}"),
    }
}

/// The bytes `[offset, offset + size)`, refused past the end of the file or above `max`.
fn read_range<'d, R: ReadRef<'d>>(
    data: R,
    len: u64,
    what: impl FnOnce() -> String,
    (offset, size): (u64, u64),
    max: Option<(&'static str, u64)>,
) -> Result<&'d [u8], UkiError> {
    let end = offset.saturating_add(size);
    if end > len {
        return Err(UkiError::Truncated {
            what: what(),
            end,
            len,
        });
    }
    if let Some((what, max)) = max.filter(|(_, max)| size > *max) {
        return Err(UkiError::TooLarge { what, size, max });
    }
    data.read_bytes_at(offset, size)
        .map_err(|()| UkiError::Unreadable)
}

fn inspect_nt<'d, Pe: ImageNtHeaders, R: ReadRef<'d>>(data: R) -> Result<UkiFacts, UkiError> {
    let len = data.len().map_err(|()| UkiError::Unreadable)?;
    let dos = pe::ImageDosHeader::parse(data)?;
    let mut offset = dos.nt_headers_offset().into();
    let (nt, dirs) = Pe::parse(data, &mut offset)?;
    let table = nt.sections(data, offset)?;
    let mut facts = UkiFacts {
        arch: arch_name(nt.file_header().machine.get(LE)),
        sections: Vec::new(),
        signer: None,
        pcr_key_fingerprint: None,
        version: None,
    };
    for section in table.iter() {
        let name = String::from_utf8_lossy(section.raw_name()).into_owned();
        let raw = (
            u64::from(section.pointer_to_raw_data.get(LE)),
            u64::from(section.size_of_raw_data.get(LE)),
        );
        // The whole section must be in the file (a short download shows here), but only the
        // small text sections are read. Their size is VirtualSize when smaller than the
        // file-aligned raw size, as systemd-stub takes it.
        read_range(data, len, || format!("section {name}"), raw, None)?;
        let virtual_size = u64::from(section.virtual_size.get(LE));
        let used = (
            raw.0,
            if virtual_size > 0 {
                virtual_size.min(raw.1)
            } else {
                raw.1
            },
        );
        match name.as_str() {
            ".pcrpkey" => {
                let bytes = read_range(
                    data,
                    len,
                    || name.clone(),
                    used,
                    Some((".pcrpkey section", MAX_TEXT_SECTION)),
                )?;
                facts.pcr_key_fingerprint = Some(pem_fingerprint(bytes).ok_or(UkiError::PcrKey)?);
            }
            ".osrel" => {
                let bytes = read_range(
                    data,
                    len,
                    || name.clone(),
                    used,
                    Some((".osrel section", MAX_TEXT_SECTION)),
                )?;
                facts.version = os_release_version(bytes);
            }
            _ => {}
        }
        facts.sections.push(name);
    }
    if let Some(dir) = dirs.get(pe::IMAGE_DIRECTORY_ENTRY_SECURITY) {
        // The Certificate Table's address is a file offset (PE Format, "Optional Header Data
        // Directories"), so it is not mapped through the sections.
        let (at, size) = dir.address_range();
        let range = (u64::from(at), u64::from(size));
        let table = read_range(
            data,
            len,
            || "the Certificate Table".into(),
            range,
            Some(("Certificate Table", MAX_CERTIFICATE_TABLE)),
        )?;
        facts.signer = signer_of_table(table)?;
    }
    Ok(facts)
}

/// `VERSION_ID` of an os-release file, unquoted.
fn os_release_version(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("VERSION_ID=")?;
        let v = v.trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// The signer of the first PKCS#7 entry of a Certificate Table (`None` when it holds none).
fn signer_of_table(table: &[u8]) -> Result<Option<Signer>, UkiError> {
    let mut pos = 0usize;
    while pos < table.len() {
        let head = table
            .get(pos..pos + 8)
            .ok_or(UkiError::CertificateTable("an entry header is cut short"))?;
        let length = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let kind = u16::from_le_bytes([head[6], head[7]]);
        if length < 8 {
            return Err(UkiError::CertificateTable(
                "an entry is shorter than its header",
            ));
        }
        let body = table
            .get(pos + 8..pos.saturating_add(length))
            .ok_or(UkiError::CertificateTable("an entry runs past the table"))?;
        if kind == WIN_CERT_TYPE_PKCS_SIGNED_DATA {
            return signer_of_signed_data(body).map(Some);
        }
        // Entries start on 8-byte boundaries (PE Format, "The Attribute Certificate Table").
        pos = pos.saturating_add(length.div_ceil(8) * 8);
    }
    Ok(None)
}

/// One BER element and the bytes after it; `what` names it for the error.
fn element<'a>(input: &'a [u8], what: &'static str) -> Result<(Any<'a>, &'a [u8]), UkiError> {
    let (rest, any) = Any::from_ber(input).map_err(|_| UkiError::Signature(what))?;
    Ok((any, rest))
}

/// One element that must be a universal `tag`.
fn expect<'a>(
    input: &'a [u8],
    tag: Tag,
    what: &'static str,
) -> Result<(Any<'a>, &'a [u8]), UkiError> {
    let (any, rest) = element(input, what)?;
    if any.class() != Class::Universal || any.tag() != tag {
        return Err(UkiError::Signature(what));
    }
    Ok((any, rest))
}

/// OID 1.2.840.113549.1.7.2 (id-signedData, RFC 5652 section 5.1), content octets.
const ID_SIGNED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02];

/// The signer certificate of a PKCS#7 `ContentInfo` holding `SignedData` (RFC 5652 5.1, 5.3).
fn signer_of_signed_data(der: &[u8]) -> Result<Signer, UkiError> {
    let (info, _padding) = expect(der, Tag::Sequence, "ContentInfo")?;
    let (oid, rest) = expect(info.data, Tag::Oid, "ContentInfo.contentType")?;
    if oid.data != ID_SIGNED_DATA {
        return Err(UkiError::Signature(
            "ContentInfo.contentType (not signedData)",
        ));
    }
    let (content, _) = element(rest, "ContentInfo.content")?;
    if content.class() != Class::ContextSpecific || content.tag() != Tag(0) {
        return Err(UkiError::Signature("ContentInfo.content"));
    }
    let (signed, _) = expect(content.data, Tag::Sequence, "SignedData")?;
    let (_, rest) = expect(signed.data, Tag::Integer, "SignedData.version")?;
    let (_, rest) = expect(rest, Tag::Set, "SignedData.digestAlgorithms")?;
    let (_, mut rest) = expect(rest, Tag::Sequence, "SignedData.encapContentInfo")?;
    let mut certificates: &[u8] = &[];
    loop {
        let (any, after) = element(rest, "SignedData.signerInfos")?;
        match (any.class(), any.tag()) {
            (Class::ContextSpecific, Tag(0)) => certificates = any.data,
            (Class::ContextSpecific, Tag(1)) => {}
            (Class::Universal, Tag::Set) => {
                let (info, _) = expect(any.data, Tag::Sequence, "SignerInfo")?;
                return signer_certificate(info.data, certificates);
            }
            _ => return Err(UkiError::Signature("SignedData.signerInfos")),
        }
        rest = after;
    }
}

/// Which certificate a `SignerInfo` names (RFC 5652 5.3 `SignerIdentifier`).
enum SignerId<'a> {
    /// `issuerAndSerialNumber`: the issuer Name's content octets and the serial's.
    IssuerSerial(&'a [u8], &'a [u8]),
    /// `subjectKeyIdentifier`.
    KeyId(&'a [u8]),
}

fn signer_certificate(info: &[u8], certificates: &[u8]) -> Result<Signer, UkiError> {
    let (_, rest) = expect(info, Tag::Integer, "SignerInfo.version")?;
    let (sid, _) = element(rest, "SignerInfo.sid")?;
    let id = match (sid.class(), sid.tag()) {
        (Class::Universal, Tag::Sequence) => {
            let (issuer, rest) = expect(sid.data, Tag::Sequence, "SignerInfo.sid.issuer")?;
            let (serial, _) = expect(rest, Tag::Integer, "SignerInfo.sid.serialNumber")?;
            SignerId::IssuerSerial(issuer.data, serial.data)
        }
        (Class::ContextSpecific, Tag(0)) => SignerId::KeyId(sid.data),
        _ => return Err(UkiError::Signature("SignerInfo.sid")),
    };
    let mut rest = certificates;
    while !rest.is_empty() {
        let (any, after) = element(rest, "SignedData.certificates")?;
        let raw = &rest[..rest.len() - after.len()];
        rest = after;
        // Other CertificateChoices (attribute certificates...) are context-tagged.
        if any.class() != Class::Universal || any.tag() != Tag::Sequence {
            continue;
        }
        let Ok((_, cert)) = X509Certificate::from_der(raw) else {
            return Err(UkiError::SignerCertificate("does not parse as X.509"));
        };
        if names(&cert, &id) {
            return Ok(Signer {
                subject: cert.subject().to_string(),
                sha256_fingerprint: fingerprint(raw),
            });
        }
    }
    Err(UkiError::SignerCertificate(
        "is not among the certificates it carries",
    ))
}

/// Whether `cert` is the one `id` names.
fn names(cert: &X509Certificate<'_>, id: &SignerId<'_>) -> bool {
    match id {
        SignerId::IssuerSerial(issuer, serial) => {
            let cert_issuer = Any::from_ber(cert.issuer().as_raw()).map(|(_, a)| a.data);
            cert_issuer.is_ok_and(|i| i == *issuer) && cert.raw_serial() == *serial
        }
        SignerId::KeyId(key_id) => cert.extensions().iter().any(|e| {
            matches!(e.parsed_extension(), ParsedExtension::SubjectKeyIdentifier(k) if k.0 == *key_id)
        }),
    }
}

#[cfg(test)]
#[path = "uki_tests.rs"]
mod tests;
