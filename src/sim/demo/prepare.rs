//! The demo's work directory, made before anything runs: the operator's inventory and its
//! patches relocated onto loopback, the stand-in boot files and iPXE binaries, the add-on
//! manifest sets, the private state directory, and the throwaway secrets bundle where the
//! relocated inventory names it. Also the checks that refuse a rack the simulation cannot
//! run (proxy DHCP, pull delivery, an endpoint outside the rack).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{DemoError, DemoOptions, prep};
use crate::inventory::{self, EndpointHost, Inventory};
use crate::machineconfig::secrets::SecretsBundle;
use crate::sim::relocate::Relocation;

/// The Cilium manifest set of the demo (an abridged rendering; see the file's header).
const CILIUM_MANIFEST: &str = include_str!("../manifests/cilium/cilium.yaml");
/// The Argo CD manifest set of the demo.
const ARGOCD_MANIFEST: &str = include_str!("../manifests/argocd/argo-cd.yaml");

/// The Kubernetes API port on the cluster endpoint.
pub(super) const KUBE_API_PORT: u16 = 6443;

/// Everything prepared on disk before anything runs.
pub(super) struct Prepared {
    /// The relocated inventory file.
    pub(super) inventory_path: PathBuf,
    pub(super) relocation: Relocation,
    /// The cluster endpoint's (loopback) address, where the API double listens.
    pub(super) api_ip: Ipv4Addr,
    pub(super) inventory: Arc<Inventory>,
    pub(super) images: PathBuf,
    pub(super) tftp_root: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) addons: PathBuf,
}

/// Copies the YAML files of the inventory's folder (patches, talenv.yaml, ...) into
/// `dest`, every rack address relocated. Returns the relocated inventory's path.
pub(crate) fn mirror_config(
    config: &Path,
    relocation: &Relocation,
    dest: &Path,
) -> Result<PathBuf, DemoError> {
    let src_dir = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut stack = vec![(src_dir.to_owned(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| prep(&dir)(e.to_string()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() && depth < 3 {
                stack.push((path, depth + 1));
            } else if ft.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
                let rel = path.strip_prefix(src_dir).unwrap_or(&path);
                let out = dest.join(rel);
                let text =
                    std::fs::read_to_string(&path).map_err(|e| prep(&path)(e.to_string()))?;
                if let Some(parent) = out.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| prep(parent)(e.to_string()))?;
                }
                std::fs::write(&out, relocation.rewrite(&text))
                    .map_err(|e| prep(&out)(e.to_string()))?;
            }
        }
    }
    let file = config
        .file_name()
        .ok_or_else(|| prep(config)("not a file".into()))?;
    Ok(dest.join(file))
}

/// Writes `bundle` age-encrypted to `file` and the identity that decrypts it to `identity`,
/// when `file` is inside `workdir` and does not exist yet: an inventory naming its bundle by
/// an absolute path points at the operator's real bundle, which the demo never touches.
/// Returns whether it wrote.
pub(super) fn write_bundle(
    workdir: &Path,
    file: &Path,
    identity: &Path,
    bundle: &SecretsBundle,
) -> Result<bool, DemoError> {
    if !file.starts_with(workdir) || file.exists() {
        return Ok(false);
    }
    use age::secrecy::ExposeSecret;
    let id = age::x25519::Identity::generate();
    let text = format!("{}\n", id.to_string().expose_secret());
    crate::fsutil::write_atomic(identity, text.as_bytes(), 0o600)
        .map_err(|e| prep(identity)(e.to_string()))?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| prep(dir)(e.to_string()))?;
    }
    let plain = zeroize::Zeroizing::new(bundle.to_yaml());
    crate::crypto::age::write_encrypted(file, plain.as_bytes(), &[id.to_public().to_string()])
        .map_err(|e| prep(file)(e.to_string()))?;
    Ok(true)
}

pub(super) fn prepare(opts: &DemoOptions) -> Result<Prepared, DemoError> {
    let original = inventory::load(&opts.config)
        .map_err(|e| DemoError::Inventory(e, opts.config.clone()))?
        .inventory;
    let relocation = Relocation::for_inventory(&original)?;
    let workdir = &opts.workdir;
    if workdir.exists()
        && std::fs::read_dir(workdir)
            .map_err(|e| prep(workdir)(e.to_string()))?
            .next()
            .is_some()
    {
        return Err(prep(workdir)(
            "the directory is not empty; the demo starts from a fresh one (omit --workdir for a temporary one)".into(),
        ));
    }
    let config_dir = workdir.join("config");
    let inv_path = mirror_config(&opts.config, &relocation, &config_dir)?;
    let inventory = inventory::load(&inv_path)
        .map_err(|e| DemoError::Inventory(e, inv_path.clone()))?
        .inventory;
    if inventory.network.mode == inventory::NetworkMode::Proxy {
        return Err(DemoError::Unsupported(
            "network.mode is proxy: the machines' addresses would come from the site's own DHCP \
             server, which the simulation does not have; simulate the rack with mode \
             authoritative"
                .into(),
        ));
    }
    if inventory.boot.delivery != inventory::Delivery::Push {
        return Err(DemoError::Unsupported(
            "boot.delivery is pull: the demo shows push provisioning and the cluster steps, \
             which talboot runs in push mode only; simulate the rack with delivery push"
                .into(),
        ));
    }
    let api_ip = match &inventory.cluster.endpoint.host {
        EndpointHost::Ip(ip) if ip.is_loopback() => *ip,
        other => {
            return Err(DemoError::Unsupported(format!(
                "the cluster endpoint host {other:?} is not an address in the rack's subnets; \
                 the simulated API server listens on the endpoint's loopback image"
            )));
        }
    };
    if inventory.cluster.endpoint.port != KUBE_API_PORT {
        return Err(DemoError::Unsupported(format!(
            "the cluster endpoint port is {}; the simulated API server listens on {KUBE_API_PORT}",
            inventory.cluster.endpoint.port
        )));
    }
    let images = workdir.join("images");
    let tftp_root = workdir.join("tftp");
    let state_dir = workdir.join("state");
    let addons = workdir.join("addons");
    let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
    crate::sim::assets::write_boot_sets(&images, &inventory, now)
        .map_err(|e| prep(&images)(e.cause))?;
    crate::sim::assets::write_ipxe_binaries(&tftp_root).map_err(|e| prep(&tftp_root)(e.cause))?;
    write_addon_manifests(&addons)?;
    std::fs::create_dir_all(&state_dir).map_err(|e| prep(&state_dir)(e.to_string()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // The store holds node records and the kubeconfig: private, as `serve` wants it.
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| prep(&state_dir)(e.to_string()))?;
    }
    Ok(Prepared {
        inventory_path: inv_path,
        relocation,
        api_ip,
        inventory: Arc::new(inventory),
        images,
        tftp_root,
        state_dir,
        addons,
    })
}

pub(super) fn cilium_enabled(inv: &Inventory) -> bool {
    inv.addons.cilium.as_ref().is_some_and(|c| c.enabled)
}

pub(super) fn argocd_enabled(inv: &Inventory) -> bool {
    inv.addons.argocd.as_ref().is_some_and(|a| a.enabled)
}

/// Writes the demo's Cilium and Argo CD manifest sets as `<dir>/cilium/` and `<dir>/argocd/`
/// (the layout `serve --addon-manifests` reads).
pub(crate) fn write_addon_manifests(dir: &Path) -> Result<(), DemoError> {
    for (sub, text) in [("cilium", CILIUM_MANIFEST), ("argocd", ARGOCD_MANIFEST)] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| prep(&d)(e.to_string()))?;
        let f = d.join(format!("{sub}.yaml"));
        std::fs::write(&f, text).map_err(|e| prep(&f)(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::machineconfig::secrets::{GenerateOptions, ServiceAccountKeyKind};

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    fn opts(config: PathBuf, workdir: &Path) -> DemoOptions {
        DemoOptions {
            config,
            workdir: workdir.join("run"),
            print_events: false,
            concurrency: crate::provision::DEFAULT_CONCURRENCY,
            power_on_stagger: crate::sim::demo::DEFAULT_POWER_ON_STAGGER,
            etcd: None,
        }
    }

    #[test]
    fn the_demo_writes_its_bundle_only_inside_its_work_directory() {
        let work = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let bundle = SecretsBundle::generate(
            time::OffsetDateTime::now_utc(),
            &GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            },
        )
        .unwrap();
        let id = work.path().join("age-identity.txt");
        // The operator's own bundle, named by an absolute path: untouched.
        let theirs = elsewhere.path().join("rack1.age");
        assert!(!write_bundle(work.path(), &theirs, &id, &bundle).unwrap());
        assert!(!theirs.exists() && !id.exists());
        // In the work directory: written, and the identity decrypts it to the same bundle.
        let ours = work.path().join("config/secrets/rack1.age");
        assert!(write_bundle(work.path(), &ours, &id, &bundle).unwrap());
        let sources = crate::crypto::age::IdentitySources {
            explicit: Some(id.clone()),
            ..Default::default()
        };
        let ids = crate::crypto::age::Identities::load(&sources).unwrap();
        let plain = crate::crypto::age::decrypt(&std::fs::read(&ours).unwrap(), &ids).unwrap();
        assert_eq!(
            SecretsBundle::from_yaml(std::str::from_utf8(plain.expose()).unwrap()).unwrap(),
            bundle
        );
        // Never over an existing file.
        assert!(!write_bundle(work.path(), &ours, &id, &bundle).unwrap());
    }

    #[test]
    fn the_rack_and_its_patches_move_onto_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let p = prepare(&opts(repo("config/rack.yaml"), dir.path())).unwrap();
        let inv = &p.inventory;
        assert_eq!(
            inv.node("rack1-mon-01").unwrap().address.value.to_string(),
            "127.0.1.41/24"
        );
        assert_eq!(
            inv.cluster.vip.as_ref().unwrap().value.to_string(),
            "127.0.0.10"
        );
        // NTP (rendered as TimeSyncConfig) moved too; the patches were copied beside it.
        assert_eq!(inv.network.ntp, vec!["127.0.0.1".to_string()]);
        let patch = std::fs::read_to_string(dir.path().join("run/config/patches/rack-common.yaml"))
            .unwrap();
        assert!(!patch.contains("10.20.0."), "{patch}");
        // The operator's files are untouched, and the state directory is private.
        let original = std::fs::read_to_string(repo("config/rack.yaml")).unwrap();
        assert!(original.contains("ntp: [10.20.0.1]"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p.state_dir)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second run needs a fresh directory.
        let again = prepare(&opts(repo("config/rack.yaml"), dir.path()));
        assert!(matches!(again, Err(DemoError::Prepare { .. })));
    }

    #[test]
    fn proxy_and_pull_inventories_are_refused_with_the_reason() {
        for (from, to, want) in [
            (
                "mode: authoritative",
                "mode: proxy",
                "network.mode is proxy",
            ),
            ("delivery: push", "delivery: pull", "boot.delivery is pull"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("src");
            std::fs::create_dir_all(src.join("patches")).unwrap();
            for f in ["rack-common.yaml", "controlplane.yaml", "storage.yaml"] {
                std::fs::copy(repo("config/patches").join(f), src.join("patches").join(f)).unwrap();
            }
            let text = std::fs::read_to_string(repo("config/rack.yaml"))
                .unwrap()
                .replace(from, to);
            std::fs::write(src.join("rack.yaml"), text).unwrap();
            let err = prepare(&opts(src.join("rack.yaml"), dir.path()))
                .err()
                .unwrap_or_else(|| panic!("{to} accepted"));
            assert!(matches!(err, DemoError::Unsupported(_)), "{err}");
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
