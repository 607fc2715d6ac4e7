//! Small filesystem helpers shared by modules that persist files.
//!
//! [`write_atomic`] is the one way talboot replaces a file: readers see either the old or the
//! new content, never a torn write, and the new content survives a power cut once the call
//! returns.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A failed [`write_atomic`], naming the file and the step that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {step}: {source}", .path.display())]
pub struct AtomicWriteError {
    /// The file that was being written.
    pub path: PathBuf,
    /// What was being done when it failed (e.g. "create temporary file in /x").
    pub step: String,
    /// The underlying I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Replaces `path` with `bytes`, atomically and durably, and gives it permission bits `mode`
/// (e.g. `0o600`).
///
/// The bytes go to a temporary file in the same directory (so the rename cannot cross
/// filesystems), which is given `mode`, fsynced, renamed over `path`, and then the directory
/// is fsynced so the rename itself is durable. On error the temporary file is removed.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let fail = |step: String| {
        let path = path.to_path_buf();
        move |source| AtomicWriteError { path, step, source }
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".talboot-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(fail(format!("create temporary file in {}", dir.display())))?;
    // Set the mode explicitly: the mode given at creation is subject to the umask.
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(fail(format!("set mode {mode:o}")))?;
    tmp.write_all(bytes).map_err(fail("write".into()))?;
    tmp.as_file().sync_all().map_err(fail("fsync".into()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .map_err(fail("rename into place".into()))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail(format!("fsync directory {}", dir.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn replaces_content_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.age");
        write_atomic(&path, b"first", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o644);

        write_atomic(&path, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);

        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("secret.age")]);
    }

    #[test]
    fn error_names_the_file() {
        let err =
            write_atomic(Path::new("/nonexistent-dir-talboot/x.age"), b"x", 0o600).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent-dir-talboot/x.age"), "{msg}");
        assert!(msg.contains("create temporary file"), "{msg}");
    }
}
