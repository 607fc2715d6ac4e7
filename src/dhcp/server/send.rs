//! The sending side: the replies of each committed group, paced so that a burst does not
//! overflow the receiver, the ProxyDHCP bindings recorded before their reply leaves, the
//! timeline events of what was sent, and delivery to the RFC 2131 §4.1 destination.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dhcproto::v4::MessageType;
use metrics::{counter, gauge, histogram};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use super::handle::{After, Job, PendingReply};
use super::peek::msg_type_label;
use super::socket::add_arp_entry;
use super::{DhcpWriters, Transport};
use crate::dhcp::admission::Backlog;
use crate::dhcp::pace::Pace;
use crate::dhcp::{DecideCtx, ReplySummary, ReplyTarget, ServerPort};
use crate::events::{EventBus, EventKind, NodeEvent, unknown_node_key};
use crate::inventory::{Mac, NetworkMode};
use crate::view::StateView;

/// Jobs whose commit returned, in order, each with whether its events are in the store.
pub(super) struct Released {
    pub(super) jobs: Vec<(Job, bool)>,
    /// When the next commit is expected to release its group (the smoothed commit time).
    pub(super) window: Duration,
    /// When the commit released it: its pacing counts from here.
    pub(super) at: Instant,
}

/// The sending half of the committer: the replies (and bindings, and events) of each
/// released group, in order, paced by [`Pace`] so that a large group does not leave back to
/// back and overflow the receiver's socket buffer.
pub(super) async fn send_loop(
    mut rx: mpsc::UnboundedReceiver<Released>,
    writers: Arc<DhcpWriters>,
    replier: Arc<Replier>,
    pace: Pace,
    backlog: Arc<Backlog>,
) {
    while let Some(group) = rx.recv().await {
        let n = group
            .jobs
            .iter()
            .filter(|(j, _)| matches!(j.after, After::Reply(_)))
            .count();
        // From its release, not from when its turn comes: groups are released about one
        // commit apart and each is spread over about one commit, so a sender that started
        // each group's schedule on its turn fell behind by every timer overshoot (a sleep of
        // 1 ms takes up to 2) and never caught up -- at 13,000 ACKs a second on one core the
        // replies waited 18-23 ms in all while commits took 1.6 ms (docs/benchmarks.md). A
        // late sender now sends what is already due at once: the lag is bounded by one window.
        let start = group.at;
        let mut sent = 0;
        if n > pace.burst {
            counter!("dhcp_paced_groups_total").increment(1);
        }
        gauge!("dhcp_discover_shed_probability").set(backlog.delay_probability());
        for (job, stored) in group.jobs {
            let _enter = job.span.enter();
            match job.after {
                After::Reply(PendingReply {
                    sock,
                    bytes,
                    to,
                    source,
                    kind,
                    bind,
                    received,
                }) => {
                    let at = pace.offset(sent, n, group.window);
                    sent += 1;
                    if !at.is_zero() {
                        tokio::time::sleep_until((start + at).into()).await;
                    }
                    if let Some((mac, ip)) = bind {
                        record_binding(&writers, replier.view.as_deref(), mac, ip).await;
                    }
                    replier.send(&sock, &bytes, to, source).await;
                    let delay = received.elapsed();
                    backlog.sent(delay);
                    histogram!("dhcp_reply_delay_seconds").record(delay.as_secs_f64());
                    counter!("dhcp_replies_total", "type" => msg_type_label(kind)).increment(1);
                }
                After::Bind { mac, ip } => {
                    record_binding(&writers, replier.view.as_deref(), mac, ip).await
                }
                After::Nothing | After::Observe(_) => {}
            }
            for ev in job.events {
                if stored {
                    replier.events.announce(ev);
                } else {
                    replier.events.publish(&ev.node, ev.kind, ev.detail);
                }
            }
        }
    }
}

/// What sending and reporting a reply needs: the interface (for ARP entries), the mode, and
/// node names by MAC.
pub(super) struct Replier {
    iface: String,
    transport: Transport,
    pub(super) mode: NetworkMode,
    hosts: BTreeMap<Mac, String>,
    pub(super) events: EventBus,
    pub(super) view: Option<Arc<StateView>>,
}

impl Replier {
    /// The replier of a server on `iface` serving `ctx`: the node names are taken now, since
    /// the core owns the context once serving starts.
    pub(super) fn new(
        iface: &str,
        transport: Transport,
        ctx: &DecideCtx,
        events: EventBus,
        view: Option<Arc<StateView>>,
    ) -> Self {
        Self {
            iface: iface.to_string(),
            transport,
            mode: ctx.mode,
            hosts: ctx
                .hosts
                .iter()
                .map(|(m, h)| (*m, h.name.clone()))
                .collect(),
            events,
            view,
        }
    }

    /// Send `bytes` per the RFC 2131 §4.1 target.
    pub(super) async fn send(
        &self,
        sock: &UdpSocket,
        bytes: &[u8],
        to: ReplyTarget,
        source: SocketAddrV4,
    ) {
        let dest = match to {
            _ if self.transport == Transport::ReplyToSource => {
                debug!(rfc2131 = %to.addr(), to = %source, "loopback simulation: replying to the request's source");
                source
            }
            ReplyTarget::UnicastToHardware { addr, mac } => {
                match add_arp_entry(sock, &self.iface, *addr.ip(), mac) {
                    Ok(()) => {
                        counter!("dhcp_arp_injected_total").increment(1);
                        addr
                    }
                    Err(e) => {
                        counter!("dhcp_arp_fallback_total").increment(1);
                        debug!(error = %e, ip = %addr.ip(), "cannot add ARP entry; broadcasting");
                        ReplyTarget::BROADCAST_ADDR
                    }
                }
            }
            other => other.addr(),
        };
        match sock.send_to(bytes, SocketAddr::V4(dest)).await {
            Ok(_) => debug!(to = %dest, "reply sent"),
            Err(e) => {
                counter!("dhcp_send_errors_total").increment(1);
                warn!(to = %dest, error = %e, "cannot send DHCP reply");
            }
        }
    }

    /// The timeline event of a reply about to be sent.
    pub(super) fn reply_event(
        &self,
        mac: Mac,
        port: ServerPort,
        reply: &ReplySummary,
        to: ReplyTarget,
    ) -> Option<NodeEvent> {
        let proxy = self.mode == NetworkMode::Proxy || port == ServerPort::PxeBoot;
        let file = &reply.boot_file;
        let kind = match reply.kind {
            MessageType::Offer | MessageType::Ack if proxy => EventKind::ProxyOffer,
            MessageType::Offer => EventKind::DhcpOffer,
            MessageType::Ack => EventKind::DhcpAck,
            MessageType::Nak => EventKind::DhcpNak,
            _ => return None,
        };
        let detail = match kind {
            EventKind::ProxyOffer => format!("boot file `{file}` via {to:?}"),
            EventKind::DhcpNak => "request refused (NAK)".to_string(),
            _ => format!("{} (boot file `{file}`)", reply.yiaddr),
        };
        Some(self.events.stamp(&self.node_key(mac), kind, detail))
    }

    /// The timeline key of `mac`: its node's name, or the key unknown machines are filed
    /// under.
    pub(super) fn node_key(&self, mac: Mac) -> String {
        match self.hosts.get(&mac) {
            Some(name) => name.clone(),
            None => unknown_node_key(mac),
        }
    }
}

/// Seconds since the epoch, as the ProxyDHCP binding records them.
fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Persist the ProxyDHCP binding of `mac` to `ip`.
async fn record_binding(
    writers: &Arc<DhcpWriters>,
    view: Option<&StateView>,
    mac: Mac,
    ip: Ipv4Addr,
) {
    let writers = writers.clone();
    let now = unix(SystemTime::now());
    if let Some(v) = view {
        v.retract_proxy(mac);
    }
    let done = tokio::task::spawn_blocking(move || {
        crate::entitlement::record_proxy_binding(&writers.bindings, mac, ip, now)
    })
    .await;
    match done {
        Ok(Ok(binding)) => {
            if let Some(v) = view {
                v.publish_proxy(binding);
            }
            debug!(%mac, %ip, "ProxyDHCP binding recorded")
        }
        Ok(Err(e)) => error!(%mac, error = %e, "cannot record ProxyDHCP binding"),
        Err(e) => error!(%mac, error = %e, "cannot record ProxyDHCP binding"),
    }
}
