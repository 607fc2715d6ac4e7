//! `talboot proxmox create|destroy`: the inventory's Proxmox VE VMs for a home lab. `create`
//! makes each node whose `power:` block is `kind: proxmox` a VM with its MACs pinned per NIC,
//! network-first boot order then disk, CPU type `host` (Talos needs x86-64-v2), the disk size,
//! memory and bridge per NIC given, tagged `talboot`; run again, it changes only what differs
//! and creates nothing twice. `destroy` removes only VMs carrying the `talboot` tag.
//!
//! The inventory is loaded and validated by the normal loader, so `talboot check` and this
//! command read the same typed `power:` block (`vm:` included); MACs are the node's boot MACs
//! then its extra interfaces'. The token secret is resolved like every power secret
//! ([`crate::power::credentials`]: environment variable or a key of the age/SOPS credentials
//! file), never read from the inventory. The decisions (`specs`, `create_params`,
//! `create_step`) are pure; `run` is the adapter.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde_json::Value;

use super::{EXIT_INVALID, EXIT_USAGE};
use crate::crypto::age::IdentitySources;
use crate::inventory::{self, Inventory, PowerConfig, ProxmoxTarget, SecretRef};
use crate::power::credentials::{CredentialError, Resolver};
use crate::power::proxmox::{ProxmoxApi, TALBOOT_TAG, VmSummary, parse_tags};
use crate::power::{PowerAction, PowerError};

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
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    /// Only these nodes (by name); all `kind: proxmox` nodes when absent.
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    #[command(flatten)]
    pub power_identity: super::args::PowerIdentity,
}

/// One VM to create, from a node whose `power:` is `kind: proxmox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmSpec {
    /// The node (and VM) name.
    pub name: String,
    /// The node's Proxmox target as the inventory has it (secret still a reference).
    pub target: ProxmoxTarget<SecretRef>,
    /// Boot NICs first, then the node's other interfaces, `AA:BB:..` as Proxmox writes them.
    pub macs: Vec<String>,
}

/// The `kind: proxmox` nodes of a loaded inventory.
pub(crate) fn specs(inv: &Inventory) -> Vec<VmSpec> {
    inv.nodes
        .iter()
        .filter_map(|n| {
            let Some(PowerConfig::Proxmox(t)) = &n.power else {
                return None;
            };
            let mut seen = std::collections::BTreeSet::new();
            let macs = n
                .macs
                .iter()
                .map(|m| m.value)
                .chain(n.interfaces.iter().map(|i| i.mac.value))
                .filter(|m| seen.insert(*m))
                .map(|m| m.to_string().to_ascii_uppercase())
                .collect();
            Some(VmSpec {
                name: n.name.to_string(),
                target: t.clone(),
                macs,
            })
        })
        .collect()
}

/// The VM config talboot wants for `spec` (the parameters of `POST /nodes/{node}/qemu`,
/// qemu-server PVE/API2/Qemu.pm create_vm), without `vmid`.
pub(crate) fn create_params(spec: &VmSpec) -> Vec<(String, String)> {
    let s = &spec.target.vm;
    let mut p = vec![
        ("name".to_string(), spec.name.clone()),
        ("memory".into(), s.memory_mib.to_string()),
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
pub(crate) enum CreateStep {
    Create(Vec<(String, String)>),
    /// A talboot VM whose config differs: these parameters are set (`PUT .../config`).
    Update(Vec<(String, String)>),
    Unchanged,
    /// The vmid belongs to a VM talboot did not create.
    Refuse(String),
}

/// Compare wanted parameters with a VM's config. The disk is left out of updates: its size
/// is a separate resize call and shrinking is refused by Proxmox anyway.
pub(crate) fn create_step(spec: &VmSpec, existing: Option<(&VmSummary, &Value)>) -> CreateStep {
    let want = create_params(spec);
    let Some((summary, config)) = existing else {
        return CreateStep::Create(want);
    };
    if !summary.tags.iter().any(|t| t == TALBOOT_TAG) {
        return CreateStep::Refuse(format!(
            "VM {} ({}) exists and is not tagged `{TALBOOT_TAG}`; pick another vmid or tag it yourself",
            spec.target.vmid, summary.name
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
            // Disk first is what serve sets once the node is installed (persistent disk
            // boot); a re-run of create must not send an installed VM back to reinstalling.
            "boot" => !matches!(
                have(k).as_deref(),
                Some("order=net0;scsi0" | "order=scsi0;net0")
            ),
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

/// Why one VM could not be created, brought in line or destroyed.
#[derive(Debug, thiserror::Error)]
enum VmError {
    /// The token secret did not resolve.
    #[error("{0}")]
    Credentials(#[from] CredentialError),
    /// The PVE API refused or did not answer.
    #[error("{0}")]
    Api(#[from] PowerError),
    /// [`create_step`] refused (the line says why).
    #[error("{0}")]
    Refused(String),
    /// The VM is not talboot's to destroy.
    #[error(
        "VM {vmid} ({name}) is not tagged `{tag}`; talboot did not create it and leaves it alone",
        tag = TALBOOT_TAG
    )]
    NotOurs {
        /// The VM id.
        vmid: u32,
        /// The VM's name on PVE.
        name: String,
    },
}

pub fn run(args: &Args) -> ExitCode {
    let (common, destroy) = match &args.action {
        Action::Create(c) => (c, false),
        Action::Destroy(c) => (c, true),
    };
    let specs = match chosen_specs(common) {
        Ok(s) => s,
        Err(code) => return code,
    };
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
    let env = |v: &str| std::env::var(v).ok();
    let mut resolver = Resolver::new(
        &env,
        IdentitySources::from_process_env(common.power_identity.age_identity.clone()),
    );
    if rt.block_on(apply_all(&specs, &mut resolver, destroy)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    }
}

/// The VMs the command is about: the inventory's `kind: proxmox` nodes, narrowed to the
/// ones named; none is a usage error (printed here).
fn chosen_specs(common: &Common) -> Result<Vec<VmSpec>, ExitCode> {
    let inv = match inventory::load(&common.inventory.config) {
        Ok(l) => l.inventory,
        Err(e) => {
            if let inventory::LoadError::Invalid { diagnostics, .. } = &e {
                for d in diagnostics.sorted() {
                    eprintln!("{d}");
                }
            }
            eprintln!("talboot: {e}");
            return Err(ExitCode::from(EXIT_INVALID));
        }
    };
    let mut specs = specs(&inv);
    if !common.nodes.is_empty() {
        specs.retain(|s| common.nodes.contains(&s.name));
    }
    if specs.is_empty() {
        eprintln!(
            "talboot: {}: no node has a `power: {{kind: proxmox}}` block{}",
            common.inventory.config.display(),
            if common.nodes.is_empty() {
                ""
            } else {
                " among those named"
            }
        );
        return Err(ExitCode::from(EXIT_INVALID));
    }
    Ok(specs)
}

/// Creates (or destroys) every VM in order, one API client per PVE endpoint and token, a
/// line per VM; whether all succeeded (a failure does not stop the others).
async fn apply_all(specs: &[VmSpec], resolver: &mut Resolver<'_>, destroy: bool) -> bool {
    let mut apis: BTreeMap<(String, String), Arc<ProxmoxApi>> = BTreeMap::new();
    let mut all_ok = true;
    for spec in specs {
        let key = (spec.target.api_url.clone(), spec.target.token_id.clone());
        let api = match apis.get(&key) {
            Some(a) => a.clone(),
            None => match connect(resolver, spec) {
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
}

/// The API client for `spec`, its token secret resolved (environment or credentials file).
fn connect(resolver: &mut Resolver<'_>, spec: &VmSpec) -> Result<Arc<ProxmoxApi>, VmError> {
    let cfg = resolver.config(&spec.name, &PowerConfig::Proxmox(spec.target.clone()))?;
    let PowerConfig::Proxmox(t) = cfg else {
        unreachable!("resolving keeps the kind")
    };
    Ok(crate::power::proxmox::proxmox_api(&t)?)
}

async fn existing(api: &ProxmoxApi, spec: &VmSpec) -> Result<Option<(VmSummary, Value)>, VmError> {
    let list = api.list_vms(&spec.target.node).await?;
    let Some(summary) = list.into_iter().find(|v| v.vmid == spec.target.vmid) else {
        return Ok(None);
    };
    let config = api.vm_config(&spec.target.node, spec.target.vmid).await?;
    Ok(Some((summary, config)))
}

async fn create_one(api: &Arc<ProxmoxApi>, spec: &VmSpec) -> Result<String, VmError> {
    let have = existing(api, spec).await?;
    let step = create_step(spec, have.as_ref().map(|(s, c)| (s, c)));
    let node_path = format!("/nodes/{}/qemu", spec.target.node);
    match step {
        CreateStep::Create(params) => {
            let mut p: Vec<(&str, String)> = vec![("vmid", spec.target.vmid.to_string())];
            p.extend(params.iter().map(|(k, v)| (k.as_str(), v.clone())));
            api.call_task(&spec.target.node, reqwest::Method::POST, &node_path, &p)
                .await?;
            Ok(format!(
                "created VM {} on {} ({})",
                spec.target.vmid,
                spec.target.node,
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
                &format!("{node_path}/{}/config", spec.target.vmid),
                &p,
            )
            .await?;
            let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            Ok(format!(
                "VM {} updated ({})",
                spec.target.vmid,
                keys.join(", ")
            ))
        }
        CreateStep::Unchanged => Ok(format!("VM {} already as wanted", spec.target.vmid)),
        CreateStep::Refuse(why) => Err(VmError::Refused(why)),
    }
}

async fn destroy_one(api: &Arc<ProxmoxApi>, spec: &VmSpec) -> Result<String, VmError> {
    let Some((summary, _)) = existing(api, spec).await? else {
        return Ok(format!("VM {} does not exist", spec.target.vmid));
    };
    if !summary.tags.iter().any(|t| t == TALBOOT_TAG) {
        return Err(VmError::NotOurs {
            vmid: spec.target.vmid,
            name: summary.name,
        });
    }
    if summary.running {
        api.vm(&spec.target.node, spec.target.vmid)
            .set_power(PowerAction::Off)
            .await?;
    }
    api.call_task(
        &spec.target.node,
        reqwest::Method::DELETE,
        &format!("/nodes/{}/qemu/{}", spec.target.node, spec.target.vmid),
        &[],
    )
    .await?;
    Ok(format!("destroyed VM {}", spec.target.vmid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const INV: &str = "
cluster:
  name: lab
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.11:6443
network:
  interfaces: [eth0]
  subnet: 10.0.40.0/24
nodes:
  - name: cp-1
    mac: bc:24:11:00:00:01
    role: controlplane
    address: 10.0.40.11/24
    installDisk: /dev/sda
    interfaces: [{mac: bc:24:11:00:01:01, addresses: [10.0.41.11/24]}]
    power:
      kind: proxmox
      apiUrl: https://pve.lan:8006
      node: pve
      vmid: 201
      tokenId: talboot@pve!lab
      tokenSecretEnv: PVE_TOKEN
      vm: {memory: 4096, cores: 4, diskGib: 40, bridges: [vmbr0, vmbr1]}
  - name: wk-1
    mac: bc:24:11:00:00:02
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: wol}
";

    fn all() -> Vec<VmSpec> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("talboot.yaml");
        std::fs::write(&p, INV).unwrap();
        let inv = inventory::load_with_env(&p, &BTreeMap::new())
            .unwrap()
            .inventory;
        specs(&inv)
    }

    fn spec() -> VmSpec {
        all().remove(0)
    }

    #[test]
    fn only_proxmox_nodes_become_vms_with_their_nics_pinned() {
        let all = all();
        assert_eq!(all.len(), 1);
        let p = create_params(&all[0]);
        let get = |k: &str| p.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("net0"), Some("virtio=BC:24:11:00:00:01,bridge=vmbr0"));
        assert_eq!(get("net1"), Some("virtio=BC:24:11:00:01:01,bridge=vmbr1"));
        assert_eq!(get("boot"), Some("order=net0;scsi0"));
        assert_eq!(get("cpu"), Some("host"));
        assert_eq!(get("scsi0"), Some("local-lvm:40"));
        assert_eq!(get("memory"), Some("4096"));
        assert_eq!(get("cores"), Some("4"));
        assert_eq!(get("tags"), Some("talboot"));
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
        // Disk first (set after install) is left alone; another order is brought back.
        let mut disk_first = cfg.clone();
        disk_first["boot"] = json!("order=scsi0;net0");
        assert_eq!(
            create_step(&s, Some((&summary, &disk_first))),
            CreateStep::Unchanged
        );
        changed["boot"] = json!("order=ide2;net0");
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

    #[test]
    fn the_token_secret_is_resolved_like_every_power_secret() {
        let s = spec();
        let empty = |_: &str| None;
        let mut r = Resolver::new(&empty, IdentitySources::default());
        let Err(e) = connect(&mut r, &s) else {
            panic!("connected without a secret")
        };
        let e = e.to_string();
        assert!(e.contains("PVE_TOKEN") && e.contains("cp-1"), "{e}");
        let set = |v: &str| (v == "PVE_TOKEN").then(|| "pve-secret-1".to_string());
        let mut r = Resolver::new(&set, IdentitySources::default());
        assert!(connect(&mut r, &s).is_ok());
    }
}
