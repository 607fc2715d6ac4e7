//! Unit tests of [`super`] on PE files built here byte by byte (the real signed UKIs, built
//! with systemd's stub, objcopy and sbsign, are in `tests/images_uki.rs`).

use super::*;
use proptest::prelude::*;

/// A DER element.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// A self-signed certificate with common name `cn`.
fn cert(cn: &str) -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.self_signed(&key).unwrap().der().to_vec()
}

/// A PKCS#7 SignedData as Authenticode lays it out (RFC 5652 5.1), carrying `certs` and one
/// SignerInfo naming `signer` by issuer and serial number.
fn signed_data(certs: &[Vec<u8>], signer: &[u8]) -> Vec<u8> {
    let (_, parsed) = X509Certificate::from_der(signer).unwrap();
    let sha256 = tlv(
        0x30,
        &tlv(
            0x06,
            &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01],
        ),
    );
    let spc = tlv(
        0x30,
        &tlv(
            0x06,
            &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x01, 0x04],
        ),
    );
    let sid = tlv(
        0x30,
        &cat(&[
            parsed.issuer().as_raw().to_vec(),
            tlv(0x02, parsed.raw_serial()),
        ]),
    );
    let signer_info = tlv(
        0x30,
        &cat(&[
            tlv(0x02, &[1]),
            sid,
            sha256.clone(),
            sha256.clone(),
            tlv(0x04, b"sig"),
        ]),
    );
    let signed = tlv(
        0x30,
        &cat(&[
            tlv(0x02, &[1]),
            tlv(0x31, &sha256),
            spc,
            tlv(0xa0, &certs.concat()),
            tlv(0x31, &signer_info),
        ]),
    );
    tlv(0x30, &cat(&[tlv(0x06, ID_SIGNED_DATA), tlv(0xa0, &signed)]))
}

const PCR_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";

/// A PE32+ image for x86-64 with `sections` (name, data) and, when given, a Certificate
/// Table entry of `cert_type` holding `signature`.
fn pe(sections: &[(&str, Vec<u8>)], signature: Option<(u16, Vec<u8>)>) -> Vec<u8> {
    let mut f = vec![0u8; 0x400];
    f[0..2].copy_from_slice(b"MZ");
    f[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    f[0x40..0x44].copy_from_slice(b"PE\0\0");
    let coff = 0x44;
    f[coff..coff + 2].copy_from_slice(&pe::IMAGE_FILE_MACHINE_AMD64.to_le_bytes());
    f[coff + 2..coff + 4].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    f[coff + 16..coff + 18].copy_from_slice(&240u16.to_le_bytes());
    f[coff + 18..coff + 20].copy_from_slice(&0x22u16.to_le_bytes());
    let opt = coff + 20;
    f[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
    f[opt + 32..opt + 36].copy_from_slice(&0x1000u32.to_le_bytes()); // SectionAlignment
    f[opt + 36..opt + 40].copy_from_slice(&0x200u32.to_le_bytes()); // FileAlignment
    f[opt + 60..opt + 64].copy_from_slice(&0x400u32.to_le_bytes()); // SizeOfHeaders
    f[opt + 68..opt + 70].copy_from_slice(&10u16.to_le_bytes()); // EFI application
    f[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes());
    let mut table = opt + 240;
    let mut rva = 0x1000u32;
    for (name, data) in sections {
        let at = f.len() as u32;
        let raw = data.len().div_ceil(0x200) * 0x200;
        let mut header = [0u8; 40];
        header[..name.len()].copy_from_slice(name.as_bytes());
        header[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        header[12..16].copy_from_slice(&rva.to_le_bytes());
        header[16..20].copy_from_slice(&(raw as u32).to_le_bytes());
        header[20..24].copy_from_slice(&at.to_le_bytes());
        f[table..table + 40].copy_from_slice(&header);
        table += 40;
        rva += (raw as u32).div_ceil(0x1000) * 0x1000;
        f.extend(data);
        f.resize(at as usize + raw, 0);
    }
    if let Some((kind, sig)) = signature {
        let at = f.len() as u32;
        let length = 8 + sig.len() as u32;
        f.extend(length.to_le_bytes());
        f.extend(0x0200u16.to_le_bytes());
        f.extend(kind.to_le_bytes());
        f.extend(&sig);
        f.resize(f.len().div_ceil(8) * 8, 0);
        let dir = opt + 112 + 8 * pe::IMAGE_DIRECTORY_ENTRY_SECURITY;
        f[dir..dir + 4].copy_from_slice(&at.to_le_bytes());
        let size = f.len() as u32 - at;
        f[dir + 4..dir + 8].copy_from_slice(&size.to_le_bytes());
    }
    f
}

fn uki_sections() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (".text", vec![0xc3; 100]),
        (
            ".osrel",
            b"NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.9\n".to_vec(),
        ),
        (".cmdline", b"talos.platform=metal".to_vec()),
        (".pcrpkey", PCR_PEM.as_bytes().to_vec()),
        (".initrd", vec![7; 3000]),
        (".linux", vec![9; 5000]),
    ]
}

fn signed_uki() -> (Vec<u8>, Vec<u8>) {
    let other = cert("Some Intermediate");
    let signer = cert("Talos UKI Signing Key");
    let sig = signed_data(&[other, signer.clone()], &signer);
    (pe(&uki_sections(), Some((2, sig))), signer)
}

#[test]
fn a_signed_uki_names_its_signer_sections_key_and_version() {
    let (file, signer) = signed_uki();
    let facts = inspect(&file).unwrap();
    assert_eq!(
        facts.signer,
        Some(Signer {
            subject: "CN=Talos UKI Signing Key".into(),
            sha256_fingerprint: fingerprint(&signer),
        })
    );
    assert_eq!(
        facts.sections,
        [
            ".text", ".osrel", ".cmdline", ".pcrpkey", ".initrd", ".linux"
        ]
    );
    assert_eq!(facts.arch, "amd64");
    assert_eq!(facts.version.as_deref(), Some("v1.13.9"));
    // The DER inside the PEM block, hashed (what `openssl pkey -pubin -outform DER | sha256sum`
    // gives), in Talos's notation.
    let der = pem::parse(PCR_PEM).unwrap().into_contents();
    assert_eq!(facts.pcr_key_fingerprint, Some(fingerprint(&der)));
    assert_eq!(fingerprint(&der).len(), 32 * 3 - 1);
    check(&facts, true, "amd64").unwrap();
    assert_eq!(
        check(&facts, true, "arm64"),
        Err(Refusal::WrongArch {
            found: "amd64".into(),
            expected: "arm64".into()
        })
    );
    // The same through a reader, as files are read.
    assert_eq!(inspect_reader(std::io::Cursor::new(&file)).unwrap(), facts);
}

#[test]
fn talos_fingerprint_format() {
    // Go: x509CertFingerprint(x509.Certificate{Raw: []byte("abc")}).
    assert_eq!(
        fingerprint(b"abc"),
        "BA:78:16:BF:8F:01:CF:EA:41:41:40:DE:5D:AE:22:23:B0:03:61:A3:96:17:7A:9C:B4:10:FF:61:F2:00:15:AD"
    );
    // Leading text and trailing section padding are ignored, as by pem.Decode.
    let mut padded = b"junk\n".to_vec();
    padded.extend(PCR_PEM.as_bytes());
    padded.extend([0u8; 40]);
    assert_eq!(
        pem_fingerprint(&padded),
        pem_fingerprint(PCR_PEM.as_bytes())
    );
    assert!(pem_fingerprint(PCR_PEM.as_bytes()).is_some());
    assert_eq!(pem_fingerprint(b"no pem here"), None);
}

#[test]
fn unsigned_and_non_uki_files() {
    let facts = inspect(&pe(&uki_sections(), None)).unwrap();
    assert_eq!(facts.signer, None);
    assert_eq!(check(&facts, true, "amd64"), Err(Refusal::Unsigned));
    check(&facts, false, "amd64").unwrap();
    // A Certificate Table without a PKCS#7 entry (an X.509-only entry, type 1): unsigned.
    let facts = inspect(&pe(&uki_sections(), Some((1, vec![1, 2, 3])))).unwrap();
    assert_eq!(facts.signer, None);
    let stub = inspect(&pe(&[(".text", vec![0xc3; 10])], None)).unwrap();
    assert_eq!(check(&stub, false, "amd64"), Err(Refusal::NotUki));
    assert!(matches!(inspect(b"<html>404</html>"), Err(UkiError::NotPe)));
    assert!(matches!(inspect(b""), Err(UkiError::NotPe)));
}

#[test]
fn malformed_signatures_and_short_files_are_typed_errors() {
    let (file, _) = signed_uki();
    // Cut anywhere inside the last section or the signature: named, not read past the end.
    let err = inspect(&file[..file.len() - 20]).unwrap_err();
    assert!(matches!(err, UkiError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("Certificate Table"), "{err}");
    let without_sig = pe(&uki_sections(), None);
    let err = inspect(&without_sig[..without_sig.len() - 100]).unwrap_err();
    assert!(err.to_string().contains("section .linux"), "{err}");
    // A signature that is not PKCS#7.
    let err = inspect(&pe(&uki_sections(), Some((2, vec![0x30, 0x03, 2, 1, 1])))).unwrap_err();
    assert!(matches!(err, UkiError::Signature(_)), "{err}");
    // A SignerInfo naming a certificate the signature does not carry.
    let signer = cert("A");
    let sig = signed_data(&[cert("B")], &signer);
    let err = inspect(&pe(&uki_sections(), Some((2, sig)))).unwrap_err();
    assert!(matches!(err, UkiError::SignerCertificate(_)), "{err}");
    // A .pcrpkey that is no PEM.
    let mut sections = uki_sections();
    sections[3].1 = b"not a key".to_vec();
    assert!(matches!(
        inspect(&pe(&sections, None)),
        Err(UkiError::PcrKey)
    ));
}

fn sample() -> &'static [u8] {
    static FILE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| signed_uki().0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Bytes changed anywhere in the headers, the section table or the signature, and the
    /// file cut anywhere: always an answer (facts or a typed error), never a panic.
    #[test]
    fn mutated_ukis_never_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>(), truncate: bool) {
        let mut file = sample().to_vec();
        // Half of the edits land in the headers (the first 1 KiB), where they matter most.
        for (i, (at, byte)) in edits.iter().enumerate() {
            let n = if i % 2 == 0 { 0x400 } else { file.len() };
            let at = at.index(n);
            file[at] = *byte;
        }
        if truncate {
            file.truncate(cut.index(file.len()));
        }
        let _ = inspect(&file);
        let _ = inspect_reader(std::io::Cursor::new(&file));
    }

    /// Arbitrary bytes as a signature: an answer, never a panic.
    #[test]
    fn arbitrary_signatures_never_panic(sig in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = signer_of_table(&sig);
        let _ = signer_of_signed_data(&sig);
    }
}
