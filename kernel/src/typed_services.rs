//! The services plugins provide through typed doors (ABI 0.6.0's `memory`, `compaction`,
//! `tool-registry`, `turns` (the `agent` service) and `verifier`; 0.7.0's `model`), in
//! `keel_protocol`'s types: the one vocabulary the kernel routes, whichever door each side
//! uses.
//!
//! A caller asks through the typed import; the kernel routes the call to the plugin that
//! provides the service now. A provider that exports the service's interface is called
//! through it (`wasm_host::abi_versions::since_v0_6`, `since_v0_7`); any other provider (built
//! against an earlier ABI, native, in-process) through its `handle-call`, with
//! [`ServiceCall::to_json`] as the payload, its answer read back by
//! [`ServiceCall::answer_from_json`]. So a typed caller works with every provider, and the
//! kernel never hands a plugin JSON text it did not ask for.

use keel_protocol::{
    CompactRequest, Compacted, HookContext, HookPrompt, HookSessionStart, HookStop, HookToolUse,
    LoadRequest, LogHealth, LogRead, LoggedConversation, Message, ModelRequest, ModelResponse,
    PromptVerdict, RecallRequest, RecalledEntry, Resolution, ResolveRequest, SessionEvent,
    SessionSummary, StopVerdict, SummarizeRequest, ToolDef, TurnReport, TurnRequest, Verdict,
    VerifyRequest, services,
};

/// The service of the person's hooks, which only keel calls.
const HOOKS: &str = "hooks";

/// A model request on its way to the `model` provider.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    /// The request; its `messages` are empty when `kept` carries them.
    pub request: ModelRequest,
    /// The messages of the conversation the request named, put in by the kernel for a provider
    /// that does not read conversations itself: the JSON array of the texts the agent kept,
    /// joined and not parsed (they are the agent's own data; whoever reads them next parses
    /// them), so the history is not decoded and encoded again on its way to a JSON door.
    pub kept: Option<String>,
}

impl ModelCall {
    /// A request that carries its messages, if any.
    pub fn new(request: ModelRequest) -> ModelCall {
        ModelCall {
            request,
            kept: None,
        }
    }

    /// The request as JSON text, the kept messages put into `messages`.
    fn to_json(&self) -> String {
        // Plain records: nothing here fails to serialize.
        let head = serde_json::to_string(&self.request).unwrap_or_default();
        match &self.kept {
            None => head,
            Some(messages) => splice_messages(&head, messages),
        }
    }

    /// The request with the kept messages decoded into it, for a provider's typed door.
    pub(crate) fn to_request(&self) -> Result<ModelRequest, String> {
        let mut request = self.request.clone();
        if let Some(kept) = &self.kept {
            request.messages = serde_json::from_str::<Vec<Message>>(kept).map_err(|e| {
                format!("a message the agent kept is not a message of the conversation: {e}")
            })?;
        }
        Ok(request)
    }
}

/// `head`, a request's JSON object whose `messages` are empty, with `messages` (a JSON array)
/// in their place.
fn splice_messages(head: &str, messages: &str) -> String {
    const EMPTY: &str = "\"messages\":[]";
    let mut out = String::with_capacity(head.len() + messages.len());
    match head.find(EMPTY) {
        Some(at) => {
            out.push_str(&head[..at]);
            out.push_str("\"messages\":");
            out.push_str(messages);
            out.push_str(&head[at + EMPTY.len()..]);
        }
        // A request without the field (it always has it): the messages lead.
        None => {
            out.push_str("{\"messages\":");
            out.push_str(messages);
            match head.strip_prefix('{') {
                Some("}") | None => out.push('}'),
                Some(rest) => {
                    out.push(',');
                    out.push_str(rest);
                }
            }
        }
    }
    out
}

/// A call to a typed service.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceCall {
    /// `memory` `recall`.
    Recall(RecallRequest),
    /// `compaction` `summarize`.
    Summarize(SummarizeRequest),
    /// `tool-registry` `list`.
    ListTools,
    /// `tool-registry` `resolve`.
    ResolveTool(ResolveRequest),
    /// `agent` `turn`.
    Turn(TurnRequest),
    /// `agent` `load`.
    LoadConversation(LoadRequest),
    /// `agent` `compact`.
    Compact(CompactRequest),
    /// `verifier` `verify`.
    Verify(VerifyRequest),
    /// `model` `complete`.
    Complete(Box<ModelCall>),
    /// `hooks` `session-start`.
    HookSessionStart(HookSessionStart),
    /// `hooks` `post-tool-use`.
    HookToolUse(HookToolUse),
    /// `hooks` `user-prompt-submit`.
    HookPrompt(HookPrompt),
    /// `hooks` `stop`.
    HookStop(HookStop),
    /// `session-log` `append`.
    LogAppend(Box<SessionEvent>),
    /// `session-log` `started`: the agent loop is about to run `calls` of `session`.
    LogStarted {
        /// The session.
        session: String,
        /// The calls' ids.
        calls: Vec<String>,
    },
    /// `session-log` `list`.
    LogList,
    /// `session-log` `read` of a session.
    LogRead(String),
    /// `session-log` `conversation` of a session.
    LogConversation(String),
    /// `session-log` `resume` of a session.
    LogResume(String),
    /// `session-log` `health`.
    LogHealth,
}

/// What a typed service answered.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceAnswer {
    /// `memory` `recall`: the entries found, best first.
    Recalled(Vec<RecalledEntry>),
    /// `compaction` `summarize`: the summary's text.
    Summary(String),
    /// `tool-registry` `list`: the tools offered to the model.
    Tools(Vec<ToolDef>),
    /// `tool-registry` `resolve`: what the name stands for.
    Resolution(Resolution),
    /// `agent` `turn`: how the turn ended.
    TurnReport(TurnReport),
    /// `agent` `load`: the messages the session now holds.
    Loaded(u32),
    /// `agent` `compact`: what the compaction did.
    Compacted(Compacted),
    /// `verifier` `verify`: the most severe verdict; `None` when the turn claimed nothing.
    Verdict(Option<Verdict>),
    /// `model` `complete`: the assistant message.
    Completion(Box<ModelResponse>),
    /// `hooks` `session-start`: what the hooks said.
    HookContext(HookContext),
    /// `hooks` `post-tool-use`: what the hooks add to the call's result (may be empty).
    HookAdded(String),
    /// `hooks` `user-prompt-submit`: what the hooks decided.
    PromptVerdict(PromptVerdict),
    /// `hooks` `stop`: what the hooks decided.
    StopVerdict(StopVerdict),
    /// `session-log` `append` and `started`: the entry's position in its log.
    Appended(u64),
    /// `session-log` `list`: every session, most recently active first.
    Sessions(Vec<SessionSummary>),
    /// `session-log` `read`: a log's entries.
    LogRead(LogRead),
    /// `session-log` `conversation` and `resume`: the conversation a log rebuilds.
    Conversation(Box<LoggedConversation>),
    /// `session-log` `health`.
    LogHealth(LogHealth),
}

impl ServiceCall {
    /// The service it is routed by.
    pub fn service(&self) -> &'static str {
        match self {
            ServiceCall::Recall(_) => services::MEMORY,
            ServiceCall::Summarize(_) => services::COMPACTION,
            ServiceCall::ListTools | ServiceCall::ResolveTool(_) => services::TOOL_REGISTRY,
            ServiceCall::Turn(_) | ServiceCall::LoadConversation(_) | ServiceCall::Compact(_) => {
                services::AGENT
            }
            ServiceCall::Verify(_) => services::VERIFIER,
            ServiceCall::Complete(_) => services::MODEL,
            ServiceCall::HookSessionStart(_)
            | ServiceCall::HookToolUse(_)
            | ServiceCall::HookPrompt(_)
            | ServiceCall::HookStop(_) => HOOKS,
            ServiceCall::LogAppend(_)
            | ServiceCall::LogStarted { .. }
            | ServiceCall::LogList
            | ServiceCall::LogRead(_)
            | ServiceCall::LogConversation(_)
            | ServiceCall::LogResume(_)
            | ServiceCall::LogHealth => services::SESSION_LOG,
        }
    }

    /// The method of the service's JSON door.
    pub fn method(&self) -> &'static str {
        match self {
            ServiceCall::Recall(_) => "recall",
            ServiceCall::Summarize(_) => "summarize",
            ServiceCall::ListTools => "list",
            ServiceCall::ResolveTool(_) => "resolve",
            ServiceCall::Turn(_) => "turn",
            ServiceCall::LoadConversation(_) => "load",
            ServiceCall::Compact(_) => "compact",
            ServiceCall::Verify(_) => "verify",
            ServiceCall::Complete(_) => "complete",
            ServiceCall::HookSessionStart(_) => "session-start",
            ServiceCall::HookToolUse(_) => "post-tool-use",
            ServiceCall::HookPrompt(_) => "user-prompt-submit",
            ServiceCall::HookStop(_) => "stop",
            ServiceCall::LogAppend(_) => "append",
            ServiceCall::LogStarted { .. } => "started",
            ServiceCall::LogList => "list",
            ServiceCall::LogRead(_) => "read",
            ServiceCall::LogConversation(_) => "conversation",
            ServiceCall::LogResume(_) => "resume",
            ServiceCall::LogHealth => "health",
        }
    }

    /// The payload of the same call through `handle-call`, for a provider without the typed
    /// door.
    pub fn to_json(&self) -> String {
        match self {
            ServiceCall::Recall(request) => serde_json::to_string(request),
            ServiceCall::Summarize(request) => serde_json::to_string(request),
            ServiceCall::ListTools => Ok("{}".to_owned()),
            ServiceCall::ResolveTool(request) => serde_json::to_string(request),
            ServiceCall::Turn(request) => serde_json::to_string(request),
            ServiceCall::LoadConversation(request) => serde_json::to_string(request),
            ServiceCall::Compact(request) => serde_json::to_string(request),
            ServiceCall::Verify(request) => serde_json::to_string(request),
            ServiceCall::Complete(call) => Ok(call.to_json()),
            ServiceCall::HookSessionStart(request) => serde_json::to_string(request),
            ServiceCall::HookToolUse(request) => serde_json::to_string(request),
            ServiceCall::HookPrompt(request) => serde_json::to_string(request),
            ServiceCall::HookStop(request) => serde_json::to_string(request),
            ServiceCall::LogAppend(event) => serde_json::to_string(event),
            // The JSON door takes the entry `started` records.
            ServiceCall::LogStarted { session, calls } => {
                serde_json::to_string(&SessionEvent::ToolStarted {
                    session: session.clone(),
                    calls: calls.clone(),
                })
            }
            ServiceCall::LogList | ServiceCall::LogHealth => Ok("{}".to_owned()),
            ServiceCall::LogRead(session)
            | ServiceCall::LogConversation(session)
            | ServiceCall::LogResume(session) => {
                serde_json::to_string(&serde_json::json!({ "session": session }))
            }
        }
        // Plain records of strings, numbers and lists: nothing here fails to serialize.
        .unwrap_or_default()
    }

    /// The answer of a provider's `handle-call` to [`Self::to_json`], read as this call's.
    pub fn answer_from_json(&self, text: &str) -> Result<ServiceAnswer, String> {
        let malformed = |e: serde_json::Error| {
            format!(
                "the `{}` provider's answer to `{}` is not what the method answers ({e})",
                self.service(),
                self.method()
            )
        };
        match self {
            ServiceCall::Recall(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Recalled)
                .map_err(malformed),
            ServiceCall::Summarize(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Summary)
                .map_err(malformed),
            ServiceCall::ListTools => serde_json::from_str(text)
                .map(ServiceAnswer::Tools)
                .map_err(malformed),
            ServiceCall::ResolveTool(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Resolution)
                .map_err(malformed),
            ServiceCall::Turn(_) => serde_json::from_str(text)
                .map(ServiceAnswer::TurnReport)
                .map_err(malformed),
            ServiceCall::LoadConversation(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Loaded)
                .map_err(malformed),
            ServiceCall::Compact(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Compacted)
                .map_err(malformed),
            ServiceCall::Verify(_) => serde_json::from_str(text)
                .map(ServiceAnswer::Verdict)
                .map_err(malformed),
            ServiceCall::Complete(_) => serde_json::from_str(text)
                .map(|r| ServiceAnswer::Completion(Box::new(r)))
                .map_err(malformed),
            ServiceCall::HookSessionStart(_) => serde_json::from_str(text)
                .map(ServiceAnswer::HookContext)
                .map_err(malformed),
            // The JSON door answers `{"context": …}`.
            ServiceCall::HookToolUse(_) => serde_json::from_str::<HookContext>(text)
                .map(|added| ServiceAnswer::HookAdded(added.context))
                .map_err(malformed),
            ServiceCall::HookPrompt(_) => serde_json::from_str(text)
                .map(ServiceAnswer::PromptVerdict)
                .map_err(malformed),
            ServiceCall::HookStop(_) => serde_json::from_str(text)
                .map(ServiceAnswer::StopVerdict)
                .map_err(malformed),
            // The JSON door answers `{"seq": n}`.
            ServiceCall::LogAppend(_) | ServiceCall::LogStarted { .. } => {
                #[derive(serde::Deserialize)]
                struct Seq {
                    seq: u64,
                }
                serde_json::from_str::<Seq>(text)
                    .map(|s| ServiceAnswer::Appended(s.seq))
                    .map_err(malformed)
            }
            ServiceCall::LogList => serde_json::from_str(text)
                .map(ServiceAnswer::Sessions)
                .map_err(malformed),
            ServiceCall::LogRead(_) => serde_json::from_str(text)
                .map(ServiceAnswer::LogRead)
                .map_err(malformed),
            ServiceCall::LogConversation(_) | ServiceCall::LogResume(_) => {
                serde_json::from_str(text)
                    .map(|c| ServiceAnswer::Conversation(Box::new(c)))
                    .map_err(malformed)
            }
            ServiceCall::LogHealth => serde_json::from_str(text)
                .map(ServiceAnswer::LogHealth)
                .map_err(malformed),
        }
    }

    /// About how many bytes the call hands its provider (its strings), for the boundary's
    /// figures.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            ServiceCall::Recall(r) => r.session.len() + r.input.len(),
            ServiceCall::Summarize(r) => r.focus.len() + messages_bytes(&r.messages),
            ServiceCall::ListTools => 0,
            ServiceCall::ResolveTool(r) => r.name.len(),
            ServiceCall::Turn(r) => r.session.len() + r.input.len(),
            ServiceCall::LoadConversation(r) => r.session.len() + messages_bytes(&r.messages),
            ServiceCall::Compact(r) => r.session.len() + r.focus.len(),
            ServiceCall::Verify(r) => {
                r.final_text.len()
                    + r.calls
                        .iter()
                        .map(|c| c.outcome.content.len())
                        .sum::<usize>()
            }
            ServiceCall::Complete(call) => {
                request_bytes(&call.request) + call.kept.as_ref().map_or(0, String::len)
            }
            ServiceCall::HookSessionStart(r) => r.session.len() + r.source.len(),
            ServiceCall::HookToolUse(r) => r.tool.len() + r.result.len(),
            ServiceCall::HookPrompt(r) => r.session.len() + r.prompt.len(),
            ServiceCall::HookStop(r) => r.session.len(),
            ServiceCall::LogAppend(event) => event_bytes(event),
            ServiceCall::LogStarted { session, calls } => {
                session.len() + calls.iter().map(String::len).sum::<usize>()
            }
            ServiceCall::LogRead(session)
            | ServiceCall::LogConversation(session)
            | ServiceCall::LogResume(session) => session.len(),
            ServiceCall::LogList | ServiceCall::LogHealth => 0,
        }
    }
}

/// About how many bytes a model request carries (its strings, and each tool's input schema as
/// the JSON text it crosses as).
pub(crate) fn request_bytes(request: &ModelRequest) -> usize {
    request.system.len()
        + messages_bytes(&request.messages)
        + request
            .tools
            .iter()
            .map(|t| t.name.len() + t.description.len() + json_len(&t.input_schema))
            .sum::<usize>()
}

/// The length of `value`'s JSON text, counted without building it.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and a `Value` always serializes.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// About how many bytes a model response carries (its strings).
pub(crate) fn response_bytes(response: &ModelResponse) -> usize {
    messages_bytes(std::slice::from_ref(&response.message)) + response.stop_reason_raw.len()
}

impl ServiceAnswer {
    /// About how many bytes the answer hands back (its strings).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            ServiceAnswer::Recalled(entries) => {
                entries.iter().map(|e| e.source.len() + e.text.len()).sum()
            }
            ServiceAnswer::Summary(text) => text.len(),
            ServiceAnswer::Tools(tools) => tools
                .iter()
                .map(|t| t.name.len() + t.description.len())
                .sum(),
            ServiceAnswer::TurnReport(report) => report.text.len() + report.detail.len(),
            ServiceAnswer::Verdict(verdict) => verdict.as_ref().map_or(0, |v| v.evidence.len()),
            ServiceAnswer::Completion(response) => response_bytes(response),
            ServiceAnswer::HookContext(c) => c.context.len(),
            ServiceAnswer::HookAdded(text) => text.len(),
            ServiceAnswer::PromptVerdict(v) => v.reason.len() + v.context.len(),
            ServiceAnswer::StopVerdict(v) => v.reason.len(),
            ServiceAnswer::Sessions(sessions) => sessions
                .iter()
                .map(|s| s.id.len() + s.preview.as_ref().map_or(0, String::len))
                .sum(),
            ServiceAnswer::LogRead(read) => read.lines.iter().map(|l| event_bytes(&l.event)).sum(),
            ServiceAnswer::Conversation(c) => messages_bytes(&c.messages),
            ServiceAnswer::LogHealth(h) => h.error.as_ref().map_or(0, String::len),
            ServiceAnswer::Appended(_)
            | ServiceAnswer::Resolution(_)
            | ServiceAnswer::Loaded(_)
            | ServiceAnswer::Compacted(_) => 0,
        }
    }
}

/// About how many bytes a log entry carries (its messages' and outcomes' strings).
fn event_bytes(event: &SessionEvent) -> usize {
    match event {
        SessionEvent::Message { message, .. } => messages_bytes(std::slice::from_ref(message)),
        SessionEvent::ToolOutcome { outcome, .. } => outcome.content.len(),
        SessionEvent::Context { system, .. } => system.len(),
        SessionEvent::Compacted { summary, .. } => summary.len(),
        SessionEvent::Subagent { event, .. } => event_bytes(event),
        SessionEvent::Verdict { verdict, .. } => verdict.evidence.len(),
        SessionEvent::SessionStarted { .. }
        | SessionEvent::ToolStarted { .. }
        | SessionEvent::Rewound { .. }
        | SessionEvent::TurnEnded { .. } => 0,
    }
}

fn messages_bytes(messages: &[keel_protocol::Message]) -> usize {
    messages
        .iter()
        .flat_map(|m| &m.content)
        .map(block_bytes)
        .sum()
}

fn block_bytes(block: &keel_protocol::Block) -> usize {
    use keel_protocol::Block;
    match block {
        Block::Text { text } | Block::Thinking { text } => text.len(),
        Block::ToolCall {
            id,
            name,
            arguments,
        } => id.len() + name.len() + arguments.len(),
        Block::ToolResult {
            call_id, content, ..
        } => call_id.len() + content.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_call_has_the_json_door_of_the_same_method() {
        let recall = ServiceCall::Recall(RecallRequest {
            session: "s1".into(),
            input: "how do we build".into(),
        });
        assert_eq!((recall.service(), recall.method()), ("memory", "recall"));
        assert_eq!(
            recall.to_json(),
            r#"{"session":"s1","input":"how do we build"}"#
        );
        assert_eq!(
            recall.answer_from_json(r#"[{"source":"project/build.md","text":"cargo b"}]"#),
            Ok(ServiceAnswer::Recalled(vec![RecalledEntry {
                source: "project/build.md".into(),
                text: "cargo b".into(),
            }]))
        );
        let summarize = ServiceCall::Summarize(SummarizeRequest {
            messages: vec![keel_protocol::Message::user_text("read every file")],
            focus: String::new(),
            budget_chars: 1000,
        });
        assert_eq!(
            summarize.answer_from_json("\"the task: read\""),
            Ok(ServiceAnswer::Summary("the task: read".into()))
        );
        // A provider answering something else is an error naming the door, not a panic.
        let wrong = summarize
            .answer_from_json("[1, 2]")
            .expect_err("a list is no summary");
        assert!(wrong.contains("`compaction` provider"), "{wrong}");
        assert_eq!(summarize.bytes(), "read every file".len());
    }
}
