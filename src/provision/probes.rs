//! When the run loop probes a node in Unknown/Booting: only once it booted Talos from
//! talboot (a plain DHCP client never answers on 50000), and with a backoff that grows while
//! it does not answer.

use std::time::Duration;

use super::Provisioner;
use crate::events::EventKind;
use crate::store::NodePhase;

/// What the run loop knows about probing one node in Unknown/Booting.
#[derive(Clone, Debug)]
pub(super) struct ProbeState {
    /// The node fetched a Talos boot script, kernel or initramfs from talboot (seen on the
    /// bus or in its timeline): only such a machine can answer on port 50000.
    talos_booted: bool,
    /// Probes that found nothing since the last boot signal.
    misses: u32,
    /// When the last boot signal was seen (`None`: learnt from the timeline at a start, so
    /// the stall clock starts at that first look).
    booted_at: Option<tokio::time::Instant>,
    /// A `boot.stalled` event went out for this boot.
    stall_reported: bool,
    /// No probe before this.
    next_at: tokio::time::Instant,
}

/// The pause after `misses` unanswered probes: the poll interval doubled per miss, at most
/// `max`.
pub(crate) fn probe_backoff(poll: Duration, misses: u32, max: Duration) -> Duration {
    poll.saturating_mul(1u32 << misses.min(16))
        .min(max.max(poll))
}

impl Provisioner {
    /// Whether the run loop should step `name` now. Nodes past Booting are always stepped
    /// (their phase says talboot configured them); a node in Unknown/Booting only once it
    /// booted Talos from talboot (a plain DHCP client never answers on 50000) and its backoff
    /// has passed.
    pub(super) async fn probe_due(&self, name: &str) -> bool {
        let phase = match self.record(name).await {
            Ok(r) => r.phase,
            Err(_) => return false,
        };
        if !matches!(phase, NodePhase::Unknown | NodePhase::Booting) {
            return true;
        }
        let known = {
            let probes = self.inner.probes.lock().expect("probe table lock");
            probes.get(name).cloned()
        };
        let state = match known {
            Some(s) => s,
            None => {
                // First look since start: the timeline remembers earlier boots.
                let booted = self.booted_talos_before(name).await;
                let now = tokio::time::Instant::now();
                let s = ProbeState {
                    talos_booted: booted,
                    misses: 0,
                    next_at: now,
                    booted_at: booted.then_some(now),
                    stall_reported: false,
                };
                self.inner
                    .probes
                    .lock()
                    .expect("probe table lock")
                    .insert(name.to_owned(), s.clone());
                s
            }
        };
        state.talos_booted && tokio::time::Instant::now() >= state.next_at
    }

    /// Whether `name`'s timeline shows a Talos network boot from talboot (a script, kernel or
    /// initramfs fetch): the run loop's first look after a start, or after the bus overflowed,
    /// learns from the store what it did not hear on the bus. A store failure counts as no.
    async fn booted_talos_before(&self, name: &str) -> bool {
        let owned = name.to_owned();
        self.db(move |s| {
            let mut since = 0;
            loop {
                let page = s.events(&owned, since, 512)?;
                let Some(last) = page.last() else {
                    return Ok(false);
                };
                since = last.seq;
                if page.iter().any(|e| {
                    [
                        EventKind::Script,
                        EventKind::Kernel,
                        EventKind::Initramfs,
                        EventKind::Uki,
                    ]
                    .iter()
                    .any(|k| k.as_str() == e.kind)
                }) {
                    return Ok(true);
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// A Talos boot of `name` was seen: probe it now, and from the shortest pause again.
    pub(super) fn mark_talos_booted(&self, name: &str) {
        self.inner.probes.lock().expect("probe table lock").insert(
            name.to_owned(),
            ProbeState {
                talos_booted: true,
                misses: 0,
                next_at: tokio::time::Instant::now(),
                booted_at: Some(tokio::time::Instant::now()),
                stall_reported: false,
            },
        );
    }

    /// A chain of calls for `name` ended in `phase` without advancing it: a node still in
    /// Unknown/Booting did not answer, so its next probe waits longer; any later phase
    /// answered, so the backoff starts over.
    pub(super) fn chain_ended(&self, name: &str, phase: NodePhase) {
        let mut stalled = None;
        let mut probes = self.inner.probes.lock().expect("probe table lock");
        if let Some(p) = probes.get_mut(name) {
            if matches!(phase, NodePhase::Unknown | NodePhase::Booting) {
                if let Some(at) = p.booted_at
                    && !p.stall_reported
                    && at.elapsed() >= self.settings().boot_stall_after
                {
                    p.stall_reported = true;
                    stalled = Some(at.elapsed());
                }
                p.misses = p.misses.saturating_add(1);
                p.next_at = tokio::time::Instant::now()
                    + probe_backoff(
                        self.settings().poll_interval,
                        p.misses,
                        self.settings().probe_backoff_max,
                    );
            } else {
                p.misses = 0;
            }
        }
        drop(probes);
        if let Some(silent) = stalled {
            let secure_boot = self.inventory().node(name).is_some_and(|n| n.secure_boot());
            self.event(
                name,
                EventKind::BootStalled,
                stall_detail(name, silent, secure_boot),
            );
        }
    }
}

/// What `boot.stalled` says: how long the node has been silent since its boot from talboot,
/// and where to look; for a `secureBoot` node, the firmware's verdict on the signed UKI is
/// the likely cause (it refuses an image it cannot verify without a word on the network).
pub(crate) fn stall_detail(name: &str, silent: Duration, secure_boot: bool) -> String {
    let mut s = format!(
        "booted Talos from talboot {}s ago and has not answered on the Talos maintenance API \
         since; the node's console says why",
        silent.as_secs()
    );
    if secure_boot {
        s.push_str(&format!(
            ": with Secure Boot, firmware that refuses the signed UKI (\"Access Denied\": \
             its signing key is not enrolled in db, or Secure Boot is in setup mode) never \
             starts it; `talboot node secureboot status {name}` reads the firmware's state"
        ));
    }
    s
}
