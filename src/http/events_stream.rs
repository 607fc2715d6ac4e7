//! The admin API's live event stream, `GET /api/events`: every event talboot publishes
//! (DHCP, TFTP, HTTP, phase changes, cluster steps, power, drift), as server-sent events
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html>), for `talboot status
//! --watch` and anything else that watches a rack come up.
//!
//! Each event is `event: node` with one JSON object of [`WireEvent`]'s shape. A watcher too
//! slow for the bus gets `event: lagged` with how many it missed, and should re-read
//! `/api/nodes`. Served on the admin listener only: event details name MACs and addresses.

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use super::HttpApp;
use super::server::Streamed;
use crate::events::NodeEvent;

/// One event as `/api/events` sends it (the SSE `data:` of an `event: node`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEvent {
    /// Inventory node name, `cluster` for cluster steps, or the key of an unknown machine.
    pub node: String,
    /// The event's stored name (`dhcp.ack`, `node.phase`, `cluster.step`, ...).
    pub kind: String,
    /// What happened.
    pub detail: String,
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

impl From<&NodeEvent> for WireEvent {
    fn from(ev: &NodeEvent) -> Self {
        WireEvent {
            node: ev.node.clone(),
            kind: ev.kind.as_str().to_owned(),
            detail: ev.detail.clone(),
            at_unix_ms: ev.at_unix_ms,
        }
    }
}

/// The SSE events of a bus subscription, ending when the bus closes.
fn events(
    rx: tokio::sync::broadcast::Receiver<NodeEvent>,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await {
            Ok(ev) => Event::default()
                .event("node")
                .json_data(WireEvent::from(&ev))
                .unwrap_or_else(|_| Event::default().event("lagged").data("1")),
            Err(RecvError::Lagged(n)) => Event::default().event("lagged").data(n.to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok(event), rx))
    })
}

/// `GET /api/events`.
pub(crate) async fn api_events(State(app): State<Arc<HttpApp>>) -> Response {
    let mut r = Sse::new(events(app.events.subscribe()))
        .keep_alive(KeepAlive::default())
        .into_response();
    r.extensions_mut().insert(Streamed);
    r
}

/// Splits an SSE byte stream into `(event, data)` pairs as the spec's parser does for the
/// fields talboot sends (`event:`, `data:`, comments); `feed` takes bytes as they arrive.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: String,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        let mut out = Vec::new();
        while let Some(nl) = self.buf.find('\n') {
            let line: String = self.buf.drain(..=nl).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    let kind = if self.event.is_empty() {
                        "message".to_owned()
                    } else {
                        std::mem::take(&mut self.event)
                    };
                    out.push((kind, self.data.join("\n")));
                }
                self.event.clear();
                self.data.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = value.to_owned(),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_split_across_reads_and_comments_are_skipped() {
        let mut p = SseParser::default();
        assert!(p.feed(b": keep-alive\n\nevent: no").is_empty());
        assert!(p.feed(b"de\ndata: {\"a\":").is_empty());
        let got = p.feed(b"1}\n\ndata: x\r\ndata: y\r\n\r\n");
        assert_eq!(
            got,
            vec![
                ("node".to_owned(), "{\"a\":1}".to_owned()),
                ("message".to_owned(), "x\ny".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn bus_events_become_node_events_and_a_slow_reader_hears_it_lagged() {
        let (tx, rx) = tokio::sync::broadcast::channel(2);
        let ev = |d: &str| NodeEvent {
            node: "n1".into(),
            kind: crate::events::EventKind::Phase,
            detail: d.into(),
            at_unix_ms: 7,
        };
        for d in ["a", "b", "c"] {
            tx.send(ev(d)).unwrap();
        }
        drop(tx);
        let body = Sse::new(events(rx)).into_response().into_body();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let got = SseParser::default().feed(&bytes);
        assert_eq!(got[0], ("lagged".to_owned(), "1".to_owned()));
        let wire: Vec<WireEvent> = got[1..]
            .iter()
            .map(|(k, d)| {
                assert_eq!(k, "node");
                serde_json::from_str(d).unwrap()
            })
            .collect();
        assert_eq!(
            wire,
            vec![WireEvent::from(&ev("b")), WireEvent::from(&ev("c"))]
        );
    }

    proptest! {
        #[test]
        fn any_split_of_a_stream_gives_the_same_events(cut in 0usize..60) {
            let text = b"event: node\ndata: {\"x\":1}\n\n: ping\n\ndata: plain\n\n";
            let cut = cut.min(text.len());
            let mut whole = SseParser::default();
            let want = whole.feed(text);
            let mut p = SseParser::default();
            let mut got = p.feed(&text[..cut]);
            got.extend(p.feed(&text[cut..]));
            prop_assert_eq!(got, want);
        }
    }
}
