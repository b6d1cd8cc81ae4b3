//! `edit_file`: replace `old_string` with `new_string` in a file.
//!
//! Exact matching comes first. When it finds nothing, two tolerant levels follow, each still
//! demanding a unique hit (or an explicit `replace_all` / `occurrence`):
//! 1. per-line leading/trailing whitespace and CRLF ignored, typographic punctuation
//!    normalised (curly quotes, dashes, non-breaking spaces, ellipsis) on both sides;
//! 2. as 1, with copied line-number prefixes (`   12\t`, `12: `, `12│`) stripped from
//!    `old_string` — accepted only when every line carries one and the numbers increase, and
//!    for a single line only when the hit lands on that line number.
//!
//! Tolerance applies to matching only: the file keeps its bytes outside the replaced span, and
//! the result says which tolerance was used.

use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;
use serde_json::json;

use super::atomic::write_atomic;
use super::{ToolCapabilities, ToolError, ToolSpec, looks_binary, parse_input, resolve_path};
use crate::text::levenshtein;

/// The tool's name.
pub const NAME: &str = "edit_file";

const EXAMPLE: &str =
    r#"{"path": "src/lib.rs", "old_string": "fn old() {", "new_string": "fn new() {"}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(alias = "file_path", alias = "file")]
    path: String,
    #[serde(alias = "search", alias = "old_str")]
    old_string: String,
    #[serde(alias = "replace", alias = "new_str")]
    new_string: String,
    #[serde(default)]
    replace_all: bool,
    #[serde(default)]
    occurrence: Option<u64>,
}

/// The tool's registration.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: format!(
            "Replace text in a file: old_string must match exactly once (copy it verbatim from a prior read_file result, without the line numbers). When it matches several times, add surrounding lines, or send replace_all: true, or occurrence: N (1-based). If no exact match exists, differences in indentation and typographic punctuation are tolerated. Use this instead of sed -i in exec_shell. Example: {EXAMPLE}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Workspace-relative path of the file."},
                "old_string": {"type": "string", "description": "The text to replace, verbatim."},
                "new_string": {"type": "string", "description": "The replacement text."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
                "occurrence": {"type": "integer", "minimum": 1, "description": "Replace only the Nth occurrence (1-based)."}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        })
        .to_string(),
        capabilities: ToolCapabilities {
            reads_files: true,
            writes_files: true,
            ..ToolCapabilities::empty()
        },
        parallel_safe: false,
    }
}

/// A matched span of the original text, plus how to re-indent the replacement for it.
#[derive(Debug, Clone)]
struct Span {
    start: usize,
    end: usize,
    /// `(indent old_string used, indent the file has)` when a tolerant hit was widened to its
    /// line start and the replacement must be re-indented.
    reindent: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Exact,
    Tolerant,
    LineNumbers,
}

/// Applies the edit described by `input`.
pub fn run(root: &Path, input: &serde_json::Value) -> Result<String, ToolError> {
    let input: Input = parse_input(NAME, input, EXAMPLE)?;
    if input.old_string.is_empty() {
        return Err(ToolError::invalid(
            NAME,
            "old_string is empty. To create or overwrite a whole file use write_file; to insert text, put a neighbouring line in old_string and repeat it with the insertion in new_string",
        ));
    }
    if input.old_string == input.new_string {
        return Err(ToolError::invalid(
            NAME,
            "old_string and new_string are identical, so the edit would change nothing; send the changed text in new_string",
        ));
    }
    if input.replace_all && input.occurrence.is_some() {
        return Err(ToolError::invalid(
            NAME,
            "replace_all and occurrence exclude each other; send replace_all: true to replace every match, or occurrence: N for only the Nth",
        ));
    }
    if input.occurrence == Some(0) {
        return Err(ToolError::invalid(
            NAME,
            "occurrence is 1-based; send occurrence: 1 for the first match",
        ));
    }

    let resolved = resolve_path(root, &input.path)?;
    let rel = resolved.rel;
    let bytes = std::fs::read(&resolved.full).map_err(|e| ToolError::io("reading", &rel, e))?;
    if looks_binary(&bytes) {
        return Err(ToolError::Binary {
            tool: NAME,
            path: rel,
            size: bytes.len() as u64,
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::invalid(
            NAME,
            format!("{rel} is not valid UTF-8, so it cannot be edited as text; rewrite it with write_file or edit it with exec_shell"),
        )
    })?;

    let (level, matches, new_string) = find_matches(&text, &input.old_string, &input.new_string);
    if matches.is_empty() {
        return Err(ToolError::NoMatch(no_match_message(
            &text,
            &rel,
            &input.old_string,
        )));
    }
    let chosen = select(&text, &rel, level, &matches, &input)?;

    let mut out = String::with_capacity(text.len() + new_string.len());
    let mut cursor = 0;
    for span in &chosen {
        out.push_str(&text[cursor..span.start]);
        match &span.reindent {
            Some((from, to)) => out.push_str(&reindent(&new_string, from, to)),
            None => out.push_str(&new_string),
        }
        cursor = span.end;
    }
    out.push_str(&text[cursor..]);
    write_atomic(&resolved.full, out.as_bytes())
        .map_err(|e| ToolError::write_failed(&rel, true, &e))?;

    let lines: Vec<String> = chosen
        .iter()
        .map(|s| line_of(&text, s.start).to_string())
        .collect();
    let noun = if chosen.len() == 1 {
        "occurrence"
    } else {
        "occurrences"
    };
    let mut msg = format!(
        "edited {rel}: replaced {} {noun} (line {})",
        chosen.len(),
        lines.join(", ")
    );
    match level {
        Level::Exact => {}
        Level::Tolerant => msg.push_str(
            "; no exact match, matched after ignoring indentation and typographic punctuation (curly quotes, dashes, non-breaking spaces)",
        ),
        Level::LineNumbers => msg.push_str(
            "; no exact match, matched after stripping copied line-number prefixes from old_string (send old_string without them next time)",
        ),
    }
    Ok(msg)
}

/// All matches at the first level that has any, and the replacement text for that level.
fn find_matches(text: &str, old: &str, new: &str) -> (Level, Vec<Span>, String) {
    let exact: Vec<Span> = text
        .match_indices(old)
        .map(|(i, m)| Span {
            start: i,
            end: i + m.len(),
            reindent: None,
        })
        .collect();
    if !exact.is_empty() {
        return (Level::Exact, exact, new.to_string());
    }
    let haystack = Normalized::new(text);
    let tolerant = tolerant_matches(text, &haystack, old);
    if !tolerant.is_empty() {
        return (Level::Tolerant, tolerant, new.to_string());
    }
    if let Some((stripped, first_line, single)) = strip_line_numbers(old) {
        let mut hits = tolerant_matches(text, &haystack, &stripped);
        if single {
            // A single numbered line must land on the line its number names; prose that only
            // starts with digits ("12:30 …") lands elsewhere and is rejected.
            hits.retain(|s| line_of(text, s.start) == first_line);
        }
        if !hits.is_empty() {
            let new = strip_line_numbers(new)
                .map(|(s, _, _)| s)
                .unwrap_or_else(|| new.to_string());
            return (Level::LineNumbers, hits, new);
        }
    }
    (Level::Exact, Vec::new(), new.to_string())
}

fn tolerant_matches(text: &str, haystack: &Normalized, old: &str) -> Vec<Span> {
    let needle = Normalized::new(old);
    if needle.text.trim().is_empty() {
        return Vec::new();
    }
    let old_indent = leading_ws(first_nonblank_line(old)).to_string();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(pos) = haystack.text[from..].find(&needle.text) {
        let ns = from + pos;
        let ne = ns + needle.text.len();
        from = ne;
        let mut start = haystack.src_start[ns];
        let end = haystack.src_end[ne - 1];
        let at_line_start = ns == 0 || haystack.text.as_bytes()[ns - 1] == b'\n';
        let mut reindent = None;
        if at_line_start {
            let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
            let file_indent = &text[line_start..start];
            if file_indent.chars().all(is_hspace) && file_indent != old_indent {
                start = line_start;
                reindent = Some((old_indent.clone(), file_indent.to_string()));
            }
        }
        spans.push(Span {
            start,
            end,
            reindent,
        });
    }
    spans
}

/// Re-indents `new`: lines starting with `from` get `to` instead (the indent shift between
/// what the model wrote and what the file has).
fn reindent(new: &str, from: &str, to: &str) -> String {
    new.split_inclusive('\n')
        .map(|line| match line.strip_prefix(from) {
            Some(rest) if !rest.trim().is_empty() => format!("{to}{rest}"),
            _ => line.to_string(),
        })
        .collect()
}

fn select(
    text: &str,
    rel: &str,
    level: Level,
    matches: &[Span],
    input: &Input,
) -> Result<Vec<Span>, ToolError> {
    let count = matches.len();
    if input.replace_all {
        return Ok(matches.to_vec());
    }
    if let Some(n) = input.occurrence {
        let index = usize::try_from(n).unwrap_or(usize::MAX);
        return matches
            .get(index.saturating_sub(1))
            .cloned()
            .map(|s| vec![s])
            .ok_or_else(|| {
                ToolError::invalid(
                    NAME,
                    format!(
                        "occurrence {n} asked for, but old_string matches only {count} time{} in {rel}; send occurrence between 1 and {count}",
                        if count == 1 { "" } else { "s" }
                    ),
                )
            });
    }
    if count == 1 {
        return Ok(matches.to_vec());
    }
    let lines: Vec<String> = matches
        .iter()
        .take(10)
        .map(|s| line_of(text, s.start).to_string())
        .collect();
    let more = if count > 10 { ", …" } else { "" };
    let how = match level {
        Level::Exact => "",
        Level::Tolerant => " (after ignoring indentation and typographic punctuation)",
        Level::LineNumbers => " (after stripping line-number prefixes)",
    };
    Err(ToolError::Ambiguous(format!(
        "old_string matches {count} times in {rel}{how}, at lines {}{more}; nothing was changed. Send replace_all: true to replace all {count}, or occurrence: N (1-based, in file order) to replace only the Nth, or extend old_string with surrounding lines so it matches exactly once",
        lines.join(", ")
    )))
}

fn no_match_message(text: &str, rel: &str, old: &str) -> String {
    let mut msg = format!(
        "old_string was not found in {rel} (tried exact, whitespace- and punctuation-tolerant, and line-number-stripped matching); nothing was changed."
    );
    if let Some((line, content)) = closest_line(text, old) {
        let offset = line.saturating_sub(5).max(1);
        msg.push_str(&format!(
            " The most similar line is {line}: `{}`. Re-read that region with read_file {{\"path\": \"{rel}\", \"offset\": {offset}, \"limit\": 30}} and copy old_string verbatim from it.",
            crate::text::preview(content, 160)
        ));
    } else {
        msg.push_str(&format!(
            " Re-read the file with read_file {{\"path\": \"{rel}\"}} and copy old_string verbatim from it."
        ));
    }
    msg
}

/// The file line most similar to the first non-blank line of `old` — only when cheap to find.
fn closest_line<'a>(text: &'a str, old: &str) -> Option<(usize, &'a str)> {
    let probe = Normalized::new(first_nonblank_line(old)).text;
    let probe = probe.trim();
    if probe.is_empty() || probe.chars().count() > 200 {
        return None;
    }
    let probe_len = probe.chars().count();
    let mut best: Option<(usize, usize, &str)> = None;
    for (i, line) in text.lines().enumerate().take(5000) {
        let candidate = Normalized::new(line).text;
        let candidate = candidate.trim();
        let len = candidate.chars().count();
        if candidate.is_empty() || len > 400 || len.abs_diff(probe_len) > probe_len / 2 + 2 {
            continue;
        }
        let distance = levenshtein(probe, candidate);
        if best.is_none_or(|(d, _, _)| distance < d) {
            best = Some((distance, i + 1, line));
        }
    }
    best.filter(|&(d, _, _)| d <= probe_len / 2 + 1)
        .map(|(_, n, line)| (n, line))
}

/// `text` with per-line leading/trailing whitespace and CRs removed and typographic
/// punctuation normalised, plus each normalised byte's source span in `text`.
struct Normalized {
    text: String,
    src_start: Vec<usize>,
    src_end: Vec<usize>,
}

impl Normalized {
    fn new(source: &str) -> Normalized {
        let mut n = Normalized {
            text: String::with_capacity(source.len()),
            src_start: Vec::with_capacity(source.len()),
            src_end: Vec::with_capacity(source.len()),
        };
        let mut line_start = true;
        for (i, c) in source.char_indices() {
            let end = i + c.len_utf8();
            if c == '\r' && source[end..].starts_with('\n') {
                continue;
            }
            if c == '\n' {
                n.trim_trailing();
                n.push("\n", i, end);
                line_start = true;
                continue;
            }
            if line_start && is_hspace(c) {
                continue;
            }
            line_start = false;
            let mut buf = [0u8; 4];
            let mapped: &str = match c {
                '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' => "'",
                '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' => "\"",
                '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2212}' => "-",
                '\u{2014}' | '\u{2015}' => "--",
                '\u{2026}' => "...",
                c if is_hspace(c) => " ",
                c => c.encode_utf8(&mut buf),
            };
            n.push(mapped, i, end);
        }
        n.trim_trailing();
        n
    }

    fn push(&mut self, s: &str, start: usize, end: usize) {
        self.text.push_str(s);
        for _ in 0..s.len() {
            self.src_start.push(start);
            self.src_end.push(end);
        }
    }

    fn trim_trailing(&mut self) {
        while self.text.ends_with([' ', '\t']) {
            self.text.pop();
            self.src_start.pop();
            self.src_end.pop();
        }
    }
}

fn is_hspace(c: char) -> bool {
    matches!(
        c,
        ' ' | '\t' | '\u{A0}' | '\u{2007}' | '\u{2009}' | '\u{200A}' | '\u{202F}' | '\u{3000}'
    )
}

fn leading_ws(line: &str) -> &str {
    let end = line
        .char_indices()
        .find(|&(_, c)| !is_hspace(c))
        .map_or(line.len(), |(i, _)| i);
    &line[..end]
}

fn first_nonblank_line(text: &str) -> &str {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// 1-based line number of byte `pos`.
fn line_of(text: &str, pos: usize) -> usize {
    text.as_bytes()[..pos]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn line_number_prefix() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^[ \t]*([0-9]+)(?:\t|[ \t]*│ ?|:[ \t]?|[ \t]*\|[ \t]?)").expect("valid regex")
    })
}

/// `text` with a line-number prefix stripped from every line, the first line's number and
/// whether it was a single line — or `None` unless every non-blank line carries a prefix
/// and the numbers strictly increase.
fn strip_line_numbers(text: &str) -> Option<(String, usize, bool)> {
    let re = line_number_prefix();
    let mut out = String::with_capacity(text.len());
    let mut last: Option<usize> = None;
    let mut first = None;
    let mut count = 0;
    for line in text.split_inclusive('\n') {
        let Some(m) = re.captures(line) else {
            if line.trim().is_empty() {
                out.push_str(line);
                continue;
            }
            return None;
        };
        let n: usize = m[1].parse().ok()?;
        if last.is_some_and(|l| n <= l) {
            return None;
        }
        last = Some(n);
        first.get_or_insert(n);
        count += 1;
        out.push_str(&line[m[0].len()..]);
    }
    Some((out, first?, count == 1))
}

#[cfg(test)]
#[path = "edit_file_tests.rs"]
mod tests;
