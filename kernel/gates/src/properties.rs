//! The properties every gate must keep for any input, written once: the fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) call these on every generated input, and the unit tests call them
//! on every seed of `fuzz/corpus/<target>` and on their proptest inputs. Each function panics
//! with a message naming the broken property; none of them is meant for production code.

use std::net::IpAddr;
use std::sync::OnceLock;

use url::{Host, Url};

use crate::arg_repair::{
    LOOKALIKE_NOTICE, is_truncation_stop, parse_strict, repair, strip_tool_call_lookalikes,
    truncated_call_notice,
};
use crate::exec_policy::{Decision, ExecPolicy};
use crate::net_policy::{MAX_REDIRECTS, NetDecision, NetPolicy, forbidden_range};
use crate::sanitize::{head_tail, sanitize_json, sanitize_text, wrap_external};
use crate::shell_split;

/// The argument gate: strict parsing and repair never panic and are deterministic, a repair is
/// always an object (and input that parses strictly needs no repair), stripping tool-call
/// look-alikes is idempotent, and the truncation notice is one line that says the call did not
/// run.
pub fn arg_repair(text: &str) {
    let strict = parse_strict(text);
    let repaired = repair(text);
    assert_eq!(repaired, repair(text), "repair is not deterministic");
    if let Ok(r) = &repaired {
        assert!(r.value.is_object(), "repair produced a non-object");
    }
    if let Ok(v) = &strict {
        assert!(v.is_object(), "strict parsing accepted a non-object");
        let r = repaired.as_ref().expect("strictly valid input repairs");
        assert_eq!(&r.value, v, "repair changed strictly valid input");
        assert!(
            r.steps.is_empty(),
            "strictly valid input needed repair steps"
        );
    }

    let (out, removed) = strip_tool_call_lookalikes(text);
    if removed.is_empty() {
        assert_eq!(out, text, "nothing was removed but the text changed");
    } else {
        assert!(out.contains(LOOKALIKE_NOTICE), "a removal left no notice");
    }
    let (again, removed_again) = strip_tool_call_lookalikes(&out);
    assert_eq!(again, out, "stripping is not idempotent");
    assert!(removed_again.is_empty(), "stripping left a look-alike");

    let notice = truncated_call_notice(text, text, text.len());
    assert!(!notice.contains('\n'), "the truncation notice spans lines");
    assert!(
        notice.contains("NOT executed"),
        "the truncation notice hides that the call did not run"
    );
    let _ = is_truncation_stop(text);
}

/// Characters that must never survive sanitizing, stated independently of the sanitizer's own
/// classification (variation selectors are checked apart, in [`sanitize`]).
fn forbidden_after_sanitizing(c: char) -> bool {
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

fn is_variation_selector(c: char) -> bool {
    ('\u{fe00}'..='\u{fe0f}').contains(&c)
}

/// Asserts that sanitized text holds nothing the sanitizer promises to remove.
pub fn assert_sanitized(s: &str) {
    let mut prev: Option<char> = None;
    for c in s.chars() {
        assert!(
            !forbidden_after_sanitizing(c),
            "U+{:04X} survived sanitizing",
            u32::from(c)
        );
        if is_variation_selector(c) {
            assert!(
                prev.is_some_and(|p| !is_variation_selector(p)
                    && !p.is_whitespace()
                    && !p.is_control()),
                "variation selector without a base"
            );
        }
        prev = Some(c);
    }
}

/// The output gate: sanitizing removes every class it promises to remove, is deterministic,
/// reaches a fixed point, treats JSON strings and keys alike; the `<external_content>` fence
/// holds for any host and body; the head/tail cut keeps what it says it keeps.
pub fn sanitize(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let r = sanitize_text(text);
    assert_sanitized(&r.text);
    assert_eq!(r, sanitize_text(text), "sanitizing is not deterministic");
    if r.report.converged {
        let again = sanitize_text(&r.text);
        assert_eq!(again.text, r.text, "sanitizing is not idempotent");
        assert!(
            again.report.is_unchanged(),
            "a fixed point reported changes"
        );
    }
    if r.report.is_unchanged() {
        assert_eq!(r.text, text, "an unchanged report with changed text");
    }

    // Tool output: sanitized, markers neutralized, and a fixed point of both.
    let out = crate::sanitize::sanitize_tool_output(text);
    assert_sanitized(&out.text);
    let (again, markers) = crate::markers::neutralize(&out.text);
    assert_eq!(
        markers, 0,
        "a neutralized marker survived in {:?}",
        out.text
    );
    assert_eq!(again, out.text);
    for marker in [
        "<|im_start|>",
        "<tool_call>",
        "\nHuman:",
        "[INST]",
        "[keel:",
    ] {
        assert!(
            !out.text.contains(marker),
            "{marker:?} survived in {:?}",
            out.text
        );
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
    assert_eq!(
        lower.matches("</external_content").count(),
        1,
        "the body closed the fence"
    );
    assert_eq!(
        lower.matches("<external_content").count(),
        1,
        "the body opened a fence"
    );
    assert!(w.ends_with("</external_content>"), "the fence is not last");
    assert_eq!(
        sanitize_text(&w).text,
        w,
        "the fence is not a sanitize fixed point"
    );
    assert_eq!(w, wrap_external(host, body), "fencing is not deterministic");

    let head = usize::from(data.first().copied().unwrap_or(0));
    let tail = usize::from(data.last().copied().unwrap_or(0));
    let t = head_tail(text, head, tail);
    if text.len() <= head + tail {
        assert!(!t.truncated, "short text was cut");
        assert_eq!(t.kept, text, "short text was changed");
    } else {
        assert!(t.truncated, "long text was not cut");
        assert!(
            t.omitted_bytes >= text.len() - head - tail,
            "kept more than asked"
        );
        assert!(t.omitted_bytes <= text.len(), "omitted more than there was");
        assert!(t.kept.contains("[keel: omitted "), "a cut without a marker");
    }
}

fn builtin_policy() -> &'static ExecPolicy {
    static POLICY: OnceLock<ExecPolicy> = OnceLock::new();
    POLICY.get_or_init(ExecPolicy::builtin)
}

/// The shell splitter and the exec policy on it: splitting and checking are deterministic,
/// every span indexes the input, and the verdict is the maximum over its segments.
pub fn shell_split(text: &str) {
    let a = shell_split::split(text);
    assert_eq!(
        a,
        shell_split::split(text),
        "splitting is not deterministic"
    );
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

    let policy = builtin_policy();
    let v = policy.check(text);
    assert_eq!(v, policy.check(text), "checking is not deterministic");
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
        assert!(i < v.segments.len(), "the deciding segment does not exist");
    }
    let _ = policy.approval_key(text);
}

/// The IP address a URL's host names literally, if it is an IP literal.
fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(a) => Some(IpAddr::V4(a)),
        Host::Ipv6(a) => Some(IpAddr::V6(a)),
        Host::Domain(_) => None,
    }
}

/// Properties of one URL the most permissive policy (default allow, no private exceptions)
/// did not deny: only http(s), no credentials, a host, and no literal internal address.
fn assert_allowed_url_is_public(url: &str) {
    let parsed = Url::parse(url).expect("an allowed URL parses");
    assert!(
        matches!(parsed.scheme(), "http" | "https"),
        "allowed a {} URL",
        parsed.scheme()
    );
    assert!(
        parsed.username().is_empty() && parsed.password().is_none(),
        "allowed a URL with credentials"
    );
    assert!(parsed.host().is_some(), "allowed a URL without a host");
    if let Some(ip) = literal_ip(&parsed) {
        assert!(
            forbidden_range(ip).is_none(),
            "allowed the internal address {ip}"
        );
    }
}

/// The network policy's URL, address and redirect handling. The input's first line is a URL
/// (the request, and the origin of a redirect), the second a `Location`, the first byte the
/// hop count, and any further lines addresses the host resolved to. Under the most permissive
/// policy: nothing panics, verdicts are deterministic, deny is exactly a refusal, refusals
/// never echo a query string, an allowed URL or redirect target is http(s) to a public literal
/// or a name, a pinned address is one of the resolved ones and none of them is internal, and
/// no redirect is followed past the limit.
pub fn net_policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let url = lines.next().unwrap_or("");
    let location = lines.next().unwrap_or("");
    let addrs: Vec<IpAddr> = lines.filter_map(|l| l.trim().parse().ok()).collect();
    let hop = usize::from(data.first().copied().unwrap_or(0) % 8);

    let policy = NetPolicy::new(NetDecision::Allow);
    let v = policy.decide_url(url);
    assert_eq!(v, policy.decide_url(url), "deciding is not deterministic");
    assert_eq!(
        v.refusal().is_some(),
        v.decision == NetDecision::Forbid,
        "a deny without a refusal, or the reverse"
    );
    if let Some(r) = v.refusal() {
        assert!(
            !r.target.contains('?'),
            "a refusal echoes a query: {}",
            r.target
        );
    }
    if v.decision != NetDecision::Forbid {
        assert_allowed_url_is_public(url);
        let port = v.port.unwrap_or(443);
        if let Ok(pinned) = policy.check_resolved(&v.host, port, &addrs) {
            assert!(
                addrs.contains(&pinned),
                "pinned {pinned}, which the name did not resolve to"
            );
            for a in &addrs {
                assert!(
                    forbidden_range(*a).is_none(),
                    "pinned a name that resolves to {a}"
                );
            }
        }
    }

    match policy.check_redirect(url, location, hop) {
        Ok(next) => {
            assert!(hop < MAX_REDIRECTS, "followed redirect number {}", hop + 1);
            assert_eq!(
                policy.decide_url(&next).decision,
                NetDecision::Allow,
                "followed a redirect the policy does not allow"
            );
            assert_allowed_url_is_public(&next);
        }
        Err(r) => assert!(
            !r.target.contains('?'),
            "a refusal echoes a query: {}",
            r.target
        ),
    }
}
