//! Fuzzes the output gate: sanitizing never panics, removes every character class it promises
//! to remove, reaches a fixed point, treats JSON strings and keys alike, and the
//! `<external_content>` fence and the head/tail cut hold for any input.
//!
//! Run: `cargo +nightly fuzz run sanitize` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The kernel's gate source, compiled in by path so the fuzzer does not build wasmtime.
#[allow(dead_code, missing_docs, unused_imports)]
#[path = "../../kernel/src/gates/sanitize.rs"]
mod sanitize;

use sanitize::{head_tail, sanitize_json, sanitize_text, wrap_external};

/// Characters that must never survive sanitizing (variation selectors are checked apart).
fn forbidden(c: char) -> bool {
    use unicode_properties::{GeneralCategory as G, UnicodeGeneralCategory};
    matches!(c, '\r' | '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
        || (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{e0000}'..='\u{e007f}'
                | '\u{e0100}'..='\u{e01ef}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{3164}'
                | '\u{ffa0}'
        )
        || matches!(
            c.general_category(),
            G::Format | G::PrivateUse | G::Unassigned | G::Surrogate
        )
}

fn check_clean(s: &str) {
    let mut prev: Option<char> = None;
    for c in s.chars() {
        assert!(!forbidden(c), "U+{:04X} survived sanitizing", u32::from(c));
        if ('\u{fe00}'..='\u{fe0f}').contains(&c) {
            assert!(
                prev.is_some_and(|p| !('\u{fe00}'..='\u{fe0f}').contains(&p)
                    && !p.is_whitespace()
                    && !p.is_control()),
                "variation selector without a base"
            );
        }
        prev = Some(c);
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let r = sanitize_text(text);
    check_clean(&r.text);
    assert_eq!(r, sanitize_text(text), "sanitizing is not deterministic");
    if r.report.converged {
        let again = sanitize_text(&r.text);
        assert_eq!(again.text, r.text, "sanitizing is not idempotent");
        assert!(again.report.is_unchanged());
    }
    if r.report.is_unchanged() {
        assert_eq!(r.text, text);
    }

    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        let once = sanitize_json(&v);
        assert_eq!(
            sanitize_json(&once),
            once,
            "JSON sanitizing is not idempotent"
        );
    }

    // The first line is the host, the rest the body.
    let (host, body) = text.split_once('\n').unwrap_or((text, ""));
    let w = wrap_external(host, body);
    let lower = w.to_ascii_lowercase();
    assert_eq!(lower.matches("</external_content").count(), 1);
    assert_eq!(lower.matches("<external_content").count(), 1);
    assert!(w.ends_with("</external_content>"));
    assert_eq!(
        sanitize_text(&w).text,
        w,
        "the fence is not a sanitize fixed point"
    );
    assert_eq!(w, wrap_external(host, body));

    let head = usize::from(data.first().copied().unwrap_or(0));
    let tail = usize::from(data.last().copied().unwrap_or(0));
    let t = head_tail(text, head, tail);
    if text.len() <= head + tail {
        assert!(!t.truncated);
        assert_eq!(t.kept, text);
    } else {
        assert!(t.truncated);
        assert!(t.omitted_bytes >= text.len() - head - tail);
        assert!(t.omitted_bytes <= text.len());
        assert!(t.kept.contains("[keel: omitted "));
    }
});
