//! The nesting-depth bound on every YAML or JSON text an operator hands talboot (inventory,
//! talhelper talconfig/talenv, patches, SOPS and age secrets files, a `--schema` override).
//!
//! Every parser talboot uses builds or walks its tree recursively somewhere: saphyr's
//! `Parser::load` recurses once per nested collection (`load_node` -> `load_mapping` ->
//! `load_node`, saphyr-parser 0.3.4 `src/parser.rs`), and so do our own tree conversions,
//! patch merges and `Drop`. A file nested some thousands of levels deep (a few kB) therefore
//! overflowed the stack and aborted the process (SIGABRT, exit 134) instead of failing with a
//! message. Block-style nesting has no limit in saphyr at all; flow style stops only at 255
//! levels (its `flow_level` is a `u8`); yaml_serde and serde_json stop at 128.
//!
//! So before any tree is built, the text is scanned here without recursion: YAML through
//! saphyr-parser's event iterator (an explicit state stack, no recursion; its scanner's own
//! flow-depth error counts as too deep), JSON with a bracket counter. Deeper than [`MAX_DEPTH`] is refused with the line and column where the
//! limit was crossed. Syntax errors are left to the real parser, which reports them better.

use saphyr_parser::{Event, Parser};

/// How many collections (mappings and sequences) may nest inside one another. A Talos machine
/// config needs about 12, an inventory with Helm values about 20; both yaml_serde and
/// serde_json give up at 128, so a file within this bound never reaches their limits.
pub(crate) const MAX_DEPTH: usize = 100;

/// A text nested deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {}", self.reason())]
pub struct TooDeep {
    /// 1-based line where the collection that crosses the limit starts.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The limit, [`MAX_DEPTH`].
    pub limit: usize,
}

impl TooDeep {
    /// What is wrong and what to do, without the position (for messages that carry their own
    /// `file:line:column`).
    pub fn reason(&self) -> String {
        format!(
            "nested more than {} levels deep (mappings and lists inside one another); talboot \
             refuses deeper files so that a broken or hostile file cannot crash it: flatten \
             this structure (no Talos config or inventory needs more than a few dozen levels)",
            self.limit
        )
    }
}

/// Checks that no YAML document in `text` nests deeper than [`MAX_DEPTH`].
pub(crate) fn check_yaml(text: &str) -> Result<(), TooDeep> {
    check_yaml_limit(text, MAX_DEPTH)
}

fn check_yaml_limit(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut depth = 0usize;
    for event in Parser::new_from_str(text) {
        let (event, span) = match event {
            Ok(e) => e,
            // The scanner looks ahead through a whole flow collection (it could be a mapping
            // key), so flow nesting past its own bound (255) fails here before our count does.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Err(TooDeep {
                    line: e.marker().line(),
                    column: e.marker().col() + 1,
                    limit,
                });
            }
            // Another syntax error: the real parser reports it afterwards.
            Err(_) => return Ok(()),
        };
        match event {
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > limit {
                    return Err(TooDeep {
                        line: span.start.line(),
                        column: span.start.col() + 1,
                        limit,
                    });
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Checks that the JSON `text` nests no deeper than [`MAX_DEPTH`] (brackets inside strings do
/// not count).
pub(crate) fn check_json(text: &str) -> Result<(), TooDeep> {
    check_json_limit(text, MAX_DEPTH)
}

fn check_json_limit(text: &str, limit: usize) -> Result<(), TooDeep> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if c == '\n' {
            line += 1;
            column = 0;
        } else {
            column += 1;
        }
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => {
                depth += 1;
                if depth > limit {
                    return Err(TooDeep {
                        line,
                        column,
                        limit,
                    });
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `depth` nested block mappings: `a:\n a:\n  ...`. One more column per level makes the
    /// text quadratic in size, so it stops at 3,000 levels.
    pub(crate) fn block_maps(depth: usize) -> String {
        let depth = depth.min(3_000);
        let mut s = String::new();
        for i in 0..depth {
            s.push_str(&" ".repeat(i));
            s.push_str("a:\n");
        }
        s.push_str(&" ".repeat(depth));
        s.push_str("x\n");
        s
    }

    /// `depth` nested block sequences, compact style: `- - - x`.
    pub(crate) fn block_seqs(depth: usize) -> String {
        format!("{}x\n", "- ".repeat(depth))
    }

    /// `depth` nested flow mappings: `{a: {a: ... }}`.
    pub(crate) fn flow_maps(depth: usize) -> String {
        format!("{}1{}\n", "{a: ".repeat(depth), "}".repeat(depth))
    }

    /// `depth` nested flow sequences: `[[[...]]]`.
    pub(crate) fn flow_seqs(depth: usize) -> String {
        format!("{}{}\n", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn yaml_within_the_limit_passes_and_one_more_level_is_refused() {
        for make in [block_maps, block_seqs, flow_maps, flow_seqs] {
            assert_eq!(check_yaml(&make(MAX_DEPTH)), Ok(()), "{}", make(3));
            let err = check_yaml(&make(MAX_DEPTH + 1)).unwrap_err();
            assert_eq!(err.limit, MAX_DEPTH);
            assert!(err.line >= 1 && err.column >= 1);
        }
    }

    #[test]
    fn yaml_position_is_where_the_limit_is_crossed() {
        // Block mappings: the 4th mapping starts on line 4 (its first key), column 4.
        let err = check_yaml_limit(&block_maps(10), 3).unwrap_err();
        assert_eq!((err.line, err.column), (4, 4));
        let err = check_yaml_limit("a: [[[[1]]]]\n", 3).unwrap_err();
        assert_eq!((err.line, err.column), (1, 6));
    }

    #[test]
    fn very_deep_yaml_is_refused_without_recursing() {
        // Deep enough that any recursive parse would overflow a test thread's stack.
        for make in [block_maps, block_seqs, flow_maps, flow_seqs] {
            assert!(check_yaml(&make(50_000)).is_err());
        }
    }

    #[test]
    fn siblings_do_not_add_up_and_syntax_errors_are_left_to_the_parser() {
        let wide: String = (0..500).map(|i| format!("k{i}: {{a: [1]}}\n")).collect();
        assert_eq!(check_yaml(&wide), Ok(()));
        assert_eq!(check_yaml("a: [\n"), Ok(()));
        let docs = format!("{}---\n{}", flow_seqs(60), flow_seqs(60));
        assert_eq!(check_yaml(&docs), Ok(()));
    }

    #[test]
    fn json_depth_ignores_brackets_in_strings() {
        assert_eq!(check_json(&flow_seqs(MAX_DEPTH)), Ok(()));
        let err = check_json(&format!("\n  {}", flow_seqs(MAX_DEPTH + 1))).unwrap_err();
        assert_eq!(
            (err.line, err.column, err.limit),
            (2, 3 + MAX_DEPTH, MAX_DEPTH)
        );
        let quoted = format!("{{\"k\": \"{}\\\"[\"}}", "[".repeat(500));
        assert_eq!(check_json(&quoted), Ok(()));
        assert!(check_json(&"[".repeat(50_000)).is_err());
    }
}

/// Every parser entry point for operator files refuses deep input with this module's message
/// (the inventory's are tested in `inventory::tests`, the schema override in
/// `machineconfig::schema::tests`).
#[cfg(test)]
mod entry_points {
    use super::tests::{block_maps, block_seqs, flow_maps, flow_seqs};

    fn deep_texts() -> Vec<String> {
        let mut out = Vec::new();
        for depth in [super::MAX_DEPTH + 1, 5_000, 50_000] {
            for make in [block_maps, block_seqs, flow_maps, flow_seqs] {
                out.push(format!("version: v1alpha1\nmachine:\n  deep:\n{}", {
                    make(depth)
                        .lines()
                        .map(|l| format!("    {l}\n"))
                        .collect::<String>()
                }));
            }
        }
        out
    }

    fn is_depth_message(msg: &str) -> bool {
        msg.contains("line ") && msg.contains("nested more than 100 levels deep")
    }

    #[test]
    fn machine_configs_and_patches() {
        use crate::machineconfig::patch::{ConfigBundle, parse_patch};
        for text in deep_texts() {
            let e = ConfigBundle::parse(&text).unwrap_err().to_string();
            assert!(is_depth_message(&e), "{e}");
            let e = parse_patch(&text).unwrap_err().to_string();
            assert!(is_depth_message(&e), "{e}");
        }
    }

    #[test]
    fn secrets_bundle_sops_file_and_talosconfig() {
        let ids = crate::crypto::age::Identities::from_text("none", "").unwrap();
        for text in deep_texts() {
            let e = crate::machineconfig::secrets::SecretsBundle::from_yaml(&text)
                .unwrap_err()
                .to_string();
            assert!(is_depth_message(&e), "{e}");
            let e = crate::crypto::sops::decrypt_yaml(&text, std::path::Path::new("s.yaml"), &ids)
                .unwrap_err()
                .to_string();
            assert!(is_depth_message(&e) && e.contains("s.yaml"), "{e}");
            let e = crate::talos::ClientCreds::from_talosconfig(&text, None)
                .unwrap_err()
                .to_string();
            assert!(is_depth_message(&e), "{e}");
            let e = crate::addons::values::values_from_yaml("values.yaml", &text)
                .unwrap_err()
                .to_string();
            assert!(
                is_depth_message(&e) && e.starts_with("values.yaml: "),
                "{e}"
            );
        }
    }
}
