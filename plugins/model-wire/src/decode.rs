//! What both vendors' stream decoders share: the [`StreamDecoder`] interface the driver uses,
//! the [`Assembly`] that builds the neutral assistant message from fragments, and the rules
//! for ending a stream.
//!
//! A stream is finished only by its terminal event (`data: [DONE]` for OpenAI,
//! `message_stop` for Anthropic). A stream that ends any other way is an *interruption*: the
//! response is marked [`StopReason::Interrupted`] and [`StreamDecoder::received_content`] tells
//! the driver whether anything was received (then the partial content is presented as is and
//! never retried, because it was billed) or nothing was (then a transparent resend is safe).

use keel_protocol::{Block, Message, ModelResponse, Role, StopReason, StreamDelta, Usage};
use thiserror::Error;

use crate::sse::SseEvent;

/// What a decoder can report about a stream.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// An event's data was not the JSON the format promises.
    #[error("malformed {format} stream event `{event}`: {detail}")]
    Malformed {
        /// `openai` or `anthropic`.
        format: &'static str,
        /// The SSE event name.
        event: String,
        /// What was wrong.
        detail: String,
    },
    /// The provider sent an error object inside the stream.
    #[error("the provider reported an error in the stream ({kind}): {message}")]
    Provider {
        /// The error's type (`overloaded_error`, `server_error`, …), empty when none was given.
        kind: String,
        /// The error's message.
        message: String,
    },
}

/// A vendor stream decoder: feed it SSE events, show its deltas, take its response.
pub trait StreamDecoder {
    /// Decode one event; returns the display fragments it produced.
    fn feed(&mut self, event: &SseEvent) -> Result<Vec<StreamDelta>, DecodeError>;
    /// Whether the terminal event arrived (later events are ignored).
    fn is_done(&self) -> bool;
    /// Whether any text, thinking or tool-call bytes arrived.
    fn received_content(&self) -> bool;
    /// The response so far. Without the terminal event its stop reason is
    /// [`StopReason::Interrupted`] with raw `interrupted`.
    fn finish(&mut self) -> ModelResponse;
}

/// The stop reason keel derives when the terminal event arrived but the wire named none:
/// billed output at or past the requested limit is truncation (`max_tokens`), a response
/// with tool calls is `tool_use`, anything else `end_turn`. The raw string is
/// `derived:<reason>`.
pub fn derive_stop_reason(
    has_tool_calls: bool,
    output_tokens: u64,
    max_tokens: u32,
) -> (StopReason, String) {
    let reason = if max_tokens > 0 && output_tokens >= u64::from(max_tokens) {
        StopReason::MaxTokens
    } else if has_tool_calls {
        StopReason::ToolUse
    } else {
        StopReason::EndTurn
    };
    (reason, format!("derived:{}", stop_reason_name(reason)))
}

/// The neutral spelling of a stop reason (`end_turn`, `tool_use`, …).
pub fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::Refusal => "refusal",
        StopReason::Interrupted => "interrupted",
    }
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Thinking(String),
    Call {
        key: u64,
        id: String,
        name: String,
        arguments: String,
        announced: bool,
    },
}

/// Builds the assistant message from stream fragments, in arrival order.
///
/// Consecutive text (or thinking) fragments join into one block; a tool call is addressed by
/// a caller-chosen key (OpenAI's `index`, Anthropic's content-block index) so its argument
/// fragments find it.
#[derive(Debug, Clone, Default)]
pub struct Assembly {
    parts: Vec<Part>,
    received: bool,
}

impl Assembly {
    /// An empty assembly.
    pub fn new() -> Assembly {
        Assembly::default()
    }

    /// Append text; returns the display delta.
    pub fn text(&mut self, fragment: &str) -> Option<StreamDelta> {
        if fragment.is_empty() {
            return None;
        }
        self.received = true;
        match self.parts.last_mut() {
            Some(Part::Text(t)) => t.push_str(fragment),
            _ => self.parts.push(Part::Text(fragment.to_string())),
        }
        Some(StreamDelta::Text {
            text: fragment.to_string(),
        })
    }

    /// Append reasoning; returns the display delta.
    pub fn thinking(&mut self, fragment: &str) -> Option<StreamDelta> {
        if fragment.is_empty() {
            return None;
        }
        self.received = true;
        match self.parts.last_mut() {
            Some(Part::Thinking(t)) => t.push_str(fragment),
            _ => self.parts.push(Part::Thinking(fragment.to_string())),
        }
        Some(StreamDelta::Thinking {
            text: fragment.to_string(),
        })
    }

    /// Whether a tool call with this key exists.
    pub fn has_call(&self, key: u64) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Call { key: k, .. } if *k == key))
    }

    /// The key of the most recently started tool call.
    pub fn last_call_key(&self) -> Option<u64> {
        self.parts.iter().rev().find_map(|p| match p {
            Part::Call { key, .. } => Some(*key),
            _ => None,
        })
    }

    /// The id of the call with this key.
    pub fn call_id(&self, key: u64) -> Option<&str> {
        self.parts.iter().find_map(|p| match p {
            Part::Call { key: k, id, .. } if *k == key => Some(id.as_str()),
            _ => None,
        })
    }

    /// Start a tool call or fill in its id and name (only where they are still empty).
    /// Returns [`StreamDelta::ToolCallStart`] once, when the call first has a name.
    pub fn call(&mut self, key: u64, id: &str, name: &str) -> Option<StreamDelta> {
        self.received = true;
        if !self.has_call(key) {
            self.parts.push(Part::Call {
                key,
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
                announced: false,
            });
        }
        let Some(Part::Call {
            id: cid,
            name: cname,
            announced,
            ..
        }) = self.call_mut(key)
        else {
            return None;
        };
        if cid.is_empty() && !id.is_empty() {
            *cid = id.to_string();
        }
        if cname.is_empty() && !name.is_empty() {
            *cname = name.to_string();
        }
        if !*announced && !cname.is_empty() {
            *announced = true;
            return Some(StreamDelta::ToolCallStart {
                id: cid.clone(),
                name: cname.clone(),
            });
        }
        None
    }

    /// Append argument bytes to the call with this key (starting it when unknown).
    pub fn arguments(&mut self, key: u64, fragment: &str) {
        if fragment.is_empty() {
            return;
        }
        if !self.has_call(key) {
            self.call(key, "", "");
        }
        self.received = true;
        if let Some(Part::Call { arguments, .. }) = self.call_mut(key) {
            arguments.push_str(fragment);
        }
    }

    /// Whether anything (text, thinking, a tool call) arrived.
    pub fn received(&self) -> bool {
        self.received
    }

    /// Whether any tool call arrived.
    pub fn has_tool_calls(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Call { .. }))
    }

    /// The assistant message. Calls that never got an id are named `call_<key>`.
    pub fn message(&self) -> Message {
        let content = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(text) => Block::Text { text: text.clone() },
                Part::Thinking(text) => Block::Thinking { text: text.clone() },
                Part::Call {
                    key,
                    id,
                    name,
                    arguments,
                    ..
                } => Block::ToolCall {
                    id: if id.is_empty() {
                        format!("call_{key}")
                    } else {
                        id.clone()
                    },
                    name: name.clone(),
                    arguments: arguments.clone(),
                },
            })
            .collect();
        Message {
            role: Role::Assistant,
            content,
        }
    }

    fn call_mut(&mut self, key: u64) -> Option<&mut Part> {
        self.parts
            .iter_mut()
            .find(|p| matches!(p, Part::Call { key: k, .. } if *k == key))
    }
}

/// Everything a decoder learned, turned into the response by [`finish_response`].
#[derive(Debug, Clone, Default)]
pub struct Ending {
    /// Whether the terminal event arrived.
    pub terminal: bool,
    /// The wire's stop reason, mapped, with its raw spelling.
    pub stop: Option<(StopReason, String)>,
    /// Token counts.
    pub usage: Usage,
    /// The model as the provider named it.
    pub model: String,
    /// The request's output limit, for deriving `max_tokens`.
    pub max_tokens: u32,
}

/// The response for an assembly and its ending, applying the interruption and derivation
/// rules of the [module documentation](self).
pub fn finish_response(assembly: &Assembly, ending: &Ending) -> ModelResponse {
    let (stop_reason, stop_reason_raw) = if !ending.terminal {
        (StopReason::Interrupted, "interrupted".to_string())
    } else if let Some((reason, raw)) = &ending.stop {
        (*reason, raw.clone())
    } else {
        derive_stop_reason(
            assembly.has_tool_calls(),
            ending.usage.output_tokens,
            ending.max_tokens,
        )
    };
    ModelResponse {
        message: assembly.message(),
        stop_reason,
        stop_reason_raw,
        usage: ending.usage,
        model: ending.model.clone(),
        retries: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivation_prefers_truncation_then_tools() {
        assert_eq!(
            derive_stop_reason(true, 100, 100),
            (StopReason::MaxTokens, "derived:max_tokens".into())
        );
        assert_eq!(derive_stop_reason(true, 99, 100).0, StopReason::ToolUse);
        assert_eq!(derive_stop_reason(false, 99, 100).0, StopReason::EndTurn);
        assert_eq!(derive_stop_reason(false, 5, 0).0, StopReason::EndTurn);
    }

    #[test]
    fn assembly_joins_fragments_and_keys_calls() {
        let mut a = Assembly::new();
        assert!(!a.received());
        a.thinking("hm");
        a.thinking("m");
        a.text("he");
        a.text("llo");
        assert_eq!(
            a.call(3, "c1", "read"),
            Some(StreamDelta::ToolCallStart {
                id: "c1".into(),
                name: "read".into()
            })
        );
        assert_eq!(a.call(3, "c1", "read"), None);
        a.arguments(3, "{\"a\"");
        a.arguments(9, "{}");
        a.arguments(3, ":1}");
        let m = a.message();
        assert_eq!(
            m.content,
            vec![
                Block::Thinking { text: "hmm".into() },
                Block::Text {
                    text: "hello".into()
                },
                Block::ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: "{\"a\":1}".into()
                },
                Block::ToolCall {
                    id: "call_9".into(),
                    name: String::new(),
                    arguments: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn no_terminal_means_interrupted() {
        let mut a = Assembly::new();
        a.text("x");
        let r = finish_response(
            &a,
            &Ending {
                stop: Some((StopReason::EndTurn, "stop".into())),
                ..Ending::default()
            },
        );
        assert_eq!(r.stop_reason, StopReason::Interrupted);
    }
}
