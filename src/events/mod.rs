//! Typed provisioning events: what happened to which machine, and when.
//!
//! The network servers and the orchestrator publish [`NodeEvent`]s; the [`EventBus`] appends
//! each to the node's timeline in the store and then broadcasts it to listeners (orchestrator,
//! status views, tests). Store writes happen on a dedicated blocking task fed by a queue, so a
//! DHCP or TFTP handler never waits for an fsync; the bus keeps the order of publication.
//! Machines not in the inventory are recorded under `mac-<aa-bb-cc-dd-ee-ff>` so discovery has a
//! timeline too; [`node_key_by_peer`] names the timeline of a request that only brings its
//! source address (TFTP, HTTP). The DHCP server persists its own events in the transaction of
//! the lease change they announce and only [`EventBus::announce`]s them. The store folds an event identical (kind and detail) to the
//! node's previous one into that row with a count, so a repeated probe failure is one line.

use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc};

use crate::inventory::{Inventory, Mac};
use crate::store::{EventWriter, NewEvent};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A DHCPOFFER was sent.
    DhcpOffer,
    /// A DHCPACK was sent.
    DhcpAck,
    /// A DHCPNAK was sent.
    DhcpNak,
    /// The client declined its address (conflict); the address is quarantined.
    DhcpDecline,
    /// The client released its address.
    DhcpRelease,
    /// proxyDHCP boot information was sent.
    ProxyOffer,
    /// A file was sent over TFTP.
    TftpFile,
    /// A TFTP transfer failed or was aborted.
    TftpFailed,
    /// An iPXE script was served.
    Script,
    /// The kernel was sent completely.
    Kernel,
    /// The initramfs was sent completely.
    Initramfs,
    /// A UKI (plain or Secure Boot signed) was sent completely, over HTTP or TFTP.
    Uki,
    /// A network-boot request was answered without a boot file because nothing the node's
    /// firmware may boot exists for it (e.g. a Secure Boot node and no signed UKI, or BIOS).
    BootRefused,
    /// A node booted Talos from talboot (a script, kernel, initramfs or UKI went out whole)
    /// and has not answered on the maintenance API for [`crate::provision::Settings`]'s
    /// `boot_stall_after` since: most often firmware that refused what it was sent (a Secure
    /// Boot verdict), or a machine that hung in early boot. Reported once per boot.
    BootStalled,
    /// A machine config was released to the node.
    ConfigReleased,
    /// A request for a machine config was refused.
    ConfigRefused,
    /// A script, token or config of a node was asked for, or a push would have gone, from an
    /// address talboot's DHCP did not bind to the node (see [`crate::entitlement`]); or a
    /// `secureBoot: true` node failed the Secure Boot gate and gets no config (the detail
    /// names every reason and all it reported). The detail never holds a token.
    EntitlementRefused,
    /// A machine not in the inventory booted (discover policy).
    Discovered,
    /// A provisioning phase change.
    Phase,
    /// A Talos API call and its outcome.
    Talos,
    /// A cluster step.
    Cluster,
    /// A power or boot-device request to the node's controller and its outcome.
    Power,
    /// Drift appeared or cleared: the node's running config and the inventory's rendering
    /// differ (or agree again).
    Drift,
}

impl EventKind {
    /// The stored, machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DhcpOffer => "dhcp.offer",
            Self::DhcpAck => "dhcp.ack",
            Self::DhcpNak => "dhcp.nak",
            Self::DhcpDecline => "dhcp.decline",
            Self::DhcpRelease => "dhcp.release",
            Self::ProxyOffer => "dhcp.proxy",
            Self::TftpFile => "tftp.file",
            Self::TftpFailed => "tftp.failed",
            Self::Script => "http.script",
            Self::Kernel => "http.kernel",
            Self::Initramfs => "http.initramfs",
            Self::Uki => "boot.uki",
            Self::BootRefused => "boot.refused",
            Self::BootStalled => "boot.stalled",
            Self::ConfigReleased => "config.released",
            Self::ConfigRefused => "config.refused",
            Self::EntitlementRefused => "security.refused",
            Self::Discovered => "node.discovered",
            Self::Phase => "node.phase",
            Self::Talos => "talos.call",
            Self::Cluster => "cluster.step",
            Self::Power => "power.action",
            Self::Drift => "node.drift",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// Inventory node name, or [`unknown_node_key`] of the MAC.
    pub node: String,
    /// What happened.
    pub kind: EventKind,
    /// Human-readable detail (never secrets).
    pub detail: String,
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

impl NodeEvent {
    /// The row the store appends for this event.
    pub fn row(&self) -> NewEvent {
        NewEvent {
            node: self.node.clone(),
            kind: self.kind.as_str().to_string(),
            detail: self.detail.clone(),
            at_unix_ms: self.at_unix_ms,
        }
    }
}

/// The timeline key for a machine that is not in the inventory.
pub fn unknown_node_key(mac: Mac) -> String {
    format!("mac-{}", mac.to_string().replace(':', "-"))
}

/// The timeline key of the machine that sent a request from `peer`. The DHCP lease on the
/// address is authoritative: its MAC names the inventory node, or the unknown machine
/// ([`unknown_node_key`]). Without a lease, the inventory node last seen at the address;
/// else `ip-<peer>`. Read from the in-memory view the writers publish to, never the store
/// (it runs per TFTP transfer and per HTTP asset).
pub(crate) fn node_key_by_peer(
    view: &crate::view::StateView,
    inventory: &Inventory,
    peer: IpAddr,
) -> String {
    let v4 = match peer {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    let Some(ip) = v4 else {
        return format!("ip-{peer}");
    };
    if let Some(mac) = view.mac_at(ip) {
        return inventory
            .node_by_mac(mac)
            .map(|n| n.name.value.clone())
            .unwrap_or_else(|| unknown_node_key(mac));
    }
    view.node_last_seen_at(ip)
        .unwrap_or_else(|| format!("ip-{peer}"))
}

/// Where time comes from; tests substitute their own.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_unix_ms(&self) -> u64;
    /// Seconds since the Unix epoch.
    fn now_unix(&self) -> u64 {
        self.now_unix_ms() / 1000
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// Publishes events: persisted in order by a writer task, then broadcast.
#[derive(Clone)]
pub struct EventBus {
    queue: mpsc::UnboundedSender<NodeEvent>,
    live: broadcast::Sender<NodeEvent>,
    clock: Arc<dyn Clock>,
}

impl EventBus {
    /// Start the bus and its writer task on the current tokio runtime. The writer ends when
    /// every clone of the bus is dropped, after writing what was queued. The writer task is
    /// the timelines' one writer: it owns `store`.
    pub fn start(store: EventWriter, clock: Arc<dyn Clock>) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, mut rx) = mpsc::unbounded_channel::<NodeEvent>();
        let (live, _) = broadcast::channel(4096);
        let live_tx = live.clone();
        let writer = tokio::task::spawn_blocking(move || {
            // Write whatever has queued up in one transaction: one fsync per burst, not per
            // event, so a busy DHCP server is not slowed down by its own timeline.
            while let Some(first) = rx.blocking_recv() {
                let mut batch = vec![first];
                while batch.len() < 1024 {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                let rows: Vec<NewEvent> = batch.iter().map(NodeEvent::row).collect();
                if let Err(e) = store.append_events(&rows) {
                    tracing::error!(events = rows.len(), error = %e, "cannot persist events");
                }
                for ev in batch {
                    // Nobody listening is fine.
                    let _ = live_tx.send(ev);
                }
            }
        });
        (Self { queue, live, clock }, writer)
    }

    /// Publish an event now.
    pub fn publish(&self, node: &str, kind: EventKind, detail: impl Into<String>) {
        let ev = self.stamp(node, kind, detail);
        tracing::info!(node = %ev.node, kind = %ev.kind, detail = %ev.detail, "event");
        if self.queue.send(ev).is_err() {
            tracing::error!("event writer has stopped; event dropped");
        }
    }

    /// An event stamped with the bus's clock, for a publisher that persists it itself (in the
    /// same transaction as the change it records) and then [`announce`](Self::announce)s it.
    pub fn stamp(&self, node: &str, kind: EventKind, detail: impl Into<String>) -> NodeEvent {
        NodeEvent {
            node: node.to_string(),
            kind,
            detail: detail.into(),
            at_unix_ms: self.clock.now_unix_ms(),
        }
    }

    /// Broadcast an event its publisher has already persisted (the DHCP server commits a lease
    /// change and its events together, so they do not take redb's write slot twice).
    pub(crate) fn announce(&self, ev: NodeEvent) {
        tracing::info!(node = %ev.node, kind = %ev.kind, detail = %ev.detail, "event");
        // Nobody listening is fine.
        let _ = self.live.send(ev);
    }

    /// Receive events published after this call (after they are persisted).
    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.live.subscribe()
    }

    /// The bus's clock.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
}

/// Prints one of talboot's events on stdout with the time since `started`: the console of
/// `talboot up` and of the demo.
pub(crate) fn print_event(started: Instant, ev: &NodeEvent) {
    // Talos calls are many and the phase changes say the same thing more plainly.
    if ev.kind == EventKind::Talos || ev.kind == EventKind::DhcpOffer {
        return;
    }
    let t = started.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{t:7.2}s  {:<14} {:<15} {}",
        ev.node,
        ev.kind.as_str(),
        ev.detail
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn events_are_persisted_in_order_then_broadcast() {
        let dir = tempfile::tempdir().unwrap();
        let (store, w) = crate::store::open(dir.path()).unwrap().split();
        let (bus, writer) = EventBus::start(w.events, Arc::new(SystemClock));
        let mut rx = bus.subscribe();
        bus.publish("cp-1", EventKind::DhcpOffer, "offered 10.0.0.11");
        bus.publish("cp-1", EventKind::DhcpAck, "acked 10.0.0.11");
        let mac: Mac = "aa:bb:cc:00:00:01".parse().unwrap();
        bus.publish(&unknown_node_key(mac), EventKind::Discovered, "booted");
        let first = rx.recv().await.unwrap();
        assert_eq!(first.kind, EventKind::DhcpOffer);
        drop(bus);
        writer.await.unwrap();
        let evs = store.events("cp-1", 0, 10).unwrap();
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["dhcp.offer", "dhcp.ack"]);
        assert_eq!(
            store
                .last_event("mac-aa-bb-cc-00-00-01")
                .unwrap()
                .unwrap()
                .kind,
            "node.discovered"
        );
    }

    #[test]
    fn peer_key_lease_first_then_last_seen_then_ip() {
        use crate::store::{Lease, LeaseState, NodePhase, NodeRecord};
        let dir = tempfile::tempdir().unwrap();
        let (store, w) = crate::store::open(dir.path()).unwrap().split();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        let inv = crate::inventory::load_with_env(&path, &std::collections::BTreeMap::new())
            .unwrap()
            .inventory;
        let known = &inv.nodes[0];
        let known_mac = known.macs[0].value;
        let stranger: Mac = "aa:bb:cc:00:00:09".parse().unwrap();
        let lease = |mac, ip: &str| Lease {
            mac,
            ip: ip.parse().unwrap(),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: 2_000,
            updated_at_unix: 1_000,
        };
        w.leases.put_lease(&lease(known_mac, "10.9.0.1")).unwrap();
        w.leases.put_lease(&lease(stranger, "10.9.0.2")).unwrap();
        // The stranger's lease outranks the inventory node last seen at its address.
        let rec = NodeRecord {
            name: inv.nodes[1].name.value.clone(),
            phase: NodePhase::Ready,
            phase_since_unix: 0,
            last_seen_addr: Some("10.9.0.2".parse().unwrap()),
            mac: None,
            talos_version: None,
            provisioning_window_open: false,
            updated_at_unix: 0,
        };
        w.nodes.put_node(&rec).unwrap();
        w.nodes
            .put_node(&NodeRecord {
                name: inv.nodes[2].name.value.clone(),
                last_seen_addr: Some("10.9.0.3".parse().unwrap()),
                ..rec
            })
            .unwrap();

        let view = crate::view::StateView::load(&*store, &inv).unwrap();
        let key = |ip: &str| node_key_by_peer(&view, &inv, ip.parse().unwrap());
        assert_eq!(key("10.9.0.1"), known.name.value);
        assert_eq!(key("::ffff:10.9.0.1"), known.name.value);
        assert_eq!(key("10.9.0.2"), "mac-aa-bb-cc-00-00-09");
        assert_eq!(key("10.9.0.3"), inv.nodes[2].name.value);
        assert_eq!(key("10.9.0.4"), "ip-10.9.0.4");
        assert_eq!(key("::ffff:10.9.0.4"), "ip-::ffff:10.9.0.4");
        assert_eq!(key("fd00::1"), "ip-fd00::1");
    }
}
