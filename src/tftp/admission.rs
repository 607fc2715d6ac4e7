//! Admission: which request gets a transfer slot, which waits, and which slot is taken back.
//!
//! This module owns the transfer table's policy as a sans-I/O state machine, in the shape of
//! [`super::transfer`]: the listener feeds it what happened (a request arrived, a transfer made
//! progress, a transfer ended, time passed) with the current time, and performs the [`Step`]s
//! it gets back (start a transfer, end a stalled one, drop a request). It does no I/O and reads
//! no clock; times are offsets from the server's start.
//!
//! The rules, with the reasons:
//! - **A global cap** ([`Policy::max_transfers`]) bounds memory and file descriptors (one
//!   socket per transfer); [`super::config::max_transfers_for`] sizes it from memory.
//! - **A per-client cap** ([`Policy::max_per_client`], active plus waiting, by source IP): a
//!   booting machine needs one transfer at a time (two for a UEFI size probe followed by the
//!   real request), so one host sending dozens of requests can hold only a few slots. A request
//!   over it is dropped without an answer: a retransmitting client gets in once its own earlier
//!   transfers end, while an ERROR would end its boot attempt (see below).
//! - **When the table is full a request waits** in a FIFO queue rather than getting an ERROR.
//!   Boot firmware treats any ERROR answer to its RRQ as final for that boot attempt: iPXE's
//!   `tftp_rx_error()` calls `tftp_done()` with the mapped error and never resends the RRQ
//!   (ipxe/ipxe `src/net/udp/tftp.c` at 0ab2277c4, the same in Debian 12's 36a4c85), and EDK2's
//!   `Mtftp4RrqInput()` turns an ERROR into `EFI_TFTP_ERROR` and cleans the operation up
//!   (tianocore/edk2 `NetworkPkg/Mtftp4Dxe/Mtftp4Rrq.c`, edk2-stable202211). Silence instead
//!   makes both resend: iPXE's retry timer backs off 0.25 s, 0.5 s, ... up to
//!   `DEFAULT_MAX_TIMEOUT` (10 s, `src/include/ipxe/retry.h`), EDK2's PXE resends every
//!   `PXEBC_MTFTP_TIMEOUT` (4 s) up to `PXEBC_MTFTP_RETRIES` (6) times
//!   (`NetworkPkg/UefiPxeBcDxe/PxeBcImpl.h`). So a waiting request is held, and a
//!   retransmission of it (same address, port and file) refreshes its place instead of
//!   queueing twice; it is dropped only when no retransmission came for [`Policy::wait`].
//! - **Stalled transfers give their slot to waiting requests.** While a request waits, the
//!   transfer that has gone longest without progress (no ACK that advanced it) loses its slot
//!   once that time reaches [`Policy::reclaim_after`]; a client that never acknowledges, such
//!   as a host that floods RRQs and ignores the replies, is therefore reclaimed within
//!   `reclaim_after` whenever anyone else is waiting, whatever `timeout` it negotiated.
//!   Without anyone waiting a stalled transfer keeps its slot until its own retries end.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The admission limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Transfers running at once.
    pub max_transfers: usize,
    /// Transfers running or waiting at once for one source address.
    pub(crate) max_per_client: usize,
    /// Requests waiting for a slot at once.
    pub(crate) max_waiting: usize,
    /// How long a waiting request is kept after its last (re)transmission.
    pub wait: Duration,
    /// How long a transfer may go without progress before a waiting request may take its slot.
    pub(crate) reclaim_after: Duration,
}

/// A transfer's handle in the table.
pub(crate) type Id = u64;

/// Why a request was dropped without a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its source address already has [`Policy::max_per_client`] transfers running or waiting.
    PerClient,
    /// The table is full and so is the queue.
    QueueFull,
    /// It waited [`Policy::wait`] without a retransmission and without a slot coming free.
    WaitExpired,
}

impl Refusal {
    /// A short stable name, used as a metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::PerClient => "per_client",
            Refusal::QueueFull => "queue_full",
            Refusal::WaitExpired => "wait_expired",
        }
    }
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step<T> {
    /// Start `request` as transfer `id`.
    Start {
        /// The new transfer's handle (report it back to [`Admission::finished`]).
        id: Id,
        /// The request to serve.
        request: T,
    },
    /// End transfer `id`: it made no progress for [`Policy::reclaim_after`] and its slot went to
    /// a waiting request. It is already out of the table.
    Reclaim {
        /// The stalled transfer.
        id: Id,
    },
    /// Drop `request` without an answer.
    Refuse {
        /// The dropped request.
        request: T,
        /// Why.
        why: Refusal,
    },
}

#[derive(Debug, Clone)]
struct Active {
    client: IpAddr,
    last_progress: Duration,
}

#[derive(Debug, Clone)]
struct Waiting<T> {
    peer: SocketAddr,
    file: String,
    last_heard: Duration,
    request: T,
}

/// The transfer table: running transfers and waiting requests (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Admission<T> {
    policy: Policy,
    next_id: Id,
    active: HashMap<Id, Active>,
    waiting: VecDeque<Waiting<T>>,
    /// Running plus waiting, per source address; no zero entries.
    per_client: HashMap<IpAddr, usize>,
}

impl<T> Admission<T> {
    /// An empty table. Limits below 1 are raised to 1.
    pub fn new(policy: Policy) -> Self {
        let policy = Policy {
            max_transfers: policy.max_transfers.max(1),
            max_per_client: policy.max_per_client.max(1),
            ..policy
        };
        Admission {
            policy,
            next_id: 0,
            active: HashMap::new(),
            waiting: VecDeque::new(),
            per_client: HashMap::new(),
        }
    }

    /// A request for `file` arrived from `peer` at `now`.
    pub fn request(
        &mut self,
        now: Duration,
        peer: SocketAddr,
        file: &str,
        request: T,
        out: &mut Vec<Step<T>>,
    ) {
        self.expire(now, out);
        if let Some(w) = self
            .waiting
            .iter_mut()
            .find(|w| w.peer == peer && w.file == file)
        {
            // A retransmission of a request that is already waiting: keep its place.
            w.last_heard = now;
            return;
        }
        let client = peer.ip();
        if self.per_client.get(&client).copied().unwrap_or(0) >= self.policy.max_per_client {
            out.push(Step::Refuse {
                request,
                why: Refusal::PerClient,
            });
            return;
        }
        if self.waiting.is_empty() && self.active.len() < self.policy.max_transfers {
            self.start(now, client, request, out);
            return;
        }
        if self.waiting.len() >= self.policy.max_waiting {
            out.push(Step::Refuse {
                request,
                why: Refusal::QueueFull,
            });
            return;
        }
        *self.per_client.entry(client).or_insert(0) += 1;
        self.waiting.push_back(Waiting {
            peer,
            file: file.to_owned(),
            last_heard: now,
            request,
        });
        self.fill(now, out);
    }

    /// Transfer `id` made progress at `now` (an ACK moved it forward).
    pub fn progress(&mut self, id: Id, now: Duration) {
        if let Some(a) = self.active.get_mut(&id) {
            a.last_progress = a.last_progress.max(now);
        }
    }

    /// Transfer `id` ended at `now`; its slot goes to the first waiting request. Unknown ids
    /// (a reclaimed transfer reporting its end) change nothing.
    pub fn finished(&mut self, id: Id, now: Duration, out: &mut Vec<Step<T>>) {
        if let Some(a) = self.active.remove(&id) {
            self.release(a.client);
        }
        self.expire(now, out);
        self.fill(now, out);
    }

    /// Time passed: drop requests that waited too long, reclaim stalled slots for the rest.
    pub(crate) fn tick(&mut self, now: Duration, out: &mut Vec<Step<T>>) {
        self.expire(now, out);
        self.fill(now, out);
    }

    /// The earliest time at which [`Admission::tick`] may do something, if any.
    pub(crate) fn next_wakeup(&self) -> Option<Duration> {
        let expiry = self
            .waiting
            .iter()
            .map(|w| w.last_heard + self.policy.wait)
            .min();
        let reclaim = if self.waiting.is_empty() {
            None
        } else {
            self.active
                .values()
                .map(|a| a.last_progress + self.policy.reclaim_after)
                .min()
        };
        match (expiry, reclaim) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Transfers running.
    pub(crate) fn active(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    /// Transfers running or waiting for `client`.
    pub(crate) fn of_client(&self, client: IpAddr) -> usize {
        self.per_client.get(&client).copied().unwrap_or(0)
    }

    fn start(&mut self, now: Duration, client: IpAddr, request: T, out: &mut Vec<Step<T>>) {
        let id = self.next_id;
        self.next_id += 1;
        self.active.insert(
            id,
            Active {
                client,
                last_progress: now,
            },
        );
        *self.per_client.entry(client).or_insert(0) += 1;
        out.push(Step::Start { id, request });
    }

    fn release(&mut self, client: IpAddr) {
        if let Some(n) = self.per_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&client);
            }
        }
    }

    fn expire(&mut self, now: Duration, out: &mut Vec<Step<T>>) {
        let wait = self.policy.wait;
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for w in self.waiting.drain(..) {
            if now >= w.last_heard + wait {
                out.push(Step::Refuse {
                    request: w.request,
                    why: Refusal::WaitExpired,
                });
                if let Some(n) = self.per_client.get_mut(&w.peer.ip()) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_client.remove(&w.peer.ip());
                    }
                }
            } else {
                kept.push_back(w);
            }
        }
        self.waiting = kept;
    }

    /// Start waiting requests in arrival order while there is a free or reclaimable slot.
    fn fill(&mut self, now: Duration, out: &mut Vec<Step<T>>) {
        while !self.waiting.is_empty() {
            if self.active.len() >= self.policy.max_transfers {
                let Some(victim) = self.stalled(now) else {
                    return;
                };
                if let Some(a) = self.active.remove(&victim) {
                    self.release(a.client);
                }
                out.push(Step::Reclaim { id: victim });
            }
            let Some(w) = self.waiting.pop_front() else {
                return;
            };
            // The waiting entry counted towards its client already; `start` counts it again.
            self.release(w.peer.ip());
            self.start(now, w.peer.ip(), w.request, out);
        }
    }

    /// The transfer longest without progress, if that is at least `reclaim_after`.
    fn stalled(&self, now: Duration) -> Option<Id> {
        self.active
            .iter()
            .filter(|(_, a)| now.saturating_sub(a.last_progress) >= self.policy.reclaim_after)
            .min_by_key(|(id, a)| (a.last_progress, **id))
            .map(|(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> Policy {
        Policy {
            max_transfers: 4,
            max_per_client: 2,
            max_waiting: 3,
            wait: Duration::from_secs(10),
            reclaim_after: Duration::from_secs(2),
        }
    }

    fn peer(host: u8, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::from([10, 0, 0, host]), port)
    }

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    /// The request payload is its peer, so steps say who they concern.
    fn ask(t: &mut Admission<SocketAddr>, now: f64, p: SocketAddr) -> Vec<Step<SocketAddr>> {
        let mut out = Vec::new();
        t.request(s(now), p, "ipxe.efi", p, &mut out);
        out
    }

    fn started(steps: &[Step<SocketAddr>]) -> Vec<(Id, SocketAddr)> {
        steps
            .iter()
            .filter_map(|st| match st {
                Step::Start { id, request } => Some((*id, *request)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn requests_start_until_the_table_is_full_then_wait_in_order() {
        let mut t = Admission::new(policy());
        for host in 1..=4 {
            assert_eq!(started(&ask(&mut t, 0.0, peer(host, 1000))).len(), 1);
        }
        assert_eq!(ask(&mut t, 0.1, peer(5, 1000)), vec![]);
        assert_eq!(ask(&mut t, 0.2, peer(6, 1000)), vec![]);
        assert_eq!((t.active(), t.waiting()), (4, 2));
        // A slot frees: the first waiting request gets it, not the one that asked last.
        let mut out = Vec::new();
        t.finished(0, s(0.5), &mut out);
        assert_eq!(started(&out), vec![(4, peer(5, 1000))]);
        assert_eq!((t.active(), t.waiting()), (4, 1));
    }

    #[test]
    fn a_retransmitted_waiting_request_keeps_its_place_and_stays() {
        let mut t = Admission::new(policy());
        for host in 1..=4 {
            ask(&mut t, 0.0, peer(host, 1000));
        }
        ask(&mut t, 0.0, peer(5, 1000));
        ask(&mut t, 1.0, peer(6, 1000));
        // Host 5 resends its RRQ at 8 s; host 6 goes quiet.
        assert_eq!(ask(&mut t, 8.0, peer(5, 1000)), vec![]);
        assert_eq!(t.waiting(), 2, "the retransmission is not queued twice");
        let mut out = Vec::new();
        // Active transfers keep progressing, so nothing is reclaimed.
        for id in 0..4 {
            t.progress(id, s(10.5));
        }
        t.tick(s(11.0), &mut out);
        assert_eq!(
            out,
            vec![Step::Refuse {
                request: peer(6, 1000),
                why: Refusal::WaitExpired
            }]
        );
        assert_eq!(t.waiting(), 1);
        assert_eq!(t.of_client(peer(6, 1000).ip()), 0);
    }

    #[test]
    fn the_per_client_cap_counts_running_and_waiting() {
        let mut t = Admission::new(policy());
        let hostile = |port| peer(66, port);
        assert_eq!(started(&ask(&mut t, 0.0, hostile(1))).len(), 1);
        assert_eq!(started(&ask(&mut t, 0.0, hostile(2))).len(), 1);
        assert_eq!(
            ask(&mut t, 0.0, hostile(3)),
            vec![Step::Refuse {
                request: hostile(3),
                why: Refusal::PerClient
            }]
        );
        // Another machine is not affected.
        assert_eq!(started(&ask(&mut t, 0.0, peer(7, 1000))).len(), 1);
        assert_eq!(t.of_client(hostile(0).ip()), 2);
    }

    #[test]
    fn a_waiting_request_takes_the_slot_of_the_longest_stalled_transfer() {
        let mut t = Admission::new(policy());
        for host in 1..=4 {
            ask(&mut t, 0.0, peer(host, 1000));
        }
        // Transfers 0, 2 and 3 progress; 1 never does.
        for id in [0, 2, 3] {
            t.progress(id, s(1.5));
        }
        assert_eq!(ask(&mut t, 1.0, peer(9, 1000)), vec![]);
        assert_eq!(t.next_wakeup(), Some(s(2.0)));
        let mut out = Vec::new();
        t.tick(s(1.9), &mut out);
        assert_eq!(out, vec![]);
        t.tick(s(2.0), &mut out);
        assert_eq!(
            out,
            vec![
                Step::Reclaim { id: 1 },
                Step::Start {
                    id: 4,
                    request: peer(9, 1000)
                }
            ]
        );
        // The reclaimed transfer reporting its end later changes nothing.
        let mut out = Vec::new();
        t.finished(1, s(2.1), &mut out);
        assert_eq!((out, t.active(), t.waiting()), (vec![], 4, 0));
    }

    #[test]
    fn without_anyone_waiting_a_stalled_transfer_keeps_its_slot() {
        let mut t = Admission::new(policy());
        ask(&mut t, 0.0, peer(1, 1000));
        assert_eq!(t.next_wakeup(), None);
        let mut out = Vec::new();
        t.tick(s(100.0), &mut out);
        assert_eq!((out, t.active()), (vec![], 1));
    }

    #[test]
    fn a_full_queue_refuses() {
        let mut t = Admission::new(policy());
        for host in 1..=7 {
            ask(&mut t, 0.0, peer(host, 1000));
        }
        assert_eq!(
            ask(&mut t, 0.0, peer(8, 1000)),
            vec![Step::Refuse {
                request: peer(8, 1000),
                why: Refusal::QueueFull
            }]
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Request { host: u8, port: u16 },
        Progress { pick: usize },
        Finish { pick: usize },
        Tick,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..6, 0u16..4).prop_map(|(host, port)| Op::Request { host, port }),
            2 => any::<usize>().prop_map(|pick| Op::Progress { pick }),
            2 => any::<usize>().prop_map(|pick| Op::Finish { pick }),
            1 => Just(Op::Tick),
        ]
    }

    proptest! {
        /// Whatever happens: the caps hold, every request is answered exactly once (started,
        /// refused, or still waiting), no id starts twice, a reclaimed transfer had made no
        /// progress for `reclaim_after`, and no request waits while a slot is free.
        #[test]
        fn the_table_keeps_its_invariants(
            ops in proptest::collection::vec((op(), 0u64..3000), 1..300)
        ) {
            let policy = policy();
            let mut t = Admission::new(policy.clone());
            let mut now = Duration::ZERO;
            let mut running: Vec<(Id, SocketAddr, Duration)> = Vec::new();
            let mut started_ids = std::collections::HashSet::new();
            let (mut asked, mut answered) = (0usize, 0usize);
            for (op, advance_ms) in ops {
                now += Duration::from_millis(advance_ms);
                let mut out = Vec::new();
                match op {
                    Op::Request { host, port } => {
                        let p = peer(host, 1000 + port);
                        // A resend of a request still waiting (not yet waited out) is the
                        // same request, not a new one.
                        let resend = t
                            .waiting
                            .iter()
                            .any(|w| w.peer == p && now < w.last_heard + policy.wait);
                        if !resend {
                            asked += 1;
                        }
                        t.request(now, p, "f", p, &mut out);
                    }
                    Op::Progress { pick } if !running.is_empty() => {
                        let i = pick % running.len();
                        running[i].2 = now;
                        t.progress(running[i].0, now);
                    }
                    Op::Finish { pick } if !running.is_empty() => {
                        let (id, _, _) = running.remove(pick % running.len());
                        t.finished(id, now, &mut out);
                    }
                    _ => t.tick(now, &mut out),
                }
                for st in out {
                    match st {
                        Step::Start { id, request } => {
                            prop_assert!(started_ids.insert(id), "id {id} started twice");
                            running.push((id, request, now));
                            answered += 1;
                        }
                        Step::Reclaim { id } => {
                            let i = running.iter().position(|r| r.0 == id);
                            prop_assert!(i.is_some(), "reclaimed an unknown transfer");
                            let (_, _, last) = running.remove(i.unwrap());
                            prop_assert!(now - last >= policy.reclaim_after);
                        }
                        Step::Refuse { .. } => answered += 1,
                    }
                }
                // Requests that neither started nor were refused are waiting.
                prop_assert!(answered <= asked, "more answers than requests");
                prop_assert_eq!(t.waiting(), asked - answered);
                for p in (0u8..6).map(|h| peer(h, 0).ip()) {
                    prop_assert!(t.of_client(p) <= policy.max_per_client);
                }
                prop_assert_eq!(t.active(), running.len());
                prop_assert!(t.active() <= policy.max_transfers);
                prop_assert!(t.waiting() <= policy.max_waiting);
                if t.waiting() > 0 {
                    prop_assert_eq!(t.active(), policy.max_transfers, "waiting beside a free slot");
                }
            }
        }
    }
}
