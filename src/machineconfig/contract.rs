//! The install-disk CEL expressions the v1.14 contract needs. Everything here is pure.
//!
//! Only the new documents of the v1.14 contract offer the CEL install-disk selector, so the
//! inventory's install disk (a path or a legacy selector) is written as a CEL expression here.
//! The contract itself, which Talos minor switches what, is
//! [`crate::talosfacts::contract::Contract`]: the inventory checks patches against it too.

use crate::inventory::{DiskSelector, DiskType};

/// Go's `%q` for the text of a path or pattern: what `cel.ParseBooleanExpression` then the CEL
/// unparser print for a string literal (`strconv.Quote`).
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `UnattendedInstallConfig` disk expression for an install disk path.
///
/// `gen config` writes `disk.dev_path == "<disk>"` (`generate/init.go`,
/// `unattendedInstallConfig`). `dev_path` is always `/dev/<kernel name>`
/// (`internal/app/machined/pkg/controllers/block/disks.go`), so a `/dev/disk/by-*` link would
/// never match that form; for those talboot writes `"<link>" in disk.symlinks`, the form
/// Talos's own tooling uses for links (`cmd/talosctl/.../configmaker/internal/makers/qemu.go`,
/// `hack/test/patches/md-boot-array.yaml`).
pub(crate) fn install_disk_expression(disk: &str) -> String {
    if disk.starts_with("/dev/disk/") {
        format!("{} in disk.symlinks", go_quote(disk))
    } else {
        format!("disk.dev_path == {}", go_quote(disk))
    }
}

/// A legacy `installDiskSelector` Talos cannot turn into CEL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `name` is refused by `DiskMatchExpression` ("selector on name is not supported").
    #[error(
        "diskSelector.name is not supported by Talos; select by model, serial, wwid or busPath"
    )]
    Name,
    /// A `type` Talos does not know.
    #[error("diskSelector.type {0:?} is not one of nvme, sd, hdd, ssd")]
    Type(String),
    /// A size Talos cannot parse.
    #[error("diskSelector.size: {0}")]
    Size(#[from] crate::inventory::size::SizeError),
}

/// The fields of a legacy install disk selector, as written (`InstallDiskSelector`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LegacySelector {
    pub size: Option<String>,
    pub name: Option<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub modalias: Option<String>,
    pub uuid: Option<String>,
    pub wwid: Option<String>,
    pub disk_type: Option<String>,
    pub bus_path: Option<String>,
}

impl From<&DiskSelector> for LegacySelector {
    fn from(s: &DiskSelector) -> Self {
        LegacySelector {
            size: s.size.clone(),
            model: s.model.clone(),
            serial: s.serial.clone(),
            wwid: s.wwid.clone(),
            disk_type: s.disk_type.map(|t: DiskType| t.as_str().to_owned()),
            bus_path: s.bus_path.clone(),
            ..Default::default()
        }
    }
}

/// The CEL expression Talos evaluates for a legacy install disk selector
/// (`InstallConfig.DiskMatchExpression`, `pkg/machinery/config/types/v1alpha1/
/// v1alpha1_provider.go`): the terms in its order (size, uuid, wwid, model, serial, modalias,
/// `disk.transport != ""`, type, busPath, `!disk.readonly`, `!disk.cdrom`) joined by `&&`,
/// string patterns through `glob`, sizes as uint literals. Its test cases
/// (`v1alpha1_provider_test.go`) are carried over as this function's tests.
pub(crate) fn selector_expression(sel: &LegacySelector) -> Result<String, SelectorError> {
    let mut terms = Vec::new();
    if let Some(size) = &sel.size {
        use crate::inventory::size::{SizeOp, parse_size_expr};
        let e = parse_size_expr(size)?;
        let op = match e.op {
            SizeOp::Eq => "==",
            SizeOp::Lt => "<",
            SizeOp::Le => "<=",
            SizeOp::Gt => ">",
            SizeOp::Ge => ">=",
        };
        terms.push(format!("disk.size {op} {}u", e.bytes));
    }
    let glob = |p: &str, field: &str| format!("glob({}, disk.{field})", go_quote(p));
    for (value, field) in [
        (&sel.uuid, "uuid"),
        (&sel.wwid, "wwid"),
        (&sel.model, "model"),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            terms.push(glob(v, field));
        }
    }
    if sel.name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(SelectorError::Name);
    }
    for (value, field) in [(&sel.serial, "serial"), (&sel.modalias, "modalias")] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            terms.push(glob(v, field));
        }
    }
    terms.push("disk.transport != \"\"".to_owned());
    match sel.disk_type.as_deref() {
        None | Some("") => {}
        Some("nvme") => terms.push("disk.transport == \"nvme\"".into()),
        Some("sd") => terms.push("disk.transport == \"mmc\"".into()),
        Some("hdd") => terms.push("disk.rotational".into()),
        Some("ssd") => terms.push("!disk.rotational".into()),
        Some(other) => return Err(SelectorError::Type(other.to_owned())),
    }
    if let Some(v) = sel.bus_path.as_deref().filter(|v| !v.is_empty()) {
        terms.push(glob(v, "bus_path"));
    }
    terms.push("!disk.readonly".into());
    terms.push("!disk.cdrom".into());
    Ok(join_and(&terms))
}

/// Joins terms with `&&` as the CEL unparser prints them (`cel.AstToString` ->
/// cel-go `parser.Unparse` defaults): the operator is followed by a line break instead of a
/// space once the current line, counted with the operator's internal name `_&&_`, reaches
/// column 80 (`writeOperatorWithWrapping`). A right-nested `&&` chain prints without parentheses.
fn join_and(terms: &[String]) -> String {
    let mut out = String::new();
    let mut last_wrap = 0;
    for (i, t) in terms.iter().enumerate() {
        if i > 0 {
            if out.len() - last_wrap + "_&&_".len() >= 80 {
                last_wrap = out.len();
                out.push_str(" &&\n");
            } else {
                out.push_str(" && ");
            }
        }
        out.push_str(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_disk_expression_is_gen_configs_form() {
        // generate/init.go unattendedInstallConfig; golden v1.14/overrides-*.yaml.
        assert_eq!(
            install_disk_expression("/dev/vda"),
            r#"disk.dev_path == "/dev/vda""#
        );
        assert_eq!(
            install_disk_expression("/dev/disk/by-id/nvme-Samsung_980_S1"),
            r#""/dev/disk/by-id/nvme-Samsung_980_S1" in disk.symlinks"#
        );
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
    }

    /// The cases of siderolabs/talos v1.14.0-rc.1
    /// `pkg/machinery/config/types/v1alpha1/v1alpha1_provider_test.go` (TestDiskMatchExpression).
    #[test]
    fn selector_expression_matches_talos_test_cases() {
        let cases = [
            (
                LegacySelector {
                    size: Some("<= 256KiB".into()),
                    ..Default::default()
                },
                r#"disk.size <= 262144u && disk.transport != "" && !disk.readonly && !disk.cdrom"#,
            ),
            (
                LegacySelector {
                    size: Some("1MiB".into()),
                    disk_type: Some("nvme".into()),
                    ..Default::default()
                },
                "disk.size == 1048576u && disk.transport != \"\" && disk.transport == \"nvme\" && !disk.readonly &&\n!disk.cdrom",
            ),
            (
                LegacySelector {
                    size: Some("1MiB".into()),
                    disk_type: Some("hdd".into()),
                    modalias: Some("pci:1234:5678*".into()),
                    ..Default::default()
                },
                "disk.size == 1048576u && glob(\"pci:1234:5678*\", disk.modalias) && disk.transport != \"\" &&\ndisk.rotational && !disk.readonly && !disk.cdrom",
            ),
            (
                LegacySelector {
                    disk_type: Some("ssd".into()),
                    ..Default::default()
                },
                r#"disk.transport != "" && !disk.rotational && !disk.readonly && !disk.cdrom"#,
            ),
            (
                LegacySelector {
                    bus_path: Some("/pci-0000:00:1f.2/*".into()),
                    ..Default::default()
                },
                "disk.transport != \"\" && glob(\"/pci-0000:00:1f.2/*\", disk.bus_path) && !disk.readonly &&\n!disk.cdrom",
            ),
            (
                LegacySelector {
                    uuid: Some("0000-0001-*".into()),
                    ..Default::default()
                },
                r#"glob("0000-0001-*", disk.uuid) && disk.transport != "" && !disk.readonly && !disk.cdrom"#,
            ),
        ];
        for (sel, want) in cases {
            assert_eq!(selector_expression(&sel).unwrap(), want, "{sel:?}");
        }
        assert_eq!(
            selector_expression(&LegacySelector {
                name: Some("sda".into()),
                ..Default::default()
            }),
            Err(SelectorError::Name)
        );
        assert!(matches!(
            selector_expression(&LegacySelector {
                disk_type: Some("floppy".into()),
                ..Default::default()
            }),
            Err(SelectorError::Type(_))
        ));
    }
}
