//! `talboot images pull/list/verify` against a local stand-in for the Image Factory that serves
//! the factory's URL shape on loopback (with Range support), counting what it was asked for.

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
