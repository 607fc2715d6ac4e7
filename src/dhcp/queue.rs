//! The bounded receive queue between the DHCP sockets and the core: a ring that, when full,
//! drops its oldest datagram to make room for the newest, and counts the drop.
//!
//! This is Kea's congestion handling (`dhcp-queue-control`, queue type `kea-ring4`):
//! a receiver reads the sockets into a ring buffer that the server thread drains, and "once
//! it reaches capacity, new packets get added to the back of the queue by discarding packets
//! from the front of the queue" (isc-projects/kea `doc/sphinx/arm/congestion-handling.rst`
//! and `src/lib/dhcp/packet_queue_ring.h`, `PacketQueueRing::pushPacket` on a
//! `boost::circular_buffer`, at Kea-2.2.0). Under overload the oldest request is the one whose
//! client has most likely retransmitted or given up already; answering the newest keeps the
//! replies useful instead of letting every client time out behind a stale backlog. The
//! readers never wait for the core, so the kernel's socket buffer (which drops the newest)
//! stays empty and this ring is the one place load is shed.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Default capacity: the pipeline behind the ring (decide, group commit, send) drains it in
/// bursts of hundreds; Kea's default of 64 is sized for one packet at a time.
pub(crate) const DEFAULT_CAPACITY: usize = 256;

/// A ring of at most `capacity` items; pushing onto a full ring evicts the oldest.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> Ring<T> {
    /// An empty ring (a capacity of 0 is raised to 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            items: VecDeque::with_capacity(capacity),
            capacity,
            dropped: 0,
        }
    }

    /// Append `item`; when the ring is full, the oldest item is removed, counted and returned.
    pub fn push(&mut self, item: T) -> Option<T> {
        let evicted = if self.items.len() >= self.capacity {
            self.dropped += 1;
            self.items.pop_front()
        } else {
            None
        };
        self.items.push_back(item);
        evicted
    }

    /// The oldest item.
    pub(crate) fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    #[cfg(test)]
    /// Items waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    #[cfg(test)]
    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    #[cfg(test)]
    /// Items evicted so far.
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

    /// Queue `item` without waiting; returns the oldest item if it had to be dropped.
    pub fn push(&self, item: T) -> Option<T> {
        let evicted = self.lock().push(item);
        // A stored permit wakes the next `pop` even if nobody is waiting yet.
        self.ready.notify_one();
        evicted
    }

    /// The oldest item, waiting for one if the queue is empty.
    pub(crate) async fn pop(&self) -> T {
        loop {
            if let Some(item) = self.lock().pop() {
                return item;
            }
            self.ready.notified().await;
        }
    }

    #[cfg(test)]
    /// Items evicted so far.
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
    use proptest::prelude::*;

    #[test]
    fn a_full_ring_drops_the_oldest_and_counts_it() {
        let mut r = Ring::new(3);
        for i in 0..3 {
            assert_eq!(r.push(i), None);
        }
        assert_eq!(r.push(3), Some(0));
        assert_eq!(r.push(4), Some(1));
        assert_eq!(r.dropped(), 2);
        assert_eq!(r.len(), 3);
        let rest: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(rest, [2, 3, 4]);
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn queue_overflow_keeps_the_newest_and_a_waiting_pop_is_woken() {
        let q = std::sync::Arc::new(RxQueue::new(2));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.push("a");
        assert_eq!(waiter.await.unwrap(), "a");
        q.push("b");
        q.push("c");
        assert_eq!(q.push("d"), Some("b"));
        assert_eq!(q.dropped(), 1);
        assert_eq!(q.pop().await, "c");
        assert_eq!(q.pop().await, "d");
    }

    proptest! {
        #[test]
        fn the_ring_holds_the_last_capacity_items_in_order(
            cap in 1usize..8, n in 0usize..40
        ) {
            let mut r = Ring::new(cap);
            for i in 0..n {
                r.push(i);
            }
            let kept: Vec<_> = std::iter::from_fn(|| r.pop()).collect();
            let want: Vec<_> = (n.saturating_sub(cap)..n).collect();
            prop_assert_eq!(kept, want);
            prop_assert_eq!(r.dropped(), n.saturating_sub(cap) as u64);
        }
    }
}
