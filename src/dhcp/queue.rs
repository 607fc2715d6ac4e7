//! The bounded receive queue between the DHCP sockets and the core: two lanes sharing one
//! capacity, so that under overload a REQUEST (the second half of an exchange the server has
//! already paid for with an OFFER) is kept and answered before a DISCOVER (the start of a new
//! one), and every drop is counted.
//!
//! The policy, for a queue of capacity `n` (REQUESTs, RELEASEs, DECLINEs and INFORMs are the
//! `Finish` lane; DISCOVERs and anything without a readable message type the `Start` lane):
//! - while fewer than `n` datagrams wait, every datagram is queued;
//! - when full, a new datagram evicts the oldest waiting `Start` one; when none waits, a new
//!   `Start` datagram is itself dropped, and a new `Finish` one evicts the oldest `Finish`;
//! - the handler takes the oldest `Finish` datagram first, then the oldest `Start` one.
//!
//! Why, from Kea: Kea 2.2.0 by default has no queue at all (`dhcp-queue-control`
//! `enable-queue` defaults to `false`, and multi-threading is off:
//! isc-projects/kea `src/lib/dhcpsrv/parsers/simple_parser4.cc` at Kea-2.2.0), so its
//! datagrams wait in the kernel socket buffer, which drops the newest when full; with the
//! queue enabled (`kea-ring4`, default capacity 64) it is a `boost::circular_buffer` that
//! "discards packets from the front" (`src/lib/dhcp/packet_queue_ring.h`,
//! `PacketQueueRing::pushPacket`, and `doc/sphinx/arm/congestion-handling.rst`). Neither looks
//! at the message type (the ring's `shouldDropPacket` and `eatPackets` hooks are left to
//! derived queues and do nothing by default). Kea loses fewer REQUESTs than a type-blind
//! oldest-first ring of talboot's did because it answers each datagram before reading the
//! next (a REQUEST comes only after its OFFER left, and waits behind at most a socket buffer
//! of DISCOVERs), not because of its queue. Here decisions and commits are pipelined, so a
//! burst of DISCOVERs queued ahead of a REQUEST could push that REQUEST out: the lanes make
//! the REQUEST win. Starving DISCOVERs cannot run away: a REQUEST normally follows an OFFER,
//! so when only REQUESTs are answered, no new REQUESTs are caused.
//!
//! Oldest-first eviction within the `Start` lane is kept from Kea's ring: the oldest DISCOVER's
//! client has most likely retransmitted already. The readers never wait for the core, so the
//! kernel's socket buffer stays empty and this queue is the one place load is shed.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Default capacity: the pipeline behind the queue (decide, group commit, send) drains it in
/// bursts of hundreds; Kea's default of 64 is sized for one packet at a time.
pub(crate) const DEFAULT_CAPACITY: usize = 256;

/// Which lane a datagram waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// Continues or ends an exchange the server already answered (REQUEST, RELEASE,
    /// DECLINE, INFORM): kept first, answered first.
    Finish,
    /// Starts an exchange (DISCOVER), or has no readable message type: shed first.
    Start,
}

impl Lane {
    /// The lane of a datagram with DHCP message type `kind` (option 53, read from the raw
    /// bytes; `None` when it cannot be read).
    pub(crate) fn of(kind: Option<dhcproto::v4::MessageType>) -> Self {
        use dhcproto::v4::MessageType as T;
        match kind {
            Some(T::Request | T::Release | T::Decline | T::Inform) => Self::Finish,
            _ => Self::Start,
        }
    }
}

/// Two lanes of at most `capacity` items in all (see the module docs for the policy).
#[derive(Debug)]
pub(crate) struct Ring<T> {
    finish: VecDeque<T>,
    start: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> Ring<T> {
    /// An empty queue (a capacity of 0 is raised to 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            finish: VecDeque::new(),
            start: VecDeque::with_capacity(capacity),
            capacity,
            dropped: 0,
        }
    }

    /// Queue `item` in `lane`; when the queue is full, the item the policy sheds (an older
    /// one, or `item` itself) is counted and returned with its lane.
    pub fn push(&mut self, item: T, lane: Lane) -> Option<(T, Lane)> {
        let shed = if self.len() < self.capacity {
            None
        } else if let Some(old) = self.start.pop_front() {
            Some((old, Lane::Start))
        } else if lane == Lane::Start {
            self.dropped += 1;
            return Some((item, Lane::Start));
        } else {
            self.finish.pop_front().map(|old| (old, Lane::Finish))
        };
        if shed.is_some() {
            self.dropped += 1;
        }
        match lane {
            Lane::Finish => self.finish.push_back(item),
            Lane::Start => self.start.push_back(item),
        }
        shed
    }

    /// The oldest `Finish` item, else the oldest `Start` item.
    pub(crate) fn pop(&mut self) -> Option<T> {
        self.finish.pop_front().or_else(|| self.start.pop_front())
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.finish.len() + self.start.len()
    }

    #[cfg(test)]
    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    /// Items shed so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A [`Ring`] shared by the socket readers (push, never wait) and the handling loop (pop,
/// wait when empty).
#[derive(Debug)]
pub(crate) struct RxQueue<T> {
    ring: Mutex<Ring<T>>,
    ready: Notify,
}

impl<T> RxQueue<T> {
    /// An empty queue of `capacity`.
    pub fn new(capacity: usize) -> Self {
        Self {
            ring: Mutex::new(Ring::new(capacity)),
            ready: Notify::new(),
        }
    }

    /// Queue `item` in `lane` without waiting; returns what had to be shed, if anything.
    pub fn push(&self, item: T, lane: Lane) -> Option<(T, Lane)> {
        let shed = self.lock().push(item, lane);
        // A stored permit wakes the next `pop` even if nobody is waiting yet.
        self.ready.notify_one();
        shed
    }

    /// The next item by the lane order, waiting for one if the queue is empty.
    pub(crate) async fn pop(&self) -> T {
        loop {
            if let Some(item) = self.lock().pop() {
                return item;
            }
            self.ready.notified().await;
        }
    }

    #[cfg(test)]
    /// Items shed so far.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring<T>> {
        // A panic while holding the lock leaves a consistent ring (push and pop are single
        // VecDeque operations), so a poisoned lock is still usable.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Lane::{Finish, Start};
    use dhcproto::v4::MessageType;
    use proptest::prelude::*;

    #[test]
    fn message_types_choose_their_lane() {
        for t in [
            MessageType::Request,
            MessageType::Release,
            MessageType::Decline,
            MessageType::Inform,
        ] {
            assert_eq!(Lane::of(Some(t)), Finish, "{t:?}");
        }
        assert_eq!(Lane::of(Some(MessageType::Discover)), Start);
        assert_eq!(Lane::of(None), Start);
    }

    #[test]
    fn a_full_queue_sheds_the_oldest_discover_for_anything_new() {
        let mut r = Ring::new(3);
        for i in 0..3 {
            assert_eq!(r.push(i, Start), None);
        }
        assert_eq!(r.push(3, Start), Some((0, Start)));
        assert_eq!(r.push(10, Finish), Some((1, Start)));
        assert_eq!(r.dropped(), 2);
        assert_eq!(r.len(), 3);
        let rest: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
        // The REQUEST first, then the DISCOVERs oldest first.
        assert_eq!(rest, [10, 2, 3]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_queue_full_of_requests_refuses_a_discover_and_sheds_its_oldest_request_for_a_request() {
        let mut r = Ring::new(2);
        r.push(1, Finish);
        r.push(2, Finish);
        assert_eq!(r.push(100, Start), Some((100, Start)));
        assert_eq!(r.push(3, Finish), Some((1, Finish)));
        assert_eq!(r.dropped(), 2);
        let rest: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(rest, [2, 3]);
    }

    #[tokio::test]
    async fn a_waiting_pop_is_woken_and_requests_overtake_discovers() {
        let q = std::sync::Arc::new(RxQueue::new(2));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.push("a", Start);
        assert_eq!(waiter.await.unwrap(), "a");
        q.push("d1", Start);
        q.push("d2", Start);
        assert_eq!(q.push("r", Finish), Some(("d1", Start)));
        assert_eq!(q.dropped(), 1);
        assert_eq!(q.pop().await, "r");
        assert_eq!(q.pop().await, "d2");
    }

    /// The policy restated over a whole arrival sequence (no pops): which items a queue of
    /// `cap` holds at the end, by lane.
    fn model(cap: usize, arrivals: &[(usize, Lane)]) -> (Vec<usize>, Vec<usize>) {
        let (mut fin, mut st) = (Vec::new(), Vec::new());
        for &(i, lane) in arrivals {
            if fin.len() + st.len() >= cap {
                if !st.is_empty() {
                    st.remove(0);
                } else if lane == Start {
                    continue;
                } else {
                    fin.remove(0);
                }
            }
            match lane {
                Finish => fin.push(i),
                Start => st.push(i),
            }
        }
        (fin, st)
    }

    fn lanes() -> impl Strategy<Value = Vec<Lane>> {
        proptest::collection::vec(prop_oneof![Just(Finish), Just(Start)], 0..60)
    }

    proptest! {
        #[test]
        fn requests_are_kept_over_discovers_and_each_lane_keeps_its_newest(
            cap in 1usize..8, lanes in lanes()
        ) {
            let arrivals: Vec<(usize, Lane)> = lanes.into_iter().enumerate().collect();
            let mut r = Ring::new(cap);
            let mut shed = Vec::new();
            for &(i, lane) in &arrivals {
                shed.extend(r.push(i, lane));
            }
            let kept: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
            let (fin, st) = model(cap, &arrivals);
            // Never more than the capacity; REQUESTs come out before DISCOVERs, each in order.
            prop_assert_eq!(&kept, &fin.iter().chain(&st).copied().collect::<Vec<_>>());
            // Nothing lost without being counted.
            prop_assert_eq!(kept.len() + shed.len(), arrivals.len());
            prop_assert_eq!(r.dropped(), shed.len() as u64);
            // A REQUEST is shed only when no DISCOVER was waiting: the kept REQUESTs are the
            // newest min(cap, #requests).
            let requests: Vec<usize> =
                arrivals.iter().filter(|(_, l)| *l == Finish).map(|(i, _)| *i).collect();
            let want = requests[requests.len().saturating_sub(cap)..].to_vec();
            prop_assert_eq!(fin, want);
        }

        #[test]
        fn with_discovers_only_it_is_kea_s_ring(cap in 1usize..8, n in 0usize..40) {
            let mut r = Ring::new(cap);
            for i in 0..n {
                r.push(i, Start);
            }
            let kept: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
            let want: Vec<_> = (n.saturating_sub(cap)..n).collect();
            prop_assert_eq!(kept, want);
            prop_assert_eq!(r.dropped(), n.saturating_sub(cap) as u64);
        }
    }
}
