//! Image Factory schematic IDs, computed offline.
//!
//! The Image Factory names a schematic by the SHA-256 of its canonical YAML, which is what Go's
//! `gopkg.in/yaml.v3` prints for the schematic struct: fields in struct order, empty fields left
//! out (except `customization`, printed as `{}` when empty), 4-space indentation, and list items
//! indented under their key. This module reproduces that output for the schematic fields talboot
//! accepts, so an operator can write the schematic itself instead of looking its ID up.

use sha2::{Digest, Sha256};

/// The parts of a schematic talboot understands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Schematic {
    /// Overlay image and name (SBC overlays); options are not supported.
    pub(crate) overlay: Option<(String, String)>,
    /// Extra kernel arguments baked into the image.
    pub(crate) extra_kernel_args: Vec<String>,
    /// Initial META values (`key`, `value`).
    pub meta: Vec<(u8, String)>,
    /// Official system extensions, e.g. `siderolabs/qemu-guest-agent`.
    pub(crate) official_extensions: Vec<String>,
    /// SecureBoot: include well-known UEFI certificates.
    pub(crate) include_well_known_certificates: bool,
}

impl Schematic {
    /// The canonical YAML the Image Factory hashes.
    pub(crate) fn canonical_yaml(&self) -> String {
        let mut out = String::new();
        if let Some((image, name)) = &self.overlay {
            out.push_str("overlay:\n");
            out.push_str(&format!("    image: {}\n", scalar(image)));
            out.push_str(&format!("    name: {}\n", scalar(name)));
        }
        let empty = self.extra_kernel_args.is_empty()
            && self.meta.is_empty()
            && self.official_extensions.is_empty()
            && !self.include_well_known_certificates;
        if empty {
            out.push_str("customization: {}\n");
            return out;
        }
        out.push_str("customization:\n");
        if !self.extra_kernel_args.is_empty() {
            out.push_str("    extraKernelArgs:\n");
            for a in &self.extra_kernel_args {
                out.push_str(&format!("        - {}\n", scalar(a)));
            }
        }
        if !self.meta.is_empty() {
            out.push_str("    meta:\n");
            for (k, v) in &self.meta {
                out.push_str(&format!(
                    "        - key: {k}\n          value: {}\n",
                    scalar(v)
                ));
            }
        }
        if !self.official_extensions.is_empty() {
            out.push_str("    systemExtensions:\n        officialExtensions:\n");
            for e in &self.official_extensions {
                out.push_str(&format!("            - {}\n", scalar(e)));
            }
        }
        if self.include_well_known_certificates {
            out.push_str("    secureboot:\n        includeWellKnownCertificates: true\n");
        }
        out
    }

    /// The schematic ID (lowercase hex SHA-256 of [`Self::canonical_yaml`]).
    pub fn id(&self) -> String {
        crate::hex::lower(&Sha256::digest(self.canonical_yaml().as_bytes()))
    }
}

/// yaml.v3 prints a string plain unless it could be read back as something else or contains
/// characters with YAML meaning; then it double-quotes it.
fn scalar(s: &str) -> String {
    let special_start = s.starts_with([
        '-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@',
        '`', ' ',
    ]);
    let looks_typed = matches!(
        s.to_ascii_lowercase().as_str(),
        "" | "~" | "null" | "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n"
    ) || s.parse::<f64>().is_ok();
    let special_inner = s.contains(": ") || s.contains(" #") || s.ends_with([' ', ':']);
    let control = s.chars().any(|c| c.is_control());
    if special_start || looks_typed || special_inner || control {
        format!("{s:?}")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vanilla_id_matches_the_factory() {
        assert_eq!(
            Schematic::default().id(),
            "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
        );
    }

    #[test]
    fn qemu_guest_agent_id_matches_the_factory() {
        // The widely published ID for the Proxmox guest-agent schematic.
        let s = Schematic {
            official_extensions: vec!["siderolabs/qemu-guest-agent".into()],
            ..Default::default()
        };
        assert_eq!(
            s.id(),
            "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515"
        );
    }

    #[test]
    fn typed_looking_strings_are_quoted() {
        assert_eq!(scalar("true"), "\"true\"");
        assert_eq!(scalar("1.5"), "\"1.5\"");
        assert_eq!(scalar("net.ifnames=0"), "net.ifnames=0");
    }
}
