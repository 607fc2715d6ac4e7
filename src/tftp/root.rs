//! Root confinement: which files a request may name and where they come from.
//!
//! This module owns the rules that keep a request inside what the server serves: a name with
//! `..`, a leading `/` or a backslash is refused before anything is looked up
//! ([`check_name`]); in fixed-set mode the name is only looked up in the set loaded at start
//! ([`lookup`]), never joined to a path; in root mode the path is canonicalized (following
//! symlinks) and must stay under the canonical root ([`resolve`]), so a symlink cannot escape.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::packet::ErrorCode;

/// Where served files come from.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// Files under a canonical root directory, looked up per request.
    Root(PathBuf),
    /// A fixed set of files loaded at start, looked up by exact name.
    Files(Arc<crate::firststage::FirstStage>),
}

impl Source {
    pub(super) fn describe(&self) -> String {
        match self {
            Source::Root(root) => root.display().to_string(),
            Source::Files(f) => format!(
                "{} ({})",
                f.dir().display(),
                f.names().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Why a requested file cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The name itself is refused before touching the filesystem.
    #[error("refused file name: {0}")]
    Name(#[from] NameError),
    /// The name resolves (through a symlink) outside the root.
    #[error("`{0}` resolves outside the TFTP root (symlink escape)")]
    Escapes(PathBuf),
    /// Nothing at that path.
    #[error("no such file among those served")]
    NotFound,
    /// The path names a directory or special file.
    #[error("not a regular file")]
    NotAFile,
    /// The server may not read the file.
    #[error("permission denied: {0}")]
    Denied(io::Error),
    /// Any other filesystem error.
    #[error("cannot open the file: {0}")]
    Io(io::Error),
}

impl ResolveError {
    pub(super) fn from_io(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => ResolveError::NotFound,
            io::ErrorKind::PermissionDenied => ResolveError::Denied(e),
            _ => ResolveError::Io(e),
        }
    }

    /// The ERROR code and message the client gets (no server paths in it).
    pub(super) fn reply(&self) -> (ErrorCode, &'static str) {
        match self {
            ResolveError::Name(_) | ResolveError::Escapes(_) | ResolveError::Denied(_) => {
                (ErrorCode::AccessViolation, "access violation")
            }
            ResolveError::NotFound | ResolveError::NotAFile => {
                (ErrorCode::FileNotFound, "file not found")
            }
            ResolveError::Io(_) => (ErrorCode::NotDefined, "server could not open the file"),
        }
    }
}

/// Why a requested file name is refused outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Starts with `/`.
    #[error("absolute paths are refused; ask for a path relative to the TFTP root")]
    Absolute,
    /// Contains `\` (a Windows-style path, or an attempt to smuggle `..\`).
    #[error("backslashes are refused in TFTP file names")]
    Backslash,
    /// Contains a `..` component.
    #[error("`..` components are refused in TFTP file names")]
    ParentDir,
    /// Names no file (empty, or only `.` and `/`).
    #[error("the file name names no file")]
    Empty,
}

/// Check a requested name and turn it into a relative path, without touching the filesystem.
pub(crate) fn check_name(name: &str) -> Result<PathBuf, NameError> {
    if name.contains('\\') {
        return Err(NameError::Backslash);
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute);
    }
    let mut rel = PathBuf::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(NameError::ParentDir),
            Component::RootDir | Component::Prefix(_) => return Err(NameError::Absolute),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(NameError::Empty);
    }
    Ok(rel)
}

/// Look a requested name up in the fixed set: `..`, absolute and backslash names are access
/// violations, any other name outside the set is not found.
pub fn lookup(
    files: &crate::firststage::FirstStage,
    name: &str,
) -> Result<axum::body::Bytes, ResolveError> {
    check_name(name)?;
    files.get(name).ok_or(ResolveError::NotFound)
}

/// Resolve a requested name to a regular file under the canonical `root`.
pub(crate) async fn resolve(root: &Path, name: &str) -> Result<PathBuf, ResolveError> {
    let rel = check_name(name)?;
    let canonical = tokio::fs::canonicalize(root.join(&rel))
        .await
        .map_err(ResolveError::from_io)?;
    if !canonical.starts_with(root) {
        return Err(ResolveError::Escapes(rel));
    }
    let meta = tokio::fs::metadata(&canonical)
        .await
        .map_err(ResolveError::from_io)?;
    if !meta.is_file() {
        return Err(ResolveError::NotAFile);
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_checks() {
        assert_eq!(check_name("ipxe.efi").unwrap(), PathBuf::from("ipxe.efi"));
        assert_eq!(check_name("sub/file").unwrap(), PathBuf::from("sub/file"));
        assert_eq!(
            check_name("./sub//file").unwrap(),
            PathBuf::from("sub/file")
        );
        assert_eq!(check_name("../etc/passwd"), Err(NameError::ParentDir));
        assert_eq!(check_name("sub/../../x"), Err(NameError::ParentDir));
        assert_eq!(check_name("sub/.."), Err(NameError::ParentDir));
        assert_eq!(check_name("/etc/passwd"), Err(NameError::Absolute));
        assert_eq!(check_name("a\\b"), Err(NameError::Backslash));
        assert_eq!(check_name("..\\..\\x"), Err(NameError::Backslash));
        assert_eq!(check_name("."), Err(NameError::Empty));
        assert_eq!(check_name(""), Err(NameError::Empty));
    }

    #[tokio::test]
    async fn resolve_confines_to_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("ipxe.efi"), b"ok").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape-dir")).unwrap();
        std::os::unix::fs::symlink("ipxe.efi", root.join("alias")).unwrap();
        std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();

        assert_eq!(
            resolve(&root, "ipxe.efi").await.unwrap(),
            root.join("ipxe.efi")
        );
        assert_eq!(
            resolve(&root, "alias").await.unwrap(),
            root.join("ipxe.efi")
        );
        assert!(matches!(
            resolve(&root, "escape").await,
            Err(ResolveError::Escapes(_))
        ));
        assert!(matches!(
            resolve(&root, "escape-dir/secret").await,
            Err(ResolveError::Escapes(_))
        ));
        assert!(matches!(
            resolve(&root, "sub").await,
            Err(ResolveError::NotAFile)
        ));
        assert!(matches!(
            resolve(&root, "nope").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "ipxe.efi/x").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "dangling").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "../secret").await,
            Err(ResolveError::Name(NameError::ParentDir))
        ));
    }
}
