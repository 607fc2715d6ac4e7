//! `artifacts::uki` against real UKIs: systemd's stub with sections added by objcopy, signed
//! by sbsign with a key made by openssl and with Debian's snakeoil key. What talboot reads
//! must be what OpenSSL and sbverify say: the signer certificate's SHA-256 fingerprint
//! (`openssl x509 -fingerprint -sha256`), its subject (`sbverify --list`), and the `.pcrpkey`
//! fingerprint (`openssl pkey -pubin -outform DER | sha256sum`, in Talos's notation).

#[path = "support/uki.rs"]
mod uki;

use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::prelude::*;
use talboot::artifacts::uki::{Refusal, UkiError, check, inspect, inspect_file};

struct Fixture {
    _tmp: tempfile::TempDir,
    built: uki::Built,
    own: uki::Key,
    snakeoil: uki::Key,
    signed: PathBuf,
    snakeoil_signed: PathBuf,
}

fn fixture() -> Option<&'static Fixture> {
    static F: OnceLock<Option<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        if !uki::require() {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let built = uki::build(&tmp.path().join("uki"), &uki::Parts::default());
        let own = uki::Key::generate(
            tmp.path(),
            "own",
            "/CN=talboot test UKI signing key/O=talboot tests",
        );
        let snakeoil = uki::Key::snakeoil(tmp.path());
        let signed = built.sign(&own, &tmp.path().join("signed.efi"));
        let snakeoil_signed = built.sign(&snakeoil, &tmp.path().join("snakeoil.efi"));
        Some(Fixture {
            _tmp: tmp,
            built,
            own,
            snakeoil,
            signed,
            snakeoil_signed,
        })
    })
    .as_ref()
}

#[test]
fn signer_and_pcr_key_are_what_openssl_and_sbverify_say() {
    let Some(f) = fixture() else { return };
    for (file, key) in [(&f.signed, &f.own), (&f.snakeoil_signed, &f.snakeoil)] {
        let facts = inspect_file(file).unwrap();
        let signer = facts.signer.as_ref().expect("signed");
        assert_eq!(signer.sha256_fingerprint, key.openssl_fingerprint());
        let listed = uki::sbverify_subjects(file);
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(
            uki::same_subject(&signer.subject, &listed[0]),
            "ours {:?}, sbverify {:?}",
            signer.subject,
            listed[0]
        );
        assert_eq!(
            facts.pcr_key_fingerprint.as_deref(),
            Some(f.built.pcr_fingerprint().as_str())
        );
        for s in [
            ".osrel", ".cmdline", ".pcrpkey", ".initrd", ".linux", ".text", ".sbat",
        ] {
            assert!(facts.has_section(s), "{s} in {:?}", facts.sections);
        }
        assert_eq!(facts.arch, "amd64");
        assert_eq!(facts.version.as_deref(), Some("v1.13.9"));
        check(&facts, true, "amd64").unwrap();
        // The same bytes from memory.
        assert_eq!(inspect(&std::fs::read(file).unwrap()).unwrap(), facts);
    }
    let own = inspect_file(&f.signed).unwrap().signer.unwrap();
    assert!(
        own.subject.contains("CN=talboot test UKI signing key"),
        "{}",
        own.subject
    );
}

#[test]
fn an_unsigned_uki_has_no_signer_and_the_bare_stub_is_no_uki() {
    let Some(f) = fixture() else { return };
    let facts = inspect_file(&f.built.unsigned).unwrap();
    assert_eq!(facts.signer, None);
    assert_eq!(
        facts.pcr_key_fingerprint.as_deref(),
        Some(f.built.pcr_fingerprint().as_str())
    );
    assert_eq!(check(&facts, true, "amd64"), Err(Refusal::Unsigned));
    check(&facts, false, "amd64").unwrap();
    let stub = inspect_file(std::path::Path::new(uki::STUB)).unwrap();
    assert_eq!(check(&stub, false, "amd64"), Err(Refusal::NotUki));
}

#[test]
fn a_cut_signed_uki_is_refused_with_a_typed_error() {
    let Some(f) = fixture() else { return };
    let bytes = std::fs::read(&f.signed).unwrap();
    for keep in [
        bytes.len() - 1,
        bytes.len() - 3000,
        bytes.len() / 2,
        4096,
        100,
    ] {
        match inspect(&bytes[..keep]) {
            Err(UkiError::Truncated { .. } | UkiError::Pe(_) | UkiError::NotPe) => {}
            other => panic!("cut at {keep}: {other:?}"),
        }
    }
}

fn signed_bytes() -> Option<&'static [u8]> {
    static B: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    B.get_or_init(|| fixture().map(|f| std::fs::read(&f.signed).unwrap()))
        .as_deref()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// A real signed UKI with bytes changed in its headers or its signature (the parts the
    /// reader walks), and cut anywhere: always facts or a typed error, never a panic.
    #[test]
    fn a_mutated_real_uki_never_panics(edits in prop::collection::vec((any::<bool>(), any::<prop::sample::Index>(), any::<u8>()), 1..12), cut in any::<prop::sample::Index>(), truncate: bool) {
        let Some(original) = signed_bytes() else { return Ok(()) };
        let mut file = original.to_vec();
        // The Certificate Table is at the end of a signed file (sbsign appends it).
        let tail = 4096.min(file.len());
        for (in_header, at, byte) in edits {
            let at = if in_header {
                at.index(1024)
            } else {
                file.len() - tail + at.index(tail)
            };
            file[at] = byte;
        }
        if truncate {
            file.truncate(cut.index(file.len()));
        }
        let _ = inspect(&file);
    }
}
