//! The cluster steps after the kubeconfig: API ready → CNI (Cilium) installed → nodes Ready →
//! Argo CD installed → handed off, as one persisted record.
//!
//! The record ([`StepRecord`], a store type: readers outside this module load it from the
//! store) says which step was last *completed*, since when, why,
//! the last error and how many attempts the next step has failed. [`next_step`] is the pure
//! decision "given the completed step and the facts, what now"; [`Provisioner::step_addons`]
//! performs one action and persists the result, so a restart resumes from the store and
//! never repeats a completed step. Add-on installs are idempotent anyway (server-side apply),
//! but a completed one is not even re-applied. A failure is recorded with its cause and the
//! attempt count; the caller retries after [`retry_after`] (exponential backoff), and the
//! error message itself names the fix. Every transition and failure is an event on the
//! `cluster` timeline.
//!
//! Cilium comes before anything that needs pod networking (nodes are not Ready without a
//! CNI); Argo CD only after Cilium is installed and every node is Ready.
//!
//! An add-on's manifest is rendered with `helm template` when a `helm` binary is configured
//! (chart from `addons.<name>.chart`, else the upstream repository; the policy, chart names,
//! images and Argo CD's setup, is [`crate::addons::policy`]), else read from the
//! rendered-manifest directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ProvisionError, Provisioner};
use crate::addons::kube::{Kube, KubeError};
use crate::addons::manifest::ObjectRef;
pub use crate::addons::policy::{
    ARGOCD_CHART, CILIUM_CHART, KSOPS_IMAGE, UpstreamChart, argocd_setup, helm_template,
};
use crate::addons::policy::{chart_meta, operator_values};
use crate::addons::source::ManifestSource;
use crate::addons::values::CiliumOptions;
use crate::addons::{AddonError, AddonSpec, argocd_addon, cilium_addon, install_addon};
use crate::events::EventKind;
use crate::inventory::{ChartRef, Version};
use crate::store::{CLUSTER_TIMELINE, ClusterStep, STEP_KEY, StepRecord};

/// Failed attempts after which a step is reported as stuck (it is still retried).
pub(crate) const STUCK_AFTER: u32 = 5;

/// What the next step needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Bootstrap, health wait and kubeconfig are done (`cluster::KUBECONFIG_KEY`).
    pub(crate) kubeconfig_written: bool,
    /// `addons.cilium.enabled` in the inventory.
    pub cilium: bool,
    /// `addons.argocd.enabled` in the inventory.
    pub argocd: bool,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Run the bootstrap / health / kubeconfig steps.
    Bootstrap,
    /// Record that the kubeconfig exists.
    MarkBootstrapped,
    /// Check that the API answers.
    CheckApi,
    /// Install Cilium.
    InstallCilium,
    /// Wait for every node to be Ready.
    WaitNodesReady,
    /// Install Argo CD.
    InstallArgoCd,
    /// Complete `step` without work, for `reason`.
    Skip(ClusterStep, &'static str),
    /// Nothing left.
    Done,
}

/// The pure decision: what follows the completed step `current`, given `facts`.
pub(crate) fn next_step(current: ClusterStep, facts: Facts) -> Action {
    use ClusterStep as S;
    match current {
        S::WaitingForControlPlanes if facts.kubeconfig_written => Action::MarkBootstrapped,
        S::WaitingForControlPlanes => Action::Bootstrap,
        S::Bootstrapped => Action::CheckApi,
        S::ApiReady if facts.cilium => Action::InstallCilium,
        S::ApiReady => Action::Skip(
            S::CniInstalled,
            "Cilium is not enabled in the inventory; the CNI is not talboot's to install",
        ),
        S::CniInstalled => Action::WaitNodesReady,
        S::NodesReady if facts.argocd => Action::InstallArgoCd,
        S::NodesReady => Action::Skip(
            S::ArgoCdInstalled,
            "Argo CD is not enabled in the inventory",
        ),
        S::ArgoCdInstalled => Action::Skip(S::HandedOff, "every cluster step is done"),
        S::HandedOff => Action::Done,
    }
}

/// How long to wait before retrying a step that failed `attempts` times: the poll interval
/// doubled per failure, at most five minutes.
pub(crate) fn retry_after(poll: Duration, attempts: u32) -> Duration {
    let factor = 1u32 << attempts.min(16);
    poll.saturating_mul(factor).min(Duration::from_secs(300))
}

/// Why a cluster step failed. Each message names what to fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    /// An add-on is enabled but neither a helm binary nor a manifest directory is configured.
    #[error(
        "add-on {addon} is enabled but talboot has no way to get its manifest: start \
         `talboot serve` with --helm PATH (a helm binary renders the pinned chart with \
         `helm template`) or with --addon-manifests DIR after rendering the chart into \
         DIR/{addon}/ (see docs/addons.md), or set addons.{addon}.enabled: false"
    )]
    NoManifestSource {
        /// `cilium` or `argocd`.
        addon: &'static str,
    },
    /// The add-on's manifest subdirectory is missing.
    #[error(
        "add-on {addon}: {dir} does not exist; render the chart into it with `helm template` \
         (see docs/addons.md), or set addons.{addon}.enabled: false"
    )]
    MissingDir {
        /// `cilium` or `argocd`.
        addon: &'static str,
        /// The directory to create.
        dir: PathBuf,
    },
    /// The admin kubeconfig could not be read.
    #[error("cannot read the admin kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The Kubernetes API failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The API did not answer in time.
    #[error(
        "the Kubernetes API did not answer within {0:?}; check the cluster endpoint and \
         `talosctl health`"
    )]
    ApiTimeout(Duration),
    /// An add-on install failed.
    #[error(transparent)]
    Addon(#[from] AddonError),
}

/// What [`Provisioner::step_addons`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// The bootstrap steps are still running (their progress says where).
    Bootstrapping(super::ClusterProgress),
    /// `ClusterStep` was completed and persisted.
    Completed(ClusterStep),
    /// The next step failed; the record holds the error and attempt count.
    Failed {
        /// Failed attempts so far.
        attempts: u32,
        /// The error.
        error: String,
    },
    /// Everything is done.
    Done,
}

impl Provisioner {
    /// The persisted step record, if any.
    pub async fn step_record(&self) -> Result<Option<StepRecord>, ProvisionError> {
        let raw = self.meta(STEP_KEY).await?;
        // A record this version cannot read is treated as absent: every step re-checks
        // its own facts, and the bootstrap keys guard the one non-repeatable call.
        Ok(raw.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// Persists `rec` and, with it, its line on the cluster timeline (see
    /// `db_then_event`: a stop between the two cannot lose the line).
    async fn put_record_then_event(
        &self,
        rec: &StepRecord,
        detail: String,
    ) -> Result<(), ProvisionError> {
        let bytes = serde_json::to_vec(rec).expect("step record serialises");
        self.db_then_event(
            move |w| w.progress.put_row(STEP_KEY, &bytes),
            CLUSTER_TIMELINE.to_owned(),
            EventKind::Cluster,
            detail,
        )
        .await
    }

    fn facts(&self, kubeconfig_written: bool) -> Facts {
        let addons = &self.inventory().addons;
        Facts {
            kubeconfig_written,
            cilium: addons.cilium.as_ref().is_some_and(|c| c.enabled),
            argocd: addons.argocd.as_ref().is_some_and(|a| a.enabled),
        }
    }

    async fn complete(
        &self,
        from: ClusterStep,
        step: ClusterStep,
        reason: &str,
    ) -> Result<StepOutcome, ProvisionError> {
        self.put_record_then_event(
            &StepRecord {
                step,
                since_unix: self.now(),
                reason: reason.to_owned(),
                last_error: None,
                attempts: 0,
            },
            format!("{from} -> {step}: {reason}"),
        )
        .await?;
        Ok(StepOutcome::Completed(step))
    }

    /// Performs the next cluster step once and persists the outcome; see the module docs.
    pub async fn step_addons(&self) -> Result<StepOutcome, ProvisionError> {
        let rec = self.step_record().await?.unwrap_or(StepRecord {
            step: ClusterStep::WaitingForControlPlanes,
            since_unix: self.now(),
            reason: "nothing done yet".into(),
            last_error: None,
            attempts: 0,
        });
        // The one place that says the bootstrap part is over.
        let kubeconfig_written = self.cluster_state().await?.kubeconfig_written();
        let action = next_step(rec.step, self.facts(kubeconfig_written));
        let from = rec.step;
        let result = match action {
            Action::Done => return Ok(StepOutcome::Done),
            Action::Bootstrap => {
                // The bootstrap steps persist their own progress and retry themselves.
                let p = self.step_cluster().await?;
                return Ok(StepOutcome::Bootstrapping(p));
            }
            Action::MarkBootstrapped => {
                return self
                    .complete(
                        from,
                        ClusterStep::Bootstrapped,
                        "bootstrapped, healthy, kubeconfig written",
                    )
                    .await;
            }
            Action::Skip(step, reason) => return self.complete(from, step, reason).await,
            Action::CheckApi => self.check_api().await.map(|()| {
                (
                    ClusterStep::ApiReady,
                    "the Kubernetes API answers".to_owned(),
                )
            }),
            Action::InstallCilium => self
                .install_cilium()
                .await
                .map(|s| (ClusterStep::CniInstalled, s)),
            Action::WaitNodesReady => self
                .wait_nodes()
                .await
                .map(|()| (ClusterStep::NodesReady, "every node is Ready".to_owned())),
            Action::InstallArgoCd => self
                .install_argocd()
                .await
                .map(|s| (ClusterStep::ArgoCdInstalled, s)),
        };
        match result {
            Ok((step, reason)) => self.complete(from, step, &reason).await,
            Err(e) => {
                let attempts = rec.attempts.saturating_add(1);
                let error = e.to_string();
                let stuck = if attempts >= STUCK_AFTER {
                    " (still failing; fix the cause above, talboot keeps retrying)"
                } else {
                    ""
                };
                self.put_record_then_event(
                    &StepRecord {
                        last_error: Some(error.clone()),
                        attempts,
                        ..rec
                    },
                    format!("after {from}: attempt {attempts} failed: {error}{stuck}"),
                )
                .await?;
                Ok(StepOutcome::Failed { attempts, error })
            }
        }
    }

    fn kubeconfig_path(&self) -> PathBuf {
        self.settings()
            .state_dir
            .join(super::cluster::KUBECONFIG_FILE)
    }

    async fn kube(&self) -> Result<Kube, StepError> {
        let path = self.kubeconfig_path();
        let yaml = tokio::fs::read(&path)
            .await
            .map_err(|e| StepError::Kubeconfig {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        Ok(Kube::from_kubeconfig(&yaml, self.settings().poll_interval).await?)
    }

    async fn check_api(&self) -> Result<(), StepError> {
        let limit = self.settings().deadlines.call;
        let probe = async {
            let kube = self.kube().await?;
            let ns = ObjectRef {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                namespace: None,
                name: "kube-system".into(),
            };
            kube.get(&ns).await?;
            Ok::<_, StepError>(())
        };
        tokio::time::timeout(limit, probe)
            .await
            .map_err(|_| StepError::ApiTimeout(limit))?
    }

    /// Where the add-on's manifest comes from: `helm template` when a helm binary is
    /// configured (with the API versions `kube` serves), else the manifest directory.
    async fn manifest_source(
        &self,
        upstream: &UpstreamChart,
        chart: Option<&ChartRef>,
        version: &Version,
        kube: &Kube,
    ) -> Result<ManifestSource, StepError> {
        let addon = upstream.addon;
        if let Some(helm) = &self.settings().helm {
            let api_versions = kube.api_versions().await?;
            return Ok(ManifestSource::HelmTemplate(helm_template(
                helm,
                upstream,
                chart,
                version,
                &self.inventory().cluster.kubernetes_version.value,
                api_versions,
            )));
        }
        let base = self
            .settings()
            .addon_manifests
            .as_deref()
            .ok_or(StepError::NoManifestSource { addon })?;
        let dir = Path::new(base).join(addon);
        if !dir.is_dir() {
            return Err(StepError::MissingDir { addon, dir });
        }
        Ok(ManifestSource::Dir(dir))
    }

    fn release_time(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(self.now() as i64)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    }

    async fn install_cilium(&self) -> Result<String, StepError> {
        let Some(c) = self.inventory().addons.cilium.clone() else {
            return Ok("Cilium is not in the inventory".into());
        };
        let kube = self.kube().await?;
        let source = self
            .manifest_source(&CILIUM_CHART, c.chart.as_ref(), &c.version.value, &kube)
            .await?;
        let spec = cilium_addon(
            &source,
            chart_meta("cilium", &c.version.value.0),
            CiliumOptions {
                kube_proxy_replacement: c.kube_proxy_replacement,
            },
            operator_values(&c.values).as_ref(),
        )
        .await?;
        self.install_spec(&kube, &spec, "Cilium", &c.version.value.0)
            .await
    }

    /// Installs an add-on's release and says what changed, for the step's record.
    async fn install_spec(
        &self,
        kube: &Kube,
        spec: &AddonSpec,
        what: &str,
        version: &semver::Version,
    ) -> Result<String, StepError> {
        let out = install_addon(
            kube,
            spec,
            self.settings().addon_timeouts,
            self.release_time(),
        )
        .await?;
        // The API server's warnings (PodSecurity findings on the add-on's workloads) go on
        // the cluster timeline, one event each, besides the log line the client wrote.
        for (object, warning) in &out.warnings {
            self.event(
                CLUSTER_TIMELINE,
                EventKind::Cluster,
                format!("{what}: the API server warned on {object}: {warning}"),
            );
        }
        Ok(format!(
            "{what} {version} installed: {} object(s) changed, {} unchanged",
            out.applied.len(),
            out.unchanged.len()
        ))
    }

    async fn wait_nodes(&self) -> Result<(), StepError> {
        let kube = self.kube().await?;
        let names: Vec<String> = self
            .inventory()
            .nodes
            .iter()
            .map(|n| n.name.value.clone())
            .collect();
        kube.wait_named_nodes_ready(&names, self.settings().addon_timeouts.rollout)
            .await?;
        Ok(())
    }

    async fn install_argocd(&self) -> Result<String, StepError> {
        let Some(a) = self.inventory().addons.argocd.clone() else {
            return Ok("Argo CD is not in the inventory".into());
        };
        let kube = self.kube().await?;
        let source = self
            .manifest_source(&ARGOCD_CHART, a.chart.as_ref(), &a.version.value, &kube)
            .await?;
        let setup = argocd_setup(&a, self.settings().ksops_age_identity.clone());
        let spec = argocd_addon(&source, chart_meta("argo-cd", &a.version.value.0), &setup).await?;
        self.install_spec(&kube, &spec, "Argo CD", &a.version.value.0)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Facts = Facts {
        kubeconfig_written: true,
        cilium: true,
        argocd: true,
    };

    #[test]
    fn steps_run_in_order_with_everything_enabled() {
        let mut step = ClusterStep::WaitingForControlPlanes;
        let mut actions = Vec::new();
        loop {
            let a = next_step(step, ALL);
            actions.push(a.clone());
            step = match a {
                Action::Done => break,
                Action::MarkBootstrapped => ClusterStep::Bootstrapped,
                Action::CheckApi => ClusterStep::ApiReady,
                Action::InstallCilium => ClusterStep::CniInstalled,
                Action::WaitNodesReady => ClusterStep::NodesReady,
                Action::InstallArgoCd => ClusterStep::ArgoCdInstalled,
                Action::Skip(s, _) => s,
                Action::Bootstrap => panic!("kubeconfig is written"),
            };
        }
        assert_eq!(
            actions[..5],
            [
                Action::MarkBootstrapped,
                Action::CheckApi,
                Action::InstallCilium,
                Action::WaitNodesReady,
                Action::InstallArgoCd
            ]
        );
        assert!(matches!(
            actions[5],
            Action::Skip(ClusterStep::HandedOff, _)
        ));
        assert_eq!(actions[6], Action::Done);
    }

    #[test]
    fn disabled_addons_are_skipped_and_bootstrap_comes_first() {
        let none = Facts {
            cilium: false,
            argocd: false,
            ..ALL
        };
        assert!(matches!(
            next_step(ClusterStep::ApiReady, none),
            Action::Skip(ClusterStep::CniInstalled, _)
        ));
        assert_eq!(
            next_step(ClusterStep::CniInstalled, none),
            Action::WaitNodesReady
        );
        assert!(matches!(
            next_step(ClusterStep::NodesReady, none),
            Action::Skip(ClusterStep::ArgoCdInstalled, _)
        ));
        let early = Facts {
            kubeconfig_written: false,
            ..ALL
        };
        assert_eq!(
            next_step(ClusterStep::WaitingForControlPlanes, early),
            Action::Bootstrap
        );
    }

    #[test]
    fn record_round_trips_and_backoff_grows_to_a_cap() {
        let rec = StepRecord {
            step: ClusterStep::CniInstalled,
            since_unix: 7,
            reason: "r".into(),
            last_error: Some("e".into()),
            attempts: 2,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert!(json.contains("\"cni-installed\""), "{json}");
        assert_eq!(serde_json::from_str::<StepRecord>(&json).unwrap(), rec);
        let p = Duration::from_secs(1);
        assert_eq!(retry_after(p, 0), p);
        assert_eq!(retry_after(p, 3), Duration::from_secs(8));
        assert_eq!(retry_after(p, 40), Duration::from_secs(300));
    }
}
