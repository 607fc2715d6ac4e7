//! The talboot binary: everything lives in the library; see `talboot::cli`.

fn main() -> std::process::ExitCode {
    talboot::cli::run()
}
