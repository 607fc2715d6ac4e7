//! talboot's own decoder for SOPS files in YAML encrypted with age.
//!
//! It reads what `sops` writes (talhelper's `talsecret.sops.yaml`, `talenv.sops.yaml`,
//! Kubernetes Secrets with `encrypted_regex`) without linking sops:
//!
//! 1. The top-level `sops:` map of the first document holds the metadata: the age recipients
//!    with the data key wrapped for each (`age:` or a single `key_groups:` group), the
//!    encryption rules (`unencrypted_suffix` … `encrypted_regex`), `mac_only_encrypted`,
//!    `lastmodified` and the encrypted `mac`.
//! 2. The 32-byte data key is unwrapped with any of the operator's age identities.
//! 3. Every document is walked in order. A leaf whose key path the rules mark as encrypted
//!    holds `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`: AES-256-GCM with a 32-byte IV, and the
//!    additional data is the path of mapping keys, each followed by `:` (list indexes are not
//!    part of it). The plaintext is turned back into its type (str, int, float, bool, bytes,
//!    time).
//! 4. The MAC is SHA-512 over the plaintext bytes of every leaf (only encrypted ones, after a
//!    fixed seed, with `mac_only_encrypted`), bools as `True`/`False` and floats in Go's
//!    shortest non-exponent form, compared in uppercase hex with the stored `mac`, which is
//!    itself encrypted with `lastmodified` as additional data. A mismatch means the file was
//!    changed without sops: [`SopsError::MacMismatch`].
//!
//! Everything happens in memory; the plaintext is returned in a [`Decrypted`] whose `Debug`
//! is redacted. Comments (encrypted by sops as `#ENC[…]`) are dropped by the YAML parser; they
//! are not part of the MAC. The pure core is [`decrypt_yaml`]; [`decrypt_yaml_file`] is the
//! file-reading adapter.
//!
//! Limits, each reported as [`SopsError::Unsupported`] or [`SopsError::NoAgeRecipients`]
//! rather than guessed at: age keys only (no PGP/KMS/Vault), one key group (no Shamir
//! splitting), YAML only (not the JSON, dotenv or INI stores), and no
//! `unencrypted_comment_regex`/`encrypted_comment_regex`, which depend on the comments the
//! YAML parser drops. Unencrypted scalars are typed by yaml_serde (YAML 1.2 core), which
//! agrees with sops's go-yaml on everything sops itself writes.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use aes_gcm::AesGcm;
use aes_gcm::aead::consts::U32;
use aes_gcm::aead::generic_array::GenericArray;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::aes::Aes256;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use regex::Regex;
use serde::Deserialize as _;
use sha2::{Digest, Sha256, Sha512};
use yaml_serde::value::TaggedValue;
use yaml_serde::{Mapping, Number, Value};
use zeroize::Zeroizing;

use crate::crypto::age::{AgeError, Identities};

/// AES-256-GCM with the 32-byte nonce sops uses (Go's `NewGCMWithNonceSize(32)`; the counter
/// block is derived through GHASH, which `aes-gcm` does for any non-96-bit nonce).
type SopsGcm = AesGcm<Aes256, U32>;

/// The unencrypted suffix sops applies when a file sets no rule at all.
const DEFAULT_UNENCRYPTED_SUFFIX: &str = "_unencrypted";

/// Key types sops may list next to `age`; named when a file has no age recipient.
const OTHER_KEY_TYPES: [&str; 6] = ["pgp", "kms", "gcp_kms", "azure_kv", "hc_vault", "hckms"];

/// Why a SOPS file could not be decrypted. Messages name the file and never contain plaintext
/// or key material.
#[derive(Debug, thiserror::Error)]
pub enum SopsError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", .file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid YAML.
    #[error("{}: not valid YAML: {message}", .file.display())]
    Yaml {
        /// The file.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The first document has no `sops:` map.
    #[error(
        "{}: not a SOPS file: its first document has no top-level `sops:` map \
         (encrypt it with `sops --encrypt --age age1… --in-place FILE`)",
        .file.display()
    )]
    NotSops {
        /// The file.
        file: PathBuf,
    },
    /// A field of the `sops:` map is missing or malformed.
    #[error("{}: invalid sops metadata field `sops.{field}`: {problem}", .file.display())]
    Metadata {
        /// The file.
        file: PathBuf,
        /// The field under `sops:`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The file uses a sops feature talboot does not implement.
    #[error("{}: unsupported sops feature: {what}", .file.display())]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// The feature and what to do instead.
        what: String,
    },
    /// The data key is wrapped only for non-age keys.
    #[error(
        "{}: has no age recipient (its data key is wrapped only for: {}); talboot decrypts \
         SOPS files with age keys. Add one with `sops updatekeys` or \
         `sops rotate --in-place --add-age age1… FILE`",
        .file.display(), if .key_types.is_empty() { "nothing".to_string() } else { .key_types.join(", ") }
    )]
    NoAgeRecipients {
        /// The file.
        file: PathBuf,
        /// The key types the file does list.
        key_types: Vec<String>,
    },
    /// None of the loaded identities unwraps the data key.
    #[error(
        "cannot decrypt {}: none of the age identities tried matches its recipients [{}]. \
         Tried: {tried}. {}",
        .file.display(),
        .recipients.join(", "),
        if .identities.is_empty() {
            "No age identity was found: pass --age-identity FILE or set SOPS_AGE_KEY_FILE to \
             the key file of one of those recipients".to_string()
        } else {
            format!("The identities found are for [{}]", .identities.join(", "))
        }
    )]
    NoMatchingIdentity {
        /// The file.
        file: PathBuf,
        /// The age recipients listed in the file.
        recipients: Vec<String>,
        /// Every identity location looked at, with what was found.
        tried: String,
        /// Public keys of the identities that were loaded.
        identities: Vec<String>,
    },
    /// An identity matched but the wrapped data key is unusable.
    #[error("{}: cannot unwrap the data key: {details}", .file.display())]
    DataKey {
        /// The file.
        file: PathBuf,
        /// Per recipient, what went wrong.
        details: String,
    },
    /// One `ENC[…]` value cannot be parsed or authenticated.
    #[error(
        "{}: cannot decrypt the value at `{path}`: {reason} \
         (the file is corrupt or was tampered with)",
        .file.display()
    )]
    Value {
        /// The file.
        file: PathBuf,
        /// The key path, e.g. `certs:etcd:key`.
        path: String,
        /// What failed.
        reason: EncError,
    },
    /// A value the rules say is encrypted is stored in plaintext.
    #[error(
        "{}: the value at `{path}` is stored in plaintext, but the file's encryption rules say \
         it must be encrypted: the file was edited without sops or tampered with",
        .file.display()
    )]
    NotEncrypted {
        /// The file.
        file: PathBuf,
        /// The key path.
        path: String,
    },
    /// A mapping key is not a string (sops never writes such files).
    #[error("{}: the mapping under `{path}` has a non-string key; sops files have string keys only", .file.display())]
    NonStringKey {
        /// The file.
        file: PathBuf,
        /// The path of the mapping (empty for the document root).
        path: String,
    },
    /// The stored MAC cannot be decrypted (the `mac` or `lastmodified` field was altered).
    #[error(
        "{}: the stored MAC cannot be decrypted ({reason}): `sops.mac` or `sops.lastmodified` \
         was altered; the file cannot be trusted",
        .file.display()
    )]
    MacUnreadable {
        /// The file.
        file: PathBuf,
        /// What failed.
        reason: EncError,
    },
    /// The recomputed MAC differs from the stored one.
    #[error(
        "{}: MAC mismatch: the file's content was changed after sops encrypted it (tampered, \
         or edited by hand); restore it from version control or re-create it with `sops edit`",
        .file.display()
    )]
    MacMismatch {
        /// The file.
        file: PathBuf,
    },
}

/// The decrypted documents of a SOPS file, with the `sops:` metadata removed. `Debug` is
/// redacted because the documents hold secrets.
#[derive(Clone, PartialEq)]
pub struct Decrypted {
    documents: Vec<Value>,
}

impl Decrypted {
    /// The documents, in file order.
    pub fn documents(&self) -> &[Value] {
        &self.documents
    }

    /// Takes the documents out.
    pub fn into_documents(self) -> Vec<Value> {
        self.documents
    }
}

impl fmt::Debug for Decrypted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Decrypted([REDACTED; {} documents])",
            self.documents.len()
        )
    }
}

/// Whether a parsed YAML document is SOPS-encrypted: a mapping with a non-empty top-level
/// `sops:` map (the test talhelper uses).
pub fn is_sops_file(doc: &Value) -> bool {
    matches!(
        doc.as_mapping().and_then(|m| m.get("sops")),
        Some(Value::Mapping(m)) if !m.is_empty()
    )
}

/// Reads `path` and decrypts it with [`decrypt_yaml`].
pub fn decrypt_yaml_file(path: &Path, ids: &Identities) -> Result<Decrypted, SopsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SopsError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    decrypt_yaml(&text, path, ids)
}

/// Decrypts the SOPS YAML `text` (possibly several documents) read from `file` (used only in
/// messages) with any of `ids`, and verifies its MAC.
pub fn decrypt_yaml(text: &str, file: &Path, ids: &Identities) -> Result<Decrypted, SopsError> {
    crate::nesting::check_yaml(text).map_err(|e| SopsError::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut docs = Vec::new();
    for de in yaml_serde::Deserializer::from_str(text) {
        let doc = Value::deserialize(de).map_err(|e| SopsError::Yaml {
            file: file.to_path_buf(),
            message: e.to_string(),
        })?;
        if !doc.is_null() {
            docs.push(doc);
        }
    }
    let meta_value = docs
        .first()
        .filter(|d| is_sops_file(d))
        .and_then(|d| d.get("sops"))
        .cloned()
        .ok_or_else(|| SopsError::NotSops {
            file: file.to_path_buf(),
        })?;
    let meta = Metadata::parse(&meta_value, file)?;
    let key = unwrap_data_key(&meta, file, ids)?;
    let cipher = SopsGcm::new(GenericArray::from_slice(key.as_slice()));

    let mut walker = Walker {
        file,
        cipher: &cipher,
        rules: &meta.rules,
        mac_only_encrypted: meta.mac_only_encrypted,
        hasher: Sha512::new(),
        path: Vec::new(),
    };
    if meta.mac_only_encrypted {
        // sops seeds this MAC so it can never equal the all-values MAC of the same tree.
        walker.hasher.update(mac_only_encrypted_seed());
    }
    let mut out = Vec::with_capacity(docs.len());
    for (n, doc) in docs.into_iter().enumerate() {
        let Value::Mapping(mut map) = doc else {
            return Err(SopsError::Unsupported {
                file: file.to_path_buf(),
                what: format!("document {} is not a mapping", n + 1),
            });
        };
        map.shift_remove("sops");
        out.push(walker.mapping(map)?);
    }
    let computed = crate::hex::upper(&walker.hasher.finalize());
    verify_mac(&meta, &cipher, &computed, file)?;
    Ok(Decrypted { documents: out })
}

/// Checks the recomputed MAC against the stored one.
fn verify_mac(
    meta: &Metadata,
    cipher: &SopsGcm,
    computed: &str,
    file: &Path,
) -> Result<(), SopsError> {
    let unreadable = |reason: EncError| SopsError::MacUnreadable {
        file: file.to_path_buf(),
        reason,
    };
    let enc = EncValue::parse(&meta.mac).map_err(unreadable)?;
    let aad = lastmodified_aad(&meta.lastmodified);
    let stored = open(cipher, &enc, aad.as_bytes()).map_err(unreadable)?;
    if stored.as_slice() != computed.as_bytes() {
        return Err(SopsError::MacMismatch {
            file: file.to_path_buf(),
        });
    }
    Ok(())
}

/// One age recipient of the file and its wrapped data key (ciphertext, safe to show).
#[derive(Debug)]
struct AgeStanza {
    recipient: String,
    enc: String,
}

/// Which leaves sops encrypted, from the file's rules (at most one is set; none means the
/// default unencrypted suffix).
#[derive(Debug, Default)]
struct Rules {
    unencrypted_suffix: Option<String>,
    encrypted_suffix: Option<String>,
    unencrypted_regex: Option<Regex>,
    encrypted_regex: Option<Regex>,
}

impl Rules {
    /// sops's `shouldBeEncrypted` for a leaf at `path` (mapping keys from the root), without
    /// the comment rules, which files using them are rejected for.
    fn should_encrypt(&self, path: &[String]) -> bool {
        let mut encrypted = true;
        if let Some(suffix) = &self.unencrypted_suffix
            && path.iter().any(|k| k.ends_with(suffix.as_str()))
        {
            encrypted = false;
        }
        if let Some(suffix) = &self.encrypted_suffix {
            encrypted = path.iter().any(|k| k.ends_with(suffix.as_str()));
        }
        if let Some(re) = &self.unencrypted_regex
            && path.iter().any(|k| re.is_match(k))
        {
            encrypted = false;
        }
        if let Some(re) = &self.encrypted_regex {
            encrypted = path.iter().any(|k| re.is_match(k));
        }
        encrypted
    }
}

/// The parts of the `sops:` map the decoder needs (no secrets: the key and MAC are encrypted).
#[derive(Debug)]
struct Metadata {
    age: Vec<AgeStanza>,
    other_key_types: Vec<String>,
    lastmodified: String,
    mac: String,
    rules: Rules,
    mac_only_encrypted: bool,
}

impl Metadata {
    fn parse(value: &Value, file: &Path) -> Result<Self, SopsError> {
        let bad = |field: &str, problem: String| SopsError::Metadata {
            file: file.to_path_buf(),
            field: field.to_string(),
            problem,
        };
        let map = value
            .as_mapping()
            .ok_or_else(|| bad("", "`sops` is not a mapping".into()))?;
        let fields = MetadataFields { map, file };
        fields.reject_comment_rules()?;
        let rules = fields.rules()?;
        let mac_only_encrypted = match map.get("mac_only_encrypted") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("mac_only_encrypted", "expected true or false".into())),
        };
        let (age, other_key_types) = fields.keys()?;
        Ok(Metadata {
            age,
            other_key_types,
            lastmodified: fields.required("lastmodified")?,
            mac: fields.required("mac")?,
            rules,
            mac_only_encrypted,
        })
    }
}

/// The fields of the `sops:` mapping, each error naming the file.
struct MetadataFields<'a> {
    map: &'a Mapping,
    file: &'a Path,
}

impl MetadataFields<'_> {
    fn bad(&self, field: &str, problem: String) -> SopsError {
        SopsError::Metadata {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            problem,
        }
    }

    /// A string field; absent, null and empty all read as unset.
    fn opt_str(&self, field: &str) -> Result<Option<String>, SopsError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.bad(field, "expected a string".into())),
        }
    }

    fn required(&self, field: &str) -> Result<String, SopsError> {
        self.opt_str(field)?
            .ok_or_else(|| self.bad(field, "missing".into()))
    }

    fn regex(&self, field: &str) -> Result<Option<Regex>, SopsError> {
        self.opt_str(field)?
            .map(|r| Regex::new(&r).map_err(|e| self.bad(field, format!("invalid regex: {e}"))))
            .transpose()
    }

    /// Comment-based encryption rules are refused: they need the YAML comments.
    fn reject_comment_rules(&self) -> Result<(), SopsError> {
        for field in ["unencrypted_comment_regex", "encrypted_comment_regex"] {
            if self.opt_str(field)?.is_some() {
                return Err(SopsError::Unsupported {
                    file: self.file.to_path_buf(),
                    what: format!(
                        "`{field}` (comment-based rules need the YAML comments, which talboot \
                     does not keep); re-encrypt with a key-based rule such as \
                     `--encrypted-regex`"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Which values are encrypted: at most one of the four rules, else sops's default suffix.
    fn rules(&self) -> Result<Rules, SopsError> {
        let mut rules = Rules {
            unencrypted_suffix: self.opt_str("unencrypted_suffix")?,
            encrypted_suffix: self.opt_str("encrypted_suffix")?,
            unencrypted_regex: self.regex("unencrypted_regex")?,
            encrypted_regex: self.regex("encrypted_regex")?,
        };
        let set = [
            rules.unencrypted_suffix.is_some(),
            rules.encrypted_suffix.is_some(),
            rules.unencrypted_regex.is_some(),
            rules.encrypted_regex.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        if set > 1 {
            return Err(self.bad(
                "unencrypted_suffix",
                "more than one of unencrypted_suffix, encrypted_suffix, unencrypted_regex and \
             encrypted_regex is set; sops allows only one"
                    .into(),
            ));
        }
        if set == 0 {
            rules.unencrypted_suffix = Some(DEFAULT_UNENCRYPTED_SUFFIX.into());
        }
        Ok(rules)
    }

    /// The age recipients' stanzas and the names of other key types, at the top level and in
    /// the one key group talboot supports.
    fn keys(&self) -> Result<(Vec<AgeStanza>, Vec<String>), SopsError> {
        let mut age = Vec::new();
        let mut other_key_types = Vec::new();
        collect_keys(self.map, "", self.file, &mut age, &mut other_key_types)?;
        match self.map.get("key_groups") {
            None | Some(Value::Null) => {}
            Some(Value::Sequence(groups)) => {
                if groups.len() > 1 {
                    return Err(SopsError::Unsupported {
                        file: self.file.to_path_buf(),
                        what: format!(
                            "Shamir secret sharing over {} key groups; talboot decrypts files \
                         with one key group. Re-encrypt with a single group (one \
                         `key_groups` entry in .sops.yaml, then `sops updatekeys`)",
                            groups.len()
                        ),
                    });
                }
                for group in groups {
                    let group = group.as_mapping().ok_or_else(|| {
                        self.bad("key_groups", "an entry is not a mapping".into())
                    })?;
                    collect_keys(
                        group,
                        "key_groups[0].",
                        self.file,
                        &mut age,
                        &mut other_key_types,
                    )?;
                }
            }
            Some(_) => return Err(self.bad("key_groups", "expected a list".into())),
        }
        Ok((age, other_key_types))
    }
}

/// Collects the `age` stanzas of one key group (or of the top level), and the names of other
/// key types that have entries.
fn collect_keys(
    map: &Mapping,
    prefix: &str,
    file: &Path,
    age: &mut Vec<AgeStanza>,
    others: &mut Vec<String>,
) -> Result<(), SopsError> {
    let bad = |problem: &str| SopsError::Metadata {
        file: file.to_path_buf(),
        field: format!("{prefix}age"),
        problem: problem.to_string(),
    };
    match map.get("age") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(list)) => {
            for entry in list {
                let field = |name: &str| {
                    entry
                        .get(name)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                };
                let (Some(recipient), Some(enc)) = (field("recipient"), field("enc")) else {
                    return Err(bad("each entry needs `recipient` and `enc` strings"));
                };
                age.push(AgeStanza { recipient, enc });
            }
        }
        Some(_) => return Err(bad("expected a list")),
    }
    for kind in OTHER_KEY_TYPES {
        if let Some(Value::Sequence(list)) = map.get(kind)
            && !list.is_empty()
            && !others.iter().any(|o| o == kind)
        {
            others.push(kind.to_string());
        }
    }
    Ok(())
}

/// Unwraps the 32-byte data key with the first age stanza any identity opens.
fn unwrap_data_key(
    meta: &Metadata,
    file: &Path,
    ids: &Identities,
) -> Result<Zeroizing<[u8; 32]>, SopsError> {
    if meta.age.is_empty() {
        return Err(SopsError::NoAgeRecipients {
            file: file.to_path_buf(),
            key_types: meta.other_key_types.clone(),
        });
    }
    let mut problems = Vec::new();
    for stanza in &meta.age {
        match crate::crypto::age::decrypt(stanza.enc.as_bytes(), ids) {
            Ok(secret) => match <[u8; 32]>::try_from(secret.expose()) {
                Ok(key) => {
                    tracing::debug!(file = %file.display(), recipient = %stanza.recipient, "sops data key unwrapped");
                    return Ok(Zeroizing::new(key));
                }
                Err(_) => problems.push(format!(
                    "for {}: the data key is {} bytes, expected 32",
                    stanza.recipient,
                    secret.len()
                )),
            },
            Err(AgeError::NoMatchingIdentity { .. }) => {}
            Err(e) => problems.push(format!("for {}: {e}", stanza.recipient)),
        }
    }
    if !problems.is_empty() {
        return Err(SopsError::DataKey {
            file: file.to_path_buf(),
            details: format!(
                "{}. Identities tried: {}",
                problems.join("; "),
                ids.describe_tried()
            ),
        });
    }
    Err(SopsError::NoMatchingIdentity {
        file: file.to_path_buf(),
        recipients: meta.age.iter().map(|s| s.recipient.clone()).collect(),
        tried: ids.describe_tried(),
        identities: ids.recipients(),
    })
}

/// Walks the documents in order, decrypting and hashing leaves.
struct Walker<'a> {
    file: &'a Path,
    cipher: &'a SopsGcm,
    rules: &'a Rules,
    mac_only_encrypted: bool,
    hasher: Sha512,
    path: Vec<String>,
}

impl Walker<'_> {
    fn mapping(&mut self, map: Mapping) -> Result<Value, SopsError> {
        let mut out = Mapping::with_capacity(map.len());
        for (k, v) in map {
            let Value::String(key) = &k else {
                return Err(SopsError::NonStringKey {
                    file: self.file.to_path_buf(),
                    path: self.path.join(":"),
                });
            };
            self.path.push(key.clone());
            let v = self.value(v)?;
            self.path.pop();
            out.insert(k, v);
        }
        Ok(Value::Mapping(out))
    }

    fn value(&mut self, v: Value) -> Result<Value, SopsError> {
        match v {
            Value::Mapping(m) => self.mapping(m),
            // List items share their parent's path: sops adds no index.
            Value::Sequence(items) => items
                .into_iter()
                .map(|item| self.value(item))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Sequence),
            Value::Tagged(t) => {
                let TaggedValue { tag, value } = *t;
                let value = self.value(value)?;
                Ok(Value::Tagged(Box::new(TaggedValue { tag, value })))
            }
            // sops neither encrypts nor hashes null.
            Value::Null => Ok(Value::Null),
            leaf => self.leaf(leaf),
        }
    }

    fn leaf(&mut self, v: Value) -> Result<Value, SopsError> {
        if !self.rules.should_encrypt(&self.path) {
            if !self.mac_only_encrypted
                && let Some(bytes) = plain_mac_bytes(&v)
            {
                self.hasher.update(bytes.as_bytes());
            }
            return Ok(v);
        }
        let path = self.path.join(":");
        let Value::String(text) = v else {
            return Err(SopsError::NotEncrypted {
                file: self.file.to_path_buf(),
                path,
            });
        };
        // sops leaves empty strings as they are; they add nothing to the MAC.
        if text.is_empty() {
            return Ok(Value::String(text));
        }
        if !text.starts_with("ENC[") {
            return Err(SopsError::NotEncrypted {
                file: self.file.to_path_buf(),
                path,
            });
        }
        let value_err = |reason: EncError| SopsError::Value {
            file: self.file.to_path_buf(),
            path: path.clone(),
            reason,
        };
        let enc = EncValue::parse(&text).map_err(value_err)?;
        let plain = open(self.cipher, &enc, aad(&self.path).as_bytes()).map_err(value_err)?;
        let (value, mac) = typed_value(enc.kind, &plain).map_err(value_err)?;
        self.hasher.update(mac.as_slice());
        Ok(value)
    }
}

/// The additional authenticated data for a leaf: each mapping key followed by `:`.
fn aad(path: &[String]) -> String {
    let mut out = String::new();
    for key in path {
        out.push_str(key);
        out.push(':');
    }
    out
}

/// sops stores `lastmodified` as RFC 3339 text but authenticates the MAC with Go's
/// `Format(time.RFC3339)` of the parsed time: whole seconds, and `Z` for a zero offset.
fn lastmodified_aad(stored: &str) -> Cow<'_, str> {
    let mut s = Cow::Borrowed(stored);
    if let Some(t) = s.find('T')
        && let Some(dot) = s[t..].find('.').map(|d| d + t)
    {
        let digits = s[dot + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            s = Cow::Owned(format!("{}{}", &s[..dot], &s[dot + 1 + digits..]));
        }
    }
    for zero in ["+00:00", "-00:00"] {
        if let Some(head) = s.strip_suffix(zero) {
            return Cow::Owned(format!("{head}Z"));
        }
    }
    s
}

/// The plaintext type recorded in an `ENC[…]` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
    Bytes,
    Time,
    Comment,
}

/// A parsed `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]` value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EncValue {
    data: Vec<u8>,
    iv: [u8; 32],
    tag: [u8; 16],
    kind: Kind,
}

/// The shape sops writes an encrypted value in.
const ENC_SHAPE: &str = "not of the form ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]";

/// Why one encrypted value (or the stored MAC) cannot be opened. Never quotes plaintext.
#[derive(Debug, thiserror::Error)]
pub enum EncError {
    /// Not `ENC[…]`.
    #[error("{shape}", shape = ENC_SHAPE)]
    Shape,
    /// A cipher other than AES256_GCM.
    #[error("unsupported cipher `{0}` (sops uses AES256_GCM)")]
    Cipher(String),
    /// A field is missing or out of order.
    #[error("{shape} (missing `{0}`)", shape = ENC_SHAPE)]
    MissingField(&'static str),
    /// A field is not base64.
    #[error("`{field}` is not valid base64: {source}")]
    Base64 {
        /// `data`, `iv` or `tag`.
        field: &'static str,
        /// The decoder's description.
        source: base64::DecodeError,
    },
    /// A `type:` sops does not write.
    #[error("unknown value type `{0}`")]
    UnknownType(String),
    /// More fields after `type:`.
    #[error("{shape} (extra fields)", shape = ENC_SHAPE)]
    ExtraFields,
    /// An IV of the wrong length.
    #[error("the IV is {0} bytes; sops uses 32-byte IVs")]
    IvLength(usize),
    /// A tag of the wrong length.
    #[error("the tag is {0} bytes, expected 16")]
    TagLength(usize),
    /// Wrong key, or the file was edited.
    #[error("AES-GCM authentication failed")]
    Authentication,
    /// The plaintext is not text.
    #[error("the plaintext is not UTF-8")]
    NotUtf8,
    /// `type:int` that is not an integer.
    #[error("a value of type int is not an integer")]
    NotInteger,
    /// `type:float` that is not a number.
    #[error("a value of type float is not a number")]
    NotFloat,
    /// `type:bool` that is not a boolean.
    #[error("a value of type bool is not true or false")]
    NotBool,
    /// `type:comment` where a value belongs.
    #[error("a comment is stored where a value belongs")]
    Comment,
}

impl EncValue {
    fn parse(s: &str) -> Result<Self, EncError> {
        let body = s
            .strip_prefix("ENC[")
            .and_then(|r| r.strip_suffix(']'))
            .ok_or(EncError::Shape)?;
        let mut parts = body.split(',');
        let cipher = parts.next().ok_or(EncError::Shape)?;
        if cipher != "AES256_GCM" {
            return Err(EncError::Cipher(cipher.to_owned()));
        }
        let mut field = |name: &'static str| -> Result<&str, EncError> {
            parts
                .next()
                .and_then(|p| p.strip_prefix(name))
                .ok_or(EncError::MissingField(name))
        };
        let b64 = |field: &'static str, text: &str| {
            B64.decode(text)
                .map_err(|source| EncError::Base64 { field, source })
        };
        let data = b64("data", field("data:")?)?;
        let iv_bytes = b64("iv", field("iv:")?)?;
        let tag_bytes = b64("tag", field("tag:")?)?;
        let kind = match field("type:")? {
            "str" => Kind::Str,
            "int" | "int64" => Kind::Int,
            "float" => Kind::Float,
            "bool" => Kind::Bool,
            "bytes" => Kind::Bytes,
            "time" => Kind::Time,
            "comment" => Kind::Comment,
            other => return Err(EncError::UnknownType(other.to_owned())),
        };
        if parts.next().is_some() {
            return Err(EncError::ExtraFields);
        }
        let iv = <[u8; 32]>::try_from(iv_bytes.as_slice())
            .map_err(|_| EncError::IvLength(iv_bytes.len()))?;
        let tag = <[u8; 16]>::try_from(tag_bytes.as_slice())
            .map_err(|_| EncError::TagLength(tag_bytes.len()))?;
        Ok(EncValue {
            data,
            iv,
            tag,
            kind,
        })
    }
}

/// Decrypts and authenticates one value.
fn open(cipher: &SopsGcm, enc: &EncValue, aad: &[u8]) -> Result<Zeroizing<Vec<u8>>, EncError> {
    let mut buf = Zeroizing::new(enc.data.clone());
    cipher
        .decrypt_in_place_detached(
            GenericArray::from_slice(&enc.iv),
            aad,
            buf.as_mut_slice(),
            GenericArray::from_slice(&enc.tag),
        )
        .map_err(|_| EncError::Authentication)?;
    Ok(buf)
}

/// Turns decrypted bytes back into a YAML value of their recorded type, and gives the bytes
/// sops hashes for it (its `ToBytes` of the typed value).
fn typed_value(kind: Kind, plain: &[u8]) -> Result<(Value, Zeroizing<Vec<u8>>), EncError> {
    let text = || std::str::from_utf8(plain).map_err(|_| EncError::NotUtf8);
    let same = || Zeroizing::new(plain.to_vec());
    Ok(match kind {
        Kind::Str | Kind::Bytes | Kind::Time => (Value::String(text()?.to_string()), same()),
        Kind::Int => {
            let t = text()?;
            let n = if let Ok(i) = t.parse::<i64>() {
                Number::from(i)
            } else {
                Number::from(t.parse::<u64>().map_err(|_| EncError::NotInteger)?)
            };
            let mac = Zeroizing::new(n.to_string().into_bytes());
            (Value::Number(n), mac)
        }
        Kind::Float => {
            let f: f64 = go_parse_float(text()?).ok_or(EncError::NotFloat)?;
            let mac = Zeroizing::new(go_float(f).into_bytes());
            (Value::Number(Number::from(f)), mac)
        }
        Kind::Bool => {
            let b = go_parse_bool(text()?).ok_or(EncError::NotBool)?;
            (
                Value::Bool(b),
                Zeroizing::new(go_bool(b).as_bytes().to_vec()),
            )
        }
        Kind::Comment => return Err(EncError::Comment),
    })
}

/// The bytes sops hashes for an unencrypted leaf; `None` for values it does not hash.
fn plain_mac_bytes(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Bool(b) => Some(Cow::Borrowed(go_bool(*b))),
        Value::Number(n) => Some(Cow::Owned(match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (None, None, Some(f)) => go_float(f),
            (None, None, None) => n.to_string(),
        })),
        _ => None,
    }
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`: the shortest digits that round-trip, never an
/// exponent. Rust's `Display` for `f64` is exactly that for finite values.
fn go_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{f}")
    }
}

/// Go's `strconv.ParseFloat` for the values sops writes (and Go's spellings of the specials).
fn go_parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => s.parse().ok().filter(|f: &f64| f.is_finite()),
    }
}

/// sops's (Python-inherited) spelling of booleans in the MAC and in encrypted values.
fn go_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Go's `strconv.ParseBool`.
fn go_parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "True" | "TRUE" => Some(true),
        "0" | "f" | "F" | "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// The fixed seed of a `mac_only_encrypted` MAC: SHA-256 of `sops` (sops's
/// `MACOnlyEncryptedInitialization`).
fn mac_only_encrypted_seed() -> [u8; 32] {
    Sha256::digest(b"sops").into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes_gcm::aead::AeadInPlace;

    const KEY: [u8; 32] = [7u8; 32];

    /// Test-side encryption of one value, the way sops writes it.
    fn seal(plain: &str, aad: &str, kind: &str, iv: [u8; 32]) -> String {
        let cipher = SopsGcm::new(GenericArray::from_slice(&KEY));
        let mut buf = plain.as_bytes().to_vec();
        let tag = cipher
            .encrypt_in_place_detached(GenericArray::from_slice(&iv), aad.as_bytes(), &mut buf)
            .unwrap();
        format!(
            "ENC[AES256_GCM,data:{},iv:{},tag:{},type:{kind}]",
            B64.encode(&buf),
            B64.encode(iv),
            B64.encode(tag)
        )
    }

    fn path(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn parses_enc_values() {
        let s = seal("hello", "a:", "str", [1; 32]);
        let enc = EncValue::parse(&s).unwrap();
        assert_eq!(enc.kind, Kind::Str);
        assert_eq!(enc.iv, [1; 32]);
        assert_eq!(enc.data.len(), 5);

        let real = "ENC[AES256_GCM,data:5B7Pog==,iv:nPlkV5/TkXBfH2WOLK+ch552+niuLWvjI0b89D6Eamk=,\
                    tag:qK3Rn6YpvaoxAW6hGa0mPg==,type:int]";
        let enc = EncValue::parse(real).unwrap();
        assert_eq!(enc.kind, Kind::Int);
        assert_eq!(enc.data.len(), 4);
        assert_eq!(
            EncValue::parse(&real.replace("type:int", "type:int64"))
                .unwrap()
                .kind,
            Kind::Int
        );
    }

    #[test]
    fn rejects_malformed_enc_values() {
        let ok = seal("x", "a:", "str", [1; 32]);
        let cases = [
            ("ENC[AES256_GCM,data:AA==]".to_string(), "missing `iv:`"),
            (ok.replace("AES256_GCM", "AES128_CBC"), "unsupported cipher"),
            (ok.replace("type:str", "type:decimal"), "unknown value type"),
            (ok.replace(",iv:", ",iv:!!"), "not valid base64"),
            (
                seal("x", "a:", "str", [1; 32])
                    .replace(&B64.encode([1u8; 32]), &B64.encode([1u8; 12])),
                "12 bytes; sops uses 32-byte IVs",
            ),
            (format!("{}x", ok), "not of the form"),
            (ok.replace("]", ",extra:1]"), "extra fields"),
        ];
        for (input, want) in cases {
            let err = EncValue::parse(&input).unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
    }

    #[test]
    fn aad_is_key_path_with_trailing_colons() {
        assert_eq!(aad(&path(&["hello"])), "hello:");
        assert_eq!(aad(&path(&["certs", "etcd", "crt"])), "certs:etcd:crt:");
        assert_eq!(aad(&[]), "");
    }

    #[test]
    fn open_checks_the_aad() {
        let cipher = SopsGcm::new(GenericArray::from_slice(&KEY));
        let enc = EncValue::parse(&seal("v", "a:b:", "str", [3; 32])).unwrap();
        assert_eq!(open(&cipher, &enc, b"a:b:").unwrap().as_slice(), b"v");
        assert!(open(&cipher, &enc, b"a:").is_err());
    }

    #[test]
    fn go_float_formatting() {
        assert_eq!(go_float(0.5), "0.5");
        assert_eq!(go_float(1.0), "1");
        assert_eq!(go_float(1e20), "100000000000000000000");
        assert_eq!(go_float(1e-7), "0.0000001");
        assert_eq!(go_float(-2.25), "-2.25");
        assert_eq!(go_float(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
        assert_eq!(go_float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(go_float(f64::NAN), "NaN");
    }

    #[test]
    fn mac_bytes_for_plain_leaves() {
        let bytes = |v: Value| plain_mac_bytes(&v).map(|c| c.into_owned());
        assert_eq!(bytes(Value::Bool(true)).unwrap(), "True");
        assert_eq!(bytes(Value::Bool(false)).unwrap(), "False");
        assert_eq!(bytes(Value::Number(6443.into())).unwrap(), "6443");
        assert_eq!(bytes(Value::Number((-3).into())).unwrap(), "-3");
        assert_eq!(
            bytes(Value::Number(1e20.into())).unwrap(),
            "100000000000000000000"
        );
        assert_eq!(bytes(Value::Number(2.0.into())).unwrap(), "2");
        assert_eq!(bytes(Value::String("x".into())).unwrap(), "x");
        assert_eq!(bytes(Value::Null), None);
    }

    #[test]
    fn typed_values_and_their_mac_bytes() {
        let t = |k, s: &str| {
            let (v, mac) = typed_value(k, s.as_bytes()).unwrap();
            (v, String::from_utf8(mac.to_vec()).unwrap())
        };
        assert_eq!(t(Kind::Bool, "True"), (Value::Bool(true), "True".into()));
        assert_eq!(t(Kind::Bool, "false"), (Value::Bool(false), "False".into()));
        assert_eq!(t(Kind::Int, "42"), (Value::Number(42.into()), "42".into()));
        assert_eq!(
            t(Kind::Float, "0.5"),
            (Value::Number(0.5.into()), "0.5".into())
        );
        assert_eq!(
            t(Kind::Float, "100000000000000000000"),
            (Value::Number(1e20.into()), "100000000000000000000".into())
        );
        assert_eq!(
            t(Kind::Str, "a b"),
            (Value::String("a b".into()), "a b".into())
        );
        assert!(typed_value(Kind::Bool, b"yes").is_err());
        assert!(typed_value(Kind::Int, b"4.5").is_err());
        assert!(typed_value(Kind::Comment, b"# c").is_err());
    }

    #[test]
    fn lastmodified_is_normalised_like_go() {
        assert_eq!(
            lastmodified_aad("2024-03-25T15:41:17Z"),
            "2024-03-25T15:41:17Z"
        );
        assert_eq!(
            lastmodified_aad("2024-03-25T15:41:17.123456Z"),
            "2024-03-25T15:41:17Z"
        );
        assert_eq!(
            lastmodified_aad("2024-03-25T15:41:17+00:00"),
            "2024-03-25T15:41:17Z"
        );
        assert_eq!(
            lastmodified_aad("2024-03-25T15:41:17.5+02:00"),
            "2024-03-25T15:41:17+02:00"
        );
    }

    #[test]
    fn mac_only_encrypted_seed_matches_sops() {
        let seed = mac_only_encrypted_seed();
        assert_eq!(&seed[..4], &[0x8a, 0x3f, 0xd2, 0xad]);
        assert_eq!(&seed[28..], &[0x76, 0xf2, 0x7d, 0x69]);
    }

    #[test]
    fn encryption_rules() {
        let default = Rules {
            unencrypted_suffix: Some("_unencrypted".into()),
            ..Default::default()
        };
        assert!(default.should_encrypt(&path(&["a", "b"])));
        assert!(!default.should_encrypt(&path(&["a_unencrypted", "b"])));
        assert!(!default.should_encrypt(&path(&["a", "b_unencrypted"])));

        let enc_suffix = Rules {
            encrypted_suffix: Some("_secret".into()),
            ..Default::default()
        };
        assert!(enc_suffix.should_encrypt(&path(&["db_secret", "pw"])));
        assert!(!enc_suffix.should_encrypt(&path(&["db", "pw"])));

        let k8s = Rules {
            encrypted_regex: Some(Regex::new("^(data|stringData)$").unwrap()),
            ..Default::default()
        };
        assert!(k8s.should_encrypt(&path(&["stringData", "token"])));
        assert!(!k8s.should_encrypt(&path(&["metadata", "name"])));
        assert!(!k8s.should_encrypt(&path(&["metadata", "database"])));

        let unenc_re = Rules {
            unencrypted_regex: Some(Regex::new("^public").unwrap()),
            ..Default::default()
        };
        assert!(!unenc_re.should_encrypt(&path(&["public_cert"])));
        assert!(unenc_re.should_encrypt(&path(&["key"])));
    }

    #[test]
    fn is_sops_file_needs_a_non_empty_sops_map() {
        let doc = |s: &str| yaml_serde::from_str::<Value>(s).unwrap();
        assert!(is_sops_file(&doc("a: 1\nsops:\n  version: 3.11.0\n")));
        assert!(!is_sops_file(&doc("a: 1\nsops: {}\n")));
        assert!(!is_sops_file(&doc("a: 1\nsops: yes\n")));
        assert!(!is_sops_file(&doc("a: 1\n")));
        assert!(!is_sops_file(&doc("- sops\n")));
    }

    #[test]
    fn decrypted_debug_is_redacted() {
        let d = Decrypted {
            documents: vec![yaml_serde::from_str("password: hunter2").unwrap()],
        };
        let dbg = format!("{d:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
    }

    #[test]
    fn metadata_rule_conflicts_and_unsupported_features() {
        let file = Path::new("f.yaml");
        let meta = |extra: &str| {
            let text = format!(
                "age:\n  - recipient: age1x\n    enc: x\nlastmodified: \"2024-01-01T00:00:00Z\"\n\
                 mac: ENC[x]\n{extra}"
            );
            Metadata::parse(&yaml_serde::from_str::<Value>(&text).unwrap(), file)
        };
        let m = meta("").unwrap();
        assert_eq!(m.rules.unencrypted_suffix.as_deref(), Some("_unencrypted"));
        assert!(!m.mac_only_encrypted);

        let err = meta("unencrypted_suffix: _u\nencrypted_regex: ^a$\n").unwrap_err();
        assert!(err.to_string().contains("only one"), "{err}");

        let err = meta("encrypted_comment_regex: sops:enc\n").unwrap_err();
        assert!(matches!(err, SopsError::Unsupported { .. }), "{err}");

        let err = meta("key_groups:\n  - age: []\n  - age: []\nshamir_threshold: 2\n").unwrap_err();
        assert!(err.to_string().contains("Shamir"), "{err}");

        let m = meta("pgp: []\nkms: []\nmac_only_encrypted: true\n").unwrap();
        assert!(m.other_key_types.is_empty());
        assert!(m.mac_only_encrypted);
    }

    #[test]
    fn no_age_recipient_names_other_key_types() {
        let text = "a: ENC[x]\nsops:\n  pgp:\n    - fp: ABC\n      enc: x\n  \
                    lastmodified: \"2024-01-01T00:00:00Z\"\n  mac: ENC[x]\n";
        let err = decrypt_yaml(text, Path::new("s.yaml"), &Identities::default()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SopsError::NoAgeRecipients { .. }), "{msg}");
        assert!(msg.contains("s.yaml") && msg.contains("pgp"), "{msg}");
    }

    #[test]
    fn plain_yaml_is_not_sops() {
        let err = decrypt_yaml("a: 1\n", Path::new("p.yaml"), &Identities::default()).unwrap_err();
        assert!(matches!(err, SopsError::NotSops { .. }), "{err}");
    }
}
