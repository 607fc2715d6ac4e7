//! The admin listener off loopback, in a network namespace pair (needs root and `ip`, `curl`):
//! `serve --admin-listen 0.0.0.0:8081 --admin-token-file F` in the server namespace answers a
//! client on the bridge only with the token (bearer header, or the dashboard's cookie got
//! from `/?token=`), answers loopback without one, never writes the token to its log, and its
//! provisioning port still serves no admin route. `serve` refuses an admin listener off
//! loopback without a token file, and a token file others can read. The dashboard part runs
//! in Debian's chromium driven by playwright-core (`tests/browser/admin_token.mjs`).

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::images::fake_images;
use support::netns::{Lab, require_tool};

const TOKEN: &str = "4f1c2a9be07d35186ac2f0e94b7d1c53";

fn config() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml")
}

/// `talboot serve` (boot files only) with `extra` arguments, as `cmd` (a namespace's).
fn serve(mut cmd: Command, tmp: &Path, extra: &[&str]) -> Command {
    cmd.arg("serve")
        .arg("-c")
        .arg(config())
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .arg("--images")
        .arg(tmp.join("images"))
        .args(["--advertise", "10.91.0.1", "--http-port", "8080"])
        .args(["--no-dhcp", "--no-tftp", "--no-provision"])
        .args(extra)
        .env("RUST_LOG", "debug")
        .env_remove("TALBOOT_ADMIN_TOKEN")
        .env_remove("TALBOOT_ADMIN_TOKEN_FILE");
    cmd
}

fn token_file(tmp: &Path, mode: u32) -> std::path::PathBuf {
    let path = tmp.join(format!("admin-token-{mode:o}"));
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// `curl` in `ns`: status code, headers and body of one request.
fn curl(lab: &Lab, client: bool, args: &[&str]) -> (u16, String) {
    let mut c = if client {
        lab.in_cli("curl")
    } else {
        lab.in_srv("curl")
    };
    let out: Output = c
        .args(["-s", "-i", "--noproxy", "*", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer to {args:?}: {text}"));
    (code, text)
}

#[test]
fn off_loopback_admin_answers_only_with_the_token() {
    if !require_tool("curl", "CURL") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fake_images(&config(), &tmp.path().join("images"));
    let mut lab = Lab::new("10.91.0");
    lab.add_client("eth0", "02:00:00:00:91:50");
    lab.ip_cli(&["addr", "add", "10.91.0.50/24", "dev", "eth0"]);

    // Off loopback without a token file: refused before anything listens, saying the fix.
    let out = serve(
        lab.in_srv(env!("CARGO_BIN_EXE_talboot")),
        tmp.path(),
        &["--admin-listen", "0.0.0.0:8081"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--admin-token-file"), "{err}");

    // A token file group or others can read: refused, naming the file and the fix.
    let loose = token_file(tmp.path(), 0o644);
    let out = serve(
        lab.in_srv(env!("CARGO_BIN_EXE_talboot")),
        tmp.path(),
        &[
            "--admin-listen",
            "0.0.0.0:8081",
            "--admin-token-file",
            loose.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(loose.to_str().unwrap()) && err.contains("chmod 600"),
        "{err}"
    );
    assert!(!err.contains(TOKEN), "{err}");

    {
        // k8s-ctrl-02 was installed in an earlier run: the browser's rebuild below resets a
        // provisioned node (a node never provisioned has nothing to reset and is refused).
        use talboot::store::{NodePhase, NodeRecord};
        let store = talboot::store::open(&tmp.path().join("state"))
            .unwrap()
            .split()
            .1
            .nodes;
        let mut r = NodeRecord::unseen("k8s-ctrl-02", 1);
        r.phase = NodePhase::Ready;
        r.provisioning_window_open = false;
        store.put_node(&r).unwrap();
    }
    let file = token_file(tmp.path(), 0o600);
    let log = tmp.path().join("serve.log");
    let child = serve(
        lab.in_srv(env!("CARGO_BIN_EXE_talboot")),
        tmp.path(),
        &[
            "--admin-listen",
            "0.0.0.0:8081",
            "--admin-token-file",
            file.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    lab.children.push(child);
    support::netns::wait_for_text(&log, "talboot serving", Duration::from_secs(30));

    let admin = "http://10.91.0.1:8081";
    let bearer = format!("Authorization: Bearer {TOKEN}");
    // From the bridge: nothing without the token, or with a wrong one.
    for args in [
        vec![format!("{admin}/api/nodes")],
        vec![format!("{admin}/")],
        vec![format!("{admin}/metrics")],
        vec![
            "-H".into(),
            "Authorization: Bearer 00000000000000000000000000000000".into(),
            format!("{admin}/api/nodes"),
        ],
        vec![
            "-H".into(),
            format!("Cookie: talboot_admin={TOKEN}x"),
            format!("{admin}/api/dashboard"),
        ],
        vec![
            "-X".into(),
            "POST".into(),
            format!("{admin}/api/nodes/k8s-ctrl-01/rebuild"),
        ],
        // The query token is for the page only.
        vec![format!("{admin}/api/nodes?token={TOKEN}")],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = curl(&lab, true, &args);
        assert_eq!(code, 401, "{args:?}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{text}"
        );
        assert!(!text.contains(TOKEN), "{text}");
    }
    // With it: the node table.
    let (code, text) = curl(&lab, true, &["-H", &bearer, &format!("{admin}/api/nodes")]);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"name\""), "{text}");

    // The dashboard: the token once in the URL, exchanged for an HttpOnly SameSite=Strict
    // cookie and a redirect that drops it from the address bar; the cookie then carries the
    // page, its snapshot and its event stream.
    let (code, text) = curl(&lab, true, &[&format!("{admin}/?token={TOKEN}")]);
    assert_eq!(code, 303, "{text}");
    let set_cookie = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {text}"));
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    assert!(
        text.to_ascii_lowercase().contains("location: /\r"),
        "{text}"
    );
    let cookie = format!("Cookie: talboot_admin={TOKEN}");
    for path in ["/", "/dashboard/app.js", "/api/dashboard"] {
        let (code, text) = curl(&lab, true, &["-H", &cookie, &format!("{admin}{path}")]);
        assert_eq!(code, 200, "{path}: {text}");
    }
    let (code, text) = curl(
        &lab,
        true,
        &[
            "-H",
            &cookie,
            "--max-time",
            "2",
            &format!("{admin}/api/events"),
        ],
    );
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("text/event-stream"), "{text}");
    // A dashboard action (same origin, the cookie): admitted; this serve runs no provisioner,
    // so the rebuild is recorded offline and answered.
    let (code, text) = curl(
        &lab,
        true,
        &[
            "-X",
            "POST",
            "-H",
            &cookie,
            "-H",
            "Origin: http://10.91.0.1:8081",
            "-H",
            "Sec-Fetch-Site: same-origin",
            &format!("{admin}/api/nodes/nope/rebuild"),
        ],
    );
    assert_eq!(code, 404, "admitted, then no such node: {text}");

    // Loopback on the same listener: no token needed, as before.
    let (code, text) = curl(&lab, false, &["http://127.0.0.1:8081/api/nodes"]);
    assert_eq!(code, 200, "{text}");

    // The provisioning port serves no admin route, token or not.
    for path in ["/api/nodes", "/", "/api/dashboard", "/metrics"] {
        let (code, text) = curl(
            &lab,
            true,
            &["-H", &bearer, &format!("http://10.91.0.1:8080{path}")],
        );
        assert_eq!(code, 404, "{path}: {text}");
    }

    // The CLI from the bridge: `status --admin` sends TALBOOT_ADMIN_TOKEN, or the file.
    let status = |env: Option<&str>, file: Option<&Path>| {
        let mut c = lab.in_cli(env!("CARGO_BIN_EXE_talboot"));
        c.arg("status")
            .arg("-c")
            .arg(config())
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .args(["--admin", "10.91.0.1:8081"])
            .env_remove("TALBOOT_ADMIN_TOKEN")
            .env_remove("TALBOOT_ADMIN_TOKEN_FILE");
        if let Some(t) = env {
            c.env("TALBOOT_ADMIN_TOKEN", t);
        }
        if let Some(f) = file {
            c.arg("--admin-token-file").arg(f);
        }
        c.output().unwrap()
    };
    let out = status(None, None);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for out in [status(Some(TOKEN), None), status(None, Some(&file))] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("k8s-ctrl-01"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The dashboard in a real browser on the bridge (Debian's chromium, playwright-core as
    // tests/dashboard.rs uses them): refused without the token, then `/?token=` once.
    let browser = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        Path::new("/usr/bin/chromium").exists()
            && browser.join("node_modules/playwright-core").exists(),
        "this test needs Debian's chromium and playwright-core in {}: run scripts/test-deps",
        browser.display()
    );
    let out = lab
        .in_cli("node")
        .arg(browser.join("admin_token.mjs"))
        .args([admin, TOKEN, "k8s-ctrl-02"])
        .current_dir(&browser)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the dashboard through the token failed in chromium:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Nothing serve wrote carries the token, not even the refused wrong ones.
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(!written.contains(TOKEN), "{written}");
}
