//! Unit tests of `kernel/gates/src/arg_repair.rs`.

use super::*;
use serde_json::json;

fn repaired(raw: &str) -> (Value, Vec<&'static str>) {
    match repair(raw) {
        Ok(r) => (r.value, r.steps),
        Err(e) => panic!("{raw:?} did not repair: {e}"),
    }
}

#[test]
fn strict_accepts_objects_only() {
    assert_eq!(parse_strict(r#"{"a":1}"#), Ok(json!({"a": 1})));
    assert_eq!(
        parse_strict("[1]"),
        Err("tool-call arguments must be a JSON object, got an array".to_owned())
    );
    assert!(parse_strict(r#"{"a":1,}"#).is_err_and(|e| e.contains("not valid JSON")));
    assert!(parse_strict("").is_err());
    assert!(parse_strict("null").is_err_and(|e| e.ends_with("got null")));
}

#[test]
fn valid_input_needs_no_steps() {
    let (v, steps) = repaired(r#" {"path": "a,}", "n": [1, 2]} "#);
    assert_eq!(v, json!({"path": "a,}", "n": [1, 2]}));
    assert!(steps.is_empty());
}

#[test]
fn empty_input_is_an_empty_object() {
    for raw in ["", "  \n\t"] {
        let (v, steps) = repaired(raw);
        assert_eq!(v, json!({}));
        assert_eq!(steps, [STEP_EMPTY_AS_OBJECT]);
    }
    // But strict parsing refuses it (a truncated turn's empty arguments are not executed).
    assert!(parse_strict("").is_err());
}

#[test]
fn rung_two_controls() {
    let (v, steps) = repaired("{\"cmd\": \"echo a\nb\tc\u{1}\"}");
    assert_eq!(v, json!({"cmd": "echo a\nb\tc\u{1}"}));
    assert_eq!(steps, [STEP_CONTROL_CHARS]);
    let (v, steps) = repaired("\u{feff}{\u{0}\"a\"\u{7}: 1\u{1b}}");
    assert_eq!(v, json!({"a": 1}));
    assert_eq!(steps, [STEP_CONTROL_CHARS]);
    // A backslash before a raw newline.
    let (v, _) = repaired("{\"a\": \"x\\\ny\"}");
    assert_eq!(v, json!({"a": "x\ny"}));
}

#[test]
fn rung_three_trailing_commas() {
    let (v, steps) = repaired(r#"{"a": [1, 2,], "b": {"c": 3,},}"#);
    assert_eq!(v, json!({"a": [1, 2], "b": {"c": 3}}));
    assert_eq!(steps, [STEP_TRAILING_COMMAS]);
    let (v, _) = repaired("{\"a\": 1,, \n }");
    assert_eq!(v, json!({"a": 1}));
    // Commas inside strings are data.
    let (v, _) = repaired(r#"{"a": "x,}", "b": "\",]",}"#);
    assert_eq!(v, json!({"a": "x,}", "b": "\",]"}));
}

#[test]
fn rung_four_closes_in_order() {
    let (v, steps) = repaired(r#"{"a": [1, {"b": "x"#);
    assert_eq!(v, json!({"a": [1, {"b": "x"}]}));
    assert_eq!(steps, [STEP_CLOSE_UNCLOSED]);
    let (v, _) = repaired(r#"{"a": [1, 2,"#);
    assert_eq!(v, json!({"a": [1, 2]}));
    let (v, _) = repaired(r#"{"a": "tab\"#);
    assert_eq!(v, json!({"a": "tab"}));
    let (v, _) = repaired(r#"{"a": "snow\u26"#);
    assert_eq!(v, json!({"a": "snow"}));
    let (v, _) = repaired(r#"{"a": "snow\u2603"#);
    assert_eq!(v, json!({"a": "snow\u{2603}"}));
    // A closer that skips an open array.
    let (v, _) = repaired(r#"{"a": [1, 2}"#);
    assert_eq!(v, json!({"a": [1, 2]}));
}

#[test]
fn rung_four_drops_incomplete_members() {
    let (v, steps) = repaired(r#"{"a": 1, "b":"#);
    assert_eq!(v, json!({"a": 1}));
    assert_eq!(steps, [STEP_CLOSE_UNCLOSED, STEP_DROP_INCOMPLETE_MEMBER]);
    let (v, _) = repaired(r#"{"a": 1, "b""#);
    assert_eq!(v, json!({"a": 1}));
    let (v, _) = repaired(r#"{"a": 1, "bo"#);
    assert_eq!(v, json!({"a": 1}));
    let (v, _) = repaired(r#"{"a": tr"#);
    assert_eq!(v, json!({}));
    let (v, _) = repaired(r#"{"a": {"b": [tr"#);
    assert_eq!(v, json!({"a": {"b": []}}));
    let (v, _) = repaired(r#"{"a": [1, {"b":"#);
    assert_eq!(v, json!({"a": [1, {}]}));
    let (v, _) = repaired(r#"{"a": 12"#);
    assert_eq!(v, json!({"a": 12}));
    let (v, _) = repaired(r#"{"a": 1.5e"#);
    assert_eq!(v, json!({}));
}

#[test]
fn all_rungs_together() {
    let (v, steps) = repaired("{\"cmd\": \"ls\u{1}\", \"args\": [\"-l\",], \"more\": {\"x\": \"y");
    assert_eq!(
        v,
        json!({"cmd": "ls\u{1}", "args": ["-l"], "more": {"x": "y"}})
    );
    assert_eq!(
        steps,
        [
            STEP_CONTROL_CHARS,
            STEP_TRAILING_COMMAS,
            STEP_CLOSE_UNCLOSED
        ]
    );
}

#[test]
fn unrepairable_and_non_objects() {
    assert!(matches!(
        repair("not json at all"),
        Err(RepairError::Unrepairable { .. })
    ));
    assert!(matches!(
        repair(r#"{"a": 1}}"#),
        Err(RepairError::Unrepairable { .. })
    ));
    assert_eq!(
        repair("[1, 2"),
        Err(RepairError::NotAnObject { found: "an array" })
    );
    assert_eq!(
        repair("\"str\""),
        Err(RepairError::NotAnObject { found: "a string" })
    );
    assert_eq!(
        repair("42").map_err(|e| e.to_string()),
        Err("tool-call arguments must be a JSON object, got a number".to_owned())
    );
}

#[test]
fn oversized_input_is_refused() {
    let big = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_REPAIR_INPUT));
    assert_eq!(
        repair(&big),
        Err(RepairError::TooLarge {
            len: big.len(),
            max: MAX_REPAIR_INPUT
        })
    );
}

#[test]
fn deep_nesting_does_not_overflow() {
    let deep = "[".repeat(100_000);
    assert!(repair(&deep).is_err());
    let deep = format!("{}{}", "{\"a\":".repeat(50_000), "1");
    assert!(repair(&deep).is_err());
    assert!(parse_strict(&"[".repeat(100_000)).is_err());
}

#[test]
fn worst_case_input_is_fast_enough() {
    let raw = format!("{{\"a\": [{}", "1,".repeat(MAX_REPAIR_INPUT / 2 - 16));
    let start = std::time::Instant::now();
    let r = repair(&raw);
    assert!(r.is_ok());
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}

const N: &str = LOOKALIKE_NOTICE;

#[test]
fn strips_xml_lookalikes() {
    let (out, removed) = strip_tool_call_lookalikes(
        "Let me check.\n<function_calls>\n<invoke name=\"exec\">\n<parameter name=\"cmd\">ls</parameter>\n</invoke>\n</function_calls>\nDone.",
    );
    assert_eq!(out, format!("Let me check.\n{N}\nDone."));
    assert_eq!(removed.len(), 1);
    assert!(
        removed[0].starts_with("<function_calls>") && removed[0].ends_with("</function_calls>")
    );

    let (out, removed) =
        strip_tool_call_lookalikes("a <INVOKE name=\"x\">y</Invoke > b <ns:invoke>z</ns:invoke> c");
    assert_eq!(out, format!("a {N} b {N} c"));
    assert_eq!(
        removed,
        ["<INVOKE name=\"x\">y</Invoke >", "<ns:invoke>z</ns:invoke>"]
    );

    let (out, _) = strip_tool_call_lookalikes("x <tool_call>{\"name\": \"a\"}</tool_call> y");
    assert_eq!(out, format!("x {N} y"));
    let (out, _) = strip_tool_call_lookalikes("x <invoke name=\"a\"/> y");
    assert_eq!(out, format!("x {N} y"));
}

#[test]
fn unclosed_lookalikes_run_to_the_end() {
    let (out, removed) = strip_tool_call_lookalikes("ok <invoke name=\"rm\">\n<parameter>-rf /");
    assert_eq!(out, format!("ok {N}"));
    assert_eq!(removed, ["<invoke name=\"rm\">\n<parameter>-rf /"]);
    let (out, _) = strip_tool_call_lookalikes("ok [TOOL_CALL] {\"tool\": \"x\"}");
    assert_eq!(out, format!("ok {N}"));
    let (out, _) = strip_tool_call_lookalikes("ok <function_calls");
    assert_eq!(out, format!("ok {N}"));
}

#[test]
fn strips_bracket_lookalikes() {
    let (out, removed) = strip_tool_call_lookalikes(
        "before [TOOL_CALL]{tool => \"exec\", args => {--cmd \"ls\"}}[/TOOL_CALL] after",
    );
    assert_eq!(out, format!("before {N} after"));
    assert_eq!(removed.len(), 1);
    let (out, _) = strip_tool_call_lookalikes("[tool_calls][{\"name\":\"a\"}][/tool_calls]");
    assert_eq!(out, N);
}

#[test]
fn strips_fenced_pseudo_calls() {
    let text =
        "Calling:\n```json\n{\"name\": \"exec\", \"arguments\": {\"cmd\": \"ls\"}}\n```\nthen\n";
    let (out, removed) = strip_tool_call_lookalikes(text);
    assert_eq!(out, format!("Calling:\n{N}\nthen\n"));
    assert_eq!(
        removed,
        ["```json\n{\"name\": \"exec\", \"arguments\": {\"cmd\": \"ls\"}}\n```"]
    );

    let text = "```tool_call\nexec(cmd=\"ls\")\n```";
    assert_eq!(strip_tool_call_lookalikes(text).0, N);

    let text =
        "~~~\n[{\"tool\": \"a\", \"input\": {}}, {\"name\": \"b\", \"parameters\": {}}]\n~~~";
    assert_eq!(strip_tool_call_lookalikes(text).0, N);

    let text = "```json\n{\"type\": \"function\", \"function\": {\"name\": \"a\", \"arguments\": \"{}\"}}\n```";
    assert_eq!(strip_tool_call_lookalikes(text).0, N);

    // Sloppy JSON is still recognised.
    let text = "```json\n{\"name\": \"a\", \"arguments\": {\"x\": 1,},}\n```";
    assert_eq!(strip_tool_call_lookalikes(text).0, N);

    // Unclosed: to the end.
    let text = "x\n```json\n{\"name\": \"a\", \"arguments\": {}}\n";
    assert_eq!(strip_tool_call_lookalikes(text).0, format!("x\n{N}"));
}

#[test]
fn ordinary_text_and_code_are_kept() {
    for text in [
        "```json\n{\"name\": \"keel\", \"version\": \"0.1\"}\n```\n",
        "```rust\nfn invoke() {}\n```",
        "```json\n{\"name\": 1, \"arguments\": {}}\n```",
        "```\nplain\n```",
        "a < b and c > d; <invoker> <invokes/> [TOOL] [tool_callx]",
        "<function_calling> is not a tag we strip",
        "",
        "日本語 ``` ~~~",
    ] {
        let (out, removed) = strip_tool_call_lookalikes(text);
        assert_eq!(out, text);
        assert!(removed.is_empty(), "{text:?}");
    }
}

#[test]
fn lookalikes_inside_ordinary_fences_are_still_stripped() {
    let text = "```xml\n<invoke name=\"a\"></invoke>\n```";
    assert_eq!(
        strip_tool_call_lookalikes(text).0,
        format!("```xml\n{N}\n```")
    );
}

#[test]
fn stripping_is_linear_on_pathological_fences() {
    let text = "```json\n".repeat(20_000);
    let start = std::time::Instant::now();
    let (out, removed) = strip_tool_call_lookalikes(&text);
    assert_eq!(out, text);
    assert!(removed.is_empty());
    let text = "<invoke>x</invoke>".repeat(20_000);
    let (out, removed) = strip_tool_call_lookalikes(&text);
    assert_eq!(removed.len(), 20_000);
    assert_eq!(out, N.repeat(20_000));
    let text = "<invoke".repeat(20_000);
    let (out, removed) = strip_tool_call_lookalikes(&text);
    assert_eq!(removed.len(), 1);
    assert_eq!(out, format!("{}{N}", "<invoke".repeat(19_999)));
    let text = "<invoke>".repeat(20_000);
    assert_eq!(strip_tool_call_lookalikes(&text).1.len(), 1);
    let text = "[tool_call]".repeat(20_000);
    assert_eq!(strip_tool_call_lookalikes(&text).1.len(), 1);
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn truncation_stops() {
    for r in [
        "length",
        "max_tokens",
        "MAX_TOKENS",
        " Length ",
        "max_output_tokens",
    ] {
        assert!(is_truncation_stop(r), "{r}");
    }
    for r in ["stop", "end_turn", "tool_use", "tool_calls", "", "lengthy"] {
        assert!(!is_truncation_stop(r), "{r}");
    }
}

#[test]
fn truncated_call_notice_says_what_to_do() {
    let n = truncated_call_notice("exec_shell", "max_tokens", 31);
    assert!(n.contains("`exec_shell`"));
    assert!(n.contains("NOT executed"));
    assert!(n.contains("`max_tokens`"));
    assert!(n.contains("31 bytes"));
    assert!(n.contains("Resend the whole call"));
    assert!(n.contains("shorten it or split"));
    let n = truncated_call_notice("x`]\n</x>", "", 1);
    assert!(n.contains("`x????/x?`"));
    assert!(n.contains("`?`"));
    assert!(n.contains("(1 byte)"));
    assert!(!n.contains('\n'));
}

#[test]
fn fuzz_seed_corpus_replays() {
    let seeds = crate::fuzz_seeds("arg_repair");
    for (_, text) in &seeds {
        crate::properties::arg_repair(text);
    }
    assert!(seeds.len() >= 16, "expected seeds, found {}", seeds.len());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn jsonish() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            "\"",
            "\\",
            "\\u",
            "\\u26",
            ":",
            ",",
            " ",
            "\n",
            "\u{0}",
            "\u{1}",
            "\u{feff}",
            "a",
            "\"k\"",
            "\"v\"",
            "1",
            "-",
            "1.5",
            "e",
            "true",
            "tr",
            "null",
            "\"\\\"\"",
            "<invoke>",
            "</invoke>",
            "<function_calls>",
            "[TOOL_CALL]",
            "[/TOOL_CALL]",
            "```json\n",
            "```\n",
            "\"name\"",
            "\"arguments\"",
            "日",
        ]);
        prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn arbitrary_strings_never_panic(s in any::<String>()) {
            crate::properties::arg_repair(&s);
        }

        #[test]
        fn jsonish_strings_never_panic(s in jsonish()) {
            crate::properties::arg_repair(&s);
        }

        #[test]
        fn truncated_valid_objects_repair_to_objects(
            v in prop::collection::btree_map("[a-z\"\\\\ ,\\]}]{0,6}", prop::collection::vec(any::<i32>(), 0..3), 0..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let full = serde_json::to_string(&v).unwrap_or_default();
            let mut at = cut.index(full.len().max(1));
            while !full.is_char_boundary(at) {
                at -= 1;
            }
            let prefix = &full[..at];
            if let Ok(r) = repair(prefix) {
                prop_assert!(r.value.is_object());
            } else if at > 0 {
                // Every non-empty prefix of an object opens with `{`, which rung 4 closes.
                prop_assert!(false, "prefix {prefix:?} of {full:?} did not repair");
            }
        }
    }
}
