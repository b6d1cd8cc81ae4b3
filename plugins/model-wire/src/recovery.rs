//! Bounded context-length recovery: shrink a [`ModelRequest`] that the provider rejected as
//! too long, one step at a time.
//!
//! Step one replaces the content of old tool results (all but the most recent
//! [`RecoveryPolicy::keep_recent_tool_results`]) with [`DROPPED_RESULT`]. Each later step
//! drops the oldest half of the messages after the first user message, cutting just before
//! an assistant message so that calls and their results go together, then removes any tool
//! result whose call is gone and any call whose result is gone, and notes the drop in the
//! first user message. After [`RecoveryPolicy::max_steps`] steps, or when nothing is left to
//! drop, recovery gives up with [`RecoveryError`].

use std::collections::HashSet;

use keel_protocol::{Block, Message, ModelRequest, Role};
use thiserror::Error;

/// What replaces an old tool result's content.
pub const DROPPED_RESULT: &str =
    "[this tool result was dropped to fit the context window; run the tool again if needed]";

/// The recovery numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// Tool results kept whole by step one (default 3).
    pub keep_recent_tool_results: usize,
    /// Steps at most before giving up (default 3).
    pub max_steps: u32,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            keep_recent_tool_results: 3,
            max_steps: 3,
        }
    }
}

/// Recovery gave up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "the conversation does not fit the model's context window even after {steps} recovery \
     step(s) ({reason}); start a new session or shorten the input"
)]
pub struct RecoveryError {
    /// Steps applied before giving up.
    pub steps: u32,
    /// Why no further step was possible.
    pub reason: String,
}

/// The state of one request's recovery.
#[derive(Debug, Clone, Default)]
pub struct ContextRecovery {
    policy: RecoveryPolicy,
    steps: u32,
    results_elided: bool,
    dropped_messages: usize,
}

impl ContextRecovery {
    /// A recovery with no step taken yet.
    pub fn new(policy: RecoveryPolicy) -> ContextRecovery {
        ContextRecovery {
            policy,
            ..ContextRecovery::default()
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Apply the next step to `req`; returns what it did, for display.
    pub fn step(&mut self, req: &mut ModelRequest) -> Result<String, RecoveryError> {
        if self.steps >= self.policy.max_steps {
            return Err(self.give_up("the step limit was reached"));
        }
        if !self.results_elided {
            self.results_elided = true;
            let n = elide_old_tool_results(req, self.policy.keep_recent_tool_results);
            if n > 0 {
                self.steps += 1;
                return Ok(format!(
                    "replaced {n} old tool result(s) with a placeholder to fit the context window"
                ));
            }
        }
        let n = drop_oldest_messages(req);
        if n == 0 {
            return Err(self.give_up("no older messages are left to drop"));
        }
        self.steps += 1;
        self.dropped_messages += n;
        note_drop(req, self.dropped_messages);
        Ok(format!(
            "dropped the {n} oldest message(s) to fit the context window"
        ))
    }

    fn give_up(&self, reason: &str) -> RecoveryError {
        RecoveryError {
            steps: self.steps,
            reason: reason.to_string(),
        }
    }
}

/// Replace the content of all tool results but the `keep` most recent with
/// [`DROPPED_RESULT`]; returns how many were replaced.
pub fn elide_old_tool_results(req: &mut ModelRequest, keep: usize) -> usize {
    let total = req
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .filter(|b| matches!(b, Block::ToolResult { content, .. } if content != DROPPED_RESULT))
        .count();
    let mut to_elide = total.saturating_sub(keep);
    let mut n = 0;
    for block in req.messages.iter_mut().flat_map(|m| &mut m.content) {
        if to_elide == 0 {
            break;
        }
        if let Block::ToolResult { content, .. } = block
            && content != DROPPED_RESULT
        {
            *content = DROPPED_RESULT.to_string();
            to_elide -= 1;
            n += 1;
        }
    }
    n
}

/// Drop the oldest half of the messages after the first user message, cutting just before an
/// assistant message, then repair call/result pairs; returns how many messages went.
pub fn drop_oldest_messages(req: &mut ModelRequest) -> usize {
    let Some(first_user) = req.messages.iter().position(|m| m.role == Role::User) else {
        return 0;
    };
    let after = first_user + 1;
    let len = req.messages.len();
    // Cut points: assistant messages after the first user message, except the first one
    // (cutting there would drop nothing) — the kept tail starts at the cut.
    let cuts: Vec<usize> = (after + 1..len)
        .filter(|&i| req.messages[i].role == Role::Assistant)
        .collect();
    let target = after + (len - after) / 2;
    let Some(cut) = cuts
        .iter()
        .copied()
        .find(|&c| c >= target)
        .or(cuts.last().copied())
    else {
        return 0;
    };
    let before = req.messages.len();
    let tail = req.messages.split_off(cut);
    req.messages.truncate(after);
    req.messages.extend(tail);
    // Messages before the first user message (rare) go too.
    req.messages.drain(..first_user);
    repair_pairs(&mut req.messages);
    before.saturating_sub(req.messages.len())
}

/// Remove tool results whose call is not in an earlier message and calls whose result is not
/// in a later one; drop messages left empty.
fn repair_pairs(messages: &mut Vec<Message>) {
    let mut calls_seen: HashSet<String> = HashSet::new();
    for m in messages.iter_mut() {
        m.content.retain(|b| match b {
            Block::ToolResult { call_id, .. } => calls_seen.contains(call_id),
            _ => true,
        });
        for (id, _, _) in m.tool_calls() {
            calls_seen.insert(id.to_string());
        }
    }
    let mut results_seen: HashSet<String> = HashSet::new();
    for m in messages.iter_mut().rev() {
        m.content.retain(|b| match b {
            Block::ToolCall { id, .. } => results_seen.contains(id),
            _ => true,
        });
        for b in &m.content {
            if let Block::ToolResult { call_id, .. } = b {
                results_seen.insert(call_id.clone());
            }
        }
    }
    messages.retain(|m| !m.content.is_empty());
}

fn note_drop(req: &mut ModelRequest, dropped: usize) {
    let note = format!(
        "[{dropped} earlier message(s) of this conversation were dropped to fit the context window]"
    );
    if let Some(first) = req.messages.iter_mut().find(|m| m.role == Role::User) {
        let existing = first.content.iter_mut().find_map(|b| match b {
            Block::Text { text } if text.ends_with("to fit the context window]") => Some(text),
            _ => None,
        });
        match existing {
            Some(text) => *text = note,
            None => first.content.push(Block::Text { text: note }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::Message;

    fn call(id: &str) -> Message {
        Message {
            role: Role::Assistant,
            content: vec![Block::ToolCall {
                id: id.into(),
                name: "read".into(),
                arguments: "{}".into(),
            }],
        }
    }

    fn result(id: &str) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                call_id: id.into(),
                content: format!("contents {id}"),
                is_error: false,
            }],
        }
    }

    fn conversation(calls: usize) -> ModelRequest {
        let mut messages = vec![Message::user_text("do the task")];
        for i in 0..calls {
            messages.push(call(&format!("c{i}")));
            messages.push(result(&format!("c{i}")));
        }
        ModelRequest {
            compacts_on_overflow: false,
            conversation: None,
            model: String::new(),
            system: "sys".into(),
            messages,
            tools: vec![],
            max_tokens: 100,
        }
    }

    fn assert_paired(req: &ModelRequest) {
        let mut calls = HashSet::new();
        for m in &req.messages {
            for b in &m.content {
                match b {
                    Block::ToolCall { id, .. } => {
                        calls.insert(id.clone());
                    }
                    Block::ToolResult { call_id, .. } => {
                        assert!(calls.remove(call_id), "result {call_id} without call")
                    }
                    _ => {}
                }
            }
        }
        assert!(calls.is_empty(), "calls without results: {calls:?}");
        for pair in req.messages.windows(2) {
            assert_ne!(pair[0].role, pair[1].role, "roles alternate");
        }
    }

    #[test]
    fn step_one_elides_old_results_then_drops_then_gives_up() {
        let mut req = conversation(6);
        let mut rec = ContextRecovery::new(RecoveryPolicy {
            keep_recent_tool_results: 2,
            max_steps: 5,
        });
        let what = rec.step(&mut req).expect("step one");
        assert!(what.contains("replaced 4"), "{what}");
        let contents: Vec<&str> = req
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolResult { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(&contents[..4], &[DROPPED_RESULT; 4]);
        assert_eq!(&contents[4..], &["contents c4", "contents c5"]);

        let what = rec.step(&mut req).expect("step two");
        assert!(what.contains("dropped"), "{what}");
        assert_eq!(
            req.messages[0].content[0],
            Block::Text {
                text: "do the task".into()
            }
        );
        assert!(
            req.messages[0]
                .text()
                .contains("dropped to fit the context window")
        );
        assert!(req.messages.len() < 13);
        assert_paired(&req);
        // The most recent exchange survives.
        assert_eq!(req.messages.last(), Some(&result("c5")));

        while rec.step(&mut req).is_ok() {
            assert_paired(&req);
        }
        let err = rec.step(&mut req).expect_err("exhausted");
        assert!(err.to_string().contains("context window"), "{err}");
        assert_eq!(req.messages.len(), 3);
        assert_paired(&req);
    }

    #[test]
    fn the_step_limit_holds() {
        let mut req = conversation(40);
        let mut rec = ContextRecovery::new(RecoveryPolicy {
            keep_recent_tool_results: 1,
            max_steps: 2,
        });
        rec.step(&mut req).expect("one");
        rec.step(&mut req).expect("two");
        let err = rec.step(&mut req).expect_err("limit");
        assert_eq!(err.steps, 2);
    }

    #[test]
    fn orphans_are_repaired_when_the_trajectory_is_irregular() {
        // A user message answering two calls made in two different assistant messages.
        let mut req = conversation(0);
        req.messages.push(call("a"));
        req.messages.push(Message::user_text("more"));
        req.messages.push(call("b"));
        req.messages.push(Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    call_id: "a".into(),
                    content: "x".into(),
                    is_error: false,
                },
                Block::ToolResult {
                    call_id: "b".into(),
                    content: "y".into(),
                    is_error: false,
                },
            ],
        });
        assert!(drop_oldest_messages(&mut req) > 0);
        assert_paired(&req);
    }
}
