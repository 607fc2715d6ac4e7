//! The wire shape of the admin API's live event stream, `GET /api/events` (served by
//! [`super::dashboard`]): every event talboot publishes (DHCP, TFTP, HTTP, phase changes,
//! cluster steps, power, drift) as server-sent events
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html>), and the parser its
//! terminal client, `talboot status --watch`, reads it with.
//!
//! Each event is `event: node` with one JSON object of [`WireEvent`]'s shape (the dashboard
//! adds a `failure` flag, which a watcher may ignore). A watcher too slow for the bus gets
//! `event: resync` and should re-read `/api/nodes`. Served on the admin listener only: event
//! details name MACs and addresses.

use serde::{Deserialize, Serialize};

/// One event as `/api/events` sends it (the SSE `data:` of an `event: node`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireEvent {
    /// Inventory node name, `cluster` for cluster steps, or the key of an unknown machine.
    pub node: String,
    /// The event's stored name (`dhcp.ack`, `node.phase`, `cluster.step`, ...).
    pub kind: String,
    /// What happened.
    pub detail: String,
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// Splits an SSE byte stream into `(event, data)` pairs as the spec's parser does for the
/// fields talboot sends (`event:`, `data:`, comments); `feed` takes bytes as they arrive.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buf: String,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
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

    #[test]
    fn the_served_frames_parse_into_wire_events() {
        let ev = crate::events::NodeEvent {
            node: "n1".into(),
            kind: crate::events::EventKind::Phase,
            detail: "maintenance -> configuring\nsecond line".into(),
            at_unix_ms: 7,
        };
        let frame = super::super::dashboard::sse_frame(&ev);
        let got = SseParser::default().feed(frame.as_bytes());
        assert_eq!(got.len(), 1, "{frame}");
        assert_eq!(got[0].0, "node");
        let wire: WireEvent = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(
            wire,
            WireEvent {
                node: "n1".into(),
                kind: ev.kind.as_str().into(),
                detail: ev.detail.clone(),
                at_unix_ms: 7,
            }
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
