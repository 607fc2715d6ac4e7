//! The loader's answers, carried over as facts from its source and its own tests:
//! go.yaml.in/yaml/v2 v2.4.3 `decode_test.go` (`unmarshalTests`) and `resolve.go`, and
//! sigs.k8s.io/yaml v1.6.0 `yaml_test.go` (`TestYAMLToJSON`).

use super::gostd::{go_format_g32, parse_timestamp};
use super::resolve::{Resolved, resolve};
use super::*;
use serde_json::json;

fn one(doc: &str) -> Result<Value, String> {
    to_json(doc).map_err(|e| e.reason.to_string())
}

/// `v: <text>` through the loader, the value of `v`.
fn v(text: &str) -> Value {
    one(&format!("v: {text}\n")).unwrap_or_else(|e| panic!("{text}: {e}"))["v"].clone()
}

#[test]
fn go_yaml_decode_test_scalars() {
    // decode_test.go, unmarshalTests (into interface{}), then through JSON.
    let cases: &[(&str, Value)] = &[
        ("hi", json!("hi")),
        ("true", json!(true)),
        ("10", json!(10)),
        ("0b10", json!(2)),
        ("0xA", json!(10)),
        ("4294967296", json!(4294967296i64)),
        ("0.1", json!(0.1)),
        (".1", json!(0.1)),
        ("-10", json!(-10)),
        ("-.1", json!(-0.1)),
        // Floats from the spec.
        ("6.8523e+5", json!(685230)),
        ("685.230_15e+03", json!(685230.15)),
        ("685_230.15", json!(685230.15)),
        // Booleans from the spec.
        ("y", json!(true)),
        ("NO", json!(false)),
        ("True", json!(true)),
        ("on", json!(true)),
        // Integers from the spec.
        ("685230", json!(685230)),
        ("+685_230", json!(685230)),
        ("02472256", json!(685230)),
        ("0x_0A_74_AE", json!(685230)),
        ("0b1010_0111_0100_1010_1110", json!(685230)),
        ("-0b101010", json!(-42)),
        (
            "-0b1000000000000000000000000000000000000000000000000000000000000000",
            json!(i64::MIN),
        ),
        // Nulls from the spec.
        ("", Value::Null),
        ("~", Value::Null),
        ("null", Value::Null),
        // "Unsupported": base 60 stays a string.
        ("190:20:30", json!("190:20:30")),
        ("190:20:30.15", json!("190:20:30.15")),
        // Not numbers.
        ("-b_c", json!("-b_c")),
        ("+b_c", json!("+b_c")),
        ("50cent_of_dollar", json!("50cent_of_dollar")),
        // Beyond int64: uint64, which the client reads back as float64.
        ("9223372036854775808", json!(9223372036854775808u64 as f64)),
        (
            "18446744073709551615",
            json!(18446744073709551615u64 as f64),
        ),
        ("18446744073709551616", json!(18446744073709551616f64)),
        ("9223372036854775807", json!(i64::MAX)),
        ("-9223372036854775808", json!(i64::MIN)),
    ];
    for (text, want) in cases {
        assert_eq!(&v(text), want, "{text:?}");
    }
}

#[test]
fn resolve_go_rules_beyond_the_spec_examples() {
    // resolve.go: strconv.ParseInt(plain, 0, 64) after removing underscores, so Go's
    // base prefixes (either case, and 0o) and a bare leading 0 for octal.
    let cases: &[(&str, Value)] = &[
        ("0400", json!(256)),
        ("-0400", json!(-256)),
        ("+0400", json!(256)),
        ("0_400", json!(256)),
        ("0o400", json!(256)),
        ("0O17", json!(15)),
        ("0X1f", json!(31)),
        ("0B11", json!(3)),
        ("0", json!(0)),
        ("-0", json!(0)),
        ("00", json!(0)),
        // Not octal: ParseInt fails, the float pattern matches.
        ("08", json!(8)),
        ("09.5", json!(9.5)),
        ("0400.0", json!(400)),
        ("1e3", json!(1000)),
        ("1.0e+3", json!(1000)),
        ("1.5e3", json!(1500)),
        ("1.0", json!(1)),
        ("1.", json!(1)),
        ("+.5", json!(0.5)),
        ("-1e-7", json!(-1e-7)),
        (".5_0", json!(0.5)),
        ("1_000", json!(1000)),
        ("1__0", json!(10)),
        // Not numbers at all.
        ("_1", json!("_1")),
        ("0x", json!("0x")),
        ("0b", json!("0b")),
        ("0b2", json!("0b2")),
        ("0x10000000000000000", json!("0x10000000000000000")),
        ("+", json!("+")),
        ("+-1", json!("+-1")),
        ("1e400", json!("1e400")),
        ("1e", json!("1e")),
        (".", json!(".")),
        ("1.2.3", json!("1.2.3")),
        ("1,000", json!("1,000")),
        ("0x1p3", json!("0x1p3")),
        ("inf", json!("inf")),
        ("nan", json!("nan")),
        (".nAn", json!(".nAn")),
        ("-.nan", json!("-.nan")),
        ("Infinity", json!("Infinity")),
        // YAML 1.1 booleans, exactly go-yaml's spellings.
        ("yes", json!(true)),
        ("Yes", json!(true)),
        ("YES", json!(true)),
        ("Y", json!(true)),
        ("On", json!(true)),
        ("ON", json!(true)),
        ("TRUE", json!(true)),
        ("no", json!(false)),
        ("No", json!(false)),
        ("n", json!(false)),
        ("N", json!(false)),
        ("off", json!(false)),
        ("Off", json!(false)),
        ("OFF", json!(false)),
        ("False", json!(false)),
        ("FALSE", json!(false)),
        ("yES", json!("yES")),
        ("tRUE", json!("tRUE")),
        ("oN", json!("oN")),
        ("nO", json!("nO")),
        ("t", json!("t")),
        ("f", json!("f")),
        ("Null", Value::Null),
        ("NULL", Value::Null),
        ("nULL", json!("nULL")),
        ("none", json!("none")),
        ("<<", json!("<<")),
        // Timestamps stay their text (decode.go, "for backward compatibility").
        ("2001-12-14", json!("2001-12-14")),
        (
            "2001-12-14t21:59:43.10-05:00",
            json!("2001-12-14t21:59:43.10-05:00"),
        ),
        ("2001-12-14 21:59:43.10", json!("2001-12-14 21:59:43.10")),
        // Version-like text.
        ("1.18.0", json!("1.18.0")),
        ("v1.36.2", json!("v1.36.2")),
        ("1.18", json!(1.18)),
    ];
    for (text, want) in cases {
        assert_eq!(&v(text), want, "{text:?}");
    }
}

#[test]
fn special_floats_resolve_but_cannot_become_json() {
    for (text, want) in [
        (".inf", f64::INFINITY),
        (".Inf", f64::INFINITY),
        (".INF", f64::INFINITY),
        ("+.inf", f64::INFINITY),
        ("+.Inf", f64::INFINITY),
        ("-.inf", f64::NEG_INFINITY),
        ("-.INF", f64::NEG_INFINITY),
    ] {
        assert_eq!(resolve("", text), Ok(Resolved::Float(want)), "{text}");
        let err = one(&format!("v: {text}")).unwrap_err();
        assert!(err.contains("json: unsupported value"), "{text}: {err}");
    }
    for text in [".nan", ".NaN", ".NAN"] {
        assert!(matches!(resolve("", text), Ok(Resolved::Float(f)) if f.is_nan()));
        assert!(one(&format!("v: {text}")).is_err());
    }
}

#[test]
fn quoting_block_scalars_and_tags() {
    let doc = one(concat!(
        "a: '0400'\n",
        "b: \"yes\"\n",
        "c: |\n  0400\n",
        "d: !!str 0400\n",
        "e: !!int \"0400\"\n",
        "f: !!float 1\n",
        "g: !foo 0400\n",
        "h: ! 0400\n",
        "i: !!bool 'on'\n",
        "j: !!null ''\n",
        "k: !<tag:yaml.org,2002:int> 0x10\n",
        "l: !!timestamp 2001-12-14\n",
        "m: !!binary gIGC\n",
        "bin: !!binary aGk=\n",
        "o: !!str\n",
    ))
    .unwrap();
    assert_eq!(
        doc,
        json!({"a": "0400", "b": "yes", "c": "0400\n", "d": "0400", "e": 256, "f": 1,
               "g": "0400", "h": "0400", "i": true, "j": null, "k": 16,
               "l": "2001-12-14", "m": "\u{fffd}\u{fffd}\u{fffd}", "bin": "hi", "o": ""})
    );
    for (doc, want) in [
        ("v: !!int 1.5", "cannot decode !!float `1.5` as a !!int"),
        ("v: !!int abc", "cannot decode !!str `abc` as a !!int"),
        ("v: !!bool 1", "cannot decode !!int `1` as a !!bool"),
        ("v: !!null 0", "cannot decode !!int `0` as a !!null"),
        ("v: !!timestamp 2001-13-01", "as a !!timestamp"),
        (
            "v: !!float 18446744073709551615",
            "cannot decode !!int `18446744073709551615` as a !!float",
        ),
        ("v: !!binary '*'", "invalid base64"),
    ] {
        let err = one(doc).unwrap_err();
        assert!(err.contains(want), "{doc}: {err}");
    }
}

#[test]
fn map_keys_become_json_strings_as_sigs_yaml_writes_them() {
    // yaml_test.go, TestYAMLToJSON.
    assert_eq!(one("True: a").unwrap(), json!({"true": "a"}));
    assert_eq!(one("no: a").unwrap(), json!({"false": "a"}));
    assert_eq!(one("1: a").unwrap(), json!({"1": "a"}));
    assert_eq!(one("1.2: a").unwrap(), json!({"1.2": "a"}));
    assert_eq!(
        one("1000000000000000000000000000000000000: a").unwrap(),
        json!({"1e+36": "a"})
    );
    assert_eq!(one("1e+36: a").unwrap(), json!({"1e+36": "a"}));
    assert_eq!(one("\"1e+36\": a").unwrap(), json!({"1e+36": "a"}));
    assert_eq!(one("0400: a").unwrap(), json!({"256": "a"}));
    // Keys resolve like values: `y` and `n` are booleans.
    assert_eq!(one("y: 1\nn: 2\n").unwrap(), json!({"true": 1, "false": 2}));
    // A lone `-` is a string to the resolver (as a plain value it is YAML syntax).
    assert_eq!(resolve("", "-"), Ok(Resolved::Str));
    assert_eq!(one("foo: bar\nfoo: baz\n").unwrap(), json!({"foo": "baz"}));
    assert_eq!(
        one("t: 9007199254740993").unwrap(),
        json!({"t": 9007199254740993i64})
    );
    assert_eq!(
        one("t: 1000000000000000000000000000000000000").unwrap(),
        json!({"t": 1e36})
    );
    assert_eq!(one("t: ").unwrap(), json!({"t": null}));
    assert_eq!(
        one("t: this is very long line\n  that it must be longer\n").unwrap(),
        json!({"t": "this is very long line that it must be longer"})
    );
    // Errors there: a null key, and (not a case of that file) a uint64 key.
    for doc in ["~: a", "null: a", ": a", "18446744073709551615: a"] {
        assert!(
            one(doc).unwrap_err().contains("unsupported map key"),
            "{doc}"
        );
    }
    assert!(one("? [a]\n: b\n").unwrap_err().contains("invalid map key"));
    // Go's FormatFloat(k, 'g', -1, 32).
    for (f, want) in [
        (0.1, "0.1"),
        (1000.0, "1000"),
        (100000.0, "100000"),
        (1e6, "1e+06"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (std::f64::consts::PI, "3.1415927"),
        (-2.5, "-2.5"),
        (-0.0, "-0"),
        (f64::INFINITY, ".inf"),
        (f64::NEG_INFINITY, "-.inf"),
        (f64::NAN, ".nan"),
    ] {
        assert_eq!(go_format_g32(f), want, "{f}");
    }
}

#[test]
fn anchors_aliases_and_merge_keys_as_go_yaml_v2() {
    let doc = one(concat!(
        "base: &b {p: 1, q: 2}\n",
        "other: &o {q: 3, r: 4}\n",
        "copy: *b\n",
        "merged:\n  <<: *b\n  q: 9\n",
        // go-yaml v2 sets in document order: the merge overwrites a key before it.
        "before:\n  q: 9\n  <<: *b\n",
        // A list: the earlier maps win.
        "many:\n  <<: [*b, *o]\n",
        "quoted:\n  '<<': *b\n",
    ))
    .unwrap();
    assert_eq!(doc["copy"], json!({"p": 1, "q": 2}));
    assert_eq!(doc["merged"], json!({"p": 1, "q": 9}));
    assert_eq!(doc["before"], json!({"q": 2, "p": 1}));
    assert_eq!(doc["many"], json!({"q": 2, "r": 4, "p": 1}));
    assert_eq!(doc["quoted"], json!({"<<": {"p": 1, "q": 2}}));
    assert!(one("a: &a [*a]").unwrap_err().contains("contains itself"));
    assert!(
        one("a: {<<: 1}")
            .unwrap_err()
            .contains("map merge requires")
    );
    assert!(one("a: *nope").is_err());
    // A billion laughs is stopped by go-yaml's alias budget.
    let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..8 {
        let prev = (b'a' + i) as char;
        let next = (b'a' + i + 1) as char;
        laughs.push_str(&format!(
            "{next}: &{next} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    assert!(one(&laughs).unwrap_err().contains("excessive aliasing"));
}

#[test]
fn documents_split_on_separator_lines_as_yaml_reader() {
    let docs = load_all(
        "a: 1\n---\n---   # comment\n\nb: 0400\r\n...\nignored: [\n---\n# only a comment\n",
    )
    .unwrap();
    let values: Vec<_> = docs.iter().map(|d| d.value.clone()).collect();
    // The empty chunk between the separators is dropped; `...` ends the document and
    // what follows it in the same chunk is never read; a comment-only chunk is null.
    assert_eq!(values, [json!({"a": 1}), json!({"b": 256}), Value::Null]);
    assert_eq!(docs[1].line, 4);
    for (text, line) in [("a: 1\n--- b: 2\n", 2), ("a: 1\n----\n", 2)] {
        match load_all(text) {
            Err(LoadError::Separator { line: l, .. }) => assert_eq!(l, line, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    let err = load_all("a: 1\n---\nb: [\n").unwrap_err();
    assert!(
        matches!(err, LoadError::Invalid { line: 3 | 4, .. }),
        "{err:?}"
    );
}

#[test]
fn json_documents_read_the_same() {
    let doc = one(r#"{"a": 1.0, "b": 1e3, "c": "0400", "d": [true, null, -0], "e": "\u00e9\/"}"#)
        .unwrap();
    assert_eq!(
        doc,
        json!({"a": 1, "b": 1000, "c": "0400", "d": [true, null, 0], "e": "é/"})
    );
}

#[test]
fn a_json_stream_is_read_as_the_json_decoder_reads_it() {
    // Concatenated objects are documents of a JSON stream (YAMLOrJSONDecoder), which the
    // YAML path would refuse.
    let docs = json_stream("  {\"a\": 1.0, \"b\": 1e3}\n{\"c\": 9223372036854775808, \"d\": 1.5}")
        .unwrap();
    assert_eq!(
        docs,
        [
            json!({"a": 1, "b": 1000}),
            json!({"c": 9223372036854775808u64 as f64, "d": 1.5})
        ]
    );
    assert!(json_stream("a: 1").is_none());
    assert!(json_stream("{a: 1}").is_none(), "not JSON: read as YAML");
}

#[test]
fn nesting_is_bounded() {
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(one(&deep).unwrap_err().contains("levels deep"));
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    assert!(one(&ok).is_ok());
}

#[test]
fn timestamps_follow_go_time_parse() {
    for ok in [
        "2001-12-14",
        "2001-1-2",
        "2000-02-29",
        "2001-12-14T21:59:43.10Z",
        "2001-12-14t21:59:43.10-05:00",
        "2001-12-14T1:2:3+24:00",
        "2001-12-14 21:59:43",
        "2001-12-14 21:59:43,5",
    ] {
        assert!(parse_timestamp(ok), "{ok}");
    }
    for bad in [
        "2001-13-14",
        "2001-02-29",
        "2001-12-14 21:59:43.10 -5",
        "2001-12-14T21:59:43",
        "2001-12-14T24:00:00Z",
        "01-12-14",
        "2001-12-14x",
        "20011-12-14",
    ] {
        assert!(!parse_timestamp(bad), "{bad}");
    }
}
