//! Unit tests of `plugins/agent-kit/src/tools/edit_file.rs`.

use super::*;
use std::fs;

fn setup(content: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(dir.path().join("f.rs"), content).expect("writes");
    dir
}

fn content(dir: &tempfile::TempDir) -> String {
    fs::read_to_string(dir.path().join("f.rs")).expect("reads")
}

fn edit(dir: &tempfile::TempDir, old: &str, new: &str) -> Result<String, ToolError> {
    run(
        dir.path(),
        &json!({"path": "f.rs", "old_string": old, "new_string": new}),
    )
}

#[test]
fn exact_unique_match_is_replaced() {
    let dir = setup("fn a() {}\nfn b() {}\n");
    let out = edit(&dir, "fn b() {}", "fn c() {}").expect("edits");
    assert_eq!(out, "edited f.rs: replaced 1 occurrence (line 2)");
    assert_eq!(content(&dir), "fn a() {}\nfn c() {}\n");
}

#[test]
fn several_matches_give_the_count_and_both_ways_out() {
    let dir = setup("x = 1\ny = 2\nx = 1\nx = 1\n");
    let err = edit(&dir, "x = 1", "x = 3").expect_err("ambiguous");
    let msg = err.to_string();
    assert!(msg.contains("matches 3 times in f.rs"), "{msg}");
    assert!(msg.contains("lines 1, 3, 4"), "{msg}");
    assert!(msg.contains("replace_all: true"), "{msg}");
    assert!(msg.contains("occurrence: N"), "{msg}");
    assert_eq!(content(&dir), "x = 1\ny = 2\nx = 1\nx = 1\n");

    let input =
        json!({"path": "f.rs", "old_string": "x = 1", "new_string": "x = 3", "occurrence": 2});
    let out = run(dir.path(), &input).expect("second");
    assert!(out.contains("line 3"), "{out}");
    assert_eq!(content(&dir), "x = 1\ny = 2\nx = 3\nx = 1\n");

    let input =
        json!({"path": "f.rs", "old_string": "x = 1", "new_string": "z", "replace_all": true});
    let out = run(dir.path(), &input).expect("all");
    assert!(out.contains("replaced 2 occurrences (line 1, 4)"), "{out}");
    assert_eq!(content(&dir), "z\ny = 2\nx = 3\nz\n");

    let input = json!({"path": "f.rs", "old_string": "z", "new_string": "w", "occurrence": 5});
    let err = run(dir.path(), &input).expect_err("out of range");
    assert!(err.to_string().contains("between 1 and 2"), "{err}");
}

#[test]
fn indentation_differences_match_and_the_replacement_takes_the_file_indent() {
    let dir = setup("fn f() {\n\tif x {\n\t\ty();\n\t}\n}\n");
    let out = edit(&dir, "    if x {\n        y();", "    if z {\n        w();").expect("edits");
    assert!(out.contains("ignoring indentation"), "{out}");
    assert_eq!(content(&dir), "fn f() {\n\tif z {\n\t    w();\n\t}\n}\n");
}

#[test]
fn curly_quotes_and_dashes_in_old_string_match_straight_ones() {
    let dir = setup("let s = \"it's -- fine...\";\n");
    edit(&dir, "let s = “it’s — fine…”;", "let s = \"ok\";").expect("edits");
    assert_eq!(content(&dir), "let s = \"ok\";\n");
}

#[test]
fn tolerant_matches_still_demand_uniqueness() {
    let dir = setup("  a = ‘x’\nb\n    a = 'x'\n");
    let err = edit(&dir, "a = 'x'", "a = 'y'");
    // Exact matching finds the straight-quoted one once, so it wins.
    assert!(err.is_ok(), "{err:?}");
    assert_eq!(content(&dir), "  a = ‘x’\nb\n    a = 'y'\n");

    let dir = setup("\tv = “q”;\n  v = \"q\";\n");
    let err = edit(&dir, "v = ”q“;\nnope", "w").expect_err("no match at all");
    assert!(err.to_string().contains("not found"), "{err}");
    let err = edit(&dir, "   v = \u{201C}q\u{201D};", "w").expect_err("two tolerant hits");
    let msg = err.to_string();
    assert!(msg.contains("matches 2 times"), "{msg}");
    assert!(msg.contains("typographic"), "{msg}");
}

#[test]
fn copied_line_number_prefixes_are_stripped() {
    let dir = setup("one\ntwo\nthree\nfour\n");
    let out = edit(&dir, "     2\ttwo\n     3\tthree", "2\n3").expect("edits");
    assert!(out.contains("line-number"), "{out}");
    assert_eq!(content(&dir), "one\n2\n3\nfour\n");

    let dir = setup("a\nb\nb\n");
    // `3: b` is a single numbered line: it must land on line 3, which makes it unique.
    edit(&dir, "3: b", "c").expect("aligned single line");
    assert_eq!(content(&dir), "a\nb\nc\n");
}

#[test]
fn line_number_stripping_is_refused_when_it_does_not_align() {
    let dir = setup("meeting at\n30:00 sharp\n");
    // "12:30:00 sharp" would strip to "30:00 sharp", but that is line 2, not 12.
    let err = edit(&dir, "12:30:00 sharp", "x").expect_err("misaligned");
    assert!(err.to_string().contains("not found"), "{err}");
    // Decreasing numbers are not a copied listing either.
    let dir = setup("a\nb\n");
    edit(&dir, "5: a\n4: b", "x").expect_err("decreasing");
}

#[test]
fn no_match_points_at_the_closest_line() {
    let dir = setup("fn main() {\n    println!(\"hello\");\n}\n");
    let err = edit(&dir, "println!(\"helo world\");", "x").expect_err("no match");
    let msg = err.to_string();
    assert!(msg.contains("most similar line is 2"), "{msg}");
    assert!(msg.contains(r#""offset": 1"#), "{msg}");
}

#[test]
fn input_rules_are_checked_first() {
    let dir = setup("a\n");
    assert!(
        edit(&dir, "", "x")
            .expect_err("empty")
            .to_string()
            .contains("write_file")
    );
    assert!(
        edit(&dir, "a", "a")
            .expect_err("same")
            .to_string()
            .contains("identical")
    );
    let input = json!({"path": "f.rs", "old_string": "a", "new_string": "b", "replace_all": true, "occurrence": 1});
    let err = run(dir.path(), &input).expect_err("both");
    assert!(err.to_string().contains("exclude each other"), "{err}");
}

#[test]
fn crlf_files_match_lf_old_strings() {
    let dir = setup("a\r\nb\r\nc\r\n");
    edit(&dir, "a\nb", "x\r\ny").expect("edits");
    assert_eq!(content(&dir), "x\r\ny\r\nc\r\n");
}
