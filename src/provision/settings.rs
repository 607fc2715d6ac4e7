//! The provisioner's knobs and their production defaults.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::talos::Deadlines;
use crate::talos::retry::RetryPolicy;

/// Default of [`Settings::concurrency`]: a rack's worth of nodes in flight at once.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// Knobs of the provisioner; [`Settings::new`] gives production defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    /// TCP port of apid on every node (50000; tests may move it).
    pub(crate) apid_port: u16,
    /// Where the kubeconfig is written.
    pub state_dir: PathBuf,
    /// How long a node may take from ApplyConfiguration until it runs installed from disk
    /// (machine stage `running`).
    pub(crate) install_timeout: Duration,
    /// How long a rebuilt node may take from the Reset reply until its maintenance API
    /// answers; past it the rebuild is Failed (the reset did not happen).
    pub reset_timeout: Duration,
    /// Longest pause between maintenance probes of a node that booted Talos but does not
    /// answer yet (the pause doubles from `poll_interval` up to this).
    pub(crate) probe_backoff_max: Duration,
    /// How long the health wait may take, in total.
    pub health_timeout: Duration,
    /// Pause between polls of nodes and between health checks.
    pub poll_interval: Duration,
    /// Retry policy of idempotent Talos calls (none by default: the next poll is the retry,
    /// and a step never blocks the loop on one slow node).
    pub retry: RetryPolicy,
    /// Per-call deadlines.
    pub(crate) deadlines: Deadlines,
    /// Directory of rendered add-on manifests, with subdirectories `cilium/` and `argocd/`
    /// (see docs/addons.md); used when no `helm` binary is configured.
    pub addon_manifests: Option<PathBuf>,
    /// The `helm` binary that renders each enabled add-on with `helm template` (pinned chart
    /// version, the inventory's Kubernetes version, the API versions the cluster serves).
    /// Takes precedence over `addon_manifests`; one of the two is required when an add-on is
    /// enabled.
    pub helm: Option<PathBuf>,
    /// The age identity (keys.txt text) for Argo CD's `sops-age` Secret; required when
    /// `addons.argocd.ksops` is on. Its `Debug` is redacted.
    pub ksops_age_identity: Option<Arc<crate::crypto::age::Secret>>,
    /// Timeouts of the add-on waits (CRDs, rollouts, nodes Ready).
    pub addon_timeouts: crate::addons::Timeouts,
    /// How many nodes' Talos calls run at once (each node has at most one in flight).
    pub concurrency: usize,
    /// Each node's power driver, credentials resolved (nodes without `power:` are absent).
    pub power: Arc<std::collections::BTreeMap<String, crate::power::PowerDriver>>,
    /// Per `secureBoot: true` node, the `.pcrpkey` fingerprint (Talos's format) of the UKI of
    /// the boot set it boots, read from the catalog by
    /// [`super::secure_boot::expected_pcr_fingerprints`]; a secure-boot node absent here is
    /// refused (nothing to match its key against).
    pub secure_boot_keys: Arc<std::collections::BTreeMap<String, String>>,
    /// How long after a Talos network boot from talboot a node may stay silent on the
    /// maintenance API before a `boot.stalled` event says so (once per boot; the node keeps
    /// being probed). Firmware that refuses an image shows nothing on the network: this is
    /// how talboot notices it.
    pub boot_stall_after: Duration,
}

impl Settings {
    /// Defaults: port 50000, 20 minutes to install, 10 minutes for health, 5 s polls.
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            apid_port: crate::talos::APID_PORT,
            state_dir,
            install_timeout: Duration::from_secs(20 * 60),
            // A graceful leave retries for up to 5 minutes (internal/pkg/etcd/etcd.go,
            // LeaveCluster), then the wipe and a network boot.
            reset_timeout: Duration::from_secs(15 * 60),
            probe_backoff_max: Duration::from_secs(60),
            health_timeout: Duration::from_secs(10 * 60),
            poll_interval: Duration::from_secs(5),
            retry: RetryPolicy::NONE,
            deadlines: Deadlines::default(),
            addon_manifests: None,
            helm: None,
            ksops_age_identity: None,
            addon_timeouts: crate::addons::Timeouts::default(),
            concurrency: DEFAULT_CONCURRENCY,
            power: Arc::default(),
            secure_boot_keys: Arc::default(),
            // Talos reaches maintenance mode about a minute after its kernel starts on
            // servers; three minutes leaves room for slow firmware and big initramfs pulls.
            boot_stall_after: Duration::from_secs(3 * 60),
        }
    }
}
