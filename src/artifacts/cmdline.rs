//! The Talos kernel command line for metal, as the Image Factory generates it.
//!
//! `images pull` stores the factory's own `cmdline-metal-<arch>` (which includes the schematic's
//! extra kernel arguments); this module is the fallback when that file is absent, and the
//! knowledge of which arguments Talos itself requires (`slab_nomerge` and `pti=on` are enforced
//! at boot).

use crate::inventory::{Arch, Version};

/// Arguments Talos refuses to boot without.
pub(crate) const REQUIRED: &[&str] = &["talos.platform=metal", "slab_nomerge", "pti=on"];

/// The default metal command line for `version` on `arch`.
pub(crate) fn default_cmdline(version: &Version, arch: Arch) -> Vec<String> {
    let v = &version.0;
    let at_least = |minor: u64| v.major > 1 || (v.major == 1 && v.minor >= minor);
    let mut args: Vec<&str> = vec!["talos.platform=metal"];
    match arch {
        Arch::Amd64 => {
            if !at_least(8) {
                args.push("console=ttyS0");
            }
            args.push("console=tty0");
        }
        Arch::Arm64 => args.extend(["console=ttyAMA0", "console=tty0"]),
    }
    args.extend([
        "init_on_alloc=1",
        "slab_nomerge",
        "pti=on",
        "consoleblank=0",
        "nvme_core.io_timeout=4294967295",
        "printk.devkmsg=on",
    ]);
    if !at_least(11) {
        args.extend(["ima_template=ima-ng", "ima_appraise=fix", "ima_hash=sha512"]);
    }
    if at_least(10) {
        args.push("selinux=1");
    }
    if at_least(12) {
        args.push("module.sig_enforce=1");
    }
    if at_least(13) {
        args.push("proc_mem.force_override=never");
    }
    args.into_iter().map(str::to_string).collect()
}

/// Split a stored command line file into arguments.
pub fn parse(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// Append `extra` to `base`, where an extra `key=value` replaces an earlier argument with the same
/// key (so an operator's `console=ttyS1,115200n8` is not shadowed), except `console=`, which the
/// kernel accepts several times (the last one becomes /dev/console). An extra argument that
/// would change one Talos requires is refused, since the node would then refuse to boot.
pub fn merge(base: &[String], extra: &[String]) -> Result<Vec<String>, CmdlineError> {
    let key_of = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let mut out: Vec<String> = base.to_vec();
    for arg in extra {
        let key = key_of(arg);
        if let Some(req) = REQUIRED.iter().find(|r| key_of(r) == key)
            && *req != arg
        {
            return Err(CmdlineError::ConflictsWithRequired {
                arg: arg.clone(),
                required: req,
            });
        }
        if key != "console" {
            out.retain(|a| key_of(a) != key);
        }
        out.push(arg.clone());
    }
    Ok(out)
}

/// Why extra kernel arguments cannot be merged into a boot set's command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    /// An argument sets a key Talos requires to another value.
    #[error("kernel argument `{arg}` conflicts with `{required}`, which Talos requires")]
    ConflictsWithRequired {
        /// The argument as written in the inventory.
        arg: String,
        /// The argument Talos requires.
        required: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn talos_1_13_amd64_matches_the_factory() {
        assert_eq!(
            default_cmdline(&v("v1.13.9"), Arch::Amd64).join(" "),
            "talos.platform=metal console=tty0 init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 printk.devkmsg=on selinux=1 module.sig_enforce=1 proc_mem.force_override=never"
        );
    }

    #[test]
    fn arm64_uses_the_pl011_console() {
        let args = default_cmdline(&v("v1.13.9"), Arch::Arm64);
        assert_eq!(&args[1..3], ["console=ttyAMA0", "console=tty0"]);
    }

    #[test]
    fn older_versions_drop_newer_arguments() {
        let args = default_cmdline(&v("v1.11.0"), Arch::Amd64).join(" ");
        assert!(
            args.contains("selinux=1") && !args.contains("module.sig_enforce"),
            "{args}"
        );
        for required in REQUIRED {
            assert!(args.contains(required));
        }
    }

    #[test]
    fn merge_replaces_keys_but_keeps_consoles() {
        let base = parse("talos.platform=metal console=tty0 pti=on");
        let out = merge(
            &base,
            &parse("console=ttyS1,115200n8 talos.dashboard.disabled=1"),
        )
        .unwrap();
        assert_eq!(
            out.join(" "),
            "talos.platform=metal console=tty0 pti=on console=ttyS1,115200n8 talos.dashboard.disabled=1"
        );
        let err = merge(&base, &parse("pti=off")).unwrap_err();
        assert_eq!(
            err,
            CmdlineError::ConflictsWithRequired {
                arg: "pti=off".into(),
                required: "pti=on"
            }
        );
        assert_eq!(
            err.to_string(),
            "kernel argument `pti=off` conflicts with `pti=on`, which Talos requires"
        );
    }
}
