//! The Proxmox VE driver and `talboot proxmox create|destroy` against the strict PVE double
//! (`talboot::sim::proxmox`; Proxmox VE itself cannot run here). Proves the token header,
//! power through status/start|stop|reset with every task UPID polled until it stops, the
//! boot order, PVE's error shapes reaching the operator (unknown VM, a method an endpoint
//! lacks, a refused parameter, a failed task), the secret never in an error, and that create is
//! idempotent and destroy removes only VMs tagged `talboot`.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use talboot::inventory::Credential;
use talboot::power::proxmox::{ProxmoxApi, ProxmoxApiConfig};
use talboot::power::{BootDevice, BootPersistence, PowerAction, PowerError, PowerState};
use talboot::sim::proxmox::{ProxmoxDouble, ProxmoxDoubleOptions, SimVm};

fn api(pve: &ProxmoxDouble, secret: &str) -> Arc<ProxmoxApi> {
    let mut a = ProxmoxApi::new(ProxmoxApiConfig::new(
        pve.url(),
        &pve.opts.token_id,
        Credential::new(secret),
    ))
    .unwrap();
    a.poll = std::time::Duration::from_millis(20);
    Arc::new(a)
}

fn vm(name: &str, tags: &str) -> SimVm {
    SimVm {
        config: BTreeMap::from([
            ("name".to_string(), name.to_string()),
            (
                "net0".into(),
                "virtio=BC:24:11:00:00:09,bridge=vmbr0".into(),
            ),
            ("scsi0".into(), "local-lvm:vm-150-disk-0,size=32G".into()),
            ("boot".into(), "order=scsi0;net0".into()),
            ("tags".into(), tags.into()),
        ]),
        running: false,
    }
}

#[tokio::test]
async fn the_driver_powers_a_vm_and_sets_its_boot_order_through_tasks() {
    let pve = ProxmoxDouble::start(ProxmoxDoubleOptions::default())
        .await
        .unwrap();
    pve.insert_vm(150, vm("cp-1", "talboot"));
    let api = api(&pve, &pve.opts.secret);
    let d = api.vm("pve", 150);

    assert_eq!(d.power_state().await.unwrap(), PowerState::Off);
    d.set_power(PowerAction::On).await.unwrap();
    assert!(pve.vm(150).unwrap().running);
    assert!(
        pve.task_polls() >= 2,
        "the start task was not polled to its end"
    );
    // Already on: no second start (which PVE would fail as "already running").
    let before = pve.requests().len();
    d.set_power(PowerAction::On).await.unwrap();
    assert_eq!(pve.requests().len(), before + 1, "{:?}", pve.requests());
    d.set_power(PowerAction::Cycle).await.unwrap();
    assert!(pve.requests().iter().any(|r| r.ends_with("/status/reset")));
    assert_eq!(d.power_state().await.unwrap(), PowerState::On);
    d.set_power(PowerAction::Off).await.unwrap();
    assert_eq!(d.power_state().await.unwrap(), PowerState::Off);
    // Cycle of a stopped VM starts it (reset would fail: "VM 150 not running").
    d.set_power(PowerAction::Cycle).await.unwrap();
    assert_eq!(d.power_state().await.unwrap(), PowerState::On);

    d.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    assert_eq!(pve.vm(150).unwrap().config["boot"], "order=net0;scsi0");
    d.set_boot_device(BootDevice::Disk, BootPersistence::Persistent)
        .await
        .unwrap();
    assert_eq!(pve.vm(150).unwrap().config["boot"], "order=scsi0;net0");
}

#[tokio::test]
async fn pve_errors_reach_the_operator_and_the_secret_does_not() {
    let pve = ProxmoxDouble::start(ProxmoxDoubleOptions::default())
        .await
        .unwrap();
    pve.insert_vm(150, vm("cp-1", "talboot"));
    let wrong = "00000000-bad0-secret-0000-000000000000";
    let err = api(&pve, wrong)
        .vm("pve", 150)
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(err, PowerError::Unauthorized { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("bad0-secret"));

    let api = api(&pve, &pve.opts.secret);
    let err = api
        .vm("pve", 999)
        .power_state()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("500") && err.contains("qemu-server/999.conf' does not exist"),
        "{err}"
    );
    let err = api
        .vm("nope", 150)
        .power_state()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("hostname lookup 'nope' failed"), "{err}");
    // A method the endpoint lacks.
    let err = api
        .call(
            reqwest::Method::GET,
            "/nodes/pve/qemu/150/status/start",
            &[],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("501")
            && err.contains("Method 'GET /nodes/pve/qemu/150/status/start' not implemented"),
        "{err}"
    );
    // A parameter the schema lacks, and a malformed one.
    let err = api
        .call(
            reqwest::Method::PUT,
            "/nodes/pve/qemu/150/config",
            &[("bootdisk_order", "x".into()), ("memory", "lots".into())],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("400")
            && err.contains("Parameter verification failed.")
            && err.contains("bootdisk_order: property is not defined")
            && err.contains("memory: type check"),
        "{err}"
    );
    // A task that fails: reset of a stopped VM.
    let err = api
        .call_task(
            "pve",
            reqwest::Method::POST,
            "/nodes/pve/qemu/150/status/reset",
            &[],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("failed: VM 150 not running"), "{err}");
}

const HEAD: &str = "\
cluster:
  name: lab
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.11:6443
network:
  interfaces: [eth0]
  subnet: 10.0.40.0/24
nodes:
";

/// The inventory of docs/operations.md's Proxmox walkthrough is one `talboot check` accepts,
/// so the typed `power:` names the walkthrough shows are the ones the loader reads.
#[test]
fn the_walkthrough_inventory_passes_check() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let section = &doc[doc.find("## A Proxmox VE home lab").expect("walkthrough")..];
    let start = section.find("```yaml\n").expect("its inventory") + "```yaml\n".len();
    let yaml: String = section[start..start + section[start..].find("```").unwrap()]
        .lines()
        .map(|l| l.strip_prefix("   ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(yaml.contains("vm: {memory: 4096"), "{yaml}");
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("talboot.yaml");
    std::fs::write(&inv, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .arg("check")
        .arg("-c")
        .arg(&inv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn talboot(inv: &std::path::Path, secret: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(["proxmox"])
        .args(args)
        .arg("--config")
        .arg(inv)
        .env("TALBOOT_PROXMOX_TOKEN_SECRET", secret)
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_create_is_idempotent_and_destroy_touches_only_talboot_vms() {
    let pve = ProxmoxDouble::start(ProxmoxDoubleOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("talboot.yaml");
    let block = |vmid: u32| {
        format!(
            "    power:\n      kind: proxmox\n      apiUrl: {}\n      node: pve\n      vmid: {vmid}\n      tokenId: {}\n      tokenSecretEnv: TALBOOT_PROXMOX_TOKEN_SECRET\n      verifyTls: false\n      vm: {{memory: 2048, cores: 2, diskGib: 20, bridges: [vmbr0]}}\n",
            pve.url(),
            pve.opts.token_id
        )
    };
    let node = |name: &str, mac: &str, ip: &str, role: &str| {
        format!(
            "  - name: {name}\n    mac: {mac}\n    role: {role}\n    address: {ip}/24\n    installDisk: /dev/sda\n"
        )
    };
    std::fs::write(
        &inv,
        format!(
            "{HEAD}{}{}{}    interfaces: [{{mac: bc:24:11:00:01:02, addresses: [10.0.41.21/24]}}]\n{}",
            node("cp-1", "bc:24:11:00:00:01", "10.0.40.11", "controlplane"),
            block(201),
            node("wk-1", "bc:24:11:00:00:02", "10.0.40.21", "worker"),
            block(202)
        ),
    )
    .unwrap();
    let secret = pve.opts.secret.clone();
    let inv2 = inv.clone();
    let run = move |args: &'static [&'static str]| {
        let (inv, secret) = (inv2.clone(), secret.clone());
        tokio::task::spawn_blocking(move || talboot(&inv, &secret, args))
    };

    let (ok, out, err) = run(&["create"]).await.unwrap();
    assert!(ok, "{out}{err}");
    assert!(
        !err.contains(&pve.opts.secret) && !out.contains(&pve.opts.secret),
        "secret printed: {err}"
    );
    let cp = pve.vm(201).expect("cp-1 created");
    assert_eq!(cp.config["net0"], "virtio=BC:24:11:00:00:01,bridge=vmbr0");
    assert_eq!(cp.config["boot"], "order=net0;scsi0");
    assert_eq!(cp.config["cpu"], "host");
    assert_eq!(cp.config["scsi0"], "local-lvm:20");
    assert_eq!(cp.config["tags"], "talboot");
    let wk = pve.vm(202).expect("wk-1 created");
    assert_eq!(wk.config["net1"], "virtio=BC:24:11:00:01:02,bridge=vmbr0");

    // Again: nothing created twice, nothing changed.
    let creates = |p: &ProxmoxDouble| {
        p.requests()
            .iter()
            .filter(|r| *r == "POST /api2/json/nodes/pve/qemu")
            .count()
    };
    assert_eq!(creates(&pve), 2);
    let (ok, out, err) = run(&["create"]).await.unwrap();
    assert!(ok, "{out}{err}");
    assert_eq!(creates(&pve), 2, "{out}");
    assert!(out.contains("cp-1: VM 201 already as wanted"), "{out}");

    // Destroy: the talboot VMs go, a foreign VM at an inventory vmid stays.
    pve.insert_vm(150, vm("not-ours", "prod"));
    std::fs::write(
        &inv,
        std::fs::read_to_string(&inv).unwrap()
            + &node("other", "bc:24:11:00:00:03", "10.0.40.22", "worker")
            + &block(150),
    )
    .unwrap();
    let (ok, out, err) = run(&["create"]).await.unwrap();
    assert!(
        !ok && err.contains("VM 150 (not-ours) exists and is not tagged `talboot`"),
        "{out}{err}"
    );
    assert_eq!(pve.vm(150).unwrap().config["name"], "not-ours");
    talboot::power::proxmox::ProxmoxApi::new(ProxmoxApiConfig::new(
        pve.url(),
        &pve.opts.token_id,
        Credential::new(pve.opts.secret.clone()),
    ))
    .map(Arc::new)
    .unwrap()
    .vm("pve", 201)
    .set_power(PowerAction::On)
    .await
    .unwrap();
    let (ok, out, err) = run(&["destroy"]).await.unwrap();
    assert!(!ok, "the foreign VM is reported: {out}{err}");
    assert!(
        err.contains("other: VM 150 (not-ours) is not tagged `talboot`"),
        "{err}"
    );
    assert!(pve.vm(201).is_none() && pve.vm(202).is_none(), "{out}{err}");
    assert!(pve.vm(150).is_some());
}

/// Issue 27 item 4: `check --probe`'s Secure Boot reading of a Proxmox VM is its config's
/// `bios` and `efidisk0` `pre-enrolled-keys` (proxmox/qemu-server 9.2.6
/// `src/PVE/QemuServer/Drive.pm`), read through the driver from the double's
/// `GET /nodes/{node}/qemu/{vmid}/config`.
#[tokio::test]
async fn the_driver_reads_secure_boot_from_the_vm_config() {
    use talboot::inventory::{ProxmoxTarget, VmShape};
    use talboot::power::PowerDriver;
    use talboot::power::secureboot::SecureBootProbe;
    let pve = ProxmoxDouble::start(ProxmoxDoubleOptions::default())
        .await
        .unwrap();
    let mut keyed = vm("sb-1", "talboot");
    keyed.config.insert("bios".into(), "ovmf".into());
    keyed.config.insert(
        "efidisk0".into(),
        "local-lvm:vm-151-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M".into(),
    );
    pve.insert_vm(151, keyed);
    pve.insert_vm(152, vm("plain", "talboot"));
    let driver = |vmid| {
        PowerDriver::Proxmox(ProxmoxTarget {
            api_url: pve.url().to_string(),
            node: "pve".into(),
            vmid,
            token_id: pve.opts.token_id.clone(),
            token_secret: Credential::new(pve.opts.secret.clone()),
            verify_tls: true,
            ca: None,
            vm: VmShape::default(),
        })
    };
    let sb = driver(151).secure_boot().await.unwrap();
    assert_eq!(
        sb,
        SecureBootProbe::Proxmox {
            ovmf: true,
            efidisk: true,
            pre_enrolled_keys: true
        }
    );
    assert_eq!(sb.not_enforcing(), None);
    let plain = driver(152).secure_boot().await.unwrap();
    assert!(plain.not_enforcing().unwrap().contains("OVMF"), "{plain:?}");
}
