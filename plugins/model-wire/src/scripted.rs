//! A deterministic scripted model, for demos and tests.
//!
//! A script lists assistant responses in order. It is stateless: the response played for a
//! request is the one at the index of the number of assistant messages already in the
//! request, so a resumed session continues where it left off. Past the end it answers with
//! [`EXHAUSTED_TEXT`] and `end_turn`.
//!
//! # Script format
//!
//! TOML (or the same structure as JSON, with `"step": [...]`):
//!
//! ```toml
//! model = "scripted"            # optional; the model name reported (default "scripted")
//!
//! [[step]]
//! thinking = "The user wants the file."   # optional
//! text = "Let me read it."                # optional
//! [[step.tool_calls]]
//! name = "read_file"
//! arguments = { path = "src/main.rs" }    # a JSON value (TOML table, array, …)
//! # id = "call_custom"                    # optional; default "call_<step>_<n>" (1-based)
//!
//! [[step]]
//! expect_tool_result_contains = "fn main" # optional: the previous tool result must say this
//! text = "Now a call cut off by the output limit."
//! stop_reason = "max_tokens"              # optional: end_turn, tool_use, max_tokens,
//!                                         # stop_sequence, refusal, interrupted;
//!                                         # default: tool_use with tool calls, else end_turn
//! usage = { input_tokens = 1200, output_tokens = 64 }   # optional; default estimated
//! [[step.tool_calls]]
//! name = "write_file"
//! raw_arguments = '{"path": "notes.md", "content": "unfini'   # the exact argument text
//! ```
//!
//! A tool call has either `arguments` (a JSON value, serialized compactly) or
//! `raw_arguments` (sent as written, so it may be broken JSON), or neither (`{}`). The default
//! usage estimates four characters per token. Text is streamed as word-sized
//! [`StreamDelta`]s.

use keel_protocol::Usage;
use keel_protocol::{Block, Message, ModelRequest, ModelResponse, Role, StopReason, StreamDelta};
use serde::Deserialize;
use thiserror::Error;

use crate::decode::stop_reason_name;

/// What the model says past the end of its script.
pub const EXHAUSTED_TEXT: &str =
    "The scripted model has no more responses: its script is exhausted.";

/// A script. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The model name reported in responses.
    #[serde(default = "default_model")]
    pub model: String,
    /// The responses, in order.
    #[serde(default, rename = "step", alias = "steps")]
    pub steps: Vec<Step>,
}

fn default_model() -> String {
    "scripted".to_string()
}

/// One scripted assistant response.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Reasoning shown before the text.
    #[serde(default)]
    pub thinking: Option<String>,
    /// The answer text.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// The stop reason; derived when absent.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// Token counts; estimated when absent.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Text the most recent tool result in the request must contain.
    #[serde(default)]
    pub expect_tool_result_contains: Option<String>,
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// The call id; default `call_<step>_<n>`.
    #[serde(default)]
    pub id: Option<String>,
    /// The tool name.
    pub name: String,
    /// The arguments as a JSON value.
    #[serde(default)]
    pub arguments: Option<serde_json::Value>,
    /// The arguments as exact text (wins over `arguments`).
    #[serde(default)]
    pub raw_arguments: Option<String>,
}

/// What can go wrong with a script.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScriptError {
    /// The script file did not parse.
    #[error("the model script is invalid: {0}")]
    Parse(String),
    /// A step's expectation about the previous tool result failed.
    #[error(
        "scripted step {step} expected the previous tool result to contain {expected:?}, \
         but it was {found:?}"
    )]
    Expectation {
        /// The 1-based step.
        step: usize,
        /// The expected text.
        expected: String,
        /// The tool result found (or `<no tool result>`).
        found: String,
    },
}

impl Script {
    /// Parse a TOML script.
    pub fn from_toml(text: &str) -> Result<Script, ScriptError> {
        toml::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))
    }

    /// Parse a JSON script.
    pub fn from_json(text: &str) -> Result<Script, ScriptError> {
        serde_json::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))
    }

    /// Parse JSON when the text starts with `{`, else TOML.
    pub fn parse(text: &str) -> Result<Script, ScriptError> {
        if text.trim_start().starts_with('{') {
            Script::from_json(text)
        } else {
            Script::from_toml(text)
        }
    }

    /// The response to `req`, with its display fragments passed to `on_delta`.
    pub fn respond(
        &self,
        req: &ModelRequest,
        on_delta: &mut dyn FnMut(StreamDelta),
    ) -> Result<ModelResponse, ScriptError> {
        let index = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let Some(step) = self.steps.get(index) else {
            words(EXHAUSTED_TEXT, &mut |w| {
                on_delta(StreamDelta::Text { text: w });
            });
            return Ok(ModelResponse {
                message: Message {
                    role: Role::Assistant,
                    content: vec![Block::Text {
                        text: EXHAUSTED_TEXT.into(),
                    }],
                },
                stop_reason: StopReason::EndTurn,
                stop_reason_raw: "scripted:exhausted".into(),
                usage: estimate_usage(req, EXHAUSTED_TEXT.len()),
                model: self.model.clone(),
                retries: 0,
            });
        };
        let number = index + 1;
        if let Some(expected) = &step.expect_tool_result_contains {
            let found = last_tool_result(req);
            if !found.is_some_and(|f| f.contains(expected.as_str())) {
                return Err(ScriptError::Expectation {
                    step: number,
                    expected: expected.clone(),
                    found: found.unwrap_or("<no tool result>").to_string(),
                });
            }
        }
        let mut content = Vec::new();
        let mut out_chars = 0;
        if let Some(thinking) = step.thinking.as_ref().filter(|t| !t.is_empty()) {
            words(thinking, &mut |w| {
                on_delta(StreamDelta::Thinking { text: w })
            });
            out_chars += thinking.len();
            content.push(Block::Thinking {
                text: thinking.clone(),
            });
        }
        if let Some(text) = step.text.as_ref().filter(|t| !t.is_empty()) {
            words(text, &mut |w| on_delta(StreamDelta::Text { text: w }));
            out_chars += text.len();
            content.push(Block::Text { text: text.clone() });
        }
        for (n, call) in step.tool_calls.iter().enumerate() {
            let id = call
                .id
                .clone()
                .unwrap_or_else(|| format!("call_{number}_{}", n + 1));
            let arguments = match (&call.raw_arguments, &call.arguments) {
                (Some(raw), _) => raw.clone(),
                (None, Some(value)) => value.to_string(),
                (None, None) => "{}".to_string(),
            };
            on_delta(StreamDelta::ToolCallStart {
                id: id.clone(),
                name: call.name.clone(),
            });
            out_chars += call.name.len() + arguments.len();
            content.push(Block::ToolCall {
                id,
                name: call.name.clone(),
                arguments,
            });
        }
        let (stop_reason, stop_reason_raw) = match step.stop_reason {
            Some(reason) => (reason, format!("scripted:{}", stop_reason_name(reason))),
            None if step.tool_calls.is_empty() => {
                (StopReason::EndTurn, "derived:end_turn".to_string())
            }
            None => (StopReason::ToolUse, "derived:tool_use".to_string()),
        };
        Ok(ModelResponse {
            message: Message {
                role: Role::Assistant,
                content,
            },
            stop_reason,
            stop_reason_raw,
            usage: step.usage.unwrap_or_else(|| estimate_usage(req, out_chars)),
            model: self.model.clone(),
            retries: 0,
        })
    }
}

/// The content of the most recent tool result in the request.
fn last_tool_result(req: &ModelRequest) -> Option<&str> {
    req.messages
        .iter()
        .rev()
        .flat_map(|m| m.content.iter().rev())
        .find_map(|b| match b {
            Block::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
}

fn estimate_usage(req: &ModelRequest, out_chars: usize) -> Usage {
    let in_chars: usize = req.system.len()
        + req
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .map(|b| match b {
                Block::Text { text } | Block::Thinking { text } => text.len(),
                Block::ToolCall {
                    name, arguments, ..
                } => name.len() + arguments.len(),
                Block::ToolResult { content, .. } => content.len(),
            })
            .sum::<usize>();
    Usage {
        input_tokens: in_chars.div_ceil(4) as u64,
        output_tokens: out_chars.div_ceil(4) as u64,
        ..Usage::default()
    }
}

/// Split text into word-sized pieces (each word with the whitespace after it).
fn words(text: &str, emit: &mut dyn FnMut(String)) {
    let mut start = 0;
    let mut in_space = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            in_space = true;
        } else if in_space {
            emit(text[start..i].to_string());
            start = i;
            in_space = false;
        }
    }
    if start < text.len() {
        emit(text[start..].to_string());
    }
}
