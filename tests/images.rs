//! `talboot images pull/list/verify` against a local stand-in for the Image Factory that serves
//! the factory's URL shape on loopback (with Range support), counting what it was asked for.

#[path = "support/uki.rs"]
mod uki;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

#[derive(Default)]
struct Factory {
    files: HashMap<String, PathBuf>,
    /// Range headers seen, per file.
    ranges: Mutex<Vec<(String, Option<String>)>>,
    /// Serve only this many bytes of the initramfs, then stop (a dropped connection).
    truncate_initramfs: Mutex<Option<usize>>,
    /// Serve only this many bytes of each `.efi`, without a length, and end cleanly: a cut
    /// HTTP cannot show.
    cut_efi: Mutex<Option<usize>>,
}

async fn image(
    State(f): State<Arc<Factory>>,
    Path((schematic, version, name)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let key = format!("{schematic}/{version}/{name}");
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    f.ranges.lock().unwrap().push((name.clone(), range));
    let Some(path) = f.files.get(&key) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if name.starts_with("initramfs")
        && let Some(n) = *f.truncate_initramfs.lock().unwrap()
    {
        // Claim the full length, send n bytes, then break the connection.
        let bytes = std::fs::read(path).unwrap();
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
            Ok(bytes[..n].to_vec()),
            Err(std::io::Error::other("connection dropped by the test")),
        ];
        // The pause lets the headers and the first bytes reach the client before the break.
        let stream =
            futures_util::StreamExt::then(futures_util::stream::iter(chunks), |c| async move {
                if c.is_err() {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                c
            });
        let body = axum::body::Body::from_stream(stream);
        let mut r = Response::new(body);
        r.headers_mut()
            .insert("content-length", bytes.len().to_string().parse().unwrap());
        return r;
    }
    if name.ends_with(".efi")
        && let Some(n) = *f.cut_efi.lock().unwrap()
    {
        let bytes = std::fs::read(path).unwrap();
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(bytes[..n].to_vec())];
        let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
        return Response::new(body);
    }
    let bytes = std::fs::read(path).unwrap();
    let asset = talboot::http::assets::Asset {
        path: path.clone(),
        size: bytes.len() as u64,
        sha256: "x".into(),
        content_type: "application/octet-stream",
    };
    talboot::http::assets::respond(&asset, &method, &headers)
        .await
        .0
}

struct Harness {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    url: String,
    factory: Arc<Factory>,
    rt: tokio::runtime::Runtime,
    kernel: Vec<u8>,
    initramfs: Vec<u8>,
}

impl Harness {
    fn new() -> Self {
        Self::serving(|_| Vec::new())
    }

    /// A factory that also serves the files `extra` makes in its folder (name, path).
    fn serving(extra: impl FnOnce(&std::path::Path) -> Vec<(String, PathBuf)>) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("factory");
        std::fs::create_dir_all(&src).unwrap();
        let kernel: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let initramfs: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let mut files = HashMap::new();
        for (name, bytes) in [
            ("kernel-amd64", kernel.clone()),
            ("initramfs-amd64.xz", initramfs.clone()),
            (
                "cmdline-metal-amd64",
                b"talos.platform=metal console=tty0 slab_nomerge pti=on".to_vec(),
            ),
        ] {
            let p = src.join(name);
            std::fs::write(&p, bytes).unwrap();
            files.insert(format!("{SCHEMATIC}/v1.13.9/{name}"), p);
        }
        for (name, p) in extra(tmp.path()) {
            files.insert(format!("{SCHEMATIC}/v1.13.9/{name}"), p);
        }
        let factory = Arc::new(Factory {
            files,
            ..Default::default()
        });
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route(
                "/image/{schematic}/{version}/{name}",
                axum::routing::get(image),
            )
            .with_state(factory.clone());
        rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            dir: tmp.path().join("images"),
            _tmp: tmp,
            url,
            factory,
            rt,
            kernel,
            initramfs,
        }
    }

    fn talboot(&self, args: &[&str]) -> Output {
        let _guard = self.rt.enter();
        Command::new(env!("CARGO_BIN_EXE_talboot"))
            .arg("images")
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .output()
            .unwrap()
    }

    fn pull(&self) -> Output {
        self.talboot(&[
            "pull",
            "--talos",
            "v1.13.9",
            "--schematic",
            SCHEMATIC,
            "--arch",
            "amd64",
            "--factory",
            &self.url,
        ])
    }

    fn set_dir(&self) -> PathBuf {
        self.dir.join("v1.13.9").join(SCHEMATIC).join("amd64")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What the UKI pull tests serve: a UKI signed with a key of the test's own, and the same UKI
/// unsigned, under the factory's names.
struct Ukis {
    key_fingerprint: String,
    pcr_fingerprint: String,
    signed: Vec<u8>,
    unsigned: Vec<u8>,
}

/// A factory serving the PXE files and both UKIs (`None` when the tools are missing and the
/// UKI tests are waived).
fn uki_harness() -> Option<(Harness, Ukis)> {
    if !uki::require() {
        return None;
    }
    let mut ukis = None;
    let h = Harness::serving(|dir| {
        let built = uki::build(&dir.join("uki"), &uki::Parts::default());
        let key = uki::Key::generate(dir, "factory", "/CN=Test Factory UKI Key");
        let signed = built.sign(&key, &dir.join("factory/metal-amd64-secureboot-uki.efi"));
        let unsigned = dir.join("factory/metal-amd64-uki.efi");
        std::fs::copy(&built.unsigned, &unsigned).unwrap();
        ukis = Some(Ukis {
            key_fingerprint: key.openssl_fingerprint(),
            pcr_fingerprint: built.pcr_fingerprint(),
            signed: std::fs::read(&signed).unwrap(),
            unsigned: std::fs::read(&unsigned).unwrap(),
        });
        vec![
            ("metal-amd64-secureboot-uki.efi".into(), signed),
            ("metal-amd64-uki.efi".into(), unsigned),
        ]
    });
    Some((h, ukis.unwrap()))
}

impl Harness {
    fn pull_boot(&self, boot: &str) -> Output {
        self.talboot(&[
            "pull",
            "--talos",
            "v1.13.9",
            "--schematic",
            SCHEMATIC,
            "--arch",
            "amd64",
            "--factory",
            &self.url,
            "--boot",
            boot,
        ])
    }

    fn requested(&self) -> Vec<String> {
        let r = self.factory.ranges.lock().unwrap();
        r.iter().map(|(n, _)| n.clone()).collect()
    }
}

#[test]
fn pull_fetches_the_ukis_asked_for_reads_them_and_keeps_the_rest_of_the_set() {
    let Some((h, ukis)) = uki_harness() else {
        return;
    };
    let out = h.pull_boot("secureboot-uki");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(h.requested(), ["metal-amd64-secureboot-uki.efi"]);
    assert_eq!(
        std::fs::read(h.set_dir().join("secureboot-uki.efi")).unwrap(),
        ukis.signed
    );
    assert!(!h.set_dir().join("kernel").exists());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("certificate sha256 {}", ukis.key_fingerprint)),
        "{stdout}"
    );
    let catalog = talboot::artifacts::Catalog::load(&h.dir).unwrap();
    let entry = &catalog.entries[0];
    use talboot::artifacts::{Boot, Kind};
    assert_eq!(entry.boots(), [Boot::SecureBootUki]);
    let facts = entry.uki_facts(Kind::SecureBootUki).unwrap();
    assert_eq!(
        facts.signer.as_ref().unwrap().sha256_fingerprint,
        ukis.key_fingerprint
    );
    assert_eq!(
        facts.pcr_key_fingerprint.as_deref(),
        Some(ukis.pcr_fingerprint.as_str())
    );

    // The PXE files, as before (the default), join the set; the UKI stays.
    let out = h.pull();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = h.pull_boot("uki");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(h.set_dir().join("uki.efi")).unwrap(),
        ukis.unsigned
    );
    let out = h.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("boots: pxe, uki, secureboot-uki"),
        "{}",
        text(&out.stdout)
    );
    let listed = text(&h.talboot(&["list"]).stdout);
    assert!(listed.contains("pxe,uki,secureboot-uki"), "{listed}");
    assert!(
        listed.contains("signed by CN=Test Factory UKI Key"),
        "{listed}"
    );
    assert!(listed.contains("unsigned"), "{listed}");
    assert!(
        listed.contains(&format!(".pcrpkey sha256 {}", ukis.pcr_fingerprint)),
        "{listed}"
    );

    // Damage on the Secure Boot UKI: verify names the pull that fetches it again.
    std::fs::write(h.set_dir().join("secureboot-uki.efi"), b"MZ").unwrap();
    let out = h.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(&format!(
            "talboot images pull --talos v1.13.9 --schematic {SCHEMATIC} --arch amd64 --boot secureboot-uki"
        )),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_cut_unsigned_or_foreign_uki_download_is_refused_and_nothing_is_written() {
    let Some((h, ukis)) = uki_harness() else {
        return;
    };
    let target = h.set_dir().join("secureboot-uki.efi");
    let part = h.set_dir().join("secureboot-uki.efi.part");
    let nothing_written = |out: &Output, says: &str| {
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
        let err = text(&out.stderr);
        assert!(
            err.contains(says) && err.contains("it was not kept and the catalog is unchanged"),
            "{err}"
        );
        assert!(!target.exists() && !part.exists());
        assert!(
            talboot::artifacts::Catalog::load(&h.dir)
                .unwrap()
                .entries
                .is_empty()
        );
    };
    // Cut short with no length to check against: the PE says its sections run past the end.
    *h.factory.cut_efi.lock().unwrap() = Some(ukis.signed.len() - 5000);
    nothing_written(&h.pull_boot("secureboot-uki"), "is cut short");
    *h.factory.cut_efi.lock().unwrap() = None;

    // An unsigned file under the Secure Boot name.
    let served =
        h.factory.files[&format!("{SCHEMATIC}/v1.13.9/metal-amd64-secureboot-uki.efi")].clone();
    std::fs::write(&served, &ukis.unsigned).unwrap();
    nothing_written(
        &h.pull_boot("secureboot-uki"),
        "carries no Authenticode signature",
    );
    // An error page sent with 200.
    std::fs::write(&served, b"<html>upstream error</html>").unwrap();
    nothing_written(&h.pull_boot("secureboot-uki"), "is not a PE/COFF image");

    // The good file again: the pull goes through.
    std::fs::write(&served, &ukis.signed).unwrap();
    let out = h.pull_boot("secureboot-uki");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), ukis.signed);
}

#[test]
fn pull_with_an_inventory_fetches_the_signed_uki_for_secure_boot_nodes() {
    let Some((h, ukis)) = uki_harness() else {
        return;
    };
    let port: u16 = h.url.rsplit(':').next().unwrap().parse().unwrap();
    let dir = h.dir.parent().unwrap().join("site");
    std::fs::create_dir_all(&dir).unwrap();
    let inv = offline_inventory(&dir, port);
    let yaml = std::fs::read_to_string(&inv).unwrap();
    let secure = yaml.replace(
        "    firmware: uefi\n",
        "    firmware: uefi\n    secureBoot: true\n",
    );
    assert_ne!(secure, yaml);
    // Without discovery of unknown machines, which boot the PXE files.
    let no_discovery = secure.replace("unknownMachines: discover", "unknownMachines: ignore");
    assert_ne!(no_discovery, secure);
    std::fs::write(&inv, &no_discovery).unwrap();
    let pull = || {
        h.talboot(&[
            "pull",
            "-c",
            inv.to_str().unwrap(),
            "--schematic",
            SCHEMATIC,
        ])
    };
    let out = pull();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("(boot: secureboot-uki)"),
        "{}",
        text(&out.stdout)
    );
    // Every node boots the signed UKI: no PXE files were fetched.
    assert_eq!(h.requested(), ["metal-amd64-secureboot-uki.efi"]);
    // With discovery, the PXE files too (what `serve` will ask for).
    std::fs::write(&inv, &secure).unwrap();
    let out = pull();
    assert!(
        text(&out.stdout).contains("(boot: pxe, secureboot-uki)"),
        "{}",
        text(&out.stdout)
    );
    assert!(h.requested().contains(&"kernel-amd64".to_string()));
    assert_eq!(
        std::fs::read(h.set_dir().join("secureboot-uki.efi")).unwrap(),
        ukis.signed
    );
}

#[test]
fn pull_records_digests_and_verify_catches_damage() {
    let h = Harness::new();
    let out = h.pull();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(h.set_dir().join("kernel")).unwrap(), h.kernel);
    assert_eq!(
        std::fs::read(h.set_dir().join("initramfs.xz")).unwrap(),
        h.initramfs
    );
    let catalog = talboot::artifacts::Catalog::load(&h.dir).unwrap();
    assert_eq!(catalog.entries.len(), 1);
    let listed = text(&h.talboot(&["list"]).stdout);
    assert!(
        listed.contains(&format!("v1.13.9   amd64  {SCHEMATIC}")),
        "{listed}"
    );

    let out = h.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    let mut damaged = h.initramfs.clone();
    damaged[500] ^= 0xff;
    std::fs::write(h.set_dir().join("initramfs.xz"), damaged).unwrap();
    let out = h.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("DAMAGED"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "talboot images pull --talos v1.13.9 --schematic {SCHEMATIC} --arch amd64"
        )),
        "{stdout}"
    );
}

#[test]
fn interrupted_pull_resumes_with_a_range_request() {
    let h = Harness::new();
    *h.factory.truncate_initramfs.lock().unwrap() = Some(400_000);
    let out = h.pull();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("run the same command again to resume"),
        "{stderr}"
    );
    assert!(
        talboot::artifacts::Catalog::load(&h.dir)
            .unwrap()
            .entries
            .is_empty(),
        "a half-pulled set must not be catalogued"
    );
    let part = h.set_dir().join("initramfs.xz.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 400_000);

    *h.factory.truncate_initramfs.lock().unwrap() = None;
    let out = h.pull();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(h.set_dir().join("initramfs.xz")).unwrap(),
        h.initramfs
    );
    assert!(!part.exists());
    let ranges = h.factory.ranges.lock().unwrap().clone();
    assert!(
        ranges
            .iter()
            .any(|(n, r)| n == "initramfs-amd64.xz" && r.as_deref() == Some("bytes=400000-")),
        "{ranges:?}"
    );
}

#[test]
fn missing_version_at_the_factory_is_reported() {
    let h = Harness::new();
    let out = h.talboot(&[
        "pull",
        "--talos",
        "v1.99.0",
        "--arch",
        "amd64",
        "--factory",
        &h.url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("HTTP 404"),
        "{}",
        text(&out.stderr)
    );
    let out = h.talboot(&["pull", "--arch", "amd64"]);
    assert_eq!(out.status.code(), Some(2));
}

// ---- `images import`: air-gapped sites -------------------------------------------------

/// A port nothing listens on: every factory URL and proxy of the import tests points there, so
/// an import that touched the network would fail instead of passing by luck.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The lab inventory, copied with its factory URL at a closed port.
fn offline_inventory(dir: &std::path::Path, port: u16) -> PathBuf {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let lab = std::fs::read_to_string(config.join("lab.yaml")).unwrap();
    let edited = lab.replacen(
        "  installer:\n",
        &format!("  installer:\n    factoryUrl: http://127.0.0.1:{port}\n"),
        1,
    );
    assert_ne!(edited, lab);
    for sub in ["patches", "secrets"] {
        std::os::unix::fs::symlink(config.join(sub), dir.join(sub)).unwrap();
    }
    let path = dir.join("lab.yaml");
    std::fs::write(&path, edited).unwrap();
    path
}

/// The lab inventory's schematic.
const LAB_SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

/// A USB stick's worth of files: a gzip initramfs (not named `.xz`), a kernel, a cmdline.
struct Stick {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    images: PathBuf,
    inventory: PathBuf,
    port: u16,
    kernel: PathBuf,
    initramfs: PathBuf,
    cmdline: PathBuf,
}

impl Stick {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let usb = root.join("usb");
        std::fs::create_dir_all(&usb).unwrap();
        let kernel = usb.join("vmlinuz-amd64");
        std::fs::write(
            &kernel,
            (0..250_000u32)
                .map(|i| (i * 11 % 239) as u8)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(
            &mut gz,
            &(0..400_000u32).map(|i| (i % 97) as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        let initramfs = usb.join("initramfs-amd64.img");
        std::fs::write(&initramfs, gz.finish().unwrap()).unwrap();
        let cmdline = usb.join("cmdline-metal-amd64");
        std::fs::write(
            &cmdline,
            "talos.platform=metal console=tty0 slab_nomerge pti=on\n",
        )
        .unwrap();
        let port = closed_port();
        let inventory = offline_inventory(&root, port);
        Self {
            images: root.join("images"),
            _tmp: tmp,
            root,
            inventory,
            port,
            kernel,
            initramfs,
            cmdline,
        }
    }

    fn talboot(&self, args: &[&str]) -> Output {
        let proxy = format!("http://127.0.0.1:{}", self.port);
        Command::new(env!("CARGO_BIN_EXE_talboot"))
            .current_dir(&self.root)
            .arg("images")
            .arg("--dir")
            .arg(&self.images)
            .args(args)
            .env("HTTP_PROXY", &proxy)
            .env("HTTPS_PROXY", &proxy)
            .env("ALL_PROXY", &proxy)
            .output()
            .unwrap()
    }

    fn import(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "import",
            "-c",
            self.inventory.to_str().unwrap(),
            "--kernel",
            self.kernel.to_str().unwrap(),
            "--initramfs",
            self.initramfs.to_str().unwrap(),
            "--cmdline-file",
            self.cmdline.to_str().unwrap(),
        ];
        args.extend(extra);
        self.talboot(&args)
    }

    fn set_dir(&self) -> PathBuf {
        self.images
            .join("v1.13.9")
            .join(LAB_SCHEMATIC)
            .join("amd64")
    }
}

#[test]
fn import_list_verify_and_refuse_a_different_file_offline() {
    let s = Stick::new();
    let out = s.import(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("imported Talos v1.13.9 amd64 schematic"),
        "{stdout}"
    );
    assert!(stdout.contains("(gzip)"), "{stdout}");
    // Stored byte for byte under the slot name the boot script asks for.
    assert_eq!(
        std::fs::read(s.set_dir().join("initramfs.xz")).unwrap(),
        std::fs::read(&s.initramfs).unwrap()
    );

    let listed = text(&s.talboot(&["list"]).stdout);
    assert!(
        listed.contains(&format!("v1.13.9   amd64  {LAB_SCHEMATIC}")),
        "{listed}"
    );
    assert!(listed.contains("gzip"), "{listed}");
    assert!(
        listed.contains("imported at 20")
            && listed.contains(&format!("from {}", s.kernel.display())),
        "{listed}"
    );
    assert!(
        listed.contains(&s.initramfs.display().to_string()),
        "{listed}"
    );

    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    // The same files again: nothing to do, and said so.
    let catalog = std::fs::read(s.images.join("catalog.json")).unwrap();
    let out = s.import(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("nothing to do"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read(s.images.join("catalog.json")).unwrap(),
        catalog
    );

    // A different initramfs (xz this time) for the same set: refused without --force.
    std::fs::write(&s.initramfs, b"\xfd7zXZ\0\0\x04 other").unwrap();
    let out = s.import(&[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("different initramfs") && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(s.images.join("catalog.json")).unwrap(),
        catalog
    );
    let out = s.import(&["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("replaced"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&s.talboot(&["list"]).stdout).contains(" xz "));

    // Truncated on the cache after import: verify catches it and names the import command.
    let stored = s.set_dir().join("initramfs.xz");
    let bytes = std::fs::read(&stored).unwrap();
    std::fs::write(&stored, &bytes[..bytes.len() - 3]).unwrap();
    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("DAMAGED") && stdout.contains("size"),
        "{stdout}"
    );
    assert!(
        stdout.contains("import it again: talboot images import --talos v1.13.9"),
        "{stdout}"
    );
}

#[test]
fn a_bad_initramfs_is_refused_naming_the_file_and_nothing_is_written() {
    let s = Stick::new();
    std::fs::write(&s.initramfs, b"<html>404</html>").unwrap();
    let out = s.import(&[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{} is not an initramfs", s.initramfs.display())),
        "{stderr}"
    );
    assert!(!s.images.exists(), "nothing may be written");
    // Neither a command line file nor --cmdline: a usage error.
    let out = s.talboot(&[
        "import",
        "--talos",
        "v1.13.9",
        "--kernel",
        s.kernel.to_str().unwrap(),
        "--initramfs",
        s.initramfs.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// An imported set (gzip initramfs) served by talboot's HTTP side to a booting machine: the
/// per-MAC script points at it and the kernel and initramfs arrive byte for byte.
#[test]
fn an_imported_set_boots_over_http() {
    let s = Stick::new();
    let out = s.import(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use talboot::http::{ConfigDir, HttpApp, router, script::Scripts, tokens::Tokens};
        talboot::install_crypto_provider();
        let inv =
            talboot::inventory::load_with_env(&s.inventory, &std::collections::BTreeMap::new())
                .unwrap()
                .inventory;
        let catalog = talboot::artifacts::Catalog::load(&s.images).unwrap();
        for id in talboot::artifacts::required_sets(&inv) {
            talboot::artifacts::verify(&s.images, &catalog, &id).unwrap();
        }
        let configs = s.root.join("configs");
        std::fs::create_dir_all(&configs).unwrap();
        let (store, writers) = talboot::store::open(&s.root.join("state")).unwrap().split();
        let store: Arc<dyn talboot::store::Store> = store;
        let (events, _writer) = talboot::events::EventBus::start(
            writers.events,
            Arc::new(talboot::events::SystemClock),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let inv = Arc::new(inv);
        let view = Arc::new(talboot::view::StateView::new());
        let app = Arc::new(HttpApp {
            inventory: inv.clone(),
            store: store.clone(),
            view: view.clone(),
            events,
            images_dir: s.images.clone(),
            catalog,
            cmdlines: Default::default(),
            base_url: base.clone(),
            scripts: Scripts::new(),
            configs: Arc::new(ConfigDir(configs)),
            tokens: Tokens::start(store.clone(), writers.tokens).0,
            observer: Arc::new(talboot::provision::OfflineObserver {
                inventory: inv.clone(),
                store: store.clone(),
                nodes: Arc::new(writers.nodes),
                view: view.clone(),
            }),
        });
        let shutdown = tokio_util::sync::CancellationToken::new();
        tokio::spawn(talboot::http::server::serve(
            listener,
            router(app),
            talboot::http::server::Limits::default(),
            "provisioning",
            shutdown.clone(),
        ));
        writers
            .leases
            .put_lease(&talboot::store::Lease {
                mac: "bc:24:11:40:00:01".parse().unwrap(),
                ip: "127.0.0.1".parse().unwrap(),
                hostname: None,
                state: talboot::store::LeaseState::Bound,
                expires_at_unix: u64::MAX / 2,
                updated_at_unix: 0,
            })
            .unwrap();
        // The lease was written behind the DHCP server's back: publish it to the read view
        // the HTTP handlers consult, as the DHCP server does after its commit.
        view.reload(store.as_ref(), &inv).unwrap();
        let c = reqwest::Client::new();
        let script = c
            .get(format!(
                "{base}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64&platform=efi"
            ))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // The URLs the firmware is told to fetch, taken from the script itself.
        let url_after = |word: &str| -> String {
            let line = script
                .lines()
                .find(|l| l.trim_start().starts_with(word))
                .unwrap_or_else(|| panic!("no `{word}` line in {script}"));
            line.split_whitespace()
                .find(|w| w.starts_with("http://"))
                .unwrap()
                .to_string()
        };
        let kernel_url = url_after("kernel ");
        let initrd_url = url_after("initrd ");
        assert!(
            kernel_url.contains(&format!("/v1.13.9/{LAB_SCHEMATIC}/amd64/")),
            "{script}"
        );
        assert!(
            script.contains("talos.platform=metal console=tty0 slab_nomerge pti=on"),
            "{script}"
        );
        for (url, file) in [(&kernel_url, &s.kernel), (&initrd_url, &s.initramfs)] {
            let body = c.get(url).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(
                body.as_ref(),
                std::fs::read(file).unwrap().as_slice(),
                "{url}"
            );
        }
        shutdown.cancel();
    });
}
