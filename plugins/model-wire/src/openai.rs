//! OpenAI Chat Completions (`POST /v1/chat/completions`) and the many servers that speak it.
//!
//! [`render_request`] turns a neutral [`ModelRequest`] into the streaming request body;
//! [`Decoder`] turns the SSE stream back into [`StreamDelta`]s and a [`ModelResponse`].
//!
//! Rendering rules: the system prompt is the first message; user text becomes a `user`
//! message; each tool result becomes a `role: "tool"` message with its `tool_call_id`, placed
//! before the user text of the same message (the API wants tool messages right after the
//! assistant message that called); a failed result's content is prefixed `Error: ` because
//! the format has no error flag; assistant messages carry their text (`null` when none) and
//! `tool_calls` with the raw argument string (an empty one is sent as `{}`); thinking is never
//! sent back.
//!
//! Decoding rules: `delta.content` is text; `delta.reasoning_content` and `delta.reasoning`
//! are thinking; `delta.refusal` is shown as text; tool calls are keyed by their `index` (a
//! missing index continues the last call unless a new id arrives); only choice 0 is read;
//! `finish_reason` maps `stop`→end_turn, `tool_calls`/`function_call`→tool_use,
//! `length`→max_tokens, `content_filter`→refusal, keeping the raw string (a `stop` with tool
//! calls present is tool_use, since some servers report it so; an unknown value is derived);
//! usage comes from the chunk that carries it (the final one with `include_usage`), where
//! `input_tokens` is `prompt_tokens` (which includes cached tokens) and `cache_read_tokens` is
//! `prompt_tokens_details.cached_tokens`; `data: [DONE]` is the terminal event; an `error`
//! object is a [`DecodeError::Provider`].

use keel_protocol::{ModelRequest, ModelResponse, Role, StopReason, StreamDelta, Usage};
use serde::Deserialize;
use serde_json::Value;

use crate::decode::{Assembly, DecodeError, Ending, StreamDecoder, finish_response};
use crate::fragments::{BodyAssembly, KeptBody, MessageParts, Rendering, Resume};
use crate::request::{BlockView, Body, MessageView, RequestView};
use crate::sse::SseEvent;
use crate::{RenderError, Rendered};

/// Which field carries the output limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensField {
    /// `max_tokens`: understood by every compatible server.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: required by OpenAI's reasoning models.
    MaxCompletionTokens,
}

/// How to render requests for one OpenAI-compatible endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiOptions {
    /// The model used when the request names none.
    pub model: String,
    /// Which field carries the output limit.
    pub max_tokens_field: MaxTokensField,
    /// Ask for a final usage chunk (`stream_options.include_usage`); some older servers
    /// reject the option.
    pub include_usage: bool,
}

impl OpenAiOptions {
    /// Options for `model` with `max_tokens` and usage reporting.
    pub fn new(model: impl Into<String>) -> OpenAiOptions {
        OpenAiOptions {
            model: model.into(),
            max_tokens_field: MaxTokensField::MaxTokens,
            include_usage: true,
        }
    }
}

/// Render the streaming request body of `req` (see [`render`]).
pub fn render_request(req: &ModelRequest, opts: &OpenAiOptions) -> Result<Rendered, RenderError> {
    let json = serde_json::to_string(req)
        .map_err(|e| RenderError::Invalid(format!("cannot encode the request: {e}")))?;
    render(&RequestView::parse(&json)?, opts)
}

/// Render the streaming request body, the request's strings copied in as they arrived.
pub fn render(req: &RequestView<'_>, opts: &OpenAiOptions) -> Result<Rendered, RenderError> {
    let rendering = Rendering::of(&req.messages, render_message)?;
    Ok(assemble(req, opts, &rendering, None)?.0)
}

/// The message objects one message becomes: its tool results as `tool` messages, then its
/// text (user), or one `assistant` message.
pub(crate) fn render_message(message: &MessageView<'_>) -> Result<MessageParts, RenderError> {
    let mut out = MessageParts::new(message.role);
    let mut texts = Vec::new();
    match message.role {
        Role::User => {
            for block in &message.content {
                match *block {
                    BlockView::Text(text) => texts.push(text),
                    BlockView::ToolResult {
                        call_id,
                        content,
                        is_error,
                    } => out.part(true, |body| {
                        body.raw(r#"{"role":"tool","tool_call_id":"#)
                            .raw(call_id.token())
                            .raw(r#","content":"#);
                        if is_error {
                            body.raw("\"Error: ").raw(content.escaped()).raw("\"");
                        } else {
                            body.raw(content.token());
                        }
                        body.raw("}");
                    }),
                    BlockView::Thinking(_) => {}
                    BlockView::ToolCall { name, .. } => out.note(format!(
                        "a tool call to `{}` in a user message was not sent",
                        name.decode()?
                    )),
                }
            }
            if !texts.is_empty() {
                out.part(false, |body| {
                    body.raw(r#"{"role":"user","content":"#)
                        .joined(&texts, "\\n")
                        .raw("}");
                });
            }
        }
        Role::Assistant => {
            let mut calls = Vec::new();
            for block in &message.content {
                match *block {
                    BlockView::Text(text) => texts.push(text),
                    BlockView::ToolCall {
                        id,
                        name,
                        arguments,
                    } => {
                        // Arguments cut off by the output limit are not JSON, and some
                        // OpenAI-compatible servers reject the whole request over them; the
                        // call was never run (its result says so), so `{}` stands in.
                        let valid =
                            serde_json::from_str::<serde::de::IgnoredAny>(&arguments.decode()?)
                                .is_ok();
                        calls.push((id, name, if valid { arguments.token() } else { r#""{}""# }));
                    }
                    BlockView::Thinking(_) => {}
                    BlockView::ToolResult { .. } => {
                        out.note("a tool result in an assistant message was not sent".into())
                    }
                }
            }
            out.part(false, |body| {
                body.raw(r#"{"role":"assistant","content":"#);
                if texts.is_empty() && !calls.is_empty() {
                    body.raw("null");
                } else {
                    body.joined(&texts, "\\n");
                }
                if !calls.is_empty() {
                    body.raw(r#","tool_calls":"#)
                        .array(&calls, |body, (id, name, arguments)| {
                            body.raw(r#"{"id":"#)
                                .raw(id.token())
                                .raw(r#","type":"function","function":{"name":"#)
                                .raw(name.token())
                                .raw(r#","arguments":"#)
                                .raw(arguments)
                                .raw("}}");
                        });
                }
                body.raw("}");
            });
        }
    }
    Ok(out)
}

/// The body of `req` with `rendering` as its messages.
pub(crate) fn assemble(
    req: &RequestView<'_>,
    opts: &OpenAiOptions,
    rendering: &Rendering,
    kept: Option<KeptBody>,
) -> Result<(Rendered, Resume), RenderError> {
    let mut head = Body::with_capacity(64 + req.system.token().len());
    head.raw("{")
        .model(req, &opts.model)?
        .raw(",")
        .key("messages")
        .raw("[");
    let system = !req.system.is_empty();
    if system {
        head.raw(r#"{"role":"system","content":"#)
            .raw(req.system.token())
            .raw("}");
    }
    let mut assembly = BodyAssembly::start(head.as_bytes(), system, kept, rendering, || {
        req.body(rendering.bytes())
    });
    for fragment in &rendering.fragments()[assembly.from..] {
        for part in rendering.parts(fragment) {
            assembly.element().bytes(rendering.part_bytes(part));
        }
    }
    // Each message's parts stand alone: the next body keeps all of these.
    let resume = assembly.resume(rendering.len());
    let mut body = assembly.body;
    body.raw(r#"],"stream":true,"#);
    let limit_field = match opts.max_tokens_field {
        MaxTokensField::MaxTokens => "max_tokens",
        MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
    };
    body.key(limit_field).value(&req.max_tokens);
    if opts.include_usage {
        body.raw(r#","stream_options":{"include_usage":true}"#);
    }
    if !req.tools.is_empty() {
        body.raw(r#","tools":"#).array(&req.tools, |body, tool| {
            body.raw(r#"{"type":"function","function":{"name":"#)
                .raw(tool.name.token())
                .raw(r#","description":"#)
                .raw(tool.description.token())
                .raw(r#","parameters":"#)
                .raw(tool.input_schema.get())
                .raw("}}");
        });
    }
    body.raw("}");
    let rendered = Rendered {
        body: body.into_bytes(),
        notes: rendering.notes(),
    };
    Ok((rendered, resume))
}

#[derive(Deserialize, Default)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    model: Option<String>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
    function_call: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireError {
    message: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<Value>,
}

impl WireError {
    fn into_decode_error(self) -> DecodeError {
        let kind = self
            .kind
            .or_else(|| match self.code {
                Some(Value::String(s)) => Some(s),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
            .unwrap_or_default();
        DecodeError::Provider {
            kind,
            message: self.message.unwrap_or_default(),
        }
    }
}

/// Map a `finish_reason` to the neutral stop reason; `None` for values keel does not know.
pub fn map_finish_reason(raw: &str) -> Option<StopReason> {
    match raw {
        "stop" => Some(StopReason::EndTurn),
        "tool_calls" | "function_call" => Some(StopReason::ToolUse),
        "length" => Some(StopReason::MaxTokens),
        "content_filter" => Some(StopReason::Refusal),
        _ => None,
    }
}

/// The Chat Completions stream decoder. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    assembly: Assembly,
    ending: Ending,
    finish_reason: Option<String>,
    next_anonymous_key: u64,
}

impl Decoder {
    /// A decoder for a request that allowed `max_tokens` output tokens.
    pub fn new(max_tokens: u32) -> Decoder {
        Decoder {
            ending: Ending {
                max_tokens,
                ..Ending::default()
            },
            next_anonymous_key: 1 << 32,
            ..Decoder::default()
        }
    }

    fn malformed(event: &SseEvent, detail: impl Into<String>) -> DecodeError {
        DecodeError::Malformed {
            format: "openai",
            event: event.event.clone(),
            detail: detail.into(),
        }
    }

    fn tool_call(&mut self, tc: ToolCallDelta, out: &mut Vec<StreamDelta>) {
        let id = tc.id.unwrap_or_default();
        let key = match tc.index {
            Some(i) => i,
            None => match self.assembly.last_call_key() {
                Some(k) if id.is_empty() || self.assembly.call_id(k) == Some(id.as_str()) => k,
                _ => {
                    self.next_anonymous_key += 1;
                    self.next_anonymous_key
                }
            },
        };
        let (name, arguments) = match tc.function {
            Some(f) => (f.name.unwrap_or_default(), f.arguments.unwrap_or_default()),
            None => (String::new(), String::new()),
        };
        if !self.assembly.has_call(key) || !id.is_empty() || !name.is_empty() {
            out.extend(self.assembly.call(key, &id, &name));
        }
        self.assembly.arguments(key, &arguments);
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: &SseEvent) -> Result<Vec<StreamDelta>, DecodeError> {
        if self.ending.terminal {
            return Ok(Vec::new());
        }
        let data = event.data.trim();
        if data == "[DONE]" {
            self.ending.terminal = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| Decoder::malformed(event, e.to_string()))?;
        if event.event == "error" || value.get("error").is_some_and(|e| !e.is_null()) {
            let err = value.get("error").cloned().unwrap_or(value.clone());
            let err: WireError = serde_json::from_value(err).unwrap_or(WireError {
                message: Some(data.to_string()),
                kind: None,
                code: None,
            });
            return Err(err.into_decode_error());
        }
        let chunk: Chunk =
            serde_json::from_value(value).map_err(|e| Decoder::malformed(event, e.to_string()))?;
        let mut out = Vec::new();
        if let Some(model) = chunk.model.filter(|m| !m.is_empty()) {
            self.ending.model = model;
        }
        if let Some(u) = chunk.usage {
            self.ending.usage = Usage {
                input_tokens: u.prompt_tokens.unwrap_or(0),
                output_tokens: u.completion_tokens.unwrap_or(0),
                cache_read_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                cache_write_tokens: 0,
            };
        }
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            let delta = choice.delta.unwrap_or_default();
            for thinking in [delta.reasoning_content, delta.reasoning]
                .into_iter()
                .flatten()
            {
                out.extend(self.assembly.thinking(&thinking));
            }
            for text in [delta.content, delta.refusal].into_iter().flatten() {
                out.extend(self.assembly.text(&text));
            }
            if let Some(f) = delta.function_call {
                self.tool_call(
                    ToolCallDelta {
                        index: Some(0),
                        id: None,
                        function: Some(f),
                    },
                    &mut out,
                );
            }
            for tc in delta.tool_calls.unwrap_or_default() {
                self.tool_call(tc, &mut out);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
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
        if let Some(raw) = &self.finish_reason {
            ending.stop = map_finish_reason(raw).map(|mut reason| {
                if reason == StopReason::EndTurn && self.assembly.has_tool_calls() {
                    reason = StopReason::ToolUse;
                }
                (reason, raw.clone())
            });
        }
        let mut response = finish_response(&self.assembly, &ending);
        if ending.terminal
            && ending.stop.is_none()
            && let Some(raw) = &self.finish_reason
        {
            // An unknown wire value: the reason is derived, the raw string kept.
            response.stop_reason_raw = raw.clone();
        }
        response
    }
}
