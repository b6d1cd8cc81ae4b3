//! Anthropic Messages (`POST /v1/messages`).
//!
//! [`render_request`] turns a neutral [`ModelRequest`] into the streaming request body;
//! [`Decoder`] turns the SSE stream back into [`StreamDelta`]s and a [`ModelResponse`].
//!
//! Rendering rules: `system` is a top-level string (omitted when empty); text blocks become
//! `text` blocks (empty ones are dropped: the API rejects them); a tool call becomes a
//! `tool_use` block whose `input` is the parsed raw arguments — when they are not a JSON
//! object (a call cut off by the output limit) `{}` is sent and a note says so; a tool result
//! becomes a `tool_result` block with `is_error`, placed before the other blocks of its
//! message; thinking is never sent back (it is stored without the vendor signature the API
//! would demand); messages left empty are dropped and consecutive messages of one role are
//! merged, because the API requires the roles to alternate.
//!
//! Decoding rules: `message_start` gives the model and input usage; `content_block_start`
//! opens a text, thinking or `tool_use` (id, name) block; `content_block_delta` carries
//! `text_delta`, `thinking_delta` and `input_json_delta` (accumulated verbatim, so a call cut
//! off mid-arguments keeps its broken JSON); `signature_delta` and redacted thinking are
//! dropped; `message_delta` gives the stop reason and output usage; `message_stop` is the
//! terminal event; `ping` is ignored; an `error` event is a [`DecodeError::Provider`]. Usage
//! is neutral: `input_tokens` counts every prompt token, cached or not (the sum of the wire's
//! `input_tokens`, `cache_read_input_tokens` and `cache_creation_input_tokens`), like
//! OpenAI's `prompt_tokens`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use keel_protocol::{ModelRequest, ModelResponse, Role, StopReason, StreamDelta, Usage};
use serde::Deserialize;
use serde_json::Value;

use crate::decode::{Assembly, DecodeError, Ending, StreamDecoder, finish_response};
use crate::fragments::{BodyAssembly, KeptBody, MessageParts, Part, Rendering, Resume};
use crate::request::{BlockView, Body, JsonText, MessageView, RequestView};
use crate::sse::SseEvent;
use crate::{RenderError, Rendered};

/// The `anthropic-version` header value this module speaks.
pub const API_VERSION: &str = "2023-06-01";

/// How to render requests for one Anthropic endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicOptions {
    /// The model used when the request names none.
    pub model: String,
}

impl AnthropicOptions {
    /// Options for `model`.
    pub fn new(model: impl Into<String>) -> AnthropicOptions {
        AnthropicOptions {
            model: model.into(),
        }
    }
}

/// Render the streaming request body of `req` (see [`render`]).
pub fn render_request(
    req: &ModelRequest,
    opts: &AnthropicOptions,
) -> Result<Rendered, RenderError> {
    let json = serde_json::to_string(req)
        .map_err(|e| RenderError::Invalid(format!("cannot encode the request: {e}")))?;
    render(&RequestView::parse(&json)?, opts)
}

/// The arguments of a tool call as the `input` object, when they are one.
fn tool_input<'a>(arguments: JsonText<'a>) -> Result<Option<Cow<'a, str>>, RenderError> {
    let text = arguments.decode()?;
    let is_object = serde_json::from_str::<&serde_json::value::RawValue>(&text)
        .is_ok_and(|raw| raw.get().starts_with('{'));
    Ok(is_object.then_some(text))
}

/// Render the streaming request body, the request's strings copied in as they arrived.
pub fn render(req: &RequestView<'_>, opts: &AnthropicOptions) -> Result<Rendered, RenderError> {
    let rendering = Rendering::of(&req.messages, render_message)?;
    Ok(assemble(req, opts, &rendering, None)?.0)
}

/// The content blocks one message becomes: its tool results first, then its text and tool
/// calls; none for a message with nothing to send (it is dropped).
pub(crate) fn render_message(message: &MessageView<'_>) -> Result<MessageParts, RenderError> {
    let mut out = MessageParts::new(message.role);
    let mut others = Vec::new();
    for block in &message.content {
        match *block {
            BlockView::Text(text) if !text.is_empty() => others.push((text, None)),
            BlockView::Text(_) | BlockView::Thinking(_) => {}
            BlockView::ToolCall {
                id,
                name,
                arguments,
            } => {
                let input = match tool_input(arguments)? {
                    Some(input) => input,
                    None => {
                        if !arguments.decode()?.trim().is_empty() {
                            out.note(format!(
                                "tool call {} (`{}`) has arguments that are not a JSON object; \
                                 sent {{}} as its input",
                                id.decode()?,
                                name.decode()?
                            ));
                        }
                        Cow::Borrowed("{}")
                    }
                };
                others.push((id, Some((name, input))));
            }
            BlockView::ToolResult {
                call_id,
                content,
                is_error,
            } => out.part(true, |body| {
                body.raw(r#"{"type":"tool_result","tool_use_id":"#)
                    .raw(call_id.token())
                    .raw(r#","content":"#)
                    .raw(content.token())
                    .raw(r#","is_error":"#)
                    .value(&is_error)
                    .raw("}");
            }),
        }
    }
    for (text_or_id, call) in others {
        out.part(false, |body| match call {
            None => {
                body.raw(r#"{"type":"text","text":"#)
                    .raw(text_or_id.token())
                    .raw("}");
            }
            Some((name, input)) => {
                body.raw(r#"{"type":"tool_use","id":"#)
                    .raw(text_or_id.token())
                    .raw(r#","name":"#)
                    .raw(name.token())
                    .raw(r#","input":"#)
                    .raw(&input)
                    .raw("}");
            }
        });
    }
    Ok(out)
}

/// The body of `req` with `rendering` as its messages: consecutive messages of one role are
/// merged (the API wants the roles to alternate), a user message's tool results first. Over
/// `kept`, from the start of the last merged message it wrote (the next message may join it).
pub(crate) fn assemble(
    req: &RequestView<'_>,
    opts: &AnthropicOptions,
    rendering: &Rendering,
    kept: Option<KeptBody>,
) -> Result<(Rendered, Resume), RenderError> {
    let mut head = Body::with_capacity(128);
    head.raw("{")
        .model(req, &opts.model)?
        .raw(",")
        .key("max_tokens")
        .value(&req.max_tokens)
        .raw(r#","stream":true,"messages":["#);
    let mut assembly = BodyAssembly::start(head.as_bytes(), false, kept, rendering, || {
        req.body(rendering.bytes())
    });
    // (first message, role, parts) of each merged message.
    let mut groups: Vec<(usize, Role, Vec<&Part>)> = Vec::new();
    for (index, fragment) in rendering.fragments().iter().enumerate().skip(assembly.from) {
        let parts = rendering.parts(fragment);
        if parts.is_empty() {
            continue;
        }
        match groups.last_mut() {
            Some((_, role, content)) if *role == fragment.role => content.extend(parts),
            _ => groups.push((index, fragment.role, parts.iter().collect())),
        }
    }
    let mut resume = assembly.resume(assembly.from);
    for (first, role, content) in &mut groups {
        resume = assembly.resume(*first);
        if *role == Role::User {
            // Tool results first, as the API wants them (a stable sort keeps their order).
            content.sort_by_key(|part| !part.is_result);
        }
        let role = match role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        assembly
            .element()
            .raw(r#"{"role":"#)
            .value(role)
            .raw(r#","content":"#)
            .array(content, |body, part| {
                body.bytes(rendering.part_bytes(part));
            })
            .raw("}");
    }
    let mut body = assembly.body;
    body.raw("]");
    if !req.system.is_empty() {
        body.raw(r#","system":"#).raw(req.system.token());
    }
    if !req.tools.is_empty() {
        body.raw(r#","tools":"#).array(&req.tools, |body, tool| {
            body.raw(r#"{"name":"#)
                .raw(tool.name.token())
                .raw(r#","description":"#)
                .raw(tool.description.token())
                .raw(r#","input_schema":"#)
                .raw(tool.input_schema.get())
                .raw("}");
        });
    }
    body.raw("}");
    let rendered = Rendered {
        body: body.into_bytes(),
        notes: rendering.notes(),
    };
    Ok((rendered, resume))
}

/// Map a `stop_reason` to the neutral stop reason; `None` for values keel does not know.
/// `pause_turn` (a server-side tool loop paused) ends the turn as `end_turn`.
pub fn map_stop_reason(raw: &str) -> Option<StopReason> {
    match raw {
        "end_turn" | "pause_turn" => Some(StopReason::EndTurn),
        "tool_use" => Some(StopReason::ToolUse),
        "max_tokens" | "model_context_window_exceeded" => Some(StopReason::MaxTokens),
        "stop_sequence" => Some(StopReason::StopSequence),
        "refusal" => Some(StopReason::Refusal),
        _ => None,
    }
}

#[derive(Deserialize, Default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    ToolUse,
    Other,
}

/// The Messages stream decoder. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    assembly: Assembly,
    ending: Ending,
    stop_raw: Option<String>,
    blocks: HashMap<u64, Kind>,
    start_inputs: HashMap<u64, String>,
    args_seen: HashSet<u64>,
    wire_input: u64,
    wire_cache_read: u64,
    wire_cache_write: u64,
}

impl Decoder {
    /// A decoder for a request that allowed `max_tokens` output tokens.
    pub fn new(max_tokens: u32) -> Decoder {
        Decoder {
            ending: Ending {
                max_tokens,
                ..Ending::default()
            },
            ..Decoder::default()
        }
    }

    fn malformed(event: &SseEvent, detail: impl Into<String>) -> DecodeError {
        DecodeError::Malformed {
            format: "anthropic",
            event: event.event.clone(),
            detail: detail.into(),
        }
    }

    fn usage(&mut self, value: &Value) {
        let Ok(u) = WireUsage::deserialize(value) else {
            return;
        };
        if let Some(n) = u.input_tokens {
            self.wire_input = n;
        }
        if let Some(n) = u.cache_read_input_tokens {
            self.wire_cache_read = n;
        }
        if let Some(n) = u.cache_creation_input_tokens {
            self.wire_cache_write = n;
        }
        if let Some(n) = u.output_tokens {
            self.ending.usage.output_tokens = n;
        }
        self.ending.usage = Usage {
            input_tokens: self.wire_input + self.wire_cache_read + self.wire_cache_write,
            output_tokens: self.ending.usage.output_tokens,
            cache_read_tokens: self.wire_cache_read,
            cache_write_tokens: self.wire_cache_write,
        };
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: &SseEvent) -> Result<Vec<StreamDelta>, DecodeError> {
        if self.ending.terminal {
            return Ok(Vec::new());
        }
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| Decoder::malformed(event, e.to_string()))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        let index = value.get("index").and_then(Value::as_u64);
        let need_index = || {
            index.ok_or_else(|| Decoder::malformed(event, "content block event without an index"))
        };
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                let message = value.get("message").unwrap_or(&Value::Null);
                let model = str_of(message, "model");
                if !model.is_empty() {
                    self.ending.model = model.to_string();
                }
                if let Some(u) = message.get("usage") {
                    self.usage(u);
                }
            }
            "content_block_start" => {
                let index = need_index()?;
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let kind = match str_of(block, "type") {
                    "text" => {
                        out.extend(self.assembly.text(str_of(block, "text")));
                        Kind::Text
                    }
                    "thinking" => {
                        out.extend(self.assembly.thinking(str_of(block, "thinking")));
                        Kind::Thinking
                    }
                    "tool_use" => {
                        out.extend(self.assembly.call(
                            index,
                            str_of(block, "id"),
                            str_of(block, "name"),
                        ));
                        if let Some(input) = block.get("input") {
                            self.start_inputs.insert(index, input.to_string());
                        }
                        Kind::ToolUse
                    }
                    _ => Kind::Other,
                };
                self.blocks.insert(index, kind);
            }
            "content_block_delta" => {
                let index = need_index()?;
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match str_of(delta, "type") {
                    "text_delta" => out.extend(self.assembly.text(str_of(delta, "text"))),
                    "thinking_delta" => {
                        out.extend(self.assembly.thinking(str_of(delta, "thinking")));
                    }
                    "input_json_delta" if self.blocks.get(&index) == Some(&Kind::ToolUse) => {
                        self.args_seen.insert(index);
                        self.assembly
                            .arguments(index, str_of(delta, "partial_json"));
                    }
                    _ => {} // signature_delta, citations and the like are dropped
                }
            }
            "content_block_stop" => {
                let index = need_index()?;
                if self.blocks.get(&index) == Some(&Kind::ToolUse)
                    && !self.args_seen.contains(&index)
                    && let Some(input) = self.start_inputs.get(&index).cloned()
                {
                    self.assembly.arguments(index, &input);
                }
            }
            "message_delta" => {
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_raw = Some(reason.to_string());
                }
                if let Some(u) = value.get("usage") {
                    self.usage(u);
                }
            }
            "message_stop" => self.ending.terminal = true,
            "error" => {
                let err = value.get("error").cloned().unwrap_or(Value::Null);
                return Err(DecodeError::Provider {
                    kind: str_of(&err, "type").to_string(),
                    message: str_of(&err, "message").to_string(),
                });
            }
            _ => {} // ping and future event types
        }
        Ok(out)
    }

    fn is_done(&self) -> bool {
        self.ending.terminal
    }

    fn received_content(&self) -> bool {
        self.assembly.received()
    }

    fn finish(&mut self) -> ModelResponse {
        let mut ending = self.ending.clone();
        if let Some(raw) = &self.stop_raw {
            ending.stop = map_stop_reason(raw).map(|reason| (reason, raw.clone()));
        }
        let mut response = finish_response(&self.assembly, &ending);
        if ending.terminal
            && ending.stop.is_none()
            && let Some(raw) = &self.stop_raw
        {
            // An unknown wire value: the reason is derived, the raw string kept.
            response.stop_reason_raw = raw.clone();
        }
        response
    }
}
