//! The lease book ([`LeaseBook`]): every rule about the one lease record type ([`Lease`],
//! a persisted record, so it lives in the store) and the index of who holds what: which
//! address belongs to which MAC, right now.
//!
//! Pure in-memory state with the clock passed in. Every mutation returns the lease records it
//! changed ([`LeaseChange`]) so the store adapter can persist exactly those before the reply
//! that depends on them is sent; [`LeaseBook::restore`] rebuilds the book from persisted
//! records after a restart. The state store only persists these records and changes as they
//! are (it checks no lease rule of its own); its by-MAC lookup table is this book's index
//! written down, so readers outside the DHCP server find a MAC's lease without a scan.
//!
//! Rules the book enforces (and the property tests check):
//! - one record per address, and at most one live (offered/bound/released) record per MAC;
//! - a reserved address is only ever leased to a MAC that reserves it; a node with several
//!   boot NICs reserves one address for all of them, and the first NIC that holds it keeps it
//!   until its lease ends (the others fall back to the pool), so two NICs never share it;
//! - pool addresses that are also reserved are never handed out from the pool;
//! - a declined address is quarantined for everyone, its reserving MAC included, until the
//!   quarantine ends;
//! - an address held (offered or bound, not expired) by one MAC is never given to another.
//!
//! A REQUEST for the binding a client already holds, made within the first quarter of its
//! lease (a retransmission, or a client that asks again at once), reuses the binding as it
//! is: no change to persist, and the ACK carries the remaining lease time. This is Kea's lease
//! caching (`cache-threshold`, `AllocEngine::setLeaseReusable` in isc-projects/kea
//! `src/lib/dhcpsrv/alloc_engine.cc` at Kea-2.2.0: age below `threshold * valid-lifetime`,
//! remaining lifetime sent, no `updateLease4`), here always on with a threshold of 0.25 so
//! that retransmissions under overload cost no disk write. A binding whose last write is known
//! to have failed ([`LeaseBook::mark_not_durable`]) is never reused: it is written again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::split::{Split, bucket_of};
use crate::inventory::{Ipv4Net, Mac, Pool};
use crate::store::{Lease, LeaseChange, LeaseState};

/// Whole seconds since the epoch (records keep seconds; DHCP lease times are seconds).
pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why the book refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Nothing free in the pool (or no pool for this subnet).
    #[error(
        "no free address: the pool is exhausted or the subnet has no pool; widen `network.pool`"
    )]
    NoFreeAddress,
    /// The address is reserved for another machine in the inventory.
    #[error("{ip} is reserved for another machine")]
    ReservedForOther {
        /// The address.
        ip: Ipv4Addr,
    },
    /// The address is held by another MAC.
    #[error("{ip} is leased to {holder}")]
    InUse {
        /// The address.
        ip: Ipv4Addr,
        /// Who holds it.
        holder: Mac,
    },
    /// The address was declined and is quarantined.
    #[error("{ip} is quarantined after a DHCPDECLINE (address conflict on the network)")]
    Quarantined {
        /// The address.
        ip: Ipv4Addr,
    },
    /// The address is neither reserved for this MAC nor in a pool.
    #[error("{ip} is not managed by talboot (not reserved for this machine, not in a pool)")]
    NotManaged {
        /// The address.
        ip: Ipv4Addr,
    },
    /// The MAC asks for another address than its free reservation.
    #[error("{ip} requested but this machine's reserved address is {expected}")]
    WrongAddress {
        /// What was asked for.
        ip: Ipv4Addr,
        /// The reservation.
        expected: Ipv4Addr,
    },
    /// RELEASE/DECLINE for an address the MAC does not hold.
    #[error("{ip} is not held by this client")]
    NotHeld {
        /// The address.
        ip: Ipv4Addr,
    },
}

/// Static configuration of the book.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseBookConfig {
    /// Inventory reservations: boot MAC to address.
    pub(crate) reservations: BTreeMap<Mac, Ipv4Addr>,
    /// Inventory names by boot MAC, written into each record as its hostname.
    pub(crate) hostnames: BTreeMap<Mac, String>,
    /// Dynamic ranges, one per subnet that has one.
    pub(crate) pools: Vec<Pool>,
    /// How long an offered address is held for the client that was offered it.
    pub(crate) offer_hold: Duration,
    /// How long a declined address is kept out of use.
    pub(crate) quarantine: Duration,
}

impl fmt::Debug for LeaseBookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseBookConfig")
            .field("reservations", &self.reservations.len())
            .field("hostnames", &self.hostnames.len())
            .field("pools", &self.pools)
            .field("offer_hold", &self.offer_hold)
            .field("quarantine", &self.quarantine)
            .finish()
    }
}

/// Default time an offer is held: long enough for slow PXE ROMs to send their REQUEST.
pub(crate) const DEFAULT_OFFER_HOLD: Duration = Duration::from_secs(60);
/// Default quarantine after a DECLINE.
pub(crate) const DEFAULT_QUARANTINE: Duration = Duration::from_secs(600);

/// A binding younger than `lease / REUSE_DIVISOR` is reused as it is (Kea `cache-threshold`
/// 0.25; see the module docs).
const REUSE_DIVISOR: u32 = 4;

/// The addresses talboot hands out and who holds them.
#[derive(Debug, Clone)]
pub struct LeaseBook {
    reserved_by_mac: BTreeMap<Mac, Ipv4Addr>,
    hostnames: BTreeMap<Mac, String>,
    owners_by_ip: BTreeMap<Ipv4Addr, BTreeSet<Mac>>,
    pools: Vec<Pool>,
    offer_hold: Duration,
    quarantine: Duration,
    leases: BTreeMap<Ipv4Addr, Lease>,
    /// Each MAC's one non-quarantined record.
    by_mac: BTreeMap<Mac, Ipv4Addr>,
    /// Per pool (keyed by its range), an address at or below the first one without a record:
    /// every pool address before it has a record. Lets [`Self::offer`] find the first
    /// never-used address without probing every recorded one on each DISCOVER (which made an
    /// offer cost grow with the number of leases). Lowered whenever a record is dropped.
    unrecorded_from: BTreeMap<(Ipv4Addr, Ipv4Addr), u64>,
    /// Addresses whose latest change the store failed to write: never reused unwritten.
    not_durable: BTreeSet<Ipv4Addr>,
    /// On a shared store: this appliance's share of the buckets ([`super::split`]), which
    /// new addresses are preferably taken from ([`Self::set_share`]).
    share: Option<Split>,
}

/// How far past the first free address of the pool a new address is looked for in this
/// appliance's share before the first free one is taken anyway (a peer's share is used only
/// when its own is that far away, or exhausted).
const SHARE_SCAN: usize = 1024;

impl LeaseBook {
    /// An empty book.
    pub fn new(cfg: LeaseBookConfig) -> Self {
        let mut owners_by_ip: BTreeMap<Ipv4Addr, BTreeSet<Mac>> = BTreeMap::new();
        for (mac, ip) in &cfg.reservations {
            owners_by_ip.entry(*ip).or_default().insert(*mac);
        }
        Self {
            reserved_by_mac: cfg.reservations,
            hostnames: cfg.hostnames,
            owners_by_ip,
            pools: cfg.pools,
            offer_hold: cfg.offer_hold,
            quarantine: cfg.quarantine,
            leases: BTreeMap::new(),
            by_mac: BTreeMap::new(),
            unrecorded_from: BTreeMap::new(),
            not_durable: BTreeSet::new(),
            share: None,
        }
    }

    /// Prefer new addresses in `share` (`None`: any). Two appliances that split the clients
    /// but not the addresses both took the lowest free address for their own clients at
    /// once; one of the two commits then lost in etcd and its client was refused (measured
    /// in `tests/ha_netns.rs`: 5-7 % of DISCOVERs at 300/s). An address's bucket is the
    /// RFC 3074 hash of its four octets, dealt among the live appliances as the clients' are,
    /// so the shares are disjoint and follow the live set.
    pub(crate) fn set_share(&mut self, share: Option<Split>) {
        self.share = share;
    }

    /// Whether `ip` is in this appliance's share (every address is, without one).
    fn in_share(&self, ip: Ipv4Addr) -> bool {
        self.share
            .as_ref()
            .is_none_or(|s| s.owns(bucket_of(&ip.octets())))
    }

    /// The store could not write the latest change of `ip`: the next REQUEST for it writes
    /// the binding again instead of reusing it (the socket adapter calls this when a commit
    /// fails).
    pub(crate) fn mark_not_durable(&mut self, ip: Ipv4Addr) {
        if self.leases.contains_key(&ip) {
            self.not_durable.insert(ip);
        }
    }

    /// Time left on the record of `ip` at `now` (zero when lapsed or absent).
    pub(crate) fn remaining(&self, ip: Ipv4Addr, now: SystemTime) -> Duration {
        self.leases
            .get(&ip)
            .and_then(|l| l.expires().duration_since(now).ok())
            .unwrap_or_default()
    }

    /// Drop the record for `ip`, keeping the never-used hints below every unrecorded address.
    fn drop_record(&mut self, ip: Ipv4Addr) {
        self.leases.remove(&ip);
        self.not_durable.remove(&ip);
        let at = u64::from(u32::from(ip));
        for ((start, _), from) in self.unrecorded_from.iter_mut() {
            if *start <= ip && at < *from {
                *from = at;
            }
        }
    }

    /// The first address of `pool` without a record that `free` accepts, scanning from the
    /// pool's hint, which is moved up to the first unrecorded address seen.
    fn first_unrecorded(
        &mut self,
        pool: Pool,
        free: impl Fn(&Self, Ipv4Addr) -> bool,
    ) -> Option<Ipv4Addr> {
        let key = (pool.start, pool.end);
        let end = u64::from(u32::from(pool.end));
        let from = self
            .unrecorded_from
            .get(&key)
            .copied()
            .unwrap_or(u64::from(u32::from(pool.start)));
        let mut first_gap = None;
        let mut pick = None;
        let mut first_free = None;
        let mut past_free = 0;
        for at in from..=end {
            // `at <= end`, an address.
            let ip = Ipv4Addr::from(at as u32);
            if first_free.is_some() {
                past_free += 1;
                if past_free > SHARE_SCAN {
                    break;
                }
            }
            if self.leases.contains_key(&ip) {
                continue;
            }
            first_gap.get_or_insert(at);
            if free(self, ip) {
                if self.in_share(ip) {
                    pick = Some(ip);
                    break;
                }
                first_free.get_or_insert(ip);
            }
        }
        self.unrecorded_from
            .insert(key, first_gap.unwrap_or(end + 1));
        pick.or(first_free)
    }

    /// Rebuild a book from persisted records. Records that break the rules under the current
    /// configuration (address no longer managed or now reserved for someone else, a second
    /// record for the same MAC) are dropped, and their removals returned for the store.
    pub(crate) fn restore(
        cfg: LeaseBookConfig,
        records: impl IntoIterator<Item = Lease>,
    ) -> (Self, Vec<LeaseChange>) {
        let mut book = Self::new(cfg);
        let mut records: Vec<Lease> = records.into_iter().collect();
        // Newest first, so the MAC keeps its most recent record.
        records.sort_by(|a, b| {
            b.expires_at_unix
                .cmp(&a.expires_at_unix)
                .then(a.ip.cmp(&b.ip))
        });
        let mut changes = Vec::new();
        for lease in records {
            let valid = !book.leases.contains_key(&lease.ip)
                && book.managed_for(lease.ip, lease.mac)
                && (lease.state == LeaseState::Declined || !book.by_mac.contains_key(&lease.mac));
            if valid {
                if lease.state != LeaseState::Declined {
                    book.by_mac.insert(lease.mac, lease.ip);
                }
                book.leases.insert(lease.ip, lease);
            } else if !book.leases.contains_key(&lease.ip) {
                changes.push(LeaseChange::Remove(lease.ip));
            }
        }
        (book, changes)
    }

    /// Replace reservations and pools (inventory reload). Records that are no longer allowed
    /// are removed; the removals are returned.
    pub fn reconfigure(&mut self, cfg: LeaseBookConfig) -> Vec<LeaseChange> {
        let records: Vec<Lease> = self.leases.values().cloned().collect();
        let (mut book, mut changes) = Self::restore(cfg, records.clone());
        book.not_durable = std::mem::take(&mut self.not_durable);
        book.not_durable.retain(|ip| book.leases.contains_key(ip));
        book.share = self.share.take();
        for old in records {
            if !book.leases.contains_key(&old.ip) && !changes.contains(&LeaseChange::Remove(old.ip))
            {
                changes.push(LeaseChange::Remove(old.ip));
            }
        }
        *self = book;
        changes
    }

    /// Another appliance sharing the store changed the record of `ip` to `record` (`None`:
    /// removed), as the lease feed or a conflicting commit reports it: the store's word
    /// replaces this book's, so no address a peer holds is offered here. A peer's record
    /// for a MAC this book has elsewhere is the newer one (the store's MAC index names it):
    /// the book's other record of that MAC is dropped. A record the configuration does not
    /// allow here (appliances of one fleet share the inventory, so only a mismatch does
    /// this) is not kept, as [`Self::restore`] would not keep it.
    pub(crate) fn learn(&mut self, ip: Ipv4Addr, record: Option<Lease>) {
        if let Some(old) = self.leases.get(&ip)
            && self.by_mac.get(&old.mac) == Some(&ip)
        {
            self.by_mac.remove(&old.mac);
        }
        self.drop_record(ip);
        let Some(lease) = record else { return };
        if lease.ip != ip || !self.managed_for(ip, lease.mac) {
            return;
        }
        if lease.state != LeaseState::Declined
            && let Some(prev) = self.by_mac.insert(lease.mac, ip)
            && prev != ip
        {
            self.drop_record(prev);
        }
        self.leases.insert(ip, lease);
    }

    /// The record for `ip`.
    pub fn get(&self, ip: Ipv4Addr) -> Option<&Lease> {
        self.leases.get(&ip)
    }

    /// The live (non-quarantined) record of `mac`.
    pub fn lease_of(&self, mac: Mac) -> Option<&Lease> {
        self.by_mac.get(&mac).and_then(|ip| self.leases.get(ip))
    }

    /// Who holds `ip` at `now` (offered or bound, not expired).
    pub fn holder(&self, ip: Ipv4Addr, now: SystemTime) -> Option<Mac> {
        self.leases
            .get(&ip)
            .filter(|l| l.is_held(now))
            .map(|l| l.mac)
    }

    /// Every record, by address.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// The address reserved for `mac`, if any.
    pub fn reservation(&self, mac: Mac) -> Option<Ipv4Addr> {
        self.reserved_by_mac.get(&mac).copied()
    }

    /// True when `ip` is reserved for some machine.
    pub(crate) fn is_reserved(&self, ip: Ipv4Addr) -> bool {
        self.owners_by_ip.contains_key(&ip)
    }

    fn in_pool(&self, ip: Ipv4Addr) -> bool {
        self.pools.iter().any(|p| p.contains(ip))
    }

    /// `ip` may be leased to `mac` at all: its reservation, or an unreserved pool address.
    fn managed_for(&self, ip: Ipv4Addr, mac: Mac) -> bool {
        match self.owners_by_ip.get(&ip) {
            Some(owners) => owners.contains(&mac),
            None => self.in_pool(ip),
        }
    }

    /// Why `mac` cannot take `ip` at `now`, if it cannot.
    fn blocked(&self, ip: Ipv4Addr, mac: Mac, now: SystemTime) -> Option<LeaseError> {
        if let Some(owners) = self.owners_by_ip.get(&ip)
            && !owners.contains(&mac)
        {
            return Some(LeaseError::ReservedForOther { ip });
        }
        if !self.managed_for(ip, mac) {
            return Some(LeaseError::NotManaged { ip });
        }
        match self.leases.get(&ip) {
            Some(l) if l.is_quarantined(now) => Some(LeaseError::Quarantined { ip }),
            Some(l) if l.is_held(now) && l.mac != mac => {
                Some(LeaseError::InUse { ip, holder: l.mac })
            }
            _ => None,
        }
    }

    /// The reservation of `mac` if it is free for it at `now`.
    fn usable_reservation(&self, mac: Mac, now: SystemTime) -> Option<Ipv4Addr> {
        let ip = self.reservation(mac)?;
        self.blocked(ip, mac, now).is_none().then_some(ip)
    }

    /// Record `mac` on `ip`, dropping its previous record and displacing a stale record of
    /// another MAC. Callers have checked [`Self::blocked`].
    fn take(
        &mut self,
        ip: Ipv4Addr,
        mac: Mac,
        state: LeaseState,
        expires: SystemTime,
        now: SystemTime,
    ) -> Vec<LeaseChange> {
        let mut changes = Vec::new();
        if let Some(old_ip) = self.by_mac.get(&mac).copied()
            && old_ip != ip
        {
            self.drop_record(old_ip);
            changes.push(LeaseChange::Remove(old_ip));
        }
        if let Some(prev) = self.leases.get(&ip)
            && prev.mac != mac
            && self.by_mac.get(&prev.mac) == Some(&ip)
        {
            self.by_mac.remove(&prev.mac);
        }
        let lease = Lease {
            mac,
            ip,
            hostname: self.hostnames.get(&mac).cloned(),
            state,
            expires_at_unix: unix(expires),
            updated_at_unix: unix(now),
        };
        self.not_durable.remove(&ip);
        self.leases.insert(ip, lease.clone());
        self.by_mac.insert(mac, ip);
        changes.push(LeaseChange::Upsert(lease));
        changes
    }

    /// Choose and hold an address for `mac` in subnet `net` (whose dynamic range is `pool`),
    /// preferring its reservation, then its previous address, then `requested`, then the
    /// first never-used pool address, then the longest-unused one.
    pub fn offer(
        &mut self,
        mac: Mac,
        net: Ipv4Net,
        pool: Option<Pool>,
        requested: Option<Ipv4Addr>,
        now: SystemTime,
    ) -> Result<(Ipv4Addr, Vec<LeaseChange>), LeaseError> {
        let expires = now + self.offer_hold;
        if let Some(ip) = self
            .usable_reservation(mac, now)
            .filter(|ip| net.contains(ip))
        {
            return Ok((ip, self.take(ip, mac, LeaseState::Offered, expires, now)));
        }
        let pool = pool.ok_or(LeaseError::NoFreeAddress)?;
        // Pool addresses only: a reserved address (even this MAC's own, which is unusable if we
        // got here) is never handed out from the pool.
        let free = |book: &Self, ip: Ipv4Addr| {
            pool.contains(ip) && !book.is_reserved(ip) && book.blocked(ip, mac, now).is_none()
        };
        let previous = self.by_mac.get(&mac).copied();
        let pick = previous
            .filter(|ip| free(self, *ip))
            .or_else(|| requested.filter(|ip| free(self, *ip)))
            .or_else(|| self.first_unrecorded(pool, free))
            .or_else(|| {
                pool_addrs(pool)
                    .filter(|ip| free(self, *ip))
                    .min_by_key(|ip| self.leases.get(ip).map(|l| l.expires_at_unix))
            });
        let ip = pick.ok_or(LeaseError::NoFreeAddress)?;
        Ok((ip, self.take(ip, mac, LeaseState::Offered, expires, now)))
    }

    /// Bind `ip` to `mac` for `lease_time` (DHCPREQUEST accepted). A binding `mac` already
    /// holds on `ip` that is younger than a quarter of `lease_time` is reused unchanged (no
    /// changes returned; [`Self::remaining`] is what the ACK promises).
    pub fn bind(
        &mut self,
        mac: Mac,
        ip: Ipv4Addr,
        lease_time: Duration,
        now: SystemTime,
    ) -> Result<Vec<LeaseChange>, LeaseError> {
        if let Some(e) = self.blocked(ip, mac, now) {
            return Err(e);
        }
        // A machine whose reservation is free must use it (a NAK sends it back to DISCOVER).
        if let Some(expected) = self.usable_reservation(mac, now)
            && expected != ip
        {
            return Err(LeaseError::WrongAddress { ip, expected });
        }
        if self.reusable(ip, mac, lease_time, now) {
            return Ok(Vec::new());
        }
        Ok(self.take(ip, mac, LeaseState::Bound, now + lease_time, now))
    }

    /// `mac`'s binding on `ip` may answer a REQUEST as it is: bound, written, not lapsed, and
    /// less than a quarter of `lease_time` old (never longer than `lease_time` either, so a
    /// shortened lease time is written at once).
    fn reusable(&self, ip: Ipv4Addr, mac: Mac, lease_time: Duration, now: SystemTime) -> bool {
        let Some(l) = self.leases.get(&ip) else {
            return false;
        };
        if l.mac != mac || l.state != LeaseState::Bound || self.not_durable.contains(&ip) {
            return false;
        }
        let Ok(left) = l.expires().duration_since(now) else {
            return false;
        };
        left <= lease_time && left > lease_time - lease_time / REUSE_DIVISOR
    }

    /// DHCPRELEASE: `mac` gives `ip` back.
    pub fn release(
        &mut self,
        mac: Mac,
        ip: Ipv4Addr,
        now: SystemTime,
    ) -> Result<Vec<LeaseChange>, LeaseError> {
        match self.leases.get_mut(&ip) {
            Some(l) if l.mac == mac && l.is_held(now) => {
                l.state = LeaseState::Released;
                l.expires_at_unix = unix(now);
                l.updated_at_unix = unix(now);
                Ok(vec![LeaseChange::Upsert(l.clone())])
            }
            _ => Err(LeaseError::NotHeld { ip }),
        }
    }

    /// DHCPDECLINE: `mac` found `ip` in use on the wire. Only the holder may decline, so a
    /// hostile client cannot quarantine addresses it was never given.
    pub(crate) fn decline(
        &mut self,
        mac: Mac,
        ip: Ipv4Addr,
        now: SystemTime,
    ) -> Result<Vec<LeaseChange>, LeaseError> {
        let until = now + self.quarantine;
        match self.leases.get_mut(&ip) {
            Some(l) if l.mac == mac && l.is_held(now) => {
                l.state = LeaseState::Declined;
                l.expires_at_unix = unix(until);
                l.updated_at_unix = unix(now);
                let lease = l.clone();
                self.by_mac.remove(&mac);
                Ok(vec![LeaseChange::Upsert(lease)])
            }
            _ => Err(LeaseError::NotHeld { ip }),
        }
    }

    /// The client chose another server: forget our outstanding offer to it (RFC 2131 §4.3.2).
    pub(crate) fn cancel_offer(&mut self, mac: Mac) -> Vec<LeaseChange> {
        match self.by_mac.get(&mac).copied() {
            Some(ip)
                if self
                    .leases
                    .get(&ip)
                    .is_some_and(|l| l.state == LeaseState::Offered) =>
            {
                self.drop_record(ip);
                self.by_mac.remove(&mac);
                vec![LeaseChange::Remove(ip)]
            }
            _ => Vec::new(),
        }
    }

    /// Housekeeping: drop lapsed offers and quarantines, mark lapsed bindings released.
    /// Correctness never depends on calling this (every check looks at `now`); it keeps the
    /// book and the store small and the states honest.
    pub(crate) fn expire(&mut self, now: SystemTime) -> Vec<LeaseChange> {
        let mut changes = Vec::new();
        let lapsed: Vec<Ipv4Addr> = self
            .leases
            .values()
            .filter(|l| l.state != LeaseState::Released && l.expires() <= now)
            .map(|l| l.ip)
            .collect();
        for ip in lapsed {
            let Some(l) = self.leases.get_mut(&ip) else {
                continue;
            };
            match l.state {
                LeaseState::Bound => {
                    l.state = LeaseState::Released;
                    l.updated_at_unix = unix(now);
                    changes.push(LeaseChange::Upsert(l.clone()));
                }
                LeaseState::Offered => {
                    let mac = l.mac;
                    self.drop_record(ip);
                    self.by_mac.remove(&mac);
                    changes.push(LeaseChange::Remove(ip));
                }
                LeaseState::Declined => {
                    self.drop_record(ip);
                    changes.push(LeaseChange::Remove(ip));
                }
                LeaseState::Released => {}
            }
        }
        changes
    }

    /// Check the book's structural invariants; `Err` names the first broken one. Used by the
    /// property tests and the fuzz target.
    pub fn check_invariants(&self) -> Result<(), BrokenInvariant> {
        for (ip, l) in &self.leases {
            if *ip != l.ip {
                return Err(BrokenInvariant::MisKeyed { key: *ip, ip: l.ip });
            }
            if !self.managed_for(l.ip, l.mac) {
                return Err(BrokenInvariant::NotManaged {
                    ip: l.ip,
                    mac: l.mac,
                });
            }
            let indexed = self.by_mac.get(&l.mac) == Some(ip);
            if l.state == LeaseState::Declined && indexed {
                return Err(BrokenInvariant::QuarantinedIndexed {
                    ip: *ip,
                    mac: l.mac,
                });
            }
            if l.state != LeaseState::Declined && !indexed {
                return Err(BrokenInvariant::NotIndexed {
                    ip: *ip,
                    mac: l.mac,
                });
            }
        }
        for ((start, _), from) in &self.unrecorded_from {
            let first = u64::from(u32::from(*start));
            if let Some(gap) =
                (first..*from).find(|&a| !self.leases.contains_key(&Ipv4Addr::from(a as u32)))
            {
                return Err(BrokenInvariant::HintSkips {
                    hint: *from,
                    pool: *start,
                    skipped: Ipv4Addr::from(gap as u32),
                });
            }
        }
        for (mac, ip) in &self.by_mac {
            match self.leases.get(ip) {
                Some(l) if l.mac == *mac => {}
                _ => {
                    return Err(BrokenInvariant::IndexDisagrees { mac: *mac, ip: *ip });
                }
            }
        }
        Ok(())
    }
}

/// A structural invariant of the [`LeaseBook`] that does not hold (a bug, never an
/// operator's error): what [`LeaseBook::check_invariants`] found first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokenInvariant {
    /// A record is stored under another address than its own.
    #[error("record keyed {key} is for {ip}")]
    MisKeyed {
        /// The key it is stored under.
        key: Ipv4Addr,
        /// The record's address.
        ip: Ipv4Addr,
    },
    /// A record gives an address to a MAC that may not have it.
    #[error("{ip} recorded for {mac} which may not have it")]
    NotManaged {
        /// The address.
        ip: Ipv4Addr,
        /// The MAC.
        mac: Mac,
    },
    /// A quarantined (declined) address is indexed as a MAC's lease.
    #[error("quarantined {ip} indexed as {mac}'s lease")]
    QuarantinedIndexed {
        /// The address.
        ip: Ipv4Addr,
        /// The MAC.
        mac: Mac,
    },
    /// A live record is not its MAC's indexed lease.
    #[error("{mac}'s record {ip} is not its indexed lease")]
    NotIndexed {
        /// The address.
        ip: Ipv4Addr,
        /// The MAC.
        mac: Mac,
    },
    /// A pool's never-used hint skips an address that has no record.
    #[error("never-used hint {hint} of the pool at {pool} skips unrecorded {skipped}")]
    HintSkips {
        /// The hint (an address as a number).
        hint: u64,
        /// The pool's first address.
        pool: Ipv4Addr,
        /// The skipped address.
        skipped: Ipv4Addr,
    },
    /// The MAC index names a record of another MAC (or none).
    #[error("index says {mac} has {ip} but the record disagrees")]
    IndexDisagrees {
        /// The MAC.
        mac: Mac,
        /// The address the index names.
        ip: Ipv4Addr,
    },
}

/// Every address of a pool, in order.
fn pool_addrs(pool: Pool) -> impl Iterator<Item = Ipv4Addr> {
    (u32::from(pool.start)..=u32::from(pool.end)).map(Ipv4Addr::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }
    fn mac(n: u8) -> Mac {
        Mac([0xbc, 0x24, 0x11, 0, 0, n])
    }
    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }
    fn net() -> Ipv4Net {
        "10.0.0.0/24".parse().unwrap()
    }
    fn pool() -> Pool {
        Pool {
            start: ip(10),
            end: ip(13),
        }
    }
    const LEASE: Duration = Duration::from_secs(3600);

    /// mac(0) reserves .12 (inside the pool); mac(1) and mac(2) are two NICs of one node that
    /// reserves .50 (outside the pool).
    fn cfg() -> LeaseBookConfig {
        LeaseBookConfig {
            reservations: [(mac(0), ip(12)), (mac(1), ip(50)), (mac(2), ip(50))]
                .into_iter()
                .collect(),
            hostnames: [(mac(1), "cp-1".to_string())].into_iter().collect(),
            pools: vec![pool()],
            offer_hold: Duration::from_secs(60),
            quarantine: Duration::from_secs(600),
        }
    }

    #[test]
    fn new_addresses_come_from_the_share_first_then_from_anywhere() {
        let wide = Pool {
            start: Ipv4Addr::new(10, 0, 0, 10),
            end: Ipv4Addr::new(10, 0, 0, 200),
        };
        let (a, b) = ("a".to_string(), "b".to_string());
        let live = [a.clone(), b.clone()];
        let mut book_a = LeaseBook::new(LeaseBookConfig {
            pools: vec![wide],
            ..cfg()
        });
        book_a.set_share(Some(Split::new(&a, &live)));
        let mut book_b = LeaseBook::new(LeaseBookConfig {
            pools: vec![wide],
            ..cfg()
        });
        book_b.set_share(Some(Split::new(&b, &live)));
        let share_b = Split::new(&b, &live);
        let mut got_a = BTreeSet::new();
        let mut got_b = BTreeSet::new();
        for n in 100..120 {
            let (x, _) = book_a.offer(mac(n), net(), Some(wide), None, t(0)).unwrap();
            let (y, _) = book_b
                .offer(mac(n + 50), net(), Some(wide), None, t(0))
                .unwrap();
            assert!(!share_b.owns(bucket_of(&x.octets())), "a took {x}, b's");
            assert!(share_b.owns(bucket_of(&y.octets())), "b took {y}, a's");
            got_a.insert(x);
            got_b.insert(y);
            book_a.check_invariants().unwrap();
        }
        // Two books deciding at once never picked the same new address.
        assert!(got_a.is_disjoint(&got_b), "{got_a:?} {got_b:?}");
        // The share is a preference: with only the other's addresses left, they are used.
        let mut tiny = LeaseBook::new(cfg());
        let only_b: Vec<Ipv4Addr> = (10..=13)
            .map(ip)
            .filter(|i| share_b.owns(bucket_of(&i.octets())) && *i != ip(12))
            .collect();
        // (.12 is reserved; of .10, .11 and .13 the hash deals b at least one.)
        assert!(!only_b.is_empty());
        tiny.set_share(Some(Split::new(&a, &live)));
        let mut taken = BTreeSet::new();
        for n in 30..34 {
            if let Ok((x, _)) = tiny.offer(mac(n), net(), Some(pool()), None, t(0)) {
                taken.insert(x);
            }
        }
        assert!(
            only_b.iter().all(|i| taken.contains(i)),
            "{taken:?} lacks some of {only_b:?}"
        );
    }

    #[test]
    fn reservation_is_offered_and_bound() {
        let mut b = LeaseBook::new(cfg());
        let (got, ch) = b.offer(mac(1), net(), Some(pool()), None, t(0)).unwrap();
        assert_eq!(got, ip(50));
        assert!(matches!(&ch[..], [LeaseChange::Upsert(l)] if l.state == LeaseState::Offered));
        let ch = b.bind(mac(1), ip(50), LEASE, t(1)).unwrap();
        assert!(
            matches!(&ch[..], [LeaseChange::Upsert(l)] if l.state == LeaseState::Bound && l.expires() == t(3601))
        );
        assert_eq!(b.holder(ip(50), t(2)), Some(mac(1)));
        // The record is complete as the store keeps it: inventory name, time of the change.
        let l = b.lease_of(mac(1)).unwrap();
        assert_eq!(
            (l.hostname.as_deref(), l.updated_at_unix),
            (Some("cp-1"), unix(t(1)))
        );
        b.check_invariants().unwrap();
    }

    #[test]
    fn a_young_binding_is_reused_unwritten_unless_its_write_failed() {
        let mut b = LeaseBook::new(cfg());
        b.bind(mac(1), ip(50), LEASE, t(0)).unwrap();
        // A retransmission, and a REQUEST up to a quarter of the lease later: nothing to write,
        // and the ACK promises what is left.
        assert_eq!(b.bind(mac(1), ip(50), LEASE, t(0)), Ok(vec![]));
        assert_eq!(b.bind(mac(1), ip(50), LEASE, t(899)), Ok(vec![]));
        assert_eq!(b.remaining(ip(50), t(899)), Duration::from_secs(2701));
        // Older than a quarter (a renewal at T1, say): written with a fresh expiry.
        let ch = b.bind(mac(1), ip(50), LEASE, t(900)).unwrap();
        assert!(matches!(&ch[..], [LeaseChange::Upsert(l)] if l.expires() == t(4500)));
        // A shorter lease time than the one left is written at once.
        assert_eq!(
            b.bind(mac(1), ip(50), Duration::from_secs(60), t(901))
                .unwrap()
                .len(),
            1
        );
        // The store could not write it: the next REQUEST writes it again, then reuse resumes.
        b.mark_not_durable(ip(50));
        assert_eq!(b.bind(mac(1), ip(50), LEASE, t(902)).unwrap().len(), 1);
        assert_eq!(b.bind(mac(1), ip(50), LEASE, t(902)), Ok(vec![]));
        b.check_invariants().unwrap();
    }

    #[test]
    fn second_nic_of_a_node_falls_back_to_the_pool_while_the_first_holds_the_reservation() {
        let mut b = LeaseBook::new(cfg());
        b.offer(mac(1), net(), Some(pool()), None, t(0)).unwrap();
        b.bind(mac(1), ip(50), LEASE, t(0)).unwrap();
        let (got, _) = b.offer(mac(2), net(), Some(pool()), None, t(1)).unwrap();
        assert_eq!(got, ip(10));
        assert_eq!(
            b.bind(mac(2), ip(50), LEASE, t(1)),
            Err(LeaseError::InUse {
                ip: ip(50),
                holder: mac(1)
            })
        );
        // Once the first NIC's lease lapses, the second one is pointed at the reservation.
        assert_eq!(
            b.bind(mac(2), ip(10), LEASE, t(3700)),
            Err(LeaseError::WrongAddress {
                ip: ip(10),
                expected: ip(50)
            })
        );
        b.bind(mac(2), ip(50), LEASE, t(3700)).unwrap();
        b.check_invariants().unwrap();
    }

    #[test]
    fn reserved_pool_address_is_never_given_to_others() {
        let mut b = LeaseBook::new(cfg());
        let mut seen = BTreeSet::new();
        for n in 10..13 {
            let (got, _) = b.offer(mac(n), net(), Some(pool()), None, t(0)).unwrap();
            seen.insert(got);
        }
        assert_eq!(seen, [ip(10), ip(11), ip(13)].into_iter().collect());
        assert_eq!(
            b.offer(mac(20), net(), Some(pool()), None, t(0)),
            Err(LeaseError::NoFreeAddress)
        );
        assert_eq!(
            b.bind(mac(20), ip(12), LEASE, t(0)),
            Err(LeaseError::ReservedForOther { ip: ip(12) })
        );
        assert_eq!(
            b.bind(mac(20), ip(99), LEASE, t(0)),
            Err(LeaseError::NotManaged { ip: ip(99) })
        );
    }

    #[test]
    fn same_mac_gets_its_address_back_and_requested_address_is_honoured() {
        let mut b = LeaseBook::new(cfg());
        let (a, _) = b
            .offer(mac(7), net(), Some(pool()), Some(ip(13)), t(0))
            .unwrap();
        assert_eq!(a, ip(13));
        b.bind(mac(7), a, LEASE, t(0)).unwrap();
        b.release(mac(7), a, t(10)).unwrap();
        let (again, _) = b.offer(mac(7), net(), Some(pool()), None, t(20)).unwrap();
        assert_eq!(again, a);
    }

    #[test]
    fn decline_quarantines_for_everyone_until_it_ends() {
        let mut b = LeaseBook::new(cfg());
        let (a, _) = b.offer(mac(7), net(), Some(pool()), None, t(0)).unwrap();
        b.bind(mac(7), a, LEASE, t(0)).unwrap();
        assert_eq!(
            b.decline(mac(8), a, t(1)),
            Err(LeaseError::NotHeld { ip: a })
        );
        let ch = b.decline(mac(7), a, t(1)).unwrap();
        assert!(matches!(&ch[..], [LeaseChange::Upsert(l)] if l.state == LeaseState::Declined));
        let (next, _) = b.offer(mac(7), net(), Some(pool()), None, t(2)).unwrap();
        assert_ne!(next, a);
        assert_eq!(
            b.bind(mac(9), a, LEASE, t(2)),
            Err(LeaseError::Quarantined { ip: a })
        );
        // After the quarantine the address is usable again.
        b.bind(mac(9), a, LEASE, t(700)).unwrap();
        b.check_invariants().unwrap();
    }

    #[test]
    fn cancel_offer_frees_the_address_and_expire_cleans_up() {
        let mut b = LeaseBook::new(cfg());
        let (a, _) = b.offer(mac(7), net(), Some(pool()), None, t(0)).unwrap();
        assert_eq!(b.cancel_offer(mac(7)), vec![LeaseChange::Remove(a)]);
        assert!(b.get(a).is_none());

        let (a, _) = b.offer(mac(7), net(), Some(pool()), None, t(0)).unwrap();
        let (c, _) = b.offer(mac(8), net(), Some(pool()), None, t(0)).unwrap();
        b.bind(mac(8), c, LEASE, t(0)).unwrap();
        let ch = b.expire(t(4000));
        assert!(ch.contains(&LeaseChange::Remove(a)));
        assert!(
            ch.iter()
                .any(|c| matches!(c, LeaseChange::Upsert(l) if l.state == LeaseState::Released))
        );
        b.check_invariants().unwrap();
    }

    #[test]
    fn restore_drops_records_that_break_the_rules() {
        let good = Lease {
            ip: ip(50),
            mac: mac(1),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: unix(t(100)),
            updated_at_unix: 0,
        };
        let stolen = Lease {
            ip: ip(12),
            mac: mac(9),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: unix(t(100)),
            updated_at_unix: 0,
        };
        let older_dup = Lease {
            ip: ip(10),
            mac: mac(1),
            hostname: None,
            state: LeaseState::Released,
            expires_at_unix: unix(t(50)),
            updated_at_unix: 0,
        };
        let (b, ch) = LeaseBook::restore(cfg(), [good.clone(), stolen, older_dup]);
        assert_eq!(b.lease_of(mac(1)), Some(&good));
        assert!(ch.contains(&LeaseChange::Remove(ip(12))));
        assert!(ch.contains(&LeaseChange::Remove(ip(10))));
        b.check_invariants().unwrap();
    }

    #[test]
    fn reconfigure_revokes_a_lease_on_a_newly_reserved_address() {
        let mut b = LeaseBook::new(cfg());
        let (a, _) = b.offer(mac(7), net(), Some(pool()), None, t(0)).unwrap();
        b.bind(mac(7), a, LEASE, t(0)).unwrap();
        let mut c = cfg();
        c.reservations.insert(mac(3), a);
        let ch = b.reconfigure(c);
        assert_eq!(ch, vec![LeaseChange::Remove(a)]);
        assert!(b.lease_of(mac(7)).is_none());
        b.check_invariants().unwrap();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Offer {
            mac: u8,
            requested: Option<u8>,
        },
        Bind {
            mac: u8,
            ip: u8,
        },
        Release {
            mac: u8,
            ip: u8,
        },
        Decline {
            mac: u8,
            ip: u8,
        },
        Cancel {
            mac: u8,
        },
        Expire,
        Advance {
            secs: u64,
        },
        /// A peer's record (state index, expiry in seconds from now) or its removal.
        Learn {
            mac: u8,
            ip: u8,
            state: Option<u8>,
            secs: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        // Addresses .9-.14 and .50-.51 cover outside-pool, pool, reserved-in-pool and
        // reserved-outside-pool; MACs 0-6 include the three reserving ones.
        let addr = prop_oneof![9u8..=14, 50u8..=51];
        prop_oneof![
            (0u8..7, proptest::option::of(addr.clone()))
                .prop_map(|(mac, requested)| Op::Offer { mac, requested }),
            (0u8..7, addr.clone()).prop_map(|(mac, ip)| Op::Bind { mac, ip }),
            (0u8..7, addr.clone()).prop_map(|(mac, ip)| Op::Release { mac, ip }),
            (0u8..7, addr).prop_map(|(mac, ip)| Op::Decline { mac, ip }),
            (0u8..7).prop_map(|mac| Op::Cancel { mac }),
            Just(Op::Expire),
            (0u64..4000).prop_map(|secs| Op::Advance { secs }),
            (
                0u8..7,
                prop_oneof![9u8..=14, 50u8..=51],
                proptest::option::of(0u8..4),
                0u64..200
            )
                .prop_map(|(mac, ip, state, secs)| Op::Learn {
                    mac,
                    ip,
                    state,
                    secs
                }),
        ]
    }

    /// The address the book just gave `m` was allowed under the state before the operation.
    fn assert_grant_allowed(before: &LeaseBook, m: Mac, a: Ipv4Addr, now: SystemTime) {
        if let Some(owners) = before.owners_by_ip.get(&a) {
            assert!(owners.contains(&m), "reserved {a} given to {m}");
        }
        if let Some(l) = before.get(a) {
            assert!(!l.is_quarantined(now), "quarantined {a} given to {m}");
            assert!(
                !(l.is_held(now) && l.mac != m),
                "{a} held by {} given to {m}",
                l.mac
            );
        }
    }

    /// The address [`LeaseBook::offer`] must pick, found the slow way (probing every pool
    /// address from the start), to check that the never-used hints change no choice.
    fn offer_by_full_scan(
        b: &LeaseBook,
        m: Mac,
        requested: Option<Ipv4Addr>,
        now: SystemTime,
    ) -> Option<Ipv4Addr> {
        if let Some(a) = b.usable_reservation(m, now).filter(|a| net().contains(a)) {
            return Some(a);
        }
        let p = pool();
        let free =
            |a: &Ipv4Addr| p.contains(*a) && !b.is_reserved(*a) && b.blocked(*a, m, now).is_none();
        b.by_mac
            .get(&m)
            .copied()
            .filter(free)
            .or_else(|| requested.filter(free))
            .or_else(|| pool_addrs(p).find(|a| !b.leases.contains_key(a) && free(a)))
            .or_else(|| {
                pool_addrs(p)
                    .filter(free)
                    .min_by_key(|a| b.leases.get(a).map(|l| l.expires_at_unix))
            })
    }

    #[test]
    fn an_address_freed_below_the_never_used_ones_is_offered_first() {
        let mut b = LeaseBook::new(cfg());
        for n in 3..6 {
            b.offer(mac(n), net(), Some(pool()), None, t(0)).unwrap();
        }
        // .10, .11 and .13 (.12 is reserved) are taken; free .10 two ways.
        b.cancel_offer(mac(3));
        let (got, _) = b.offer(mac(6), net(), Some(pool()), None, t(1)).unwrap();
        assert_eq!(got, ip(10));
        b.check_invariants().unwrap();
        // Offers lapse after 60 s and the sweep drops them; the lowest comes back first.
        b.expire(t(120));
        let (got, _) = b.offer(mac(7), net(), Some(pool()), None, t(121)).unwrap();
        assert_eq!(got, ip(10));
        b.check_invariants().unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn lease_book_invariants_hold_over_random_operations(ops in proptest::collection::vec(op(), 1..80)) {
            let mut b = LeaseBook::new(cfg());
            let mut now = t(0);
            for op in ops {
                let before = b.clone();
                match op {
                    Op::Offer { mac: m, requested } => {
                        let got = b.offer(mac(m), net(), Some(pool()), requested.map(ip), now);
                        prop_assert_eq!(
                            got.as_ref().ok().map(|(a, _)| *a),
                            offer_by_full_scan(&before, mac(m), requested.map(ip), now)
                        );
                        if let Ok((a, _)) = got {
                            assert_grant_allowed(&before, mac(m), a, now);
                            prop_assert_eq!(b.holder(a, now), Some(mac(m)));
                        }
                    }
                    Op::Bind { mac: m, ip: i } => {
                        if b.bind(mac(m), ip(i), LEASE, now).is_ok() {
                            assert_grant_allowed(&before, mac(m), ip(i), now);
                            prop_assert_eq!(b.holder(ip(i), now), Some(mac(m)));
                        }
                    }
                    Op::Release { mac: m, ip: i } => {
                        if b.release(mac(m), ip(i), now).is_ok() {
                            prop_assert_eq!(before.holder(ip(i), now), Some(mac(m)));
                            prop_assert_eq!(b.holder(ip(i), now), None);
                        }
                    }
                    Op::Decline { mac: m, ip: i } => {
                        if b.decline(mac(m), ip(i), now).is_ok() {
                            prop_assert_eq!(before.holder(ip(i), now), Some(mac(m)));
                            prop_assert!(b.get(ip(i)).unwrap().is_quarantined(now));
                        }
                    }
                    Op::Cancel { mac: m } => { b.cancel_offer(mac(m)); }
                    Op::Expire => { b.expire(now); }
                    Op::Advance { secs } => now += Duration::from_secs(secs),
                    Op::Learn { mac: m, ip: i, state, secs } => {
                        let record = state.map(|s| Lease {
                            ip: ip(i),
                            mac: mac(m),
                            hostname: None,
                            state: [LeaseState::Offered, LeaseState::Bound, LeaseState::Released, LeaseState::Declined][usize::from(s)],
                            expires_at_unix: unix(now + Duration::from_secs(secs)),
                            updated_at_unix: 0,
                        });
                        let kept = record.clone().filter(|l| b.managed_for(l.ip, l.mac));
                        b.learn(ip(i), record);
                        // The book now says what the peer wrote (when it may hold it at all).
                        prop_assert_eq!(b.get(ip(i)), kept.as_ref());
                    }
                }
                if let Err(e) = b.check_invariants() {
                    prop_assert!(false, "{}", e);
                }
                // No MAC holds two addresses; no address is held by a MAC it is reserved against.
                let mut holders = BTreeSet::new();
                for l in b.iter().filter(|l| l.is_held(now)) {
                    prop_assert!(holders.insert(l.mac), "{} holds two addresses", l.mac);
                    if let Some(owners) = b.owners_by_ip.get(&l.ip) {
                        prop_assert!(owners.contains(&l.mac));
                    }
                }
            }
        }

        #[test]
        fn restore_of_any_records_yields_a_consistent_book(
            recs in proptest::collection::vec((0u8..7, prop_oneof![9u8..=14, 50u8..=51], 0u8..4, 0u64..500), 0..20)
        ) {
            let records = recs.into_iter().map(|(m, i, s, e)| Lease {
                ip: ip(i),
                mac: mac(m),
                hostname: None,
                state: [LeaseState::Offered, LeaseState::Bound, LeaseState::Released, LeaseState::Declined][usize::from(s)],
                expires_at_unix: unix(t(e)),
                updated_at_unix: 0,
            });
            let (b, _) = LeaseBook::restore(cfg(), records);
            if let Err(e) = b.check_invariants() {
                prop_assert!(false, "{}", e);
            }
        }
    }
}
