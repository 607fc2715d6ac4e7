//! Change notices for a follower's read view (issue 28 item 3): a watch on some tables'
//! prefixes that says "something changed" so the view reloads them from the store. A notice
//! carries no data: the reload reads the store at one revision, so a burst of changes costs
//! one reload, and a notice lost to a coalesced channel is covered by the next reload.
//!
//! etcd's watch delivers every change after its start revision in revision order
//! (etcd-io/etcd v3.4.23 `mvcc/watchable_store.go`); a watch that breaks, or is cancelled
//! because its start revision was compacted (`WatchResponse.CompactRevision`,
//! `etcdserver/api/v3rpc/watch.go`), is started again from the current revision, with a
//! notice, since changes in between may have been missed.

use std::time::Duration;

use etcd_client::{Client, WatchOptions};
use tokio::sync::mpsc;

use super::EtcdStore;

/// Pause before watching again after a watch ended.
const REWATCH_AFTER: Duration = Duration::from_millis(200);

impl EtcdStore {
    /// Notices of changes under the `tables` (`"nodes"`, `"node_lifecycle"`, ...) of this
    /// fleet, one waiting at most; the watches stop once the receiver is dropped. The first
    /// notice comes once the watches are in place, so a reload on it misses nothing.
    pub fn watch_tables(&self, tables: &[&str]) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel(1);
        for t in tables {
            let mut prefix = self.root();
            prefix.extend_from_slice(t.as_bytes());
            prefix.push(b'/');
            self.runtime()
                .spawn(watch_prefix(self.client(), prefix, tx.clone()));
        }
        rx
    }
}

impl EtcdStore {
    /// The value of every put under `table` (`"events"`) from now on, in revision order,
    /// until the receiver is dropped. A watch that breaks is started again from the next
    /// revision it had not delivered, so nothing is skipped unless compaction removed it.
    pub fn watch_puts(&self, table: &str) -> mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = mpsc::channel(1024);
        let mut prefix = self.root();
        prefix.extend_from_slice(table.as_bytes());
        prefix.push(b'/');
        self.runtime().spawn(relay_puts(self.client(), prefix, tx));
        rx
    }
}

/// Send the value of every put under `prefix` to `tx` until it closes.
async fn relay_puts(mut client: Client, prefix: Vec<u8>, tx: mpsc::Sender<Vec<u8>>) {
    let mut from = 0;
    loop {
        let mut opts = WatchOptions::new().with_prefix();
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let watched = tokio::select! {
            w = client.watch(prefix.clone(), Some(opts)) => w,
            () = tx.closed() => return,
        };
        if let Ok(mut stream) = watched {
            while let Ok(Some(resp)) = stream.message().await {
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    from = kv.mod_revision() + 1;
                    if ev.event_type() == etcd_client::EventType::Put
                        && tx.send(kv.value().to_vec()).await.is_err()
                    {
                        return;
                    }
                }
                if resp.canceled() {
                    // Compacted past `from`: what was removed is gone; go on from now.
                    from = 0;
                    break;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(REWATCH_AFTER) => {}
            () = tx.closed() => return,
        }
    }
}

/// Watch `prefix` until `tx` closes, sending a notice per batch of events.
async fn watch_prefix(mut client: Client, prefix: Vec<u8>, tx: mpsc::Sender<()>) {
    loop {
        let opts = WatchOptions::new().with_prefix();
        let watched = tokio::select! {
            w = client.watch(prefix.clone(), Some(opts)) => w,
            () = tx.closed() => return,
        };
        if let Ok(mut stream) = watched {
            // In place from here on (or ended): whatever came before is for a reload to read.
            let _ = tx.try_send(());
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    () = tx.closed() => return,
                };
                let Ok(Some(resp)) = msg else { break };
                if !resp.events().is_empty() || resp.canceled() {
                    let _ = tx.try_send(());
                }
                if resp.canceled() {
                    break;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(REWATCH_AFTER) => {}
            () = tx.closed() => return,
        }
    }
}
