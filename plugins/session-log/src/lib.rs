//! keel plugin `session-log`: the append-only JSONL session log.
//!
//! It subscribes to `session.event` and appends each [`SessionEvent`] (the event's payload,
//! JSON) as a [`LogLine`](keel_protocol::LogLine) — sequence number and wall-clock time added
//! — to `/sessions/<session>.jsonl`, the `sessions` folder of keel's data directory.
//!
//! It provides the service `session-log` 1.0.0, through two doors that serve the same methods:
//! the typed export `keel:plugin/session-log@0.8.0` (records, world `session-log-service`)
//! and `handle-call` (JSON, for callers of earlier ABIs):
//! - `append` (`SessionEvent`) → the entry's position (`{"seq": n}`): the same as the event,
//!   synchronously.
//! - `started` (the calls the agent loop is about to run) → the same: the record of their
//!   start is written before this returns.
//! - `list` → [`SessionSummary`](keel_protocol::SessionSummary)s, most recently active first.
//! - `read` (a session) → its [`LogRead`](keel_protocol::LogRead): the lines and what was
//!   skipped.
//! - `conversation` (a session) → the [`LoggedConversation`](keel_protocol::LoggedConversation)
//!   the next request would carry, repaired so every tool call has its result
//!   (`keel_agent_kit::session_log::Rebuild`).
//! - `resume` (a session) → the same as `conversation`, and when calls at the log's end had no
//!   result, the results made up for them are appended to the log (with a `turn_ended` entry
//!   saying the turn was interrupted), so the log itself is whole again.
//! - `health` → how many entries could not be written since the last `health` (a full disk),
//!   and the last error; the host asks after each turn, so a turn whose record is incomplete
//!   does not pass for a good one.
//!
//! A child agent's entries arrive on `subagent.event` (the kernel lets only the plugin serving
//! that child's tool call emit them, naming that call); each is filed, as a `subagent` entry,
//! in the log of the session whose model made that call, which resume never replays.
//!
//! A torn last line (an interrupted writer, a full disk) is skipped with a warning, never
//! fatal; before the next append the writer cuts it off (or completes it, when it is a whole
//! entry without its newline), so the log never holds a torn line before a whole one. Lines
//! are read a buffer at a time and any over 16 MiB is skipped with a warning, so one bad log
//! never stops `list` from showing the others.
//!
//! Who may write and read: only the host (`keel`) and the plugin that provides `agent` (the
//! agent loop), as the kernel attests them (`keel.caller`); the kernel refuses a
//! `session.event` from any other plugin when it is emitted. So no other plugin can forge an entry that `keel resume`
//! would trust, or read another session's conversation.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use keel_agent_kit::session_log::{self, LogRead, LogWriter};
use keel_protocol::{
    Block, LogHealth, LoggedContext, LoggedConversation, SessionEvent, SessionSummary,
    SubagentEvent, services, topics,
};
use keel_sdk::{Event, Plugin, events, log, services as kernel_services};
use serde::Deserialize;
use serde_json::json;

/// Where the sessions folder is preopened.
const DIR: &str = "/sessions";
/// Open writers kept at most; older ones are closed (reopening is cheap).
const MAX_OPEN: usize = 16;
/// Recent tool calls remembered with their session, so a child agent's entries find the log
/// of the call that started it.
const MAX_CALLS: usize = 4096;

/// The payload of `read` and `conversation`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    session: String,
}

/// The plugin instance: the open writers, by session.
struct SessionLog {
    writers: BTreeMap<String, LogWriter>,
    /// (tool call id, session), the newest last.
    calls: VecDeque<(String, String)>,
    /// Entries that could not be written since `health` was last asked, and the last error.
    failed: u64,
    last_error: Option<String>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode the answer: {e}"))
}

impl SessionLog {
    /// Remember the tool calls `event` carries as `session`'s (a child's calls too, so a
    /// grandchild finds the same log).
    fn note_calls(&mut self, session: &str, event: &SessionEvent) {
        match event {
            SessionEvent::Message { message, .. } => {
                for block in &message.content {
                    if let Block::ToolCall { id, .. } = block {
                        if self.calls.len() >= MAX_CALLS {
                            self.calls.pop_front();
                        }
                        self.calls.push_back((id.clone(), session.to_owned()));
                    }
                }
            }
            SessionEvent::Subagent { event, .. } => self.note_calls(session, event),
            _ => {}
        }
    }

    /// File a child agent's entry under the session whose call started it.
    fn append_child(&mut self, entry: SubagentEvent) -> Result<u64, String> {
        let Some(session) = self
            .calls
            .iter()
            .rev()
            .find(|(id, _)| *id == entry.parent_call)
            .map(|(_, session)| session.clone())
        else {
            return Err(format!(
                "no logged session made tool call `{}`; the subagent's entry is dropped",
                entry.parent_call
            ));
        };
        self.append(&SessionEvent::Subagent {
            session,
            parent_call: entry.parent_call,
            child: entry.child,
            label: entry.label,
            event: Box::new(entry.event),
        })
    }

    fn append(&mut self, event: &SessionEvent) -> Result<u64, String> {
        self.note_calls(event.session(), event);
        let id = event.session().to_string();
        if !self.writers.contains_key(&id) {
            if self.writers.len() >= MAX_OPEN
                && let Some(oldest) = self.writers.keys().next().cloned()
            {
                self.writers.remove(&oldest);
            }
            let writer = LogWriter::open(Path::new(DIR), &id).map_err(|e| e.to_string())?;
            self.writers.insert(id.clone(), writer);
        }
        let Some(writer) = self.writers.get_mut(&id) else {
            return Err(format!("no writer for session {id}"));
        };
        // A turn's end is put on the disk, so a power loss costs at most the turn in flight
        // (a killed keel loses nothing written: the data is the kernel's once appended).
        let appended = writer.append(now_ms(), event).and_then(|seq| {
            if matches!(event, SessionEvent::TurnEnded { .. }) {
                writer.sync()?;
            }
            Ok(seq)
        });
        match appended {
            Ok(seq) => Ok(seq),
            Err(e) => {
                // The file may have been moved or truncated under us, or a write may have
                // stopped halfway (a full disk): drop the writer so the next event reopens it,
                // which cuts a torn last line off before appending.
                self.writers.remove(&id);
                Err(e.to_string())
            }
        }
    }

    /// An append that failed, counted for `health`.
    fn failed(&mut self, error: String) {
        self.failed += 1;
        self.last_error = Some(error);
    }

    /// `started`: the record that the agent loop is about to run `event`'s calls.
    fn started(&mut self, event: &SessionEvent) -> Result<u64, String> {
        if !matches!(event, SessionEvent::ToolStarted { .. }) {
            return Err("started: the payload is not a tool_started entry".into());
        }
        self.append(event)
    }

    fn list() -> Result<Vec<SessionSummary>, String> {
        session_log::list(Path::new(DIR)).map_err(|e| e.to_string())
    }

    fn read(session: &str) -> Result<LogRead, String> {
        session_log::read_log(Path::new(DIR), session).map_err(|e| e.to_string())
    }

    /// `conversation`, and for `resume` (`record`) the repair of the log's end appended.
    fn conversation(&mut self, session: &str, record: bool) -> Result<LoggedConversation, String> {
        let (conversation, warnings) =
            session_log::read_conversation(Path::new(DIR), session).map_err(|e| e.to_string())?;
        if record && let Some(results) = &conversation.tail_repair {
            self.append(&SessionEvent::Message {
                session: session.to_owned(),
                message: results.clone(),
                stop_reason: None,
                usage: None,
            })
            .and_then(|_| {
                self.append(&SessionEvent::TurnEnded {
                    session: session.to_owned(),
                    end: keel_protocol::TurnEnd::Interrupted,
                    detail: "keel stopped before the turn ended; the calls it left without a \
                             result were answered as interrupted when the session was resumed"
                        .into(),
                })
            })
            .map_err(|e| format!("cannot record the repair of the log's end: {e}"))?;
        }
        Ok(LoggedConversation {
            messages: conversation.messages,
            context: conversation.context.map(|c| LoggedContext {
                system: c.system,
                tools: c.tools,
            }),
            context_window: conversation.context_window,
            warnings,
            repairs: conversation.repairs,
        })
    }

    /// `health`: what failed since the last ask, which is forgotten.
    fn health(&mut self) -> LogHealth {
        LogHealth {
            failed: std::mem::take(&mut self.failed),
            error: self.last_error.take(),
        }
    }
}

fn session_request(payload: &str) -> Result<SessionRequest, String> {
    serde_json::from_str(payload)
        .map_err(|e| format!("the payload must be {{\"session\": \"<id>\"}} ({e})"))
}

impl Plugin for SessionLog {
    fn activate(_config: &str) -> Result<Self, String> {
        std::fs::metadata(DIR).map_err(|e| {
            format!("the sessions directory {DIR} is not available ({e}); the manifest's `$KEEL_DATA/sessions` grant is missing")
        })?;
        events::subscribe(topics::SESSION_EVENT)?;
        events::subscribe(topics::SUBAGENT_EVENT)?;
        kernel_services::provide(services::SESSION_LOG, "1.0.0")?;
        Ok(SessionLog {
            writers: BTreeMap::new(),
            calls: VecDeque::new(),
            failed: 0,
            last_error: None,
        })
    }

    fn on_event(&mut self, event: Event) {
        if event.topic == topics::SUBAGENT_EVENT {
            let logged = serde_json::from_str::<SubagentEvent>(&event.payload)
                .map_err(|e| format!("subagent.event is not a SubagentEvent ({e})"))
                .and_then(|entry| self.append_child(entry));
            if let Err(e) = logged {
                log::warn(&format!(
                    "subagent entry from `{}` not logged: {e}",
                    event.source
                ));
            }
            return;
        }
        if event.topic != topics::SESSION_EVENT {
            return;
        }
        // The kernel delivers `session.event` only from keel and the plugin that provides
        // `agent` when it emits, so the source needs no second check here (and an agent loop
        // unloaded since keeps its last events).
        let parsed: SessionEvent = match serde_json::from_str(&event.payload) {
            Ok(e) => e,
            Err(e) => {
                log::warn(&format!(
                    "session.event from `{}` is not a SessionEvent ({e}); not logged",
                    event.source
                ));
                return;
            }
        };
        if let Err(e) = self.append(&parsed) {
            log::error(&format!("session event not logged: {e}"));
            self.failed(e);
        }
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != services::SESSION_LOG {
            return Err(format!("no such service: {service}"));
        }
        // The JSON door's error is text: the kind leads it (`denied: …`).
        check_caller().map_err(|e| keel_sdk::KernelError::from(e).to_string())?;
        match method {
            "append" => {
                let event: SessionEvent = serde_json::from_str(payload)
                    .map_err(|e| format!("append: the payload is not a SessionEvent ({e})"))?;
                let seq = self.append(&event)?;
                to_json(&json!({ "seq": seq }))
            }
            // The agent loop, before it runs tool calls: the record of their start is written
            // before this returns (an event would wait in a queue while the calls ran).
            "started" => {
                let event: SessionEvent = serde_json::from_str(payload)
                    .map_err(|e| format!("started: the payload is not a SessionEvent ({e})"))?;
                let seq = self.started(&event)?;
                to_json(&json!({ "seq": seq }))
            }
            "list" => to_json(&Self::list()?),
            "read" => to_json(&Self::read(&session_request(payload)?.session)?),
            "conversation" => {
                to_json(&self.conversation(&session_request(payload)?.session, false)?)
            }
            "resume" => to_json(&self.conversation(&session_request(payload)?.session, true)?),
            "health" => to_json(&self.health()),
            other => Err(format!(
                "session-log has no method `{other}`; the methods are append, started, list, \
                 read, conversation, resume and health"
            )),
        }
    }
}

/// Refuses a caller that may not write or read session logs, whichever door it came through.
fn check_caller() -> Result<(), RawKernelError> {
    let caller = kernel_services::call(keel_sdk::CALLER_SERVICE, "name", "")
        .map_err(|e| RawKernelError::Failed(format!("cannot learn who is calling: {e}")))?;
    if trusted(&caller) {
        return Ok(());
    }
    Err(RawKernelError::Denied(format!(
        "session-log serves only keel and the plugin that provides `{}`; `{caller}` is neither",
        services::AGENT
    )))
}

/// Whether `plugin` (kernel-attested) may write or read session logs: the host, or the plugin
/// that provides `agent` right now.
fn trusted(plugin: &str) -> bool {
    if plugin == keel_sdk::KERNEL_NAME {
        return true;
    }
    !plugin.is_empty()
        && kernel_services::call(keel_sdk::CALLER_SERVICE, "provider", services::AGENT)
            .is_ok_and(|provider| provider == plugin)
}

keel_sdk::export_plugin!(SessionLog);

/// `session-log` served typed (ABI 0.8.0's world `session-log-service`): callers of 0.8.0 get
/// records, through the same methods and the same caller check as `handle_call`.
#[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
mod typed {
    wit_bindgen::generate!({
        path: [
            "../../wit/keel-plugin-0.2.0",
            "../../wit/keel-plugin-0.3.0",
            "../../wit/keel-plugin-0.4.0",
            "../../wit/keel-plugin-0.5.0",
            "../../wit/keel-plugin-0.6.0",
            "../../wit/keel-plugin-0.7.0",
            "../../wit/keel-plugin-0.8.0",
        ],
        world: "keel:plugin/session-log-service@0.8.0",
        with: {
            "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
            "keel:plugin/conversation@0.5.0": keel_sdk::bindings::keel::plugin0_5_0::conversation,
            "keel:plugin/tool-registry@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::tool_registry,
            "keel:plugin/turns@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::turns,
            "keel:plugin/verifier-types@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::verifier_types,
            "keel:plugin/model-types@0.7.0": keel_sdk::bindings::keel::plugin0_7_0::model_types,
            "keel:plugin/session-log-types@0.8.0": keel_sdk::bindings::keel::plugin0_8_0::session_log_types,
        },
    });
}

use keel_sdk::bindings::keel::plugin0_2_0::types::KernelError as RawKernelError;
use keel_sdk::session_log as records;
use keel_sdk_protocol as convert;

struct TypedSessionLog;

/// `f` on the plugin's state, for a caller `check_caller` lets through.
fn served<R>(f: impl FnOnce(&mut SessionLog) -> Result<R, String>) -> Result<R, RawKernelError> {
    check_caller()?;
    keel_sdk::with_plugin(f)?.map_err(RawKernelError::Failed)
}

impl typed::exports::keel::plugin0_8_0::session_log::Guest for TypedSessionLog {
    fn append(event: records::SessionEvent) -> Result<u64, RawKernelError> {
        let event = convert::session_event_from_wit(event).map_err(RawKernelError::Invalid)?;
        served(|log| log.append(&event))
    }

    fn started(session: String, calls: Vec<String>) -> Result<u64, RawKernelError> {
        served(|log| log.started(&SessionEvent::ToolStarted { session, calls }))
    }

    fn list() -> Result<Vec<records::SessionSummary>, RawKernelError> {
        let sessions = served(|_| SessionLog::list())?;
        Ok(sessions
            .into_iter()
            .map(convert::session_summary_to_wit)
            .collect())
    }

    fn read(session: String) -> Result<records::LogRead, RawKernelError> {
        served(|_| SessionLog::read(&session)).map(convert::log_read_to_wit)
    }

    fn conversation(session: String) -> Result<records::LoggedConversation, RawKernelError> {
        served(|log| log.conversation(&session, false)).map(convert::logged_conversation_to_wit)
    }

    fn resume(session: String) -> Result<records::LoggedConversation, RawKernelError> {
        served(|log| log.conversation(&session, true)).map(convert::logged_conversation_to_wit)
    }

    fn health() -> Result<records::LogHealth, RawKernelError> {
        served(|log| Ok(log.health())).map(convert::log_health_to_wit)
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedSessionLog with_types_in typed);
};
