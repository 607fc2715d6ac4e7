//! The in-memory read view of node state and DHCP bindings: what the request paths (the
//! per-MAC boot script, the pull-config handler, the asset handler's and TFTP's naming of a
//! requester) read instead of the store.
//!
//! The view owns nothing durable. Each piece has one writer, which publishes here what it
//! committed to the store: the provisioner (or, with no provisioner running, the HTTP
//! handler that applies the core's rules) publishes node records and lifecycles after each
//! commit; the DHCP server publishes its leases after each lease commit and its ProxyDHCP
//! bindings after each write. The view is loaded from the store once, before any server
//! starts. The drift board ([`drift`]) rides along: serve's day-two tasks write it, the admin
//! API reads it.
//!
//! **A view that lags the store fails closed.** A writer announces what it is about to change
//! *before* its commit ([`StateView::begin_leases`], [`StateView::retract_proxy`],
//! [`StateView::begin_nodes`]): the bindings it touches are removed (no binding entitles
//! nobody) and the nodes it touches read as "window closed" until the commit's outcome is
//! published. A lease is published as the store holds it after the commit (re-read, so the
//! store's lease rules stay the store's), and its expiry is judged at read time. So a binding
//! that moves refuses the old address from before the commit on, and the new address only
//! once the store has it.
//!
//! Mechanism: one `std::sync::RwLock` over plain maps. Reads copy out a few bytes (or one
//! record) under the read lock; writes are a DHCP commit batch or a provisioner group commit,
//! far rarer than reads, and hold the write lock only to update map entries (never across a
//! store call). A copy-on-write map (`arc-swap`) would make reads lock-free but copies the
//! whole map on every write, for no measured gain here (see docs/architecture.md).

pub mod drift;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::RwLock;

use crate::entitlement::{Bound, ProxyBinding};
use crate::inventory::{Inventory, Mac, NetworkMode};
use crate::store::{
    Lease, LeaseChange, LeaseCommit, LeaseState, Lifecycle, NodePart, NodeRecord, NodeWrite, Store,
    StoreError, decode_lifecycle,
};

/// The read view (see the module docs). Shared as `Arc<StateView>`.
#[derive(Debug, Default)]
pub struct StateView {
    inner: RwLock<Inner>,
    /// Drift as serve's drift watcher last saw it (its own lock; see [`drift`]).
    pub drift: std::sync::Arc<drift::DriftBoard>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each MAC's current lease, as `Store::lease` returns it (never a `Declined` record).
    leases: HashMap<Mac, Lease>,
    /// The MAC of the record occupying each address, as `Store::lease_by_ip` returns it.
    by_ip: HashMap<Ipv4Addr, Mac>,
    /// ProxyDHCP bindings by MAC.
    proxies: HashMap<Mac, ProxyBinding>,
    /// Node state by name (ordered, as `Store::nodes` is).
    nodes: BTreeMap<String, NodeEntry>,
}

#[derive(Debug, Default)]
struct NodeEntry {
    /// The committed record and lifecycle (`None`: no record yet).
    state: Option<(NodeRecord, Lifecycle)>,
    /// Commits of this node in flight; while any is, its window reads as closed.
    in_flight: u32,
}

/// The leases a DHCP commit is about to change, from [`StateView::begin_leases`]; hand it
/// the store after the commit (whatever its outcome) with [`LeaseTouch::refresh`].
#[derive(Debug, Default)]
#[must_use = "refresh the view after the commit, or the touched bindings stay retracted"]
pub struct LeaseTouch {
    macs: HashSet<Mac>,
    ips: HashSet<Ipv4Addr>,
}

impl StateView {
    /// An empty view (nothing bound, no records): what a store with nothing in it holds.
    pub fn new() -> Self {
        Self::default()
    }

    /// The view of what `store` holds now: every lease, the ProxyDHCP binding of every
    /// inventory MAC, every node record and its lifecycle. Call before the writers start.
    pub fn load(store: &dyn Store, inventory: &Inventory) -> Result<Self, StoreError> {
        let view = Self::new();
        view.reload(store, inventory)?;
        Ok(view)
    }

    /// Replace the whole view with what `store` holds now (startup, or a test that wrote
    /// the store directly and so acts as the writer).
    pub fn reload(&self, store: &dyn Store, inventory: &Inventory) -> Result<(), StoreError> {
        let mut fresh = Inner::default();
        for l in store.leases()? {
            fresh.by_ip.insert(l.ip, l.mac);
            if l.state != LeaseState::Declined {
                fresh.leases.insert(l.mac, l);
            }
        }
        for n in &inventory.nodes {
            for m in &n.macs {
                if let Some(p) = crate::entitlement::proxy_binding(store, m.value)? {
                    fresh.proxies.insert(m.value, p);
                }
            }
        }
        for rec in store.nodes()? {
            let life = Lifecycle::load(store, &rec.name)?;
            fresh.nodes.insert(
                rec.name.clone(),
                NodeEntry {
                    state: Some((rec, life)),
                    in_flight: 0,
                },
            );
        }
        *self.write() = fresh;
        Ok(())
    }

    /// Replace the node records and lifecycles with what `store` holds now: a follower's
    /// refresh from the shared store, which some other appliance's provisioner writes. A
    /// commit of this appliance in flight keeps its node reading as closed.
    pub fn reload_nodes(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut fresh = BTreeMap::new();
        for rec in store.nodes()? {
            let life = Lifecycle::load(store, &rec.name)?;
            fresh.insert(rec.name.clone(), (rec, life));
        }
        let mut inner = self.write();
        inner
            .nodes
            .retain(|name, e| e.in_flight > 0 || fresh.contains_key(name));
        for (name, state) in fresh {
            inner.nodes.entry(name).or_default().state = Some(state);
        }
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock leaves maps that are each consistent (every update
        // is a single insert or remove), so a poisoned lock is still readable.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    // ----- reads -----

    /// The address a node with `macs` may receive its config at: [`crate::entitlement`]'s
    /// rule ([`crate::entitlement::choose`]) over the published bindings.
    pub(crate) fn bound(&self, mode: NetworkMode, macs: &[Mac], now_unix: u64) -> Option<Bound> {
        let inner = self.read();
        match mode {
            NetworkMode::Authoritative => {
                let leases: Vec<Lease> = macs
                    .iter()
                    .filter_map(|m| inner.leases.get(m).cloned())
                    .collect();
                drop(inner);
                crate::entitlement::choose(mode, &leases, &[], now_unix)
            }
            NetworkMode::Proxy => {
                let mut proxies: Vec<ProxyBinding> = macs
                    .iter()
                    .filter_map(|m| inner.proxies.get(m).cloned())
                    .collect();
                drop(inner);
                // The most recent exchange wins, as in `entitlement::bound_address`.
                proxies.sort_by_key(|p| std::cmp::Reverse(p.seen_at_unix));
                crate::entitlement::choose(mode, &[], &proxies, now_unix)
            }
        }
    }

    /// The committed record and lifecycle of `name`, and whether a commit of it is in
    /// flight.
    pub(crate) fn node(&self, name: &str) -> (Option<(NodeRecord, Lifecycle)>, bool) {
        match self.read().nodes.get(name) {
            Some(e) => (e.state.clone(), e.in_flight > 0),
            None => (None, false),
        }
    }

    /// Whether `name`'s provisioning window is open: no record yet, or a record with its
    /// window open, and no commit of it in flight (which might close it).
    pub(crate) fn window_open(&self, name: &str) -> bool {
        match self.read().nodes.get(name) {
            None => true,
            Some(e) => {
                e.in_flight == 0
                    && e.state
                        .as_ref()
                        .is_none_or(|(r, _)| r.provisioning_window_open)
            }
        }
    }

    /// Whether `name` is installed: a record in phase Ready with its window closed.
    pub(crate) fn installed(&self, name: &str) -> bool {
        self.read()
            .nodes
            .get(name)
            .and_then(|e| e.state.as_ref())
            .is_some_and(|(r, _)| {
                !r.provisioning_window_open && r.phase == crate::store::NodePhase::Ready
            })
    }

    /// The MAC whose lease record occupies `ip`, if any.
    pub(crate) fn mac_at(&self, ip: Ipv4Addr) -> Option<Mac> {
        self.read().by_ip.get(&ip).copied()
    }

    /// The first node (by name) last seen at `ip`.
    pub(crate) fn node_last_seen_at(&self, ip: Ipv4Addr) -> Option<String> {
        self.read()
            .nodes
            .iter()
            .find(|(_, e)| {
                e.state
                    .as_ref()
                    .is_some_and(|(r, _)| r.last_seen_addr == Some(ip))
            })
            .map(|(n, _)| n.clone())
    }

    // ----- the DHCP server's side -----

    /// Before a lease commit: retract every binding `groups` may change (each written MAC's
    /// current lease, and whatever occupies each written address), so nothing they held
    /// entitles anyone until [`LeaseTouch::refresh`] publishes what the store then holds.
    pub fn begin_leases(&self, groups: &[LeaseCommit]) -> LeaseTouch {
        self.begin_lease_writes(groups.iter().flat_map(|g| g.writes.iter()))
    }

    /// [`Self::begin_leases`] for a plain list of writes.
    pub(crate) fn begin_lease_writes<'a>(
        &self,
        writes: impl Iterator<Item = &'a LeaseChange>,
    ) -> LeaseTouch {
        let mut touch = LeaseTouch::default();
        let mut inner = self.write();
        for w in writes {
            let ip = match w {
                LeaseChange::Upsert(l) => {
                    touch.macs.insert(l.mac);
                    l.ip
                }
                LeaseChange::Remove(ip) => *ip,
            };
            touch.ips.insert(ip);
            if let Some(holder) = inner.by_ip.get(&ip).copied() {
                touch.macs.insert(holder);
            }
        }
        for mac in &touch.macs {
            // A put also removes the MAC's lease at its previous address.
            if let Some(old) = inner.leases.remove(mac) {
                touch.ips.insert(old.ip);
            }
        }
        for ip in &touch.ips {
            if let Some(holder) = inner.by_ip.remove(ip) {
                inner.leases.remove(&holder);
            }
        }
        touch
    }

    // ----- the ProxyDHCP side -----

    /// Before writing `mac`'s ProxyDHCP binding: nothing it held entitles anyone until
    /// [`Self::publish_proxy`].
    pub(crate) fn retract_proxy(&self, mac: Mac) {
        self.write().proxies.remove(&mac);
    }

    /// After `binding` was written to the store.
    pub(crate) fn publish_proxy(&self, binding: ProxyBinding) {
        self.write().proxies.insert(binding.mac, binding);
    }

    // ----- the node records' writer -----

    /// Before committing `writes`: their nodes read as "window closed" until
    /// [`Self::end_nodes`].
    pub(crate) fn begin_nodes(&self, writes: &[NodeWrite]) {
        let mut inner = self.write();
        for w in writes {
            inner.nodes.entry(w.name.clone()).or_default().in_flight += 1;
        }
    }

    /// After the commit of `writes` (begun with [`Self::begin_nodes`]): publish them when
    /// `committed`, and end their in-flight mark either way (a failed commit changed nothing).
    pub(crate) fn end_nodes(&self, writes: &[NodeWrite], committed: bool) {
        let mut inner = self.write();
        for w in writes {
            let entry = inner.nodes.entry(w.name.clone()).or_default();
            entry.in_flight = entry.in_flight.saturating_sub(1);
            if !committed {
                continue;
            }
            let life = w
                .parts
                .iter()
                .find(|(p, _)| *p == NodePart::Lifecycle)
                .map(|(_, json)| decode_lifecycle(Some(json)));
            match (&mut entry.state, &w.record, life) {
                (Some((rec, l)), r, life) => {
                    if let Some(r) = r {
                        *rec = r.clone();
                    }
                    if let Some(life) = life {
                        *l = life;
                    }
                }
                (None, Some(r), life) => entry.state = Some((r.clone(), life.unwrap_or_default())),
                // Parts of a node with no record (facts before any record): nothing read here.
                (None, None, _) => {}
            }
        }
    }
}

impl LeaseTouch {
    /// After the commit: publish what `store` now holds for every touched MAC and address.
    /// A binding that cannot be read stays retracted (it entitles nobody) and is logged.
    pub fn refresh(self, view: &StateView, store: &dyn Store) {
        let macs: Vec<Mac> = self.macs.iter().copied().collect();
        let ips: Vec<Ipv4Addr> = self.ips.iter().copied().collect();
        let crate::store::SettledLeases { leases, holders } = match store
            .settled_leases(&macs, &ips)
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot re-read leases after a commit; their bindings entitle nobody until the next commit");
                return;
            }
        };
        let mut inner = view.write();
        for (ip, mac) in holders {
            inner.by_ip.insert(ip, mac);
        }
        for l in leases {
            inner.by_ip.insert(l.ip, l.mac);
            inner.leases.insert(l.mac, l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> Mac {
        Mac([0xbc, 0x24, 0x11, 0, 0, n])
    }

    fn bound_lease(m: u8, ip: [u8; 4]) -> Lease {
        Lease {
            mac: mac(m),
            ip: ip.into(),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: 1_000,
            updated_at_unix: 0,
        }
    }

    fn put(l: &Lease) -> LeaseCommit {
        LeaseCommit {
            writes: vec![LeaseChange::Upsert(l.clone())],
            events: vec![],
        }
    }

    fn judge(view: &StateView, ip: [u8; 4], now: u64) -> bool {
        crate::entitlement::judge(
            view.bound(NetworkMode::Authoritative, &[mac(1)], now),
            Some(ip.into()),
        )
        .is_ok()
    }

    /// The consistency rule: when the binding moves, the old address is refused from the
    /// moment the commit begins, and the new one is entitled only once the store has it.
    #[test]
    fn a_moving_binding_refuses_the_old_address_before_the_commit_lands() {
        let dir = tempfile::tempdir().unwrap();
        let (store, w) = crate::store::open(dir.path()).unwrap().split();
        let view = StateView::new();
        let old = bound_lease(1, [10, 0, 0, 5]);
        let g = [put(&old)];
        let touch = view.begin_leases(&g);
        w.leases.commit_leases(&g, true).unwrap();
        touch.refresh(&view, &store);
        assert!(judge(&view, [10, 0, 0, 5], 10));

        // As the lease book decides a move: the old record removed, the new one written.
        let new = bound_lease(1, [10, 0, 0, 6]);
        let g = [LeaseCommit {
            writes: vec![
                LeaseChange::Remove([10, 0, 0, 5].into()),
                LeaseChange::Upsert(new.clone()),
            ],
            events: Vec::new(),
        }];
        let touch = view.begin_leases(&g);
        // Commit in flight: the store still has the old address, the view entitles nobody.
        assert!(
            !judge(&view, [10, 0, 0, 5], 10),
            "old address while in flight"
        );
        assert!(
            !judge(&view, [10, 0, 0, 6], 10),
            "new address before the commit"
        );
        w.leases.commit_leases(&g, true).unwrap();
        assert!(
            !judge(&view, [10, 0, 0, 5], 10),
            "old address after the commit"
        );
        touch.refresh(&view, &store);
        assert!(
            !judge(&view, [10, 0, 0, 5], 10),
            "old address once published"
        );
        assert!(judge(&view, [10, 0, 0, 6], 10));
        assert_eq!(view.mac_at([10, 0, 0, 6].into()), Some(mac(1)));
        assert_eq!(view.mac_at([10, 0, 0, 5].into()), None);
        // Expiry is judged at read time, as the store path does.
        assert!(!judge(&view, [10, 0, 0, 6], 1_000));
    }

    #[test]
    fn a_node_commit_in_flight_closes_its_window_until_published() {
        let view = StateView::new();
        assert!(view.window_open("n1"), "no record: window open");
        let mut rec = NodeRecord::unseen("n1", 0);
        rec.provisioning_window_open = true;
        let w = [NodeWrite {
            name: "n1".into(),
            record: Some(rec.clone()),
            parts: vec![],
        }];
        view.begin_nodes(&w);
        assert!(!view.window_open("n1"));
        view.end_nodes(&w, true);
        assert!(view.window_open("n1"));
        rec.provisioning_window_open = false;
        rec.phase = crate::store::NodePhase::Ready;
        let w = [NodeWrite {
            name: "n1".into(),
            record: Some(rec),
            parts: vec![],
        }];
        view.begin_nodes(&w);
        assert!(!view.window_open("n1"));
        assert!(!view.installed("n1"), "not yet published");
        view.end_nodes(&w, true);
        assert!(!view.window_open("n1"));
        assert!(view.installed("n1"));
        // A failed commit publishes nothing and ends the in-flight mark.
        let w = [NodeWrite {
            name: "n2".into(),
            record: Some(NodeRecord::unseen("n2", 0)),
            parts: vec![],
        }];
        view.begin_nodes(&w);
        view.end_nodes(&w, false);
        assert_eq!(view.node("n2"), (None, false));
    }

    #[test]
    fn proxy_bindings_are_retracted_before_they_move() {
        let view = StateView::new();
        let b = |ip: [u8; 4], at| ProxyBinding {
            mac: mac(1),
            ip: ip.into(),
            seen_at_unix: at,
        };
        view.publish_proxy(b([10, 0, 0, 5], 1));
        let got = |v: &StateView| v.bound(NetworkMode::Proxy, &[mac(1)], 10).map(|b| b.ip);
        assert_eq!(got(&view), Some([10, 0, 0, 5].into()));
        view.retract_proxy(mac(1));
        assert_eq!(got(&view), None);
        view.publish_proxy(b([10, 0, 0, 6], 2));
        assert_eq!(got(&view), Some([10, 0, 0, 6].into()));
    }
}
