//! A model request read in place: the [`ModelRequest`](keel_protocol::ModelRequest) JSON as
//! it arrived, its strings kept as the escaped JSON text they already are.
//!
//! The conversation is most of a request (megabytes in a long turn), and everything an
//! adapter does with its strings is copy them into the vendor's body. Parsing them into
//! Rust strings and encoding them again costs two passes over every byte with their
//! allocations, each step; [`RequestView`] validates the JSON once (serde_json's scan) and
//! keeps each string as a [`JsonText`] slice of the input, which the renderers copy into the
//! body verbatim. Only what a renderer must look inside is decoded: tool-call arguments (is it
//! JSON?) and the role and block tags.

use std::borrow::Cow;

use keel_protocol::Role;
use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::RenderError;

/// A JSON string token exactly as it appears in the request: quotes and escapes included,
/// so it is valid JSON wherever it is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonText<'a>(&'a str);

impl<'a> JsonText<'a> {
    /// The token of the empty string.
    pub const EMPTY: JsonText<'static> = JsonText("\"\"");

    /// The token, quotes included.
    pub fn token(&self) -> &'a str {
        self.0
    }

    /// What lies between the quotes, still escaped: contents of several tokens joined inside
    /// one pair of quotes make one valid token.
    pub fn escaped(&self) -> &'a str {
        &self.0[1..self.0.len() - 1]
    }

    /// Whether the string is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 2
    }

    /// The string itself, unescaped (borrowed when it has no escapes).
    pub fn decode(&self) -> Result<Cow<'a, str>, RenderError> {
        if !self.0.contains('\\') {
            return Ok(Cow::Borrowed(self.escaped()));
        }
        serde_json::from_str::<String>(self.0)
            .map(Cow::Owned)
            .map_err(|e| RenderError::Invalid(format!("a string of the request: {e}")))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for JsonText<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?;
        let text = raw.get();
        // serde_json hands over a value's text without surrounding whitespace, and a string's
        // text has passed its checks (escapes, no raw control characters).
        if text.len() >= 2 && text.starts_with('"') && text.ends_with('"') {
            Ok(JsonText(text))
        } else {
            Err(D::Error::custom(format!(
                "expected a string, found `{}`",
                text.chars().take(40).collect::<String>()
            )))
        }
    }
}

/// One block of a message, its strings as tokens (see [`keel_protocol::Block`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockView<'a> {
    /// Plain text.
    Text(JsonText<'a>),
    /// The model's reasoning (never sent back).
    Thinking(JsonText<'a>),
    /// A tool call.
    ToolCall {
        /// The call's id.
        id: JsonText<'a>,
        /// The tool's name.
        name: JsonText<'a>,
        /// The arguments as they arrived (a string holding JSON text, possibly broken).
        arguments: JsonText<'a>,
    },
    /// A tool result.
    ToolResult {
        /// The id of the call it answers.
        call_id: JsonText<'a>,
        /// What the model reads.
        content: JsonText<'a>,
        /// Whether the call failed or was refused.
        is_error: bool,
    },
}

/// [`keel_protocol::Block`]'s JSON (`{"type": …, fields}`) read without buffering, so the
/// strings stay borrowed.
#[derive(Deserialize)]
struct BlockFields<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<JsonText<'a>>,
    #[serde(borrow, default)]
    id: Option<JsonText<'a>>,
    #[serde(borrow, default)]
    name: Option<JsonText<'a>>,
    #[serde(borrow, default)]
    arguments: Option<JsonText<'a>>,
    #[serde(borrow, default)]
    call_id: Option<JsonText<'a>>,
    #[serde(borrow, default)]
    content: Option<JsonText<'a>>,
    #[serde(default)]
    is_error: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for BlockView<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = BlockFields::<'a>::deserialize(d)?;
        let need = |field: Option<JsonText<'a>>, name: &str| {
            field.ok_or_else(|| D::Error::custom(format!("a `{}` block needs `{name}`", f.kind)))
        };
        Ok(match f.kind.as_ref() {
            "text" => BlockView::Text(need(f.text, "text")?),
            "thinking" => BlockView::Thinking(need(f.text, "text")?),
            "tool_call" => BlockView::ToolCall {
                id: need(f.id, "id")?,
                name: need(f.name, "name")?,
                arguments: need(f.arguments, "arguments")?,
            },
            "tool_result" => BlockView::ToolResult {
                call_id: need(f.call_id, "call_id")?,
                content: need(f.content, "content")?,
                is_error: f.is_error,
            },
            other => {
                return Err(D::Error::custom(format!(
                    "unknown block type `{other}`; expected text, thinking, tool_call or \
                     tool_result"
                )));
            }
        })
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MessageView<'a> {
    /// Who said it.
    pub role: Role,
    /// What was said, in order.
    #[serde(borrow)]
    pub content: Vec<BlockView<'a>>,
}

/// One tool offered to the model.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolView<'a> {
    /// Its name.
    #[serde(borrow)]
    pub name: JsonText<'a>,
    /// What it does.
    #[serde(borrow)]
    pub description: JsonText<'a>,
    /// Its input's JSON Schema, as JSON text.
    #[serde(borrow)]
    pub input_schema: &'a RawValue,
}

/// A [`keel_protocol::ModelRequest`] read in place.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestView<'a> {
    /// The model; absent or empty: the adapter's own.
    #[serde(borrow, default)]
    pub model: Option<JsonText<'a>>,
    /// The system prompt.
    #[serde(borrow)]
    pub system: JsonText<'a>,
    /// The conversation, oldest first.
    #[serde(borrow)]
    pub messages: Vec<MessageView<'a>>,
    /// The tools, sorted by name.
    #[serde(borrow)]
    pub tools: Vec<ToolView<'a>>,
    /// The most output tokens the model may produce.
    pub max_tokens: u32,
    /// Whether the caller compacts on a length refusal itself.
    #[serde(default)]
    pub compacts_on_overflow: bool,
    /// The conversation by reference: where the kernel holds it, when the request carries no
    /// messages of its own ([`crate::fragments`]).
    #[serde(default)]
    pub conversation: Option<keel_protocol::ConversationRef>,
    /// The size of the JSON it was read from, which sizes the body written from it.
    #[serde(skip)]
    source_len: usize,
}

impl<'a> RequestView<'a> {
    /// Read `json`, a `ModelRequest`.
    pub fn parse(json: &'a str) -> Result<RequestView<'a>, RenderError> {
        let mut view: RequestView<'a> = serde_json::from_str(json)
            .map_err(|e| RenderError::Invalid(format!("the request is not a ModelRequest: {e}")))?;
        view.source_len = json.len();
        Ok(view)
    }

    /// An empty body with room for what is written from this request and `messages` bytes of
    /// rendered messages.
    pub(crate) fn body(&self, messages: usize) -> Body {
        Body::with_capacity(self.source_len + self.source_len / 16 + messages + 1024)
    }

    /// The held conversation the request names instead of carrying messages, if it does.
    pub fn held(
        &self,
    ) -> Option<(
        &keel_protocol::ConversationRef,
        &keel_protocol::HeldConversation,
    )> {
        let named = self.conversation.as_ref()?;
        Some((named, named.held.as_ref()?))
    }

    /// The model the request names, if it names one.
    pub fn model(&self) -> Option<JsonText<'a>> {
        self.model.filter(|m| !m.is_empty())
    }
}

/// A JSON body written piece by piece: tokens of the request copied in, keel's own values
/// encoded.
#[derive(Debug, Default)]
pub(crate) struct Body(Vec<u8>);

impl Body {
    /// An empty body with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Body {
        Body(Vec::with_capacity(capacity))
    }

    /// A body that goes on from `bytes`.
    pub(crate) fn over(bytes: Vec<u8>) -> Body {
        Body(bytes)
    }

    /// JSON text written as is (structure, or a token of the request).
    pub(crate) fn raw(&mut self, text: &str) -> &mut Body {
        self.0.extend_from_slice(text.as_bytes());
        self
    }

    /// Bytes already JSON (a rendered part), written as they are.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> &mut Body {
        self.0.extend_from_slice(bytes);
        self
    }

    /// `"key":`.
    pub(crate) fn key(&mut self, key: &str) -> &mut Body {
        self.value(key).raw(":")
    }

    /// A value of keel's own, encoded.
    pub(crate) fn value(&mut self, value: &(impl Serialize + ?Sized)) -> &mut Body {
        // Writing into a Vec fails only for a value serde cannot encode; keel's strings,
        // numbers and booleans always can.
        let _ = serde_json::to_writer(&mut self.0, value);
        self
    }

    /// `"model":` and the model the request names, or else the adapter's `default`.
    pub(crate) fn model(
        &mut self,
        req: &RequestView<'_>,
        default: &str,
    ) -> Result<&mut Body, RenderError> {
        self.key("model");
        match req.model() {
            Some(model) => Ok(self.raw(model.token())),
            None if !default.is_empty() => Ok(self.value(default)),
            None => Err(RenderError::NoModel),
        }
    }

    /// A JSON array of `items`, each written by `write`.
    pub(crate) fn array<T>(
        &mut self,
        items: &[T],
        mut write: impl FnMut(&mut Body, &T),
    ) -> &mut Body {
        self.raw("[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.raw(",");
            }
            write(self, item);
        }
        self.raw("]")
    }

    /// One string token made of `parts` joined by `separator` (both escaped text).
    pub(crate) fn joined(&mut self, parts: &[JsonText<'_>], separator: &str) -> &mut Body {
        self.raw("\"");
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                self.raw(separator);
            }
            self.raw(part.escaped());
        }
        self.raw("\"")
    }

    /// The bytes so far.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}
