//! `talboot node rebuild NAME`: reopen a node's provisioning window and reset it over the
//! Talos API (graceful, wipe STATE and EPHEMERAL, reboot), so its next network boot is
//! provisioned again. Cluster steps already done (bootstrap) are not repeated.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::events::{EventBus, SystemClock};
use crate::inventory::{self, Node};
use crate::machineconfig::renderer::ConfigRenderer;
use crate::provision::{Provisioner, Settings};
use crate::store::{self, Store};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot node`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do with a node.
    #[command(subcommand)]
    pub(crate) action: Action,
}

/// `talboot node` actions.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Action {
    /// Reset the node (wiping STATE and EPHEMERAL) and reprovision it on its next boot.
    Rebuild(RebuildArgs),
    /// Power the node on, off or cycle it, or read its power state (inventory `power:`).
    Power(super::power::PowerArgs),
    /// Choose the node's next boot device: network (PXE) or disk, once or `--persistent`.
    Boot(super::power::BootArgs),
    /// The node's UEFI Secure Boot through its BMC's Redfish `SecureBoot` resource: read its
    /// state, enrol a signing certificate, reset the keys.
    Secureboot(super::node_secureboot::Args),
}

/// Arguments of `talboot node rebuild`.
#[derive(Debug, clap::Args)]
pub(crate) struct RebuildArgs {
    /// Node name from the inventory.
    pub name: String,
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub store: super::args::StoreAccess,
    /// Admin talosconfig (default: `talosconfig` in the state directory).
    #[arg(long, env = "TALOSCONFIG")]
    pub talosconfig: Option<PathBuf>,
    /// talosconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
}

/// Rebuild never renders a config: the node's next boot is provisioned by `talboot serve`.
struct NoRender;

impl ConfigRenderer for NoRender {
    fn render(&self, _node: &Node) -> Result<Vec<u8>, crate::machineconfig::renderer::RenderError> {
        Err(crate::machineconfig::renderer::RenderError::NotDelivered {
            command: "talboot node rebuild",
            instead: "`talboot serve` provisions the node on its next boot",
        })
    }
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    match &args.action {
        Action::Rebuild(a) => rebuild(a),
        Action::Power(a) => super::power::run_power(a),
        Action::Boot(a) => super::power::run_boot(a),
        Action::Secureboot(a) => super::node_secureboot::run(a),
    }
}

fn rebuild(args: &RebuildArgs) -> ExitCode {
    let inventory = match inventory::load(&args.inventory.config) {
        Ok(l) => l.inventory,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    if inventory.node(&args.name).is_none() {
        eprintln!(
            "talboot: node {:?} is not in {}; `talboot check` lists the node names",
            args.name,
            args.inventory.config.display()
        );
        return ExitCode::from(EXIT_INVALID);
    }
    // This command owns the store while it runs: the node, progress and timeline writers
    // go to its provisioner and bus.
    let reach = super::store_flags::open_to_write(
        &args.store,
        inventory.cluster.name.as_str(),
        "node rebuild",
    );
    let (store, writers) = match reach {
        Ok(super::store_flags::Reach::Local(opened)) => (opened.store, opened.writers),
        Ok(super::store_flags::Reach::Serve) => return rebuild_through_serve(args),
        Err(code) => return code,
    };
    // Before any credentials, probe or power request: a node that holds no config from
    // talboot has nothing to reset.
    if let Err(code) = check_rebuildable(store.as_ref(), &args.name) {
        return code;
    }
    let creds = match super::talosconfig_creds(
        args.talosconfig.as_deref(),
        &args.store.state_dir,
        args.context.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    crate::install_crypto_provider();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let settings = Settings::new(args.store.state_dir.clone());
    let name = args.name.clone();
    let inventory_for_power = Arc::new(inventory.clone());
    // Asked before the rebuild: a node that answers is reset over its API, never cycled too.
    let power_fallback =
        super::power::rebuild_needs_power(&inventory_for_power, &name, crate::talos::APID_PORT);
    rt.block_on(async move {
        let result = reset(inventory, store, writers, creds, settings, &name).await;
        report_rebuild(result, power_fallback, &inventory_for_power, &name).await
    })
}

/// Refuses, before anything else, a node that holds no config from talboot.
fn check_rebuildable(store: &dyn Store, name: &str) -> Result<(), ExitCode> {
    match store.node(name) {
        Ok(rec) => {
            let rec = rec.unwrap_or_else(|| store::NodeRecord::unseen(name, 0));
            if let Err(refused) = crate::provision::core::check_rebuild(&rec) {
                eprintln!("talboot: {refused}");
                return Err(ExitCode::from(EXIT_INVALID));
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("talboot: {e}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// Marks the node for rebuild and resets it over its API, the event log flushed after.
async fn reset(
    inventory: crate::inventory::Inventory,
    store: Arc<dyn Store>,
    writers: store::Writers,
    creds: crate::talos::ClientCreds,
    settings: Settings,
    name: &str,
) -> Result<crate::provision::NodeStep, crate::provision::ProvisionError> {
    let (bus, writer) = EventBus::start(writers.events, Arc::new(SystemClock));
    let prov = Provisioner::new(
        Arc::new(inventory),
        store,
        crate::provision::ProvisionWriters {
            nodes: writers.nodes,
            progress: writers.progress,
        },
        bus,
        Arc::new(NoRender),
        creds,
        settings,
    );
    let result = prov.rebuild(name).await;
    drop(prov);
    let _ = writer.await;
    result
}

/// Tells the operator what the rebuild did, power-cycling the node if it did not answer.
async fn report_rebuild(
    result: Result<crate::provision::NodeStep, crate::provision::ProvisionError>,
    power_fallback: bool,
    inventory: &Arc<crate::inventory::Inventory>,
    name: &str,
) -> ExitCode {
    // Nothing to reset (never provisioned, or waiting for its config): no reset, no power
    // cycle, and the operator is told what happens instead.
    if let Err(crate::provision::ProvisionError::RebuildRefused(r)) = &result {
        eprintln!("talboot: {r}");
        return ExitCode::from(EXIT_INVALID);
    }
    if power_fallback {
        let sources = crate::crypto::age::IdentitySources::from_process_env(None);
        match crate::power::fleet::rebuild_by_power(inventory, name, sources).await {
            Ok(done) => {
                println!("{name}: marked for rebuild; {done}; its next boot gets its config again");
                return ExitCode::SUCCESS;
            }
            Err(e) => eprintln!("talboot: {name}: power control failed: {e}"),
        }
    }
    match result {
        Ok(crate::provision::NodeStep::Waiting(why)) => {
            eprintln!(
                "talboot: {name} is marked for rebuild but was not reset yet: {why}\n\
                 `talboot serve` retries the reset; or power-cycle it into network boot"
            );
            ExitCode::from(EXIT_INVALID)
        }
        Ok(step) => {
            println!(
                "{name}: marked for rebuild; provisioning window open ({step:?}); its next \
                 boot gets its config again"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "talboot: {e}\n{name} stays marked for rebuild; `talboot serve` retries the \
                 reset, or power-cycle it into network boot"
            );
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `serve` holds the store: ask its admin API to mark the node; its provisioner resets it.
fn rebuild_through_serve(args: &RebuildArgs) -> ExitCode {
    let url = format!(
        "http://{}/api/nodes/{}/rebuild",
        args.store.admin, args.name
    );
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    crate::install_crypto_provider();
    let client = match super::admin_client::client() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = rt.block_on(async {
        let resp = client.post(&url).send().await?;
        let status = resp.status();
        Ok::<_, reqwest::Error>((status, resp.text().await.unwrap_or_default()))
    });
    match result {
        Ok((status, body)) if status.is_success() => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!(
                "talboot: talboot serve refused the rebuild ({status}): {}",
                body.trim()
            );
            ExitCode::from(EXIT_INVALID)
        }
        Err(e) => {
            eprintln!(
                "talboot: the state store is in use (is `talboot serve` running?) and {url} \
                 did not answer: {e}; pass --admin if serve's --admin-listen is elsewhere"
            );
            ExitCode::from(EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuild_never_renders_and_says_what_delivers_the_config() {
        let inv = crate::inventory::load_with_env(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
            &std::collections::BTreeMap::new(),
        )
        .unwrap()
        .inventory;
        let e = NoRender.render(&inv.nodes[0]).unwrap_err();
        assert!(matches!(
            e,
            crate::machineconfig::renderer::RenderError::NotDelivered {
                command: "talboot node rebuild",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "`talboot node rebuild` does not deliver configs; `talboot serve` provisions the node \
             on its next boot"
        );
    }
}
