//! `talboot check`: load and validate an inventory, render every node's machine config and
//! validate each document against the Talos config schema, then print every problem or a
//! summary of the nodes by role.
//!
//! `check` needs no keys: it renders with a throwaway secrets bundle generated in memory (the
//! documents' shape does not depend on key values) and drops it. `gen` and `serve` validate
//! the configs rendered with the real bundle the same way.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::inventory::{self, Inventory, LoadError, NetworkMode, Severity};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub image_cache: super::args::ImageCache,
    /// Folder with the first-stage iPXE binaries served over TFTP.
    #[arg(long, env = "TALBOOT_IPXE_DIR", default_value = super::serve::DEFAULT_IPXE_DIR)]
    pub(crate) ipxe_dir: PathBuf,
    /// Talos config schema (config.schema.json of another Talos release) to validate the
    /// rendered configs against, instead of the embedded Talos v1.13 schema facts.
    #[arg(long = "schema")]
    pub schema: Option<PathBuf>,
    /// Also reach every node's power controller (Redfish, IPMI, Proxmox) and report what
    /// answered; Wake-on-LAN is send-only and reported as such, nothing is sent.
    #[arg(long)]
    pub probe: bool,
    #[command(flatten)]
    pub power_identity: super::args::PowerIdentity,
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    match inventory::load(&args.inventory.config) {
        Ok(loaded) => check_loaded(args, &loaded),
        Err(LoadError::Invalid { path, diagnostics }) => invalid(&path, &diagnostics),
        Err(e @ LoadError::Io { .. }) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Checks the rendered configs of a loaded inventory (and probes its power controllers if
/// asked), printing the summary.
fn check_loaded(args: &Args, loaded: &inventory::Loaded) -> ExitCode {
    for w in loaded.warnings.sorted() {
        eprintln!("{w}");
    }
    let schema = match crate::machineconfig::schema::load_for_inventory(
        args.schema.as_deref(),
        &loaded.inventory,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match render_check(&loaded.inventory, &schema) {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("{w}");
            }
        }
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            eprintln!(
                "{}: invalid: {} problem{} in the rendered machine configs",
                args.inventory.config.display(),
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            );
            return ExitCode::from(EXIT_INVALID);
        }
    }
    print!("{}", summary(&loaded.inventory));
    readiness_notes(&loaded.inventory, args);
    if args.probe {
        let failed =
            super::power::probe_all(&loaded.inventory, args.power_identity.age_identity.clone());
        if failed.unreachable > 0 {
            eprintln!(
                "talboot: check --probe: {} power controller(s) did not answer",
                failed.unreachable
            );
        }
        if failed.not_enforcing > 0 {
            eprintln!(
                "talboot: check --probe: {} `secureBoot: true` node(s) whose firmware will not \
                 enforce Secure Boot (see above)",
                failed.not_enforcing
            );
        }
        if failed != super::power::ProbeFailures::default() {
            return ExitCode::from(EXIT_INVALID);
        }
    }
    let warnings = loaded.warnings.len();
    println!(
        "valid: {} node{} in {} role{}, {warnings} warning{}",
        loaded.inventory.nodes.len(),
        if loaded.inventory.nodes.len() == 1 {
            ""
        } else {
            "s"
        },
        roles_in_use(&loaded.inventory).len(),
        if roles_in_use(&loaded.inventory).len() == 1 {
            ""
        } else {
            "s"
        },
        if warnings == 1 { "" } else { "s" }
    );
    ExitCode::SUCCESS
}

/// Prints the problems of an invalid inventory.
fn invalid(path: &std::path::Path, diagnostics: &inventory::Diagnostics) -> ExitCode {
    for diag in diagnostics.sorted() {
        eprintln!("{diag}");
    }
    let errors = diagnostics.error_count();
    let warnings = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .count();
    eprintln!(
        "{}: invalid: {errors} error{}, {warnings} warning{}",
        path.display(),
        if errors == 1 { "" } else { "s" },
        if warnings == 1 { "" } else { "s" }
    );
    ExitCode::from(EXIT_INVALID)
}

/// Renders every node with a throwaway secrets bundle and validates the documents against
/// `schema`: the warnings, or every problem.
pub(crate) fn render_check(
    inv: &Inventory,
    schema: &crate::machineconfig::schema::Schema,
) -> Result<Vec<String>, Vec<String>> {
    use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, ServiceAccountKeyKind};
    // ECDSA instead of RSA-4096 for the service-account key: same document shape, no
    // seconds-long prime search.
    let options = GenerateOptions {
        service_account_key: ServiceAccountKeyKind::EcdsaP256,
    };
    // Silenced: "generated a new cluster secrets bundle" would mislead here.
    let no_logs = tracing::subscriber::NoSubscriber::default();
    let secrets = tracing::subscriber::with_default(no_logs, || {
        SecretsBundle::generate(time::OffsetDateTime::now_utc(), &options)
    })
    .map_err(|e| {
        vec![format!(
            "talboot: cannot make a throwaway secrets bundle: {e}"
        )]
    })?;
    let rendered = crate::machineconfig::rendered::render_all(inv, &secrets, schema)?;
    tracing::debug!(
        nodes = rendered.configs.len(),
        schema = %schema.source_name(),
        "every rendered machine config is valid"
    );
    Ok(rendered.warnings)
}

/// What `serve` would need that is not there yet: boot artifacts and iPXE binaries. These do
/// not make the inventory invalid, so they are notes, not diagnostics.
fn readiness_notes(inv: &Inventory, args: &Args) {
    let catalog = crate::artifacts::Catalog::load(&args.image_cache.images);
    for r in crate::artifacts::requirements(inv) {
        let problem = match &catalog {
            Ok(c) => crate::artifacts::verify_for(&args.image_cache.images, c, &r.id, r.boots)
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(p) = problem {
            eprintln!("note: boot artifacts not ready: {p}");
        }
    }
    if let Ok(c) = &catalog {
        secure_boot_notes(inv, c);
    }
    let needed = crate::firststage::needed(inv, crate::firststage::Transport::TftpAndHttp);
    let missing = crate::tftp::missing_ipxe_binaries(&args.ipxe_dir, needed);
    if !missing.is_empty() {
        eprintln!(
            "note: iPXE binaries missing from {}: {} (install Debian's `ipxe` package or pass --ipxe-dir)",
            args.ipxe_dir.display(),
            missing.join(", ")
        );
    }
}

/// A `secureBoot: true` node whose architecture's boot set has no signed UKI in the cache: its
/// DHCP answer would carry no boot file (`boot.refused`), so say so now, where it was set.
fn secure_boot_notes(inv: &Inventory, catalog: &crate::artifacts::Catalog) {
    let ukis = crate::dhcp::uki_sets(inv, catalog);
    for n in inv.nodes.iter().filter(|n| n.secure_boot()) {
        let arch = inv.arch_of(n);
        if ukis.get(&arch).is_some_and(|u| u.signed) {
            continue;
        }
        let at = n
            .secure_boot
            .as_ref()
            .map(|s| format!("{}:{}: ", s.loc.file.display(), s.loc.line))
            .unwrap_or_default();
        eprintln!(
            "note: {at}secureBoot: {} boots with Secure Boot but the {arch} boot set of Talos {} \
             has no Secure Boot UKI in the cache, so it would get no boot file; pull the signed \
             UKI (`talboot images pull`) or import the Secure Boot ISO",
            n.name.as_str(),
            inv.cluster.talos_version.value
        );
    }
}

fn roles_in_use(inv: &Inventory) -> Vec<&str> {
    let mut roles: Vec<&str> = Vec::new();
    for n in &inv.nodes {
        if !roles.contains(&n.role.as_str()) {
            roles.push(n.role.as_str());
        }
    }
    roles
}

/// The human summary printed for a valid inventory.
pub fn summary(inv: &Inventory) -> String {
    let c = &inv.cluster;
    let n = &inv.network;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster {} (Talos {}, Kubernetes {}) endpoint {}{}",
        c.name.as_str(),
        c.talos_version.value,
        c.kubernetes_version.value,
        c.endpoint.value,
        c.vip
            .as_ref()
            .map(|v| format!(", VIP {}", v.value))
            .unwrap_or_default()
    );
    network_line(&mut out, n);
    let _ = writeln!(
        out,
        "boot {} delivery, unknown machines: {}, schematic {}",
        inv.boot.delivery,
        inv.boot.unknown_machines,
        c.installer.schematic_id()
    );
    for role in roles_in_use(inv) {
        role_section(&mut out, inv, role);
    }
    out.push('\n');
    out
}

/// The network line of the summary.
fn network_line(out: &mut String, n: &inventory::Network) {
    let ifaces = if n.interfaces.is_empty() {
        "(interface not set)".to_string()
    } else {
        n.interfaces.join(",")
    };
    let _ = writeln!(
        out,
        "network {} DHCP on {ifaces}, subnet {}{}{}{}",
        match n.mode {
            NetworkMode::Authoritative => "authoritative",
            NetworkMode::Proxy => "proxy",
        },
        n.subnet.value,
        n.gateway
            .as_ref()
            .map(|g| format!(", gateway {}", g.value))
            .unwrap_or_default(),
        n.pool
            .as_ref()
            .map(|p| format!(", pool {}", p.value))
            .unwrap_or_default(),
        if n.relays.is_empty() {
            String::new()
        } else {
            format!(
                ", relayed {}",
                n.relays
                    .iter()
                    .map(|r| r.subnet.value.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
}

/// One role of the summary: its header and its nodes' table.
fn role_section(out: &mut String, inv: &Inventory, role: &str) {
    let r = &inv.roles[role];
    let members: Vec<_> = inv
        .nodes
        .iter()
        .filter(|n| n.role.as_str() == role)
        .collect();
    let chain = if r.chain.len() > 1 {
        format!(", extends {}", r.chain[..r.chain.len() - 1].join(" <- "))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\nrole {role} (type {}{chain}, {} node{})",
        r.machine_type,
        members.len(),
        if members.len() == 1 { "" } else { "s" }
    );
    node_table(out, inv, &members);
}

/// The nodes' table of one role, columns as wide as their widest cell.
fn node_table(out: &mut String, inv: &Inventory, members: &[&inventory::Node]) {
    let rows: Vec<[String; 5]> = members
        .iter()
        .map(|node| {
            let macs = node
                .macs
                .iter()
                .map(|m| m.value.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let boot = format!(
                "{}/{}",
                node.firmware.map(|f| f.as_str()).unwrap_or("auto"),
                inv.arch_of(node)
            );
            [
                node.name.value.clone(),
                macs,
                node.address.value.to_string(),
                node.install.to_string(),
                boot,
            ]
        })
        .collect();
    let header = ["NAME", "MAC", "ADDRESS", "INSTALL DISK", "BOOT"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut s = String::from("  ");
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i == 4 {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s
    };
    let _ = writeln!(out, "{}", line(header));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row.each_ref().map(String::as_str)));
    }
}
