//! The argument gate for tool calls: strict parsing, the repair ladder for arguments that were
//! fully written but mangled on the way, removal of tool-call look-alikes from assistant text,
//! and the pieces of the truncation gate.
//!
//! The line this module draws: damage *inside* the protocol (a streamed argument buffer with a
//! stray control character, a trailing comma, a missing closing bracket) may be repaired; a
//! "call" *outside* the protocol (XML or markdown pseudo-calls in assistant text) is never
//! parsed into a call: it is removed and the removal is made visible. And when a turn was cut
//! off by the output limit, arguments that do not parse strictly are half-written, not
//! fumbled: the dispatcher must not repair them ([`is_truncation_stop`],
//! [`truncated_call_notice`]), because finishing the model's half-written command on its behalf
//! (`{"command": "rm -rf /tmp/leg` → `rm -rf /tmp/leg`) is a security problem.
//!
//! Everything here is pure, bounded and panic-free: repair refuses input over
//! [`MAX_REPAIR_INPUT`] bytes, every rung is a single linear pass plus a bounded number of
//! strict parses, and serde_json's recursion limit bounds the parser's nesting.

use std::borrow::Cow;

use serde_json::Value;

/// Largest argument buffer [`repair`] works on (1 MiB); larger input is refused with
/// [`RepairError::TooLarge`].
pub const MAX_REPAIR_INPUT: usize = 1024 * 1024;

/// Repair step: empty or all-whitespace arguments were read as `{}`.
pub const STEP_EMPTY_AS_OBJECT: &str = "empty_as_object";
/// Repair step (rung 2): control characters outside strings removed, raw control characters
/// inside strings escaped.
pub const STEP_CONTROL_CHARS: &str = "strip_control_chars";
/// Repair step (rung 3): commas directly before `}` or `]` removed.
pub const STEP_TRAILING_COMMAS: &str = "drop_trailing_commas";
/// Repair step (rung 4): an unclosed string and unclosed brackets closed in the right order.
pub const STEP_CLOSE_UNCLOSED: &str = "close_unclosed";
/// Repair step (part of rung 4): an incomplete last member (`"key":` without a value, a cut-off
/// key, a cut-off literal) dropped before closing.
pub const STEP_DROP_INCOMPLETE_MEMBER: &str = "drop_incomplete_member";

/// How many times rung 4 drops an incomplete last member (innermost container first) before
/// giving up.
const MAX_MEMBER_DROPS: usize = 4;

/// Most passes [`strip_tool_call_lookalikes`] makes over the text.
pub const MAX_STRIP_PASSES: usize = 8;

/// The notice put in place of each tool-call look-alike removed from assistant text.
pub const LOOKALIKE_NOTICE: &str = "[keel: removed a tool-call look-alike from assistant text; tool calls must use the API's tool-call format]";

/// Arguments that [`repair`] turned into a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct Repaired {
    /// The arguments; always a JSON object.
    pub value: Value,
    /// The repair steps applied, in order (the `STEP_*` constants); empty when the input
    /// parsed as is.
    pub steps: Vec<&'static str>,
}

/// Why [`repair`] gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairError {
    /// The input is larger than [`MAX_REPAIR_INPUT`]; it was not looked at.
    #[error("tool-call arguments are {len} bytes, over the {max}-byte repair limit")]
    TooLarge {
        /// Length of the input in bytes.
        len: usize,
        /// The limit, [`MAX_REPAIR_INPUT`].
        max: usize,
    },
    /// The input (after repair) is valid JSON but not an object.
    #[error("tool-call arguments must be a JSON object, got {found}")]
    NotAnObject {
        /// What it is instead: `"an array"`, `"a string"`, `"a number"`, `"a boolean"` or
        /// `"null"`.
        found: &'static str,
    },
    /// No rung of the ladder produced valid JSON.
    #[error("tool-call arguments are not valid JSON and could not be repaired: {message}")]
    Unrepairable {
        /// The strict parser's complaint about the input as received.
        message: String,
    },
}

/// Parses tool-call arguments strictly: valid JSON (serde_json, no extensions) whose top level
/// is an object. The error is a one-line message fit for the model.
///
/// This is the only parse allowed for a call from a turn that hit the output limit.
pub fn parse_strict(raw: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!(
            "tool-call arguments must be a JSON object, got {}",
            kind_name(&other)
        )),
        Err(e) => Err(format!("tool-call arguments are not valid JSON: {e}")),
    }
}

/// Repairs tool-call arguments from a turn that was *not* cut off by the output limit.
///
/// The ladder, each rung applied on top of the previous one and stopping at the first that
/// parses strictly:
///
/// 1. the input as is (empty or all-whitespace input is read as `{}`);
/// 2. control characters outside strings removed (as are a BOM and zero-width characters
///    there), raw control characters inside strings escaped;
/// 3. commas directly before `}` or `]` (ignoring whitespace) removed;
/// 4. an unclosed string closed (a dangling `\` or incomplete `\u` escape dropped), a trailing
///    comma dropped and unclosed brackets closed innermost first; a closing bracket that skips
///    an open one gets the missing closers inserted before it. If that still does not parse, the
///    incomplete last member of the innermost container (`"key":`, a cut-off key or literal)
///    is dropped and closing is retried, up to four times, moving outwards.
///
/// A rung that does not change the text is skipped. Repair never invents a value: it closes
/// and drops, nothing else. Valid JSON that is not an object is [`RepairError::NotAnObject`].
/// Never panics; input over [`MAX_REPAIR_INPUT`] bytes is refused.
pub fn repair(raw: &str) -> Result<Repaired, RepairError> {
    if raw.len() > MAX_REPAIR_INPUT {
        return Err(RepairError::TooLarge {
            len: raw.len(),
            max: MAX_REPAIR_INPUT,
        });
    }
    let first_error = match serde_json::from_str::<Value>(raw) {
        Ok(v) => return object(v, Vec::new()),
        Err(e) => e.to_string(),
    };
    if raw.trim_matches(is_json_whitespace).is_empty() {
        return Ok(Repaired {
            value: Value::Object(serde_json::Map::new()),
            steps: vec![STEP_EMPTY_AS_OBJECT],
        });
    }
    let mut steps = Vec::new();
    let mut text: Cow<'_, str> = Cow::Borrowed(raw);

    if let Some(fixed) = fix_control_chars(&text) {
        steps.push(STEP_CONTROL_CHARS);
        text = Cow::Owned(fixed);
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            return object(v, steps);
        }
    }
    if let Some(fixed) = drop_trailing_commas(&text) {
        steps.push(STEP_TRAILING_COMMAS);
        text = Cow::Owned(fixed);
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            return object(v, steps);
        }
    }
    if let Some((v, drops)) = close_unclosed(&text) {
        steps.push(STEP_CLOSE_UNCLOSED);
        if drops > 0 {
            steps.push(STEP_DROP_INCOMPLETE_MEMBER);
        }
        return object(v, steps);
    }
    Err(RepairError::Unrepairable {
        message: first_error,
    })
}

fn object(v: Value, steps: Vec<&'static str>) -> Result<Repaired, RepairError> {
    match v {
        Value::Object(_) => Ok(Repaired { value: v, steps }),
        other => Err(RepairError::NotAnObject {
            found: kind_name(&other),
        }),
    }
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn is_json_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Junk that never belongs between JSON tokens.
fn is_junk_outside_strings(c: char) -> bool {
    (c.is_control() && !is_json_whitespace(c))
        || matches!(c, '\u{feff}' | '\u{200b}'..='\u{200d}' | '\u{2060}')
}

/// Rung 2. `None` when nothing changes.
fn fix_control_chars(s: &str) -> Option<String> {
    let needs = s
        .chars()
        .any(|c| is_junk_outside_strings(c) || u32::from(c) < 0x20);
    if !needs {
        return None;
    }
    let mut out = String::with_capacity(s.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    for c in s.chars() {
        if !in_string {
            if c == '"' {
                in_string = true;
                out.push(c);
            } else if !is_junk_outside_strings(c) {
                out.push(c);
            }
            continue;
        }
        if escaped {
            escaped = false;
            if u32::from(c) < 0x20 {
                // A backslash before a raw control character: drop the backslash, escape the
                // character.
                out.pop();
                push_escaped_control(&mut out, c);
            } else {
                out.push(c);
            }
        } else if c == '\\' {
            escaped = true;
            out.push(c);
        } else if c == '"' {
            in_string = false;
            out.push(c);
        } else if u32::from(c) < 0x20 {
            push_escaped_control(&mut out, c);
        } else {
            out.push(c);
        }
    }
    (out != s).then_some(out)
}

fn push_escaped_control(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c => out.push_str(&format!("\\u{:04x}", u32::from(c))),
    }
}

/// Rung 3: removes every run of commas that is followed (after whitespace) by `}` or `]`.
/// `None` when nothing changes.
fn drop_trailing_commas(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut in_string = false;
    let mut escaped = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' => {
                let mut j = i;
                while bytes
                    .get(j)
                    .is_some_and(|&b| b == b',' || b.is_ascii_whitespace())
                {
                    j += 1;
                }
                if matches!(bytes.get(j), Some(b'}' | b']')) {
                    // Drop the commas, keep the whitespace.
                    let buf = out.get_or_insert_with(|| String::with_capacity(s.len()));
                    buf.push_str(s.get(copied..i).unwrap_or_default());
                    for &w in bytes.get(i..j).unwrap_or_default() {
                        if w != b',' {
                            buf.push(char::from(w));
                        }
                    }
                    copied = j;
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    let mut buf = out?;
    buf.push_str(s.get(copied..).unwrap_or_default());
    Some(buf)
}

/// One open container while closing.
struct Open {
    /// `}` or `]`.
    closer: char,
    /// Byte offset in the rewritten text where the container's last member starts (just
    /// after the `{`, `[` or `,`).
    member_start: usize,
}

/// Rung 4: closes what is open, dropping incomplete trailing members if closing alone does not
/// parse. Returns the value and how many members were dropped.
fn close_unclosed(s: &str) -> Option<(Value, usize)> {
    let mut out = String::with_capacity(s.len() + 16);
    let mut stack: Vec<Open> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    // Byte offset in `out` of a `\u` escape still missing hex digits, and how many it has.
    let mut unicode_escape: Option<(usize, u8)> = None;
    // Whether a closer was inserted before a closing bracket that skipped an open one.
    let mut inserted = false;
    for c in s.chars() {
        if in_string {
            if let Some((start, digits)) = unicode_escape {
                unicode_escape =
                    (c.is_ascii_hexdigit() && digits < 3).then_some((start, digits + 1));
            }
            if escaped {
                escaped = false;
                if c == 'u' {
                    unicode_escape = Some((out.len().saturating_sub(1), 0));
                }
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            out.push(c);
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                stack.push(Open {
                    closer: if c == '{' { '}' } else { ']' },
                    member_start: out.len(),
                });
            }
            ',' => {
                out.push(c);
                if let Some(top) = stack.last_mut() {
                    top.member_start = out.len();
                }
            }
            '}' | ']' => {
                if let Some(depth) = stack.iter().rposition(|o| o.closer == c) {
                    // Close whatever was left open inside the container this closes.
                    while stack.len() > depth + 1 {
                        if let Some(open) = stack.pop() {
                            trim_trailing_comma(&mut out);
                            out.push(open.closer);
                            inserted = true;
                        }
                    }
                    stack.pop();
                }
                out.push(c);
            }
            c => out.push(c),
        }
    }
    if stack.is_empty() && !in_string {
        // Nothing left open: only the inserted closers can have helped.
        return if inserted {
            serde_json::from_str(&out).ok().map(|v| (v, 0))
        } else {
            None
        };
    }

    // Attempt 0: close the string and every bracket.
    let mut base = out.clone();
    if in_string {
        if let Some((start, _)) = unicode_escape {
            base.truncate(start);
        } else if escaped {
            base.pop();
        }
        base.push('"');
    }
    if let Some(v) = parse_closed(&base, &stack) {
        return Some((v, 0));
    }
    // Attempts 1..: drop the last member of the innermost open container, then of the next
    // one out (the container itself becomes the incomplete member of its parent).
    let mut drops = 0;
    while drops < MAX_MEMBER_DROPS {
        let open = stack.pop()?;
        drops += 1;
        let mut attempt = out.get(..open.member_start).unwrap_or_default().to_owned();
        trim_trailing_comma(&mut attempt);
        stack.push(open);
        if let Some(v) = parse_closed(&attempt, &stack) {
            return Some((v, drops));
        }
        // Give up on the innermost container: from here on its parent's last member (the
        // container itself) is the one to drop.
        stack.pop();
        if stack.is_empty() {
            return None;
        }
    }
    None
}

fn parse_closed(text: &str, stack: &[Open]) -> Option<Value> {
    let mut candidate = text.to_owned();
    trim_trailing_comma(&mut candidate);
    for open in stack.iter().rev() {
        candidate.push(open.closer);
    }
    serde_json::from_str(&candidate).ok()
}

/// Removes trailing whitespace and then one trailing comma (and the whitespace before it).
fn trim_trailing_comma(s: &mut String) {
    let trimmed = s.trim_end_matches(is_json_whitespace).len();
    s.truncate(trimmed);
    if s.ends_with(',') {
        s.pop();
        let trimmed = s.trim_end_matches(is_json_whitespace).len();
        s.truncate(trimmed);
    }
}

/// XML-ish tag names whose blocks are tool-call look-alikes (an `ns:` prefix is allowed).
const LOOKALIKE_TAGS: &[&str] = &["function_calls", "invoke", "tool_call"];

/// Bracket markers whose blocks are tool-call look-alikes.
const LOOKALIKE_BRACKETS: &[(&str, &str)] = &[
    ("[tool_call]", "[/tool_call]"),
    ("[tool_calls]", "[/tool_calls]"),
];

/// Fence info strings whose blocks are removed whatever they contain.
const CALL_FENCE_INFOS: &[&str] = &["tool_call", "tool_calls", "tool_code", "function_call"];

/// Fence info strings whose blocks are removed when their content is call-shaped JSON.
const JSON_FENCE_INFOS: &[&str] = &["", "json", "jsonc", "json5"];

/// Removes tool-call look-alikes from assistant text, putting [`LOOKALIKE_NOTICE`] in place of
/// each, and returns the cleaned text and the removed blocks (in order, verbatim).
///
/// Removed:
///
/// - `<invoke …>…</invoke>`, `<function_calls>…</function_calls>` and
///   `<tool_call>…</tool_call>`, ASCII case-insensitive, with an optional `ns:` prefix on the
///   tag name; an unclosed block runs to the end of the text, a self-closing tag is removed
///   alone;
/// - `[TOOL_CALL]…[/TOOL_CALL]` (and `[TOOL_CALLS]`), case-insensitive, unclosed to the end;
/// - fenced blocks (backticks or tildes, indented at most three spaces) whose info string is
///   `tool_call`, `tool_calls`, `tool_code` or `function_call`, whatever they contain, and
///   fenced blocks with no info string or `json` whose content is call-shaped: an object with a
///   string `name` or `tool` and an `arguments`, `parameters` or `input` key, an object
///   `{"function": <call>}` or `{"tool_calls": [<call>…]}`, or a non-empty array of calls
///   (content that is not strict JSON is read with [`repair`]). An unclosed fence runs to the
///   end of the text.
///
/// Look-alikes are removed wherever they are, inside ordinary code blocks and inline code
/// included: the cost is that prose quoting one of these tags loses the quoted block (to the
/// end of the text if it is not closed), and the notice shows that it happened.
///
/// A removal can change what surrounds it (an unclosed tag inside a code fence takes the
/// closing fence with it, and the fence's remaining content may then read as a call), so the
/// pass repeats until it removes nothing, at most [`MAX_STRIP_PASSES`] times. Each pass is
/// linear in the length of the text; never panics.
pub fn strip_tool_call_lookalikes(text: &str) -> (String, Vec<String>) {
    let mut current = Cow::Borrowed(text);
    let mut removed = Vec::new();
    for _ in 0..MAX_STRIP_PASSES {
        let (out, found) = strip_pass(&current);
        if found.is_empty() {
            break;
        }
        removed.extend(found);
        current = Cow::Owned(out);
    }
    (current.into_owned(), removed)
}

fn strip_pass(text: &str) -> (String, Vec<String>) {
    let lower = text.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut removed = Vec::new();
    let mut copied = 0;
    let mut i = 0;
    // Lines before this offset are inside a fenced block already looked at: not fence openers.
    let mut fence_scan_from = 0;
    while let Some(&b) = bytes.get(i) {
        let at_line_start = i == 0 || bytes.get(i - 1) == Some(&b'\n');
        let found = if at_line_start && i >= fence_scan_from {
            match fence_block(text, &lower, i) {
                FenceCheck::Remove(end) => Some(end),
                FenceCheck::Keep(block_end) => {
                    fence_scan_from = block_end;
                    None
                }
                FenceCheck::NotAFence => None,
            }
        } else {
            None
        };
        let found = found.or_else(|| match b {
            b'<' => tag_block(&lower, i),
            b'[' => bracket_block(&lower, i),
            _ => None,
        });
        match found {
            Some(end) if end > i => {
                out.push_str(text.get(copied..i).unwrap_or_default());
                out.push_str(LOOKALIKE_NOTICE);
                removed.push(text.get(i..end).unwrap_or_default().to_owned());
                copied = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    (out, removed)
}

/// End of the look-alike tag block opening at `start` (a `<`), if there is one there.
fn tag_block(lower: &str, start: usize) -> Option<usize> {
    let bytes = lower.as_bytes();
    let (name, after_name) = tag_name_at(bytes, start + 1)?;
    if !LOOKALIKE_TAGS.contains(&name) {
        return None;
    }
    match bytes.get(after_name) {
        Some(b'>' | b'/') | None => {}
        Some(b) if b.is_ascii_whitespace() => {}
        Some(_) => return None,
    }
    // End of the opening tag.
    let Some(gt) = bytes
        .get(after_name..)
        .and_then(|rest| rest.iter().position(|&b| b == b'>'))
        .map(|o| after_name + o)
    else {
        return Some(lower.len());
    };
    if gt > 0 && bytes.get(gt - 1) == Some(&b'/') {
        return Some(gt + 1);
    }
    // The first matching closing tag.
    let mut from = gt + 1;
    while let Some(offset) = lower.get(from..).and_then(|rest| rest.find("</")) {
        let close = from + offset;
        if let Some((close_name, after)) = tag_name_at(bytes, close + 2)
            && close_name == name
        {
            let mut j = after;
            while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
            if bytes.get(j) == Some(&b'>') {
                return Some(j + 1);
            }
        }
        from = close + 2;
    }
    Some(lower.len())
}

/// The (lowercase) tag name at `at`, skipping an `ns:` prefix, and the offset after it.
fn tag_name_at(bytes: &[u8], at: usize) -> Option<(&'static str, usize)> {
    let is_name = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-';
    let mut end = at;
    while bytes.get(end).is_some_and(is_name) {
        end += 1;
    }
    let mut start = at;
    if bytes.get(end) == Some(&b':') {
        start = end + 1;
        end = start;
        while bytes.get(end).is_some_and(is_name) {
            end += 1;
        }
    }
    let word = bytes.get(start..end)?;
    LOOKALIKE_TAGS
        .iter()
        .find(|t| t.as_bytes() == word)
        .map(|t| (*t, end))
}

/// End of the `[TOOL_CALL]` block opening at `start`, if there is one there.
fn bracket_block(lower: &str, start: usize) -> Option<usize> {
    let rest = lower.get(start..)?;
    let (open, close) = LOOKALIKE_BRACKETS
        .iter()
        .find(|(open, _)| rest.starts_with(open))?;
    let body_start = start + open.len();
    Some(
        lower
            .get(body_start..)
            .and_then(|body| body.find(close))
            .map_or(lower.len(), |o| body_start + o + close.len()),
    )
}

enum FenceCheck {
    /// A look-alike fence: remove up to this offset (the end of the closing fence line, before
    /// its newline).
    Remove(usize),
    /// An ordinary fence that ends at this offset.
    Keep(usize),
    /// The line does not open a fence.
    NotAFence,
}

/// Checks whether the line starting at `start` opens a fenced block, and whether that block is
/// a pseudo tool call.
fn fence_block(text: &str, lower: &str, start: usize) -> FenceCheck {
    let bytes = lower.as_bytes();
    let mut i = start;
    while i < start + 3 && bytes.get(i) == Some(&b' ') {
        i += 1;
    }
    let Some(&fence_char) = bytes.get(i).filter(|&&b| b == b'`' || b == b'~') else {
        return FenceCheck::NotAFence;
    };
    let mut run = 0;
    while bytes.get(i + run) == Some(&fence_char) {
        run += 1;
    }
    if run < 3 {
        return FenceCheck::NotAFence;
    }
    let line_end = lower
        .get(i..)
        .and_then(|rest| rest.find('\n'))
        .map_or(lower.len(), |o| i + o);
    let info_line = lower.get(i + run..line_end).unwrap_or_default();
    if fence_char == b'`' && info_line.contains('`') {
        return FenceCheck::NotAFence;
    }
    let info = info_line.split_whitespace().next().unwrap_or_default();

    // Find the closing fence: a line of at least `run` fence characters and nothing else.
    let content_start = (line_end + 1).min(lower.len());
    let mut line_start = content_start;
    let (content_end, block_end) = loop {
        if line_start >= lower.len() {
            break (lower.len(), lower.len());
        }
        let end = lower
            .get(line_start..)
            .and_then(|rest| rest.find('\n'))
            .map_or(lower.len(), |o| line_start + o);
        let line = lower.get(line_start..end).unwrap_or_default();
        let trimmed = line.trim_start_matches(' ');
        let indent = line.len() - trimmed.len();
        let closing = trimmed.trim_end();
        if indent <= 3 && closing.len() >= run && closing.bytes().all(|b| b == fence_char) {
            break (line_start, end);
        }
        line_start = end + 1;
    };

    if CALL_FENCE_INFOS.contains(&info) {
        return FenceCheck::Remove(block_end);
    }
    if JSON_FENCE_INFOS.contains(&info) {
        let content = text.get(content_start..content_end).unwrap_or_default();
        if content_is_call(content) {
            return FenceCheck::Remove(block_end);
        }
    }
    FenceCheck::Keep(block_end)
}

fn content_is_call(content: &str) -> bool {
    let trimmed = content.trim();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return false;
    }
    let value = match serde_json::from_str::<Value>(trimmed) {
        Ok(v) => v,
        Err(_) => match repair(trimmed) {
            Ok(r) => r.value,
            Err(_) => return false,
        },
    };
    match &value {
        Value::Array(items) => !items.is_empty() && items.iter().all(is_call_shaped),
        v => is_call_shaped(v),
    }
}

fn is_call_shaped(v: &Value) -> bool {
    let Value::Object(m) = v else {
        return false;
    };
    let named = ["name", "tool"]
        .iter()
        .any(|k| m.get(*k).is_some_and(Value::is_string));
    let has_args = ["arguments", "parameters", "input"]
        .iter()
        .any(|k| m.contains_key(*k));
    if named && has_args {
        return true;
    }
    if m.get("function").is_some_and(is_call_shaped) {
        return true;
    }
    matches!(m.get("tool_calls"), Some(Value::Array(calls)) if !calls.is_empty() && calls.iter().all(is_call_shaped))
}

/// Whether a provider stop reason means the turn was cut off by the output limit: `length`
/// (OpenAI-style), `max_tokens` (Anthropic-style) or `max_output_tokens` (the Responses API's
/// incomplete reason), ASCII case-insensitive, surrounding whitespace ignored.
pub fn is_truncation_stop(reason: &str) -> bool {
    let reason = reason.trim();
    ["length", "max_tokens", "max_output_tokens"]
        .iter()
        .any(|r| reason.eq_ignore_ascii_case(r))
}

/// The tool result to send back for a call that was not executed because its turn hit the
/// output limit and its arguments did not parse strictly. `tool` and `stop_reason` come from
/// the model and the provider: anything but letters, digits and `_-.:/` in them becomes `?`,
/// and each is cut at 64 characters.
pub fn truncated_call_notice(tool: &str, stop_reason: &str, raw_len: usize) -> String {
    format!(
        "[keel: the call to tool `{}` was NOT executed. The turn stopped with stop reason `{}` \
         (the output limit) while the call's arguments ({raw_len} byte{}) were still incomplete, \
         so they were neither repaired nor run. Resend the whole call with complete arguments; \
         if it is too long to fit, shorten it or split the work into several smaller calls.]",
        label(tool),
        label(stop_reason),
        if raw_len == 1 { "" } else { "s" },
    )
}

fn label(s: &str) -> String {
    let cleaned: String = s
        .trim()
        .chars()
        .take(64)
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/') {
                c
            } else {
                '?'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "?".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
#[path = "arg_repair_tests.rs"]
mod tests;
