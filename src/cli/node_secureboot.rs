//! `talboot node secureboot status NODE`, `talboot node secureboot enroll NODE --cert PEM
//! [--database db] [--enable]` and `reset-keys NODE --type T --yes`: a node's UEFI Secure Boot state and key enrolment through its
//! BMC's Redfish `SecureBoot` resource ([`crate::power::redfish`]). These talk to the BMC
//! directly and touch no node state, so they run the same whether `talboot serve` runs or not.
//! A node whose controller is not Redfish gets what its driver can say (`status`) or the
//! manual path (`enroll`).

use std::path::PathBuf;

use clap::ValueEnum as _;
use std::process::ExitCode;

use crate::inventory::{Inventory, PowerConfig};
use crate::power::redfish::{self, Enrolled, SecureBootError, SecureBootStatus};
use crate::power::secureboot::{EnrolCertificate, enrol_certificate};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot node secureboot`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub action: Action,
}

/// `talboot node secureboot` actions.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Action {
    /// Read the node's Secure Boot state from its BMC: enabled, current boot, mode, and each
    /// key database's certificates (subject, fingerprint) where the BMC exposes them.
    Status(StatusArgs),
    /// Enrol a signing certificate (PEM) into a Secure Boot database over Redfish, and
    /// optionally turn Secure Boot on for the next boot.
    Enroll(EnrollArgs),
    /// Reset the firmware's Secure Boot keys over Redfish (`#SecureBoot.ResetKeys`):
    /// `delete-all-keys` or `delete-pk` put it in Setup Mode (for the Talos Secure Boot ISO's
    /// auto-enrolment); `reset-all-keys-to-default` restores the vendor's keys.
    ResetKeys(ResetKeysArgs),
}

/// The `ResetKeysType` of `#SecureBoot.ResetKeys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ResetKeysType {
    /// All key databases back to the firmware's defaults.
    ResetAllKeysToDefault,
    /// Delete every key database, PK included (Setup Mode).
    DeleteAllKeys,
    /// Delete the Platform Key only (Setup Mode).
    DeletePk,
}

impl ResetKeysType {
    /// The schema's value.
    pub fn as_redfish(self) -> &'static str {
        match self {
            Self::ResetAllKeysToDefault => "ResetAllKeysToDefault",
            Self::DeleteAllKeys => "DeleteAllKeys",
            Self::DeletePk => "DeletePK",
        }
    }
}

/// Arguments of `talboot node secureboot reset-keys`.
#[derive(Debug, clap::Args)]
pub(crate) struct ResetKeysArgs {
    #[command(flatten)]
    pub target: Target,
    /// What to reset.
    #[arg(long = "type", value_enum, value_name = "TYPE")]
    pub kind: ResetKeysType,
    /// Confirm: the firmware's keys change (after a delete it boots anything until keys are
    /// enrolled again).
    #[arg(long)]
    pub yes: bool,
}

/// Where the node and its controller's credentials are found.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// Node name from the inventory.
    pub name: String,
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub power_identity: super::args::PowerIdentity,
}

/// Arguments of `talboot node secureboot status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub target: Target,
}

/// Arguments of `talboot node secureboot enroll`.
#[derive(Debug, clap::Args)]
pub(crate) struct EnrollArgs {
    #[command(flatten)]
    pub target: Target,
    /// The certificate to enrol: one PEM certificate, no private key (for factory UKIs the
    /// Image Factory's signing certificate; for custom UKIs the site's own).
    #[arg(long, value_name = "PEM_FILE")]
    pub cert: PathBuf,
    /// The Secure Boot database to enrol into (`db`, `KEK`, `PK`, as the BMC names them).
    #[arg(long, default_value = "db")]
    pub database: String,
    /// Also set `SecureBootEnable: true` (takes effect on the next boot).
    #[arg(long)]
    pub enable: bool,
}

/// Run `talboot node secureboot`.
pub(crate) fn run(args: &Args) -> ExitCode {
    match &args.action {
        Action::Status(a) => status(a),
        Action::Enroll(a) => enroll(a),
        Action::ResetKeys(a) => reset_keys(a),
    }
}

fn reset_keys(a: &ResetKeysArgs) -> ExitCode {
    let name = a.target.name.as_str();
    let want = a.kind.as_redfish();
    if !a.yes {
        eprintln!(
            "talboot: {name}: reset-keys --type {} changes the firmware's Secure Boot keys \
             ({want}); pass --yes to do it",
            a.kind
                .to_possible_value()
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let (_, driver) = match resolve(&a.target) {
        Ok(r) => r,
        Err(c) => return c,
    };
    let PowerConfig::Redfish(t) = &driver else {
        eprintln!(
            "talboot: {name}: its power controller is {} ({}), which cannot reset Secure Boot \
             keys; use the firmware setup UI",
            driver.kind(),
            driver.target()
        );
        return ExitCode::from(EXIT_INVALID);
    };
    crate::install_crypto_provider();
    let rt = match super::power::runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    match rt.block_on(redfish::with_redfish(t, async |rf| {
        rf.reset_keys(want).await
    })) {
        Ok(()) => {
            println!(
                "{name}: ResetKeys {want} sent; `talboot node secureboot status {name}` shows the mode"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot: {name}: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// The node's resolved controller, with the inventory.
fn resolve(t: &Target) -> Result<(Inventory, crate::power::PowerDriver), ExitCode> {
    let inv = super::power::load(&t.inventory.config)?;
    let driver = super::power::driver_of(&inv, &t.name, &t.inventory, &t.power_identity)?;
    Ok((inv, driver))
}

fn status(a: &StatusArgs) -> ExitCode {
    let name = a.target.name.as_str();
    let (inv, driver) = match resolve(&a.target) {
        Ok(r) => r,
        Err(c) => return c,
    };
    crate::install_crypto_provider();
    let rt = match super::power::runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let wants = inv.node(name).is_some_and(|n| n.secure_boot());
    let PowerConfig::Redfish(t) = &driver else {
        return match rt.block_on(driver.secure_boot()) {
            Ok(p) => {
                println!(
                    "{name}: {} {}: secure boot: {p}",
                    driver.kind(),
                    driver.target()
                );
                if wants && let Some(why) = p.not_enforcing() {
                    println!("{name}: NOT ENFORCED on a `secureBoot: true` node: {why}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("talboot: {name}: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        };
    };
    let result = rt.block_on(redfish::with_redfish(t, async |rf| {
        rf.secure_boot_status().await
    }));
    match result {
        Ok(s) => {
            print!("{}", status_text(name, &s, wants));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot: {name}: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// What `status` prints for a Redfish node.
pub(crate) fn status_text(name: &str, s: &SecureBootStatus, wants: bool) -> String {
    let probe = s.view.probe();
    let mut out = format!("{name}: secure boot: {probe} ({})\n", s.view.path);
    if wants && let Some(why) = probe.not_enforcing() {
        out.push_str(&format!(
            "{name}: NOT ENFORCED on a `secureBoot: true` node: {why}\n"
        ));
    }
    if let Some(k) = &s.view.reset_keys {
        let allowed = k
            .allowed
            .as_ref()
            .map_or("not listed".to_string(), |l| l.join(", "));
        out.push_str(&format!("  ResetKeys: {allowed}\n"));
    }
    if s.view.databases.is_none() {
        out.push_str(
            "  no SecureBootDatabases: keys cannot be enrolled over Redfish on this BMC\n",
        );
    }
    for db in &s.databases {
        match &db.certificates {
            Err(why) => out.push_str(&format!(
                "  {}: certificates unreadable: {why}\n",
                db.view.id
            )),
            Ok(certs) => {
                out.push_str(&format!(
                    "  {}: {} certificate{}\n",
                    db.view.id,
                    certs.len(),
                    if certs.len() == 1 { "" } else { "s" }
                ));
                for c in certs {
                    out.push_str(&format!("    {}\n", certificate_line(c)));
                }
            }
        }
    }
    out
}

fn certificate_line(c: &redfish::CertificateView) -> String {
    let mut parts = vec![
        c.subject
            .clone()
            .unwrap_or_else(|| "subject not exposed".into()),
    ];
    if let Some(f) = &c.sha256 {
        parts.push(format!("sha256 {f}"));
    }
    if let Some((alg, f)) = &c.fingerprint {
        parts.push(format!("BMC fingerprint {alg} {f}"));
    }
    if c.sha256.is_none() && c.fingerprint.is_none() {
        parts.push("fingerprint not exposed".into());
    }
    format!("{} ({})", parts.join(", "), c.path)
}

fn read_cert(name: &str, path: &std::path::Path) -> Result<EnrolCertificate, ExitCode> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        eprintln!("talboot: {name}: cannot read {}: {e}", path.display());
        ExitCode::from(EXIT_USAGE)
    })?;
    enrol_certificate(&text).map_err(|e| {
        eprintln!("talboot: {name}: {}: {e}", path.display());
        ExitCode::from(EXIT_INVALID)
    })
}

fn enroll(a: &EnrollArgs) -> ExitCode {
    let name = a.target.name.as_str();
    let cert = match read_cert(name, &a.cert) {
        Ok(c) => c,
        Err(c) => return c,
    };
    let (_, driver) = match resolve(&a.target) {
        Ok(r) => r,
        Err(c) => return c,
    };
    let PowerConfig::Redfish(t) = &driver else {
        eprintln!(
            "talboot: {name}: its power controller is {} ({}), which cannot enrol Secure Boot keys; \
             only a Redfish BMC can. Enrol the certificate by hand: the firmware setup UI, the \
             Talos Secure Boot ISO booted once in setup mode, or for VMs virt-fw-vars or \
             Proxmox's efidisk0 (docs/operations.md, \"Secure Boot key enrolment\")",
            driver.kind(),
            driver.target()
        );
        return ExitCode::from(EXIT_INVALID);
    };
    crate::install_crypto_provider();
    let rt = match super::power::runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let result = rt.block_on(redfish::with_redfish(t, async |rf| {
        rf.enroll(&a.database, &cert, a.enable).await
    }));
    match result {
        Ok(done) => {
            print!("{}", enrolled_text(name, &cert, &done));
            ExitCode::SUCCESS
        }
        // A refusal names what the BMC lacks and the manual path; a failure, the BMC's answer.
        Err(e @ (SecureBootError::Refused { .. } | SecureBootError::Power(_))) => {
            eprintln!("talboot: {name}: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// What `enroll` prints once the BMC took the certificate.
pub(crate) fn enrolled_text(name: &str, cert: &EnrolCertificate, done: &Enrolled) -> String {
    let mut out = format!(
        "{name}: enrolled {} (sha256 {}) into {}{}\n",
        cert.subject,
        cert.sha256,
        done.database,
        done.location
            .as_deref()
            .map(|l| format!(" at {l}"))
            .unwrap_or_default()
    );
    match &done.stored {
        Some(c) if c.sha256.as_deref() == Some(cert.sha256.as_str()) => {
            out.push_str(&format!("{name}: the BMC reads it back: {}\n", certificate_line(c)));
        }
        Some(c) => out.push_str(&format!(
            "{name}: the BMC reads back {}; it returns no certificate to compare\n",
            certificate_line(c)
        )),
        None => out.push_str(&format!(
            "{name}: the BMC took it but does not list it back; `talboot node secureboot status {name}` shows what it holds\n"
        )),
    }
    if done.enabled {
        out.push_str(&format!(
            "{name}: SecureBootEnable set to true (takes effect on the next boot)\n"
        ));
    }
    out
}
