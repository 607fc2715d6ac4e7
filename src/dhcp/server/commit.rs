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

use super::handle::{After, Job};
use super::send::{Released, Replier, send_loop};
use super::{DhcpWriters, join_error};
use crate::dhcp::admission::Backlog;
use crate::dhcp::pace::Pace;
use crate::store::{LeaseChange, LeaseCommit, Store, StoreError};

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
    /// Tells the handling half which addresses the book must write again.
    pub(super) not_durable_tx: mpsc::UnboundedSender<Ipv4Addr>,
    pub(super) backlog: Arc<Backlog>,
    /// Addresses whose latest write failed; a reused binding on one of them is not announced.
    pub(super) not_durable: HashSet<Ipv4Addr>,
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
        while let Some(first) = rx.recv().await {
            let (mut batch, rows) = take_batch(&mut rx, first);
            self.drop_unannounceable(&mut batch);
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
                let _ = self.not_durable_tx.send(ip);
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
        let (results, took) = self.write(groups, durable, rows).await;
        // Its commit is done: these replies no longer wait for the disk, sent or not.
        self.backlog.committed(replies, took, Instant::now());
        self.release(batch, ips, &results)
    }

    /// Write the batch's rows in one transaction, and the view after it; returns the result
    /// and, for a synced commit, how long it took (the admission target learns from it).
    async fn write(
        &self,
        groups: Vec<LeaseCommit>,
        durable: bool,
        rows: usize,
    ) -> (Result<(), StoreError>, Option<Duration>) {
        if groups
            .iter()
            .all(|g| g.writes.is_empty() && g.events.is_empty())
        {
            return (Ok(()), None);
        }
        let (store, writers) = (self.store.clone(), self.writers.clone());
        // The view retracts what the commit touches now and publishes the result after.
        let view = self.replier.view.clone();
        let publish = view.as_ref().map(|v| v.begin_leases(&groups));
        let jobs = groups.len();
        let queued = Instant::now();
        let done = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let r = writers.leases.commit_leases(&groups, durable);
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
            Err(e) => (Err(join_error(e)), None),
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
        results: &Result<(), StoreError>,
    ) -> Vec<(Job, bool)> {
        let mut group = Vec::with_capacity(batch.len());
        for (job, ips) in batch.into_iter().zip(ips) {
            if let (Err(e), false) = (results, ips.is_empty()) {
                let _enter = job.span.enter();
                counter!("dhcp_dropped_total", "reason" => "store_failed").increment(1);
                error!(error = %e, "cannot persist lease; reply not sent");
                for ip in ips {
                    self.not_durable.insert(ip);
                    let _ = self.not_durable_tx.send(ip);
                }
                continue;
            }
            for ip in &ips {
                self.not_durable.remove(ip);
            }
            group.push((job, results.is_ok()));
        }
        group
    }
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
