//! The mock host: an in-memory stand-in for the kernel, which the SDK's wrappers call outside
//! WebAssembly, so a plugin's logic runs under plain `cargo test`.
//!
//! Each thread has its own host (the test harness runs each test on its own thread), reached
//! with [`with_host`]. What the plugin does through the wrappers is recorded in its public
//! fields (log lines, tools, services, subscriptions, emitted events, prompt fragments,
//! state, service calls made); what other plugins would answer is scripted with
//! [`MockHost::serve`]. [`activate`] drives a plugin the way the kernel does, through the
//! same adapter a component exports.
//!
//! The kernel's own services (ABI 0.5.0's `caller`, `prompt_context`, `conversation`,
//! `agents`) answer from fields a test sets: [`MockHost::caller`], [`MockHost::providers`],
//! [`MockHost::prompt`], [`MockHost::generation`], [`MockHost::conversation`] and
//! [`MockHost::child`]; each refuses as the kernel does when its field is unset. So do the
//! plugins' typed services (ABI 0.6.0): `memory::recall` answers [`MockHost::recalled`],
//! `compaction::summarize` [`MockHost::summary`], `tool_registry` [`MockHost::offered_tools`];
//! unset, each is `unavailable`, as when no plugin provides the service, and the requests are
//! recorded ([`MockHost::recall_requests`], [`MockHost::summarize_requests`]);
//! `verifier::verify` answers [`MockHost::verdict`]; `editor::read` answers from
//! [`MockHost::editor_files`]; `model::complete` (ABI 0.7.0) answers
//! [`MockHost::model_response`], its requests recorded in [`MockHost::model_requests`];
//! `session_log::append` and `started` (ABI 0.8.0) write to [`MockHost::session_log`], which
//! `read` answers (it lists no sessions and rebuilds no conversation). The mock runs no agent:
//! `turns` answers `unavailable`.
//!
//! The doors that reach outside the kernel (`http`, `exec`, `agent`, `processes`) answer
//! `unavailable` here: test the logic around them, not the network.
//!
//! ```
//! use keel_sdk::mock::{self, with_host};
//! use keel_sdk::{Plugin, services};
//!
//! struct Asker;
//!
//! impl Plugin for Asker {
//!     fn activate(_config: &str) -> Result<Self, String> {
//!         let answer = services::call("example.oracle", "ask", "?")?;
//!         keel_sdk::log::info(&answer);
//!         Ok(Asker)
//!     }
//! }
//!
//! with_host(|host| host.serve("example.oracle", |_method, _payload| Ok("42".into())));
//! let plugin = mock::activate::<Asker>("{}").expect("activates");
//! with_host(|host| assert_eq!(host.logged(), ["42"]));
//! plugin.deactivate();
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::marker::PhantomData;

use crate::bindings::exports::keel::plugin0_4_0::plugin::Guest;
use crate::bindings::keel::plugin0_2_0::types::KernelError as RawKernelError;
use crate::{
    ActivateError, CallError, Event, GuardVerdict, KernelError, Level, Plugin, ToolError, ToolSpec,
};

/// A scripted service: answers `(method, payload)`.
type Handler = Box<dyn FnMut(&str, &str) -> Result<String, KernelError>>;

/// The kernel as a test sees it. Fields record what the plugin did, in order.
#[derive(Default)]
pub struct MockHost {
    /// Log lines written.
    pub logs: Vec<(Level, String)>,
    /// Services the plugin provides: `(name, version)`.
    pub provided: Vec<(String, String)>,
    /// Tools registered and not withdrawn.
    pub tools: Vec<ToolSpec>,
    /// Guards registered.
    pub guards: Vec<String>,
    /// Topics subscribed to.
    pub subscriptions: Vec<String>,
    /// Events emitted: `(topic, payload)`.
    pub emitted: Vec<(String, String)>,
    /// Prompt fragments added: `(id, text)`.
    pub fragments: Vec<(String, String)>,
    /// The plugin's kernel-held state.
    pub state: BTreeMap<String, Vec<u8>>,
    /// Service calls the plugin made: `(service, method, payload)`.
    pub calls: Vec<(String, String, String)>,
    /// What `caller::name` answers: the plugin whose call this one serves (empty: none).
    pub caller: String,
    /// What `caller::provider` answers: service → the plugin that provides it.
    pub providers: BTreeMap<String, String>,
    /// What `prompt_context::fragments` answers: every loaded plugin's fragments.
    pub prompt: Vec<crate::prompt_context::PromptFragment>,
    /// What `prompt_context::generation` answers.
    pub generation: u64,
    /// The conversation `conversation::read` reads; `None` (the default): the plugin is not
    /// serving a request that names one, and the read is refused as the kernel refuses it.
    pub conversation: Option<Vec<crate::conversation::Message>>,
    /// What `agents::open` answers; `None` (the default): the plugin is not serving a tool
    /// call, and the opening is refused as the kernel refuses it.
    pub child: Option<crate::agents::ChildScope>,
    /// What `memory::recall` answers; `None` (the default): no plugin provides `memory`.
    pub recalled: Option<Vec<crate::memory::RecalledEntry>>,
    /// The requests `memory::recall` was asked, in order.
    pub recall_requests: Vec<crate::memory::RecallRequest>,
    /// What `compaction::summarize` answers; `None` (the default): no plugin provides
    /// `compaction`.
    pub summary: Option<String>,
    /// The requests `compaction::summarize` was asked, in order.
    pub summarize_requests: Vec<crate::compaction::SummarizeRequest>,
    /// What `tool_registry::list` answers; `None` (the default): no plugin provides
    /// `tool-registry`. `tool_registry::resolve` finds a name here exactly, else answers
    /// `unknown` with no suggestion.
    pub offered_tools: Option<Vec<crate::tool_registry::ToolDef>>,
    /// What `editor::read` answers, by workspace-relative path; a path not here: `None`, as
    /// when no editor drives the session.
    pub editor_files: BTreeMap<String, String>,
    /// What `verifier::verify` answers: `None` (the default): no plugin provides `verifier`;
    /// `Some(None)`: the turn claimed nothing; `Some(Some(verdict))`: that verdict.
    pub verdict: Option<Option<crate::verifier::Verdict>>,
    /// What `model::complete` answers; `None` (the default): no plugin provides `model`.
    pub model_response: Option<crate::model::ModelResponse>,
    /// The requests `model::complete` was asked, in order.
    pub model_requests: Vec<crate::model::ModelRequest>,
    /// The session log: `None` (the default): no plugin provides `session-log`; `Some`: the
    /// entries `session_log::append` and `started` wrote, in order, which `read` answers.
    pub session_log: Option<Vec<crate::session_log::SessionEvent>>,
    services: BTreeMap<String, Handler>,
}

impl std::fmt::Debug for MockHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHost")
            .field("logs", &self.logs)
            .field("provided", &self.provided)
            .field("tools", &self.tools)
            .field("guards", &self.guards)
            .field("subscriptions", &self.subscriptions)
            .field("emitted", &self.emitted)
            .field("fragments", &self.fragments)
            .field("state", &self.state)
            .field("calls", &self.calls)
            .field("caller", &self.caller)
            .field("providers", &self.providers)
            .field("prompt", &self.prompt)
            .field("generation", &self.generation)
            .field("conversation", &self.conversation)
            .field("child", &self.child)
            .field("recalled", &self.recalled)
            .field("recall_requests", &self.recall_requests)
            .field("summary", &self.summary)
            .field("summarize_requests", &self.summarize_requests)
            .field("offered_tools", &self.offered_tools)
            .field("editor_files", &self.editor_files)
            .field("verdict", &self.verdict)
            .field("model_response", &self.model_response)
            .field("model_requests", &self.model_requests)
            .field("session_log", &self.session_log)
            .field("services", &self.services.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MockHost {
    /// Answer calls to the service `name` with `handler(method, payload)`, as another plugin
    /// providing it would. Replaces an earlier handler of the same name.
    pub fn serve(
        &mut self,
        name: &str,
        handler: impl FnMut(&str, &str) -> Result<String, KernelError> + 'static,
    ) {
        self.services.insert(name.to_owned(), Box::new(handler));
    }

    /// The messages of the log lines written, in order.
    pub fn logged(&self) -> Vec<&str> {
        self.logs.iter().map(|(_, m)| m.as_str()).collect()
    }

    /// The registered tool `name`, if any.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}

thread_local! {
    static HOST: RefCell<MockHost> = RefCell::new(MockHost::default());
}

/// Run `f` with this thread's mock host, to script it or look at what the plugin did.
///
/// # Panics
///
/// When called from inside a scripted service handler (the host is busy then).
pub fn with_host<R>(f: impl FnOnce(&mut MockHost) -> R) -> R {
    HOST.with(|host| f(&mut host.borrow_mut()))
}

/// Forget everything this thread's mock host recorded and every scripted service.
pub fn reset() {
    with_host(|host| *host = MockHost::default());
}

/// Activate `P` with `config` the way the kernel does (through the adapter
/// [`export_plugin!`](crate::export_plugin) exports), against this thread's mock host.
/// When activation fails, the host undoes what the plugin registered, as the kernel does.
pub fn activate<P: Plugin>(config: &str) -> Result<Activated<P>, ActivateError> {
    if let Err(e) = crate::__private::Adapter::<P>::activate(config.to_owned()) {
        undo_registrations();
        return Err(e.into());
    }
    Ok(Activated {
        active: true,
        plugin: PhantomData,
    })
}

/// A plugin activated against the mock host; its methods are the kernel's calls into it.
/// Dropping it deactivates the plugin, and the host then undoes what the plugin registered
/// (tools, services, guards, subscriptions, prompt fragments) as the kernel does; its state
/// stays, as it does across a reload.
#[derive(Debug)]
pub struct Activated<P: Plugin> {
    active: bool,
    plugin: PhantomData<P>,
}

impl<P: Plugin> Activated<P> {
    /// Run the tool `name` with JSON `input`, as the kernel does for a model's call.
    pub fn invoke_tool(&self, name: &str, input: &str) -> Result<String, ToolError> {
        crate::__private::Adapter::<P>::invoke_tool(name.to_owned(), input.to_owned())
            .map_err(ToolError::from)
    }

    /// Call `method` of the provided `service`, as another plugin would.
    pub fn handle_call(
        &self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, CallError> {
        crate::__private::Adapter::<P>::handle_call(
            service.to_owned(),
            method.to_owned(),
            payload.to_owned(),
        )
        .map_err(CallError::from)
    }

    /// Deliver an event of `topic`, from `source`.
    pub fn on_event(&self, topic: &str, source: &str, payload: &str) {
        crate::__private::Adapter::<P>::on_event(Event {
            topic: topic.to_owned(),
            source: source.to_owned(),
            payload: payload.to_owned(),
        });
    }

    /// Ask the guard `guard` about the tool call `tool` with `input`.
    pub fn check_tool_call(&self, guard: &str, tool: &str, input: &str) -> GuardVerdict {
        crate::__private::Adapter::<P>::check_tool_call(
            guard.to_owned(),
            tool.to_owned(),
            input.to_owned(),
        )
    }

    /// Deactivate the plugin (dropping does the same).
    pub fn deactivate(mut self) {
        self.active = false;
        unload::<P>();
    }
}

impl<P: Plugin> Drop for Activated<P> {
    fn drop(&mut self) {
        if self.active {
            unload::<P>();
        }
    }
}

/// Deactivate `P` and undo what it registered.
fn unload<P: Plugin>() {
    crate::__private::Adapter::<P>::deactivate();
    undo_registrations();
}

/// Forget the tools, services, guards, subscriptions and prompt fragments registered, as the
/// kernel does when a plugin is unloaded or fails to activate; its state stays.
fn undo_registrations() {
    with_host(|h| {
        h.tools.clear();
        h.provided.clear();
        h.guards.clear();
        h.subscriptions.clear();
        h.fragments.clear();
    });
}

/// What the mock host answers for the doors it does not model.
fn outside(door: &str) -> RawKernelError {
    RawKernelError::Unavailable(format!(
        "the mock host does not reach outside the kernel (`{door}`); test the logic around it"
    ))
}

/// The mock host's side of every kernel import, shaped like the generated bindings so the
/// wrappers are the same inside and outside a component.
pub(crate) mod door {
    use super::{HOST, KernelError, RawKernelError, ToolSpec, outside, with_host};

    pub(crate) mod log {
        use crate::Level;

        pub(crate) fn log(level: Level, message: &str) {
            super::with_host(|h| h.logs.push((level, message.to_owned())));
        }
    }

    pub(crate) mod services {
        use super::{HOST, KernelError, RawKernelError, with_host};

        pub(crate) fn provide(name: &str, version: &str) -> Result<(), RawKernelError> {
            with_host(|h| h.provided.push((name.to_owned(), version.to_owned())));
            Ok(())
        }

        pub(crate) fn call(
            name: &str,
            method: &str,
            payload: &str,
        ) -> Result<String, RawKernelError> {
            let handler = with_host(|h| {
                h.calls
                    .push((name.to_owned(), method.to_owned(), payload.to_owned()));
                h.services.remove(name)
            });
            let Some(mut handler) = handler else {
                return Err(RawKernelError::Unavailable(format!(
                    "no plugin provides `{name}` in the mock host; script it with \
                     `MockHost::serve`"
                )));
            };
            // Taken out while it runs, so it may call back into the host.
            let answer = handler(method, payload);
            HOST.with(|h| {
                h.borrow_mut()
                    .services
                    .entry(name.to_owned())
                    .or_insert(handler);
            });
            answer.map_err(|e: KernelError| e.into())
        }
    }

    pub(crate) mod tools {
        use super::{KernelError, RawKernelError, ToolSpec, with_host};

        pub(crate) fn register(spec: &ToolSpec) -> Result<(), RawKernelError> {
            with_host(|h| {
                if h.tools.iter().any(|t| t.name == spec.name) {
                    return Err(KernelError::Conflict(format!(
                        "tool `{}` is already registered",
                        spec.name
                    ))
                    .into());
                }
                h.tools.push(spec.clone());
                Ok(())
            })
        }

        pub(crate) fn registered() -> Vec<ToolSpec> {
            let mut tools = with_host(|h| h.tools.clone());
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            tools
        }
    }

    pub(crate) mod tool_list {
        use super::{KernelError, RawKernelError, with_host};

        pub(crate) fn unregister(name: &str) -> Result<(), RawKernelError> {
            with_host(|h| {
                let before = h.tools.len();
                h.tools.retain(|t| t.name != name);
                if h.tools.len() == before {
                    return Err(
                        KernelError::Invalid(format!("no tool `{name}` is registered")).into(),
                    );
                }
                Ok(())
            })
        }
    }

    pub(crate) mod guards {
        use super::{RawKernelError, with_host};

        pub(crate) fn register(name: &str) -> Result<(), RawKernelError> {
            with_host(|h| h.guards.push(name.to_owned()));
            Ok(())
        }
    }

    pub(crate) mod events {
        use super::{RawKernelError, with_host};

        pub(crate) fn subscribe(topic: &str) -> Result<(), RawKernelError> {
            with_host(|h| h.subscriptions.push(topic.to_owned()));
            Ok(())
        }

        pub(crate) fn emit(topic: &str, payload: &str) -> Result<(), RawKernelError> {
            with_host(|h| h.emitted.push((topic.to_owned(), payload.to_owned())));
            Ok(())
        }
    }

    pub(crate) mod prompt {
        use super::{RawKernelError, with_host};

        pub(crate) fn add_fragment(id: &str, text: &str) -> Result<(), RawKernelError> {
            with_host(|h| h.fragments.push((id.to_owned(), text.to_owned())));
            Ok(())
        }
    }

    pub(crate) mod state {
        use super::{RawKernelError, with_host};

        pub(crate) fn get(key: &str) -> Option<Vec<u8>> {
            with_host(|h| h.state.get(key).cloned())
        }

        pub(crate) fn set(key: &str, value: &[u8]) -> Result<(), RawKernelError> {
            with_host(|h| h.state.insert(key.to_owned(), value.to_vec()));
            Ok(())
        }

        pub(crate) fn remove(key: &str) {
            with_host(|h| h.state.remove(key));
        }

        pub(crate) fn keys() -> Vec<String> {
            with_host(|h| h.state.keys().cloned().collect())
        }
    }

    pub(crate) mod caller {
        use super::with_host;

        pub(crate) fn name() -> String {
            with_host(|h| h.caller.clone())
        }

        pub(crate) fn provider(service: &str) -> Option<String> {
            with_host(|h| h.providers.get(service.trim()).cloned())
        }
    }

    pub(crate) mod prompt_context {
        pub use crate::bindings::keel::plugin0_5_0::prompt_context::PromptFragment;

        use super::{RawKernelError, with_host};

        pub(crate) fn fragments() -> Result<Vec<PromptFragment>, RawKernelError> {
            Ok(with_host(|h| h.prompt.clone()))
        }

        /// The kernel's fence without its cleaning: enough to test what a plugin does with
        /// fenced text, not the fence itself.
        pub(crate) fn fence(source: &str, text: &str) -> Result<String, RawKernelError> {
            Ok(format!(
                "<external_content source=\"{source}\">\n{text}\n</external_content>"
            ))
        }

        pub(crate) fn generation() -> Result<u64, RawKernelError> {
            Ok(with_host(|h| h.generation))
        }
    }

    pub(crate) mod conversation {
        pub use crate::bindings::keel::plugin0_5_0::conversation::{
            Block, Message, Role, ToolCall, ToolResult,
        };

        use super::{RawKernelError, with_host};

        pub(crate) fn read(from: u32, to: u32) -> Result<Vec<Message>, RawKernelError> {
            with_host(|h| {
                let Some(messages) = &h.conversation else {
                    return Err(RawKernelError::Denied(
                        "`keel.conversation` answers only the model adapter serving a request \
                         that names a held conversation; set `MockHost::conversation`"
                            .into(),
                    ));
                };
                let (from, to) = (from as usize, to as usize);
                if from > to || to > messages.len() {
                    return Err(RawKernelError::Invalid(format!(
                        "messages {from}..{to} are not part of the request, which names the \
                         first {}",
                        messages.len()
                    )));
                }
                Ok(messages[from..to].to_vec())
            })
        }
    }

    pub(crate) mod memory {
        pub use crate::bindings::keel::plugin0_6_0::memory::{RecallRequest, RecalledEntry};

        use super::{RawKernelError, with_host};

        pub(crate) fn recall(
            request: &RecallRequest,
        ) -> Result<Vec<RecalledEntry>, RawKernelError> {
            with_host(|h| {
                h.recall_requests.push(request.clone());
                h.recalled.clone().ok_or_else(|| {
                    RawKernelError::Unavailable(
                        "no plugin provides `memory` in the mock host; set \
                         `MockHost::recalled`"
                            .into(),
                    )
                })
            })
        }
    }

    pub(crate) mod compaction {
        pub use crate::bindings::keel::plugin0_6_0::compaction::SummarizeRequest;

        use super::{RawKernelError, with_host};

        pub(crate) fn summarize(request: &SummarizeRequest) -> Result<String, RawKernelError> {
            with_host(|h| {
                h.summarize_requests.push(request.clone());
                h.summary.clone().ok_or_else(|| {
                    RawKernelError::Unavailable(
                        "no plugin provides `compaction` in the mock host; set \
                         `MockHost::summary`"
                            .into(),
                    )
                })
            })
        }
    }

    pub(crate) mod tool_registry {
        pub use crate::bindings::keel::plugin0_6_0::tool_registry::{
            DisabledTool, Resolution, ToolDef,
        };

        use super::{RawKernelError, with_host};

        fn offered() -> Result<Vec<ToolDef>, RawKernelError> {
            with_host(|h| h.offered_tools.clone()).ok_or_else(|| {
                RawKernelError::Unavailable(
                    "no plugin provides `tool-registry` in the mock host; set \
                     `MockHost::offered_tools`"
                        .into(),
                )
            })
        }

        pub(crate) fn list() -> Result<Vec<ToolDef>, RawKernelError> {
            offered()
        }

        pub(crate) fn resolve(name: &str) -> Result<Resolution, RawKernelError> {
            Ok(if offered()?.iter().any(|t| t.name == name) {
                Resolution::Found(name.to_owned())
            } else {
                Resolution::Unknown(Vec::new())
            })
        }
    }

    pub(crate) mod verifier {
        use crate::bindings::keel::plugin0_6_0::verifier_types::{Verdict, VerifyRequest};

        use super::{RawKernelError, with_host};

        pub(crate) fn verify(_request: &VerifyRequest) -> Result<Option<Verdict>, RawKernelError> {
            with_host(|h| h.verdict.clone()).ok_or_else(|| {
                RawKernelError::Unavailable(
                    "no plugin provides `verifier` in the mock host; set `MockHost::verdict`"
                        .into(),
                )
            })
        }
    }

    pub(crate) mod model {
        use crate::bindings::keel::plugin0_7_0::model_types::{ModelRequest, ModelResponse};

        use super::{RawKernelError, with_host};

        pub(crate) fn complete(request: &ModelRequest) -> Result<ModelResponse, RawKernelError> {
            with_host(|h| {
                h.model_requests.push(request.clone());
                h.model_response.clone().ok_or_else(|| {
                    RawKernelError::Unavailable(
                        "no plugin provides `model` in the mock host; set \
                         `MockHost::model_response`"
                            .into(),
                    )
                })
            })
        }
    }

    pub(crate) mod session_log {
        use crate::bindings::keel::plugin0_8_0::session_log_types::{
            Entry, LogHealth, LogLine, LogRead, LoggedConversation, SessionEvent, SessionSummary,
        };

        use super::{RawKernelError, with_host};

        fn no_log() -> RawKernelError {
            RawKernelError::Unavailable(
                "no plugin provides `session-log` in the mock host; set `MockHost::session_log`"
                    .into(),
            )
        }

        pub(crate) fn append(event: &SessionEvent) -> Result<u64, RawKernelError> {
            with_host(|h| {
                let log = h.session_log.as_mut().ok_or_else(no_log)?;
                log.push(event.clone());
                Ok(log.len() as u64 - 1)
            })
        }

        pub(crate) fn started(session: &str, calls: &[String]) -> Result<u64, RawKernelError> {
            append(&SessionEvent {
                through: Vec::new(),
                session: session.to_owned(),
                entry: Entry::ToolStarted(calls.to_vec()),
            })
        }

        pub(crate) fn list() -> Result<Vec<SessionSummary>, RawKernelError> {
            Err(RawKernelError::Unavailable(
                "the mock host does not list sessions; test the logic around it".into(),
            ))
        }

        pub(crate) fn read(session: &str) -> Result<LogRead, RawKernelError> {
            with_host(|h| {
                let log = h.session_log.as_ref().ok_or_else(no_log)?;
                Ok(LogRead {
                    lines: log
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| e.session == session)
                        .map(|(seq, e)| LogLine {
                            seq: seq as u64,
                            time_ms: 0,
                            event: e.clone(),
                        })
                        .collect(),
                    warnings: Vec::new(),
                })
            })
        }

        pub(crate) fn conversation(_session: &str) -> Result<LoggedConversation, RawKernelError> {
            Err(RawKernelError::Unavailable(
                "the mock host does not rebuild conversations; test the logic around it".into(),
            ))
        }

        pub(crate) fn resume(session: &str) -> Result<LoggedConversation, RawKernelError> {
            conversation(session)
        }

        pub(crate) fn health() -> Result<LogHealth, RawKernelError> {
            with_host(|h| h.session_log.as_ref().map(|_| ()).ok_or_else(no_log))?;
            Ok(LogHealth {
                failed: 0,
                error: None,
            })
        }
    }

    pub(crate) mod typed_agent {
        use crate::bindings::keel::plugin0_6_0::verifier_types::ToolOutcome;
        use crate::bindings::keel::plugin0_7_0::model_types::{ModelRequest, ModelResponse};

        use super::{RawKernelError, outside};

        pub(crate) fn complete(_request: &ModelRequest) -> Result<ModelResponse, RawKernelError> {
            Err(outside("agent"))
        }

        pub(crate) fn dispatch(_call_ids: &[String]) -> Vec<ToolOutcome> {
            Vec::new()
        }

        pub(crate) fn replay(_call_id: &str) -> Result<ToolOutcome, RawKernelError> {
            Err(outside("agent"))
        }
    }

    pub(crate) mod editor {
        use super::{RawKernelError, with_host};

        pub(crate) fn read(path: &str) -> Result<Option<String>, RawKernelError> {
            Ok(with_host(|h| h.editor_files.get(path).cloned()))
        }
    }

    pub(crate) mod turns {
        pub use crate::bindings::keel::plugin0_6_0::turns::{
            Compacted, LoadRequest, TurnEnd, TurnReport, TurnRequest, Usage,
        };

        use super::RawKernelError;

        fn unavailable() -> RawKernelError {
            RawKernelError::Unavailable(
                "the mock host runs no agent; test the plugin's logic around its turns".into(),
            )
        }

        pub(crate) fn turn(_request: &TurnRequest) -> Result<TurnReport, RawKernelError> {
            Err(unavailable())
        }

        pub(crate) fn load(_request: &LoadRequest) -> Result<u32, RawKernelError> {
            Err(unavailable())
        }

        pub(crate) fn compact(_session: &str, _focus: &str) -> Result<Compacted, RawKernelError> {
            Err(unavailable())
        }
    }

    pub(crate) mod agents {
        pub use crate::bindings::keel::plugin0_5_0::agents::{ChildScope, OpenRequest};

        use super::{RawKernelError, with_host};

        pub(crate) fn open(_request: &OpenRequest) -> Result<ChildScope, RawKernelError> {
            with_host(|h| {
                h.child.clone().ok_or_else(|| {
                    RawKernelError::Denied(
                        "not serving a tool call; a child agent is opened for the tool call \
                         that asks for it (set `MockHost::child`)"
                            .into(),
                    )
                })
            })
        }
    }

    pub(crate) mod http {
        pub use crate::bindings::keel::plugin0_2_0::http::{
            Header, Request, ResponseHead, SecretHeader,
        };

        use super::{RawKernelError, outside};

        pub(crate) fn send(_request: &Request) -> Result<(u32, ResponseHead), RawKernelError> {
            Err(outside("http"))
        }

        pub(crate) fn next_chunk(
            _body: u32,
            _idle_ms: u32,
        ) -> Result<Option<Vec<u8>>, RawKernelError> {
            Err(outside("http"))
        }

        pub(crate) fn close(_body: u32) {}
    }

    pub(crate) mod http_resources {
        use crate::bindings::keel::plugin0_2_0::http::{Request, ResponseHead};

        use super::{RawKernelError, outside};

        /// A body never opened: the mock reaches no network.
        #[derive(Debug)]
        pub struct Body;

        impl Body {
            pub(crate) fn next_chunk(
                &self,
                _idle_ms: u32,
            ) -> Result<Option<Vec<u8>>, RawKernelError> {
                Err(outside("http"))
            }
        }

        pub(crate) fn send(_request: &Request) -> Result<(ResponseHead, Body), RawKernelError> {
            Err(outside("http"))
        }
    }

    pub(crate) mod process_resources {
        use crate::bindings::keel::plugin0_3_0::processes::ProcessStatus;

        use super::{RawKernelError, outside};

        /// A process never started: the mock runs no program.
        #[derive(Debug)]
        pub struct Process;

        impl Process {
            pub(crate) fn id(&self) -> u32 {
                0
            }

            pub(crate) fn write(
                &self,
                _bytes: &[u8],
                _timeout_ms: u32,
            ) -> Result<(), RawKernelError> {
                Err(outside("processes"))
            }

            pub(crate) fn read(
                &self,
                _max_bytes: u32,
                _timeout_ms: u32,
            ) -> Result<Option<Vec<u8>>, RawKernelError> {
                Err(outside("processes"))
            }

            pub(crate) fn status(&self) -> Result<ProcessStatus, RawKernelError> {
                Err(outside("processes"))
            }
        }

        pub(crate) fn start(_entry: &str) -> Result<Process, RawKernelError> {
            Err(outside("processes"))
        }
    }

    pub(crate) mod exec {
        pub use crate::bindings::keel::plugin0_2_0::exec::{Command, Outcome};

        use super::{RawKernelError, outside};

        pub(crate) fn run(_command: &Command) -> Result<Outcome, RawKernelError> {
            Err(outside("exec"))
        }
    }

    pub(crate) mod agent {
        use super::{RawKernelError, outside};

        pub(crate) fn complete(_request: &str) -> Result<String, RawKernelError> {
            Err(outside("agent"))
        }

        pub(crate) fn dispatch(_call_ids: &[String]) -> Vec<String> {
            Vec::new()
        }

        pub(crate) fn replay(_call_id: &str) -> Result<String, RawKernelError> {
            Err(outside("agent"))
        }

        pub(crate) fn cancelled() -> bool {
            false
        }
    }

    pub(crate) mod processes {
        pub use crate::bindings::keel::plugin0_3_0::processes::ProcessStatus;

        use super::{RawKernelError, outside};

        pub(crate) fn entries() -> Vec<String> {
            Vec::new()
        }

        pub(crate) fn start(_entry: &str) -> Result<u32, RawKernelError> {
            Err(outside("processes"))
        }

        pub(crate) fn write(
            _process: u32,
            _bytes: &[u8],
            _timeout_ms: u32,
        ) -> Result<(), RawKernelError> {
            Err(outside("processes"))
        }

        pub(crate) fn read(
            _process: u32,
            _max_bytes: u32,
            _timeout_ms: u32,
        ) -> Result<Option<Vec<u8>>, RawKernelError> {
            Err(outside("processes"))
        }

        pub(crate) fn status(_process: u32) -> Result<ProcessStatus, RawKernelError> {
            Err(outside("processes"))
        }

        pub(crate) fn kill(_process: u32) {}
    }
}
