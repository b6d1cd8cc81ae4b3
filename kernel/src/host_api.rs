//! The one door from a plugin into the kernel. Every host import a plugin can reach (WIT
//! imports for components, the callback table for native libraries) ends in a method of
//! [`HostHandle`]; none of them can reach the gates, another plugin's state, or the lifecycle.

use std::sync::{Arc, Weak};

use crate::call_chain::CallChain;
use crate::env::Effect;
use crate::lifecycle::Shared;
use crate::manifest::Manifest;
use crate::net_client::{HttpHead, HttpRequest};
use crate::sandbox::runner::{ExecCommand, ExecOutcome};
use crate::types::{KernelError, Level, ToolSpec};

/// Topics only the plugin serving `agent` may emit.
const AGENTS_TOPICS: &[&str] = &[
    keel_protocol::topics::SESSION_EVENT,
    keel_protocol::topics::COMPACTION_STATUS,
];

/// A plugin instance's handle on the kernel. Cheap to clone; holds the kernel weakly so an
/// instance never keeps a dropped kernel alive.
#[derive(Clone)]
pub struct HostHandle {
    shared: Weak<Shared>,
    plugin: Arc<str>,
    generation: u64,
    chain: CallChain,
    /// An extra instance that only serves calls (see `limits.instances`): what it registers
    /// at activation the plugin's first instance already holds, so it changes nothing.
    extra: bool,
}

impl std::fmt::Debug for HostHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostHandle")
            .field("plugin", &self.plugin)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl HostHandle {
    pub(crate) fn new(shared: Weak<Shared>, plugin: &str, generation: u64) -> Self {
        HostHandle {
            shared,
            plugin: Arc::from(plugin),
            generation,
            chain: CallChain::starting_at(plugin),
            extra: false,
        }
    }

    /// The handle of an extra instance of `plugin` that only serves calls.
    pub(crate) fn extra(shared: Weak<Shared>, plugin: &str, generation: u64) -> Self {
        HostHandle {
            extra: true,
            ..HostHandle::new(shared, plugin, generation)
        }
    }

    /// Count `bytes` that crossed between this plugin and the kernel.
    fn crossed(&self, shared: &Shared, bytes: usize) {
        shared.boundary.crossed(bytes);
    }

    /// The plugin this handle belongs to.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Set the call chain of the call about to run in this plugin; calls it makes carry it.
    pub fn enter(&mut self, chain: &CallChain) {
        self.chain = chain.clone();
    }

    /// The chain of the call running (or last run) in this plugin.
    pub fn chain(&self) -> &CallChain {
        &self.chain
    }

    fn shared(&self) -> Result<Arc<Shared>, KernelError> {
        self.shared
            .upgrade()
            .ok_or_else(|| KernelError::Unavailable("the kernel has shut down".into()))
    }

    /// Write a log line tagged with the plugin's name.
    pub fn log(&self, level: Level, message: &str) {
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn effect(&self, effect: Effect) -> Result<(), KernelError> {
        if self.extra {
            // The environment is the first instance's to change; an extra instance's
            // activation repeats its registrations, which are already in place.
            return Ok(());
        }
        self.shared()?
            .apply_effect(&self.plugin, self.generation, effect)
    }

    /// Start serving `name` at `version` (must be declared under `provides`).
    pub fn provide(&self, name: &str, version: &str) -> Result<(), KernelError> {
        let version = semver::Version::parse(version).map_err(|e| {
            KernelError::Invalid(format!(
                "service `{name}`: version `{version}` is not semver ({e}); use e.g. `1.0.0`"
            ))
        })?;
        self.effect(Effect::ProvideService {
            name: name.to_owned(),
            version,
        })
    }

    /// Register a tool.
    pub fn register_tool(&self, spec: ToolSpec) -> Result<(), KernelError> {
        self.effect(Effect::RegisterTool(spec))
    }

    /// Receive events of `topic`.
    pub fn subscribe(&self, topic: &str) -> Result<(), KernelError> {
        self.effect(Effect::Subscribe {
            topic: topic.to_owned(),
        })
    }

    /// Add a system-prompt fragment under `id`.
    pub fn add_prompt_fragment(&self, id: &str, text: &str) -> Result<(), KernelError> {
        self.effect(Effect::AddPromptFragment {
            id: id.to_owned(),
            text: text.to_owned(),
        })
    }

    /// Emit an event to every other subscriber of `topic`.
    pub fn emit(&self, topic: &str, payload: &str) -> Result<(), KernelError> {
        let shared = self.shared()?;
        if !self.manifest(&shared)?.may_emit(topic) {
            return Err(KernelError::Denied(format!(
                "plugin `{}` did not declare the event topic `{topic}`; add \
                 `emits = [\"{topic}\"]` under [capabilities] in its keel.toml",
                self.plugin
            )));
        }
        // The session's record and its compaction status are the agent's to say: only the
        // plugin serving `agent` may emit them, so the session log never holds an entry
        // another plugin forged, and no other plugin sets off the person's pre-compact hooks.
        if AGENTS_TOPICS.contains(&topic)
            && shared
                .provider_of(keel_protocol::services::AGENT)
                .as_deref()
                != Some(&*self.plugin)
        {
            return Err(KernelError::Denied(format!(
                "only the plugin that provides `{}` may emit `{topic}`; `{}` does not",
                keel_protocol::services::AGENT,
                self.plugin
            )));
        }
        if topic == keel_protocol::topics::SUBAGENT_EVENT {
            self.check_subagent_event(payload)?;
        }
        shared.emit_from_plugin(&self.plugin, self.generation, topic, payload)
    }

    /// A child agent's log entry comes only from the plugin serving that child's call, and
    /// names that call and child: no plugin can file entries under another call.
    fn check_subagent_event(&self, payload: &str) -> Result<(), KernelError> {
        let Some(child) = self.chain.opened_agent() else {
            return Err(KernelError::Denied(format!(
                "plugin `{}` has no child agent open in this call, so it cannot emit `{}`",
                self.plugin,
                keel_protocol::topics::SUBAGENT_EVENT
            )));
        };
        let event: keel_protocol::SubagentEvent = serde_json::from_str(payload).map_err(|e| {
            KernelError::Invalid(format!("`subagent.event` takes a SubagentEvent: {e}"))
        })?;
        if event.child != child.id || event.parent_call != child.parent_call {
            return Err(KernelError::Denied(format!(
                "plugin `{}` serves {} for call `{}`; an entry naming child {} of call `{}` is \
                 refused",
                self.plugin,
                child.name(),
                child.parent_call,
                event.child,
                event.parent_call
            )));
        }
        Ok(())
    }

    /// The value of `key` in this plugin's kernel-held state.
    pub fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        let shared = self.shared().ok()?;
        let value = shared.state_get(&self.plugin, key);
        self.crossed(&shared, value.as_ref().map_or(0, Vec::len));
        value
    }

    /// Store `value` under `key` in this plugin's kernel-held state.
    pub fn state_set(&self, key: &str, value: Vec<u8>) -> Result<(), KernelError> {
        let shared = self.shared()?;
        self.crossed(&shared, value.len());
        shared.state_set(&self.plugin, self.generation, key, value)
    }

    /// Remove `key` from this plugin's kernel-held state.
    pub fn state_remove(&self, key: &str) {
        if let Ok(shared) = self.shared() {
            shared.state_remove(&self.plugin, self.generation, key);
        }
    }

    /// Every key of this plugin's kernel-held state, sorted.
    pub fn state_keys(&self) -> Vec<String> {
        self.shared()
            .map(|s| s.state_keys(&self.plugin))
            .unwrap_or_default()
    }

    /// Call `method` of service `name` through the kernel.
    pub async fn call(
        &self,
        name: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, KernelError> {
        let shared = if name == keel_protocol::services::EDITOR {
            self.editor_reader()?
        } else {
            self.declared(name)?
        };
        let answer = shared
            .call_service(&self.chain, name, method, payload)
            .await;
        self.crossed(
            &shared,
            payload.len() + answer.as_ref().map_or(0, String::len),
        );
        answer
    }

    /// A typed service call (ABI 0.6.0's `memory`, `compaction`), through the same
    /// declaration check and routing as [`Self::call`].
    pub async fn call_typed(
        &self,
        call: &crate::ServiceCall,
    ) -> Result<crate::ServiceAnswer, KernelError> {
        let shared = self.declared(call.service())?;
        let answer = shared.call_service_typed(&self.chain, call).await;
        self.crossed(
            &shared,
            call.bytes() + answer.as_ref().map_or(0, crate::ServiceAnswer::bytes),
        );
        answer
    }

    /// The kernel, when this plugin may read through the editor: it declared `keel.editor`,
    /// and it may read the whole workspace anyway (the file tools), since through the editor
    /// it reads workspace files.
    fn editor_reader(&self) -> Result<Arc<Shared>, KernelError> {
        let shared = self.declared(keel_protocol::services::EDITOR)?;
        let whole_workspace = self.manifest(&shared)?.capabilities.dirs.iter().any(|d| {
            d.path
                .components()
                .all(|c| c == std::path::Component::CurDir)
        });
        if !whole_workspace {
            return Err(KernelError::Denied(format!(
                "plugin `{}` may not read through the editor: only a plugin granted the whole \
                 workspace (`dirs = [{{ path = \".\" … }}]`) may",
                self.plugin
            )));
        }
        Ok(shared)
    }

    /// `keel.editor` `read`, typed (ABI 0.6.0): the editor's text of workspace file `path`.
    pub async fn editor_read(&self, path: &str) -> Result<Option<String>, KernelError> {
        let shared = self.editor_reader()?;
        let text = shared
            .editor
            .read_path(shared.gates.workspace.as_deref(), path)
            .await;
        self.crossed(
            &shared,
            path.len()
                + text
                    .as_ref()
                    .ok()
                    .and_then(Option::as_ref)
                    .map_or(0, String::len),
        );
        text
    }

    /// The kernel, when this plugin declared that it calls `service`: a plugin calls only
    /// what its manifest declares, and so what the person consented to. Every door to a
    /// service passes here, the JSON one ([`Self::call`]) and the kernel's typed ones.
    fn declared(&self, service: &str) -> Result<Arc<Shared>, KernelError> {
        let shared = self.shared()?;
        if !self.manifest(&shared)?.may_call(service) {
            return Err(KernelError::Denied(format!(
                "plugin `{}` did not declare the service `{service}`; add it under [requires] \
                 in its keel.toml, or `services = [\"{service}\"]` under [capabilities] for one \
                 it uses only when present",
                self.plugin
            )));
        }
        // The person's hooks run at keel's points only (around a turn, before and after a tool
        // call): a plugin calling the `hooks` service could run them when it likes, with the
        // session, tool and arguments it made up.
        if service == crate::dispatch::HOOKS_SERVICE {
            return Err(KernelError::Denied(format!(
                "plugin `{}` may not call `{service}`: the person's hooks run only when keel \
                 runs them",
                self.plugin
            )));
        }
        Ok(shared)
    }

    /// `keel.caller` `name`, typed: the plugin whose call this one serves; empty outside a
    /// call (and once the plugin is no longer loaded).
    pub fn caller_name(&self) -> String {
        self.declared(crate::manifest::CALLER_SERVICE)
            .map(|_| Shared::caller_name(&self.chain))
            .unwrap_or_default()
    }

    /// `keel.caller` `provider`, typed: the plugin that provides `service` now.
    pub fn caller_provider(&self, service: &str) -> Option<String> {
        self.declared(crate::manifest::CALLER_SERVICE)
            .ok()?
            .provider_of(service.trim())
    }

    /// `keel.prompt` `fragments`, typed.
    pub fn prompt_fragments(&self) -> Result<Vec<keel_protocol::PromptFragment>, KernelError> {
        Ok(self
            .declared(keel_protocol::services::PROMPT)?
            .prompt_fragments())
    }

    /// `keel.prompt` `fence`, typed.
    pub fn prompt_fence(&self, source: &str, text: &str) -> Result<String, KernelError> {
        self.declared(keel_protocol::services::PROMPT)?;
        Ok(crate::lifecycle::fence_data(source, text))
    }

    /// `keel.prompt` `generation`, typed.
    pub fn prompt_generation(&self) -> Result<u64, KernelError> {
        Ok(self
            .declared(keel_protocol::services::PROMPT)?
            .prompt_generation())
    }

    /// `keel.conversation` `read`, typed: the messages parsed from the texts the agent kept
    /// (the JSON door hands those texts on unparsed).
    pub fn conversation_read(
        &self,
        range: keel_protocol::ConversationRead,
    ) -> Result<Vec<keel_protocol::Message>, KernelError> {
        let shared = self.declared(keel_protocol::services::CONVERSATION)?;
        shared.read_conversation(&self.chain, range, |texts| {
            self.crossed(&shared, texts.iter().map(|t| t.len()).sum());
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    serde_json::from_str(text).map_err(|e| {
                        KernelError::Invalid(format!(
                            "message {} of the conversation is not a message the agent \
                                 could have sent: {e}",
                            range.from + i
                        ))
                    })
                })
                .collect()
        })
    }

    /// `keel.agents` `open`, typed.
    pub fn agents_open(
        &self,
        request: &keel_protocol::OpenChild,
    ) -> Result<keel_protocol::ChildScope, KernelError> {
        self.declared(keel_protocol::services::AGENTS)?
            .open_child(&self.chain, request)
    }

    /// Every registered tool, sorted by name.
    pub fn tools(&self) -> Vec<ToolSpec> {
        self.shared().map(|s| s.tools()).unwrap_or_default()
    }

    /// Register the guard `name`; the kernel asks this plugin about every tool call.
    pub fn register_guard(&self, name: &str) -> Result<(), KernelError> {
        self.effect(Effect::RegisterGuard {
            name: name.to_owned(),
        })
    }

    fn manifest(&self, shared: &Shared) -> Result<Arc<Manifest>, KernelError> {
        shared
            .manifest_of(&self.plugin)
            .ok_or_else(|| KernelError::Denied(format!("plugin `{}` is not loaded", self.plugin)))
    }

    /// Send an HTTP request through the network gate.
    pub async fn http_send(&self, request: HttpRequest) -> Result<(u32, HttpHead), KernelError> {
        let shared = self.shared()?;
        let manifest = self.manifest(&shared)?;
        let caps = &manifest.capabilities;
        if caps.network.is_empty() {
            return Err(KernelError::Denied(format!(
                "plugin `{}` has no `network` capability; list the hosts it may reach under \
                 [capabilities] network in its keel.toml",
                self.plugin
            )));
        }
        self.crossed(&shared, request.body.len());
        let gates = shared.gates.clone();
        let send = gates.net.send(
            &self.plugin,
            &caps.network,
            &caps.secrets,
            request,
            gates.approver.clone(),
        );
        let result = gates.unless_cancelled("the request", send).await;
        if let Ok((_, head)) = &result
            && let Ok(url) = url::Url::parse(&head.url)
            && let Some(host) = url.host_str()
        {
            gates.note_host(&self.plugin, host);
        }
        result
    }

    /// A request body from the plugin's memory, as [`Self::http_send`] takes it: in the buffer
    /// the kernel keeps for the next request (a detached handle copies it plainly; its send
    /// is refused anyway).
    pub(crate) fn http_request_body(&self, body: &[u8]) -> bytes::Bytes {
        match self.shared() {
            Ok(shared) => shared.gates.net.request_body(body),
            Err(_) => bytes::Bytes::copy_from_slice(body),
        }
    }

    /// The next chunk of an HTTP response body.
    pub async fn http_next_chunk(
        &self,
        body: u32,
        idle: std::time::Duration,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let shared = self.shared()?;
        let gates = shared.gates.clone();
        let chunk = gates.net.next_chunk(&self.plugin, body, idle);
        let chunk = gates.unless_cancelled("the response stream", chunk).await;
        if let Ok(Some(bytes)) = &chunk {
            self.crossed(&shared, bytes.len());
        }
        chunk
    }

    /// Release an HTTP response body.
    pub fn http_close(&self, body: u32) {
        if let Ok(shared) = self.shared() {
            shared.gates.net.close(&self.plugin, body);
        }
    }

    /// Run a command through the exec gate.
    pub async fn exec(&self, command: ExecCommand) -> Result<ExecOutcome, KernelError> {
        let shared = self.shared()?;
        if !self.manifest(&shared)?.capabilities.exec {
            return Err(KernelError::Denied(format!(
                "plugin `{}` has no `exec` capability; add `exec = true` under [capabilities] \
                 in its keel.toml",
                self.plugin
            )));
        }
        self.crossed(&shared, command.line.len());
        let gates = shared.gates.clone();
        let outcome = gates.run_exec(&self.plugin, command).await;
        if let Ok(outcome) = &outcome {
            self.crossed(&shared, outcome.output.len());
        }
        outcome
    }

    /// The shared kernel, if this plugin declared `processes`.
    fn processes_shared(&self) -> Result<Arc<Shared>, KernelError> {
        let shared = self.shared()?;
        if !self.manifest(&shared)?.capabilities.processes {
            return Err(KernelError::Denied(format!(
                "plugin `{}` has no `processes` capability; add `processes = true` under \
                 [capabilities] in its keel.toml",
                self.plugin
            )));
        }
        Ok(shared)
    }

    /// The entries of the person's config this plugin may start, sorted.
    pub fn process_entries(&self) -> Vec<String> {
        self.processes_shared()
            .ok()
            .and_then(|s| {
                s.gates
                    .process_entries(&self.plugin)
                    .map(|e| e.keys().cloned().collect())
            })
            .unwrap_or_default()
    }

    /// Start the program of `entry` (an entry of the person's config for this plugin).
    pub fn process_start(&self, entry: &str) -> Result<u32, KernelError> {
        if self.extra {
            return Err(KernelError::Denied(format!(
                "an extra instance of `{}` cannot start processes; its first instance owns them",
                self.plugin
            )));
        }
        let shared = self.processes_shared()?;
        let Some(config) = shared
            .gates
            .process_entries(&self.plugin)
            .and_then(|e| e.get(entry))
            .cloned()
        else {
            return Err(KernelError::Denied(format!(
                "plugin `{}` may not start `{entry}`: the person's config lists no such entry \
                 for it (for the MCP client: `keel mcp add {entry} -- COMMAND ARGS…`)",
                self.plugin
            )));
        };
        let notify = {
            let (weak, plugin) = (self.shared.clone(), self.plugin.clone());
            let id = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
            let id2 = id.clone();
            (
                Box::new(move || {
                    if let Some(s) = weak.upgrade() {
                        let id = id2.load(std::sync::atomic::Ordering::SeqCst);
                        s.notify_plugin(&plugin, crate::processes::OUTPUT_TOPIC, id.to_string());
                    }
                }) as Box<dyn Fn() + Send + Sync>,
                id,
            )
        };
        let (notify, id_cell) = notify;
        let gates = shared.gates.clone();
        let (id, running) = crate::processes::start(
            &gates,
            &gates.processes,
            &self.plugin,
            entry,
            &config,
            notify,
        )?;
        id_cell.store(id, std::sync::atomic::Ordering::SeqCst);
        // Recorded in the environment, so an unload's undo kills it; refused (and so dropped,
        // which kills it) when this instance may no longer change the environment.
        self.effect(Effect::StartProcess {
            id,
            entry: entry.to_owned(),
        })?;
        gates.processes.insert(id, running);
        Ok(id)
    }

    /// Write to the stdin of this plugin's process `id`.
    pub async fn process_write(
        &self,
        id: u32,
        bytes: &[u8],
        timeout: std::time::Duration,
    ) -> Result<(), KernelError> {
        let shared = self.processes_shared()?;
        let gates = shared.gates.clone();
        gates
            .processes
            .write(&self.plugin, id, bytes, timeout)
            .await
    }

    /// Read from the stdout of this plugin's process `id`; the person's Ctrl-C ends the wait
    /// of a read serving the turn.
    pub async fn process_read(
        &self,
        id: u32,
        max: usize,
        timeout: std::time::Duration,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let shared = self.processes_shared()?;
        let gates = shared.gates.clone();
        let read = gates.processes.read(&self.plugin, id, max, timeout);
        if self.chain.interruptible() {
            gates
                .unless_cancelled("reading the server's answer", read)
                .await
        } else {
            read.await
        }
    }

    /// Whether this plugin's process `id` runs.
    pub fn process_status(&self, id: u32) -> Result<crate::processes::ProcessStatus, KernelError> {
        self.processes_shared()?
            .gates
            .processes
            .status(&self.plugin, id)
    }

    /// Kill this plugin's process `id` and its group.
    pub fn process_kill(&self, id: u32) {
        let _ = self.effect(Effect::StopProcess { id });
    }

    /// Withdraw the tool `name`, which this plugin registered.
    pub fn withdraw_tool(&self, name: &str) -> Result<(), KernelError> {
        self.effect(Effect::WithdrawTool {
            name: name.to_owned(),
        })
    }

    fn agent_shared(&self) -> Result<Arc<Shared>, KernelError> {
        let shared = self.shared()?;
        if !self.manifest(&shared)?.capabilities.agent {
            return Err(KernelError::Denied(format!(
                "plugin `{}` has no `agent` capability; add `agent = true` under \
                 [capabilities] in its keel.toml",
                self.plugin
            )));
        }
        Ok(shared)
    }

    /// The doors that drive a conversation (`complete`, `dispatch`): the plugin serving
    /// `agent` drives the person's; any other drives only a child it opened for the tool
    /// call it serves.
    fn driver_shared(&self) -> Result<Arc<Shared>, KernelError> {
        let shared = self.agent_shared()?;
        if self.chain.opened_agent().is_none()
            && shared
                .provider_of(keel_protocol::services::AGENT)
                .as_deref()
                != Some(&*self.plugin)
        {
            return Err(KernelError::Denied(format!(
                "plugin `{}` does not provide `{}`; it may ask the model and dispatch calls \
                 only for a child agent it opened (`{}` `open`)",
                self.plugin,
                keel_protocol::services::AGENT,
                keel_protocol::services::AGENTS
            )));
        }
        Ok(shared)
    }

    /// Ask the model for the next assistant message (the kernel records its tool calls):
    /// `agent.complete`'s JSON door (ABI 0.2.0 to 0.6.0).
    pub async fn agent_complete(&self, request: &str) -> Result<String, KernelError> {
        let shared = self.driver_shared()?;
        shared.boundary.step_begins(&self.plugin);
        let answer = shared
            .agent_complete(&self.chain, Some(&self.plugin), request)
            .await;
        self.crossed(
            &shared,
            request.len() + answer.as_ref().map_or(0, String::len),
        );
        answer
    }

    /// `agent.complete` typed (ABI 0.7.0): the same call in records.
    pub async fn agent_complete_typed(
        &self,
        request: keel_protocol::ModelRequest,
    ) -> Result<keel_protocol::ModelResponse, KernelError> {
        let shared = self.driver_shared()?;
        shared.boundary.step_begins(&self.plugin);
        let sent = crate::typed_services::request_bytes(&request);
        let answer = shared
            .agent_complete_typed(&self.chain, Some(&self.plugin), request)
            .await;
        self.crossed(
            &shared,
            sent + answer
                .as_ref()
                .map_or(0, crate::typed_services::response_bytes),
        );
        answer
    }

    /// Dispatch recorded tool calls through the gate pipeline: `agent.dispatch`'s JSON door.
    pub async fn agent_dispatch(&self, call_ids: &[String]) -> Vec<String> {
        self.agent_dispatch_typed(call_ids)
            .await
            .iter()
            .map(|o| serde_json::to_string(o).unwrap_or_default())
            .collect()
    }

    /// Dispatch recorded tool calls through the gate pipeline, each outcome a record.
    pub async fn agent_dispatch_typed(
        &self,
        call_ids: &[String],
    ) -> Vec<keel_protocol::ToolOutcome> {
        match self.driver_shared() {
            Ok(shared) => {
                let outcomes = shared.agent_dispatch(&self.chain, call_ids).await;
                self.crossed(&shared, outcomes.iter().map(|o| o.content.len()).sum());
                outcomes
            }
            Err(e) => call_ids
                .iter()
                .map(|id| keel_protocol::ToolOutcome {
                    call_id: id.clone(),
                    tool: String::new(),
                    status: keel_protocol::OutcomeStatus::Refused,
                    content: e.to_string(),
                    exec: Vec::new(),
                    spill: None,
                })
                .collect(),
        }
    }

    /// Replay an approved call of the current turn: `agent.replay`'s JSON door.
    pub async fn agent_replay(&self, call_id: &str) -> Result<String, KernelError> {
        let outcome = self.agent_replay_typed(call_id).await?;
        serde_json::to_string(&outcome)
            .map_err(|e| KernelError::Failed(format!("cannot encode the outcome: {e}")))
    }

    /// Replay an approved call of the current turn, its outcome a record.
    pub async fn agent_replay_typed(
        &self,
        call_id: &str,
    ) -> Result<keel_protocol::ToolOutcome, KernelError> {
        self.agent_shared()?
            .agent_replay(&self.chain, call_id)
            .await
    }

    /// Whether the person asked to stop the current turn.
    pub fn agent_cancelled(&self) -> bool {
        self.shared().is_ok_and(|s| s.gates.is_cancelled())
    }
}
