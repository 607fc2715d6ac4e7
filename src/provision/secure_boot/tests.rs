use proptest::prelude::*;
use sha2::Digest;

use super::*;

/// A fingerprint in Talos's format of some bytes.
fn fp(of: &[u8]) -> String {
    talos_fingerprint(&sha2::Sha256::digest(of).into())
}

fn good(key: &str) -> Reported {
    Reported {
        secure_boot: true,
        booted_with_uki: true,
        pcr_signing_key_fingerprint: key.to_owned(),
        selinux_state: "disabled".into(),
        fips_state: "disabled".into(),
        ..Reported::default()
    }
}

fn expect(key: &str) -> Expected {
    Expected {
        pcr_signing_key_fingerprint: Some(key.to_owned()),
    }
}

#[test]
fn the_format_is_talos_x509_cert_fingerprint() {
    // x509CertFingerprint(sha256("")) as Talos prints it: uppercase hex pairs joined by ':'.
    assert_eq!(
        fp(b""),
        "E3:B0:C4:42:98:FC:1C:14:9A:FB:F4:C8:99:6F:B9:24:27:AE:41:E4:64:9B:93:4C:A4:95:99:1B:78:52:B8:55"
    );
}

#[test]
fn secure_boot_uki_and_the_boot_sets_key_pass() {
    let k = fp(b"key");
    assert_eq!(judge(&Read::Found(good(&k)), &expect(&k)), Ok(good(&k)));
    // Case and separators do not make another key.
    let lower = k.to_ascii_lowercase().replace(':', "");
    assert!(judge(&Read::Found(good(&lower)), &expect(&k)).is_ok());
}

#[test]
fn secure_boot_off_is_refused_naming_everything_reported() {
    let k = fp(b"key");
    let rep = Reported {
        secure_boot: false,
        ..good(&k)
    };
    let err = judge(&Read::Found(rep.clone()), &expect(&k)).unwrap_err();
    assert_eq!(err.reasons, vec![Reason::SecureBootOff]);
    let text = err.to_string();
    for field in [
        "secureBoot=false",
        "bootedWithUKI=true",
        &format!("pcrSigningKeyFingerprint={k}"),
        "ukiSigningKeyFingerprint=(none)",
        "selinuxState=\"disabled\"",
        "fipsState=\"disabled\"",
        "moduleSignatureEnforced=false",
    ] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
}

#[test]
fn every_failing_check_is_listed() {
    let rep = Reported {
        secure_boot: false,
        booted_with_uki: false,
        pcr_signing_key_fingerprint: String::new(),
        ..Reported::default()
    };
    let err = judge(&Read::Found(rep), &expect(&fp(b"key"))).unwrap_err();
    assert_eq!(
        err.reasons,
        vec![
            Reason::SecureBootOff,
            Reason::NotBootedWithUki,
            Reason::OtherKey {
                expected: fp(b"key")
            }
        ]
    );
}

/// A UKI loaded over PXE/TFTP reports `bootedWithUKI: false` on real Talos (no file path for
/// systemd-stub's `StubImageIdentifier`); the boot set's PCR key is what shows the UKI ran.
#[test]
fn booted_with_uki_false_passes_only_with_the_boot_sets_pcr_key() {
    let pxe = |key: &str| Reported {
        booted_with_uki: false,
        ..good(key)
    };
    assert!(judge(&Read::Found(pxe(&fp(b"key"))), &expect(&fp(b"key"))).is_ok());
    let err = judge(&Read::Found(pxe(&fp(b"other"))), &expect(&fp(b"key"))).unwrap_err();
    assert_eq!(
        err.reasons,
        vec![
            Reason::NotBootedWithUki,
            Reason::OtherKey {
                expected: fp(b"key")
            }
        ]
    );
    let err = judge(&Read::Found(pxe(&fp(b"key"))), &Expected::default()).unwrap_err();
    assert_eq!(
        err.reasons,
        vec![Reason::NotBootedWithUki, Reason::NoExpectedKey]
    );
}

#[test]
fn another_key_or_no_expected_key_is_refused() {
    let err = judge(&Read::Found(good(&fp(b"other"))), &expect(&fp(b"key"))).unwrap_err();
    assert_eq!(
        err.reasons,
        vec![Reason::OtherKey {
            expected: fp(b"key")
        }]
    );
    let err = judge(&Read::Found(good(&fp(b"key"))), &Expected::default()).unwrap_err();
    assert_eq!(err.reasons, vec![Reason::NoExpectedKey]);
}

#[test]
fn an_unreadable_or_missing_resource_is_refused() {
    let k = expect(&fp(b"key"));
    let err = judge(&Read::NotFound, &k).unwrap_err();
    assert_eq!((err.reasons, err.reported), (vec![Reason::NotFound], None));
    let err = judge(&Read::Failed("deadline exceeded".into()), &k).unwrap_err();
    assert!(err.to_string().contains("deadline exceeded"));
}

#[test]
fn the_spec_decodes_with_talos_names() {
    let spec = SecurityStateSpec {
        secure_boot: true,
        se_linux_state: RuntimeSeLinuxState::SeLinuxStateEnforcing as i32,
        fips_state: RuntimeFipsState::FipsStateStrict as i32,
        ..SecurityStateSpec::default()
    };
    let rep = Reported::from(&spec);
    assert_eq!(
        (rep.selinux_state.as_str(), rep.fips_state.as_str()),
        ("enabled, enforcing", "enabled, strict")
    );
}

proptest! {
    /// The gate passes exactly when Secure Boot is enforced and the key is the boot set's,
    /// whatever else was reported (`bootedWithUKI` included: see `judge`).
    #[test]
    fn passes_iff_secure_boot_and_same_key(
        sb in any::<bool>(),
        uki in any::<bool>(),
        same in any::<bool>(),
        mse in any::<bool>(),
        key in proptest::collection::vec(any::<u8>(), 0..16),
        other in proptest::collection::vec(any::<u8>(), 0..16),
        expected_known in any::<bool>(),
    ) {
        let want = fp(&key);
        let got = if same { want.clone() } else { fp(&[other.as_slice(), b"x"].concat()) };
        let rep = Reported {
            secure_boot: sb,
            booted_with_uki: uki,
            pcr_signing_key_fingerprint: got,
            module_signature_enforced: mse,
            ..Reported::default()
        };
        let exp = Expected { pcr_signing_key_fingerprint: expected_known.then(|| want.clone()) };
        let verdict = judge(&Read::Found(rep.clone()), &exp);
        prop_assert_eq!(verdict.is_ok(), sb && same && expected_known);
        if let Err(r) = &verdict {
            let listed = r.reasons.contains(&Reason::NotBootedWithUki);
            let key_matched = same && expected_known;
            prop_assert_eq!(listed, !(uki || key_matched));
        }
        if let Err(r) = verdict {
            prop_assert!(!r.reasons.is_empty());
            prop_assert_eq!(r.reported, Some(Box::new(rep)));
        }
    }

    /// Nothing that is not a full SHA-256 matches, not even itself.
    #[test]
    fn short_fingerprints_never_match(s in "[0-9A-F:]{0,60}") {
        let digits = s.chars().filter(|c| *c != ':').count();
        prop_assume!(digits < 64);
        prop_assert!(!same_fingerprint(&s, &s));
    }
}

/// What `serve` hands the gate: per secure-boot node, the `.pcrpkey` fingerprint the catalog
/// recorded for its set's signed UKI; nothing for a node whose set has no such UKI (refused:
/// fails closed) and nothing for nodes without `secureBoot`.
#[test]
fn the_expected_key_is_the_catalogs_recorded_pcrpkey() {
    use crate::artifacts::{Catalog, Entry, FileRecord, Kind, SetId, UkiRecord, uki::UkiFacts};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    let mut inv = crate::inventory::load_with_env(&path, &std::collections::BTreeMap::new())
        .unwrap()
        .inventory;
    let first = inv.nodes[0].name.value.clone();
    inv.nodes[0].secure_boot = Some(crate::inventory::Spanned::new(
        true,
        inv.nodes[0].name.loc.clone(),
    ));
    let id = SetId::new(
        &inv.cluster.talos_version.value,
        inv.cluster.installer.schematic_id(),
        inv.arch_of(&inv.nodes[0]),
    );
    let mut catalog = Catalog::default();
    assert!(expected_pcr_fingerprints(&inv, &catalog).is_empty());
    let key = fp(b"the boot set's pcr key");
    let uki = |pcr: Option<String>| FileRecord {
        size: 1,
        sha256: "00".repeat(32),
        compression: None,
        uki: Some(UkiRecord {
            facts: UkiFacts {
                arch: "amd64".into(),
                sections: vec![".linux".into(), ".pcrpkey".into()],
                signer: None,
                pcr_key_fingerprint: pcr,
                version: None,
            },
            source: "test".into(),
            at: 0,
            origin: Default::default(),
        }),
    };
    let entry = |pcr: Option<String>| Entry {
        id: id.clone(),
        source: "test".into(),
        pulled_at: 0,
        files: [(Kind::SecureBootUki, uki(pcr))].into_iter().collect(),
        origin: Default::default(),
    };
    catalog.upsert(entry(None));
    assert!(expected_pcr_fingerprints(&inv, &catalog).is_empty());
    catalog.upsert(entry(Some(key.clone())));
    let keys = expected_pcr_fingerprints(&inv, &catalog);
    assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec![(first, key)]);
}
