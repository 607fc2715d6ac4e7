//! The Debian package: built with cargo-deb from the binary this test run already built
//! (`packaging/build-deb --no-build`), installed on this machine with dpkg (the tests run as
//! root on a Debian 12 machine), checked (files, modes, owners, the system user, the unit with
//! `systemd-analyze verify` and `security --offline`, `talboot --version` from /usr/bin as the
//! talboot user), then purged, which must leave nothing behind. A guard purges it on failure
//! too; the test refuses to run where a talboot package is already installed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "talboot"])
        .output()
        .map(|o| text(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Purges the package when dropped, so a failing assertion does not leave it installed.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "talboot"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output();
    }
}

/// (mode bits, uid, gid) of a path.
fn meta(p: &str) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    (m.permissions().mode() & 0o7777, m.uid(), m.gid())
}

fn id_of(db: &str, name: &str) -> Option<Vec<String>> {
    let out = Command::new("getent").args([db, name]).output().ok()?;
    out.status.success().then(|| {
        text(&out.stdout)
            .trim()
            .split(':')
            .map(str::to_string)
            .collect()
    })
}

/// The `.deb` built from this run's binary.
fn build_package(out_dir: &Path) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_talboot"));
    // <target>/<profile dir>/talboot
    let profile_dir = bin.parent().unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev".to_string(),
        other => other.to_string(),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    run(Command::new(root.join("packaging/build-deb"))
        .args(["--no-build", "--fast", "--profile", &profile, "--output"])
        .arg(out_dir)
        .env("CARGO_TARGET_DIR", target_dir));
    let debs: Vec<PathBuf> = std::fs::read_dir(out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "{debs:?}");
    debs.into_iter().next().unwrap()
}

#[test]
fn the_debian_package_installs_verifies_runs_and_purges_cleanly() {
    assert!(
        !installed(),
        "a talboot package is installed on this machine; this test installs and purges its own build, so it refuses to touch that one (dpkg --purge talboot first)"
    );
    assert!(
        id_of("passwd", "talboot").is_none(),
        "a talboot user exists already; the package's purge would delete it"
    );
    let tmp = tempfile::tempdir().unwrap();
    let deb = build_package(tmp.path());

    // What the package holds, before installing it: everything root-owned.
    let listing = text(&run(Command::new("dpkg-deb").arg("-c").arg(&deb)).stdout);
    for line in listing.lines() {
        let owner = line.split_whitespace().nth(1);
        assert!(
            matches!(owner, Some("0/0" | "root/root")),
            "not root-owned: {line}"
        );
    }
    let fields = text(&run(Command::new("dpkg-deb").arg("-f").arg(&deb)).stdout);
    assert!(fields.contains("Package: talboot"), "{fields}");
    assert!(
        fields.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "{fields}"
    );

    let _purge = Purge;
    run(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(installed());
    let files: Vec<String> = text(&run(Command::new("dpkg").args(["-L", "talboot"])).stdout)
        .lines()
        .map(str::to_string)
        .collect();

    // The binary, from its installed path, as the dedicated user.
    assert_eq!(meta("/usr/bin/talboot"), (0o755, 0, 0));
    let version =
        run(Command::new("runuser").args(["-u", "talboot", "--", "/usr/bin/talboot", "--version"]));
    assert_eq!(
        text(&version.stdout).trim(),
        format!("talboot {}", env!("CARGO_PKG_VERSION"))
    );

    // The system user and its directories.
    let user = id_of("passwd", "talboot").expect("the talboot user");
    let uid: u32 = user[2].parse().unwrap();
    let gid: u32 = user[3].parse().unwrap();
    assert!(uid < 1000, "a system uid: {user:?}");
    assert_eq!(user[5], "/var/lib/talboot", "{user:?}");
    assert_eq!(user[6], "/usr/sbin/nologin", "{user:?}");
    assert_eq!(meta("/var/lib/talboot"), (0o750, uid, gid));
    assert_eq!(meta("/etc/talboot"), (0o750, 0, gid));

    // The default configuration file, a conffile.
    assert_eq!(meta("/etc/default/talboot"), (0o644, 0, 0));
    let conffiles =
        text(&run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "talboot"])).stdout);
    assert!(conffiles.contains("/etc/default/talboot"), "{conffiles}");
    let default = std::fs::read_to_string("/etc/default/talboot").unwrap();
    assert!(
        default.contains("TALBOOT_CONFIG=/etc/talboot/talboot.yaml"),
        "{default}"
    );

    // Man pages (compressed, one per subcommand) and completions, from the clap definition.
    for page in [
        "talboot.1.gz",
        "talboot-serve.1.gz",
        "talboot-images-import.1.gz",
    ] {
        let p = format!("/usr/share/man/man1/{page}");
        assert_eq!(meta(&p), (0o644, 0, 0), "{p}");
        let roff = run(Command::new("zcat").arg(&p));
        assert!(text(&roff.stdout).contains(".TH talboot"), "{p}");
    }
    for f in [
        "/usr/share/bash-completion/completions/talboot",
        "/usr/share/zsh/vendor-completions/_talboot",
        "/usr/share/fish/vendor_completions.d/talboot.fish",
    ] {
        assert_eq!(meta(f), (0o644, 0, 0), "{f}");
    }
    run(Command::new("bash").args(["-n", "/usr/share/bash-completion/completions/talboot"]));

    // The unit: where dpkg put it, valid for systemd, and as tight as intended.
    let unit = files
        .iter()
        .find(|f| f.ends_with("/systemd/system/talboot.service"))
        .unwrap_or_else(|| panic!("no unit in {files:?}"))
        .clone();
    assert_eq!(meta(&unit), (0o644, 0, 0));
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    let said = text(&verify.stderr);
    assert!(
        verify.status.success() && !said.contains("talboot"),
        "systemd-analyze verify {unit}: {}\n{said}",
        verify.status
    );
    let body = std::fs::read_to_string(&unit).unwrap();
    let directive = |key: &str| -> Vec<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(directive("User"), ["talboot"]);
    assert_eq!(directive("StateDirectory"), ["talboot"]);
    assert_eq!(
        directive("CapabilityBoundingSet"),
        ["CAP_NET_BIND_SERVICE CAP_NET_RAW"]
    );
    assert_eq!(
        directive("AmbientCapabilities"),
        ["CAP_NET_BIND_SERVICE CAP_NET_RAW"]
    );
    assert_eq!(directive("NoNewPrivileges"), ["yes"]);
    assert_eq!(directive("ProtectSystem"), ["strict"]);
    // systemd's own exposure score for the unit (0 best, 10 worst), offline.
    let security = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit));
    let report = text(&security.stdout);
    let score: f64 = report
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for talboot.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{report}"));
    assert!(score <= 2.5, "exposure {score}:\n{report}");

    // Nothing the package installed was changed.
    let verify = run(Command::new("dpkg").args(["-V", "talboot"]));
    assert_eq!(text(&verify.stdout), "");

    // Remove: the program goes, the configuration, the state and the user stay.
    run(Command::new("dpkg").args(["-r", "talboot"]));
    assert!(!Path::new("/usr/bin/talboot").exists());
    assert!(!Path::new(&unit).exists());
    for kept in ["/etc/default/talboot", "/etc/talboot", "/var/lib/talboot"] {
        assert!(Path::new(kept).exists(), "{kept} removed before purge");
    }
    assert!(id_of("passwd", "talboot").is_some());

    // Purge: the files, the state, the configuration directory and the user are gone.
    run(Command::new("dpkg").args(["--purge", "talboot"]));
    assert!(!installed());
    for f in &files {
        let p = Path::new(f);
        // Shared directories such as /usr/share/man/man1 stay; talboot's own go.
        if p.is_dir() && !f.contains("talboot") {
            continue;
        }
        assert!(!p.exists(), "{f} left behind");
    }
    for left in ["/var/lib/talboot", "/etc/talboot", "/etc/default/talboot"] {
        assert!(!Path::new(left).exists(), "{left} left behind");
    }
    assert!(id_of("passwd", "talboot").is_none(), "user left behind");
    assert!(id_of("group", "talboot").is_none(), "group left behind");
}
