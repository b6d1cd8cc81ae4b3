//! Compaction as data: where a conversation may be cut, what replaces the part before the
//! cut, how big a request is, and the trimming used once compaction has failed. The agent loop
//! and the session log's rebuild share [`apply`], so a resumed session continues from exactly
//! the compacted conversation.
//!
//! A cut is made just before a message in which the person spoke (a user message holding no
//! tool result), keeping whole turns, or — when the current turn alone outgrows the window (one
//! prompt, hundreds of tool calls) — inside it, just before one of the model's messages that
//! follows a tool result ([`step_cut_point`]). Either way every tool call and its result are on
//! the same side of the cut, so no request after a compaction carries a result without its call,
//! or a call without its result, in either wire format. A cut inside a turn keeps the person's
//! request of that turn verbatim, the summary of its earlier steps after it ([`apply`]).

use keel_protocol::{Block, Message, Role, ToolDef};

/// What starts a compaction's summary in the conversation.
pub const SUMMARY_HEADER: &str =
    "[keel: the earlier part of this conversation was compacted; this is its summary]";

/// What starts the note that replaces trimmed messages.
pub const TRIM_HEADER: &str = "[keel: the earlier part of this conversation was dropped to \
                               fit the context window; compaction is off after repeated \
                               failures]";

/// Characters per token, for estimates (the scripted model uses the same).
const CHARS_PER_TOKEN: usize = 4;

/// The estimated tokens of a request with this system prompt, messages and tools.
pub fn estimate_tokens(system: &str, messages: &[Message], tools: &[ToolDef]) -> u64 {
    estimate_tokens_of(system, messages.iter().map(message_chars).sum(), tools)
}

/// [`estimate_tokens`] of a conversation whose messages hold `message_chars` characters (as
/// [`message_chars`] counts them), without the messages at hand.
pub fn estimate_tokens_of(system: &str, message_chars: usize, tools: &[ToolDef]) -> u64 {
    let mut chars = system.len() + message_chars;
    for t in tools {
        chars += t.name.len() + t.description.len() + t.input_schema.to_string().len();
    }
    (chars.div_ceil(CHARS_PER_TOKEN)) as u64
}

/// The characters of one message, as [`estimate_tokens`] counts them.
pub fn message_chars(m: &Message) -> usize {
    m.content
        .iter()
        .map(|b| match b {
            Block::Text { text } | Block::Thinking { text } => text.len(),
            Block::ToolCall {
                name, arguments, ..
            } => name.len() + arguments.len(),
            Block::ToolResult { content, .. } => content.len(),
        })
        .sum()
}

/// Whether `m` holds tool results (a user message answering the model's calls).
fn is_results(m: &Message) -> bool {
    m.role == Role::User
        && m.content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { .. }))
}

/// Whether `b` is a summary or trim note an earlier compaction put in.
fn is_compaction_note(b: &Block) -> bool {
    matches!(b, Block::Text { text } if text.starts_with(SUMMARY_HEADER) || text.starts_with(TRIM_HEADER))
}

/// Whether `m` is a message in which the person spoke (not tool results).
fn is_person(m: &Message) -> bool {
    m.role == Role::User
        && !m
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { .. }))
}

/// Where to cut so that the last `keep_turns` turns (at least one) are kept whole: the index
/// of the first message kept, or `None` when there is nothing before it to replace.
pub fn cut_point(messages: &[Message], keep_turns: usize) -> Option<usize> {
    let starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| is_person(m))
        .map(|(i, _)| i)
        .collect();
    let keep = keep_turns.max(1);
    let cut = *starts.get(starts.len().checked_sub(keep)?)?;
    (cut > 0).then_some(cut)
}

/// Where to cut inside the current turn (after the person's last message): just before one of
/// the model's messages that follows a tool result, the earliest such point whose kept part
/// (the person's request, the steps from the cut on) is estimated at `target` tokens or less,
/// else the latest one (the last step is always kept). `None` when the turn has no step to
/// cut before.
pub fn step_cut_point(
    system: &str,
    messages: &[Message],
    tools: &[ToolDef],
    target: u64,
) -> Option<usize> {
    let person = messages.iter().rposition(is_person)?;
    let candidates: Vec<usize> = (person + 2..messages.len())
        .filter(|&i| messages[i].role == Role::Assistant && is_results(&messages[i - 1]))
        .collect();
    let last = *candidates.last()?;
    // What every choice keeps besides its steps: the request, the tools, the system prompt.
    let fixed = estimate_tokens(system, &messages[person..=person], tools);
    // suffix[k]: the characters of the messages from candidates[k] on.
    let mut suffix = vec![0usize; candidates.len()];
    let mut chars = 0;
    let mut from = messages.len();
    for (k, &cut) in candidates.iter().enumerate().rev() {
        chars += messages[cut..from].iter().map(message_chars).sum::<usize>();
        from = cut;
        suffix[k] = chars;
    }
    let fitting = candidates
        .iter()
        .zip(&suffix)
        .find(|(_, chars)| fixed + (chars.div_ceil(CHARS_PER_TOKEN)) as u64 <= target)
        .map(|(&cut, _)| cut);
    Some(fitting.unwrap_or(last))
}

/// The conversation after replacing its first `replaced` messages by `summary`: the messages
/// from `replaced` on, with the summary as the first text of the first one (a message in which
/// the person spoke). When the cut was made inside a turn (the first kept message is the
/// model's), a user message leads instead: the person's request of that turn, verbatim (less
/// an earlier compaction's note, which the new summary covers), then the summary.
/// `replaced` past the end keeps nothing but the summary.
pub fn apply(messages: &[Message], replaced: usize, summary: &str) -> Vec<Message> {
    let mut kept: Vec<Message> = messages.get(replaced..).unwrap_or_default().to_vec();
    let block = Block::Text {
        text: summary.to_owned(),
    };
    match kept.first_mut() {
        Some(first) if first.role == Role::User => first.content.insert(0, block),
        Some(_) => {
            let before = messages.get(..replaced).unwrap_or(messages);
            let mut content: Vec<Block> = before
                .iter()
                .rposition(is_person)
                .map(|i| {
                    before[i]
                        .content
                        .iter()
                        .filter(|b| !is_compaction_note(b))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            content.push(block);
            kept.insert(
                0,
                Message {
                    role: Role::User,
                    content,
                },
            );
        }
        None => kept.insert(
            0,
            Message {
                role: Role::User,
                content: vec![block],
            },
        ),
    }
    kept
}

/// The text a summary of `messages` is made from: each message as `ROLE: text`, tool calls and
/// results cut at 2,000 characters each; the newest part when it passes `budget_chars`.
pub fn transcript(messages: &[Message], budget_chars: usize) -> String {
    const BLOCK_CHARS: usize = 2000;
    let cut = |s: &str| -> String {
        if s.chars().count() <= BLOCK_CHARS {
            s.to_owned()
        } else {
            s.chars().take(BLOCK_CHARS).collect::<String>() + " […]"
        }
    };
    let mut parts: Vec<String> = Vec::new();
    for m in messages {
        let role = match m.role {
            Role::User => "person",
            Role::Assistant => "assistant",
        };
        for b in &m.content {
            let line = match b {
                Block::Text { text } => format!("{role}: {}", cut(text)),
                Block::ToolCall {
                    name, arguments, ..
                } => format!("assistant called {name} {}", cut(arguments)),
                Block::ToolResult {
                    content, is_error, ..
                } => format!(
                    "tool {}: {}",
                    if *is_error { "error" } else { "result" },
                    cut(content)
                ),
                Block::Thinking { .. } => continue,
            };
            parts.push(line);
        }
    }
    let mut out = String::new();
    let mut skipped = 0;
    for part in parts.iter().rev() {
        if out.len() + part.len() + 1 > budget_chars {
            skipped += 1;
            continue;
        }
        out.insert_str(0, &format!("{part}\n"));
    }
    if skipped > 0 {
        out.insert_str(0, &format!("[{skipped} older entries left out]\n"));
    }
    out
}

/// Trimming, for when compaction is off: the fewest oldest turns to drop (keeping the last
/// turn whole) so the estimate falls to `target` tokens or below, else the oldest steps of the
/// last turn too (see [`step_cut_point`]); the index to cut at, or `None` when there is
/// nothing to drop.
pub fn trim_point(
    system: &str,
    messages: &[Message],
    tools: &[ToolDef],
    target: u64,
) -> Option<usize> {
    let starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(i, m)| *i > 0 && is_person(m))
        .map(|(i, _)| i)
        .collect();
    let mut last = None;
    for &cut in &starts {
        last = Some(cut);
        let after = apply(messages, cut, TRIM_HEADER);
        if estimate_tokens(system, &after, tools) <= target {
            return Some(cut);
        }
    }
    // Every earlier turn dropped is not enough: drop the current turn's oldest steps too.
    step_cut_point(system, messages, tools, target)
        .filter(|&cut| last.is_none_or(|l| cut > l))
        .or(last)
}

/// The context window of a model, in tokens, when keel knows it (by name prefix).
pub fn known_context_window(model: &str) -> Option<u64> {
    const KNOWN: &[(&str, u64)] = &[
        ("gpt-4.1", 1_047_576),
        ("gpt-5", 400_000),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("claude", 200_000),
    ];
    let model = model.to_ascii_lowercase();
    KNOWN
        .iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map(|(_, n)| *n)
}

#[cfg(test)]
#[path = "compaction_tests.rs"]
mod tests;
