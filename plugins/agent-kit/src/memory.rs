//! keel's memory as text: an index file (`MEMORY.md`) of pointer lines, one per topic file
//! (`TOPIC.md`, one entry a line). Pure functions over the files' contents, shared by the
//! `memory` plugin (remember, recall) and `keel memory consolidate` (tidy, and the check a
//! model's proposed index must pass); the callers do the reading and writing.
//!
//! ```text
//! # Memory
//! - [testing](testing.md) — run the tests with `make check`; cargo test alone misses …
//! ```
//!
//! Everything here is untrusted text (a model or a cloned repository wrote it): it is bounded
//! here and fenced as data by whoever shows it to a model.

use std::collections::{BTreeMap, BTreeSet};

/// The index file in a memory folder.
pub const INDEX: &str = "MEMORY.md";
/// The index's budget in lines: what a prompt shows of it, what a tidy keeps it within.
pub const INDEX_MAX_LINES: usize = 200;
/// The index's budget in bytes.
pub const INDEX_MAX_BYTES: usize = 25 * 1024;
/// One entry at most, in characters.
pub const ENTRY_MAX_CHARS: usize = 500;
/// Entries one recall returns at most.
pub const RECALL_MAX: usize = keel_protocol::RECALL_MAX;
/// Bytes one recall returns at most.
pub const RECALL_MAX_BYTES: usize = 4096;
/// Topic files one recall reads at most.
pub const RECALL_MAX_TOPICS: usize = 3;
/// A topic file's bytes a recall reads at most.
pub const TOPIC_READ_MAX_BYTES: usize = 64 * 1024;
/// A pointer's summary at most, in characters (the tidy shortens to this under pressure).
const SUMMARY_MAX_CHARS: usize = 120;
const SUMMARY_TIGHT_CHARS: usize = 60;
/// Where a tidy moves index lines that are not pointers when the index is over its budget.
pub const OVERFLOW_TOPIC: &str = "notes";

/// A pointer line of the index: `- [TITLE](FILE) — SUMMARY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// What the topic is called.
    pub title: String,
    /// The topic file, `NAME.md` in the same folder.
    pub file: String,
    /// A line about what it holds.
    pub summary: String,
}

impl Pointer {
    /// The line as the index holds it.
    pub fn line(&self) -> String {
        if self.summary.is_empty() {
            format!("- [{}]({})", self.title, self.file)
        } else {
            format!("- [{}]({}) — {}", self.title, self.file, self.summary)
        }
    }
}

/// The pointer `line` is, if it is one.
pub fn parse_pointer(line: &str) -> Option<Pointer> {
    let rest = line.trim().strip_prefix("- [")?;
    let (title, rest) = rest.split_once("](")?;
    let (file, rest) = rest.split_once(')')?;
    if !is_topic_file(file) {
        return None;
    }
    let summary = rest
        .trim()
        .trim_start_matches(['—', '-', ':'])
        .trim()
        .to_owned();
    Some(Pointer {
        title: title.trim().to_owned(),
        file: file.to_owned(),
        summary,
    })
}

/// Whether `name` is a topic file's name: `[a-z0-9-]{1,48}.md`, not the index.
pub fn is_topic_file(name: &str) -> bool {
    name.strip_suffix(".md").is_some_and(|stem| {
        !stem.is_empty()
            && stem.len() <= 48
            && stem
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// A topic's name at most, in characters.
pub const TOPIC_MAX_CHARS: usize = 64;

/// Checks a topic's name before it becomes a heading and a pointer's title: one line of at
/// most [`TOPIC_MAX_CHARS`] characters, no control or invisible characters (a newline would
/// write raw lines into `MEMORY.md`), no brackets or parentheses (they would break the
/// pointer line `- [TITLE](FILE)`).
pub fn check_topic(topic: &str) -> Result<(), String> {
    let count = topic.trim().chars().count();
    if count > TOPIC_MAX_CHARS {
        return Err(format!(
            "a topic is a word or two, at most {TOPIC_MAX_CHARS} characters; this one has {count}"
        ));
    }
    // The output gate's own classes (keel-sanitize): controls, line breaks, and every
    // character it removes as invisible (format, private-use, unassigned, variation
    // selectors, tag characters, fillers).
    let invisible = |c: char| c.is_control() || keel_sanitize::sanitize::is_removed(c);
    if let Some(c) = topic.chars().find(|&c| invisible(c) || "[]()".contains(c)) {
        return Err(format!(
            "topic `{}` holds {c:?}: name it in a word or two on one line, like `testing`, \
             without brackets or control characters",
            topic.escape_debug()
        ));
    }
    Ok(())
}

/// The topic file a topic name maps to: lowercase letters, digits and dashes, at most 48.
pub fn topic_file(topic: &str) -> Result<String, String> {
    let mut stem = String::new();
    for c in topic.trim().chars() {
        if c.is_ascii_alphanumeric() {
            stem.push(c.to_ascii_lowercase());
        } else if !stem.ends_with('-') && !stem.is_empty() {
            stem.push('-');
        }
    }
    let stem: String = stem.trim_end_matches('-').chars().take(48).collect();
    let stem = stem.trim_end_matches('-');
    if stem.is_empty() {
        return Err(format!(
            "topic `{topic}` has no letters or digits; name it in a word or two, like `testing`"
        ));
    }
    Ok(format!("{stem}.md"))
}

/// An entry as one line: whitespace runs (newlines too) become one space, control characters
/// go, at most [`ENTRY_MAX_CHARS`].
pub fn entry_line(text: &str) -> Result<String, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let flat: String = words
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if flat.is_empty() {
        return Err("nothing to remember: `text` is empty".into());
    }
    let count = flat.chars().count();
    if count > ENTRY_MAX_CHARS {
        return Err(format!(
            "an entry is at most {ENTRY_MAX_CHARS} characters; this one has {count}: remember \
             the point, not the whole text"
        ));
    }
    Ok(format!("- {flat}"))
}

/// What `remember` changes: the new contents of the files that change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    /// The index's new text, when a pointer was added.
    pub index: Option<String>,
    /// The topic file's new text, unless the entry was already there.
    pub topic: Option<String>,
}

/// Appends `text` to the topic file (`topic_text` is its contents, empty when it does not
/// exist) and, when the index has no pointer to it, a pointer to the index. Only appends: a
/// line exactly like the new one means nothing changes.
pub fn remember(
    index: &str,
    topic: &str,
    topic_text: &str,
    text: &str,
) -> Result<Remembered, String> {
    check_topic(topic)?;
    let file = topic_file(topic)?;
    let line = entry_line(text)?;
    let topic_new = if topic_text.lines().any(|l| l.trim_end() == line) {
        None
    } else {
        let mut t = if topic_text.is_empty() {
            format!("# {}\n", topic.trim())
        } else {
            topic_text.to_owned()
        };
        if !t.ends_with('\n') {
            t.push('\n');
        }
        t.push_str(&line);
        t.push('\n');
        Some(t)
    };
    let pointed = index
        .lines()
        .filter_map(parse_pointer)
        .any(|p| p.file == file);
    let index_new = (!pointed).then(|| {
        let mut i = if index.trim().is_empty() {
            "# Memory\n".to_owned()
        } else {
            index.to_owned()
        };
        if !i.ends_with('\n') {
            i.push('\n');
        }
        let pointer = Pointer {
            title: topic.trim().to_owned(),
            file: file.clone(),
            summary: cut_chars(line.trim_start_matches("- "), SUMMARY_MAX_CHARS),
        };
        i.push_str(&pointer.line());
        i.push('\n');
        i
    });
    Ok(Remembered {
        index: index_new,
        topic: topic_new,
    })
}

/// The index as a prompt shows it: its first [`INDEX_MAX_LINES`] lines within
/// [`INDEX_MAX_BYTES`], and a line saying how much was left out.
pub fn index_for_prompt(index: &str) -> String {
    let mut out = String::new();
    let total = index.lines().count();
    let mut shown = 0;
    for line in index.lines().take(INDEX_MAX_LINES) {
        if out.len() + line.len() + 1 > INDEX_MAX_BYTES {
            break;
        }
        out.push_str(line);
        out.push('\n');
        shown += 1;
    }
    if shown < total {
        out.push_str(&format!(
            "[{} more lines left out: the index is over its budget; `keel memory consolidate` \
             tidies it]\n",
            total - shown
        ));
    }
    out
}

fn cut_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "with", "that", "this", "what", "how", "are", "was", "you", "your", "our",
    "can", "does", "did", "not", "but", "from", "have", "has", "why", "when", "where", "which",
    "who", "about", "into", "there", "then", "them", "they", "its", "should", "would", "could",
    "please", "make", "let",
];

/// The words of `text` a recall matches on: lowercase, letters and digits, three or more long,
/// without the commonest English words.
fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 3 && !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// How many of `query`'s words `text` has; a word matches one it begins (four letters or
/// more: `test` matches `testing`).
fn score(query: &BTreeSet<String>, text: &str) -> usize {
    let have = words(text);
    query
        .iter()
        .filter(|q| {
            have.iter().any(|h| {
                h == *q
                    || (q.len() >= 4 && h.starts_with(q.as_str()))
                    || (h.len() >= 4 && q.starts_with(h.as_str()))
            })
        })
        .count()
}

/// The topic files worth reading for `input`: those whose pointer shares words with it, best
/// first, at most [`RECALL_MAX_TOPICS`].
pub fn topics_for(index: &str, input: &str) -> Vec<String> {
    let query = words(input);
    let mut scored: Vec<(usize, usize, String)> = index
        .lines()
        .filter_map(parse_pointer)
        .enumerate()
        .filter_map(|(i, p)| {
            let s = score(&query, &format!("{} {} {}", p.title, p.file, p.summary));
            (s > 0).then_some((s, i, p.file))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut seen = BTreeSet::new();
    scored
        .into_iter()
        .filter(|(_, _, f)| seen.insert(f.clone()))
        .map(|(_, _, f)| f)
        .take(RECALL_MAX_TOPICS)
        .collect()
}

/// The entries of the given topic files (`(source, contents)`) to recall for `input`: those
/// sharing the most words with it, then the newest, never one in `already`; at most
/// [`RECALL_MAX`] and [`RECALL_MAX_BYTES`] together, each cut at [`ENTRY_MAX_CHARS`].
pub fn pick_entries(
    topics: &[(String, String)],
    input: &str,
    already: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let query = words(input);
    // (score, topic order, newest first, source, text)
    let mut candidates: Vec<(usize, usize, usize, &str, String)> = Vec::new();
    for (t, (source, text)) in topics.iter().enumerate() {
        let entries: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .collect();
        let n = entries.len();
        for (i, entry) in entries.into_iter().enumerate() {
            let entry = cut_chars(entry.trim(), ENTRY_MAX_CHARS);
            if entry.is_empty() || already.contains(&entry) {
                continue;
            }
            candidates.push((score(&query, &entry), t, n - i, source, entry));
        }
    }
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut seen = BTreeSet::new();
    for (_, _, _, source, entry) in candidates {
        if out.len() == RECALL_MAX {
            break;
        }
        if bytes + entry.len() > RECALL_MAX_BYTES || !seen.insert(entry.clone()) {
            continue;
        }
        bytes += entry.len();
        out.push((source.to_owned(), entry));
    }
    out
}

/// What a tidy did to an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tidied {
    /// The index afterwards.
    pub index: String,
    /// Lines moved out of the index to the [`OVERFLOW_TOPIC`] file to bring it within its
    /// budget (they are entries there now; its pointer is in `index`).
    pub moved: Vec<String>,
    /// What changed, one line each.
    pub changes: Vec<String>,
}

/// The deterministic tidy of an index over the topic files that exist (`topics`: file name →
/// its first entry, for a pointer's summary): duplicate pointers and pointers to missing
/// files go, a topic file without a pointer gets one, and an index over its budget has its
/// summaries shortened, then its other lines moved to the [`OVERFLOW_TOPIC`] file. Topic
/// files are never changed (beyond the overflow file gaining lines).
pub fn tidy(index: &str, topics: &BTreeMap<String, String>) -> Tidied {
    let mut changes = Vec::new();
    let mut seen = BTreeSet::new();
    let mut lines: Vec<String> = Vec::new();
    for line in index.lines() {
        if let Some(p) = parse_pointer(line) {
            if !topics.contains_key(&p.file) {
                changes.push(format!(
                    "dropped a pointer to {}, which does not exist",
                    p.file
                ));
                continue;
            }
            if !seen.insert(p.file.clone()) {
                changes.push(format!("dropped a second pointer to {}", p.file));
                continue;
            }
        }
        lines.push(line.trim_end().to_owned());
    }
    if lines.is_empty() {
        lines.push("# Memory".into());
    }
    for (file, first) in topics {
        if !seen.contains(file) {
            let title = file.trim_end_matches(".md").to_owned();
            lines.push(
                Pointer {
                    title,
                    file: file.clone(),
                    summary: cut_chars(first, SUMMARY_MAX_CHARS),
                }
                .line(),
            );
            seen.insert(file.clone());
            changes.push(format!("added a pointer to {file}, which had none"));
        }
    }
    // The index's size with `extra` more bytes in one more line, over its budget?
    let over_with = |lines: &[String], extra: Option<usize>| {
        let (n, b) = extra.map_or((0, 0), |b| (1, b + 1));
        lines.len() + n > INDEX_MAX_LINES
            || lines.iter().map(|l| l.len() + 1).sum::<usize>() + b > INDEX_MAX_BYTES
    };
    let over = |lines: &[String]| over_with(lines, None);
    let overflow_file = format!("{OVERFLOW_TOPIC}.md");
    let overflow_pointer = Pointer {
        title: OVERFLOW_TOPIC.into(),
        file: overflow_file.clone(),
        summary: "lines moved out of the index to keep it within its budget".into(),
    }
    .line();
    if over(&lines) {
        let mut shortened = 0;
        for line in &mut lines {
            if let Some(mut p) = parse_pointer(line)
                && p.summary.chars().count() > SUMMARY_TIGHT_CHARS
            {
                p.summary = cut_chars(&p.summary, SUMMARY_TIGHT_CHARS);
                *line = p.line();
                shortened += 1;
            }
        }
        if shortened > 0 {
            changes.push(format!("shortened {shortened} summaries to fit the budget"));
        }
    }
    let mut moved = Vec::new();
    if over(&lines) {
        // Keep the first line (the heading) and every pointer; move the rest, last first,
        // leaving room for the pointer to where they went.
        let extra = (!seen.contains(&overflow_file)).then_some(overflow_pointer.len());
        while over_with(&lines, extra) {
            let Some(pos) = lines
                .iter()
                .enumerate()
                .skip(1)
                .rev()
                .find(|(_, l)| parse_pointer(l).is_none())
                .map(|(i, _)| i)
            else {
                changes.push(format!(
                    "still over the budget of {INDEX_MAX_LINES} lines and {INDEX_MAX_BYTES} \
                     bytes with only pointers left: merge topic files"
                ));
                break;
            };
            let line = lines.remove(pos);
            if !line.trim().is_empty() {
                moved.push(line);
            }
        }
        moved.reverse();
        if !moved.is_empty() {
            if !seen.contains(&overflow_file) {
                lines.push(overflow_pointer);
            }
            changes.push(format!(
                "moved {} lines to {overflow_file} to bring the index within its budget",
                moved.len()
            ));
        }
    }
    let mut index = lines.join("\n");
    index.push('\n');
    Tidied {
        index,
        moved,
        changes,
    }
}

/// The check a proposed index must pass before it replaces the tidied one: every pointer names
/// a topic file that exists (no invented files), every topic file has exactly one pointer (no
/// lost files), and it fits the budget. Topic files are not the proposal's to change: only the
/// index is ever written from it. Each problem is one line.
pub fn verify_index(proposal: &str, topics: &BTreeSet<String>) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    let pointers: Vec<Pointer> = proposal.lines().filter_map(parse_pointer).collect();
    for p in &pointers {
        if topics.contains(&p.file) {
            *count.entry(p.file.as_str()).or_default() += 1;
        } else {
            problems.push(format!("points at {}, which does not exist", p.file));
        }
    }
    // A line that looks like a pointer but is not one the parser takes hides a file.
    for line in proposal.lines() {
        if line.trim_start().starts_with("- [")
            && parse_pointer(line).is_none()
            && line.contains("](")
        {
            problems.push(format!("a pointer keel cannot read: `{}`", line.trim()));
        }
    }
    for file in topics {
        match count.get(file.as_str()).copied().unwrap_or(0) {
            0 => problems.push(format!("loses {file}: no pointer to it")),
            1 => {}
            n => problems.push(format!("points at {file} {n} times")),
        }
    }
    let lines = proposal.lines().count();
    if lines > INDEX_MAX_LINES || proposal.len() > INDEX_MAX_BYTES {
        problems.push(format!(
            "{lines} lines, {} bytes: over the budget of {INDEX_MAX_LINES} lines and \
             {INDEX_MAX_BYTES} bytes",
            proposal.len()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The first entry of a topic file, for its pointer's summary.
pub fn first_entry(topic_text: &str) -> String {
    topic_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("- "))
        .map(|e| cut_chars(e.trim(), SUMMARY_MAX_CHARS))
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
