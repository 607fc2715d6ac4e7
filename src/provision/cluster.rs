//! Cluster steps after the nodes are configured: Bootstrap exactly once, the health wait,
//! the kubeconfig.
//!
//! Bootstrap is the one Talos call that must never repeat on another node: a second
//! control plane bootstrapped with an empty data directory becomes a second etcd cluster. So:
//! * the bootstrap node is chosen among control planes ready for Bootstrap: the first one in
//!   inventory order that is Ready, or installed and booted from disk with its config, its
//!   secured API answering and its etcd service started (a control plane of a new cluster
//!   never reaches stage `running`, hence Ready, before Bootstrap: its etcd waits to join and
//!   the boot sequence waits for etcd; see [`core::bootstrap_readiness`]), persisted under
//!   `cluster/bootstrap-node` by compare-and-set; later
//!   runs use the persisted name even if the inventory order changes, and no other code path
//!   calls Bootstrap. A chosen node that Failed before any bootstrap intent was recorded is
//!   replaced by the next Ready control plane (a failed node would block bootstrap for good);
//!   once an intent exists the choice never changes, because that node may already run etcd;
//! * rebuilding the last voting etcd member wipes the cluster's etcd: the bootstrap,
//!   kubeconfig and cluster-step records are then marked `rebuilt`, so the cluster is
//!   bootstrapped again (on the same node) once it is ready for Bootstrap;
//! * the intent is persisted (`cluster/bootstrap` = `intent`) before the call, and `done`
//!   after it;
//! * before calling, etcd membership is checked on that node: members present means a
//!   previous run's call landed (or someone bootstrapped by hand), so no call is made;
//! * `AlreadyExists` ("etcd data directory is not empty") counts as done.
//!
//! The kubeconfig is fetched only after the health wait passes (etcd has one member per
//! control plane and the API server answers on the cluster endpoint), so nobody gets a
//! kubeconfig for an API that does not serve yet; it is written 0600 with `write_atomic`.
//! The health wait runs under one `tokio::time::timeout` around the whole loop, so its
//! deadline holds whatever the individual checks do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::core::{
    self, BootstrapEffect, BootstrapMark, BootstrapObs, BootstrapProbe, Choice, ClusterState,
    ForBootstrap,
};
use super::{ProvisionError, Provisioner};
use crate::events::EventKind;
use crate::inventory::EndpointHost;
use crate::store::{CasOutcome, NodePhase};
use crate::talos::{TalosClient, TalosError};

/// Row (in the store's cluster progress table) of the chosen bootstrap node's name.
pub const BOOTSTRAP_NODE_KEY: &str = "bootstrap-node";
/// Row of the bootstrap step: `intent`, then `done`.
pub const BOOTSTRAP_KEY: &str = "bootstrap";
/// Row of the kubeconfig step: `done` once written.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The cluster progress table those rows live in.
const PROGRESS: crate::store::ClusterTable = crate::store::ClusterTable::Progress;
/// File name of the admin kubeconfig in the state directory.
pub const KUBECONFIG_FILE: &str = "kubeconfig";

const INTENT: &[u8] = b"intent";
const DONE: &[u8] = b"done";
/// The value of the bootstrap and kubeconfig keys after the last etcd member was rebuilt.
const REBUILT: &[u8] = b"rebuilt";

/// Where the cluster is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterProgress {
    /// Waiting for something (the reason says what).
    Waiting(String),
    /// Bootstrap recorded as done in this step.
    Bootstrapped,
    /// Kubeconfig written in this step: everything is done.
    KubeconfigWritten(PathBuf),
    /// Nothing left to do.
    Done,
}

/// What one health check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// Voting etcd members seen by the bootstrap node.
    pub(crate) etcd_members: usize,
    /// Control planes in the inventory.
    pub(crate) control_planes: usize,
    /// Whether the API server endpoint accepted a connection.
    pub(crate) api_answers: bool,
}

impl HealthReport {
    /// All checks pass.
    pub fn healthy(&self) -> bool {
        self.etcd_members == self.control_planes && self.api_answers
    }
}

impl std::fmt::Display for HealthReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcd has {} of {} control-plane members; API server {}",
            self.etcd_members,
            self.control_planes,
            if self.api_answers {
                "answers"
            } else {
                "does not answer"
            }
        )
    }
}

/// Why a control plane that is not Ready cannot take Bootstrap now
/// ([`Provisioner::bootstrap_probe`]'s answer).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    /// talboot's phase says it is not installed yet (or its address is unknown).
    #[error("{node} is {phase}")]
    Phase {
        /// The control plane.
        node: String,
        /// Its phase.
        phase: NodePhase,
    },
    /// Its secured API answered, but it is not ready ([`core::bootstrap_readiness`]).
    #[error(transparent)]
    Readiness(core::NotReadyForBootstrap),
    /// Its secured API did not answer usefully.
    #[error(transparent)]
    Talos(TalosError),
}

impl Provisioner {
    /// The cluster's progress as the core sees it: the bootstrap node, the bootstrap and
    /// kubeconfig marks, the step record.
    pub(crate) async fn cluster_state(&self) -> Result<ClusterState, ProvisionError> {
        let (node, mark, kubeconfig, step) = self
            .db(|s| {
                Ok((
                    s.row(PROGRESS, BOOTSTRAP_NODE_KEY)?,
                    s.row(PROGRESS, BOOTSTRAP_KEY)?,
                    s.row(PROGRESS, KUBECONFIG_KEY)?,
                    crate::store::load_step_record(s)?,
                ))
            })
            .await?;
        Ok(ClusterState {
            bootstrap_node: node.map(|b| String::from_utf8_lossy(&b).into_owned()),
            bootstrap: match mark.as_deref() {
                None => BootstrapMark::None,
                Some(INTENT) => BootstrapMark::Intent,
                Some(DONE) => BootstrapMark::Done,
                Some(REBUILT) => BootstrapMark::Rebuilt,
                // An unknown mark may hide a call that was made: treat it as an intent (the
                // etcd check comes before any call).
                Some(_) => BootstrapMark::Intent,
            },
            kubeconfig_done: kubeconfig.as_deref() == Some(DONE),
            step,
        })
    }

    /// The bootstrap node: the persisted choice, or the first control plane ready for
    /// Bootstrap in inventory order, persisted by compare-and-set so two racing runs agree.
    /// Until one is ready nothing is persisted and the first control plane that has not
    /// failed is returned (for the relay, which needs it Ready anyway). The choice is the
    /// core's ([`core::choose_bootstrap_node`]); control planes that are not Ready are probed
    /// ([`Self::bootstrap_probe`]) only while there is no choice to keep and no Ready one.
    pub async fn bootstrap_node(&self) -> Result<String, ProvisionError> {
        let state = self.cluster_state().await?;
        let mut cps = Vec::new();
        let mut recs = Vec::new();
        for cp in self.inventory().control_planes() {
            let rec = self.record(cp.name.as_str()).await?;
            cps.push((cp.name.to_string(), ForBootstrap::of_phase(rec.phase)));
            recs.push(rec);
        }
        let kept = matches!(
            core::choose_bootstrap_node(&state, &cps),
            Some(Choice::Keep(ref n)) if state.bootstrap_node.as_deref() == Some(n.as_str())
        );
        if !kept && !cps.iter().any(|(_, c)| *c == ForBootstrap::Ready) {
            for ((name, status), rec) in cps.iter_mut().zip(&recs) {
                if *status == ForBootstrap::NotReady
                    && self.bootstrap_probe(name, rec).await?.is_ok()
                {
                    *status = ForBootstrap::Ready;
                    break;
                }
            }
        }
        let (chosen, persisted) = match core::choose_bootstrap_node(&state, &cps) {
            None => return Err(ProvisionError::NoControlPlane),
            Some(Choice::Keep(name)) => return Ok(name),
            Some(Choice::Persist { name, replaces }) => (name, replaces),
        };
        let value = chosen.clone().into_bytes();
        let expected = persisted.clone().map(String::into_bytes);
        let outcome = self
            .write(move |w| {
                w.progress
                    .compare_and_set_row(BOOTSTRAP_NODE_KEY, expected.as_deref(), &value)
            })
            .await?;
        Ok(match outcome {
            CasOutcome::Swapped => {
                let why = match &persisted {
                    Some(old) => format!(
                        "chosen as the bootstrap node instead of {old}, which failed (first \
                         control plane in the inventory ready for Bootstrap)"
                    ),
                    None => "chosen as the bootstrap node (first control plane in the \
                             inventory ready for Bootstrap: installed, booted from disk, etcd \
                             started)"
                        .into(),
                };
                self.event(&chosen, EventKind::Cluster, why);
                chosen
            }
            CasOutcome::Mismatch { current } => {
                String::from_utf8_lossy(&current.unwrap_or_default()).into_owned()
            }
        })
    }

    /// The last voting etcd member `node` was reset: its cluster's etcd is gone, so the
    /// recorded bootstrap, kubeconfig and cluster steps no longer hold. Marks them `rebuilt`
    /// (the store has no delete), so the cluster is bootstrapped again once `node` is Ready.
    pub(crate) async fn forget_bootstrap(&self, node: &str) -> Result<(), ProvisionError> {
        let state = self.cluster_state().await?;
        let forgotten = core::forget_bootstrap(&state, node, self.now());
        let step = serde_json::to_vec(&forgotten.step).expect("step record serialises");
        self.db_then_event(
            move |w| {
                // One commit: the three marks cannot be separated by a stop.
                w.progress.put_rows(&[
                    (BOOTSTRAP_KEY.to_owned(), REBUILT.to_vec()),
                    (KUBECONFIG_KEY.to_owned(), REBUILT.to_vec()),
                    (crate::store::STEP_KEY.to_owned(), step),
                ])
            },
            node.to_owned(),
            EventKind::Cluster,
            "last etcd member reset: the cluster will be bootstrapped again".into(),
        )
        .await
    }

    pub(crate) async fn meta(&self, key: &'static str) -> Result<Option<Vec<u8>>, ProvisionError> {
        self.db(move |s| s.row(PROGRESS, key)).await
    }

    /// A secured client to the bootstrap node, if it is Ready, or else ready for Bootstrap
    /// ([`Self::bootstrap_probe`]).
    async fn bootstrap_client(&self, cp: &str) -> Result<Option<TalosClient>, ProvisionError> {
        let rec = self.record(cp).await?;
        if let (NodePhase::Ready, Some(ip)) = (rec.phase, rec.last_seen_addr) {
            return Ok(Some(
                self.secured_client(ip).map_err(|e| self.talos_err(cp, e))?,
            ));
        }
        Ok(self.bootstrap_probe(cp, &rec).await?.ok())
    }

    /// Whether control plane `cp`, not Ready, can take Bootstrap: installing (talboot's
    /// phase until stage `running`) with a known address, its secured API answering, and
    /// [`core::bootstrap_readiness`] satisfied by its `MachineStatus` and `ServiceList`. The
    /// client on success, else why not.
    async fn bootstrap_probe(
        &self,
        cp: &str,
        rec: &crate::store::NodeRecord,
    ) -> Result<Result<TalosClient, NotReady>, ProvisionError> {
        let (NodePhase::Installing, Some(ip)) = (rec.phase, rec.last_seen_addr) else {
            return Ok(Err(NotReady::Phase {
                node: cp.to_owned(),
                phase: rec.phase,
            }));
        };
        let client = self.secured_client(ip).map_err(|e| self.talos_err(cp, e))?;
        let looked = async {
            client.version().await?;
            let stage = client.machine_status().await?.stage();
            let etcd = client
                .service_list()
                .await?
                .into_iter()
                .find(|s| s.id == "etcd")
                .map(|s| s.state);
            Ok::<_, TalosError>(BootstrapProbe {
                stage: super::node::stage_name(stage).to_owned(),
                etcd,
            })
        };
        Ok(match looked.await {
            Ok(probe) => match core::bootstrap_readiness(&probe) {
                Ok(()) => Ok(client),
                Err(why) => Err(NotReady::Readiness(why)),
            },
            Err(e) => {
                tracing::debug!(node = %cp, error = %e, "not ready for Bootstrap");
                Err(NotReady::Talos(e))
            }
        })
    }

    /// One cluster step: bootstrap (once), then health wait and kubeconfig.
    pub async fn step_cluster(&self) -> Result<ClusterProgress, ProvisionError> {
        if self.meta(KUBECONFIG_KEY).await?.as_deref() == Some(DONE) {
            return Ok(ClusterProgress::Done);
        }
        let cp = self.bootstrap_node().await?;
        if self.node_def(&cp).is_err() {
            return Err(ProvisionError::UnknownNode(cp));
        }
        if self.meta(BOOTSTRAP_KEY).await?.as_deref() != Some(DONE) {
            return self.bootstrap_once(&cp).await;
        }
        let report = self.wait_healthy(self.settings().health_timeout).await?;
        self.event(&cp, EventKind::Cluster, format!("healthy: {report}"));
        self.write_kubeconfig(&cp).await
    }

    /// The bootstrap, as the core decides it ([`core::bootstrap_step`]): intent persisted
    /// before anything is called, etcd checked before Bootstrap, done after.
    async fn bootstrap_once(&self, cp: &str) -> Result<ClusterProgress, ProvisionError> {
        let state = self.cluster_state().await?;
        let client = self.bootstrap_client(cp).await?;
        let (state, effect) = core::bootstrap_step(
            &state,
            BootstrapObs::Poll {
                node: cp.to_owned(),
                ready: client.is_some(),
            },
        );
        let client = match (effect, client) {
            (BootstrapEffect::CheckEtcd, Some(c)) => c,
            (BootstrapEffect::Done, _) => return Ok(ClusterProgress::Bootstrapped),
            (BootstrapEffect::Wait(why), _) => return Ok(ClusterProgress::Waiting(why)),
            (other, _) => return Err(unexpected_effect(cp, &other)),
        };
        if self.persist_bootstrap_intent(cp).await? {
            return Ok(ClusterProgress::Bootstrapped);
        }
        let members = self.etcd_members_before_bootstrap(cp, &client).await;
        let (state, effect) = core::bootstrap_step(&state, BootstrapObs::EtcdMembers(members));
        match effect {
            BootstrapEffect::Done => return self.mark_bootstrapped(cp).await,
            BootstrapEffect::Bootstrap => {}
            other => return Err(unexpected_effect(cp, &other)),
        }
        let (obs, err) = self.call_bootstrap(cp, &client).await;
        match core::bootstrap_step(&state, obs).1 {
            BootstrapEffect::Done => self.mark_bootstrapped(cp).await,
            BootstrapEffect::Wait(why) => Ok(ClusterProgress::Waiting(why)),
            other => Err(match err {
                Some(e) => self.talos_err(cp, e),
                None => unexpected_effect(cp, &other),
            }),
        }
    }

    /// The bootstrap intent, persisted before any call so a restart never calls Bootstrap
    /// blind: swapped in by compare-and-set (from nothing, or from `rebuilt` after the last
    /// etcd member was rebuilt). An intent from an earlier run is fine (same node) and is
    /// said on the timeline. `true`: the bootstrap is recorded done already.
    async fn persist_bootstrap_intent(&self, cp: &str) -> Result<bool, ProvisionError> {
        let rebuilt = self.meta(BOOTSTRAP_KEY).await?.as_deref() == Some(REBUILT);
        let outcome = self
            .write(move |w| {
                w.progress
                    .compare_and_set_row(BOOTSTRAP_KEY, rebuilt.then_some(REBUILT), INTENT)
            })
            .await?;
        if let CasOutcome::Mismatch { current } = &outcome
            && current.as_deref() == Some(DONE)
        {
            return Ok(true);
        }
        if !outcome.is_swapped() {
            self.event(
                cp,
                EventKind::Cluster,
                "bootstrap intent found from an earlier run; checking etcd before calling",
            );
        }
        Ok(false)
    }

    /// How many etcd members the bootstrap node has (0 when etcd does not answer): members
    /// mean an earlier call landed, or someone bootstrapped by hand, so Bootstrap is not
    /// called again.
    async fn etcd_members_before_bootstrap(&self, cp: &str, client: &TalosClient) -> usize {
        match client.etcd_member_list().await {
            Ok(members) => {
                if !members.is_empty() {
                    self.event(
                        cp,
                        EventKind::Talos,
                        format!(
                            "EtcdMemberList: {} member(s) already; bootstrap not called again",
                            members.len()
                        ),
                    );
                }
                members.len()
            }
            Err(e) => {
                self.event(
                    cp,
                    EventKind::Talos,
                    format!("EtcdMemberList: no etcd yet ({e})"),
                );
                0
            }
        }
    }

    /// The one Bootstrap call, with its event, as the core's observation: "already
    /// bootstrapped" is done, and a failure says whether a later retry can succeed. The
    /// error comes back too, for the step's typed error when the core gives up.
    async fn call_bootstrap(
        &self,
        cp: &str,
        client: &TalosClient,
    ) -> (BootstrapObs, Option<TalosError>) {
        match client.bootstrap().await {
            Ok(()) => {
                self.event(
                    cp,
                    EventKind::Talos,
                    format!("Bootstrap at {}: ok", client.target()),
                );
                (BootstrapObs::Bootstrapped, None)
            }
            Err(TalosError::AlreadyBootstrapped { message, .. }) => {
                self.event(
                    cp,
                    EventKind::Talos,
                    format!(
                        "Bootstrap at {}: already bootstrapped ({message}); done",
                        client.target()
                    ),
                );
                (BootstrapObs::Bootstrapped, None)
            }
            Err(e) => {
                self.event(
                    cp,
                    EventKind::Talos,
                    format!("Bootstrap at {} failed: {e}", client.target()),
                );
                // "bootstrap is not available yet", "time is not in sync yet": retry later.
                let retry = matches!(&e, TalosError::Remote { code, .. } if *code == tonic::Code::FailedPrecondition)
                    || e.is_transient();
                (
                    BootstrapObs::BootstrapFailed {
                        retry,
                        why: e.to_string(),
                    },
                    Some(e),
                )
            }
        }
    }

    async fn mark_bootstrapped(&self, cp: &str) -> Result<ClusterProgress, ProvisionError> {
        self.db_then_event(
            |w| w.progress.put_row(BOOTSTRAP_KEY, DONE),
            cp.to_owned(),
            EventKind::Cluster,
            "bootstrap done (recorded)".into(),
        )
        .await?;
        Ok(ClusterProgress::Bootstrapped)
    }

    /// One health check: etcd members seen by the bootstrap node against the inventory's
    /// control planes, and a TCP connection to the API server endpoint.
    pub(crate) async fn check_health(&self) -> Result<HealthReport, ProvisionError> {
        let cp = self.bootstrap_node().await?;
        let control_planes = self.inventory().control_planes().count();
        let etcd_members = match self.bootstrap_client(&cp).await? {
            Some(client) => match client.etcd_member_list().await {
                Ok(m) => m.iter().filter(|m| !m.is_learner).count(),
                Err(e) => {
                    tracing::debug!(error = %e, "etcd member list failed");
                    0
                }
            },
            None => 0,
        };
        let api_answers = self.api_answers().await;
        Ok(HealthReport {
            etcd_members,
            control_planes,
            api_answers,
        })
    }

    async fn api_answers(&self) -> bool {
        let ep = &self.inventory().cluster.endpoint;
        let connect = self.settings().deadlines.connect;
        let addrs: Vec<SocketAddr> = match &ep.host {
            EndpointHost::Ip(ip) => vec![SocketAddr::new((*ip).into(), ep.port)],
            EndpointHost::Name(name) => {
                match tokio::net::lookup_host((name.as_str(), ep.port)).await {
                    Ok(a) => a.collect(),
                    Err(_) => return false,
                }
            }
        };
        for addr in addrs {
            if let Ok(Ok(_)) =
                tokio::time::timeout(connect, tokio::net::TcpStream::connect(addr)).await
            {
                return true;
            }
        }
        false
    }

    /// Checks health until it passes or `timeout` runs out; the timeout bounds the whole
    /// wait, including checks in flight. Publishes the outcome either way.
    pub(crate) async fn wait_healthy(
        &self,
        timeout: Duration,
    ) -> Result<HealthReport, ProvisionError> {
        let cp = self.bootstrap_node().await?;
        let (last_tx, last_rx) = tokio::sync::watch::channel(String::from("no check finished"));
        let pause = self.settings().poll_interval;
        let waited = tokio::time::timeout(timeout, async {
            loop {
                let report = self.check_health().await?;
                if report.healthy() {
                    return Ok::<_, ProvisionError>(report);
                }
                last_tx.send_replace(report.to_string());
                tokio::time::sleep(pause).await;
            }
        })
        .await;
        match waited {
            Ok(result) => result,
            Err(_) => {
                let err = ProvisionError::HealthTimeout {
                    after: timeout,
                    last: last_rx.borrow().clone(),
                };
                self.event(
                    &cp,
                    EventKind::Cluster,
                    format!("health wait failed: {err}"),
                );
                Err(err)
            }
        }
    }

    async fn write_kubeconfig(&self, cp: &str) -> Result<ClusterProgress, ProvisionError> {
        let Some(client) = self.bootstrap_client(cp).await? else {
            return Ok(ClusterProgress::Waiting(format!("{cp} is not Ready")));
        };
        let bytes = match client.kubeconfig().await {
            Ok(b) => b,
            Err(e) => {
                self.event(
                    cp,
                    EventKind::Talos,
                    format!("Kubeconfig at {} failed: {e}", client.target()),
                );
                return Err(self.talos_err(cp, e));
            }
        };
        let path = self.settings().state_dir.join(KUBECONFIG_FILE);
        let target = path.clone();
        let (writers, bus, node) = (
            self.inner.writers.clone(),
            self.inner.bus.clone(),
            cp.to_owned(),
        );
        let detail = format!(
            "Kubeconfig at {}: written to {} (0600)",
            client.target(),
            path.display()
        );
        // File, mark and event in one blocking task, spawned in the same poll that got the
        // reply: it runs to its end even when talboot stops right then, so a fetched
        // kubeconfig is never fetched again.
        tokio::task::spawn_blocking(move || {
            crate::fsutil::write_atomic(&target, &bytes, 0o600)?;
            writers.progress.put_row(KUBECONFIG_KEY, DONE)?;
            bus.publish(&node, EventKind::Talos, detail);
            Ok::<_, ProvisionError>(())
        })
        .await
        .map_err(|e| ProvisionError::Join(e.to_string()))??;
        Ok(ClusterProgress::KubeconfigWritten(path))
    }
}

/// The core answered the bootstrap with an effect that does not fit where the adapter is:
/// a bug, reported as the step's error rather than acted on.
fn unexpected_effect(cp: &str, effect: &BootstrapEffect) -> ProvisionError {
    ProvisionError::Step {
        node: cp.to_owned(),
        why: format!("internal: unexpected bootstrap effect {effect:?}"),
    }
}
