//! A request's messages rendered one at a time, and a held conversation's rendering kept
//! between requests.
//!
//! Each wire format turns one message into the parts of the body it contributes (OpenAI: the
//! message objects; Anthropic: the content blocks, merged with a neighbour's of the same role
//! when the body is assembled). A part depends on its message alone, so a conversation the
//! kernel holds ([`keel_protocol::HeldConversation`]) is rendered once per message: the
//! [`ConversationCache`] keeps the parts of the messages already rendered, reads through the
//! kernel only the ones added since, and a step's body is the cached bytes copied in order.
//! The cost of a step then grows with what is new, not with the history.
//!
//! The cache is only ever a copy: it is reused while the kernel's revision is the one it was
//! read at (the revision changes whenever a kept message is replaced or removed) and the
//! conversation has at least as many messages, and is rebuilt from the kernel otherwise.

use std::ops::Range;

use keel_protocol::Role;

use crate::RenderError;
use crate::request::{Body, MessageView};

/// One part of the body a message contributes: a whole JSON value.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    /// The bytes, in the rendering's buffer.
    bytes: Range<usize>,
    /// A tool result (Anthropic puts them first in a user message).
    pub(crate) is_result: bool,
}

/// What one message contributes.
#[derive(Debug, Clone)]
pub(crate) struct Fragment {
    /// Whose message it is.
    pub(crate) role: Role,
    /// Its parts, in order.
    pub(crate) parts: Range<usize>,
    /// What rendering had to change or leave out.
    notes: Vec<String>,
}

/// The parts of one message, as a format's renderer writes them.
#[derive(Debug)]
pub(crate) struct MessageParts {
    role: Role,
    parts: Vec<(Body, bool)>,
    notes: Vec<String>,
}

impl MessageParts {
    /// The parts of a message of `role`, none yet.
    pub(crate) fn new(role: Role) -> MessageParts {
        MessageParts {
            role,
            parts: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A part, written by `write`; `is_result` for a tool result.
    pub(crate) fn part(&mut self, is_result: bool, write: impl FnOnce(&mut Body)) {
        let mut body = Body::default();
        write(&mut body);
        self.parts.push((body, is_result));
    }

    /// A note on what could not be sent as it was.
    pub(crate) fn note(&mut self, note: String) {
        self.notes.push(note);
    }
}

/// Messages rendered one by one into one buffer.
#[derive(Debug, Default)]
pub struct Rendering {
    bytes: Vec<u8>,
    parts: Vec<Part>,
    fragments: Vec<Fragment>,
}

impl Rendering {
    /// `messages`, each rendered by `render`.
    pub(crate) fn of(
        messages: &[MessageView<'_>],
        mut render: impl FnMut(&MessageView<'_>) -> Result<MessageParts, RenderError>,
    ) -> Result<Rendering, RenderError> {
        let mut rendering = Rendering::default();
        for message in messages {
            rendering.push(render(message)?);
        }
        Ok(rendering)
    }

    /// How many messages are rendered.
    pub fn len(&self) -> usize {
        self.fragments.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.fragments.is_empty()
    }

    /// The bytes of every part together.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Add one message's parts.
    pub(crate) fn push(&mut self, message: MessageParts) {
        let first = self.parts.len();
        for (body, is_result) in message.parts {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(body.as_bytes());
            self.parts.push(Part {
                bytes: start..self.bytes.len(),
                is_result,
            });
        }
        self.fragments.push(Fragment {
            role: message.role,
            parts: first..self.parts.len(),
            notes: message.notes,
        });
    }

    /// Keep the first `messages` messages only.
    pub(crate) fn truncate(&mut self, messages: usize) {
        if messages >= self.fragments.len() {
            return;
        }
        self.fragments.truncate(messages);
        let parts = self.fragments.last().map_or(0, |f| f.parts.end);
        self.parts.truncate(parts);
        let bytes = self.parts.last().map_or(0, |p| p.bytes.end);
        self.bytes.truncate(bytes);
    }

    /// The messages, in order.
    pub(crate) fn fragments(&self) -> &[Fragment] {
        &self.fragments
    }

    /// The parts of `fragment`.
    pub(crate) fn parts(&self, fragment: &Fragment) -> &[Part] {
        &self.parts[fragment.parts.clone()]
    }

    /// The bytes of `part`.
    pub(crate) fn part_bytes(&self, part: &Part) -> &[u8] {
        &self.bytes[part.bytes.clone()]
    }

    /// Every note, in message order.
    pub(crate) fn notes(&self) -> Vec<String> {
        self.fragments
            .iter()
            .flat_map(|f| f.notes.iter().cloned())
            .collect()
    }
}

/// Where a held conversation's messages are read from: the kernel's `keel.conversation`.
pub trait ConversationSource {
    /// Messages `from..to` of the conversation the request being served names, as a JSON
    /// array of `Message`s.
    fn read_conversation(&mut self, from: usize, to: usize) -> Result<String, String>;
}

/// Which held conversation a rendering is of, and at which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    keeper: String,
    session: String,
    revision: u64,
}

/// The rendering of the last held conversation an adapter instance rendered (one is enough:
/// an agent's steps come one after another; a second conversation takes its place).
#[derive(Debug, Default)]
pub struct ConversationCache {
    kept: Option<(Held, Rendering)>,
}

impl ConversationCache {
    /// The rendering of the first `messages` messages of `session` as `keeper` holds them at
    /// `revision`: the cached one when it still holds, extended by the messages read from
    /// `source` since; `render` renders one message.
    pub(crate) fn rendering(
        &mut self,
        keeper: &str,
        session: &str,
        revision: u64,
        messages: usize,
        source: &mut dyn ConversationSource,
        mut render: impl FnMut(&MessageView<'_>) -> Result<MessageParts, RenderError>,
    ) -> Result<&Rendering, RenderError> {
        let held = Held {
            keeper: keeper.to_owned(),
            session: session.to_owned(),
            revision,
        };
        if self.kept.as_ref().is_some_and(|(kept, _)| *kept != held) {
            self.kept = None;
        }
        let (_, rendering) = self
            .kept
            .get_or_insert_with(|| (held, Rendering::default()));
        rendering.truncate(messages);
        let from = rendering.len();
        // Read even when nothing is new: the kernel answers only the call it handed this
        // conversation to, so a request that names it without the kernel's say-so (a plugin
        // calling the model service itself, naming the agent's conversation) gets nothing
        // from the cache either.
        let text = source
            .read_conversation(from, messages)
            .map_err(|e| RenderError::Invalid(format!("cannot read the conversation: {e}")))?;
        {
            let views: Vec<MessageView<'_>> = serde_json::from_str(&text)
                .map_err(|e| RenderError::Invalid(format!("the conversation's messages: {e}")))?;
            if views.len() != messages - from {
                return Err(RenderError::Invalid(format!(
                    "asked for messages {from}..{messages} of the conversation, read {}",
                    views.len()
                )));
            }
            for view in &views {
                rendering.push(render(view)?);
            }
        }
        Ok(rendering)
    }

    /// Forget what is cached (a message could not be rendered, or the bytes are wanted).
    pub fn clear(&mut self) {
        self.kept = None;
    }
}
