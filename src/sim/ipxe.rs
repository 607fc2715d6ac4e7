//! The part of iPXE's script language a simulated machine needs to follow talboot's boot
//! scripts: `${...}` settings expansion, `chain`, `kernel`, `initrd`, `boot`, `exit`, `echo`,
//! and the `|| goto label` failure arms. Pure: text in, commands out; the machine fetches.
//!
//! Semantics follow iPXE: an unknown setting expands to the empty string, options
//! (`--replace`, `--name x`) precede the image URL, and a script ends at `exit`, at `boot`,
//! at a `chain` (with `--replace` nothing after it runs) or when it falls into a label, which
//! in talboot's scripts only starts the failure path.

use std::collections::BTreeMap;

/// One command the machine acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Fetch and run another script.
    Chain {
        /// Expanded URL.
        url: String,
    },
    /// Fetch a kernel; the rest of the line is its command line.
    Kernel {
        /// Expanded URL.
        url: String,
        /// Kernel command line.
        cmdline: String,
    },
    /// Fetch an initrd.
    Initrd {
        /// Expanded URL.
        url: String,
    },
    /// Start the loaded kernel.
    Boot,
    /// Leave iPXE: the firmware goes on to the next boot device (the local disk).
    Exit,
    /// Print a line.
    Echo(String),
}

/// Why a script cannot be followed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScriptError {
    /// The first line is not `#!ipxe`.
    #[error("not an iPXE script (first line is {0:?}, want `#!ipxe`)")]
    NoMagic(String),
    /// A command that needs an image has none.
    #[error("line {line}: `{command}` without an image URL")]
    MissingUrl {
        /// 1-based line number.
        line: usize,
        /// The command.
        command: String,
    },
}

/// Settings `${name}` expands to; what iPXE would know about this machine.
pub type Settings = BTreeMap<String, String>;

/// Expands `${name}` and `${name:type}` references; unknown settings become "".
pub(crate) fn expand(text: &str, settings: &Settings) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) => {
                let name = &after[..end];
                out.push_str(settings.get(name).map(String::as_str).unwrap_or(""));
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The commands of `script` that run on the success path, in order, with settings
/// expanded. Lines after the first label, comments and commands the simulation does not
/// need (`imgfree`, `sleep`, `dhcp`, `goto`) are skipped.
pub fn commands(script: &str, settings: &Settings) -> Result<Vec<Command>, ScriptError> {
    let mut lines = script.lines();
    let first = lines.next().unwrap_or("").trim();
    if first != "#!ipxe" {
        return Err(ScriptError::NoMagic(first.chars().take(40).collect()));
    }
    let mut out = Vec::new();
    for (i, raw) in lines.enumerate() {
        let line_no = i + 2;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with(':') {
            break;
        }
        // `cmd args || goto failed`: the failure arm is the machine's to take.
        let line = line.split(" || ").next().unwrap_or(line).trim();
        let expanded = expand(line, settings);
        let mut words = expanded.split_whitespace();
        let Some(cmd) = words.next() else { continue };
        let args: Vec<&str> = words.collect();
        let image = |args: &[&str]| -> Result<(String, String), ScriptError> {
            let mut it = args.iter().copied().peekable();
            while let Some(a) = it.peek() {
                if let Some(opt) = a.strip_prefix("--") {
                    it.next();
                    // `--name x` takes a value; `--name=x`, `--replace`, `--autofree` do not.
                    if opt == "name" || opt == "n" {
                        it.next();
                    }
                } else {
                    break;
                }
            }
            let url = it.next().ok_or_else(|| ScriptError::MissingUrl {
                line: line_no,
                command: cmd.to_owned(),
            })?;
            Ok((url.to_owned(), it.collect::<Vec<_>>().join(" ")))
        };
        match cmd {
            "chain" | "chainload" => {
                let (url, _) = image(&args)?;
                out.push(Command::Chain { url });
                break;
            }
            "kernel" | "imgexec" => {
                let (url, cmdline) = image(&args)?;
                out.push(Command::Kernel { url, cmdline });
            }
            "initrd" | "module" => {
                let (url, _) = image(&args)?;
                out.push(Command::Initrd { url });
            }
            "boot" => {
                out.push(Command::Boot);
                break;
            }
            "exit" => {
                out.push(Command::Exit);
                break;
            }
            "echo" => out.push(Command::Echo(args.join(" "))),
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        [
            ("netX/mac:hexhyp", "3c-ec-ef-10-00-01"),
            ("netX/mac", "3c:ec:ef:10:00:01"),
            ("buildarch", "x86_64"),
            ("platform", "efi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    #[test]
    fn expansion_follows_ipxe() {
        let s = settings();
        assert_eq!(
            expand("a=${netX/mac:hexhyp}&p=${platform}&u=${uuid}", &s),
            "a=3c-ec-ef-10-00-01&p=efi&u="
        );
        assert_eq!(expand("broken ${unterminated", &s), "broken ${unterminated");
    }

    #[test]
    fn the_entry_script_chains_to_the_per_machine_script() {
        let script = "#!ipxe\n# comment\necho asking for ${netX/mac}\n\
            chain --replace --autofree http://h:1/boot.ipxe?mac=${netX/mac:hexhyp}&arch=${buildarch} || goto failed\n\
            :failed\necho retry\nchain --replace http://h:1/boot.ipxe || exit\n";
        assert_eq!(
            commands(script, &settings()).unwrap(),
            [
                Command::Echo("asking for 3c:ec:ef:10:00:01".into()),
                Command::Chain {
                    url: "http://h:1/boot.ipxe?mac=3c-ec-ef-10-00-01&arch=x86_64".into()
                },
            ]
        );
    }

    #[test]
    fn a_talos_script_loads_kernel_and_initrd_then_boots() {
        let script = "#!ipxe\nimgfree\nkernel http://h/k talos.platform=metal console=ttyS0 || goto failed\n\
            initrd --name initramfs.xz http://h/i || goto failed\nboot || goto failed\n:failed\nexit\n";
        assert_eq!(
            commands(script, &settings()).unwrap(),
            [
                Command::Kernel {
                    url: "http://h/k".into(),
                    cmdline: "talos.platform=metal console=ttyS0".into()
                },
                Command::Initrd {
                    url: "http://h/i".into()
                },
                Command::Boot,
            ]
        );
    }

    #[test]
    fn bad_scripts_are_named() {
        assert!(matches!(
            commands("<html>", &settings()),
            Err(ScriptError::NoMagic(_))
        ));
        assert_eq!(
            commands("#!ipxe\nkernel --name x\n", &settings()),
            Err(ScriptError::MissingUrl {
                line: 2,
                command: "kernel".into()
            })
        );
        assert_eq!(
            commands("#!ipxe\necho installed\nexit\n", &settings()).unwrap(),
            [Command::Echo("installed".into()), Command::Exit]
        );
    }
}
