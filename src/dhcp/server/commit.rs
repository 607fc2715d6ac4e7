//! The committer: group commit of the lease changes and timeline rows of many decisions in
//! one transaction, synced when any of them promises a binding, after which the jobs whose
//! writes all succeeded are released, in order, to the sender ([`super::send`]).

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use tokio::sync::mpsc;
use tracing::{debug, error};

use super::ha::{GroupOutcome, HaLink, Note, commit_split};
use super::handle::{After, Job};
use super::send::{Released, Replier, send_loop};
use super::{DhcpWriters, join_error};
use crate::dhcp::admission::Backlog;
use crate::dhcp::pace::Pace;
use crate::store::{LeaseChange, LeaseCommit, LeaseState, Store};

/// Replies (and events) wait here while their lease writes are committed; bounded so a flood
/// that outruns the disk stops the handling loop, and the receive queue then sheds the oldest
/// DISCOVERs, instead of growing memory. Sized to ride out one slow fsync at 15,000 decisions
/// a second: this VM's disk was measured at up to 180 ms for one `fdatasync` while other
/// processes wrote (docs/benchmarks.md), which filled the 1,024 of before.
pub(super) const COMMIT_QUEUE: usize = 4096;
/// Most rows (lease writes and events) committed in one transaction: a whole backlog, so that
/// after a slow fsync the queue drains with one more sync instead of one per 512 rows.
const COMMIT_BATCH: usize = 8192;

/// The address a lease write is about.
fn write_ip(w: &LeaseChange) -> Ipv4Addr {
    match w {
        LeaseChange::Upsert(l) => l.ip,
        LeaseChange::Remove(ip) => *ip,
    }
}

/// What the committer commits with, and the addresses whose latest write failed.
pub(super) struct Committer {
    pub(super) store: Arc<dyn Store>,
    pub(super) writers: Arc<DhcpWriters>,
    pub(super) replier: Arc<Replier>,
    /// Tells the handling half which addresses the book must write again, and what peers
    /// changed.
    pub(super) notes: mpsc::UnboundedSender<Note>,
    pub(super) backlog: Arc<Backlog>,
    /// Addresses whose latest write failed; a reused binding on one of them is not announced.
    pub(super) not_durable: HashSet<Ipv4Addr>,
    /// On etcd: the store, the lease feed, and what of it was passed on.
    pub(super) ha: Option<HaLink>,
}

impl Committer {
    /// Group commit: take every job waiting, write all their lease changes and events in one
    /// transaction (synced when any of them needs it), then hand the jobs whose writes all
    /// succeeded, in order, to the sender ([`send_loop`]), which paces their replies. One
    /// commit is shared by a whole burst of requests, the timeline rows ride in it instead of
    /// taking redb's write slot again, and no reply leaves before the lease it announces is on
    /// disk (durable before acknowledged): the sender only sees a job once its commit
    /// returned, while the committer goes on to the next batch.
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        // Unbounded: the sender sends at least `Pace::burst` replies per `Pace::min_gap`,
        // faster than decisions are made, so it never holds more than a few groups.
        let (released_tx, released_rx) = mpsc::unbounded_channel::<Released>();
        let sender = tokio::spawn(send_loop(
            released_rx,
            self.writers.clone(),
            self.replier.clone(),
            Pace::default(),
            self.backlog.clone(),
        ));
        loop {
            let first = tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
                batch = next_feed(&mut self.ha) => {
                    if let Some(ha) = &mut self.ha {
                        ha.forward(batch, &self.notes);
                    }
                    continue;
                }
            };
            let (mut batch, rows) = take_batch(&mut rx, first);
            self.drop_unannounceable(&mut batch);
            if self.ha.is_some() {
                batch
                    .iter_mut()
                    .for_each(|j| trim_for_shared_store(&mut j.commit));
            }
            let group = self.commit(batch, rows).await;
            if !group.is_empty() {
                let _ = released_tx.send(Released {
                    jobs: group,
                    window: self.backlog.commit_time(),
                    at: Instant::now(),
                });
            }
        }
        // Let the replies already released go out before stopping.
        drop(released_tx);
        let _ = sender.await;
    }

    /// A reused binding whose address's last write failed is not on disk, so its reply must
    /// not announce it: the job is dropped (the client retries) and the book told to write
    /// the address again.
    fn drop_unannounceable(&self, batch: &mut Vec<Job>) {
        batch.retain(|job| match job.relies_on {
            Some(ip) if self.not_durable.contains(&ip) => {
                let _enter = job.span.enter();
                if matches!(job.after, After::Reply(_)) {
                    self.backlog.left();
                }
                counter!("dhcp_dropped_total", "reason" => "store_failed").increment(1);
                error!(%ip, "binding is not on disk (its write failed); reply not sent");
                let _ = self.notes.send(Note::NotDurable(ip));
                false
            }
            _ => true,
        });
    }

    /// Commit one batch and return its jobs that may go on, each with whether its events
    /// are in the store.
    async fn commit(&mut self, mut batch: Vec<Job>, rows: usize) -> Vec<(Job, bool)> {
        let durable = batch.iter().any(|j| j.durable);
        let replies = batch
            .iter()
            .filter(|j| matches!(j.after, After::Reply(_)))
            .count();
        self.backlog.taken(replies);
        let ips: Vec<Vec<Ipv4Addr>> = batch
            .iter()
            .map(|j| j.commit.writes.iter().map(write_ip).collect())
            .collect();
        let groups: Vec<LeaseCommit> = batch
            .iter_mut()
            .map(|j| std::mem::take(&mut j.commit))
            .collect();
        let (results, took) = self.write(&groups, durable, rows).await;
        // Its commit is done: these replies no longer wait for the disk, sent or not.
        self.backlog.committed(replies, took, Instant::now());
        self.after_commit(&mut batch, groups, &results).await;
        self.release(batch, ips, &results)
    }

    /// On etcd: the peers' changes learned before this batch's markers now hold for the
    /// compare view (see [`super::ha`]), and the records that won over this batch's
    /// conflicting groups are read back for the book.
    async fn after_commit(
        &mut self,
        batch: &mut [Job],
        groups: Vec<LeaseCommit>,
        results: &[GroupOutcome],
    ) {
        let Some(ha) = &mut self.ha else { return };
        for job in batch.iter_mut() {
            if let After::Observe(events) = &mut job.after {
                ha.etcd.observe(&std::mem::take(events));
            }
        }
        let lost: Vec<LeaseCommit> = groups
            .into_iter()
            .zip(results)
            .filter(|(_, r)| matches!(r, GroupOutcome::Conflict))
            .map(|(g, _)| g)
            .collect();
        if !lost.is_empty() {
            ha.learn_conflicts(lost, &self.notes).await;
        }
    }

    /// Write the batch's rows in one transaction, and the view after it; returns the result
    /// and, for a synced commit, how long it took (the admission target learns from it).
    async fn write(
        &self,
        groups: &[LeaseCommit],
        durable: bool,
        rows: usize,
    ) -> (Vec<GroupOutcome>, Option<Duration>) {
        if groups
            .iter()
            .all(|g| g.writes.is_empty() && g.events.is_empty())
        {
            return (vec![GroupOutcome::Committed; groups.len()], None);
        }
        let groups = groups.to_vec();
        let (store, writers) = (self.store.clone(), self.writers.clone());
        // The view retracts what the commit touches now and publishes the result after.
        let view = self.replier.view.clone();
        let publish = view.as_ref().map(|v| v.begin_leases(&groups));
        let jobs = groups.len();
        let queued = Instant::now();
        let done = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            // Groups another appliance won are split out; the rest is committed (on etcd;
            // redb never conflicts, so this is one commit there).
            let r = commit_split(&groups, &mut |gs| writers.leases.commit_leases(gs, durable));
            let committed = Instant::now();
            if let (Some(v), Some(p)) = (view, publish) {
                p.refresh(&v, store.as_ref());
            }
            (r, started, committed, committed.elapsed())
        })
        .await;
        let total = queued.elapsed();
        match done {
            Ok((r, started, committed, refresh)) => {
                let wait = started.duration_since(queued);
                // Where a slow reply's time goes: the wait for a blocking thread, the
                // commit itself (redb's write slot, page writes, the fsync when durable),
                // and re-reading the committed leases into the view before the replies.
                histogram!("dhcp_commit_seconds", "durable" => if durable { "yes" } else { "no" })
                    .record(total.as_secs_f64());
                histogram!("dhcp_commit_jobs").record(jobs as f64);
                debug!(target: "talboot::dhcp::commit", jobs, rows, durable,
                    wait_us = wait.as_micros() as u64,
                    commit_us = committed.duration_since(started).as_micros() as u64,
                    refresh_us = refresh.as_micros() as u64, "lease commit");
                (r, durable.then_some(total))
            }
            Err(e) => {
                let e = std::sync::Arc::new(join_error(e));
                (vec![GroupOutcome::Failed(e); jobs], None)
            }
        }
    }

    /// The jobs of a committed batch that may go on, in order. A job whose writes failed is
    /// held back (the client retries; the next attempt is decided and written again) and its
    /// addresses marked not durable; one with nothing to write still gets its reply, its
    /// events then persisted by the bus instead.
    fn release(
        &mut self,
        batch: Vec<Job>,
        ips: Vec<Vec<Ipv4Addr>>,
        results: &[GroupOutcome],
    ) -> Vec<(Job, bool)> {
        let mut group = Vec::with_capacity(batch.len());
        for ((job, ips), result) in batch.into_iter().zip(ips).zip(results) {
            if matches!(job.after, After::Observe(_)) {
                continue;
            }
            let failed = match result {
                GroupOutcome::Committed => None,
                GroupOutcome::Conflict => Some(("conflict", None)),
                GroupOutcome::Failed(e) => Some(("store_failed", Some(e))),
            };
            if let (Some((reason, e)), false) = (failed, ips.is_empty()) {
                let _enter = job.span.enter();
                counter!("dhcp_dropped_total", "reason" => reason).increment(1);
                match e {
                    Some(e) => error!(error = %e, "cannot persist lease; reply not sent"),
                    // Another appliance committed one of its addresses first: the client
                    // retries and is decided afresh, on the winner's record.
                    None => debug!("a peer committed this lease's address first; reply not sent"),
                }
                for ip in ips {
                    self.not_durable.insert(ip);
                    let _ = self.notes.send(Note::NotDurable(ip));
                }
                continue;
            }
            for ip in &ips {
                self.not_durable.remove(ip);
            }
            // On etcd the events left the commit ([`trim_for_shared_store`]): the bus
            // persists them.
            let stored = self.ha.is_none() && matches!(result, GroupOutcome::Committed);
            group.push((job, stored));
        }
        group
    }
}

/// On a shared etcd store, a commit carries only what a reply promises, as Kea's HA pair
/// sends its peer only committed leases (`lease4_committed`, not offers):
/// - an offer's record stays in the book: written, it doubled the keys etcd must replicate per
///   client, for a promise of a few seconds that no peer acts on (a peer that picks the same
///   address loses at the REQUEST's commit, whose compare sees the key's revision move);
/// - the timeline rows go to the event bus's writer, off the path to the ACK: each row and
///   its node's head are two more keys in the transaction, and the heads another read before
///   it (events are history, not a promise to the client; redb keeps them in the lease
///   transaction because there they are free).
fn trim_for_shared_store(commit: &mut LeaseCommit) {
    commit
        .writes
        .retain(|w| !matches!(w, LeaseChange::Upsert(l) if l.state == LeaseState::Offered));
    commit.events.clear();
}

/// The first job waiting and every one behind it, up to [`COMMIT_BATCH`] rows; returns the
/// batch and its row count.
fn take_batch(rx: &mut mpsc::Receiver<Job>, first: Job) -> (Vec<Job>, usize) {
    let size = |j: &Job| j.commit.writes.len() + j.commit.events.len();
    let mut count = size(&first);
    let mut batch = vec![first];
    while count < COMMIT_BATCH {
        match rx.try_recv() {
            Ok(job) => {
                count += size(&job);
                batch.push(job);
            }
            Err(_) => break,
        }
    }
    (batch, count)
}

/// The next batch of the lease feed, when there is one; never otherwise.
async fn next_feed(ha: &mut Option<HaLink>) -> Vec<crate::store::LeaseEvent> {
    match ha {
        Some(ha) => ha.next_batch().await,
        None => std::future::pending().await,
    }
}
