//! Fuzzes the argument gate: strict parsing and repair never panic and are deterministic, a
//! successful repair is always an object (and input that parses strictly needs no repair),
//! and stripping tool-call look-alikes is idempotent.
//!
//! Run: `cargo +nightly fuzz run arg_repair` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The kernel's gate source, compiled in by path so the fuzzer does not build wasmtime.
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/arg_repair.rs"]
mod arg_repair;

use arg_repair::{
    LOOKALIKE_NOTICE, is_truncation_stop, parse_strict, repair, strip_tool_call_lookalikes,
    truncated_call_notice,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let strict = parse_strict(text);
    let repaired = repair(text);
    assert_eq!(repaired, repair(text), "repair is not deterministic");
    if let Ok(r) = &repaired {
        assert!(r.value.is_object(), "repair produced a non-object");
    }
    if let Ok(v) = &strict {
        assert!(v.is_object());
        let r = repaired.as_ref().expect("strictly valid input repairs");
        assert_eq!(&r.value, v);
        assert!(r.steps.is_empty());
    }

    let (out, removed) = strip_tool_call_lookalikes(text);
    if removed.is_empty() {
        assert_eq!(out, text);
    } else {
        assert!(out.contains(LOOKALIKE_NOTICE));
    }
    let (again, removed_again) = strip_tool_call_lookalikes(&out);
    assert_eq!(again, out, "stripping is not idempotent");
    assert!(removed_again.is_empty());

    let notice = truncated_call_notice(text, text, data.len());
    assert!(!notice.contains('\n'));
    assert!(notice.contains("NOT executed"));
    let _ = is_truncation_stop(text);
});
