//! DHCPv4 for network boot: the pure core (no sockets here).
//!
//! The socket adapter queues datagrams in `queue` (bounded, oldest dropped first). A datagram
//! flows `wire::parse` (checked decode, malformed input dropped with a reason) ->
//! `flood` (per-MAC token bucket) -> `classify` (PXE / UEFI HTTP / iPXE, arch, UUID) ->
//! `decide` (authoritative, proxy, PXE boot server; relays) against the read-only
//! [`DecideCtx`] and the mutable [`LeaseBook`] -> `reply` (encode, echo option 82, pad to
//! 300 bytes, RFC 2131 §4.1 destination). [`DhcpCore::handle`] runs the whole chain; the
//! socket adapter only receives, persists the returned lease changes, and sends.

pub(crate) mod admission;
pub mod classify;
pub mod ctx;
pub mod decide;
pub mod flood;
pub mod leases;
pub(crate) mod pace;
pub(crate) mod queue;
pub mod reply;
pub mod server;
pub(crate) mod sojourn;
pub mod split;
pub mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::time::{Instant, SystemTime};

pub use classify::{BootKind, ClientInfo, IpxeFeatures, apply_node_hints, classify};
pub use ctx::{BootTargets, DecideCtx, Host, Subnet, UkiSet, uki_sets};
pub use decide::{Decision, Silence, decide};
pub use flood::{FloodConfig, FloodLimiter};
pub use leases::{LeaseBook, LeaseBookConfig, LeaseError};
pub use reply::{Reply, ReplySummary, ReplyTarget, reply_target};
pub use wire::{DropReason, Request, ServerPort};

use crate::store::LeaseChange;

/// The clocks a packet is handled at: wall time for leases (they are persisted and survive
/// restarts), monotonic time for the flood limiter.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Wall clock.
    pub wall: SystemTime,
    /// Monotonic clock.
    pub mono: Instant,
}

/// What the socket adapter should do with one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Persist `lease_changes`, then send `bytes` to `to`.
    Send {
        /// Encoded, padded reply.
        bytes: Vec<u8>,
        /// Destination.
        to: ReplyTarget,
        /// Lease records to persist before sending.
        lease_changes: Vec<LeaseChange>,
        /// The client, for events.
        client: Box<ClientInfo>,
        /// The reply's type, address and boot file, for events and metrics.
        summary: ReplySummary,
    },
    /// Persist `lease_changes`; nothing to send.
    Silent {
        /// Why.
        reason: Silence,
        /// Lease records to persist.
        lease_changes: Vec<LeaseChange>,
    },
    /// Dropped.
    Dropped(DropReason),
}

/// Counters of what the core did, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Replies sent.
    pub replies: u64,
    /// Messages handled without a reply.
    pub silent: u64,
    /// Drops by reason.
    pub dropped: BTreeMap<DropReason, u64>,
}

impl Stats {
    #[cfg(test)]
    /// Drops whose datagram was malformed.
    pub fn malformed(&self) -> u64 {
        self.dropped
            .iter()
            .filter(|(r, _)| r.is_malformed())
            .map(|(_, n)| n)
            .sum()
    }
}

/// The DHCP core: view, lease book, flood limiter and counters.
#[derive(Debug)]
pub struct DhcpCore {
    /// Read-only view of the inventory.
    pub ctx: DecideCtx,
    /// Lease state.
    pub book: LeaseBook,
    /// Flood limiter.
    pub flood: FloodLimiter,
    /// Counters.
    pub(crate) stats: Stats,
    /// With other appliances sharing the fleet: this one's share of the clients
    /// ([`split`]); `None` answers everyone.
    pub split: Option<split::Split>,
}

impl DhcpCore {
    /// A core over `ctx` with `book` (fresh or restored from the store).
    pub fn new(ctx: DecideCtx, book: LeaseBook, flood: FloodConfig) -> Self {
        Self {
            ctx,
            book,
            flood: FloodLimiter::new(flood),
            stats: Stats::default(),
            split: None,
        }
    }

    /// Handle one datagram that arrived on `port` from `source`.
    pub fn handle(
        &mut self,
        bytes: &[u8],
        port: ServerPort,
        source: SocketAddrV4,
        now: Now,
    ) -> Outcome {
        let outcome = self.handle_inner(bytes, port, source, now);
        match &outcome {
            Outcome::Send { .. } => self.stats.replies += 1,
            Outcome::Silent { .. } => self.stats.silent += 1,
            Outcome::Dropped(r) => *self.stats.dropped.entry(*r).or_default() += 1,
        }
        outcome
    }

    fn handle_inner(
        &mut self,
        bytes: &[u8],
        port: ServerPort,
        source: SocketAddrV4,
        now: Now,
    ) -> Outcome {
        let req = match wire::parse(bytes, port, source) {
            Ok(r) => r,
            Err(r) => return Outcome::Dropped(r),
        };
        if port == ServerPort::Dhcp
            && let Some(split) = &self.split
            && !split.answers(&req.msg)
        {
            return Outcome::Dropped(DropReason::PeerBucket);
        }
        if !self.flood.allow(req.mac, now.mono) {
            return Outcome::Dropped(DropReason::RateLimited);
        }
        match decide(&self.ctx, &mut self.book, &req, now.wall) {
            Decision::Reply {
                reply,
                to,
                lease_changes,
                client,
            } => match reply::encode(&reply) {
                Ok(bytes) => Outcome::Send {
                    bytes,
                    to,
                    lease_changes,
                    client,
                    summary: reply.summary(),
                },
                Err(e) => {
                    tracing::error!(mac = %req.mac, error = %e, "dropping a reply talboot could not encode");
                    Outcome::Dropped(DropReason::EncodeFailed)
                }
            },
            Decision::Silent {
                reason,
                lease_changes,
            } => Outcome::Silent {
                reason,
                lease_changes,
            },
            Decision::Drop { reason } => Outcome::Dropped(reason),
        }
    }
}

#[cfg(test)]
mod tests;
