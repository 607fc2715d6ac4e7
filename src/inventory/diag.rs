//! Located diagnostics for inventory loading and validation.
//!
//! Every problem found in an operator's file is reported with the file, line, column and field
//! path it concerns, plus a hint saying what would be valid. Loading never stops at the first
//! problem: diagnostics are collected into a [`Diagnostics`] list so the operator fixes the whole
//! file in one pass.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A position in a source file (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Loc {
    /// The file the position is in; shared because every node of a file points at it.
    pub file: Arc<PathBuf>,
    /// 1-based line number.
    pub line: usize,
    /// 1-based column number.
    pub column: usize,
}

impl Loc {
    /// A location in `file` at `line`:`column` (both 1-based).
    pub fn new(file: Arc<PathBuf>, line: usize, column: usize) -> Self {
        Self { file, line, column }
    }

    /// A location that names only a file (for problems with the file as a whole).
    pub(crate) fn file_only(file: &Path) -> Self {
        Self {
            file: Arc::new(file.to_path_buf()),
            line: 0,
            column: 0,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
        }
    }
}

/// How bad a diagnostic is: errors make the inventory invalid, warnings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The inventory is unusable until this is fixed.
    Error,
    /// Probably a mistake, but talboot can proceed.
    Warning,
}

/// One located problem in an inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub(crate) severity: Severity,
    /// Where in which file.
    pub(crate) loc: Loc,
    /// Field path from the document root, e.g. `nodes[3].macs[0]`.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// What would be valid, when we can say.
    pub hint: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        if self.path.is_empty() {
            write!(f, "{}: {sev}: {}", self.loc, self.message)?;
        } else {
            write!(f, "{}: {sev}: {}: {}", self.loc, self.path, self.message)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// An ordered collection of diagnostics.
#[derive(Debug, Default, Clone)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record an error at `loc` for field `path`.
    pub fn error(&mut self, loc: &Loc, path: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Error, loc, path.into(), message.into(), None);
    }

    /// Record an error with a hint saying what would be valid.
    pub(crate) fn error_hint(
        &mut self,
        loc: &Loc,
        path: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.push(
            Severity::Error,
            loc,
            path.into(),
            message.into(),
            Some(hint.into()),
        );
    }

    /// Record a warning, optionally with a hint.
    pub fn warning(
        &mut self,
        loc: &Loc,
        path: impl Into<String>,
        message: impl Into<String>,
        hint: Option<String>,
    ) {
        self.push(Severity::Warning, loc, path.into(), message.into(), hint);
    }

    fn push(
        &mut self,
        severity: Severity,
        loc: &Loc,
        path: String,
        message: String,
        hint: Option<String>,
    ) {
        self.items.push(Diagnostic {
            severity,
            loc: loc.clone(),
            path,
            message,
            hint,
        });
    }

    /// Append all diagnostics of `other`.
    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    /// True when at least one diagnostic is an error.
    pub(crate) fn has_errors(&self) -> bool {
        self.items.iter().any(|d| d.severity == Severity::Error)
    }

    /// Number of errors.
    pub(crate) fn error_count(&self) -> usize {
        self.items
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
    }

    /// All diagnostics, sorted by file position so output reads top to bottom.
    pub fn sorted(&self) -> Vec<&Diagnostic> {
        let mut v: Vec<&Diagnostic> = self.items.iter().collect();
        v.sort_by(|a, b| {
            (&a.loc.file, a.loc.line, a.loc.column, a.severity).cmp(&(
                &b.loc.file,
                b.loc.line,
                b.loc.column,
                b.severity,
            ))
        });
        v
    }

    /// Iterate in recording order.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// Number of diagnostics of any severity.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Suggest the closest of `candidates` to a misspelled `word`, if one is close enough.
pub(crate) fn did_you_mean<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| {
            (
                strsim::jaro_winkler(&word.to_ascii_lowercase(), &c.to_ascii_lowercase()),
                *c,
            )
        })
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_pick_the_close_field() {
        let fields = [
            "name",
            "macs",
            "role",
            "address",
            "installDisk",
            "diskSelector",
        ];
        assert_eq!(did_you_mean("adress", &fields), Some("address"));
        assert_eq!(did_you_mean("instalDisk", &fields), Some("installDisk"));
        assert_eq!(did_you_mean("zzz", &fields), None);
    }

    #[test]
    fn display_has_location_path_and_hint() {
        let mut d = Diagnostics::new();
        let loc = Loc::new(Arc::new(PathBuf::from("a.yaml")), 3, 5);
        d.error_hint(&loc, "nodes[0].mac", "bad", "use aa:bb:cc:dd:ee:ff");
        let s = d.iter().next().unwrap().to_string();
        assert_eq!(
            s,
            "a.yaml:3:5: error: nodes[0].mac: bad\n  hint: use aa:bb:cc:dd:ee:ff"
        );
        assert!(d.has_errors());
    }
}
