//! `talboot proxmox create|destroy`: the inventory's Proxmox VE VMs for a home lab. `create`
//! makes each node whose `power:` block is `kind: proxmox` a VM with its MACs pinned per NIC,
//! network-first boot order then disk, CPU type `host` (Talos needs x86-64-v2), the disk size,
//! memory and bridge per NIC given, tagged `talboot`; run again, it changes only what differs
//! and creates nothing twice. `destroy` removes only VMs carrying the `talboot` tag.
//!
//! The inventory is read here through a small lenient view of the `nodes[].power` block
//! (the typed `power:` block belongs to the inventory; the two are reconciled at merge). The
//! token secret comes from the environment (`tokenSecretEnv`, default
//! `TALBOOT_PROXMOX_TOKEN_SECRET`), never from the file. The decisions (`create_params`,
//! `create_step`) are pure; `run` is the adapter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde::Deserialize;
use serde_json::Value;

use super::{EXIT_INVALID, EXIT_USAGE};
use crate::power::proxmox::{ProxmoxApi, ProxmoxApiConfig, TALBOOT_TAG, VmSummary, parse_tags};
use crate::power::{Credential, PowerAction};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Create (or bring in line) the VMs of the inventory's `kind: proxmox` nodes.
    Create(Common),
    /// Stop and delete those VMs; only VMs tagged `talboot` are touched.
    Destroy(Common),
}

#[derive(Debug, clap::Args)]
pub struct Common {
    /// Inventory file.
    #[arg(
        long = "config",
        env = "TALBOOT_CONFIG",
        default_value = "talboot.yaml"
    )]
    pub config: PathBuf,
    /// Only these nodes (by name); all `kind: proxmox` nodes when absent.
    #[arg(long = "node")]
    pub nodes: Vec<String>,
}

/// The part of the inventory this command reads.
#[derive(Debug, Deserialize)]
struct InvFile {
    #[serde(default)]
    nodes: Vec<InvNode>,
}

#[derive(Debug, Deserialize)]
struct InvNode {
    name: String,
    mac: Option<String>,
    #[serde(default)]
    macs: Vec<String>,
    #[serde(default)]
    interfaces: Vec<Iface>,
    power: Option<PowerBlock>,
}

#[derive(Debug, Deserialize)]
struct Iface {
    mac: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PowerBlock {
    kind: String,
    api: Option<String>,
    node: Option<String>,
    vmid: Option<u32>,
    token_id: Option<String>,
    token_secret_env: Option<String>,
    #[serde(default = "yes")]
    tls_verify: bool,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    vm: VmShape,
}

fn yes() -> bool {
    true
}

/// The VM's shape (`power.vm`), with home-lab defaults.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct VmShape {
    /// MiB.
    pub memory: u32,
    pub cores: u32,
    /// GiB of the first disk (`scsi0`).
    pub disk_gib: u32,
    pub storage: String,
    /// Bridge per NIC, in NIC order; the last one is reused for further NICs.
    pub bridges: Vec<String>,
}

impl Default for VmShape {
    fn default() -> Self {
        Self {
            memory: 4096,
            cores: 2,
            disk_gib: 32,
            storage: "local-lvm".into(),
            bridges: vec!["vmbr0".into()],
        }
    }
}

/// One VM to create, resolved from a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub name: String,
    pub api: String,
    pub pve_node: String,
    pub vmid: u32,
    pub token_id: String,
    pub secret_env: String,
    pub tls_verify: bool,
    pub ca_file: Option<PathBuf>,
    /// Boot NIC first, then the node's other interfaces.
    pub macs: Vec<String>,
    pub shape: VmShape,
}

fn spec_of(file: &Path, i: usize, n: &InvNode) -> Result<Option<VmSpec>, String> {
    let Some(p) = &n.power else { return Ok(None) };
    if p.kind != "proxmox" {
        return Ok(None);
    }
    let field = |f: &str| format!("{}: nodes[{i}] ({}).power.{f}", file.display(), n.name);
    let need = |v: &Option<String>, f: &str, eg: &str| {
        v.clone()
            .ok_or_else(|| format!("{} is missing (e.g. {f}: {eg})", field(f)))
    };
    let api = need(&p.api, "api", "https://pve.lan:8006")?;
    let pve_node = need(&p.node, "node", "pve")?;
    let token_id = need(&p.token_id, "tokenId", "talboot@pve!lab")?;
    crate::power::proxmox::check_token_id(&token_id)
        .map_err(|e| format!("{}: {e}", field("tokenId")))?;
    let vmid = p
        .vmid
        .ok_or_else(|| format!("{} is missing (e.g. vmid: 201)", field("vmid")))?;
    if vmid < 100 {
        return Err(format!(
            "{}: {vmid} is below 100, the lowest VM id Proxmox takes",
            field("vmid")
        ));
    }
    let mut macs: Vec<String> = n
        .mac
        .iter()
        .cloned()
        .chain(n.macs.iter().cloned())
        .collect();
    macs.extend(n.interfaces.iter().map(|f| f.mac.clone()));
    let mut seen = std::collections::BTreeSet::new();
    macs.retain(|m| seen.insert(m.to_ascii_lowercase()));
    if macs.is_empty() {
        return Err(format!(
            "{}: nodes[{i}] ({}) has no mac",
            file.display(),
            n.name
        ));
    }
    for m in &mut macs {
        let ok = m.len() == 17
            && m.split([':', '-'])
                .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
        if !ok {
            return Err(format!(
                "{}: nodes[{i}] ({}): `{m}` is not a MAC address",
                file.display(),
                n.name
            ));
        }
        *m = m.replace('-', ":").to_ascii_uppercase();
    }
    if p.vm.bridges.is_empty() {
        return Err(format!(
            "{} is empty; give a bridge per NIC (e.g. [vmbr0])",
            field("vm.bridges")
        ));
    }
    if p.vm.memory < 2048 {
        return Err(format!(
            "{}: {} MiB is below the 2048 MiB Talos needs",
            field("vm.memory"),
            p.vm.memory
        ));
    }
    Ok(Some(VmSpec {
        name: n.name.clone(),
        api,
        pve_node,
        vmid,
        token_id,
        secret_env: p
            .token_secret_env
            .clone()
            .unwrap_or_else(|| "TALBOOT_PROXMOX_TOKEN_SECRET".into()),
        tls_verify: p.tls_verify,
        ca_file: p.ca_file.clone(),
        macs,
        shape: p.vm.clone(),
    }))
}

/// The `kind: proxmox` nodes of an inventory file's text.
pub fn specs(file: &Path, text: &str) -> Result<Vec<VmSpec>, String> {
    let inv: InvFile =
        yaml_serde::from_str(text).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut out = Vec::new();
    for (i, n) in inv.nodes.iter().enumerate() {
        if let Some(s) = spec_of(file, i, n)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// The VM config talboot wants for `spec` (the parameters of `POST /nodes/{node}/qemu`,
/// qemu-server PVE/API2/Qemu.pm create_vm), without `vmid`.
pub fn create_params(spec: &VmSpec) -> Vec<(String, String)> {
    let s = &spec.shape;
    let mut p = vec![
        ("name".to_string(), spec.name.clone()),
        ("memory".into(), s.memory.to_string()),
        ("cores".into(), s.cores.to_string()),
        // Talos needs x86-64-v2; `host` passes the CPU through.
        ("cpu".into(), "host".into()),
        ("ostype".into(), "l26".into()),
        ("scsihw".into(), "virtio-scsi-pci".into()),
        ("scsi0".into(), format!("{}:{}", s.storage, s.disk_gib)),
        ("boot".into(), "order=net0;scsi0".into()),
        ("tags".into(), TALBOOT_TAG.into()),
    ];
    for (i, mac) in spec.macs.iter().enumerate() {
        let bridge = s
            .bridges
            .get(i)
            .or(s.bridges.last())
            .expect("checked non-empty");
        p.push((format!("net{i}"), format!("virtio={mac},bridge={bridge}")));
    }
    p
}

/// What `create` does for one spec, given what Proxmox has at its vmid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateStep {
    Create(Vec<(String, String)>),
    /// A talboot VM whose config differs: these parameters are set (`PUT .../config`).
    Update(Vec<(String, String)>),
    Unchanged,
    /// The vmid belongs to a VM talboot did not create.
    Refuse(String),
}

/// Compare wanted parameters with a VM's config. The disk is left out of updates: its size
/// is a separate resize call and shrinking is refused by Proxmox anyway.
pub fn create_step(spec: &VmSpec, existing: Option<(&VmSummary, &Value)>) -> CreateStep {
    let want = create_params(spec);
    let Some((summary, config)) = existing else {
        return CreateStep::Create(want);
    };
    if !summary.tags.iter().any(|t| t == TALBOOT_TAG) {
        return CreateStep::Refuse(format!(
            "VM {} ({}) exists and is not tagged `{TALBOOT_TAG}`; pick another vmid or tag it yourself",
            spec.vmid, summary.name
        ));
    }
    let have = |k: &str| -> Option<String> {
        config.get(k).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let differs: Vec<(String, String)> = want
        .into_iter()
        .filter(|(k, _)| k != "scsi0")
        .filter(|(k, v)| match k.as_str() {
            // PVE writes tags back sorted and `;`-separated; the NIC line may carry defaults.
            "tags" => !parse_tags(&have(k).unwrap_or_default())
                .iter()
                .any(|t| t == TALBOOT_TAG),
            _ if k.starts_with("net") => {
                let h = have(k).unwrap_or_default();
                !h.split(',')
                    .collect::<Vec<_>>()
                    .starts_with(&v.split(',').collect::<Vec<_>>())
            }
            _ => have(k).as_deref() != Some(v.as_str()),
        })
        .collect();
    if differs.is_empty() {
        CreateStep::Unchanged
    } else {
        CreateStep::Update(differs)
    }
}

pub fn run(args: &Args) -> ExitCode {
    let (common, destroy) = match &args.action {
        Action::Create(c) => (c, false),
        Action::Destroy(c) => (c, true),
    };
    let text = match std::fs::read_to_string(&common.config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("talboot: {}: {e}", common.config.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut specs = match specs(&common.config, &text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    if !common.nodes.is_empty() {
        specs.retain(|s| common.nodes.contains(&s.name));
    }
    if specs.is_empty() {
        eprintln!(
            "talboot: {}: no node has a `power: {{kind: proxmox}}` block{}",
            common.config.display(),
            if common.nodes.is_empty() {
                ""
            } else {
                " among those named"
            }
        );
        return ExitCode::from(EXIT_INVALID);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let ok = rt.block_on(async {
        let mut apis: BTreeMap<(String, String), Arc<ProxmoxApi>> = BTreeMap::new();
        let mut all_ok = true;
        for spec in &specs {
            let key = (spec.api.clone(), spec.token_id.clone());
            let api = match apis.get(&key) {
                Some(a) => a.clone(),
                None => match connect(spec) {
                    Ok(a) => {
                        apis.insert(key, a.clone());
                        a
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", spec.name);
                        all_ok = false;
                        continue;
                    }
                },
            };
            let result = if destroy {
                destroy_one(&api, spec).await
            } else {
                create_one(&api, spec).await
            };
            match result {
                Ok(line) => println!("{}: {line}", spec.name),
                Err(e) => {
                    eprintln!("{}: {e}", spec.name);
                    all_ok = false;
                }
            }
        }
        all_ok
    });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    }
}

fn connect(spec: &VmSpec) -> Result<Arc<ProxmoxApi>, String> {
    let secret = std::env::var(&spec.secret_env).map_err(|_| {
        format!(
            "the API token secret is not in ${} (set it, or name another variable in power.tokenSecretEnv)",
            spec.secret_env
        )
    })?;
    let mut cfg = ProxmoxApiConfig::new(&spec.api, &spec.token_id, Credential::new(secret));
    cfg.verify_tls = spec.tls_verify;
    if let Some(ca) = &spec.ca_file {
        cfg.ca_pem =
            Some(std::fs::read(ca).map_err(|e| format!("power.caFile {}: {e}", ca.display()))?);
    }
    ProxmoxApi::new(cfg)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

async fn existing(api: &ProxmoxApi, spec: &VmSpec) -> Result<Option<(VmSummary, Value)>, String> {
    let list = api
        .list_vms(&spec.pve_node)
        .await
        .map_err(|e| e.to_string())?;
    let Some(summary) = list.into_iter().find(|v| v.vmid == spec.vmid) else {
        return Ok(None);
    };
    let config = api
        .vm_config(&spec.pve_node, spec.vmid)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some((summary, config)))
}

async fn create_one(api: &Arc<ProxmoxApi>, spec: &VmSpec) -> Result<String, String> {
    let have = existing(api, spec).await?;
    let step = create_step(spec, have.as_ref().map(|(s, c)| (s, c)));
    let node_path = format!("/nodes/{}/qemu", spec.pve_node);
    match step {
        CreateStep::Create(params) => {
            let mut p: Vec<(&str, String)> = vec![("vmid", spec.vmid.to_string())];
            p.extend(params.iter().map(|(k, v)| (k.as_str(), v.clone())));
            api.call_task(&spec.pve_node, reqwest::Method::POST, &node_path, &p)
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "created VM {} on {} ({})",
                spec.vmid,
                spec.pve_node,
                spec.macs.join(", ")
            ))
        }
        CreateStep::Update(params) => {
            let p: Vec<(&str, String)> = params
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect();
            api.call(
                reqwest::Method::PUT,
                &format!("{node_path}/{}/config", spec.vmid),
                &p,
            )
            .await
            .map_err(|e| e.to_string())?;
            let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            Ok(format!("VM {} updated ({})", spec.vmid, keys.join(", ")))
        }
        CreateStep::Unchanged => Ok(format!("VM {} already as wanted", spec.vmid)),
        CreateStep::Refuse(why) => Err(why),
    }
}

async fn destroy_one(api: &Arc<ProxmoxApi>, spec: &VmSpec) -> Result<String, String> {
    let Some((summary, _)) = existing(api, spec).await? else {
        return Ok(format!("VM {} does not exist", spec.vmid));
    };
    if !summary.tags.iter().any(|t| t == TALBOOT_TAG) {
        return Err(format!(
            "VM {} ({}) is not tagged `{TALBOOT_TAG}`; talboot did not create it and leaves it alone",
            spec.vmid, summary.name
        ));
    }
    if summary.running {
        api.vm(&spec.pve_node, spec.vmid)
            .set_power(PowerAction::Off)
            .await
            .map_err(|e| e.to_string())?;
    }
    api.call_task(
        &spec.pve_node,
        reqwest::Method::DELETE,
        &format!("/nodes/{}/qemu/{}", spec.pve_node, spec.vmid),
        &[],
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(format!("destroyed VM {}", spec.vmid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const INV: &str = "
cluster: {name: lab}
nodes:
  - name: cp-1
    mac: bc:24:11:00:00:01
    interfaces: [{mac: bc-24-11-00-01-01}]
    power:
      kind: proxmox
      api: https://pve.lan:8006
      node: pve
      vmid: 201
      tokenId: talboot@pve!lab
      vm: {memory: 4096, cores: 4, diskGib: 40, bridges: [vmbr0, vmbr1]}
  - name: wk-1
    mac: bc:24:11:00:00:02
    power: {kind: wol, mac: bc:24:11:00:00:02}
";

    fn spec() -> VmSpec {
        specs(Path::new("t.yaml"), INV).unwrap().remove(0)
    }

    #[test]
    fn only_proxmox_nodes_become_vms_with_their_nics_pinned() {
        let all = specs(Path::new("t.yaml"), INV).unwrap();
        assert_eq!(all.len(), 1);
        let p = create_params(&all[0]);
        let get = |k: &str| p.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("net0"), Some("virtio=BC:24:11:00:00:01,bridge=vmbr0"));
        assert_eq!(get("net1"), Some("virtio=BC:24:11:00:01:01,bridge=vmbr1"));
        assert_eq!(get("boot"), Some("order=net0;scsi0"));
        assert_eq!(get("cpu"), Some("host"));
        assert_eq!(get("scsi0"), Some("local-lvm:40"));
        assert_eq!(get("memory"), Some("4096"));
        assert_eq!(get("tags"), Some("talboot"));
    }

    #[test]
    fn missing_or_bad_fields_name_the_file_and_field() {
        let e = specs(Path::new("t.yaml"), &INV.replace("      vmid: 201\n", "")).unwrap_err();
        assert!(e.contains("t.yaml") && e.contains("power.vmid"), "{e}");
        let e = specs(
            Path::new("t.yaml"),
            &INV.replace("talboot@pve!lab", "talboot"),
        )
        .unwrap_err();
        assert!(e.contains("power.tokenId"), "{e}");
        let e = specs(
            Path::new("t.yaml"),
            &INV.replace("memory: 4096", "memory: 512"),
        )
        .unwrap_err();
        assert!(e.contains("vm.memory") && e.contains("2048"), "{e}");
    }

    #[test]
    fn create_is_idempotent_and_never_adopts_a_foreign_vm() {
        let s = spec();
        assert!(matches!(create_step(&s, None), CreateStep::Create(_)));
        let summary = VmSummary {
            vmid: 201,
            name: "cp-1".into(),
            running: false,
            tags: vec!["talboot".into()],
        };
        let mut cfg: serde_json::Map<String, Value> = create_params(&s)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        cfg.insert("memory".into(), json!(4096));
        cfg.insert(
            "net0".into(),
            json!("virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1"),
        );
        let cfg = Value::Object(cfg);
        assert_eq!(
            create_step(&s, Some((&summary, &cfg))),
            CreateStep::Unchanged
        );
        let mut changed = cfg.clone();
        changed["boot"] = json!("order=scsi0;net0");
        changed["net1"] = json!("virtio=BC:24:11:00:99:99,bridge=vmbr1");
        assert_eq!(
            create_step(&s, Some((&summary, &changed))),
            CreateStep::Update(vec![
                ("boot".into(), "order=net0;scsi0".into()),
                (
                    "net1".into(),
                    "virtio=BC:24:11:00:01:01,bridge=vmbr1".into()
                ),
            ])
        );
        let foreign = VmSummary {
            tags: vec![],
            ..summary
        };
        assert!(matches!(
            create_step(&s, Some((&foreign, &cfg))),
            CreateStep::Refuse(_)
        ));
    }
}
