//! Secrets at rest and SOPS files.
//!
//! [`age`] owns age identities (where they are loaded from, and which locations were tried),
//! age encryption to recipients and decryption into zeroize-on-drop [`age::Secret`]s.
//! [`sops`] is talboot's own decoder for SOPS+age YAML files (talhelper's `talsecret.sops.yaml`
//! and friends): it unwraps the data key with an age identity, decrypts every `ENC[…]` value
//! with AES-256-GCM and the key-path AAD, and verifies the file's MAC.
//!
//! Nothing here writes plaintext to disk or logs a secret; the only file writes are of
//! ciphertext, through [`crate::fsutil::write_atomic`].

pub mod age;
pub mod sops;
