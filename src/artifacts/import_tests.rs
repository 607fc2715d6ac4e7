//! Unit tests of `images import`.

use super::*;
use proptest::prelude::*;
use std::cell::Cell;

const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

struct Files {
    tmp: tempfile::TempDir,
    req: ImportRequest,
}

impl Files {
    fn images(&self) -> PathBuf {
        self.tmp.path().join("images")
    }
    fn set_dir(&self) -> PathBuf {
        self.images().join(self.req.id.rel_dir())
    }
    /// Every file under the set's folder, sorted.
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.set_dir())
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn files(initramfs: &[u8]) -> Files {
    let tmp = tempfile::tempdir().unwrap();
    let usb = tmp.path().join("usb");
    std::fs::create_dir_all(&usb).unwrap();
    std::fs::write(usb.join("vmlinuz"), b"MZ kernel bytes").unwrap();
    std::fs::write(usb.join("initrd.img"), initramfs).unwrap();
    std::fs::write(usb.join("cmdline"), b"talos.platform=metal console=tty0\n").unwrap();
    let req = ImportRequest {
        id: SetId {
            talos: "v1.13.9".into(),
            schematic: SCHEMATIC.into(),
            arch: "amd64".into(),
        },
        kernel: usb.join("vmlinuz"),
        initramfs: usb.join("initrd.img"),
        cmdline: CmdlineSource::File(usb.join("cmdline")),
        force: false,
        iso: None,
    };
    Files { tmp, req }
}

const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3, 4, 5, 6];

#[test]
fn imports_records_compression_and_reimport_is_a_no_op() {
    let f = files(ZSTD);
    let (entry, outcome) = import(&f.images(), &f.req, 42).unwrap();
    assert_eq!(outcome, Outcome::Imported);
    assert_eq!(
        entry.files[&Kind::Initramfs].compression,
        Some(Compression::Zstd)
    );
    assert_eq!(
        std::fs::read(f.set_dir().join("initramfs.xz")).unwrap(),
        ZSTD
    );
    assert_eq!(f.listing(), ["cmdline", "initramfs.xz", "kernel"]);
    let catalog = Catalog::load(&f.images()).unwrap();
    super::super::verify(&f.images(), &catalog, &f.req.id).unwrap();
    assert!(matches!(
        catalog.find(&f.req.id).unwrap().origin,
        Origin::Imported { .. }
    ));

    let before = std::fs::metadata(f.set_dir().join("kernel"))
        .unwrap()
        .modified()
        .unwrap();
    let (_, outcome) = import(&f.images(), &f.req, 43).unwrap();
    assert_eq!(outcome, Outcome::Unchanged);
    let after = std::fs::metadata(f.set_dir().join("kernel"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
    assert_eq!(
        Catalog::load(&f.images())
            .unwrap()
            .find(&f.req.id)
            .unwrap()
            .pulled_at,
        42
    );
}

#[test]
fn a_different_file_is_refused_without_force() {
    let f = files(ZSTD);
    import(&f.images(), &f.req, 1).unwrap();
    std::fs::write(&f.req.kernel, b"MZ another kernel").unwrap();
    let err = import(&f.images(), &f.req, 2).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ImportError::Conflict { ref kinds, .. } if kinds == &[Kind::Kernel]),
        "{msg}"
    );
    assert!(msg.contains("--force"), "{msg}");
    let mut forced = f.req.clone();
    forced.force = true;
    let (_, outcome) = import(&f.images(), &forced, 3).unwrap();
    assert_eq!(outcome, Outcome::Replaced(vec![Kind::Kernel]));
    assert_eq!(
        std::fs::read(f.set_dir().join("kernel")).unwrap(),
        b"MZ another kernel"
    );
}

#[test]
fn bad_sources_are_refused_naming_the_file_and_nothing_is_written() {
    let f = files(b"<html>not found</html>");
    let err = import(&f.images(), &f.req, 1).unwrap_err().to_string();
    assert!(err.contains("initrd.img"), "{err}");
    assert!(err.contains("3c68746d"), "{err}");
    assert!(!f.images().exists(), "nothing may be written: {err}");

    let mut r = files(ZSTD).req;
    r.kernel = PathBuf::from("/nonexistent/vmlinuz");
    let err = import(&f.images(), &r, 1).unwrap_err().to_string();
    assert!(
        err.contains("cannot read the kernel /nonexistent/vmlinuz"),
        "{err}"
    );

    let mut r = f.req.clone();
    std::fs::write(&r.initramfs, ZSTD).unwrap();
    r.cmdline = CmdlineSource::Inline("a\nb".into());
    let err = import(&f.images(), &r, 1).unwrap_err().to_string();
    assert!(err.contains("more than one line"), "{err}");
    assert!(!f.images().exists());
}

/// A read error or a changed source during the copy leaves the old set (files and catalog)
/// exactly as it was and no temporary file behind.
#[test]
fn a_failure_while_copying_leaves_the_cache_as_it_was() {
    let f = files(ZSTD);
    import(&f.images(), &f.req, 1).unwrap();
    let catalog = std::fs::read(f.images().join("catalog.json")).unwrap();
    let old_initramfs = std::fs::read(f.set_dir().join("initramfs.xz")).unwrap();
    std::fs::write(&f.req.kernel, b"MZ new kernel").unwrap();
    std::fs::write(&f.req.initramfs, [0x1f, 0x8b, 8, 0, 9, 9, 9, 9]).unwrap();
    let mut forced = f.req.clone();
    forced.force = true;

    struct FailAfter(usize);
    impl Read for FailAfter {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("USB stick pulled out"));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(0x1f);
            self.0 -= n;
            Ok(n)
        }
    }
    for fault in ["read error", "changed"] {
        let opens = Cell::new(0);
        let initramfs = forced.initramfs.clone();
        let opener = |p: &Path| -> std::io::Result<Box<dyn Read>> {
            if p == initramfs {
                opens.set(opens.get() + 1);
                if opens.get() == 2 {
                    return Ok(match fault {
                        "read error" => Box::new(FailAfter(3)),
                        _ => Box::new(&[0x1f, 0x8b, 8, 0, 9, 9, 9, 0][..]),
                    });
                }
            }
            open_file(p)
        };
        let err = import_with(&f.images(), &forced, 2, &opener).unwrap_err();
        match fault {
            "read error" => assert!(err.to_string().contains("USB stick pulled out"), "{err}"),
            _ => assert!(matches!(err, ImportError::Changed { .. }), "{err}"),
        }
        assert_eq!(
            std::fs::read(f.images().join("catalog.json")).unwrap(),
            catalog
        );
        assert_eq!(
            std::fs::read(f.set_dir().join("initramfs.xz")).unwrap(),
            old_initramfs
        );
        assert_eq!(
            std::fs::read(f.set_dir().join("kernel")).unwrap(),
            b"MZ kernel bytes"
        );
        assert_eq!(f.listing(), ["cmdline", "initramfs.xz", "kernel"]);
    }
}

#[test]
fn damaged_store_with_identical_sources_is_repaired() {
    let f = files(ZSTD);
    import(&f.images(), &f.req, 1).unwrap();
    std::fs::write(f.set_dir().join("kernel"), b"MZ kernel byte").unwrap();
    let (_, outcome) = import(&f.images(), &f.req, 2).unwrap();
    assert_eq!(outcome, Outcome::Repaired);
    let catalog = Catalog::load(&f.images()).unwrap();
    super::super::verify(&f.images(), &catalog, &f.req.id).unwrap();
}

fn rec(n: u8) -> FileRecord {
    FileRecord {
        size: u64::from(n),
        sha256: format!("{n:02x}"),
        compression: None,
        uki: None,
    }
}

proptest! {
    /// Writing happens exactly when the set is new, damaged, or forced over a difference;
    /// a difference without force is always refused, naming exactly the differing files.
    #[test]
    fn decide_writes_only_when_it_should(old in proptest::array::uniform3(0u8..3), new in proptest::array::uniform3(0u8..3), present: bool, intact: bool, force: bool) {
        let map = |v: [u8; 3]| Kind::ALL.into_iter().zip(v).map(|(k, n)| (k, rec(n))).collect::<BTreeMap<_, _>>();
        let (old_m, new_m) = (map(old), map(new));
        let d = decide(present.then_some(&old_m), &new_m, intact, force);
        let differing: Vec<Kind> = Kind::ALL.into_iter().zip(old.iter().zip(new.iter())).filter(|(_, (a, b))| a != b).map(|(k, _)| k).collect();
        let expected = if !present {
            Decision::Write(Outcome::Imported)
        } else if differing.is_empty() {
            if intact { Decision::Unchanged } else { Decision::Write(Outcome::Repaired) }
        } else if force {
            Decision::Write(Outcome::Replaced(differing))
        } else {
            Decision::Conflict(differing)
        };
        prop_assert_eq!(d, expected);
    }
}
