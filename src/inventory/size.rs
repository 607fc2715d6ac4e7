//! Talos's disk-size expressions (`<= 600GB`, `>=1TiB`): the grammar of the `size` field of
//! an inventory disk selector. The inventory checks a selector's size when it loads, the
//! renderer turns it into CEL and the provisioner matches it against a node's disks, all with
//! this one parser, so what `check` accepts is exactly what Talos reads.

/// A size comparison from a selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeExpr {
    /// The comparison.
    pub(crate) op: SizeOp,
    /// The size in bytes.
    pub bytes: u64,
}

/// Comparison operators a selector size may start with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeOp {
    /// `==` or no operator.
    Eq,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

impl SizeExpr {
    /// Whether a disk of `size` bytes satisfies the comparison.
    pub fn holds(self, size: u64) -> bool {
        match self.op {
            SizeOp::Eq => size == self.bytes,
            SizeOp::Lt => size < self.bytes,
            SizeOp::Le => size <= self.bytes,
            SizeOp::Gt => size > self.bytes,
            SizeOp::Ge => size >= self.bytes,
        }
    }
}

/// Parses a selector size as Talos does (`InstallDiskSizeMatcher.UnmarshalYAML`,
/// `v1alpha1_types.go`): trimmed, an optional `>=`, `<=`, `>`, `<` or `==` (tried in that
/// order), then the rest, trimmed, through `humanize.ParseBytes`: a run of digits, `.` and
/// `,` (commas dropped) read as a float, then a case-insensitive unit (`B`, `k`/`kB`...`E`/`EB`
/// powers of 1000, `Ki`/`KiB`...`Ei`/`EiB` powers of 1024, none = bytes), the product
/// truncated to whole bytes.
pub(crate) fn parse_size_expr(s: &str) -> Result<SizeExpr, SizeError> {
    let s = s.trim();
    let (op, rest) = [
        (">=", SizeOp::Ge),
        ("<=", SizeOp::Le),
        (">", SizeOp::Gt),
        ("<", SizeOp::Lt),
        ("==", SizeOp::Eq),
    ]
    .iter()
    .find_map(|(p, op)| s.strip_prefix(p).map(|r| (*op, r)))
    .unwrap_or((SizeOp::Eq, s));
    let bytes = parse_bytes(rest.trim())?;
    Ok(SizeExpr { op, bytes })
}

/// Why a selector size is not one Talos reads; the message starts as Talos's own
/// (`failed to parse disk size`) and says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number where the size starts.
    #[error(
        "failed to parse disk size {text:?}: {text:?} does not start with a number (e.g. `<= 600GB`)"
    )]
    NotANumber {
        /// The size as written (after the comparison).
        text: String,
    },
    /// A unit `humanize.ParseBytes` does not know.
    #[error(
        "failed to parse disk size {text:?}: unknown unit {unit:?}; use B, kB, MB, GB, TB \
         (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
    )]
    UnknownUnit {
        /// The size as written.
        text: String,
        /// The unit, lower-cased.
        unit: String,
    },
    /// More bytes than 64 bits hold.
    #[error("failed to parse disk size {text:?}: too large: {text}")]
    TooLarge {
        /// The size as written.
        text: String,
    },
}

/// `humanize.ParseBytes` (dustin/go-humanize v1.0.1 `bytes.go`).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, SizeError> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(s.len());
    let num = s[..end].replace(',', "");
    let f: f64 = num
        .parse()
        .map_err(|_| SizeError::NotANumber { text: s.to_owned() })?;
    let unit = s[end..].trim().to_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000u64.pow(2),
        "g" | "gb" => 1000u64.pow(3),
        "t" | "tb" => 1000u64.pow(4),
        "p" | "pb" => 1000u64.pow(5),
        "e" | "eb" => 1000u64.pow(6),
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        "pi" | "pib" => 1 << 50,
        "ei" | "eib" => 1 << 60,
        other => {
            return Err(SizeError::UnknownUnit {
                text: s.to_owned(),
                unit: other.to_owned(),
            });
        }
    };
    let v = f * mult as f64;
    if v >= u64::MAX as f64 {
        return Err(SizeError::TooLarge { text: s.to_owned() });
    }
    // Go's uint64(f) truncates toward zero.
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_expressions_as_humanize_parses_them() {
        let e = parse_size_expr("<= 600GB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Le, 600_000_000_000));
        let e = parse_size_expr(">=1TiB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Ge, 1 << 40));
        let e = parse_size_expr("1.5 TB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Eq, 1_500_000_000_000));
        assert_eq!(parse_size_expr("512").unwrap().bytes, 512);
        // Units without B, commas, case, truncation (not rounding).
        assert_eq!(parse_size_expr("4G").unwrap().bytes, 4_000_000_000);
        assert_eq!(
            parse_size_expr("1,000 gb").unwrap().bytes,
            1_000_000_000_000
        );
        assert_eq!(parse_size_expr("1.5Ki").unwrap().bytes, 1536);
        assert_eq!(parse_size_expr("0.9").unwrap().bytes, 0);
        assert_eq!(parse_size_expr("== 256").unwrap().op, SizeOp::Eq);
        for bad in [
            "big",
            "10 XB",
            "=5GB",
            "!= 5GB",
            "< = 5GB",
            "-5GB",
            "",
            "99999999999 EB",
        ] {
            assert!(parse_size_expr(bad).is_err(), "{bad}");
        }
        assert!(e.holds(1_500_000_000_000) && !e.holds(1));
    }
}
