//! Secret redaction for everything the kernel logs or hands back: request and error logs, a
//! plugin's stderr, error bodies echoed to the model. Redaction happens once, at the kernel
//! boundary, not in each plugin.
//!
//! [`redact`] replaces with [`REDACTED`]:
//!
//! - every occurrence of each known secret (the values of configured API keys) of at least
//!   [`MIN_SECRET_CHARS`] characters — shorter ones would mangle ordinary text and are ignored;
//! - the token after `Bearer` (any case, so `Authorization: Bearer abc` becomes
//!   `Authorization: Bearer [REDACTED]`);
//! - the value after a key-ish name followed by `:` or `=`, quoted or not: `x-api-key`,
//!   `x-goog-api-key`, `api_key`, `api-key`, `apikey`, `access_token`, `refresh_token`,
//!   `auth_token`, `client_secret` (any case, also as the end of a longer name such as
//!   `OPENAI_API_KEY=`), so `x-api-key: abc`, `api_key=abc&x=1` and `"api_key": "abc"` all keep
//!   their key and lose their value;
//! - whole tokens of well-known key shapes: `sk-` followed by 20 or more of `A-Za-z0-9_-`,
//!   `sk-ant-` followed by 8 or more, GitHub's `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_` (20 or more
//!   alphanumerics) and `github_pat_`, AWS access key ids `AKIA`/`ASIA` + 16 of `A-Z0-9`, Google
//!   `AIza` + 35, Slack `xoxb-`/`xoxp-`/`xoxa-`/`xoxr-`/`xoxs-` + 10.
//!
//! [`redact_log`] also hides the value of an upper-case `NAME=value` whose name looks secret
//! (`GITHUB_TOKEN=…`, `AWS_SECRET_ACCESS_KEY=…`), for what a process writes that keel logs.
//!
//! The scanning is hand-written (no regular expressions) and linear per pattern. It never
//! panics, and it is idempotent: `redact(redact(t)) == redact(t)`. Existing `[REDACTED]`
//! markers are opaque (nothing matches across or inside one), and the passes repeat until
//! nothing changes, so a redaction that exposes a new match (a known secret glued to an
//! `sk-...` key) is handled too; each changing pass removes text outside the markers, so the
//! repetition always ends.

/// What a redacted secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Known secrets shorter than this (in characters) are ignored.
pub const MIN_SECRET_CHARS: usize = 8;

/// Names whose value is a secret, matched case-insensitively.
const SECRET_KEYS: &[&str] = &[
    "x-api-key",
    "x-goog-api-key",
    "api_key",
    "api-key",
    "apikey",
    "access_token",
    "refresh_token",
    "auth_token",
    "client_secret",
];

/// Which characters a key shape's body may use.
#[derive(Clone, Copy)]
enum Body {
    /// `A-Z a-z 0-9 _ -`
    Token,
    /// `A-Z a-z 0-9`
    Alnum,
    /// `A-Z a-z 0-9 _`
    AlnumUnderscore,
    /// `A-Z 0-9`
    UpperDigit,
    /// `A-Z a-z 0-9 -`
    AlnumDash,
}

impl Body {
    fn accepts(self, b: u8) -> bool {
        match self {
            Body::Token => b.is_ascii_alphanumeric() || b == b'_' || b == b'-',
            Body::Alnum => b.is_ascii_alphanumeric(),
            Body::AlnumUnderscore => b.is_ascii_alphanumeric() || b == b'_',
            Body::UpperDigit => b.is_ascii_uppercase() || b.is_ascii_digit(),
            Body::AlnumDash => b.is_ascii_alphanumeric() || b == b'-',
        }
    }
}

/// A well-known key shape: a case-sensitive prefix and a body of at least `min` characters
/// (with `exact`, exactly `min`, not followed by an alphanumeric).
struct Shape {
    prefix: &'static [u8],
    body: Body,
    min: usize,
    exact: bool,
}

const SHAPES: &[Shape] = &[
    shape(b"sk-ant-", Body::Token, 8, false),
    shape(b"sk-", Body::Token, 20, false),
    shape(b"ghp_", Body::Alnum, 20, false),
    shape(b"gho_", Body::Alnum, 20, false),
    shape(b"ghu_", Body::Alnum, 20, false),
    shape(b"ghs_", Body::Alnum, 20, false),
    shape(b"ghr_", Body::Alnum, 20, false),
    shape(b"github_pat_", Body::AlnumUnderscore, 20, false),
    shape(b"AKIA", Body::UpperDigit, 16, true),
    shape(b"ASIA", Body::UpperDigit, 16, true),
    shape(b"AIza", Body::Token, 35, false),
    shape(b"xoxb-", Body::AlnumDash, 10, false),
    shape(b"xoxp-", Body::AlnumDash, 10, false),
    shape(b"xoxa-", Body::AlnumDash, 10, false),
    shape(b"xoxr-", Body::AlnumDash, 10, false),
    shape(b"xoxs-", Body::AlnumDash, 10, false),
];

const fn shape(prefix: &'static [u8], body: Body, min: usize, exact: bool) -> Shape {
    Shape {
        prefix,
        body,
        min,
        exact,
    }
}

/// Replaces known secrets and secret-looking values in `text` with [`REDACTED`] (see the
/// module docs for the patterns). Never panics; `redact(&redact(t, s), s) == redact(t, s)`.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let secrets: Vec<&str> = secrets
        .iter()
        .copied()
        .filter(|s| s.chars().count() >= MIN_SECRET_CHARS)
        .collect();
    let mut current = text.to_owned();
    // Every changing pass shrinks the text outside the markers by at least one byte, so this
    // bound is never reached; it only makes termination obvious.
    for _ in 0..=text.len() {
        match pass(&current, &secrets) {
            Some(next) => current = next,
            None => break,
        }
    }
    current
}

/// One pass over the marker-free segments of `text`; `None` when nothing matched.
fn pass(text: &str, secrets: &[&str]) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut first = true;
    for segment in text.split(REDACTED) {
        if !first {
            out.push_str(REDACTED);
        }
        first = false;
        let ranges = merged(find_ranges(segment, secrets));
        if ranges.is_empty() {
            out.push_str(segment);
            continue;
        }
        changed = true;
        let mut at = 0;
        for (start, end) in ranges {
            out.push_str(segment.get(at..start).unwrap_or(""));
            out.push_str(REDACTED);
            at = end;
        }
        out.push_str(segment.get(at..).unwrap_or(""));
    }
    changed.then_some(out)
}

/// Sorts and merges overlapping or touching ranges, dropping empty and misaligned ones.
fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.retain(|(s, e)| s < e);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Every byte range of `s` to redact (unsorted, possibly overlapping). All ranges start and
/// end on character boundaries: patterns begin and end at ASCII bytes or at the segment's end.
fn find_ranges(s: &str, secrets: &[&str]) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    for secret in secrets {
        find_secret(s, secret, &mut ranges);
    }
    let b = s.as_bytes();
    for i in 0..b.len() {
        let word_start = i == 0 || b.get(i - 1).is_some_and(|p| !p.is_ascii_alphanumeric());
        if !word_start || !b.get(i).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        if let Some(r) = bearer_at(b, i) {
            ranges.push(r);
        }
        if let Some(r) = key_value_at(b, i) {
            ranges.push(r);
        }
        if let Some(r) = shape_at(b, i) {
            ranges.push(r);
        }
    }
    ranges
}

/// Every occurrence of `secret` in `s`, overlapping ones included.
fn find_secret(s: &str, secret: &str, ranges: &mut Vec<(usize, usize)>) {
    let step = secret.chars().next().map_or(1, char::len_utf8);
    let mut from = 0;
    while let Some(i) = s.get(from..).and_then(|rest| rest.find(secret)) {
        let start = from + i;
        ranges.push((start, start + secret.len()));
        from = start + step;
    }
}

/// Whether `b[i..]` starts with `word`, ignoring ASCII case.
fn starts_with_ci(b: &[u8], i: usize, word: &[u8]) -> bool {
    b.get(i..i + word.len())
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
}

fn skip_blanks(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| *c == b' ' || *c == b'\t') {
        i += 1;
    }
    i
}

/// `Bearer <token>`: the token (RFC 6750 characters), when `bearer` is a whole word followed by
/// blanks.
fn bearer_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    const WORD: &[u8] = b"bearer";
    if !starts_with_ci(b, i, WORD) {
        return None;
    }
    let after = i + WORD.len();
    let start = skip_blanks(b, after);
    if start == after {
        return None;
    }
    let mut end = start;
    while b.get(end).is_some_and(|c| {
        c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
    }) {
        end += 1;
    }
    (end > start).then_some((start, end))
}

/// `<key> : <value>` / `<key>=<value>` / `"<key>": "<value>"`: the value.
fn key_value_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let key = SECRET_KEYS
        .iter()
        .find(|k| starts_with_ci(b, i, k.as_bytes()))?;
    let mut j = i + key.len();
    if b.get(j)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
    {
        return None;
    }
    if b.get(j).is_some_and(|c| *c == b'"' || *c == b'\'') {
        j += 1;
    }
    j = skip_blanks(b, j);
    if !b.get(j).is_some_and(|c| *c == b':' || *c == b'=') {
        return None;
    }
    j = skip_blanks(b, j + 1);
    match b.get(j) {
        Some(&q) if q == b'"' || q == b'\'' => {
            let start = j + 1;
            let mut end = start;
            while let Some(&c) = b.get(end) {
                if c == q || c == b'\n' || c == b'\r' {
                    break;
                }
                end += if c == b'\\' && b.get(end + 1).is_some_and(u8::is_ascii) {
                    2
                } else {
                    1
                };
            }
            (end > start).then_some((start, end.min(b.len())))
        }
        Some(_) => {
            let start = j;
            let mut end = start;
            while b.get(end).is_some_and(|c| {
                !c.is_ascii_whitespace()
                    && !matches!(
                        c,
                        b'&' | b','
                            | b';'
                            | b'"'
                            | b'\''
                            | b'<'
                            | b'>'
                            | b'('
                            | b')'
                            | b'{'
                            | b'}'
                            | b'['
                            | b']'
                    )
            }) {
                end += 1;
            }
            (end > start).then_some((start, end))
        }
        None => None,
    }
}

/// Words that make an environment variable's name secret-looking (`GITHUB_TOKEN`,
/// `AWS_SECRET_ACCESS_KEY`, `PGPASSWORD`, `NPM_AUTH`, …).
const SECRET_NAME_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PRIVATE_KEY",
    "ACCESS_KEY",
    "API_KEY",
    "APIKEY",
    "CREDENTIAL",
    "AUTH",
    "SESSION_KEY",
];

/// [`redact`], and besides the value of every `NAME=value` whose name is an upper-case
/// environment variable name that looks secret ([`SECRET_NAME_WORDS`]): for text a process
/// wrote that keel copies into its log (a failing server dumping its environment). Only
/// upper-case names count, so source code (`let token = …`) read through a tool is not
/// mangled; that goes through [`redact`] alone.
pub fn redact_log(text: &str, secrets: &[&str]) -> String {
    let b = text.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || b.get(i - 1).is_some_and(|p| !is_env_name_byte(*p));
        if !word_start || !b.get(i).is_some_and(u8::is_ascii_uppercase) {
            i += 1;
            continue;
        }
        let mut end = i;
        while b.get(end).is_some_and(|c| is_env_name_byte(*c)) {
            end += 1;
        }
        let name = text.get(i..end).unwrap_or("");
        let upper = !name.bytes().any(|c| c.is_ascii_lowercase());
        if upper && b.get(end) == Some(&b'=') && SECRET_NAME_WORDS.iter().any(|w| name.contains(w))
        {
            let start = end + 1;
            let mut stop = start;
            while b.get(stop).is_some_and(|c| !c.is_ascii_whitespace()) {
                stop += 1;
            }
            if stop > start {
                ranges.push((start, stop));
            }
            i = stop.max(end + 1);
            continue;
        }
        i = end.max(i + 1);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in merged(ranges) {
        out.push_str(text.get(at..start).unwrap_or(""));
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(text.get(at..).unwrap_or(""));
    redact(&out, secrets)
}

fn is_env_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// A well-known key shape starting at `i`: the whole token.
fn shape_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    SHAPES.iter().find_map(|shape| {
        if !b
            .get(i..)
            .is_some_and(|rest| rest.starts_with(shape.prefix))
        {
            return None;
        }
        let start = i + shape.prefix.len();
        let mut end = start;
        while b.get(end).is_some_and(|c| shape.body.accepts(*c)) {
            end += 1;
        }
        let len = end - start;
        let ok = if shape.exact {
            len == shape.min && !b.get(end).is_some_and(u8::is_ascii_alphanumeric)
        } else {
            len >= shape.min
        };
        ok.then_some((i, end))
    })
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
