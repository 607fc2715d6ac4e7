//! `talboot completions SHELL` and `talboot man DIR`: shell completion scripts and man pages
//! generated from the clap definition itself (`clap_complete`, `clap_mangen`), so they can
//! never describe flags the binary does not have. The Debian package ships their output
//! (`packaging/build-deb`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;

use super::{Cli, EXIT_USAGE};

/// Arguments of `talboot completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `talboot man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Directory to write `talboot.1` and one `talboot-<subcommand>.1` per subcommand into
    /// (created if missing).
    pub dir: PathBuf,
}

/// Print the completion script for a shell on stdout.
pub fn completions(args: &CompletionsArgs) -> ExitCode {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "talboot", &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Write every man page into a directory.
pub fn man(args: &ManArgs) -> ExitCode {
    let written = std::fs::create_dir_all(&args.dir)
        .and_then(|()| clap_mangen::generate_to(Cli::command(), &args.dir));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "talboot man: cannot write man pages into {}: {e}",
                args.dir.display()
            );
            ExitCode::from(EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_gets_a_man_page_naming_its_flags() {
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(Cli::command(), dir.path()).unwrap();
        let root = std::fs::read_to_string(dir.path().join("talboot.1")).unwrap();
        assert!(root.contains(".TH talboot 1"), "{root}");
        for sub in Cli::command().get_subcommands() {
            let name = format!("talboot-{}.1", sub.get_name());
            assert!(dir.path().join(&name).is_file(), "{name} missing");
        }
        let import = std::fs::read_to_string(dir.path().join("talboot-images-import.1")).unwrap();
        assert!(import.contains("\\-\\-iso"), "{import}");
    }

    #[test]
    fn bash_completion_knows_the_subcommands() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "talboot",
            &mut out,
        );
        let script = String::from_utf8(out).unwrap();
        assert!(script.contains("complete -F _talboot"), "{script}");
        for sub in ["serve", "images", "completions", "man"] {
            assert!(script.contains(sub), "{sub} not completed");
        }
    }
}
