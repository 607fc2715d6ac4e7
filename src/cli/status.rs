//! `talboot status`: one line per inventory node from the state store: role, phase, address,
//! Talos version, the disk Talos installs to (as talboot computed it from the node's disks)
//! and the last event -- or, for a Failed node, why it failed (the last event of a failed
//! node is often a later, unrelated probe). While serve runs (it holds the store) the rows
//! come from its admin API, with each node's drift as serve's drift watcher last saw it.
//!
//! On an etcd store an "Appliances" section follows the table: the live appliances with the
//! leader marked, and etcd's health per endpoint, read from etcd itself
//! ([`crate::admin::ha`], the same document as the admin API's `/api/ha`). `--json` prints
//! `{"nodes": [...], "ha": ...}` instead (`ha` null on redb).

use std::process::ExitCode;

use crate::admin::ha::{self, HaStatus};
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
    /// Print JSON instead of tables: `{"nodes": [...], "ha": ...}`, where `ha` is the fleet on
    /// an etcd store (appliances, leader, etcd's health; as the admin API's `/api/ha`) and
    /// null on redb.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
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
    let cluster = inventory.cluster.name.as_str();
    let opened = match super::store_flags::open_to_read(&args.store, cluster) {
        Ok(super::store_flags::Reach::Local(opened)) => opened,
        Ok(super::store_flags::Reach::Serve) => {
            return status_from_serve(args.store.admin, args.json);
        }
        Err(code) => return code,
    };
    let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
    let rows = match rows(&inventory, opened.store.as_ref(), now) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let ha = match (
        &opened.etcd,
        super::store_flags::spec_or_exit(&args.store, cluster),
    ) {
        (Some(etcd), Ok(store::StoreSpec::Etcd(cfg))) => Some(fleet(etcd, &cfg)),
        _ => None,
    };
    let now_ms = crate::events::Clock::now_unix_ms(&crate::events::SystemClock);
    print!("{}", output(&rows, ha.as_ref(), args.json, now_ms));
    ExitCode::SUCCESS
}

/// What `status` prints: the table (and on etcd the Appliances section), or the JSON.
fn output(rows: &[[String; COLUMNS]], ha: Option<&HaStatus>, json: bool, now_ms: u64) -> String {
    if json {
        let doc = serde_json::json!({ "nodes": rows_json(rows), "ha": ha });
        return format!("{doc:#}\n");
    }
    let mut out = render(rows);
    if let Some(ha) = ha {
        out.push('\n');
        out.push_str(&ha_text(ha, now_ms));
    }
    out
}

/// The fleet on etcd, read now: members and leader from etcd, and a health probe of every
/// endpoint (on a runtime of its own; a fact that cannot be read is named in `problems`).
fn fleet(etcd: &std::sync::Arc<store::EtcdStore>, cfg: &store::EtcdConfig) -> HaStatus {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return ha::assemble(None, Err(&e), Err(&e), None),
    };
    rt.block_on(async {
        let (health, problem) = match store::etcd_health::probe(cfg).await {
            Ok(h) => (Some(h), None),
            Err(e) => (None, Some(format!("etcd's health cannot be probed: {e}"))),
        };
        let mut s = ha::gather(etcd.clone(), None, None, health).await;
        s.problems.extend(problem);
        s
    })
}

/// The Appliances section: one row per live appliance (the leader starred, how long it has
/// served), etcd's verdict, one row per etcd endpoint, and what could not be read.
pub(crate) fn ha_text(s: &HaStatus, now_ms: u64) -> String {
    let mut out = String::from("Appliances\n");
    let mut rows =
        vec![["APPLIANCE", "LEADER", "VERSION", "UP", "ADMIN", "HTTP"].map(String::from)];
    for a in &s.appliances {
        rows.push([
            a.name.clone(),
            if a.leader { "*" } else { "" }.into(),
            a.version.clone(),
            served_for(now_ms.saturating_sub(a.started_unix_ms) / 1000),
            a.admin_url.clone(),
            a.http_url.clone(),
        ]);
    }
    out.push_str(&render(&rows));
    match (&s.leader, s.appliances.iter().any(|a| a.leader)) {
        (None, _) => out.push_str("no appliance leads the fleet right now\n"),
        (Some(l), false) => out.push_str(&format!("leader: {l} (not among the live appliances)\n")),
        (Some(_), true) => {}
    }
    if let Some(e) = &s.etcd {
        out.push_str(&format!("\n{}\n", e.summary));
        let mut rows =
            vec![["ETCD ENDPOINT", "UP", "LEADER", "DB SIZE", "ERRORS"].map(String::from)];
        for p in &e.endpoints {
            rows.push([
                p.url.clone(),
                if p.up { "yes" } else { "no" }.into(),
                if p.leader { "*" } else { "" }.into(),
                p.db_size.map_or_else(|| "-".into(), |b| format!("{b} B")),
                if p.errors.is_empty() {
                    "-".into()
                } else {
                    p.errors.join("; ")
                },
            ]);
        }
        out.push_str(&render(&rows));
    }
    for p in &s.problems {
        out.push_str(&format!("problem: {p}\n"));
    }
    out
}

/// `3d4h`, `2h5m`, `4m10s`, `12s`: how long an appliance has served.
fn served_for(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// The node rows as JSON objects keyed by the header (lower case, `_` for spaces).
fn rows_json(rows: &[[String; COLUMNS]]) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let Some((header, body)) = rows.split_first() else {
        return Vec::new();
    };
    let keys: Vec<String> = header
        .iter()
        .map(|h| h.to_lowercase().replace(' ', "_"))
        .collect();
    body.iter()
        .map(|r| {
            keys.iter()
                .zip(r)
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .collect()
}

/// The status table, one row per inventory node in file order; a lease counts as the node's
/// address while it holds it at `now_unix`.
pub fn table(
    inventory: &Inventory,
    store: &dyn Store,
    now_unix: u64,
) -> Result<String, store::StoreError> {
    rows(inventory, store, now_unix).map(|r| render(&r))
}

/// The rows of [`table`], header first.
fn rows(
    inventory: &Inventory,
    store: &dyn Store,
    now_unix: u64,
) -> Result<Vec<[String; COLUMNS]>, store::StoreError> {
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
    Ok(rows)
}

/// The install disk recorded with the node's facts, `-` before one was chosen.
fn install_disk(store: &dyn Store, node: &str) -> String {
    crate::store::NodeFacts::load(store, node)
        .map(|f| f.install_disk)
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// Align the rows into columns (the last column is left ragged).
pub(crate) fn render<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.first().map_or(0, |r| r.as_ref().len());
    let mut widths = vec![0usize; columns.saturating_sub(1)];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.as_ref().iter().enumerate() {
            if i + 1 < columns {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                out.push_str(cell);
            }
        }
        out.push('\n');
    }
    out
}

/// `serve` holds the store (redb): read the same facts from its admin API's `/api/nodes`.
fn status_from_serve(admin: std::net::SocketAddr, json: bool) -> ExitCode {
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
    print!("{}", output(&api_rows(&nodes), None, json, 0));
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
    use super::*;
    use crate::store::Member;
    use crate::store::election::Candidate;
    use serde_json::json;

    fn member(name: &str, started_unix_ms: u64) -> Member {
        Member {
            name: name.into(),
            admin_url: format!("http://{name}:9090"),
            http_url: format!("http://{name}:8080"),
            version: "1.2.3".into(),
            started_unix_ms,
        }
    }

    #[test]
    fn the_appliances_section_stars_the_leader_and_names_what_failed() {
        let members: Result<_, String> = Ok(vec![member("b", 0), member("a", 55_000)]);
        let leader: Result<_, String> = Ok(Some(Candidate {
            name: "a".into(),
            admin_url: "http://a:9090".into(),
        }));
        let s = ha::assemble(None, members, leader, None);
        let text = ha_text(&s, 3_725_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Appliances");
        assert!(lines[1].starts_with("APPLIANCE  LEADER"), "{text}");
        assert!(
            lines[2].starts_with("a          *       1.2.3    1h1m"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("b                  1.2.3    1h2m"),
            "{text}"
        );
        assert_eq!(lines.len(), 4, "{text}");

        let members: Result<Vec<Member>, _> = Err("no quorum");
        let leader: Result<Option<Candidate>, _> = Err("no quorum");
        let text = ha_text(&ha::assemble(None, members, leader, None), 0);
        assert!(text.contains("no appliance leads"), "{text}");
        assert!(
            text.contains("problem: the appliances cannot be listed: no quorum"),
            "{text}"
        );
    }

    #[test]
    fn json_carries_the_nodes_by_column_and_the_fleet() {
        let rows = [
            [
                "NODE",
                "ROLE",
                "PHASE",
                "ADDRESS",
                "TALOS",
                "DISK",
                "DRIFT",
                "LAST EVENT",
            ]
            .map(String::from),
            [
                "n1", "cp", "ready", "10.0.0.2", "v1.9", "/dev/sda", "-", "boot: x",
            ]
            .map(String::from),
        ];
        let doc: serde_json::Value = serde_json::from_str(&output(&rows, None, true, 0)).unwrap();
        assert_eq!(doc["nodes"][0]["last_event"], "boot: x");
        assert_eq!(doc["ha"], serde_json::Value::Null);
        let members: Result<_, String> = Ok(vec![member("a", 0)]);
        let s = ha::assemble(None, members, Ok::<_, String>(None), None);
        let doc: serde_json::Value =
            serde_json::from_str(&output(&rows, Some(&s), true, 0)).unwrap();
        assert_eq!(doc["ha"]["appliances"][0]["name"], "a");
        let text = output(&rows, Some(&s), false, 0);
        assert!(text.contains("\nAppliances\n"), "{text}");
    }

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
