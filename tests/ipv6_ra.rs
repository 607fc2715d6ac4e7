//! `serve --ipv6-ra` in a network namespace, seen by real receivers on the other side of the
//! bridge: rdisc6 (ndisc6) solicits and prints the advertisement it gets, and the client
//! kernel (accept_ra on) takes no default route and no address from it. What the
//! advertisement does to a real iPXE (its IPv6 wait ends) is measured by tests/boot_qemu.rs.
//!
//! Needs root (namespaces) and ndisc6 (scripts/test-deps).

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::images::fake_images;
use support::netns::{Lab, require_tool};

#[test]
fn router_advertisements_say_no_router_and_no_prefix() {
    if !require_tool("rdisc6", "NDISC6") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    fake_images(&config, &tmp.path().join("images"));
    let mut lab = Lab::new("10.83.0");
    lab.add_client("eth0", "02:00:00:83:00:01");
    // The client kernel listens to RAs as a host does.
    lab.in_cli("sysctl")
        .args(["-qw", "net.ipv6.conf.eth0.accept_ra=2"])
        .status()
        .unwrap();
    let log = tmp.path().join("serve.log");
    let child = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--images")
        .arg(tmp.path().join("images"))
        .args(["--interface", "br0", "--advertise", &lab.server_ip()])
        .args(["--no-dhcp", "--no-tftp", "--no-provision", "--ipv6-ra"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    lab.children.push(child);
    support::netns::wait_for_text(&log, "talboot serving", Duration::from_secs(30));

    // rdisc6 sends router solicitations and prints the first advertisement it gets (the
    // bridge's link-local address may still be tentative for a second or two).
    let deadline = Instant::now() + Duration::from_secs(30);
    let ra = loop {
        let out = lab
            .in_cli("rdisc6")
            .args(["-1", "-w", "1500", "-r", "3", "eth0"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains("Router lifetime") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no router advertisement: {text}{}\n--- serve ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let line = |key: &str| {
        ra.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}` in rdisc6's output:\n{ra}"))
            .to_owned()
    };
    assert!(
        line("Router lifetime").contains(" 0 (0x00000000) seconds"),
        "{ra}"
    );
    assert!(line("Stateful address conf.").ends_with("No"), "{ra}");
    assert!(line("Stateful other conf.").ends_with("No"), "{ra}");
    // The source link-layer address is br0's.
    assert!(line("Source link-layer address").contains(':'), "{ra}");
    assert!(!ra.contains("Prefix"), "no prefix information: {ra}");
    assert!(
        ra.contains(" from fe80::"),
        "from a link-local address: {ra}"
    );

    // The client's kernel took no default route and autoconfigured no global address.
    std::thread::sleep(Duration::from_millis(500));
    let out = lab
        .in_cli("ip")
        .args(["-6", "route", "show", "default"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
    let out = lab
        .in_cli("ip")
        .args(["-6", "addr", "show", "dev", "eth0", "scope", "global"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
}
