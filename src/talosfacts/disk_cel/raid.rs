//! Which disks Talos makes members of a `RAIDArrayConfig` array, and talboot's refusal when
//! that would be chance or never happen.
//!
//! Talos (`MDArrayReconcileController`, v1.14.0-rc.1 `md_array_reconcile.go`) evaluates the
//! array's one `provisioning.volumeSelector.match` over every whole disk that holds no
//! partitions and is not the system disk, takes every match as a member, and waits until at
//! least two match. talboot writes one expression per member joined by `||`, so it splits
//! the expression back at its top-level `||` and requires each part to match exactly one
//! disk of its own; a selector with no top-level `||` must match at least two disks, all of
//! which become members.

use super::pick::{CelRefusal, Purpose, RefusalKind, choose, describe, talos_order};
use super::{CelDisk, compile_member, eval};

/// `minMembers` in `md_array_reconcile.go`.
const MIN_MEMBERS: usize = 2;

/// The top-level disjuncts of `text`, each without one pair of enclosing parentheses.
/// `text` itself when it has no top-level `||`, or a top-level `?:` (which binds looser
/// than `||`, so splitting there would change the meaning).
pub fn split_members(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let (mut depth, mut quote, mut i) = (0i32, None::<u8>, 0);
    let mut cuts = Vec::new();
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(_) if b == b'\\' => i += 1,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b'?' if depth == 0 => return vec![text.trim()],
                b'|' if depth == 0 && bytes.get(i + 1) == Some(&b'|') => {
                    cuts.push(i);
                    i += 1;
                }
                _ => {}
            },
        }
        i += 1;
    }
    let mut parts = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain(std::iter::once(text.len())) {
        parts.push(unwrap_parens(text[start..c].trim()));
        start = c + 2;
    }
    parts
}

/// `s` without one pair of parentheses that encloses all of it.
fn unwrap_parens(s: &str) -> &str {
    let Some(inner) = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')) else {
        return s;
    };
    // `(a) && (b)` starts and ends with parentheses that are not one pair.
    let mut depth = 0i32;
    let mut quote = None::<u8>;
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(_) if b == b'\\' => i += 1,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'(' => depth += 1,
                b')' if depth == 0 => return s,
                b')' => depth -= 1,
                _ => {}
            },
        }
        i += 1;
    }
    inner.trim()
}

/// The member disks (`dev_path`, in Talos's order) of array `name` whose selector is `text`,
/// or why talboot refuses: a member that matches no disk, several, or a disk another member
/// already matched; a single selector matching fewer than two disks; an invalid expression.
pub fn choose_members(
    name: &str,
    text: &str,
    disks: &[CelDisk],
) -> Result<Vec<String>, CelRefusal> {
    let parts = split_members(text);
    let refuse = |what: String, expr: &str, reason| CelRefusal {
        what,
        expr: expr.to_owned(),
        reason: Box::new(reason),
        disks: talos_order(disks).iter().map(|d| describe(d)).collect(),
    };
    if let [only] = parts.as_slice() {
        let only: &str = only;
        let what = format!("RAIDArrayConfig {name}");
        let expr = compile_member(only)
            .map_err(|e| refuse(what.clone(), only, RefusalKind::Invalid(e)))?;
        let mut matched = Vec::new();
        for d in talos_order(disks) {
            match eval(&expr, d, Some(false)) {
                Ok(true) => matched.push(d.dev_path.clone()),
                Ok(false) => {}
                Err(error) => {
                    let disk = d.dev_path.clone();
                    return Err(refuse(what, only, RefusalKind::EvalError { disk, error }));
                }
            }
        }
        if matched.len() < MIN_MEMBERS {
            return Err(refuse(what, only, RefusalKind::TooFewMembers { matched }));
        }
        return Ok(matched);
    }
    let mut members: Vec<(String, String)> = Vec::new();
    for (i, &part) in parts.iter().enumerate() {
        let what = format!("RAIDArrayConfig {name} member {}", i + 1);
        let expr = compile_member(part)
            .map_err(|e| refuse(what.clone(), part, RefusalKind::Invalid(e)))?;
        let pick = choose(&what, &expr, disks, &Purpose::Install)?.disk;
        if let Some((other, _)) = members.iter().find(|(_, d)| *d == pick) {
            let reason = RefusalKind::SharedMember {
                disk: pick,
                other: other.clone(),
            };
            return Err(refuse(what, part, reason));
        }
        members.push((what, pick));
    }
    let mut out: Vec<String> = members.into_iter().map(|(_, d)| d).collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(id: &str, serial: &str, transport: &str, gib: u64) -> CelDisk {
        CelDisk {
            dev_path: format!("/dev/{id}"),
            serial: serial.into(),
            transport: transport.into(),
            size: gib << 30,
            sector_size: 512,
            ..CelDisk::default()
        }
    }

    /// Talos's RAID-boot CI: two virtio disks of 12 GiB or more (QEMU_SYSTEM_DISKS=2).
    fn ci_disks() -> Vec<CelDisk> {
        vec![
            disk("vdb", "B", "virtio", 12),
            disk("vda", "A", "virtio", 12),
        ]
    }

    const CI_SELECTOR: &str = "disk.transport == \"virtio\" && disk.size >= 12u * GiB";

    #[test]
    fn splitting_follows_cel_precedence_and_quotes() {
        assert_eq!(
            split_members("(disk.serial == \"A\") || (disk.serial == \"B\")"),
            ["disk.serial == \"A\"", "disk.serial == \"B\""]
        );
        assert_eq!(split_members(CI_SELECTOR), [CI_SELECTOR]);
        // `||` inside a string, inside parentheses, or under a ternary does not split.
        assert_eq!(
            split_members("disk.model == \"a||b\""),
            ["disk.model == \"a||b\""]
        );
        assert_eq!(split_members("(a || b) && c"), ["(a || b) && c"]);
        assert_eq!(split_members("a ? b || c : d"), ["a ? b || c : d"]);
        assert_eq!(split_members("a || b && c"), ["a", "b && c"]);
        assert_eq!(split_members("(a) && (b) || c"), ["(a) && (b)", "c"]);
    }

    /// The CI patch's selector matches both disks, so both are members (in Talos's order).
    #[test]
    fn talos_ci_selector_takes_both_disks() {
        assert_eq!(
            choose_members("boot", CI_SELECTOR, &ci_disks()).unwrap(),
            ["/dev/vda", "/dev/vdb"]
        );
    }

    /// One match: Talos's array stays `waiting for enough member disks: matched 1, required 2`.
    #[test]
    fn one_matching_disk_is_refused_as_too_few() {
        let mut disks = ci_disks();
        disks[0].size = 8 << 30;
        let e = choose_members("boot", CI_SELECTOR, &disks).unwrap_err();
        assert!(
            matches!(e.reason.as_ref(), RefusalKind::TooFewMembers { matched } if matched == &["/dev/vda"]),
            "{e}"
        );
        assert!(e.to_string().contains("at least 2 members"), "{e}");
    }

    #[test]
    fn each_member_must_match_exactly_one_disk_of_its_own() {
        let mut disks = ci_disks();
        disks.push(disk("sda", "C", "sata", 100));
        let ok = "(disk.serial == \"A\") || (disk.serial == \"C\")";
        assert_eq!(
            choose_members("boot", ok, &disks).unwrap(),
            ["/dev/sda", "/dev/vda"]
        );

        let twice =
            "(disk.serial == \"A\") || (disk.transport == \"virtio\" && disk.serial != \"B\")";
        let e = choose_members("boot", twice, &disks).unwrap_err();
        assert_eq!(e.what, "RAIDArrayConfig boot member 2");
        assert!(
            matches!(e.reason.as_ref(), RefusalKind::SharedMember { disk, other }
                if disk == "/dev/vda" && other == "RAIDArrayConfig boot member 1"),
            "{e}"
        );

        let broad = "(disk.serial == \"A\") || (disk.transport == \"virtio\")";
        let e = choose_members("boot", broad, &disks).unwrap_err();
        assert!(
            matches!(e.reason.as_ref(), RefusalKind::Ambiguous { .. }),
            "{e}"
        );

        let none = "(disk.serial == \"A\") || (disk.serial == \"Z\")";
        let e = choose_members("boot", none, &disks).unwrap_err();
        assert!(matches!(e.reason.as_ref(), RefusalKind::NoMatch), "{e}");
    }

    /// `VolumeLocator` has no `system_disk` and no `glob`: Talos refuses the document.
    #[test]
    fn member_selectors_are_checked_in_the_volume_locator_environment() {
        for bad in [
            "!system_disk",
            "glob(\"S*\", disk.serial)",
            "volume.name == \"xfs\"",
        ] {
            let e = choose_members("boot", bad, &ci_disks()).unwrap_err();
            assert!(
                matches!(e.reason.as_ref(), RefusalKind::Invalid(_)),
                "{bad}: {e}"
            );
        }
    }
}
