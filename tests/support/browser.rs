//! The dashboard tests' browser: Debian's chromium (or `$CHROMIUM`) driven by playwright-core
//! from `tests/browser` (installed by scripts/test-deps).

use std::path::{Path, PathBuf};

/// `tests/browser`, once chromium and playwright-core are both there; else a panic saying
/// how to get them (a skipped browser test would pass in CI without testing anything).
pub fn tools() -> PathBuf {
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        chromium.exists() && dir.join("node_modules/playwright-core").exists(),
        "the dashboard tests need Debian's chromium ({}) and playwright-core in {}: run \
         scripts/test-deps (as root)",
        chromium.display(),
        dir.join("node_modules").display()
    );
    dir
}
