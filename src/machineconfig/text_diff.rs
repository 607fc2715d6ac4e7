//! A unified line diff of two texts, for the operator: `talboot gen --check` prints it per
//! node that differs, and the tests of rendered configs show it when a golden file differs.

use std::fmt::Write as _;

/// Lines of context around each change in [`line_diff`].
const CONTEXT: usize = 3;

/// A line diff of `old` -> `new` in unified style (`-`/`+`/` ` prefixes, `@@` hunk headers with
/// 1-based line numbers), from a longest-common-subsequence alignment. Empty when equal.
pub(crate) fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j] = length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (op, old line index, new line index).
    let mut ops: Vec<(char, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i, j));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i, j));
            i += 1;
        } else {
            ops.push(('+', i, j));
            j += 1;
        }
    }
    let mut out = String::new();
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k + 1 < changed.len() && changed[k + 1] <= end + 2 * CONTEXT + 1 {
            k += 1;
            end = changed[k];
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let (_, oi, nj) = ops[start];
        let _ = writeln!(out, "@@ -{} +{} @@", oi + 1, nj + 1);
        for &(op, oi, nj) in &ops[start..end] {
            let line = if op == '+' { b[nj] } else { a[oi] };
            let _ = writeln!(out, "{op}{line}");
        }
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_marks_changes_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\ni\nj\nk\nl\nm\nn\n";
        let d = line_diff(old, new);
        assert_eq!(
            d,
            "@@ -1 +1 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n@@ -11 +11 @@\n k\n l\n m\n+n\n"
        );
        assert_eq!(line_diff(old, old), "");
        assert_eq!(line_diff("", "x\n"), "@@ -1 +1 @@\n+x\n");
    }
}
