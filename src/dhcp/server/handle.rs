//! The handling half of the server: admission, the core's decision on one datagram at a
//! time, and what each decision leaves to do once its lease changes are committed (a
//! [`Job`] for the committer). Decisions never wait for the disk.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use dhcproto::v4::MessageType;
use metrics::counter;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tracing::{debug, error};

use super::ha::Note;
use super::peek::{
    msg_type_label, peek_mac, peek_msg_type, peek_xid, proxy_request_address, selected_address,
};
use super::send::Replier;
use super::socket::Datagram;
use crate::dhcp::admission::Backlog;
use crate::dhcp::decide::Silence;
use crate::dhcp::queue::Lane;
use crate::dhcp::{DhcpCore, DropReason, Now, Outcome, ReplySummary, ReplyTarget};
use crate::events::{EventKind, NodeEvent};
use crate::inventory::{Mac, NetworkMode};
use crate::store::{LeaseChange, LeaseCommit, LeaseEvent};

/// Replies waiting for their commit above which DISCOVERs are shed whatever their age: a
/// memory bound only. Load is shed earlier by the age of the oldest waiting ACK against the
/// measured commit time ([`crate::dhcp::admission`]); a count is the wrong brake (on a fast
/// disk 512 ACKs never wait long, on a slow one they are a second of waiting).
pub(super) const ACK_BACKLOG: usize = 512;

/// How many answered proxy exchanges are remembered (a rack boots a few hundred machines).
const PROXIED_REMEMBERED: usize = 4096;

/// The handling half: the core, deciding one datagram at a time, and the queue to the
/// committer. Decisions are made in order and never wait for the disk; the committer makes
/// each decision's lease changes durable (many per transaction) before its reply is sent.
pub(super) struct Adapter {
    pub(super) core: DhcpCore,
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) replier: Arc<Replier>,
    /// Addresses whose write the committer could not make (the book must write them
    /// again), and peers' lease changes the book must learn ([`super::ha`]).
    pub(super) notes: mpsc::UnboundedReceiver<Note>,
    /// Proxy mode: the recent exchanges (chaddr, xid) talboot answered with boot
    /// information, so the client's REQUEST of the site server's offer in the same exchange
    /// can be recorded as its ProxyDHCP binding.
    pub(super) proxied: VecDeque<(Mac, u32)>,
    /// Replies queued behind a commit and not sent yet, and the admission target from the
    /// measured commit times (shared with the committer).
    pub(super) backlog: Arc<Backlog>,
    /// Above this many waiting replies, DISCOVERs are shed ([`ACK_BACKLOG`]).
    pub(super) ack_backlog: usize,
    /// On etcd: this appliance's name and the live set its share of clients follows.
    pub(super) members: Option<super::Members>,
}

/// One decision's store rows and what to do once they are committed.
pub(super) struct Job {
    /// Lease writes and the timeline rows announcing them, committed together.
    pub(super) commit: LeaseCommit,
    /// The same events, broadcast once committed.
    pub(super) events: Vec<NodeEvent>,
    /// The batch holding this job must be synced before its reply leaves (an ACK's binding,
    /// a release or decline). Offers and expiry sweeps need not: Kea does not store a lease
    /// for a DHCPOFFER at all (`fake_allocation_` in isc-projects/kea
    /// `src/lib/dhcpsrv/alloc_engine.cc` at Kea-2.2.0).
    pub(super) durable: bool,
    /// A reused binding (retransmitted REQUEST) this reply announces without writing it:
    /// sent only if that address's last write did not fail.
    pub(super) relies_on: Option<Ipv4Addr>,
    pub(super) after: After,
    pub(super) span: tracing::Span,
}

/// What follows a committed job.
pub(super) enum After {
    /// Send this reply.
    Reply(PendingReply),
    /// Proxy mode: persist the MAC's ProxyDHCP binding ([`crate::entitlement`]).
    Bind { mac: Mac, ip: Ipv4Addr },
    /// Nothing (expiry sweeps, releases, declines).
    Nothing,
    /// On etcd: the book has learned these peers' changes; once every job before this one
    /// is committed, the store's compare view takes them ([`super::ha`]).
    Observe(Vec<LeaseEvent>),
}

/// A reply decided and encoded, with where and how it is to be sent.
pub(super) struct PendingReply {
    pub(super) sock: Arc<UdpSocket>,
    pub(super) bytes: Vec<u8>,
    pub(super) to: ReplyTarget,
    /// The request's source (where a loopback simulation replies).
    pub(super) source: SocketAddrV4,
    pub(super) kind: MessageType,
    /// Proxy mode: the client address of this exchange, persisted as the MAC's
    /// ProxyDHCP binding before the reply leaves ([`crate::entitlement`]).
    pub(super) bind: Option<(Mac, Ipv4Addr)>,
    /// When the request was received ([`Datagram::received`]).
    pub(super) received: Instant,
}

impl Adapter {
    /// Decide one datagram and queue what its decision leaves to do.
    pub(super) async fn handle(&mut self, dgram: Datagram, sock: &Arc<UdpSocket>) {
        self.take_notes().await;
        self.follow_members();
        let request_type = peek_msg_type(&dgram.bytes);
        counter!("dhcp_packets_total", "type" => request_type.map(msg_type_label).unwrap_or("none"))
            .increment(1);
        if self.shed(request_type) {
            return;
        }
        let mac = peek_mac(&dgram.bytes);
        let now = Now {
            wall: SystemTime::now(),
            mono: Instant::now(),
        };
        match self
            .core
            .handle(&dgram.bytes, dgram.port, dgram.source, now)
        {
            Outcome::Dropped(reason) => self.dropped(reason, &dgram).await,
            Outcome::Silent {
                reason,
                lease_changes,
            } => self.silent(mac, reason, lease_changes).await,
            Outcome::Send {
                bytes,
                to,
                lease_changes,
                client,
                summary,
            } => {
                let bind = self.proxy_exchange(client.mac, &dgram);
                let mut events: Vec<NodeEvent> = self
                    .replier
                    .reply_event(client.mac, dgram.port, &summary, to)
                    .into_iter()
                    .collect();
                if let Some(why) = &summary.boot_refused {
                    tracing::warn!(mac = %client.mac, reason = %why, "no boot file offered");
                    counter!("dhcp_boot_refused_total").increment(1);
                    let key = self.replier.node_key(client.mac);
                    events.push(self.replier.events.stamp(
                        &key,
                        EventKind::BootRefused,
                        why.clone(),
                    ));
                }
                let reply = PendingReply {
                    sock: sock.clone(),
                    bytes,
                    to,
                    source: dgram.source,
                    kind: summary.kind,
                    bind,
                    received: dgram.received,
                };
                self.answer(reply, &summary, lease_changes, events).await;
            }
        }
    }

    /// Apply what the committer reported since the last datagram: writes that failed, and
    /// peers' lease changes (learned, then a marker queued for the store's view).
    pub(super) async fn take_notes(&mut self) {
        while let Ok(note) = self.notes.try_recv() {
            match note {
                Note::NotDurable(ip) => self.core.book.mark_not_durable(ip),
                Note::Learn { events, records } => {
                    for (ip, record) in records {
                        self.core.book.learn(ip, record);
                    }
                    self.enqueue(Vec::new(), Vec::new(), false, None, After::Observe(events))
                        .await;
                }
            }
        }
    }

    /// Recompute this appliance's share of the clients when the live set changed (an
    /// appliance joined, left, or its etcd lease expired: its buckets are taken over now).
    pub(super) fn follow_members(&mut self) {
        let Some((me, live)) = &mut self.members else {
            return;
        };
        let first = self.core.split.is_none();
        if !first && !live.has_changed().unwrap_or(false) {
            return;
        }
        let names: Vec<String> = live
            .borrow_and_update()
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let split = crate::dhcp::split::Split::new(me, &names);
        tracing::info!(live = ?names, buckets = split.buckets(), "DHCP share of the clients");
        self.core.book.set_share(Some(split.clone()));
        self.core.split = Some(split);
    }

    /// Admission control: when the durable path is behind, a new exchange would only
    /// produce a REQUEST it cannot answer in time. Kea gets this for free by answering
    /// one datagram at a time; here OFFERs leave without waiting for the disk, so it has
    /// to be said ([`crate::dhcp::admission`]; only DISCOVERs are ever refused).
    fn shed(&self, request_type: Option<MessageType>) -> bool {
        let Some(shed) =
            self.backlog
                .decide(Lane::of(request_type), Instant::now(), self.ack_backlog)
        else {
            return false;
        };
        let reason = shed.label();
        counter!("dhcp_dropped_total", "reason" => reason).increment(1);
        debug!(reason, "ACKs waiting for the disk: DISCOVER not answered");
        true
    }

    /// A datagram the core dropped is counted; in proxy mode it may still carry the binding
    /// of an exchange talboot answered.
    async fn dropped(&mut self, reason: DropReason, dgram: &Datagram) {
        counter!("dhcp_dropped_total", "reason" => reason.label()).increment(1);
        debug!(%reason, "dropped");
        // Proxy mode: the client takes its address from the site's server with a
        // broadcast REQUEST (option 50) in the exchange talboot answered; when it never
        // asks talboot on 4011 (iPXE skips that when the proxy offer already carries a
        // boot file), that REQUEST is the only binding talboot sees.
        if self.replier.mode == NetworkMode::Proxy
            && let Some((mac, ip)) = selected_address(&dgram.bytes)
            && self.proxied.contains(&(mac, peek_xid(&dgram.bytes)))
        {
            self.enqueue(Vec::new(), Vec::new(), false, None, After::Bind { mac, ip })
                .await;
        }
    }

    /// A decision without a reply: its lease changes are written, and a release or decline
    /// is announced on the timeline once durable.
    async fn silent(&mut self, mac: Option<Mac>, reason: Silence, writes: Vec<LeaseChange>) {
        let event = match (mac, reason) {
            (Some(mac), Silence::Released) => {
                Some((mac, EventKind::DhcpRelease, "released its address"))
            }
            (Some(mac), Silence::Declined) => Some((
                mac,
                EventKind::DhcpDecline,
                "declined its address (conflict); quarantined",
            )),
            _ => None,
        };
        let durable = event.is_some();
        let events = event
            .map(|(mac, kind, detail)| {
                self.replier
                    .events
                    .stamp(&self.replier.node_key(mac), kind, detail)
            })
            .into_iter()
            .collect();
        self.enqueue(writes, events, durable, None, After::Nothing)
            .await;
    }

    /// Proxy mode: remember the exchange this reply answers (see [`Adapter::proxied`]) and
    /// return the client's address in it, its MAC's binding. In proxy mode talboot hands out
    /// no lease: the address the client speaks from in the PXE exchange it answered is the
    /// only binding of its MAC it ever sees.
    fn proxy_exchange(&mut self, mac: Mac, dgram: &Datagram) -> Option<(Mac, Ipv4Addr)> {
        if self.replier.mode != NetworkMode::Proxy {
            return None;
        }
        let bind = proxy_request_address(&dgram.bytes, *dgram.source.ip()).map(|ip| (mac, ip));
        if self.proxied.len() >= PROXIED_REMEMBERED {
            self.proxied.pop_front();
        }
        self.proxied.push_back((mac, peek_xid(&dgram.bytes)));
        bind
    }

    /// Send a reply now, or queue it behind the commit of what it announces: an ACK's new
    /// binding must be on disk before the ACK leaves, and a retransmitted ACK only goes out
    /// if its binding's write did not fail.
    async fn answer(
        &self,
        reply: PendingReply,
        summary: &ReplySummary,
        writes: Vec<LeaseChange>,
        events: Vec<NodeEvent>,
    ) {
        let ack = summary.kind == MessageType::Ack;
        let durable = ack && !writes.is_empty();
        let relies_on = (ack && writes.is_empty() && !summary.yiaddr.is_unspecified())
            .then_some(summary.yiaddr);
        if !durable && relies_on.is_none() && reply.bind.is_none() {
            // Nothing this reply says needs to be on disk (an OFFER: Kea does not even
            // store one; a NAK; an INFORM's ACK): it leaves now, and its record and
            // event ride in the next commit. So a slow fsync delays only the ACKs that
            // must wait for it, never the DISCOVERs behind them (the stall at
            // 3,000/s, docs/benchmarks.md).
            self.replier
                .send(&reply.sock, &reply.bytes, reply.to, reply.source)
                .await;
            counter!("dhcp_replies_total", "type" => msg_type_label(summary.kind)).increment(1);
            self.enqueue(writes, events, false, None, After::Nothing)
                .await;
            return;
        }
        self.enqueue(writes, events, durable, relies_on, After::Reply(reply))
            .await;
    }

    /// Sweep expired offers and leases out of the book, their removal committed like any
    /// decision's.
    pub(super) async fn sweep_expired(&mut self) {
        self.take_notes().await;
        let changes = self.core.book.expire(SystemTime::now());
        if !changes.is_empty() {
            self.enqueue(changes, Vec::new(), false, None, After::Nothing)
                .await;
        }
    }

    /// Hand a decision's rows and follow-up to the committer; the wait here is the only
    /// back-pressure the handling loop feels.
    async fn enqueue(
        &self,
        writes: Vec<LeaseChange>,
        events: Vec<NodeEvent>,
        durable: bool,
        relies_on: Option<Ipv4Addr>,
        after: After,
    ) {
        if matches!(after, After::Reply(_)) {
            self.backlog.queued(Instant::now());
        }
        let job = Job {
            commit: LeaseCommit {
                writes,
                events: events.iter().map(NodeEvent::row).collect(),
            },
            events,
            durable,
            relies_on,
            after,
            span: tracing::Span::current(),
        };
        let waited = Instant::now();
        if self.jobs.send(job).await.is_err() {
            error!("DHCP committer has stopped; reply dropped");
        }
        let waited = waited.elapsed();
        if waited > Duration::from_millis(5) {
            // The committer is behind: datagrams now pile up in the receive queue.
            debug!(target: "talboot::dhcp::commit", waited_us = waited.as_micros() as u64, "handler waited for the committer");
        }
    }
}
