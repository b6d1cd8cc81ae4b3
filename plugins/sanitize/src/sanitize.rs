//! The output gate for text that enters the model's context from outside: tool output, fetched
//! pages, MCP results.
//!
//! Four pure functions, no I/O:
//!
//! - [`sanitize_text`] removes what a human reviewing the transcript cannot see but the model
//!   still reads: format characters (Cf, which covers zero-width characters, bidi controls, the
//!   BOM and the Unicode tag block), private-use (Co) and unassigned (Cn) code points, control
//!   characters and terminal escape sequences. Before each removal pass the text is
//!   NFKC-normalized, and the two steps repeat until nothing changes (at most [`MAX_ROUNDS`]
//!   rounds), because removing a character can expose a new composition and normalizing can in
//!   principle expose a new character to remove.
//! - [`sanitize_json`] does the same for every string of a JSON value, object keys included.
//! - [`wrap_external`] fences content of network origin in
//!   `<external_content source="HOST">…</external_content>` so that the body cannot close the
//!   fence early and the label is byte-stable (no nonce, no timestamp: the prompt cache survives).
//! - [`head_tail`] / [`head_tail_with_pointer`] cut long output down to its head and tail with a
//!   marker line in the middle; spilling the full text to disk is the caller's job.
//!
//! # What is removed, and what is kept
//!
//! | input | result | counted in |
//! | --- | --- | --- |
//! | printable ASCII, `\t`, `\n` | kept | |
//! | `\r\n` | `\n` | [`SanitizeReport::line_breaks_normalized`] |
//! | lone `\r`, U+0085 NEL, U+2028, U+2029 | `\n` | [`SanitizeReport::line_breaks_normalized`] |
//! | other C0 controls, DEL, C1 controls | removed | [`SanitizeReport::removed_controls`] |
//! | ANSI escape sequences (CSI up to 64 bytes, OSC/DCS/SOS/PM/APC ended by BEL or ST within 4 KiB and before any other control character, two- and three-character ESC sequences) | removed whole | [`SanitizeReport::removed_controls`] |
//! | general categories Cf, Co, Cn (and Cc, Cs) | removed | [`SanitizeReport::removed_invisible`] |
//! | explicit ranges, whatever the tables say: U+200B–U+200F, U+202A–U+202E, U+2060–U+206F, U+FEFF, U+E0000–U+E007F, the private-use planes | removed | [`SanitizeReport::removed_invisible`] |
//! | the Hangul fillers U+115F, U+1160, U+3164, U+FFA0 (letters that render as nothing) | removed | [`SanitizeReport::removed_invisible`] |
//! | variation selectors U+FE00–U+FE0F and U+E0100–U+E01EF | removed | [`SanitizeReport::removed_invisible`] |
//!
//! Carriage returns are turned into line feeds rather than kept: `progress 10%\rprogress 20%`
//! stays readable as two lines, and a lone `\r` can no longer make a terminal or log viewer
//! overprint text that the model still reads. Variation selectors are a known way to hide
//! bytes after an innocent-looking character (even one per character carries four bits); all
//! real text loses by their removal is an emoji's colour presentation. Terminal escape sequences are removed whole rather than leaving `[31m`
//! residue behind; an unterminated OSC string only loses its `ESC`, so a stray `ESC ]` cannot
//! swallow the rest of the output.
//!
//! Determinism: the output depends only on the input and on the Unicode tables compiled in
//! (`unicode-normalization` for NFKC, `unicode-properties` for general categories).
//! Performance: pure printable ASCII is returned after a single byte scan; NFKC only runs on the
//! non-ASCII runs whose quick check is not a clear "yes".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::{Map, Value};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// Most normalize-then-filter rounds [`sanitize_text`] runs before it stops looking for a fixed
/// point. Real text converges in one or two rounds; stopping early is reported, never a panic,
/// and the result still contains none of the removed characters (the filter runs last).
pub const MAX_ROUNDS: usize = 10;

/// Default head budget of [`head_tail`] in bytes (22 KiB): most of a 30 KiB output budget.
pub const DEFAULT_HEAD: usize = 22 * 1024;

/// Default tail budget of [`head_tail`] in bytes (8 KiB): the tail is where error messages and
/// test summaries usually are.
pub const DEFAULT_TAIL: usize = 8 * 1024;

/// Longest host label [`wrap_external`] writes, in characters; longer labels are cut.
pub const MAX_HOST_LABEL: usize = 256;

/// Longest OSC / DCS / APC / PM / SOS string (bytes) recognised as one escape sequence.
const MAX_ESCAPE_STRING: usize = 4096;

/// Longest CSI sequence (bytes, `ESC` included) recognised as one escape sequence.
const MAX_CSI_LEN: usize = 64;

/// What [`sanitize_text`] and [`sanitize_json_with_report`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SanitizeReport {
    /// Characters removed as invisible: format, private-use and unassigned code points, tag
    /// characters, fillers and surplus variation selectors.
    pub removed_invisible: usize,
    /// Characters removed as control characters, including every character of a removed
    /// terminal escape sequence.
    pub removed_controls: usize,
    /// Line breaks rewritten to `\n` (`\r\n`, lone `\r`, NEL, U+2028, U+2029).
    pub line_breaks_normalized: usize,
    /// Whether NFKC normalization changed the text.
    pub normalized: bool,
    /// Object keys that collided after sanitizing and were renamed ([`sanitize_json`] only).
    pub renamed_keys: usize,
    /// Role, special-token, tool-call and fence markers made harmless
    /// ([`sanitize_tool_output`] only; see [`crate::markers`]).
    pub neutralized_markers: usize,
    /// Normalize-then-filter rounds run (0 when the fast path applied). For JSON, the most
    /// rounds any one string needed.
    pub rounds: usize,
    /// `false` when [`MAX_ROUNDS`] rounds still changed the text: the result contains none of
    /// the removed characters but may not be NFKC-stable.
    pub converged: bool,
}

impl SanitizeReport {
    /// Characters removed in total (invisible plus control characters).
    pub fn removed(&self) -> usize {
        self.removed_invisible.saturating_add(self.removed_controls)
    }

    /// Whether the text came out byte-identical to what went in.
    pub fn is_unchanged(&self) -> bool {
        self.removed() == 0
            && self.neutralized_markers == 0
            && self.line_breaks_normalized == 0
            && !self.normalized
            && self.renamed_keys == 0
    }

    /// A one-line notice for the transcript when characters were removed or keys renamed, so
    /// the removal is visible; `None` when nothing worth telling happened (line-ending and NFKC
    /// rewrites alone are not announced).
    pub fn notice(&self) -> Option<String> {
        if self.removed() == 0 && self.renamed_keys == 0 && self.neutralized_markers == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if self.removed_invisible > 0 {
            parts.push(format!(
                "{} invisible character{}",
                self.removed_invisible,
                plural(self.removed_invisible)
            ));
        }
        if self.removed_controls > 0 {
            parts.push(format!(
                "{} control character{}",
                self.removed_controls,
                plural(self.removed_controls)
            ));
        }
        let mut notice = String::from("[keel: ");
        if !parts.is_empty() {
            notice.push_str("removed ");
            notice.push_str(&parts.join(" and "));
            notice.push_str(" from this content");
        }
        if self.neutralized_markers > 0 {
            if !parts.is_empty() {
                notice.push_str("; ");
            }
            notice.push_str(&format!(
                "neutralized {} role, tool-call or fence marker{} (shown as ‹…›)",
                self.neutralized_markers,
                plural(self.neutralized_markers)
            ));
        }
        if self.renamed_keys > 0 {
            if !parts.is_empty() || self.neutralized_markers > 0 {
                notice.push_str("; ");
            }
            notice.push_str(&format!(
                "renamed {} object key{} that collided after sanitizing",
                self.renamed_keys,
                plural(self.renamed_keys)
            ));
        }
        notice.push(']');
        Some(notice)
    }

    fn absorb(&mut self, other: &SanitizeReport) {
        self.removed_invisible = self
            .removed_invisible
            .saturating_add(other.removed_invisible);
        self.removed_controls = self.removed_controls.saturating_add(other.removed_controls);
        self.line_breaks_normalized = self
            .line_breaks_normalized
            .saturating_add(other.line_breaks_normalized);
        self.normalized |= other.normalized;
        self.renamed_keys = self.renamed_keys.saturating_add(other.renamed_keys);
        self.neutralized_markers = self
            .neutralized_markers
            .saturating_add(other.neutralized_markers);
        self.rounds = self.rounds.max(other.rounds);
        self.converged &= other.converged;
    }
}

/// Sanitized text and what was changed to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sanitized {
    /// The sanitized text.
    pub text: String,
    /// What was removed or rewritten.
    pub report: SanitizeReport,
}

/// Sanitizes a tool's output (or error) for the model's context: [`sanitize_text`], then
/// [`crate::markers::neutralize`], so the output can neither hide text from a reviewer nor pass
/// for a role turn, a tool call or a notice of keel's.
pub fn sanitize_tool_output(s: &str) -> Sanitized {
    let mut clean = sanitize_text(s);
    let (text, markers) = crate::markers::neutralize(&clean.text);
    if markers > 0 {
        clean.text = text.into_owned();
        clean.report.neutralized_markers = markers;
    }
    clean
}

/// Sanitizes text for the model's context: NFKC, then removal of invisible and control
/// characters (see the [module documentation](self) for the exact classes), repeated to a fixed
/// point for at most [`MAX_ROUNDS`] rounds.
///
/// Never panics. The result never contains a removed character, even when the round limit is
/// hit, and sanitizing it again changes nothing whenever [`SanitizeReport::converged`] is set.
pub fn sanitize_text(s: &str) -> Sanitized {
    let mut report = SanitizeReport {
        converged: true,
        ..SanitizeReport::default()
    };
    if is_plain(s) {
        return Sanitized {
            text: s.to_owned(),
            report,
        };
    }
    let mut current: Cow<'_, str> = Cow::Borrowed(s);
    report.converged = false;
    for round in 1..=MAX_ROUNDS {
        report.rounds = round;
        let mut changed = false;
        if let Some(normalized) = nfkc_changed(&current) {
            current = Cow::Owned(normalized);
            report.normalized = true;
            changed = true;
        }
        if let Some(filtered) = filter_changed(&current, &mut report) {
            current = Cow::Owned(filtered);
            changed = true;
        }
        if !changed {
            report.converged = true;
            break;
        }
    }
    Sanitized {
        text: current.into_owned(),
        report,
    }
}

/// Whether [`sanitize_text`] removes or rewrites `c`: an invisible, private-use, unassigned or
/// control character, a variation selector or a line break other than `\n` (`\t` and `\n`
/// are kept). For callers that refuse such text outright instead of cleaning it, with the
/// same classes.
pub fn is_removed(c: char) -> bool {
    classify(c) != Class::Keep
}

/// A file name (or path) as one unambiguous line, the same for the model and for the person's
/// terminal: when it holds a control character (a newline would make one entry look like two)
/// or starts with `"`, a JSON string in double quotes with those characters escaped; otherwise
/// `None` (shown as it is).
pub fn one_line_name(name: &str) -> Option<String> {
    (name.chars().any(char::is_control) || name.starts_with('"'))
        .then(|| serde_json::Value::String(name.to_owned()).to_string())
}

/// Text made safe to show a person on a terminal (not for the model): the removals of
/// [`sanitize_text`] without its NFKC step, so what the person reads keeps its characters
/// (`…`, `x²`, `ﬁ`) while no escape sequence, control, bidi or invisible character gets
/// through.
pub fn sanitize_for_display(s: &str) -> String {
    if is_plain(s) {
        return s.to_owned();
    }
    let mut report = SanitizeReport::default();
    let mut current: Cow<'_, str> = Cow::Borrowed(s);
    for _ in 0..MAX_ROUNDS {
        match filter_changed(&current, &mut report) {
            Some(filtered) => current = Cow::Owned(filtered),
            None => break,
        }
    }
    current.into_owned()
}

/// [`sanitize_text`] applied to every string of a JSON value, object keys included; numbers,
/// booleans and nulls are copied. See [`sanitize_json_with_report`] for the key-collision rule.
pub fn sanitize_json(v: &Value) -> Value {
    sanitize_json_with_report(v).0
}

/// [`sanitize_json`] with the combined report of every string sanitized.
///
/// Keys that become equal after sanitizing (`"path"` and `"path\u{200B}"`): the first one in the
/// object's iteration order keeps the sanitized key, each later one gets the first free
/// `KEY~N` with N = 2, 3, …, and [`SanitizeReport::renamed_keys`] counts them. The iteration
/// order is serde_json's: sorted by the original key, or insertion order when serde_json's
/// `preserve_order` feature is on; either way the result is deterministic. Renaming rather than
/// dropping keeps every value visible while making sure a smuggled duplicate cannot silently
/// replace the plain key.
///
/// Works with an explicit stack, so a deeply nested value cannot overflow the call stack.
pub fn sanitize_json_with_report(v: &Value) -> (Value, SanitizeReport) {
    let mut report = SanitizeReport {
        converged: true,
        ..SanitizeReport::default()
    };
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut carry = match enter(v, &mut report) {
        Entered::Leaf(value) => return (value, report),
        Entered::Open(frame) => {
            stack.push(frame);
            None
        }
    };
    loop {
        let Some(top) = stack.last_mut() else {
            // Unreachable: the loop returns when it pops the last frame.
            return (carry.unwrap_or(Value::Null), report);
        };
        if let Some(value) = carry.take() {
            top.accept(value, &mut report);
        }
        match top.next_child(&mut report) {
            Some(child) => match enter(child, &mut report) {
                Entered::Leaf(value) => carry = Some(value),
                Entered::Open(frame) => stack.push(frame),
            },
            None => {
                let finished = match stack.pop() {
                    Some(frame) => frame.finish(),
                    None => Value::Null,
                };
                if stack.is_empty() {
                    return (finished, report);
                }
                carry = Some(finished);
            }
        }
    }
}

enum Entered<'a> {
    Leaf(Value),
    Open(Frame<'a>),
}

enum Frame<'a> {
    Array {
        items: std::slice::Iter<'a, Value>,
        out: Vec<Value>,
    },
    Object {
        entries: serde_json::map::Iter<'a>,
        out: Map<String, Value>,
        key: String,
        next_suffix: BTreeMap<String, usize>,
    },
}

impl<'a> Frame<'a> {
    fn next_child(&mut self, report: &mut SanitizeReport) -> Option<&'a Value> {
        match self {
            Frame::Array { items, .. } => items.next(),
            Frame::Object { entries, key, .. } => {
                let (k, v) = entries.next()?;
                let s = sanitize_text(k);
                report.absorb(&s.report);
                *key = s.text;
                Some(v)
            }
        }
    }

    fn accept(&mut self, value: Value, report: &mut SanitizeReport) {
        match self {
            Frame::Array { out, .. } => out.push(value),
            Frame::Object {
                out,
                key,
                next_suffix,
                ..
            } => {
                let key = std::mem::take(key);
                if !out.contains_key(&key) {
                    out.insert(key, value);
                    return;
                }
                report.renamed_keys = report.renamed_keys.saturating_add(1);
                let mut n = next_suffix.get(&key).copied().unwrap_or(2);
                // Terminates: every probe that fails moves past a key already in `out`.
                loop {
                    let candidate = format!("{key}~{n}");
                    n = n.saturating_add(1);
                    if !out.contains_key(&candidate) {
                        next_suffix.insert(key, n);
                        out.insert(candidate, value);
                        return;
                    }
                }
            }
        }
    }

    fn finish(self) -> Value {
        match self {
            Frame::Array { out, .. } => Value::Array(out),
            Frame::Object { out, .. } => Value::Object(out),
        }
    }
}

fn enter<'a>(v: &'a Value, report: &mut SanitizeReport) -> Entered<'a> {
    match v {
        Value::String(s) => {
            let s = sanitize_text(s);
            report.absorb(&s.report);
            Entered::Leaf(Value::String(s.text))
        }
        Value::Array(items) => Entered::Open(Frame::Array {
            items: items.iter(),
            out: Vec::with_capacity(items.len()),
        }),
        Value::Object(map) => Entered::Open(Frame::Object {
            entries: map.iter(),
            out: Map::new(),
            key: String::new(),
            next_suffix: BTreeMap::new(),
        }),
        other => Entered::Leaf(other.clone()),
    }
}

/// Fences content of network origin for the model's context:
///
/// ```text
/// <external_content source="HOST">
/// BODY
/// </external_content>
/// ```
///
/// Both host and body are run through [`sanitize_text`] first (so the fence holds whether or
/// not the caller sanitized, and sanitizing the result again changes nothing). In the host,
/// `& " ' < >` and whitespace become character references and the label is cut at
/// [`MAX_HOST_LABEL`] characters. In the body, every `<` that starts an opening or closing
/// `external_content` tag (ASCII case-insensitive, `_` or `-`, whitespace allowed around the
/// `/`) becomes `&lt;`, so nothing in the body can close the fence or open a nested one. A
/// newline is added before the closing tag unless the body already ends with one.
///
/// Byte-stable: identical input gives identical bytes.
pub fn wrap_external(host: &str, body: &str) -> String {
    let host = sanitize_text(host).text;
    let body = sanitize_text(body).text;
    let mut out = String::with_capacity(body.len() + host.len() + 64);
    out.push_str("<external_content source=\"");
    for c in host.chars().take(MAX_HOST_LABEL) {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c if c.is_whitespace() || c.is_control() => {
                out.push_str(&format!("&#x{:X};", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push_str("\">\n");
    neutralize_fence_tags(&body, &mut out);
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("</external_content>");
    out
}

/// Copies `body` to `out`, replacing the `<` of every `external_content` tag with `&lt;`.
fn neutralize_fence_tags(body: &str, out: &mut String) {
    const NAME: &[u8] = b"external_content";
    let bytes = body.as_bytes();
    let mut copied = 0;
    let mut i = 0;
    while let Some(offset) = bytes
        .get(i..)
        .and_then(|rest| rest.iter().position(|&b| b == b'<'))
    {
        let lt = i + offset;
        let mut j = lt + 1;
        while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
            j += 1;
        }
        if bytes.get(j) == Some(&b'/') {
            j += 1;
            while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
        }
        let is_tag = bytes.get(j..j + NAME.len()).is_some_and(|word| {
            word.iter().zip(NAME).all(|(&a, &b)| {
                let a = a.to_ascii_lowercase();
                a == b || (b == b'_' && a == b'-')
            })
        });
        if is_tag {
            out.push_str(body.get(copied..lt).unwrap_or_default());
            out.push_str("&lt;");
            copied = lt + 1;
        }
        i = lt + 1;
    }
    out.push_str(body.get(copied..).unwrap_or_default());
}

/// The result of [`head_tail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// The text to put into context: the whole text, or head, marker line and tail.
    pub kept: String,
    /// Bytes of the original text left out.
    pub omitted_bytes: usize,
    /// Lines, whole or partial, of the original text left out (newlines in the omitted part,
    /// plus one when it does not end with a newline).
    pub omitted_lines: usize,
    /// Whether anything was left out.
    pub truncated: bool,
}

/// Keeps at most `head_bytes` from the start and `tail_bytes` from the end of `text`, with a
/// marker line in the middle saying how much was left out. Text that fits in
/// `head_bytes + tail_bytes` is returned whole.
///
/// Cuts are made at line boundaries when one lies in the second half of the head budget (or the
/// first half of the tail budget), otherwise at the nearest character boundary inside the
/// budget, so the kept parts never exceed their budgets and never split a character. The
/// marker line is `[keel: omitted N bytes (M lines) from the middle of this output]`. Never
/// panics, whatever the budgets.
pub fn head_tail(text: &str, head_bytes: usize, tail_bytes: usize) -> Truncated {
    head_tail_impl(text, head_bytes, tail_bytes, None)
}

/// [`head_tail`] whose marker line also says where the full text is:
/// `[keel: omitted N bytes (M lines) from the middle of this output; full output: POINTER]`.
/// The caller writes the full text somewhere and passes the pointer (for instance the call
/// that retrieves it); control characters, line breaks and `]` in the pointer become spaces or
/// `)` so it cannot end the marker line early.
pub fn head_tail_with_pointer(
    text: &str,
    head_bytes: usize,
    tail_bytes: usize,
    pointer: &str,
) -> Truncated {
    head_tail_impl(text, head_bytes, tail_bytes, Some(pointer))
}

/// The marker line [`head_tail`] and [`head_tail_with_pointer`] put in place of the omitted
/// middle (without a trailing newline).
pub fn omission_marker(
    omitted_bytes: usize,
    omitted_lines: usize,
    pointer: Option<&str>,
) -> String {
    let mut marker = format!(
        "[keel: omitted {omitted_bytes} byte{} ({omitted_lines} line{}) from the middle of this output",
        plural(omitted_bytes),
        plural(omitted_lines)
    );
    if let Some(pointer) = pointer {
        marker.push_str("; full output: ");
        for c in pointer.chars() {
            match c {
                ']' => marker.push(')'),
                c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => marker.push(' '),
                c => marker.push(c),
            }
        }
    }
    marker.push(']');
    marker
}

fn head_tail_impl(
    text: &str,
    head_bytes: usize,
    tail_bytes: usize,
    pointer: Option<&str>,
) -> Truncated {
    let Some((head_end, tail_start)) = cut_points(text, head_bytes, tail_bytes) else {
        return Truncated {
            kept: text.to_owned(),
            omitted_bytes: 0,
            omitted_lines: 0,
            truncated: false,
        };
    };
    let head = text.get(..head_end).unwrap_or_default();
    let omitted = text.get(head_end..tail_start).unwrap_or_default();
    let tail = text.get(tail_start..).unwrap_or_default();
    let newlines = omitted.bytes().filter(|&b| b == b'\n').count();
    let omitted_lines = newlines + usize::from(!omitted.is_empty() && !omitted.ends_with('\n'));
    let marker = omission_marker(omitted.len(), omitted_lines, pointer);
    let mut kept = String::with_capacity(head.len() + marker.len() + tail.len() + 2);
    kept.push_str(head);
    if !head.is_empty() && !head.ends_with('\n') {
        kept.push('\n');
    }
    kept.push_str(&marker);
    kept.push('\n');
    kept.push_str(tail);
    Truncated {
        kept,
        omitted_bytes: omitted.len(),
        omitted_lines,
        truncated: true,
    }
}

/// Where [`head_tail`] cuts: the end of the head and the start of the tail (both char
/// boundaries, `head_end <= head_bytes`, `len - tail_start <= tail_bytes`), or `None` when the
/// text fits.
fn cut_points(text: &str, head_bytes: usize, tail_bytes: usize) -> Option<(usize, usize)> {
    let len = text.len();
    if len <= head_bytes.saturating_add(tail_bytes) {
        return None;
    }
    // Here head_bytes < len and tail_bytes < len.
    let head_limit = floor_boundary(text, head_bytes);
    let head_end = match text.get(..head_limit).and_then(|h| h.rfind('\n')) {
        Some(nl) if nl + 1 >= head_bytes / 2 => nl + 1,
        _ => head_limit,
    };
    let tail_limit = ceil_boundary(text, len - tail_bytes);
    let at_line_start = text.as_bytes().get(tail_limit.wrapping_sub(1)) == Some(&b'\n');
    let tail_start = match text.get(tail_limit..).and_then(|t| t.find('\n')) {
        _ if at_line_start => tail_limit,
        Some(nl) if tail_limit + nl + 1 < len && len - (tail_limit + nl + 1) >= tail_bytes / 2 => {
            tail_limit + nl + 1
        }
        _ => tail_limit,
    };
    Some((head_end, tail_start))
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Printable ASCII plus tab and line feed: nothing to normalize, nothing to remove.
#[inline]
fn is_plain_byte(b: u8) -> bool {
    (0x20..0x7f).contains(&b) || b == b'\n' || b == b'\t'
}

fn is_plain(s: &str) -> bool {
    s.bytes().all(is_plain_byte)
}

/// NFKC of `s`, or `None` when `s` is already NFKC.
///
/// Only the non-ASCII runs are looked at, each together with the ASCII character before it
/// (a combining mark may compose with it). Splitting before an ASCII character is safe: ASCII
/// characters never decompose, never reorder and are never the second half of a composition,
/// so NFKC of the whole is the concatenation of NFKC of the pieces (the tests check this
/// against whole-string NFKC).
fn nfkc_changed(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let Some(offset) = bytes
            .get(i..)
            .and_then(|rest| rest.iter().position(|b| !b.is_ascii()))
        else {
            break;
        };
        let run_start = i + offset;
        let run_end = bytes
            .get(run_start..)
            .and_then(|rest| rest.iter().position(u8::is_ascii))
            .map_or(bytes.len(), |o| run_start + o);
        let seg_start = run_start.saturating_sub(1).max(copied);
        i = run_end;
        let Some(segment) = s.get(seg_start..run_end) else {
            continue;
        };
        if is_nfkc_quick(segment.chars()) == IsNormalized::Yes {
            continue;
        }
        let normalized: String = segment.nfkc().collect();
        if normalized == segment {
            continue;
        }
        let buf = out.get_or_insert_with(|| String::with_capacity(s.len()));
        buf.push_str(s.get(copied..seg_start).unwrap_or_default());
        buf.push_str(&normalized);
        copied = run_end;
    }
    let mut buf = out?;
    buf.push_str(s.get(copied..).unwrap_or_default());
    Some(buf)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Keep,
    Invisible,
    Control,
    LineBreak,
}

fn classify(c: char) -> Class {
    match c {
        '\t' | '\n' | ' '..='~' => Class::Keep,
        '\u{85}' | '\u{2028}' | '\u{2029}' => Class::LineBreak,
        '\0'..='\u{1f}' | '\u{7f}'..='\u{9f}' => Class::Control,
        '\u{fe00}'..='\u{fe0f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}'
        | '\u{e0000}'..='\u{e007f}'
        | '\u{e0100}'..='\u{e01ef}'
        | '\u{e000}'..='\u{f8ff}'
        | '\u{f0000}'..='\u{10ffff}'
        | '\u{115f}'
        | '\u{1160}'
        | '\u{3164}'
        | '\u{ffa0}' => Class::Invisible,
        _ if bmp_kept(c) => Class::Keep,
        _ => classify_by_category(c),
    }
}

fn classify_by_category(c: char) -> Class {
    match c.general_category() {
        GeneralCategory::Format
        | GeneralCategory::PrivateUse
        | GeneralCategory::Unassigned
        | GeneralCategory::Surrogate => Class::Invisible,
        GeneralCategory::Control => Class::Control,
        _ => Class::Keep,
    }
}

const BLOCK_BITS: u32 = 6;
const BLOCKS: usize = 0x10000 >> BLOCK_BITS;

/// Per 64-character block of the BMP, one bit per character: whether [`classify`] keeps it.
/// Filled lazily the first time a block is seen ([`BMP_BLOCK_READY`]), so text in one script
/// pays the table lookups once per block instead of once per character.
static BMP_KEPT: [AtomicU64; BLOCKS] = [const { AtomicU64::new(0) }; BLOCKS];
static BMP_BLOCK_READY: [AtomicBool; BLOCKS] = [const { AtomicBool::new(false) }; BLOCKS];

fn bmp_kept(c: char) -> bool {
    let cp = u32::from(c);
    let Ok(block) = usize::try_from(cp >> BLOCK_BITS) else {
        return false;
    };
    let (Some(ready), Some(kept)) = (BMP_BLOCK_READY.get(block), BMP_KEPT.get(block)) else {
        return false;
    };
    let bit = 1u64 << (cp & ((1 << BLOCK_BITS) - 1));
    if ready.load(Ordering::Acquire) {
        return kept.load(Ordering::Relaxed) & bit != 0;
    }
    let first = cp & !((1 << BLOCK_BITS) - 1);
    let mut mask = 0u64;
    for offset in 0..(1u32 << BLOCK_BITS) {
        if char::from_u32(first + offset).is_some_and(classify_explicit_free) {
            mask |= 1 << offset;
        }
    }
    kept.store(mask, Ordering::Relaxed);
    ready.store(true, Ordering::Release);
    mask & bit != 0
}

/// A non-ASCII character that no explicit rule of [`classify`] names and that the category
/// test keeps.
fn classify_explicit_free(c: char) -> bool {
    u32::from(c) >= 0xa0
        && !matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{e000}'..='\u{f8ff}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{3164}'
                | '\u{ffa0}'
        )
        && classify_by_category(c) == Class::Keep
}

/// Removes and rewrites characters as described in the module documentation; `None` when
/// nothing changes. Counts go into `report`.
fn filter_changed(s: &str, report: &mut SanitizeReport) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out: Option<String> = None;
    // `s[copied..i]` is kept but not yet copied to `out`.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let Some(&b) = bytes.get(i) else { break };
        if is_plain_byte(b) {
            i += 1;
            continue;
        }
        let Some(c) = s.get(i..).and_then(|rest| rest.chars().next()) else {
            break;
        };
        let width = c.len_utf8();
        // (end of the removed or rewritten span, replacement)
        let edit: Option<(usize, Option<char>)> = match classify(c) {
            Class::Keep => None,
            Class::LineBreak => {
                report.line_breaks_normalized += 1;
                Some((i + width, Some('\n')))
            }
            Class::Invisible => {
                report.removed_invisible += 1;
                Some((i + width, None))
            }
            Class::Control if c == '\r' => {
                report.line_breaks_normalized += 1;
                if bytes.get(i + 1) == Some(&b'\n') {
                    Some((i + 1, None))
                } else {
                    Some((i + 1, Some('\n')))
                }
            }
            Class::Control if c == '\u{1b}' => {
                let end = escape_sequence_end(bytes, i);
                let removed = s.get(i..end).map_or(1, |seq| seq.chars().count());
                report.removed_controls += removed;
                Some((end, None))
            }
            Class::Control => {
                report.removed_controls += 1;
                Some((i + width, None))
            }
        };
        match edit {
            None => i += width,
            Some((end, replacement)) => {
                let buf = out.get_or_insert_with(|| String::with_capacity(s.len()));
                buf.push_str(s.get(copied..i).unwrap_or_default());
                if let Some(r) = replacement {
                    buf.push(r);
                }
                copied = end;
                i = end;
            }
        }
    }
    let mut buf = out?;
    buf.push_str(s.get(copied..).unwrap_or_default());
    Some(buf)
}

/// End (exclusive, a char boundary) of the terminal escape sequence starting with the `ESC` at
/// `start`. A sequence that is not recognised ends right after the `ESC`.
fn escape_sequence_end(bytes: &[u8], start: usize) -> usize {
    let after_esc = start + 1;
    let Some(&kind) = bytes.get(after_esc) else {
        return after_esc;
    };
    match kind {
        // CSI: parameters, intermediates, one final byte; at most MAX_CSI_LEN bytes, or only
        // the ESC goes (a stray `ESC [` must not eat a long run of digits).
        b'[' => {
            let mut j = after_esc + 1;
            while bytes.get(j).is_some_and(|b| (0x30..=0x3f).contains(b)) {
                j += 1;
            }
            while bytes.get(j).is_some_and(|b| (0x20..=0x2f).contains(b)) {
                j += 1;
            }
            if bytes.get(j).is_some_and(|b| (0x40..=0x7e).contains(b)) {
                j += 1;
            }
            if j - start > MAX_CSI_LEN {
                return after_esc;
            }
            j
        }
        // OSC, DCS, SOS, PM, APC: a string ended by BEL or ST (`ESC \`) within
        // MAX_ESCAPE_STRING bytes, with no other control character in it; otherwise only the
        // ESC goes.
        b']' | b'P' | b'X' | b'^' | b'_' => {
            let limit = bytes.len().min(after_esc + 1 + MAX_ESCAPE_STRING);
            let mut j = after_esc + 1;
            while j < limit {
                match bytes.get(j) {
                    Some(0x07) => return j + 1,
                    Some(0x1b) if bytes.get(j + 1) == Some(&b'\\') => return j + 2,
                    // Any other control character (a newline, another ESC) ends the attempt,
                    // so no byte is scanned by two attempts and the pass stays linear.
                    Some(b) if *b < 0x20 => break,
                    None => break,
                    Some(_) => j += 1,
                }
            }
            after_esc
        }
        // nF sequences (ESC, intermediates, final) and Fp/Fe/Fs two-character sequences.
        0x20..=0x2f => {
            let mut j = after_esc;
            while bytes.get(j).is_some_and(|b| (0x20..=0x2f).contains(b)) {
                j += 1;
            }
            if bytes.get(j).is_some_and(|b| (0x30..=0x7e).contains(b)) {
                j += 1;
            }
            j
        }
        0x30..=0x7e => after_esc + 1,
        _ => after_esc,
    }
}

#[cfg(test)]
#[path = "sanitize_tests.rs"]
mod tests;
