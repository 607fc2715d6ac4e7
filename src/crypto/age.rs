//! age encryption for secrets at rest, and the age identities that decrypt them.
//!
//! Identities are looked up the way sops looks them up, so an operator's existing setup works
//! unchanged: an explicit `--age-identity PATH`, then `SOPS_AGE_KEY` (key text, several keys
//! and `#` comments allowed), then `SOPS_AGE_KEY_FILE`, then
//! `$XDG_CONFIG_HOME/sops/age/keys.txt` (or `~/.config/sops/age/keys.txt`). Every location is
//! recorded with what was found there, so a failed decryption can say exactly where talboot
//! looked. The environment is passed in as an [`IdentitySources`] value; only
//! [`IdentitySources::from_process_env`] reads the real process environment.
//!
//! Plaintext lives only in memory, in [`Secret`] buffers that are zeroed on drop. Files are
//! written only as age ciphertext ([`write_encrypted`]).

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ::age::armor::{ArmoredReader, ArmoredWriter, Format};
use ::age::x25519;
use zeroize::Zeroizing;

/// Decrypted bytes, zeroed when dropped and never shown by `Debug`.
pub struct Secret(Zeroizing<Vec<u8>>);

impl Secret {
    /// Wraps bytes that must not leak.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The plaintext. Keep the borrow short and never log it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes (not secret).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret([REDACTED; {} bytes])", self.0.len())
    }
}

/// Errors from age encryption, decryption and identity loading. None carries key material or
/// plaintext.
#[derive(Debug, thiserror::Error)]
pub enum AgeError {
    /// The `--age-identity` file could not be used.
    #[error(
        "cannot use the age identity file given with --age-identity ({}): {reason}",
        .path.display()
    )]
    ExplicitIdentity {
        /// The path that was given.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// In-memory identity text is not a valid identity list.
    #[error("age identities from {location} are invalid: {reason}")]
    InvalidIdentities {
        /// Where the text came from.
        location: String,
        /// What is wrong (a line number, never the content).
        reason: BadIdentityLine,
    },
    /// A recipient string is not an X25519 age recipient.
    #[error("`{0}` is not an age recipient: expected an X25519 public key starting with `age1`")]
    InvalidRecipient(String),
    /// `encrypt` was called without recipients.
    #[error("no age recipients given: a secret must be encrypted to at least one `age1…` key")]
    NoRecipients,
    /// The input is neither a binary age file nor ASCII-armored age.
    #[error(
        "not an age-encrypted file (expected `age-encryption.org/v1` or \
         `-----BEGIN AGE ENCRYPTED FILE-----`): {0}"
    )]
    NotAge(String),
    /// No loaded identity could unwrap the file key.
    #[error(
        "none of the age identities tried can decrypt it. Tried: {tried}. \
         Pass the right key with --age-identity, SOPS_AGE_KEY or SOPS_AGE_KEY_FILE"
    )]
    NoMatchingIdentity {
        /// Every identity location and what was found there.
        tried: String,
    },
    /// The file key was recovered but the payload does not authenticate.
    #[error("the age file is corrupt or was tampered with: {0}")]
    Corrupt(String),
    /// Encryption failed (I/O into memory, or the age library refused).
    #[error("age encryption failed: {0}")]
    Encrypt(String),
    /// Reading or writing an encrypted file failed.
    #[error("{}: {source}", .path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong with it.
        #[source]
        source: Box<AgeError>,
    },
    /// An I/O error on an encrypted file.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Atomic write of ciphertext failed.
    #[error(transparent)]
    Write(#[from] crate::fsutil::AtomicWriteError),
}

/// Where age identities may come from; the CLI fills it from its flags and the environment.
#[derive(Clone, Default)]
pub struct IdentitySources {
    /// `--age-identity PATH`.
    pub explicit: Option<PathBuf>,
    /// The value of `SOPS_AGE_KEY` (identity text; secret).
    pub sops_age_key: Option<Zeroizing<String>>,
    /// The value of `SOPS_AGE_KEY_FILE`.
    pub sops_age_key_file: Option<PathBuf>,
    /// The value of `XDG_CONFIG_HOME`.
    pub xdg_config_home: Option<PathBuf>,
    /// The value of `HOME`.
    pub home: Option<PathBuf>,
}

impl fmt::Debug for IdentitySources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentitySources")
            .field("explicit", &self.explicit)
            .field(
                "sops_age_key",
                &self.sops_age_key.as_ref().map(|_| "[REDACTED]"),
            )
            .field("sops_age_key_file", &self.sops_age_key_file)
            .field("xdg_config_home", &self.xdg_config_home)
            .field("home", &self.home)
            .finish()
    }
}

impl IdentitySources {
    /// Reads `SOPS_AGE_KEY`, `SOPS_AGE_KEY_FILE`, `XDG_CONFIG_HOME` and `HOME` from the process
    /// environment (the adapter the CLI uses). Empty variables count as unset, as in sops.
    pub(crate) fn from_process_env(explicit: Option<PathBuf>) -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Self {
            explicit,
            sops_age_key: var("SOPS_AGE_KEY")
                .map(|v| Zeroizing::new(v.to_string_lossy().into_owned())),
            sops_age_key_file: var("SOPS_AGE_KEY_FILE").map(PathBuf::from),
            xdg_config_home: var("XDG_CONFIG_HOME").map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
        }
    }

    /// sops's default key file: `<user config dir>/sops/age/keys.txt`, where the user config
    /// dir is `$XDG_CONFIG_HOME` when set to an absolute path, else `$HOME/.config`.
    pub(crate) fn default_keys_path(&self) -> Option<PathBuf> {
        let config = match &self.xdg_config_home {
            Some(x) if x.is_absolute() => x.clone(),
            _ => self.home.as_ref()?.join(".config"),
        };
        Some(config.join("sops").join("age").join("keys.txt"))
    }
}

/// What was found at one identity location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The flag was not given.
    NotGiven,
    /// The environment variable was not set.
    NotSet,
    /// The file does not exist.
    Missing,
    /// This many identities were loaded.
    Loaded(usize),
    /// The file exists but could not be read.
    Unreadable(String),
    /// The content is not a valid identity list (the reason never quotes key material).
    Invalid(BadIdentityLine),
}

/// A keys.txt line that is not an identity talboot can use; names the line number, never the
/// line (it may be key material).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadIdentityLine {
    /// An `AGE-PLUGIN-…` identity.
    #[error("line {line} is an age plugin identity, which talboot does not support")]
    Plugin {
        /// The line number, counting from 1.
        line: usize,
    },
    /// Anything else that is not `AGE-SECRET-KEY-1…`.
    #[error("line {line} is not an X25519 age identity (AGE-SECRET-KEY-1…)")]
    NotX25519 {
        /// The line number, counting from 1.
        line: usize,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::NotGiven => f.write_str("not given"),
            Outcome::NotSet => f.write_str("not set"),
            Outcome::Missing => f.write_str("missing"),
            Outcome::Loaded(1) => f.write_str("1 identity"),
            Outcome::Loaded(n) => write!(f, "{n} identities"),
            Outcome::Unreadable(why) => write!(f, "unreadable: {why}"),
            Outcome::Invalid(why) => write!(f, "invalid: {why}"),
        }
    }
}

/// One identity location and what was found there, e.g.
/// `SOPS_AGE_KEY_FILE=/x/keys.txt (1 identity)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    /// The location: a flag, a variable (with its path value) or a file path.
    pub location: String,
    /// What was found there.
    pub outcome: Outcome,
}

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.location, self.outcome)
    }
}

/// The age identities available for decryption, with the record of where they were looked up.
#[derive(Clone, Default)]
pub struct Identities {
    keys: Vec<x25519::Identity>,
    tried: Vec<Tried>,
}

impl fmt::Debug for Identities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only public keys and locations: never the secret keys.
        f.debug_struct("Identities")
            .field("recipients", &self.recipients())
            .field("tried", &self.tried)
            .finish()
    }
}

impl Identities {
    /// Loads identities from every location in `sources`, in sops's order, recording each.
    ///
    /// An unusable `--age-identity` file is an error: the operator asked for it. Problems at
    /// the other locations are recorded (and logged without content) and the search goes on,
    /// so one stale variable does not hide a working key elsewhere.
    pub fn load(sources: &IdentitySources) -> Result<Self, AgeError> {
        let mut ids = Identities::default();

        match &sources.explicit {
            None => ids.record("--age-identity".into(), Outcome::NotGiven),
            Some(path) => {
                let location = format!("--age-identity {}", path.display());
                match read_identity_file(path) {
                    Ok(keys) if keys.is_empty() => {
                        return Err(AgeError::ExplicitIdentity {
                            path: path.clone(),
                            reason: "it contains no AGE-SECRET-KEY-1… line".into(),
                        });
                    }
                    Ok(keys) => ids.add(location, keys),
                    Err(outcome) => {
                        return Err(AgeError::ExplicitIdentity {
                            path: path.clone(),
                            reason: outcome.to_string(),
                        });
                    }
                }
            }
        }

        match &sources.sops_age_key {
            None => ids.record("SOPS_AGE_KEY".into(), Outcome::NotSet),
            Some(text) => match parse_identities(text) {
                Ok(keys) => ids.add("SOPS_AGE_KEY".into(), keys),
                Err(why) => ids.record("SOPS_AGE_KEY".into(), Outcome::Invalid(why)),
            },
        }

        match &sources.sops_age_key_file {
            None => ids.record("SOPS_AGE_KEY_FILE".into(), Outcome::NotSet),
            Some(path) => {
                let location = format!("SOPS_AGE_KEY_FILE={}", path.display());
                match read_identity_file(path) {
                    Ok(keys) => ids.add(location, keys),
                    Err(outcome) => ids.record(location, outcome),
                }
            }
        }

        match sources.default_keys_path() {
            None => ids.record(
                "~/.config/sops/age/keys.txt".into(),
                Outcome::Unreadable("neither XDG_CONFIG_HOME nor HOME is set".into()),
            ),
            Some(path) => {
                let location = path.display().to_string();
                match read_identity_file(&path) {
                    Ok(keys) => ids.add(location, keys),
                    Err(outcome) => ids.record(location, outcome),
                }
            }
        }

        Ok(ids)
    }

    /// Parses identity text (a keys.txt file: `#` comments, blank lines and
    /// `AGE-SECRET-KEY-1…` lines) held in memory; `location` names it in error messages.
    pub(crate) fn from_text(location: &str, text: &str) -> Result<Self, AgeError> {
        let keys = parse_identities(text).map_err(|reason| AgeError::InvalidIdentities {
            location: location.into(),
            reason,
        })?;
        let mut ids = Identities::default();
        ids.add(location.into(), keys);
        Ok(ids)
    }

    fn add(&mut self, location: String, keys: Vec<x25519::Identity>) {
        self.record(location, Outcome::Loaded(keys.len()));
        self.keys.extend(keys);
    }

    fn record(&mut self, location: String, outcome: Outcome) {
        if matches!(outcome, Outcome::Unreadable(_) | Outcome::Invalid(_)) {
            tracing::warn!(%location, %outcome, "age identity location not usable");
        }
        self.tried.push(Tried { location, outcome });
    }

    /// The public keys (`age1…`) of the loaded identities: safe to show.
    pub fn recipients(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| k.to_public().to_string())
            .collect()
    }

    /// Every location looked at, in order.
    pub fn tried(&self) -> &[Tried] {
        &self.tried
    }

    /// The tried locations as one line, for error messages.
    pub(crate) fn describe_tried(&self) -> String {
        let parts: Vec<String> = self.tried.iter().map(Tried::to_string).collect();
        parts.join(", ")
    }

    /// Whether no identity was loaded at all.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The loaded identities as keys.txt text (one `AGE-SECRET-KEY-1…` line each), for
    /// handing them to another consumer such as Argo CD's `sops-age` Secret.
    pub(crate) fn to_keys_text(&self) -> Secret {
        use ::age::secrecy::ExposeSecret;
        let mut text = Zeroizing::new(String::new());
        for k in &self.keys {
            text.push_str(k.to_string().expose_secret());
            text.push('\n');
        }
        Secret::new(text.as_bytes().to_vec())
    }

    fn as_dyn(&self) -> impl Iterator<Item = &dyn ::age::Identity> {
        self.keys.iter().map(|k| k as &dyn ::age::Identity)
    }
}

/// Reads and parses an identity file; a missing file or a parse failure becomes the outcome
/// to record.
fn read_identity_file(path: &Path) -> Result<Vec<x25519::Identity>, Outcome> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => Zeroizing::new(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Outcome::Missing),
        Err(e) => return Err(Outcome::Unreadable(e.to_string())),
    };
    parse_identities(&text).map_err(Outcome::Invalid)
}

/// Parses keys.txt content. The error names a line number, never the line.
fn parse_identities(text: &str) -> Result<Vec<x25519::Identity>, BadIdentityLine> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match x25519::Identity::from_str(line) {
            Ok(k) => keys.push(k),
            Err(_) if line.starts_with("AGE-PLUGIN-") => {
                return Err(BadIdentityLine::Plugin { line: n + 1 });
            }
            Err(_) => {
                return Err(BadIdentityLine::NotX25519 { line: n + 1 });
            }
        }
    }
    Ok(keys)
}

/// Encrypts `plaintext` to every recipient (`age1…`) and returns ASCII-armored age.
pub fn encrypt<S: AsRef<str>>(plaintext: &[u8], recipients: &[S]) -> Result<Vec<u8>, AgeError> {
    if recipients.is_empty() {
        return Err(AgeError::NoRecipients);
    }
    let parsed = recipients
        .iter()
        .map(|r| {
            let r = r.as_ref().trim();
            x25519::Recipient::from_str(r).map_err(|_| AgeError::InvalidRecipient(r.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let encryptor =
        ::age::Encryptor::with_recipients(parsed.iter().map(|r| r as &dyn ::age::Recipient))
            .map_err(|e| AgeError::Encrypt(e.to_string()))?;
    let mut out = Vec::with_capacity(plaintext.len() + 512);
    let enc_err = |e: std::io::Error| AgeError::Encrypt(e.to_string());
    let armor = ArmoredWriter::wrap_output(&mut out, Format::AsciiArmor).map_err(enc_err)?;
    let mut writer = encryptor.wrap_output(armor).map_err(enc_err)?;
    writer.write_all(plaintext).map_err(enc_err)?;
    writer.finish().and_then(|a| a.finish()).map_err(enc_err)?;
    Ok(out)
}

/// Decrypts binary or ASCII-armored age with any of `ids`.
pub fn decrypt(ciphertext: &[u8], ids: &Identities) -> Result<Secret, AgeError> {
    use ::age::DecryptError as D;
    let decryptor =
        ::age::Decryptor::new_buffered(ArmoredReader::new(ciphertext)).map_err(|e| match e {
            D::InvalidHeader | D::UnknownFormat | D::Io(_) => AgeError::NotAge(e.to_string()),
            other => AgeError::Corrupt(other.to_string()),
        })?;
    let mut reader = decryptor.decrypt(ids.as_dyn()).map_err(|e| match e {
        D::NoMatchingKeys => AgeError::NoMatchingIdentity {
            tried: ids.describe_tried(),
        },
        other => AgeError::Corrupt(other.to_string()),
    })?;
    let mut plain = Zeroizing::new(Vec::new());
    reader
        .read_to_end(&mut plain)
        .map_err(|e| AgeError::Corrupt(e.to_string()))?;
    Ok(Secret(plain))
}

/// Encrypts `plaintext` to `recipients` and atomically writes the armored ciphertext to
/// `path` with mode 0600. Only ciphertext reaches the disk.
pub fn write_encrypted<S: AsRef<str>>(
    path: &Path,
    plaintext: &[u8],
    recipients: &[S],
) -> Result<(), AgeError> {
    let armored = encrypt(plaintext, recipients).map_err(|e| AgeError::File {
        path: path.to_path_buf(),
        source: Box::new(e),
    })?;
    crate::fsutil::write_atomic(path, &armored, 0o600)?;
    Ok(())
}

/// Reads an age file (binary or armored) and decrypts it in memory.
pub fn read_encrypted(path: &Path, ids: &Identities) -> Result<Secret, AgeError> {
    let bytes = std::fs::read(path).map_err(|source| AgeError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decrypt(&bytes, ids).map_err(|e| AgeError::File {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::age::secrecy::ExposeSecret;

    fn keypair() -> (String, String) {
        let id = x25519::Identity::generate();
        let secret = id.to_string().expose_secret().to_string();
        (secret, id.to_public().to_string())
    }

    fn sources_in(dir: &Path) -> IdentitySources {
        IdentitySources {
            home: Some(dir.join("home")),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_in_memory() {
        let (secret, public) = keypair();
        let ids = Identities::from_text("test", &secret).unwrap();
        let armored = encrypt(b"cluster secrets", &[public.as_str()]).unwrap();
        assert!(armored.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----"));
        let plain = decrypt(&armored, &ids).unwrap();
        assert_eq!(plain.expose(), b"cluster secrets");
    }

    #[test]
    fn secret_debug_is_redacted() {
        let s = Secret::new(b"hunter2".to_vec());
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(dbg.contains("7 bytes"), "{dbg}");
    }

    #[test]
    fn identities_debug_shows_only_public_keys() {
        let (secret, public) = keypair();
        let ids = Identities::from_text("inline", &secret).unwrap();
        let dbg = format!("{ids:?}");
        assert!(dbg.contains(&public), "{dbg}");
        assert!(!dbg.contains(&secret), "{dbg}");
        let src = IdentitySources {
            sops_age_key: Some(Zeroizing::new(secret.clone())),
            ..Default::default()
        };
        assert!(!format!("{src:?}").contains(&secret));
    }

    #[test]
    fn key_text_with_comments_and_several_keys() {
        let (s1, p1) = keypair();
        let (s2, p2) = keypair();
        let text = format!("# created: today\n# public key: {p1}\n{s1}\n\n  {s2}  \n");
        let ids = Identities::from_text("SOPS_AGE_KEY", &text).unwrap();
        assert_eq!(ids.recipients(), vec![p1, p2]);
    }

    #[test]
    fn invalid_key_text_names_line_not_content() {
        let text = "# comment\nAGE-SECRET-KEY-1NOTAVALIDKEYATALL\n";
        let err = Identities::from_text("SOPS_AGE_KEY", text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SOPS_AGE_KEY") && err.contains("line 2"),
            "{err}"
        );
        assert!(!err.contains("NOTAVALID"), "{err}");
        let err = parse_identities("AGE-PLUGIN-YUBIKEY-1XYZ")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("plugin"), "{err}");
    }

    #[test]
    fn invalid_env_key_is_recorded_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = sources_in(dir.path());
        src.sops_age_key = Some(Zeroizing::new("garbage".into()));
        let ids = Identities::load(&src).unwrap();
        assert!(ids.is_empty());
        assert_eq!(
            ids.tried()[1].to_string(),
            "SOPS_AGE_KEY (invalid: line 1 is not an X25519 age identity (AGE-SECRET-KEY-1…))"
        );
    }

    #[test]
    fn load_records_every_location_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (s1, p1) = keypair();
        let (s2, p2) = keypair();
        let key_file = dir.path().join("keys.txt");
        std::fs::write(&key_file, format!("{s2}\n")).unwrap();
        let mut src = sources_in(dir.path());
        src.sops_age_key = Some(Zeroizing::new(s1));
        src.sops_age_key_file = Some(key_file.clone());
        let ids = Identities::load(&src).unwrap();
        assert_eq!(ids.recipients(), vec![p1, p2]);
        let default = dir.path().join("home/.config/sops/age/keys.txt");
        assert_eq!(
            ids.describe_tried(),
            format!(
                "--age-identity (not given), SOPS_AGE_KEY (1 identity), \
                 SOPS_AGE_KEY_FILE={} (1 identity), {} (missing)",
                key_file.display(),
                default.display()
            )
        );
    }

    #[test]
    fn default_path_prefers_absolute_xdg_config_home() {
        let src = IdentitySources {
            xdg_config_home: Some("/xdg".into()),
            home: Some("/home/op".into()),
            ..Default::default()
        };
        assert_eq!(
            src.default_keys_path().unwrap(),
            Path::new("/xdg/sops/age/keys.txt")
        );
        let relative = IdentitySources {
            xdg_config_home: Some("rel".into()),
            ..src
        };
        assert_eq!(
            relative.default_keys_path().unwrap(),
            Path::new("/home/op/.config/sops/age/keys.txt")
        );
    }

    #[test]
    fn default_keys_file_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let (s, p) = keypair();
        let default = dir.path().join("home/.config/sops/age/keys.txt");
        std::fs::create_dir_all(default.parent().unwrap()).unwrap();
        std::fs::write(&default, format!("# key\n{s}\n")).unwrap();
        let ids = Identities::load(&sources_in(dir.path())).unwrap();
        assert_eq!(ids.recipients(), vec![p]);
        assert_eq!(ids.tried().last().unwrap().outcome, Outcome::Loaded(1));
    }

    #[test]
    fn explicit_identity_problems_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.txt");
        let mut src = sources_in(dir.path());
        src.explicit = Some(missing.clone());
        let err = Identities::load(&src).unwrap_err().to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("missing"), "{err}");

        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "# only a comment\n").unwrap();
        src.explicit = Some(empty);
        let err = Identities::load(&src).unwrap_err().to_string();
        assert!(err.contains("no AGE-SECRET-KEY-1"), "{err}");
    }

    #[test]
    fn wrong_identity_lists_locations() {
        let (_, public) = keypair();
        let (other_secret, _) = keypair();
        let armored = encrypt(b"x", &[public]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut src = sources_in(dir.path());
        src.sops_age_key = Some(Zeroizing::new(other_secret.clone()));
        let ids = Identities::load(&src).unwrap();
        let err = decrypt(&armored, &ids).unwrap_err();
        assert!(
            matches!(err, AgeError::NoMatchingIdentity { .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("SOPS_AGE_KEY (1 identity)"), "{msg}");
        assert!(msg.contains("--age-identity (not given)"), "{msg}");
        assert!(!msg.contains(&other_secret), "{msg}");
    }

    #[test]
    fn tampered_payload_is_corrupt() {
        let (secret, public) = keypair();
        let ids = Identities::from_text("t", &secret).unwrap();
        let recipient = x25519::Recipient::from_str(&public).unwrap();
        let mut binary = ::age::encrypt(&recipient, b"some payload bytes").unwrap();
        let last = binary.len() - 1;
        binary[last] ^= 0x01;
        let err = decrypt(&binary, &ids).unwrap_err();
        assert!(matches!(err, AgeError::Corrupt(_)), "{err:?}");
    }

    #[test]
    fn not_age_input() {
        let ids = Identities::default();
        let err = decrypt(b"hello: world\n", &ids).unwrap_err();
        assert!(matches!(err, AgeError::NotAge(_)), "{err:?}");
    }

    #[test]
    fn bad_recipients() {
        assert!(matches!(
            encrypt::<&str>(b"x", &[]),
            Err(AgeError::NoRecipients)
        ));
        assert!(matches!(
            encrypt(b"x", &["age1bogus"]),
            Err(AgeError::InvalidRecipient(r)) if r == "age1bogus"
        ));
    }

    #[test]
    fn file_round_trip_writes_only_ciphertext() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, public) = keypair();
        let ids = Identities::from_text("t", &secret).unwrap();
        let path = dir.path().join("bundle.age");
        write_encrypted(&path, b"PLAINTEXT-MARKER", &[public]).unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert!(
            !on_disk
                .windows(b"PLAINTEXT-MARKER".len())
                .any(|w| w == b"PLAINTEXT-MARKER")
        );
        assert_eq!(
            read_encrypted(&path, &ids).unwrap().expose(),
            b"PLAINTEXT-MARKER"
        );
    }
}
