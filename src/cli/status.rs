//! `talboot status`: one line per inventory node from the state store: role, phase, address,
//! Talos version, the disk Talos installs to (as talboot computed it from the node's disks)
//! and the last event -- or, for a Failed node, why it failed (the last event of a failed
//! node is often a later, unrelated probe). While serve runs (it holds the store) the rows
//! come from its admin API, with each node's drift as serve's drift watcher last saw it.

use std::process::ExitCode;

use crate::inventory::{self, Inventory};
use crate::store::{self, NodePhase, NodeRecord, Store};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub store: super::args::StoreAccess,
    /// Keep the table live from the running serve's event stream (`--admin`'s
    /// `/api/events`): redrawn in place on a terminal, one line per event otherwise.
    #[arg(long)]
    pub watch: bool,
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    if args.watch {
        return super::watch::run(args.store.admin);
    }
    let inventory = match inventory::load(&args.inventory.config) {
        Ok(l) => l.inventory,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    // On etcd the table is read from etcd itself, whichever appliances run.
    let store = match super::store_flags::open_to_read(&args.store, inventory.cluster.name.as_str())
    {
        Ok(super::store_flags::Reach::Local(opened)) => opened.store,
        Ok(super::store_flags::Reach::Serve) => return status_from_serve(args.store.admin),
        Err(code) => return code,
    };
    let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
    match table(&inventory, store.as_ref(), now) {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// The status table, one row per inventory node in file order; a lease counts as the node's
/// address while it holds it at `now_unix`.
pub fn table(
    inventory: &Inventory,
    store: &dyn Store,
    now_unix: u64,
) -> Result<String, store::StoreError> {
    let mut rows = vec![[
        "NODE".to_owned(),
        "ROLE".into(),
        "PHASE".into(),
        "ADDRESS".into(),
        "TALOS".into(),
        "DISK".into(),
        "DRIFT".into(),
        "LAST EVENT".into(),
    ]];
    for node in &inventory.nodes {
        let rec: Option<NodeRecord> = store.node(&node.name)?;
        let lease = node
            .macs
            .iter()
            .map(|m| store.lease(m.value))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .find(|l| l.holds_address(now_unix));
        let address = lease
            .map(|l| l.ip.to_string())
            .or_else(|| {
                rec.as_ref()
                    .and_then(|r| r.last_seen_addr)
                    .map(|a| a.to_string())
            })
            .unwrap_or_else(|| "-".into());
        let failure = if rec.as_ref().is_some_and(|r| r.phase == NodePhase::Failed) {
            crate::store::Lifecycle::load(store, &node.name)?.failure
        } else {
            None
        };
        let last = match failure {
            Some(why) => format!("failed: {}", first_line(&why)),
            None => store
                .last_event(&node.name)?
                .map(|e| format!("{}: {}", e.kind, first_line(&e.display_detail())))
                .unwrap_or_else(|| "-".into()),
        };
        rows.push([
            node.name.to_string(),
            node.role.to_string(),
            rec.as_ref()
                .map(|r| r.phase.to_string())
                .unwrap_or_else(|| "unknown".into()),
            address,
            rec.and_then(|r| r.talos_version)
                .unwrap_or_else(|| "-".into()),
            install_disk(store, node.name.as_str()),
            // Only a running serve's drift watcher knows; `talboot plan` checks now.
            "-".into(),
            last,
        ]);
    }
    Ok(render(&rows))
}

/// The install disk recorded with the node's facts, `-` before one was chosen.
fn install_disk(store: &dyn Store, node: &str) -> String {
    crate::store::NodeFacts::load(store, node)
        .map(|f| f.install_disk)
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// Align the rows into columns (the last column is left ragged).
pub(crate) fn render(rows: &[[String; COLUMNS]]) -> String {
    let mut widths = [0usize; COLUMNS - 1];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < COLUMNS - 1 {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                out.push_str(cell);
            }
        }
        out.push('\n');
    }
    out
}

/// `serve` holds the store: read the same facts from its admin API's `/api/nodes`.
fn status_from_serve(admin: std::net::SocketAddr) -> ExitCode {
    let url = format!("http://{admin}/api/nodes");
    let fetched = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            crate::install_crypto_provider();
            rt.block_on(async {
                let resp = super::admin_client::client()
                    .map_err(|e| e.to_string())?
                    .get(&url)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let code = resp.status();
                let body = resp.bytes().await.map_err(|e| e.to_string())?;
                if !code.is_success() {
                    // A 401 says how to pass the admin token.
                    return Err(format!("{code}: {}", String::from_utf8_lossy(&body).trim()));
                }
                serde_json::from_slice::<Vec<serde_json::Value>>(&body).map_err(|e| e.to_string())
            })
        });
    let nodes = match fetched {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "talboot: the state store is in use (is `talboot serve` running?) and {url} did \
                 not answer: {e}; pass --admin if serve's --admin-listen is elsewhere"
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    print!("{}", render(&api_rows(&nodes)));
    ExitCode::SUCCESS
}

/// The table rows (header first) of `/api/nodes`' answer.
pub(crate) fn api_rows(nodes: &[serde_json::Value]) -> Vec<[String; COLUMNS]> {
    let field = |n: &serde_json::Value, k: &str| {
        n.get(k)
            .and_then(|v| v.as_str())
            .map(|s| first_line(s).to_string())
            .unwrap_or_else(|| "-".into())
    };
    let mut rows = vec![[
        "NODE".to_owned(),
        "ROLE".into(),
        "PHASE".into(),
        "ADDRESS".into(),
        "TALOS".into(),
        "DISK".into(),
        "DRIFT".into(),
        "LAST EVENT".into(),
    ]];
    for n in nodes {
        rows.push([
            field(n, "name"),
            field(n, "role"),
            field(n, "phase"),
            field(n, "last_seen"),
            field(n, "talos_version"),
            field(n, "install_disk"),
            drift_cell(n.get("drift")),
            match n.get("failure").and_then(|v| v.as_str()) {
                Some(why) => format!("failed: {}", first_line(why)),
                None => field(n, "last_event"),
            },
        ]);
    }
    rows
}

/// Columns of the status table.
pub(crate) const COLUMNS: usize = 8;

/// The DRIFT cell of a node from `/api/nodes`: `-` until serve's drift watcher could read
/// the node, `no` in sync, `yes (N)` with the number of differences (`talboot plan` lists
/// them).
fn drift_cell(drift: Option<&serde_json::Value>) -> String {
    let Some(d) = drift.filter(|d| !d.is_null()) else {
        return "-".into();
    };
    match (
        d.get("drifted").and_then(|v| v.as_bool()),
        d.get("changes").and_then(|v| v.as_u64()),
    ) {
        (Some(true), Some(n)) => format!("yes ({n})"),
        (Some(true), None) => "yes".into(),
        (Some(false), _) => "no".into(),
        (None, _) => "-".into(),
    }
}

/// Long details (a disk refusal lists every disk) are cut to their first line.
pub(crate) fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::drift_cell;
    use serde_json::json;

    #[test]
    fn the_drift_cell_says_what_serve_knows() {
        assert_eq!(drift_cell(None), "-");
        assert_eq!(drift_cell(Some(&json!(null))), "-");
        assert_eq!(
            drift_cell(Some(&json!({"drifted": false, "changes": 0}))),
            "no"
        );
        assert_eq!(
            drift_cell(Some(&json!({"drifted": true, "changes": 2}))),
            "yes (2)"
        );
    }
}
