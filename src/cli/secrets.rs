//! `talboot secrets init`: create the cluster secrets bundle, age-encrypted to the inventory's
//! recipients; and [`load_bundle`], how every command reads the bundle back (age file, or a
//! SOPS file such as talhelper's `talsecret.sops.yaml`). Plaintext never touches disk.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use thiserror::Error;
use time::OffsetDateTime;

use crate::crypto::age::{self, AgeError, Identities, IdentitySources};
use crate::crypto::sops::{self, SopsError};
use crate::inventory::{self, Inventory, LoadError};
use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, SecretsError};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot secrets`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: SecretsCommand,
}

/// `talboot secrets` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SecretsCommand {
    /// Generate a new secrets bundle and write it age-encrypted to `cluster.secrets.file`,
    /// for the recipients in `cluster.secrets.ageRecipients`. Refuses to overwrite.
    Init(InitArgs),
}

/// Arguments of `talboot secrets init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
}

/// Why the secrets bundle could not be read.
#[derive(Debug, Error)]
pub(crate) enum LoadBundleError {
    /// The file is missing or unreadable.
    #[error(
        "cannot read the secrets bundle {}: {source}; create it with `talboot secrets init -c <inventory>`",
        .path.display()
    )]
    Read {
        /// The bundle file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No identity could decrypt the bundle.
    #[error(
        "cannot decrypt the secrets bundle {} (encrypted to {recipients}): {reason}; identities \
         tried: {tried}. Pass --age-identity FILE, or set SOPS_AGE_KEY_FILE or SOPS_AGE_KEY",
        .path.display()
    )]
    Decrypt {
        /// The bundle file.
        path: PathBuf,
        /// Recipients the inventory names (or the file's, for SOPS).
        recipients: String,
        /// Locations identities were looked for, with what was found.
        tried: String,
        /// Decryption error.
        reason: String,
    },
    /// The file is plaintext YAML: we never keep plaintext secrets on disk.
    #[error(
        "{} holds the secrets bundle in plaintext; encrypt it (`sops encrypt --age <recipient> \
         -i {}`, or age-encrypt it to a `.age` file) and delete the plaintext copy",
        .path.display(), .path.display()
    )]
    Plaintext {
        /// The bundle file.
        path: PathBuf,
    },
    /// The decrypted content is not a valid bundle.
    #[error("{}: {source}", .path.display())]
    Invalid {
        /// The bundle file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: SecretsError,
    },
}

/// Reads the inventory's secrets bundle: `.age` files are age-decrypted, YAML with a `sops:`
/// key is SOPS-decrypted (talhelper's `talsecret.sops.yaml`); identities come from `sources`.
pub(crate) fn load_bundle(
    inv: &Inventory,
    sources: &IdentitySources,
) -> Result<SecretsBundle, LoadBundleError> {
    let path = inv.cluster.secrets.file.clone();
    let bytes = std::fs::read(&path).map_err(|source| LoadBundleError::Read {
        path: path.clone(),
        source,
    })?;
    let recipients = if inv.cluster.secrets.age_recipients.is_empty() {
        "the recipients in the file".to_owned()
    } else {
        inv.cluster.secrets.age_recipients.join(", ")
    };
    let ids = Identities::load(sources).map_err(|e| LoadBundleError::Decrypt {
        path: path.clone(),
        recipients: recipients.clone(),
        tried: describe_sources(sources),
        reason: e.to_string(),
    })?;
    let decrypt_failed = |reason: String| LoadBundleError::Decrypt {
        path: path.clone(),
        recipients: recipients.clone(),
        tried: ids.describe_tried(),
        reason,
    };
    let is_age = path.extension().is_some_and(|e| e == "age")
        || bytes.starts_with(b"age-encryption.org/")
        || bytes.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----");
    let text = if is_age {
        let plain = age::decrypt(&bytes, &ids).map_err(|e| decrypt_failed(e.to_string()))?;
        String::from_utf8(plain.expose().to_vec()).map_err(|_| LoadBundleError::Invalid {
            path: path.clone(),
            source: SecretsError::Yaml("decrypted content is not UTF-8".into()),
        })?
    } else {
        let text = String::from_utf8(bytes)
            .map_err(|_| LoadBundleError::Plaintext { path: path.clone() })?;
        // Before the sniff below, so a too-deep file is not reported as plaintext.
        crate::nesting::check_yaml(&text).map_err(|e| LoadBundleError::Invalid {
            path: path.clone(),
            source: SecretsError::Yaml(e.to_string()),
        })?;
        let first: Option<yaml_serde::Value> = yaml_serde::from_str(&text).ok();
        if !first.as_ref().is_some_and(sops::is_sops_file) {
            return Err(LoadBundleError::Plaintext { path });
        }
        let docs = sops::decrypt_yaml(&text, &path, &ids)
            .map_err(|e: SopsError| decrypt_failed(e.to_string()))?;
        let doc = docs
            .documents()
            .first()
            .cloned()
            .unwrap_or(yaml_serde::Value::Null);
        yaml_serde::to_string(&doc).map_err(|e| LoadBundleError::Invalid {
            path: path.clone(),
            source: SecretsError::Yaml(e.to_string()),
        })?
    };
    SecretsBundle::from_yaml(&text).map_err(|source| LoadBundleError::Invalid { path, source })
}

/// The identity locations `sources` names, for an error when none loaded.
fn describe_sources(sources: &IdentitySources) -> String {
    let mut out = Vec::new();
    if let Some(p) = &sources.explicit {
        out.push(format!("--age-identity {}", p.display()));
    }
    if sources.sops_age_key.is_some() {
        out.push("SOPS_AGE_KEY".into());
    }
    if let Some(p) = &sources.sops_age_key_file {
        out.push(format!("SOPS_AGE_KEY_FILE={}", p.display()));
    }
    if let Some(p) = sources.default_keys_path() {
        out.push(p.display().to_string());
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// Errors of `secrets init`.
#[derive(Debug, Error)]
pub(crate) enum InitError {
    /// The target exists.
    #[error(
        "{} already exists; talboot never overwrites a secrets bundle (a new one would orphan \
         every node). Move it away first if you really mean to start over",
        .0.display()
    )]
    Exists(PathBuf),
    /// No recipients to encrypt to.
    #[error(
        "the inventory names no age recipients; add `cluster.secrets.ageRecipients: [age1...]` \
         (create a key with `age-keygen -o key.txt`)"
    )]
    NoRecipients,
    /// Generation failed.
    #[error(transparent)]
    Generate(#[from] SecretsError),
    /// Encryption or the write failed.
    #[error(transparent)]
    Write(#[from] AgeError),
    /// The directory could not be created.
    #[error("cannot create {}: {source}", .path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Generates a bundle (CA validity from `now`) and writes it age-encrypted to `path`.
pub(crate) fn init_bundle(
    path: &Path,
    recipients: &[String],
    now: OffsetDateTime,
) -> Result<(), InitError> {
    init_bundle_with(path, recipients, now, &GenerateOptions::default())
}

/// [`init_bundle`] with the bundle's key choices.
pub(crate) fn init_bundle_with(
    path: &Path,
    recipients: &[String],
    now: OffsetDateTime,
    options: &GenerateOptions,
) -> Result<(), InitError> {
    if path.exists() {
        return Err(InitError::Exists(path.to_path_buf()));
    }
    if recipients.is_empty() {
        return Err(InitError::NoRecipients);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| InitError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let bundle = SecretsBundle::generate(now, options)?;
    let plain = zeroize::Zeroizing::new(bundle.to_yaml());
    age::write_encrypted(path, plain.as_bytes(), recipients)?;
    tracing::info!(file = %path.display(), recipients = recipients.len(), "wrote the encrypted secrets bundle");
    Ok(())
}

/// Run `talboot secrets`.
pub fn run(args: &Args) -> ExitCode {
    match &args.command {
        SecretsCommand::Init(a) => run_init(a),
    }
}

fn run_init(args: &InitArgs) -> ExitCode {
    let inv = match load_inventory(&args.inventory.config) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let path = &inv.cluster.secrets.file;
    match init_bundle(
        path,
        &inv.cluster.secrets.age_recipients,
        OffsetDateTime::now_utc(),
    ) {
        Ok(()) => {
            println!(
                "wrote {} (age, {} recipient{})",
                path.display(),
                inv.cluster.secrets.age_recipients.len(),
                if inv.cluster.secrets.age_recipients.len() == 1 {
                    ""
                } else {
                    "s"
                }
            );
            ExitCode::SUCCESS
        }
        Err(e @ (InitError::Exists(_) | InitError::NoRecipients)) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_INVALID)
        }
        Err(e) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Loads an inventory for a command, printing diagnostics; `Err` carries the exit code.
pub(crate) fn load_inventory(path: &Path) -> Result<Inventory, ExitCode> {
    match inventory::load(path) {
        Ok(loaded) => {
            for w in loaded.warnings.sorted() {
                eprintln!("{w}");
            }
            Ok(loaded.inventory)
        }
        Err(LoadError::Invalid { path, diagnostics }) => {
            for d in diagnostics.sorted() {
                eprintln!("{d}");
            }
            eprintln!(
                "{}: invalid inventory; run `talboot check -c {}`",
                path.display(),
                path.display()
            );
            Err(ExitCode::from(EXIT_INVALID))
        }
        Err(e) => {
            eprintln!("talboot: {e}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_identity() -> (age::Identities, String, String) {
        let id = ::age::x25519::Identity::generate();
        let recipient = id.to_public().to_string();
        let text = zeroize::Zeroizing::new(
            ::age::secrecy::ExposeSecret::expose_secret(&id.to_string()).to_owned(),
        );
        let ids = Identities::from_text("test", &text).unwrap();
        (ids, recipient, text.to_string())
    }

    #[test]
    fn init_writes_ciphertext_only_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets/c.age");
        let (ids, recipient, _) = test_identity();
        let now = OffsetDateTime::now_utc();
        init_bundle(&path, std::slice::from_ref(&recipient), now).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----"));
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("bootstraptoken") && !text.contains("BEGIN CERTIFICATE"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let plain = age::decrypt(&bytes, &ids).unwrap();
        SecretsBundle::from_yaml(std::str::from_utf8(plain.expose()).unwrap()).unwrap();

        let before = std::fs::read(&path).unwrap();
        let err = init_bundle(&path, &[recipient], now).unwrap_err();
        assert!(matches!(err, InitError::Exists(_)), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let err = init_bundle(&dir.path().join("x.age"), &[], now).unwrap_err();
        assert!(matches!(err, InitError::NoRecipients));
    }
}
