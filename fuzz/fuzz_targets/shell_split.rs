//! Fuzzes the shell splitter and the exec policy built on it: no input may panic, splitting
//! and checking must be deterministic, spans must index the input, and the verdict must be
//! the maximum over its segments.
//!
//! Run: `cargo +nightly fuzz run shell_split` from the repository root (or from `fuzz/`).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

// The kernel's gate sources, compiled in by path so the fuzzer does not build wasmtime. They
// refer to each other as `super::...`, which at the crate root is this crate.
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/exec_danger.rs"]
mod exec_danger;
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/exec_policy.rs"]
mod exec_policy;
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/exec_rules.rs"]
mod exec_rules;
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/shell_split.rs"]
mod shell_split;

use exec_policy::{Decision, ExecPolicy};

fn policy() -> &'static ExecPolicy {
    static POLICY: OnceLock<ExecPolicy> = OnceLock::new();
    POLICY.get_or_init(ExecPolicy::builtin)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let a = shell_split::split(text);
    let b = shell_split::split(text);
    assert_eq!(a, b, "splitting is not deterministic");
    for c in &a.commands {
        assert!(
            text.get(c.span.clone()).is_some(),
            "span {:?} does not index the input",
            c.span
        );
        for w in c.words.iter().chain(&c.assignments) {
            assert!(
                text.get(w.span.clone()).is_some(),
                "word span {:?} does not index the input",
                w.span
            );
        }
    }

    let v = policy().check(text);
    assert_eq!(v, policy().check(text), "checking is not deterministic");
    let max = v
        .segments
        .iter()
        .map(|s| s.decision)
        .max()
        .unwrap_or(Decision::Allow);
    assert_eq!(
        v.decision, max,
        "the verdict is not the maximum over its segments"
    );
    if let Some(i) = v.deciding_segment {
        assert!(i < v.segments.len());
    }
    let _ = policy().approval_key(text);
});
