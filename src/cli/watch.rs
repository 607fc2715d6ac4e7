//! `talboot status --watch`: the status table kept live from a running `serve`'s admin API.
//! It reads `/api/nodes` once, then follows `/api/events` (server-sent events, see
//! [`crate::admin::events_stream`]): on a terminal the table is redrawn in place after each
//! batch of events, with the last cluster step under it; anywhere else (a pipe, a file, the
//! journal) it prints the table once and then one plain line per event, without escape codes.
//!
//! [`Board`] owns the table and is pure (events in, table out); [`watch`] is the HTTP and
//! terminal adapter around it.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::EXIT_USAGE;
use super::status::{api_rows, first_line, render};
use crate::admin::events_stream::{SseParser, WireEvent};

/// Columns of the status table that events update.
const NODE: usize = 0;
const PHASE: usize = 2;
const LAST: usize = super::status::COLUMNS - 1;

/// The live table: `/api/nodes`' rows, updated by events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Board {
    rows: Vec<[String; super::status::COLUMNS]>,
    cluster: Option<String>,
}

/// What an event did to the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing shown changed (an unknown machine, a Talos call).
    None,
    /// A row or the cluster line changed.
    Redraw,
}

impl Board {
    /// The board of `/api/nodes`' answer.
    pub(crate) fn new(nodes: &[serde_json::Value]) -> Board {
        Board {
            rows: api_rows(nodes),
            cluster: None,
        }
    }

    /// Applies one event: a node's phase (`from -> to: why`) and last event, or the cluster
    /// step line.
    pub(crate) fn apply(&mut self, ev: &WireEvent) -> Change {
        if ev.kind == "cluster.step" {
            self.cluster = Some(first_line(&ev.detail).to_owned());
            return Change::Redraw;
        }
        // Talos calls are many; the phase changes say the same thing more plainly.
        if ev.kind == "talos.call" {
            return Change::None;
        }
        let Some(row) = self.rows.iter_mut().skip(1).find(|r| r[NODE] == ev.node) else {
            return Change::None;
        };
        if ev.kind == "node.phase"
            && let Some(to) = phase_after(&ev.detail)
        {
            row[PHASE] = to.to_owned();
        }
        row[LAST] = if row[PHASE] == "failed" && ev.kind == "node.phase" {
            format!("failed: {}", first_line(&ev.detail))
        } else {
            format!("{}: {}", ev.kind, first_line(&ev.detail))
        };
        Change::Redraw
    }

    /// The table, and the last cluster step under it.
    pub(crate) fn screen(&self) -> String {
        let mut s = render(&self.rows);
        s.push_str(&format!(
            "\ncluster: {}\n",
            self.cluster.as_deref().unwrap_or("no cluster step yet")
        ));
        s
    }
}

/// The phase a `node.phase` detail (`from -> to: why`) moves to.
fn phase_after(detail: &str) -> Option<&str> {
    let (_, rest) = detail.split_once(" -> ")?;
    let to = rest.split(':').next()?.trim();
    (!to.is_empty() && !to.contains(' ')).then_some(to)
}

/// One plain line for an event: UTC time, node, kind, detail.
pub(crate) fn plain_line(ev: &WireEvent) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ev.at_unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(time::macros::format_description!(
                "[hour]:[minute]:[second].[subsecond digits:3]"
            ))
            .ok()
        })
        .unwrap_or_default();
    format!(
        "{t}  {:<14} {:<15} {}",
        ev.node,
        ev.kind,
        first_line(&ev.detail)
    )
}

/// Why watching failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// The admin API did not answer.
    #[error(
        "{url} did not answer: {cause}; is `talboot serve` (or `talboot up`) running? pass \
         --admin if its --admin-listen is elsewhere"
    )]
    Connect {
        /// What was asked.
        url: String,
        /// Why.
        cause: String,
    },
    /// It answered with an error.
    #[error("{url}: HTTP {status}")]
    Status {
        /// What was asked.
        url: String,
        /// The answer.
        status: reqwest::StatusCode,
    },
    /// Writing the table failed.
    #[error("cannot write the table: {0}")]
    Output(#[from] std::io::Error),
}

/// Clears the screen and homes the cursor (ECMA-48 CSI `2J` and `H`).
const CLEAR: &str = "\x1b[H\x1b[2J";

async fn nodes(client: &reqwest::Client, base: &str) -> Result<Vec<serde_json::Value>, WatchError> {
    let url = format!("{base}/api/nodes");
    let connect = |cause: String| WatchError::Connect {
        url: url.clone(),
        cause,
    };
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| connect(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(WatchError::Status {
            url,
            status: resp.status(),
        });
    }
    let body = resp.bytes().await.map_err(|e| connect(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| connect(e.to_string()))
}

/// Follows the admin API at `admin` until the stream ends (serve stopped) or `stop`; writes
/// to `out`, redrawing in place when `terminal`.
pub(crate) async fn watch(
    admin: SocketAddr,
    out: &mut (dyn Write + Send),
    terminal: bool,
    stop: CancellationToken,
) -> Result<(), WatchError> {
    use futures_util::StreamExt as _;
    crate::install_crypto_provider();
    let base = format!("http://{admin}");
    let client = super::admin_client::client().map_err(|e| WatchError::Connect {
        url: base.clone(),
        cause: e.to_string(),
    })?;
    let (url, resp) = subscribe(&client, &base).await?;
    let mut follower = Follower {
        client: &client,
        base: &base,
        board: Board::new(&nodes(&client, &base).await?),
        parser: SseParser::default(),
        terminal,
    };
    let footer = format!("\nwatching {url} (Ctrl-C to stop)\n");
    if terminal {
        write!(out, "{CLEAR}{}{footer}", follower.board.screen())?;
    } else {
        write!(out, "{}", follower.board.screen())?;
    }
    out.flush()?;
    let mut stream = resp.bytes_stream();
    loop {
        let chunk = tokio::select! {
            _ = stop.cancelled() => break,
            c = stream.next() => c,
        };
        let Some(Ok(bytes)) = chunk else {
            writeln!(out, "the event stream ended (serve stopped)")?;
            break;
        };
        let redraw = follower.feed(&bytes, out).await?;
        if terminal && redraw {
            write!(out, "{CLEAR}{}{footer}", follower.board.screen())?;
        }
        out.flush()?;
    }
    out.flush()?;
    Ok(())
}

/// Opens `/api/events` (its URL and the streaming answer). Subscribe first, then read the
/// table: an event between the two is applied to a table that may already show it, which is
/// harmless; the other order could miss one.
async fn subscribe(
    client: &reqwest::Client,
    base: &str,
) -> Result<(String, reqwest::Response), WatchError> {
    let url = format!("{base}/api/events");
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| WatchError::Connect {
            url: url.clone(),
            cause: e.to_string(),
        })?;
    if !resp.status().is_success() {
        return Err(WatchError::Status {
            url,
            status: resp.status(),
        });
    }
    Ok((url, resp))
}

/// What following the event stream keeps from one chunk to the next.
struct Follower<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    board: Board,
    parser: SseParser,
    terminal: bool,
}

impl Follower<'_> {
    /// Applies one chunk of the event stream: node events to the table (and, off a terminal,
    /// one line each); a resync reads the table again, as events were missed. Whether the
    /// table needs a redraw.
    async fn feed(
        &mut self,
        bytes: &[u8],
        out: &mut (dyn Write + Send),
    ) -> Result<bool, WatchError> {
        let mut redraw = false;
        for (kind, data) in self.parser.feed(bytes) {
            match kind.as_str() {
                "node" => {
                    let Ok(ev) = serde_json::from_str::<WireEvent>(&data) else {
                        continue;
                    };
                    if self.board.apply(&ev) == Change::Redraw {
                        redraw = true;
                    }
                    if !self.terminal && ev.kind != "talos.call" && ev.kind != "dhcp.offer" {
                        writeln!(out, "{}", plain_line(&ev))?;
                    }
                }
                "resync" => {
                    let cluster = self.board.cluster.take();
                    self.board = Board::new(&nodes(self.client, self.base).await?);
                    self.board.cluster = cluster;
                    redraw = true;
                }
                _ => {}
            }
        }
        Ok(redraw)
    }
}

/// Run `talboot status --watch --admin ADDR`.
pub(crate) fn run(admin: SocketAddr) -> ExitCode {
    use std::io::IsTerminal;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot status: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let terminal = std::io::stdout().is_terminal();
    rt.block_on(async {
        let stop = CancellationToken::new();
        {
            let stop = stop.clone();
            tokio::spawn(async move {
                super::serve::wait_for_signal().await;
                stop.cancel();
            });
        }
        let mut out = std::io::stdout();
        match watch(admin, &mut out, terminal, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("talboot status: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(node: &str, kind: &str, detail: &str) -> WireEvent {
        WireEvent {
            node: node.into(),
            kind: kind.into(),
            detail: detail.into(),
            at_unix_ms: 1_796_133_600_123,
        }
    }

    fn board() -> Board {
        Board::new(&[
            serde_json::json!({"name": "cp-01", "role": "controlplane", "phase": "unknown"}),
            serde_json::json!({"name": "wk-01", "role": "worker", "phase": "installing",
                "last_event": "node.phase: configured -> installing: config applied"}),
        ])
    }

    #[test]
    fn phase_events_move_the_phase_and_every_event_is_the_last_event() {
        let mut b = board();
        assert_eq!(
            b.apply(&ev(
                "cp-01",
                "dhcp.ack",
                "127.0.0.11 (boot file `ipxe.efi`)"
            )),
            Change::Redraw
        );
        assert_eq!(
            b.apply(&ev(
                "cp-01",
                "node.phase",
                "unknown -> maintenance: Talos API answered\nmore"
            )),
            Change::Redraw
        );
        let s = b.screen();
        let row = s.lines().find(|l| l.starts_with("cp-01")).unwrap();
        assert!(row.contains(" maintenance "), "{row}");
        assert!(
            row.ends_with("node.phase: unknown -> maintenance: Talos API answered"),
            "{row}"
        );
        // Unknown machines and Talos calls change nothing shown.
        let before = b.clone();
        assert_eq!(
            b.apply(&ev("mac-aa-bb-cc-dd-ee-ff", "dhcp.ack", "x")),
            Change::None
        );
        assert_eq!(
            b.apply(&ev("wk-01", "talos.call", "Version ok")),
            Change::None
        );
        assert_eq!(b, before);
        // A failure shows why.
        b.apply(&ev(
            "wk-01",
            "node.phase",
            "installing -> failed: no disk matches",
        ));
        let s = b.screen();
        let row = s.lines().find(|l| l.starts_with("wk-01")).unwrap();
        assert!(
            row.contains(" failed ")
                && row.ends_with("failed: installing -> failed: no disk matches"),
            "{row}"
        );
    }

    #[test]
    fn cluster_steps_show_under_the_table() {
        let mut b = board();
        assert!(b.screen().ends_with("cluster: no cluster step yet\n"));
        b.apply(&ev(
            "cluster",
            "cluster.step",
            "argocd-installed -> handed-off: every cluster step is done",
        ));
        assert!(
            b.screen()
                .ends_with("cluster: argocd-installed -> handed-off: every cluster step is done\n"),
            "{}",
            b.screen()
        );
    }

    #[test]
    fn plain_lines_carry_no_escape_codes() {
        let l = plain_line(&ev("cp-01", "dhcp.ack", "127.0.0.11\nsecond line"));
        assert_eq!(l, "14:00:00.123  cp-01          dhcp.ack        127.0.0.11");
        assert!(!l.contains('\x1b'));
    }

    #[test]
    fn only_a_well_formed_phase_change_moves_the_phase() {
        assert_eq!(
            phase_after("unknown -> maintenance: x"),
            Some("maintenance")
        );
        assert_eq!(phase_after("installing -> ready"), Some("ready"));
        assert_eq!(phase_after("no arrow here"), None);
        assert_eq!(phase_after("a -> : nothing"), None);
    }
}
