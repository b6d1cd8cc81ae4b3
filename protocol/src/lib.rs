//! keel's neutral trajectory vocabulary (principle 8 of the design): everything that crosses
//! between the kernel, the agent plugins and the CLI as JSON, in keel's own words. Model
//! adapters translate each vendor's wire dialect to and from these types at request time;
//! the session log stores them; nothing here knows about a vendor.
//!
//! This crate is data only — no I/O, no policy — so guests (wasm32-wasip2), the kernel and
//! the CLI can share it.

use serde::{Deserialize, Serialize};

mod wit_conversions;

/// serde_json as this crate uses it, for [`wit_conversions!`]'s expansion in crates that may not
/// name it.
#[doc(hidden)]
pub use serde_json as __serde_json;

/// Service names the agent plugins provide and the kernel and CLI call.
pub mod services {
    /// A model adapter: method `complete` takes a [`ModelRequest`](crate::ModelRequest) and
    /// returns a [`ModelResponse`](crate::ModelResponse).
    pub const MODEL: &str = "model";
    /// The tool registry: methods `list` (→ `Vec<ToolDef>`) and `resolve`
    /// ([`ResolveRequest`](crate::ResolveRequest) → [`Resolution`](crate::Resolution)).
    pub const TOOL_REGISTRY: &str = "tool-registry";
    /// The session log: methods `append`, `read`, `list`.
    pub const SESSION_LOG: &str = "session-log";
    /// The agent loop: method `turn` ([`TurnRequest`](crate::TurnRequest) →
    /// [`TurnReport`](crate::TurnReport)).
    pub const AGENT: &str = "agent";
    /// A claim verifier: method `verify` ([`VerifyRequest`](crate::VerifyRequest) →
    /// `Option<Verdict>`).
    pub const VERIFIER: &str = "verifier";
    /// Memory of earlier sessions: method `recall` ([`RecallRequest`](crate::RecallRequest)
    /// → `[RecalledEntry]`, at most five, never one recalled before in the session).
    pub const MEMORY: &str = "memory";
    /// Compaction: method `summarize` ([`SummarizeRequest`](crate::SummarizeRequest) → the
    /// summary as a JSON string).
    pub const COMPACTION: &str = "compaction";
    /// Served by the kernel itself: method `fragments` (payload ignored) returns the prompt
    /// fragments plugins added, as `[PromptFragment]` sorted by plugin, then id; method
    /// `fence` ([`FenceRequest`](crate::FenceRequest) → string) returns text sanitized and
    /// fenced as data, the same way a tool's network result is.
    pub const PROMPT: &str = "keel.prompt";
    /// Served by the kernel itself: child agents. Method `open`
    /// ([`OpenChild`](crate::OpenChild) → [`ChildScope`](crate::ChildScope)) opens a child
    /// agent for the tool call the caller serves; the caller's `agent.complete` and
    /// `agent.dispatch` then act as that child, with the child's tools only.
    pub const AGENTS: &str = "keel.agents";
    /// Served by the kernel itself: the conversation a model request names. Method `read`
    /// ([`ConversationRead`](crate::ConversationRead) → a JSON array of
    /// [`Message`](crate::Message)s) answers only the plugin serving a `model.complete` call
    /// whose request names a held conversation ([`HeldConversation`](crate::HeldConversation)),
    /// and only that conversation's messages.
    pub const CONVERSATION: &str = "keel.conversation";
    /// Served by the kernel itself: a workspace file as the editor driving the session holds
    /// it (an ACP client that offers `fs/read_text_file`), unsaved changes included. Method
    /// `read` ([`EditorRead`](crate::EditorRead) → [`EditorText`](crate::EditorText)), for a
    /// plugin granted the whole workspace; `text` is `None` without such an editor.
    pub const EDITOR: &str = "keel.editor";
    /// The first version of the [`MODEL`] service whose providers read a named conversation
    /// themselves: the kernel hands such a provider the request with
    /// [`ConversationRef::held`](crate::ConversationRef::held) set and `messages` empty, and
    /// the provider reads through [`CONVERSATION`] only the messages it has not rendered yet.
    /// Older providers get the messages put into the request.
    pub const MODEL_READS_CONVERSATIONS: &str = "1.1.0";
}

/// `keel.agents` `open`: a child agent for the tool call being served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenChild {
    /// A short name for the child, shown to the person (cut to 40 characters).
    pub label: String,
    /// The tools the child asks for; `None`: every read-only tool its parent has.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
}

/// `keel.agents` `open`'s answer: the child as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildScope {
    /// The kernel's number for the child, unique in the session.
    pub child: u64,
    /// Its label as shown to the person.
    pub label: String,
    /// 1 for a child of the main agent, 2 for its child, …
    pub depth: u32,
    /// The id of the tool call the child serves.
    pub parent_call: String,
    /// The tools the child may call.
    pub tools: Vec<String>,
    /// Tools asked for and not given, each with why.
    #[serde(default)]
    pub withheld: Vec<String>,
}

/// A child agent's session-log entry, emitted on [`topics::SUBAGENT_EVENT`]; the session log
/// files it under the parent's call as a [`SessionEvent::Subagent`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentEvent {
    /// The id of the tool call the child serves.
    pub parent_call: String,
    /// The kernel's number for the child.
    pub child: u64,
    /// Its label.
    pub label: String,
    /// What happened in the child.
    pub event: SessionEvent,
}

/// `keel.editor` `read`: a file of the workspace, by its workspace-relative path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditorRead {
    /// Workspace-relative, without `..`.
    pub path: String,
}

/// `keel.editor` `read`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditorText {
    /// The file's text as the editor holds it; `None` when no editor drives the session, it
    /// offers no file reads, or it could not answer (the file is then read from the disk).
    pub text: Option<String>,
}

/// `keel.prompt` `fence`: text that is data, not instructions (memory, a project's files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRequest {
    /// Where it came from, shown in the fence's label.
    pub source: String,
    /// The text.
    pub text: String,
}

/// `memory` `recall`: what the person just said, to recall entries for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallRequest {
    /// The session, so an entry is recalled once per session.
    pub session: String,
    /// The person's input of the turn.
    pub input: String,
}

/// `compaction` `summarize`: the oldest part of a conversation, to be replaced by a summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummarizeRequest {
    /// The messages to summarize, oldest first.
    pub messages: Vec<Message>,
    /// What the person asked the summary to keep (`/compact FOCUS`).
    #[serde(default)]
    pub focus: String,
    /// The transcript shown to the model at most, in characters (the newest part is kept).
    pub budget_chars: usize,
}

/// Entries one `memory` `recall` returns at most; the agent loop takes no more.
pub const RECALL_MAX: usize = 5;

/// One entry `memory` `recall` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecalledEntry {
    /// The file it is in, as `project/TOPIC.md` or `user/TOPIC.md`.
    pub source: String,
    /// The entry's text.
    pub text: String,
}

/// A piece of the system prompt a plugin added (the `prompt` import), as the kernel's
/// [`services::PROMPT`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptFragment {
    /// The plugin that added it.
    pub plugin: String,
    /// Its id, unique within the plugin.
    pub id: String,
    /// The text.
    pub text: String,
}

/// Event topics on the kernel's bus.
pub mod topics {
    /// A live fragment of the model's output ([`StreamDelta`](crate::StreamDelta)); for display
    /// only, never logged (the complete message is).
    pub const MODEL_DELTA: &str = "model.delta";
    /// The agent loop's compaction: `{"session", "state": "started" | "failed" | "tripped",
    /// "detail"}` (`started` also says its `trigger`: `manual` or `auto`), for the display and
    /// the `pre-compact` hooks (the result itself is a `session.event` `compacted`).
    pub const COMPACTION_STATUS: &str = "compaction.status";
    /// A session-log entry ([`SessionEvent`](crate::SessionEvent)) to be appended.
    pub const SESSION_EVENT: &str = "session.event";
    /// A child agent's entry ([`SubagentEvent`](crate::SubagentEvent)); the kernel lets only
    /// the plugin serving that child's call emit it, naming that call and child.
    pub const SUBAGENT_EVENT: &str = "subagent.event";
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person, or keel speaking for the person (notices, verdicts, tool results).
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's visible reasoning, stored as text without any vendor signature.
    Thinking {
        /// The reasoning text.
        text: String,
    },
    /// A tool call the model made.
    ToolCall {
        /// The call's id, unique within the session.
        id: String,
        /// The tool name as the model wrote it.
        name: String,
        /// The arguments exactly as they arrived on the wire (JSON text, possibly broken).
        arguments: String,
    },
    /// The result of a tool call, sent back to the model.
    ToolResult {
        /// The id of the call this answers.
        call_id: String,
        /// What the model reads.
        content: String,
        /// Whether the call failed or was refused.
        is_error: bool,
    },
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said, in order.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message holding one text block.
    pub fn user_text(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// The text blocks joined by newlines.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        parts.join("\n")
    }

    /// The tool calls, in order: `(id, name, raw arguments)`.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolCall {
                id,
                name,
                arguments,
            } => Some((id.as_str(), name.as_str(), arguments.as_str())),
            _ => None,
        })
    }
}

/// What a tool may do when it runs: the gates weigh it when no exec policy decides a call.
/// The ABI carries it as flags (`tool-capabilities`); the constants and `|` read the same.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(default)]
pub struct ToolCapabilities {
    /// The tool reads files.
    pub reads_files: bool,
    /// The tool creates, changes or removes files.
    pub writes_files: bool,
    /// The tool runs commands or code.
    pub executes_code: bool,
    /// The tool talks to the network.
    pub network: bool,
}

impl ToolCapabilities {
    /// Reads files.
    pub const READS_FILES: Self = Self {
        reads_files: true,
        ..Self::empty()
    };
    /// Creates, changes or removes files.
    pub const WRITES_FILES: Self = Self {
        writes_files: true,
        ..Self::empty()
    };
    /// Runs commands or code.
    pub const EXECUTES_CODE: Self = Self {
        executes_code: true,
        ..Self::empty()
    };
    /// Talks to the network.
    pub const NETWORK: Self = Self {
        network: true,
        ..Self::empty()
    };

    /// None.
    pub const fn empty() -> Self {
        ToolCapabilities {
            reads_files: false,
            writes_files: false,
            executes_code: false,
            network: false,
        }
    }

    /// Whether every capability of `other` is one of these.
    pub fn contains(self, other: Self) -> bool {
        self | other == self
    }

    /// From the ABI's `tool-capabilities` flags as bits (`bits()` of the bindings): one bit
    /// per flag in the WIT's order, unknown bits ignored.
    pub const fn from_abi_bits(bits: u8) -> Self {
        ToolCapabilities {
            reads_files: bits & 1 != 0,
            writes_files: bits & 2 != 0,
            executes_code: bits & 4 != 0,
            network: bits & 8 != 0,
        }
    }

    /// As the ABI's `tool-capabilities` bits ([`from_abi_bits`](Self::from_abi_bits)).
    pub const fn abi_bits(self) -> u8 {
        self.reads_files as u8
            | (self.writes_files as u8) << 1
            | (self.executes_code as u8) << 2
            | (self.network as u8) << 3
    }
}

impl std::ops::BitOr for ToolCapabilities {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        ToolCapabilities {
            reads_files: self.reads_files || other.reads_files,
            writes_files: self.writes_files || other.writes_files,
            executes_code: self.executes_code || other.executes_code,
            network: self.network || other.network,
        }
    }
}

impl std::ops::BitOrAssign for ToolCapabilities {
    fn bitor_assign(&mut self, other: Self) {
        *self = *self | other;
    }
}

/// A tool a plugin offers: the one description of a tool the kernel registers, the tool
/// registry lists and the agent loop offers (the ABI's `tool-spec` record, field for field).
/// What the model is shown of it is its [`ToolDef`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique tool name.
    pub name: String,
    /// What the tool does, shown to the model.
    pub description: String,
    /// JSON Schema of the input, as JSON text (as it crosses the plugin ABI).
    pub input_schema: String,
    /// What the tool may do.
    #[serde(default)]
    pub capabilities: ToolCapabilities,
    /// True when calls may run concurrently with other parallel-safe calls.
    #[serde(default)]
    pub parallel_safe: bool,
}

impl ToolSpec {
    /// A tool named `name` with a description for the model and the JSON Schema of its input
    /// as JSON text; no capabilities and not parallel-safe until said otherwise.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: impl Into<String>,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: input_schema.into(),
            capabilities: ToolCapabilities::empty(),
            parallel_safe: false,
        }
    }

    /// Sets what the tool may do when it runs.
    #[must_use]
    pub fn capabilities(mut self, capabilities: ToolCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Sets whether calls may run concurrently with other parallel-safe calls.
    #[must_use]
    pub fn parallel_safe(mut self, parallel_safe: bool) -> Self {
        self.parallel_safe = parallel_safe;
        self
    }

    /// What the model is shown; a schema that does not parse becomes `null`.
    pub fn def(&self) -> ToolDef {
        ToolDef {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: serde_json::from_str(&self.input_schema)
                .unwrap_or(serde_json::Value::Null),
        }
    }
}

/// A tool as presented to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: serde_json::Value,
}

/// A request for the next assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The model name; empty means the adapter's configured model.
    #[serde(default)]
    pub model: String,
    /// The system prompt.
    pub system: String,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call, sorted by name.
    pub tools: Vec<ToolDef>,
    /// The most output tokens the model may produce.
    pub max_tokens: u32,
    /// The caller compacts the conversation itself when the provider refuses it as too long:
    /// the adapter then answers such a refusal at once with an error beginning with
    /// [`CONTEXT_OVERFLOW`] instead of shrinking this one request (which the next request
    /// would repeat).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compacts_on_overflow: bool,
    /// The conversation by reference: the agent sends `messages` empty and names the
    /// messages it keeps in its kernel-held state (under [`conversation_key`]); the kernel
    /// puts them in `messages` before the model adapter sees the request, or, for an adapter
    /// that reads conversations itself ([`services::MODEL_READS_CONVERSATIONS`]), says where
    /// they are held ([`ConversationRef::held`]). The history then crosses a component
    /// boundary at most once a step, not on its way to the adapter too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationRef>,
}

/// The conversation of a [`ModelRequest`] named, not carried: the first `messages` messages
/// of `session` that the calling agent keeps in its kernel-held state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationRef {
    /// The session whose messages these are.
    pub session: String,
    /// How many, from the first.
    pub messages: usize,
    /// Set by the kernel only, for an adapter that reads the conversation itself: where it is
    /// held. Whatever an agent puts here is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldConversation>,
}

/// Where a named conversation is held, as the kernel attests it to the model adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldConversation {
    /// The plugin that keeps it (the agent that asked).
    pub keeper: String,
    /// The kernel's conversation revision: it changes whenever any kept message is replaced or
    /// removed (a compaction, a rewind), never when one is added. While it is unchanged, the
    /// first messages of a conversation are the ones an adapter read before, so a rendering
    /// of them may be reused.
    pub revision: u64,
}

/// `keel.conversation` `read`: messages `from..to` of the conversation the request being
/// served names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationRead {
    /// The first message, counted from 0.
    pub from: usize,
    /// One past the last.
    pub to: usize,
}

/// How every [`conversation_key`] begins.
pub const CONVERSATION_KEY_PREFIX: &str = "m/";

/// The kernel-held state key under which an agent keeps message `index` of `session`'s
/// conversation: the key order is the conversation's order.
pub fn conversation_key(session: &str, index: usize) -> String {
    format!("{CONVERSATION_KEY_PREFIX}{session}/{index:08}")
}

/// How a model adapter's error begins when the provider refused a request that asked for it
/// (`compacts_on_overflow`) as longer than the model's context window.
pub const CONTEXT_OVERFLOW: &str = "the request is longer than the model's context window";

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It hit the output limit (`length` or `max_tokens` on the wire): the last block may be
    /// cut off.
    MaxTokens,
    /// A stop sequence matched.
    StopSequence,
    /// The provider refused to continue (content filter, refusal).
    Refusal,
    /// The stream ended without its terminal event; what arrived is presented as is.
    Interrupted,
}

impl StopReason {
    /// Whether the output may have been cut off mid-block.
    pub fn is_truncation(self) -> bool {
        matches!(self, StopReason::MaxTokens)
    }
}

/// Token counts of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

/// The assistant message a model call produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The assistant message (role assistant).
    pub message: Message,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The stop reason exactly as the wire spelled it (`length`, `max_tokens`, …), or what
    /// keel derived it from when the wire gave none.
    #[serde(default)]
    pub stop_reason_raw: String,
    /// Token counts.
    #[serde(default)]
    pub usage: Usage,
    /// The model that answered, as the provider named it.
    #[serde(default)]
    pub model: String,
    /// Retries the adapter made before this answer (for display and the log).
    #[serde(default)]
    pub retries: u32,
}

/// A live fragment of the model's output, emitted on [`topics::MODEL_DELTA`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamDelta {
    /// More assistant text.
    Text {
        /// The fragment.
        text: String,
    },
    /// More reasoning text.
    Thinking {
        /// The fragment.
        text: String,
    },
    /// A tool call began.
    ToolCallStart {
        /// The call's id.
        id: String,
        /// The tool name.
        name: String,
    },
    /// The adapter is retrying after a failure.
    Retry {
        /// Which attempt comes next (1-based).
        attempt: u32,
        /// Why, and how long it waits.
        reason: String,
    },
}

/// How a dispatched tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// The tool ran and succeeded.
    Ok,
    /// The tool ran and reported an error.
    Error,
    /// A gate refused the call (policy, guard, approval denied); the tool did not run.
    Refused,
    /// The call's arguments were cut off by the output limit; it did not run and does not
    /// count as an attempt.
    NotExecuted,
}

/// A command the kernel ran on a tool's behalf during a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRecord {
    /// The command line.
    pub command: String,
    /// Its exit code; `None` when it was killed or timed out.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Where it ran: `bubblewrap workspace-write`, `… with network through keel's gate`,
    /// `outside the sandbox (approved)`, `not sandboxed (…)`. Absent in logs written before
    /// it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// What the kernel's dispatcher returns for one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// The call's id.
    pub call_id: String,
    /// The tool that ran (after name resolution), or the name as written when none did.
    pub tool: String,
    /// How it ended.
    pub status: OutcomeStatus,
    /// What the model reads: sanitized, truncated with a pointer to the spilled full text.
    pub content: String,
    /// Commands the kernel ran for this call, in order.
    #[serde(default)]
    pub exec: Vec<ExecRecord>,
    /// Where the full output was spilled, when it was truncated.
    #[serde(default)]
    pub spill: Option<String>,
}

impl ToolOutcome {
    /// Whether the model should see this result as an error.
    pub fn is_error(&self) -> bool {
        self.status != OutcomeStatus::Ok
    }
}

/// Asking the tool registry to resolve a tool name the model wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolveRequest {
    /// The name as written.
    pub name: String,
}

/// The tool registry's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Resolution {
    /// The canonical name of a registered tool.
    Found {
        /// The registered name.
        name: String,
    },
    /// No tool matched; the closest names (edit distance ≤ 3), best first.
    Unknown {
        /// Suggestions.
        did_you_mean: Vec<String>,
    },
    /// The tool exists but its definition was invalid and it is a fail-closed placeholder.
    Disabled {
        /// The registered name.
        name: String,
        /// What was wrong with the definition.
        reason: String,
    },
}

/// Asking the agent loop to run one turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRequest {
    /// The session this turn belongs to.
    pub session: String,
    /// What the person typed.
    pub input: String,
}

/// `agent` `load`: seed a session's conversation (resume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadRequest {
    /// The session to seed.
    pub session: String,
    /// Its conversation so far.
    pub messages: Vec<Message>,
    /// The context window a provider's refusal showed earlier in the session, if one did
    /// ([`SessionEvent::Compacted`]'s `context_window`).
    #[serde(default)]
    pub context_window: Option<u64>,
}

/// `agent` `compact`: compact a session's conversation now (`/compact FOCUS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactRequest {
    /// The session.
    pub session: String,
    /// What the summary should keep in particular; may be empty.
    #[serde(default)]
    pub focus: String,
}

/// `agent` `compact`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compacted {
    /// The messages replaced by the summary.
    pub replaced: u64,
    /// About how many tokens the conversation took before.
    pub tokens_before: u64,
    /// And after.
    pub tokens_after: u64,
}

/// Why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnEnd {
    /// The model answered without asking for tools.
    Completed,
    /// The model's stream broke off after content arrived: what arrived is kept as the
    /// answer, but it may be incomplete.
    Interrupted,
    /// The turn reached its step limit.
    StepLimit,
    /// The loop guard stopped it (too many consecutive failures).
    LoopGuard,
    /// The person cancelled it (Ctrl-C).
    Cancelled,
    /// The model could not be reached or answered with an error.
    ModelError,
}

/// What the agent loop reports when a turn ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnReport {
    /// Why it ended.
    pub end: TurnEnd,
    /// The final assistant text.
    pub text: String,
    /// Model calls made.
    pub steps: u32,
    /// Tool calls dispatched.
    pub tool_calls: u32,
    /// Tokens used over the turn.
    pub usage: Usage,
    /// A human-readable detail (the model error, the guard's reason).
    #[serde(default)]
    pub detail: String,
}

/// `hooks` `session-start`: a session began; the person's session-start hooks run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookSessionStart {
    /// The session.
    pub session: String,
    /// `startup`, `resume` or `clear`.
    pub source: String,
}

/// What the person's session-start hooks said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookContext {
    /// Text for the model's first turn; may be empty.
    pub context: String,
    /// Hooks that failed, each in a line for the person.
    pub errors: Vec<String>,
}

/// How a tool call the post-tool-use hooks hear of ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookToolStatus {
    /// It succeeded.
    #[default]
    Ok,
    /// It failed or was refused.
    Error,
}

/// `hooks` `post-tool-use`: a tool call that just ran, before its result goes back to the
/// agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookToolUse {
    /// The tool.
    pub tool: String,
    /// Its input.
    pub arguments: serde_json::Value,
    /// Its (redacted) result.
    pub result: String,
    /// How it ended.
    pub status: HookToolStatus,
}

/// `hooks` `user-prompt-submit`: what the person typed, before it goes to the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookPrompt {
    /// The session.
    pub session: String,
    /// The prompt.
    pub prompt: String,
}

/// What the person's user-prompt-submit hooks decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptVerdict {
    /// Whether a hook held the prompt back.
    pub blocked: bool,
    /// Why, when it did.
    #[serde(default)]
    pub reason: String,
    /// Text a hook added for the model; may be empty.
    #[serde(default)]
    pub context: String,
}

/// `hooks` `stop`: a turn ended; the person's stop hooks may ask the agent to go on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookStop {
    /// The session.
    pub session: String,
    /// Whether the turn that ended was one a stop hook asked for.
    pub stop_hook_active: bool,
}

/// What the person's stop hooks decided.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopVerdict {
    /// Hooks that failed, each in a line for the person.
    pub errors: Vec<String>,
    /// Whether a hook asks the agent to go on.
    pub go_on: bool,
    /// Why, for the model.
    pub reason: String,
}

/// Asking a verifier to check the claims of a finished turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyRequest {
    /// The session.
    pub session: String,
    /// The final assistant text of the turn.
    pub final_text: String,
    /// The tool calls of the turn with their outcomes, in order.
    pub calls: Vec<TurnCall>,
}

/// One tool call of a turn as a verifier sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnCall {
    /// The call's id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments (parsed).
    pub input: serde_json::Value,
    /// How it ended.
    pub outcome: ToolOutcome,
}

/// A verifier's finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// `verified-pass`, `verified-fail`, `verify-error` or `unsubstantiated`.
    pub status: VerdictStatus,
    /// What was claimed: `tests` or `build`.
    pub dimension: String,
    /// The phrase that made the claim.
    pub claim: String,
    /// The replayed command, when there was one.
    #[serde(default)]
    pub command: Option<String>,
    /// The call whose input was replayed.
    #[serde(default)]
    pub call_id: Option<String>,
    /// The replay's exit code.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The head of the replay's output.
    #[serde(default)]
    pub evidence: String,
    /// `test-failure`, `build-failure`, `timeout`, `refused`, … when not a pass.
    #[serde(default)]
    pub failure_type: Option<String>,
}

/// A verifier's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictStatus {
    /// The replay passed.
    VerifiedPass,
    /// The replay failed.
    VerifiedFail,
    /// The replay could not run.
    VerifyError,
    /// A claim with no verification command behind it.
    Unsubstantiated,
}

/// One entry of a session log, as the agent loop emits it on [`topics::SESSION_EVENT`].
/// The log plugin adds the sequence number and time when it appends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionEvent {
    /// A session began (or was resumed).
    SessionStarted {
        /// The session id.
        session: String,
        /// The workspace path.
        workspace: String,
        /// The model, as configured.
        model: String,
    },
    /// The system prompt and tools of the next model request, when they changed.
    Context {
        /// The session id.
        session: String,
        /// The system prompt.
        system: String,
        /// The tools offered.
        tools: Vec<ToolDef>,
    },
    /// A message added to the conversation (user input, assistant answer, tool results,
    /// notices and verdicts appended at the tail).
    Message {
        /// The session id.
        session: String,
        /// The message.
        message: Message,
        /// For assistant messages: why the model stopped.
        #[serde(default)]
        stop_reason: Option<StopReason>,
        /// For assistant messages: token counts.
        #[serde(default)]
        usage: Option<Usage>,
    },
    /// A tool call's outcome, with the details the model does not see.
    ToolOutcome {
        /// The session id.
        session: String,
        /// The outcome.
        outcome: ToolOutcome,
    },
    /// The agent loop is about to run these tool calls. Recorded through session-log's
    /// `started` (a call that returns once the line is written) before any of them starts, so
    /// a resume can tell a call that never started from one whose outcome is unknown.
    ToolStarted {
        /// The session id.
        session: String,
        /// The calls' ids.
        calls: Vec<String>,
    },
    /// A verifier's verdict.
    Verdict {
        /// The session id.
        session: String,
        /// The verdict.
        verdict: Verdict,
    },
    /// The conversation's oldest messages were replaced: by a model's summary (compaction) or,
    /// after compaction failed, by a note that they were dropped. The log keeps every original
    /// message; replaying this entry where it stands rebuilds the compacted conversation
    /// (`keel_agent_kit::compaction::apply`).
    Compacted {
        /// The session id.
        session: String,
        /// How many of the conversation's messages (the oldest) were replaced.
        replaced: usize,
        /// The text put before the first message kept.
        summary: String,
        /// `threshold`, `manual` (`/compact`) or `trimmed` (compaction off after failures).
        reason: String,
        /// The request's estimated tokens before and after.
        tokens_before: u64,
        /// …and after.
        tokens_after: u64,
        /// The context window (tokens) the session's requests were held to, when the
        /// provider's refusal of a request as too long showed one smaller than the configured
        /// window: a resumed session holds its requests to it from the first, so no request
        /// is refused for length twice.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_window: Option<u64>,
    },
    /// What a child agent did, filed under the parent's tool call that started it. Never
    /// part of the parent's conversation: a resume does not replay it.
    Subagent {
        /// The parent's session id.
        session: String,
        /// The parent's tool call the child served.
        parent_call: String,
        /// The kernel's number for the child.
        child: u64,
        /// Its label.
        label: String,
        /// The child's own entry.
        event: Box<SessionEvent>,
    },
    /// The conversation was rewound (`keel rewind`, `--conversation` or `--both`): it goes on
    /// from its first `keep` messages, as rebuilt from the entries before this one. The log
    /// keeps every entry; replaying this one where it stands rebuilds the rewound conversation
    /// (`keel_agent_kit::session_log::Rebuild`).
    Rewound {
        /// The session id.
        session: String,
        /// How many of the conversation's messages are kept.
        keep: usize,
        /// The turn it went back to the start of.
        turn: u64,
        /// The files' safety checkpoint, when the files were rewound too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<String>,
    },
    /// A turn ended.
    TurnEnded {
        /// The session id.
        session: String,
        /// Why.
        end: TurnEnd,
        /// Detail.
        #[serde(default)]
        detail: String,
    },
}

impl SessionEvent {
    /// The session the entry belongs to.
    pub fn session(&self) -> &str {
        match self {
            SessionEvent::SessionStarted { session, .. }
            | SessionEvent::Context { session, .. }
            | SessionEvent::Message { session, .. }
            | SessionEvent::ToolOutcome { session, .. }
            | SessionEvent::ToolStarted { session, .. }
            | SessionEvent::Verdict { session, .. }
            | SessionEvent::Compacted { session, .. }
            | SessionEvent::Subagent { session, .. }
            | SessionEvent::Rewound { session, .. }
            | SessionEvent::TurnEnded { session, .. } => session,
        }
    }
}

/// A line of a session's JSONL log: the event with its position and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// 0-based position in the session's log.
    pub seq: u64,
    /// Milliseconds since the Unix epoch when it was appended.
    pub time_ms: u64,
    /// The event.
    #[serde(flatten)]
    pub event: SessionEvent,
}

/// A line of a log that was skipped while reading it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogWarning {
    /// 1-based line number in the file.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

/// The entries of a log, and what had to be skipped (`session-log` `read`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogRead {
    /// The entries that parsed, in file order.
    pub lines: Vec<LogLine>,
    /// The lines that were skipped.
    pub warnings: Vec<LogWarning>,
}

/// One session as `session-log` `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The session id.
    pub id: String,
    /// Time of the first entry (ms since the Unix epoch), if any.
    #[serde(default)]
    pub first_time_ms: Option<u64>,
    /// Time of the last entry, if any.
    #[serde(default)]
    pub last_time_ms: Option<u64>,
    /// Entries that parsed.
    #[serde(default)]
    pub entries: usize,
    /// The start of the first user message, flattened to one line.
    #[serde(default)]
    pub preview: Option<String>,
    /// The workspace the session began in, as its first `session_started` entry says (an
    /// editor lists a project's sessions by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Lines skipped while reading.
    #[serde(default)]
    pub warnings: usize,
    /// Why the log could not be read (the others are still listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The system prompt and tools a log recorded last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedContext {
    /// The system prompt.
    pub system: String,
    /// The tools offered.
    pub tools: Vec<ToolDef>,
}

/// A session's conversation as the next model request would carry it, rebuilt from its log
/// and repaired so every tool call has its result (`session-log` `conversation` and `resume`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoggedConversation {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// The latest context, if any was logged.
    #[serde(default)]
    pub context: Option<LoggedContext>,
    /// The context window a provider's refusal showed, as the latest compaction recorded it.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The lines skipped while reading.
    #[serde(default)]
    pub warnings: Vec<LogWarning>,
    /// What the rebuild had to mend, in words (empty for a log written whole).
    #[serde(default)]
    pub repairs: Vec<String>,
}

/// Whether a session log wrote every entry since it was last asked (`session-log` `health`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogHealth {
    /// Entries that could not be written (a full disk).
    #[serde(default)]
    pub failed: u64,
    /// The last error, if any.
    #[serde(default)]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_capabilities_read_as_flags_and_round_trip_the_abi_bits() {
        let all = ToolCapabilities::READS_FILES
            | ToolCapabilities::WRITES_FILES
            | ToolCapabilities::EXECUTES_CODE
            | ToolCapabilities::NETWORK;
        assert_eq!(all.abi_bits(), 0b1111);
        for bits in 0..16u8 {
            assert_eq!(ToolCapabilities::from_abi_bits(bits).abi_bits(), bits);
        }
        assert_eq!(
            ToolCapabilities::from_abi_bits(4),
            ToolCapabilities::EXECUTES_CODE
        );
        assert!(all.contains(ToolCapabilities::NETWORK));
        assert!(!ToolCapabilities::READS_FILES.contains(ToolCapabilities::WRITES_FILES));
        // A spec written before a capability existed reads as not having it.
        let old: ToolSpec = serde_json::from_str(
            r#"{"name":"t","description":"d","input_schema":"{}","capabilities":{"reads_files":true}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(old.capabilities, ToolCapabilities::READS_FILES);
        assert!(!old.parallel_safe);
    }

    #[test]
    fn blocks_and_events_round_trip_as_tagged_json() {
        let event = SessionEvent::Message {
            session: "s1".into(),
            message: Message {
                role: Role::Assistant,
                content: vec![
                    Block::Thinking { text: "hm".into() },
                    Block::ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: "{\"path\":".into(),
                    },
                ],
            },
            stop_reason: Some(StopReason::MaxTokens),
            usage: Some(Usage::default()),
        };
        let line = LogLine {
            seq: 7,
            time_ms: 1,
            event,
        };
        let text = serde_json::to_string(&line).expect("serializes");
        assert!(text.contains("\"kind\":\"message\""), "{text}");
        assert!(text.contains("\"type\":\"tool_call\""), "{text}");
        assert!(text.contains("\"stop_reason\":\"max_tokens\""), "{text}");
        let back: LogLine = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, line);
    }

    #[test]
    fn message_helpers_pick_their_blocks() {
        let m = Message {
            role: Role::Assistant,
            content: vec![
                Block::Text { text: "a".into() },
                Block::ToolCall {
                    id: "1".into(),
                    name: "t".into(),
                    arguments: "{}".into(),
                },
                Block::Text { text: "b".into() },
            ],
        };
        assert_eq!(m.text(), "a\nb");
        assert_eq!(m.tool_calls().collect::<Vec<_>>(), vec![("1", "t", "{}")]);
        assert!(StopReason::MaxTokens.is_truncation());
        assert!(!StopReason::Interrupted.is_truncation());
    }
}
