//! The Talos double's upgrade path: `LifecycleService.Upgrade`, which versions a node runs and
//! has on disk, injected upgrade failures, and the cluster-wide record of when each node was
//! unavailable (so a test can check a rollout from the double's own account, not from what
//! talboot believes it did).
//!
//! As siderolabs/talos v1.13.9 does it:
//! - `LifecycleService.Upgrade` (`api/machine/lifecycle.proto`; served by
//!   `internal/app/lifecycle/lifecycle.go`, registered in
//!   `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`) only runs the
//!   installer container against the system disk (`install.WithUpgrade(true)`), streaming its
//!   output as `message`s and then one `exit_code`; a non-zero exit code is *not* a gRPC error
//!   ("Server SHOULD NOT respond with error"). It does not reboot: talosctl asks for the
//!   reboot afterwards (`cmd/talosctl/cmd/talos/upgrade.go`, `upgradeViaLifecycleService`:
//!   image pull, `upgradeInternal`, drain, `rebootInternal`; `--no-reboot` skips it). So a
//!   staged upgrade is an Upgrade without the Reboot: the new version runs from the next boot.
//! - Refusals: another install/upgrade in flight -> FailedPrecondition "another
//!   installation/upgrade is already in progress"; not installed -> FailedPrecondition
//!   "machine is not installed"; empty image -> InvalidArgument "installer image name is
//!   required". The method needs `os:admin` (`internal/app/machined/pkg/system/services/
//!   machined.go`, rules) and is a streamed method for apid's relay
//!   (`internal/app/apid/service.go`).
//! - The A-B boot scheme: a new version that does not boot falls back to the previous one
//!   (the "Upgrading Talos Linux" guide; `BootRollback` below), so the node comes back on its
//!   old version.
//!
//! - Pull before upgrade: the handler runs only an installer already in containerd's image
//!   store: `runInstallerContainer` (`internal/app/lifecycle/container.go`) looks it up with
//!   `GetImage` and fails with `installer image %q not found in containerd store: %w`, which
//!   `Upgrade` (`lifecycle.go`) returns as Internal "upgrade failed: ...". talosctl pulls it
//!   first through `ImageService.Pull` (`cmd/talosctl/cmd/talos/upgrade.go`,
//!   `imagePullInternal`, in the containerd instance `--namespace` names, default `system`:
//!   driver CRI, namespace `system`; `cmd/talosctl/cmd/talos/image.go`).
//! - `ImageService.Pull` (`api/machine/image.proto`, served by `internal/app/images/images.go`;
//!   rule os:admin/os:operator in `machined.go`): the containerd instance is checked first
//!   (`internal/app/internal/ctrhelper/ctrhelper.go`: an unknown driver or namespace, or
//!   driver CONTAINERD with namespace CRI, is InvalidArgument), then the image is pulled
//!   with `WithSkipIfAlreadyPulled` (no progress when it is there already) and
//!   `WithMaxNotFoundRetries(0)` (an image the registry lacks is NotFound "error pulling
//!   image: ..." at once); each layer's progress streams as `pull_progress`, then one `name`:
//!   the pulled reference pinned to its digest (`name@sha256:...`).
//! - Each (driver, namespace) pair is its own store: an image pulled into one is not found
//!   through another. The system containerd (driver CONTAINERD) keeps its root on tmpfs
//!   (`internal/app/machined/pkg/system/services/containerd.go`: `--root`
//!   `/system/var/lib/containerd`), so its images are gone after any reboot; the CRI
//!   containerd's root is `/var/lib/containerd` on EPHEMERAL, kept across a reboot and wiped
//!   by a reset or a new install.
//!
//! Deviation: the double's registry holds every tagged installer reference (the tag is the
//! version it installs) and nothing else; a reference without a tag is NotFound. Docker
//! reference normalisation (`docker.io/library/...`) is not modelled: talboot always names
//! installers in full.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{
    ADMIN, BootReason, FakeCluster, FakeTalosNode, Lifecycle, NodeApi, OPERATE, Route, Shared,
    TALOS_TAG, lock,
};
use crate::talos::api::common;
use crate::talos::api::machine::{
    self, image_service_pull_layer_progress, image_service_pull_response,
    image_service_server::ImageService, image_service_server::ImageServiceServer,
    lifecycle_service_install_progress, lifecycle_service_server::LifecycleService,
    lifecycle_service_server::LifecycleServiceServer,
};

/// A way for a node's next upgrades to fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeFailure {
    /// The installer exits non-zero: the stream ends with `exit_code` 1, nothing changes on
    /// disk.
    Installer,
    /// The installer succeeds but the new version does not boot: the A-B scheme boots the
    /// previous version again, so after the reboot the node reports its old version.
    BootRollback,
}

/// The versions of one node.
#[derive(Debug)]
pub(super) struct Versions {
    /// What `Version` reports: the version the running system booted.
    running: String,
    /// What the next boot runs.
    next_boot: String,
    /// An Upgrade is running (the handler's `TryLock`).
    busy: bool,
    failure: Option<UpgradeFailure>,
    /// The version the next boot runs is known not to boot (rolled back at that boot).
    broken: bool,
    /// The image references in each containerd instance's store (driver, namespace).
    images: std::collections::BTreeMap<(i32, i32), std::collections::BTreeSet<String>>,
    /// ImageService.Pull calls that reached the handler.
    pulls: usize,
}

impl Versions {
    /// A machine that first boots Talos `tag`.
    pub(super) fn booted(tag: &str) -> Self {
        Self {
            running: tag.to_owned(),
            next_boot: tag.to_owned(),
            busy: false,
            failure: None,
            broken: false,
            images: Default::default(),
            pulls: 0,
        }
    }
}

/// Whether a node became unavailable or available again, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    pub hostname: String,
    pub ip: IpAddr,
    pub control_plane: bool,
    /// True: went down (reboot announced); false: back (boot sequence finished, stage
    /// `running`).
    pub down: bool,
    pub at: Instant,
}

/// The cluster's record of unavailability, in the order things happened.
#[derive(Debug, Default)]
pub(super) struct AvailabilityLog(Vec<Availability>);

impl AvailabilityLog {
    fn push(&mut self, a: Availability) {
        self.0.push(a);
    }
}

/// The largest number of nodes (control planes when `control_planes`, else workers) down
/// at the same moment among `events` at or after `since`. A node already down at `since`
/// counts from the start.
pub fn max_down(events: &[Availability], since: Instant, control_planes: bool) -> usize {
    let mut down = std::collections::BTreeSet::new();
    let mut max = 0;
    for e in events.iter().filter(|e| e.control_plane == control_planes) {
        if e.down {
            down.insert(e.ip);
        } else {
            down.remove(&e.ip);
        }
        if e.at >= since {
            max = max.max(down.len());
        }
    }
    max
}

impl FakeCluster {
    /// Every time a node of this cluster went down (reboot announced) or came back (stage
    /// `running`), in order.
    pub(crate) fn availability(&self) -> Vec<Availability> {
        lock(&self.inner).availability.0.clone()
    }
}

impl FakeTalosNode {
    /// From now on this node's upgrades fail this way (`None`: they work again).
    pub fn fail_upgrades(&self, failure: Option<UpgradeFailure>) {
        lock(&self.shared.versions).failure = failure;
    }

    /// The version this node reports (`Version`'s tag).
    pub fn running_version(&self) -> String {
        lock(&self.shared.versions).running.clone()
    }

    /// The version its next boot runs.
    pub fn next_boot_version(&self) -> String {
        lock(&self.shared.versions).next_boot.clone()
    }

    /// ImageService.Pull calls that reached the handler.
    pub fn pull_calls(&self) -> usize {
        lock(&self.shared.versions).pulls
    }

    /// Whether `image` is in the store of the containerd instance (`driver`, `namespace`).
    pub fn has_image(
        &self,
        driver: common::ContainerDriver,
        namespace: common::ContainerdNamespace,
        image: &str,
    ) -> bool {
        lock(&self.shared.versions)
            .images
            .get(&(driver as i32, namespace as i32))
            .is_some_and(|s| s.contains(image))
    }

    /// LifecycleService.Upgrade calls that reached the handler.
    pub fn upgrade_calls(&self) -> usize {
        self.shared
            .stats
            .upgrade_calls
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The running version, for `Version`.
pub(super) fn running(shared: &Shared) -> String {
    lock(&shared.versions).running.clone()
}

/// Hook for every announced reboot: the node is unavailable from now on.
pub(super) fn on_go_down(shared: &Shared, what: &Lifecycle) {
    if !matches!(what, Lifecycle::Reboot(_)) {
        return;
    }
    record(shared, true);
}

/// Hook for the boot hook of every reboot: the machine boots what its disk holds now. A
/// broken new version rolls back to the one that ran before (A-B).
pub(super) fn on_reboot(shared: &Shared, reason: BootReason) {
    let mut v = lock(&shared.versions);
    // The system containerd's store is on tmpfs: gone at every boot. The CRI containerd's is
    // on EPHEMERAL: kept by a plain reboot, gone after a reset or a (failed) install.
    let system = common::ContainerDriver::Containerd as i32;
    v.images.retain(|(driver, _), _| *driver != system);
    if reason != BootReason::Reboot {
        v.images.clear();
    }
    if reason == BootReason::Reboot {
        if v.broken {
            v.next_boot = v.running.clone();
            v.broken = false;
        }
        v.running = v.next_boot.clone();
    }
}

/// Hook for the end of the boot sequence (stage `running`): the node is available again.
pub(super) fn on_running(shared: &Shared) {
    record(shared, false);
}

fn record(shared: &Shared, down: bool) {
    let control_plane = shared
        .installed()
        .is_some_and(|i| i.config.is_control_plane());
    lock(&shared.cluster.inner).availability.push(Availability {
        hostname: shared.cfg.hostname.clone(),
        ip: shared.cfg.ip,
        control_plane,
        down,
        at: Instant::now(),
    });
}

/// The version an installer image reference installs: its tag (`...:v1.14.0`, a digest after
/// it ignored).
fn image_version(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':')
        .map(|(_, tag)| tag)
        .filter(|t| !t.is_empty())
}

/// `ctrhelper.ContainerdInstanceHelper`: the store key of a request's containerd instance,
/// or upstream's InvalidArgument. A missing instance reads as driver CONTAINERD, namespace
/// NS_UNKNOWN (proto3 defaults), so it is refused for its namespace.
fn containerd_instance(inst: Option<&common::ContainerdInstance>) -> Result<(i32, i32), Status> {
    use common::{ContainerDriver as D, ContainerdNamespace as N};
    let (driver, namespace) = inst.map_or((0, 0), |i| (i.driver, i.namespace));
    let d = D::try_from(driver)
        .map_err(|_| Status::invalid_argument(format!("invalid containerd driver {driver}")))?;
    let n = match N::try_from(namespace) {
        Ok(n @ (N::NsCri | N::NsSystem)) => n,
        Ok(N::NsUnknown) => {
            return Err(Status::invalid_argument(
                "invalid containerd namespace NS_UNKNOWN",
            ));
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "invalid containerd namespace {namespace}"
            )));
        }
    };
    if d == D::Containerd && n == N::NsCri {
        return Err(Status::invalid_argument(
            "cannot use CRI namespace with containerd driver",
        ));
    }
    Ok((driver, namespace))
}

/// The digest the double's registry gives `image` (stable, so a pull is repeatable).
fn image_digest(image: &str) -> String {
    use sha2::Digest as _;
    format!(
        "sha256:{}",
        crate::hex::lower(&sha2::Sha256::digest(image.as_bytes()))
    )
}

type PullStream = std::pin::Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<machine::ImageServicePullResponse, Status>>
            + Send
            + 'static,
    >,
>;

fn pull_progress(
    layer: &str,
    status: image_service_pull_layer_progress::Status,
    offset: i64,
    total: i64,
) -> Result<machine::ImageServicePullResponse, Status> {
    Ok(machine::ImageServicePullResponse {
        response: Some(image_service_pull_response::Response::PullProgress(
            machine::ImageServicePullProgress {
                layer_id: layer.to_owned(),
                progress: Some(machine::ImageServicePullLayerProgress {
                    status: status as i32,
                    elapsed: None,
                    offset,
                    total,
                }),
            },
        )),
    })
}

/// The pull as containerd runs it: each layer downloaded and extracted, then the image is in
/// the instance's store and its pinned name is the last message.
async fn run_pull(
    shared: Arc<Shared>,
    store: (i32, i32),
    image: String,
    tx: tokio::sync::mpsc::Sender<Result<machine::ImageServicePullResponse, Status>>,
) {
    use image_service_pull_layer_progress::Status as S;
    let pinned = format!("{image}@{}", image_digest(&image));
    let present = lock(&shared.versions)
        .images
        .get(&store)
        .is_some_and(|s| s.contains(&image));
    if !present {
        let digest = image_digest(&image);
        let layers = [
            (format!("sha256:{}", &digest[7..19]), 24 * 1024 * 1024),
            (format!("sha256:{}", &digest[19..31]), 180 * 1024 * 1024),
        ];
        let share = shared.cfg.timing.installer_pull / 4;
        for (layer, total) in &layers {
            for (status, offset) in [
                (S::Downloading, 0),
                (S::Downloading, total / 2),
                (S::DownloadComplete, *total),
                (S::Extracting, *total),
                (S::ExtractComplete, *total),
            ] {
                if tx
                    .send(pull_progress(layer, status, offset, *total))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if !shared.pause(share).await {
                return;
            }
        }
        lock(&shared.versions)
            .images
            .entry(store)
            .or_default()
            .insert(image);
    }
    let _ = tx
        .send(Ok(machine::ImageServicePullResponse {
            response: Some(image_service_pull_response::Response::Name(pinned)),
        }))
        .await;
}

#[tonic::async_trait]
impl ImageService for NodeApi {
    type PullStream = PullStream;

    async fn pull(
        &self,
        req: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        route_or_forward!(self, req, stream, "/machine.ImageService/Pull", OPERATE);
        lock(&self.shared.versions).pulls += 1;
        let req = req.into_inner();
        let store = containerd_instance(req.containerd.as_ref())?;
        let image = req.image_ref;
        if image_version(&image).is_none() {
            return Err(Status::not_found(format!(
                "error pulling image: failed to pull image {image:?}: {image}: not found"
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(run_pull(self.shared.clone(), store, image, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type UpgradeStream = std::pin::Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<machine::LifecycleServiceUpgradeResponse, Status>>
            + Send
            + 'static,
    >,
>;

fn progress(
    p: lifecycle_service_install_progress::Response,
) -> Result<machine::LifecycleServiceUpgradeResponse, Status> {
    Ok(machine::LifecycleServiceUpgradeResponse {
        progress: Some(machine::LifecycleServiceInstallProgress { response: Some(p) }),
    })
}

/// The installer run: its output, then the exit code; the new version is written for the
/// next boot when it exits 0.
async fn run_installer(
    shared: Arc<Shared>,
    image: String,
    version: String,
    tx: tokio::sync::mpsc::Sender<Result<machine::LifecycleServiceUpgradeResponse, Status>>,
) {
    use lifecycle_service_install_progress::Response as P;
    let t = shared.cfg.timing;
    let failure = lock(&shared.versions).failure.clone();
    let disk = shared
        .install_disk()
        .and_then(Result::ok)
        .unwrap_or_else(|| "/dev/sda".into());
    let _ = tx
        .send(progress(P::Message(format!(
            "running installer {image} against {disk} (upgrade)\n"
        ))))
        .await;
    let ok = shared.pause(t.install).await;
    let code = if !ok {
        1
    } else if failure == Some(UpgradeFailure::Installer) {
        let _ = tx
            .send(progress(P::Message(
                "installation of the new version failed\n".into(),
            )))
            .await;
        1
    } else {
        let _ = tx
            .send(progress(P::Message(format!(
                "installed Talos {version} to {disk}; it runs after the next reboot\n"
            ))))
            .await;
        let mut v = lock(&shared.versions);
        v.next_boot = version;
        v.broken = failure == Some(UpgradeFailure::BootRollback);
        0
    };
    lock(&shared.versions).busy = false;
    let _ = tx.send(progress(P::ExitCode(code))).await;
}

#[tonic::async_trait]
impl LifecycleService for NodeApi {
    type UpgradeStream = UpgradeStream;

    async fn upgrade(
        &self,
        req: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        route_or_forward!(
            self,
            req,
            stream,
            "/machine.LifecycleService/Upgrade",
            ADMIN
        );
        self.shared
            .stats
            .upgrade_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let req = req.into_inner();
        // In the handler's order (lifecycle.go, Upgrade): the lock, installed, an image name,
        // then the installer container: its containerd instance and the image in its store.
        let mut v = lock(&self.shared.versions);
        if v.busy {
            return Err(Status::failed_precondition(
                "another installation/upgrade is already in progress",
            ));
        }
        if self.shared.on_disk().is_none() {
            return Err(Status::failed_precondition("machine is not installed"));
        }
        let image = req
            .source
            .map(|s| s.image_name)
            .filter(|i| !i.is_empty())
            .ok_or_else(|| Status::invalid_argument("installer image name is required"))?;
        let store = containerd_instance(req.containerd.as_ref()).map_err(|st| {
            Status::internal(format!(
                "upgrade failed: rpc error: code = {:?} desc = {}",
                st.code(),
                st.message()
            ))
        })?;
        if !v.images.get(&store).is_some_and(|s| s.contains(&image)) {
            return Err(Status::internal(format!(
                "upgrade failed: installer image {image:?} not found in containerd store: \
                 image {image:?}: not found"
            )));
        }
        // Pulled, so the registry held it: it has a tag.
        let version = image_version(&image).unwrap_or(TALOS_TAG).to_owned();
        v.busy = true;
        drop(v);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(run_installer(self.shared.clone(), image, version, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The service as the node's gRPC server mounts it.
pub(super) fn service(api: NodeApi) -> LifecycleServiceServer<NodeApi> {
    LifecycleServiceServer::new(api)
}

/// The image service as the node's gRPC server mounts it.
pub(super) fn image_service(api: NodeApi) -> ImageServiceServer<NodeApi> {
    ImageServiceServer::new(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_version_is_the_tag() {
        assert_eq!(
            image_version("factory.talos.dev/metal-installer/abc:v1.14.0"),
            Some("v1.14.0")
        );
        assert_eq!(
            image_version("127.0.0.1:5000/installer:v1.14.0@sha256:00"),
            Some("v1.14.0")
        );
        assert_eq!(image_version("127.0.0.1:5000/installer"), None);
    }

    #[test]
    fn max_down_counts_overlaps_per_role() {
        let t0 = Instant::now();
        let ev = |ip: u8, cp: bool, down: bool, ms: u64| Availability {
            hostname: format!("n{ip}"),
            ip: IpAddr::from([127, 0, 0, ip]),
            control_plane: cp,
            down,
            at: t0 + std::time::Duration::from_millis(ms),
        };
        let seq = vec![
            ev(1, true, true, 1),
            ev(1, true, false, 2),
            ev(2, true, true, 3),
            ev(4, false, true, 3),
            ev(5, false, true, 4),
            ev(2, true, false, 5),
        ];
        assert_eq!(max_down(&seq, t0, true), 1);
        assert_eq!(max_down(&seq, t0, false), 2);
        let overlap = vec![ev(1, true, true, 1), ev(2, true, true, 2)];
        assert_eq!(max_down(&overlap, t0, true), 2);
    }
}

#[cfg(test)]
mod node_tests {
    //! Against a fake node installed from talboot's own rendered config. Nodes listen on
    //! 127.0.77.2xx (the parent's tests use 127.0.77.1-11).

    use super::super::tests::{maintenance, node_cfg, rendered, secured};
    use super::super::{FakeCluster, FakeTalosNode, Phase};
    use super::*;
    use crate::talos::TalosError;

    const IMAGE: &str = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.0";

    async fn installed(last: u8, name: &str) -> (FakeCluster, FakeTalosNode) {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(node_cfg(last, name), &cluster)
            .await
            .unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered(name).as_bytes())
            .await
            .unwrap();
        // Installing (configured API, install running), then Secured, booted from disk;
        // bootstrapped, so its boot sequence can end (its etcd would wait to join).
        node.wait_phase(Phase::Secured).await.unwrap();
        secured(node.addr()).bootstrap().await.unwrap();
        (cluster, node)
    }

    async fn reboot_and_wait(node: &FakeTalosNode) {
        secured(node.addr()).reboot().await.unwrap();
        assert_eq!(node.phase(), Phase::Booting);
        node.wait_phase(Phase::Secured).await.unwrap();
    }

    #[tokio::test]
    async fn upgrade_streams_progress_and_the_reboot_runs_the_new_version() {
        let (cluster, node) = installed(201, "rack1-cp-01").await;
        // In maintenance it would be refused; a config on disk is needed: done above.
        let client = secured(node.addr());
        let mut layers = Vec::new();
        let pinned = client
            .image_pull(IMAGE, |p| layers.push(p.clone()))
            .await
            .unwrap();
        assert!(pinned.starts_with(&format!("{IMAGE}@sha256:")), "{pinned}");
        assert!(!layers.is_empty());
        let mut messages = Vec::new();
        let code = client
            .lifecycle_upgrade(IMAGE, |m| messages.push(m.to_owned()))
            .await
            .unwrap();
        assert_eq!(code, 0);
        assert!(!messages.is_empty());
        // No reboot yet: still the old version running, the new one staged for the next boot.
        assert_eq!(
            client.version().await.unwrap().version.unwrap().tag,
            TALOS_TAG
        );
        assert_eq!(node.next_boot_version(), "v1.14.0");
        let before = Instant::now();
        reboot_and_wait(&node).await;
        assert_eq!(
            secured(node.addr())
                .version()
                .await
                .unwrap()
                .version
                .unwrap()
                .tag,
            "v1.14.0"
        );
        // The record shows it down and (once the boot sequence finishes) up again.
        let mut up = false;
        for _ in 0..200 {
            let log = cluster.availability();
            let after: Vec<_> = log.iter().filter(|a| a.at >= before).collect();
            assert!(after.first().is_some_and(|a| a.down && a.control_plane));
            if after.iter().any(|a| !a.down) {
                up = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(up, "the node never reported stage running again");
        assert_eq!(node.upgrade_calls(), 1);
    }

    #[tokio::test]
    async fn injected_failures_and_refusals() {
        let (_cluster, node) = installed(202, "rack1-cp-02").await;
        let client = secured(node.addr());
        client.image_pull(IMAGE, |_| {}).await.unwrap();

        // The installer fails: exit code 1, no gRPC error, nothing staged.
        node.fail_upgrades(Some(UpgradeFailure::Installer));
        assert_eq!(client.lifecycle_upgrade(IMAGE, |_| {}).await.unwrap(), 1);
        assert_eq!(node.next_boot_version(), TALOS_TAG);

        // The new version does not boot: after the reboot the old one runs again.
        node.fail_upgrades(Some(UpgradeFailure::BootRollback));
        assert_eq!(client.lifecycle_upgrade(IMAGE, |_| {}).await.unwrap(), 0);
        reboot_and_wait(&node).await;
        assert_eq!(node.running_version(), TALOS_TAG);
        assert_eq!(node.next_boot_version(), TALOS_TAG);

        // One upgrade at a time.
        node.fail_upgrades(None);
        let first = tokio::spawn({
            let c = secured(node.addr());
            async move { c.lifecycle_upgrade(IMAGE, |_| {}).await }
        });
        // Wait until the first one holds the lock.
        for _ in 0..200 {
            if lock(&node.shared.versions).busy {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let second = client.lifecycle_upgrade(IMAGE, |_| {}).await.unwrap_err();
        assert!(
            second
                .to_string()
                .contains("another installation/upgrade is already in progress"),
            "{second}"
        );
        assert_eq!(first.await.unwrap().unwrap(), 0);

        // No image name.
        let err = client.lifecycle_upgrade("", |_| {}).await.unwrap_err();
        assert!(
            err.to_string().contains("installer image name is required"),
            "{err}"
        );
        assert!(matches!(err, TalosError::Remote { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn an_installer_that_was_not_pulled_is_refused_as_upstream_does() {
        let (_cluster, node) = installed(204, "rack1-cp-01").await;
        let client = secured(node.addr());
        let err = client.lifecycle_upgrade(IMAGE, |_| {}).await.unwrap_err();
        let TalosError::Remote { ref message, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(
            message,
            &format!(
                "upgrade failed: installer image {IMAGE:?} not found in containerd store: \
                 image {IMAGE:?}: not found"
            )
        );
        assert_eq!(node.next_boot_version(), TALOS_TAG);

        // In another containerd instance's store it is not found either.
        use common::{ContainerDriver as D, ContainerdNamespace as N};
        lock(&node.shared.versions)
            .images
            .entry((D::Containerd as i32, N::NsSystem as i32))
            .or_default()
            .insert(IMAGE.into());
        assert!(client.lifecycle_upgrade(IMAGE, |_| {}).await.is_err());

        // Pulled into the installer's instance, it runs; a second pull fetches nothing.
        let mut first = Vec::new();
        client
            .image_pull(IMAGE, |p| first.push(p.clone()))
            .await
            .unwrap();
        assert!(node.has_image(D::Cri, N::NsSystem, IMAGE));
        let mut second = Vec::new();
        client
            .image_pull(IMAGE, |p| second.push(p.clone()))
            .await
            .unwrap();
        assert!(!first.is_empty() && second.is_empty(), "{second:?}");
        assert_eq!(node.pull_calls(), 2);
        assert_eq!(client.lifecycle_upgrade(IMAGE, |_| {}).await.unwrap(), 0);

        // A reboot keeps the CRI containerd's images and drops the system containerd's.
        reboot_and_wait(&node).await;
        assert!(node.has_image(D::Cri, N::NsSystem, IMAGE));
        assert!(!node.has_image(D::Containerd, N::NsSystem, IMAGE));

        // An image the registry does not have is NotFound at once.
        let err = secured(node.addr())
            .image_pull("factory.talos.dev/metal-installer/x", |_| {})
            .await
            .unwrap_err();
        assert!(err.to_string().contains("error pulling image"), "{err}");
    }

    #[test]
    fn the_containerd_instance_is_checked_as_ctrhelper_does() {
        use common::{ContainerDriver as D, ContainerdInstance as I, ContainerdNamespace as N};
        let inst = |d: D, n: N| I {
            driver: d as i32,
            namespace: n as i32,
        };
        assert!(containerd_instance(Some(&inst(D::Cri, N::NsSystem))).is_ok());
        assert!(containerd_instance(Some(&inst(D::Cri, N::NsCri))).is_ok());
        assert!(containerd_instance(Some(&inst(D::Containerd, N::NsSystem))).is_ok());
        let e = containerd_instance(Some(&inst(D::Containerd, N::NsCri))).unwrap_err();
        assert_eq!(
            e.message(),
            "cannot use CRI namespace with containerd driver"
        );
        let e = containerd_instance(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "invalid containerd namespace NS_UNKNOWN");
    }

    #[tokio::test]
    async fn maintenance_mode_refuses_upgrade() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(node_cfg(203, "rack1-cp-03"), &cluster)
            .await
            .unwrap();
        let err = maintenance(node.addr())
            .lifecycle_upgrade(IMAGE, |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, TalosError::Maintenance { .. }), "{err:?}");
        assert_eq!(node.upgrade_calls(), 0);
        let err = maintenance(node.addr())
            .image_pull(IMAGE, |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, TalosError::Maintenance { .. }), "{err:?}");
        assert_eq!(node.pull_calls(), 0);
    }
}
