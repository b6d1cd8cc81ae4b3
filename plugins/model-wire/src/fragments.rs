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
//!
//! The body itself is kept too ([`KeptBody`]): the transport lends it back after the send, and
//! the next request of the conversation is assembled over it. Its bytes up to the point where
//! the previous messages end depend only on the head (everything before the first message,
//! compared byte for byte) and on those messages, which stay as they were while the revision
//! holds; so the next body keeps them in place and writes only the new messages and the tail.
//! A step then copies no history at all inside the adapter: the body goes from here to the
//! kernel as it lies.

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

/// Where an assembly over a kept body picks up: what the body holds before `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The length of the head, the bytes before the first message.
    head: usize,
    /// Whether the head ends with an element of the messages array (OpenAI's system message).
    head_wrote: bool,
    /// The bytes kept: the head and the messages before `fragments`.
    at: usize,
    /// How many of the rendering's messages are written before `at`.
    fragments: usize,
    /// Whether an element of the messages array is written before `at`.
    wrote: bool,
}

impl Resume {
    /// The head alone: nothing of the messages kept.
    fn head_only(self) -> Resume {
        Resume {
            at: self.head,
            fragments: 0,
            wrote: self.head_wrote,
            ..self
        }
    }
}

/// A body sent for the held conversation, lent back by the transport.
#[derive(Debug)]
pub(crate) struct KeptBody {
    bytes: Vec<u8>,
    resume: Resume,
}

/// A body being assembled: its head written (or kept), the messages from `from` on still to
/// write.
pub(crate) struct BodyAssembly {
    /// The body so far.
    pub(crate) body: Body,
    /// The first message of the rendering not yet in the body.
    pub(crate) from: usize,
    head: usize,
    head_wrote: bool,
    wrote: bool,
}

impl BodyAssembly {
    /// A body that starts with `head` (`head_wrote`: it ends with an element of the messages
    /// array). Over `kept` cut back to where it resumes when `kept` starts with the same
    /// head and its messages are still the first of `rendering`'s; otherwise the head
    /// written into `kept`'s allocation, or into a fresh body from `fresh`.
    pub(crate) fn start(
        head: &[u8],
        head_wrote: bool,
        kept: Option<KeptBody>,
        rendering: &Rendering,
        fresh: impl FnOnce() -> Body,
    ) -> BodyAssembly {
        let mut assembly = BodyAssembly {
            body: Body::default(),
            from: 0,
            head: head.len(),
            head_wrote,
            wrote: head_wrote,
        };
        match kept {
            Some(KeptBody { mut bytes, resume })
                if resume.head == head.len()
                    && resume.head_wrote == head_wrote
                    && resume.fragments <= rendering.len()
                    && resume.at <= bytes.len()
                    && bytes.get(..head.len()) == Some(head) =>
            {
                bytes.truncate(resume.at);
                assembly.body = Body::over(bytes);
                assembly.from = resume.fragments;
                assembly.wrote = resume.wrote;
            }
            Some(KeptBody { mut bytes, .. }) => {
                bytes.clear();
                assembly.body = Body::over(bytes);
                assembly.body.bytes(head);
            }
            None => {
                assembly.body = fresh();
                assembly.body.bytes(head);
            }
        }
        assembly
    }

    /// `,` before every element of the messages array but the first.
    pub(crate) fn element(&mut self) -> &mut Body {
        if std::mem::replace(&mut self.wrote, true) {
            self.body.raw(",");
        }
        &mut self.body
    }

    /// Where a later assembly may pick up: here, with `fragments` messages written.
    pub(crate) fn resume(&self, fragments: usize) -> Resume {
        Resume {
            head: self.head,
            head_wrote: self.head_wrote,
            at: self.body.as_bytes().len(),
            fragments,
            wrote: self.wrote,
        }
    }
}

/// The rendering of the last held conversation an adapter instance rendered (one is enough:
/// an agent's steps come one after another; a second conversation takes its place), and the
/// body last sent for it.
#[derive(Debug, Default)]
pub struct ConversationCache {
    kept: Option<(Held, Rendering)>,
    /// The body last sent, lent back by the transport.
    body: Option<KeptBody>,
    /// Where the body being sent may be picked up, until it comes back.
    sending: Option<Resume>,
}

impl ConversationCache {
    /// The rendering of the first `messages` messages of `session` as `keeper` holds them at
    /// `revision`: the cached one when it still holds, extended by the messages read from
    /// `source` since; `render` renders one message. With it, the body last sent for it to
    /// assemble the next over ([`BodyAssembly`]).
    pub(crate) fn rendering(
        &mut self,
        keeper: &str,
        session: &str,
        revision: u64,
        messages: usize,
        source: &mut dyn ConversationSource,
        mut render: impl FnMut(&MessageView<'_>) -> Result<MessageParts, RenderError>,
    ) -> Result<(&Rendering, Option<KeptBody>), RenderError> {
        let held = Held {
            keeper: keeper.to_owned(),
            session: session.to_owned(),
            revision,
        };
        let mut body = self.body.take();
        if self.kept.as_ref().is_some_and(|(kept, _)| *kept != held) {
            self.kept = None;
        }
        let (_, rendering) = self
            .kept
            .get_or_insert_with(|| (held, Rendering::default()));
        // The kept body holds this rendering's messages only while the rendering grows: one
        // started afresh, or cut back, leaves it its head alone.
        if (rendering.is_empty() || messages < rendering.len())
            && let Some(body) = &mut body
        {
            body.resume = body.resume.head_only();
        }
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
        Ok((rendering, body))
    }

    /// The body about to be sent was assembled from the rendering; `resume` says where the
    /// next may pick it up once [`lent_back`](Self::lent_back).
    pub(crate) fn sending(&mut self, resume: Resume) {
        self.sending = Some(resume);
    }

    /// The transport is done with the body just sent: keep it for the next request of the
    /// conversation (a body of any other request is let go).
    pub fn lent_back(&mut self, bytes: Vec<u8>) {
        if let Some(resume) = self.sending.take()
            && resume.at <= bytes.len()
        {
            self.body = Some(KeptBody { bytes, resume });
        }
    }

    /// Forget what is cached (a message could not be rendered, or the bytes are wanted).
    pub fn clear(&mut self) {
        self.kept = None;
        self.body = None;
        self.sending = None;
    }
}
