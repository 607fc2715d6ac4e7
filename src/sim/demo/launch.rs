//! What the demo hands talboot to start it the way `serve` starts: throwaway cluster secrets
//! (the admin talosconfig, and the bundle where the relocated inventory names it), the
//! provisioning settings, and the plan that binds talboot's servers, kept so that a restart
//! binds the same addresses.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::prepare::{Prepared, write_bundle};
use super::{DemoError, SimFailure, prep};
use crate::appliance::{DhcpPlan, Plan, ProvisioningPlan, Running};
use crate::inventory::Inventory;
use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, ServiceAccountKeyKind};
use crate::provision::Settings;
use crate::sim::machine::Wire;

/// A run's throwaway cluster secrets and what talboot and the CLI use of them.
pub(super) struct Throwaway {
    /// The bundle (also on disk, encrypted, where the relocated inventory names it).
    pub(super) bundle: SecretsBundle,
    /// talboot's credentials for the Talos API, from the admin talosconfig.
    pub(super) creds: crate::talos::ClientCreds,
    /// The identity that decrypts the bundle on disk.
    pub(super) age_identity: PathBuf,
}

/// Throwaway cluster secrets: on disk only in the work directory (the admin talosconfig and
/// kubeconfig, and the bundle encrypted to a throwaway identity). ECDSA for the
/// service-account key so the bundle takes milliseconds, not an RSA-4096 search.
pub(super) fn throwaway_secrets(inv: &Inventory, workdir: &Path) -> Result<Throwaway, DemoError> {
    let now = time::OffsetDateTime::now_utc();
    let bundle = SecretsBundle::generate(
        now,
        &GenerateOptions {
            service_account_key: ServiceAccountKeyKind::EcdsaP256,
        },
    )
    .map_err(SimFailure::from)?;
    let endpoints: Vec<String> = inv
        .control_planes()
        .map(|n| n.address.value.addr().to_string())
        .collect();
    let talosconfig = crate::machineconfig::clients::talosconfig(
        inv.cluster.name.as_str(),
        &endpoints,
        &[],
        &bundle,
        time::Duration::days(1),
        now,
    )
    .map_err(SimFailure::from)?;
    // The bundle is also written age-encrypted where the relocated inventory names it,
    // to a throwaway identity kept beside it (0600), so that `talboot plan`/`apply` run
    // against the simulated rack render exactly what the demo's talboot renders.
    let age_identity = workdir.join("age-identity.txt");
    write_bundle(workdir, &inv.cluster.secrets.file, &age_identity, &bundle)?;
    let tc_path = workdir.join("talosconfig");
    crate::fsutil::write_atomic(&tc_path, talosconfig.as_bytes(), 0o600)
        .map_err(|e| prep(&tc_path)(e.to_string()))?;
    let creds =
        crate::talos::ClientCreds::from_talosconfig(&talosconfig, Some(inv.cluster.name.as_str()))
            .map_err(SimFailure::from)?;
    Ok(Throwaway {
        bundle,
        creds,
        age_identity,
    })
}

/// The provisioner's settings for the simulated rack: what an operator would pass to
/// `serve`, with timings short enough for doubles that answer at once.
pub(super) fn settings(p: &Prepared, concurrency: usize) -> Settings {
    let inv = &p.inventory;
    let mut settings = Settings::new(p.state_dir.clone());
    settings.concurrency = concurrency;
    // An inventory with KSOPS gets a throwaway age identity for the `sops-age` Secret, as
    // an operator would pass one with `serve --ksops-age-identity`.
    if inv.addons.argocd.as_ref().is_some_and(|a| a.ksops) {
        use age::secrecy::ExposeSecret;
        let id = age::x25519::Identity::generate();
        let text = format!("{}\n", id.to_string().expose_secret());
        settings.ksops_age_identity =
            Some(Arc::new(crate::crypto::age::Secret::new(text.into_bytes())));
    }
    // Power controllers from the inventory's `power:` blocks, as `serve` builds them (the
    // example rack has none; an inventory with one gets the dashboard's power actions).
    settings.power = Arc::new(crate::power::dispatch::serve_drivers(inv, None));
    // The expected keys as `serve` reads them: from the catalog, where the simulated boot
    // set records its signed UKI's `.pcrpkey` (`sim::assets`); an unreadable catalog leaves
    // none, and the gate then refuses every secure-boot node (fails closed).
    settings.secure_boot_keys = Arc::new(
        crate::artifacts::Catalog::load(&p.images)
            .map(|c| crate::provision::secure_boot::expected_pcr_fingerprints(inv, &c))
            .unwrap_or_default(),
    );
    settings.poll_interval = Duration::from_millis(250);
    settings.install_timeout = Duration::from_secs(60);
    settings.health_timeout = Duration::from_secs(60);
    settings.addon_manifests = Some(p.addons.clone());
    settings.addon_timeouts = crate::addons::Timeouts {
        crd: Duration::from_secs(30),
        rollout: Duration::from_secs(60),
    };
    settings
}

/// The demo's secrets are new on every run: state an earlier run (or a real fleet) left
/// under the etcd prefix would not match them, so a prefix holding node records is refused.
pub(super) fn require_empty_prefix(cfg: &crate::store::EtcdConfig) -> Result<(), DemoError> {
    use crate::store::Store as _;
    let store_err = |e| DemoError::Start(crate::appliance::ApplianceError::Store(e));
    let store = crate::store::EtcdStore::open(cfg).map_err(store_err)?;
    let nodes = store.nodes().map_err(store_err)?.len();
    if nodes > 0 {
        return Err(DemoError::Unsupported(format!(
            "the etcd prefix /talboot/{}/ already holds {nodes} node record(s) from another \
             run; give the demo an empty one with --etcd-cluster",
            cfg.cluster
        )));
    }
    Ok(())
}

/// What it takes to start talboot again on the same state and the same addresses, as an
/// operator restarting `serve` would.
pub(super) struct Relaunch {
    pub(super) inventory: Arc<Inventory>,
    pub(super) images: PathBuf,
    pub(super) tftp_root: PathBuf,
    pub(super) configs: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) advertise: Ipv4Addr,
    pub(super) http: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) tftp: SocketAddr,
    pub(super) dhcp: SocketAddrV4,
    pub(super) renderer: Arc<dyn crate::machineconfig::renderer::ConfigRenderer>,
    pub(super) creds: crate::talos::ClientCreds,
    pub(super) settings: Settings,
    /// The etcd the state is kept in (`demo --store`), else the redb file in `state_dir`.
    pub(super) etcd: Option<crate::store::EtcdConfig>,
}

impl Relaunch {
    /// The first start's plan: talboot on the inventory's advertise address when it is on
    /// loopback (else 127.0.0.1), every port left to the OS until [`Relaunch::start`]
    /// records the ones bound.
    pub(super) fn new(
        p: &Prepared,
        workdir: &Path,
        secrets: &Throwaway,
        settings: Settings,
    ) -> Self {
        let inv = &p.inventory;
        let advertise = inv
            .network
            .advertise
            .as_ref()
            .map(|a| a.value)
            .filter(|a| a.is_loopback())
            .unwrap_or(Ipv4Addr::LOCALHOST);
        Relaunch {
            inventory: inv.clone(),
            images: p.images.clone(),
            tftp_root: p.tftp_root.clone(),
            configs: workdir.join("configs"),
            state_dir: p.state_dir.clone(),
            advertise,
            http: SocketAddr::new(IpAddr::V4(advertise), 0),
            admin: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tftp: SocketAddr::new(IpAddr::V4(advertise), 0),
            dhcp: SocketAddrV4::new(advertise, 0),
            renderer: Arc::new(crate::provision::BundleRenderer::new(
                inv.clone(),
                secrets.bundle.clone(),
            )),
            creds: secrets.creds.clone(),
            settings,
            etcd: None,
        }
    }

    /// Binds and starts talboot for the first time, and records the ports it bound so that a
    /// restart binds the same ones, as a restarted `serve` would. Returns the running talboot
    /// and the sockets the machines boot from.
    pub(super) async fn start(&mut self) -> Result<(Running, Wire), DemoError> {
        let bound = self.plan()?.bind().await?;
        let (Some(http), Some(SocketAddr::V4(dhcp)), Some(tftp), Some(admin)) = (
            bound.http_addr(),
            bound.dhcp_addr(),
            bound.tftp_addr(),
            bound.admin_addr(),
        ) else {
            return Err(SimFailure::NoIpv4.into());
        };
        self.http = http;
        self.admin = admin;
        self.tftp = tftp;
        self.dhcp = dhcp;
        let wire = Wire {
            dhcp,
            tftp_port: tftp.port(),
        };
        Ok((bound.start()?, wire))
    }

    /// The plan `serve` would build for this rack, on the addresses recorded so far.
    pub(super) fn plan(&self) -> Result<Plan, DemoError> {
        Ok(Plan {
            inventory: self.inventory.clone(),
            catalog: crate::artifacts::Catalog::load(&self.images).map_err(SimFailure::from)?,
            images_dir: self.images.clone(),
            ipxe_dir: self.tftp_root.clone(),
            configs: self.configs.clone(),
            store: match &self.etcd {
                Some(cfg) => crate::store::StoreSpec::Etcd(cfg.clone()),
                None => crate::store::StoreSpec::Redb(self.state_dir.clone()),
            },
            name: "demo".into(),
            advertise: self.advertise,
            http: self.http,
            admin: self.admin,
            admin_token: None,
            admin_hosts: Default::default(),
            http_limits: Default::default(),
            tftp: Some((
                self.tftp,
                crate::tftp::TftpConfig {
                    max_blksize: 1468,
                    ..crate::tftp::TftpConfig::default()
                },
            )),
            dhcp: Some(DhcpPlan::Loopback(self.dhcp)),
            ipv6_ra: None,
            // Drift is watched once the cluster is up ([`Demo::watch_drift`]); the simulated
            // machines are powered on by the demo itself.
            drift: None,
            power_on: None,
            provisioning: Some(ProvisioningPlan {
                renderer: self.renderer.clone(),
                creds: self.creds.clone(),
                settings: self.settings.clone(),
            }),
        })
    }
}
