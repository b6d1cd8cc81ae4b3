//! The kernel proper: plugin records and their states, load / unload / reload, the settle
//! loop that activates and deactivates plugins as their providers come and go, and the
//! mediation of every call between plugins.
//!
//! Locking: `Shared::inner` (a std mutex) guards the environment and the records and is never
//! held across an await. Each plugin's instance sits in its own async `slot` mutex, held for
//! the whole of a call into it, so a reload that takes the slot waits for the in-flight call
//! and makes new calls queue behind it. `Shared::lifecycle` serializes load, unload, reload
//! and settle.
//!
//! The jobs live in files of their own under `lifecycle/`: `settle` (activation, unload,
//! reload), `calls` (the call path into a plugin, bounded), `routing` (the doors of a turn and
//! the kernel's services), `events` (the bus) and `state` (kept state). This file holds the
//! records, the public [`Kernel`] and the environment changes plugins make.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use semver::Version;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use crate::call_chain::{CallChain, CallKind, ConversationGrant, Deadline, Deadlines};
use crate::dispatch::Mediator;
use crate::env::{Effect, Env, Inverse, validate_topic};
use crate::graph::{GraphError, PluginGraph};
use crate::host_api::HostHandle;
use crate::instance::{PluginInstance, PluginSource};
use crate::manifest::{Manifest, PluginKind};
use crate::session_gates::{GateConfig, SessionGates};
use crate::types::{
    Event, GuardVerdict, KERNEL_NAME, KernelError, RESERVED_SERVICE_PREFIX, ToolSpec,
};
use crate::undo::UndoLog;

mod calls;
mod conversation;
mod events;
mod observe;
mod routing;
mod settle;
mod state;
use calls::Request;
use events::{Backlog, deliver_events};
pub use observe::{CallFigures, PluginChange, PluginChangeKind};
pub(crate) use routing::fence_data;
use state::KeptState;

/// Kernel settings.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// How long unload and reload wait for a plugin's in-flight call before giving up.
    pub quiesce_timeout: Duration,
    /// Events buffered per subscriber before emitters are told it is not keeping up.
    pub event_queue: usize,
    /// How long a call into a plugin may take, wall clock, by the door it came through.
    pub deadlines: Deadlines,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            quiesce_timeout: Duration::from_secs(30),
            event_queue: 4096,
            deadlines: Deadlines::default(),
        }
    }
}

/// A plugin ready to load: its manifest and something that makes instances of it.
#[derive(Clone)]
pub struct PluginPackage {
    /// The validated manifest.
    pub manifest: Manifest,
    /// Makes instances.
    pub source: Arc<dyn PluginSource>,
}

/// Where a plugin is in its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum PluginState {
    /// Loaded but waiting for required providers; says for what.
    Pending {
        /// One line per unmet requirement.
        waiting_for: Vec<String>,
    },
    /// Being instantiated and activated.
    Loading,
    /// Running.
    Active,
    /// Being deactivated; its effects are being undone.
    Unloading,
    /// Gone; nothing of it remains in the environment.
    Disposed,
    /// Activation or a call trapped or failed; its effects were undone.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

impl PluginState {
    /// Short lowercase name (`active`, `pending`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            PluginState::Pending { .. } => "pending",
            PluginState::Loading => "loading",
            PluginState::Active => "active",
            PluginState::Unloading => "unloading",
            PluginState::Disposed => "disposed",
            PluginState::Failed { .. } => "failed",
        }
    }
}

/// What `keel plugin list` shows about one plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginStatus {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: Version,
    /// How it is hosted.
    pub kind: PluginKind,
    /// Its state, with what it waits for or why it failed.
    #[serde(flatten)]
    pub state: PluginState,
    /// `service version` it declares.
    pub provides: Vec<String>,
    /// `service range` it requires (`?` marks optional ones).
    pub requires: Vec<String>,
}

/// Why a lifecycle operation was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// No plugin of that name is loaded.
    #[error("no plugin named `{0}` is loaded; `keel plugin list` shows what is")]
    NotLoaded(String),
    /// A plugin of that name is already loaded.
    #[error("plugin `{0}` is already loaded; reload it to change its version, or unload it first")]
    AlreadyLoaded(String),
    /// The graph with this plugin would be invalid.
    #[error("{0}")]
    Graph(#[from] GraphError),
    /// A reload named a different plugin.
    #[error(
        "cannot reload `{old}` with a plugin named `{new}`; to swap plugins, load `{new}` with `replaces = \"{old}\"`"
    )]
    NameMismatch {
        /// The loaded plugin.
        old: String,
        /// The manifest's name.
        new: String,
    },
    /// A plugin stayed busy in a call longer than the quiesce timeout.
    #[error(
        "plugin `{name}` stayed busy in a call for {waited:?}; nothing was changed; retry when its call has finished, or cancel it"
    )]
    Busy {
        /// The busy plugin.
        name: String,
        /// How long the kernel waited.
        waited: Duration,
    },
    /// The new version failed to activate; the old one was restored (or could not be).
    #[error("reloading `{name}` failed: {reason}; {}", if *.rolled_back { "the previous version is active again" } else { "the previous version could not be restored either and is marked failed" })]
    ReloadFailed {
        /// The plugin.
        name: String,
        /// Why the new version did not activate.
        reason: String,
        /// Whether the old version is active again.
        rolled_back: bool,
    },
}

type Slot = Arc<tokio::sync::Mutex<Option<Box<dyn PluginInstance>>>>;

/// An extra instance of a plugin that asked for several (`limits.instances`), with the
/// generation it was activated for; it serves tool and service calls only.
type ExtraSlot = Arc<tokio::sync::Mutex<Option<(u64, Box<dyn PluginInstance>)>>>;

struct Record {
    manifest: Arc<Manifest>,
    source: Arc<dyn PluginSource>,
    state: PluginState,
    undo: UndoLog,
    /// Bumped at every activation; a stale instance's requests are refused.
    generation: u64,
    /// Reloads that took (a new build or version activated in its place), for observers.
    reloads: u64,
    slot: Slot,
    /// Extra instances, made on demand up to `limits.instances` − 1 while the first is busy.
    extra: Vec<ExtraSlot>,
    events: mpsc::Sender<Arc<Event>>,
    /// Events queued for the plugin and not yet handled, so an unload can let them arrive
    /// first (a session log must not lose the last events of a session at exit), and their
    /// bytes, bounded by [`crate::quotas::MAX_QUEUED_EVENT_BYTES`].
    undelivered: Arc<Backlog>,
    /// True while a reload holds the slot: calls that miss its services wait for it.
    reloading: bool,
    /// Why the instance must be replaced before its next call: a call into it was stopped
    /// halfway (a deadline, Ctrl-C) or ran into a resource limit.
    restart: Option<String>,
}

#[derive(Default)]
struct Inner {
    env: Env,
    plugins: BTreeMap<String, Record>,
    state: BTreeMap<String, KeptState>,
    /// Changes whenever a message an agent keeps is replaced or removed, in any plugin's state
    /// ([`keel_protocol::HeldConversation::revision`]).
    conversation_revision: u64,
    next_generation: u64,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// The sealed gates of this session; reachable only through the kernel's own paths.
    pub(crate) gates: Arc<SessionGates>,
    lifecycle: tokio::sync::Mutex<()>,
    config: KernelConfig,
    host_events: broadcast::Sender<Event>,
    /// Bytes of events queued for all subscribers (see [`Backlog`]).
    queued_events: Arc<AtomicUsize>,
    /// Bytes across the plugin boundary (see [`crate::boundary`]).
    pub(crate) boundary: crate::boundary::BoundaryMeter,
    /// The editor driving the session, if the host attached one (`keel.editor`).
    pub(crate) editor: crate::editor::EditorDoor,
    /// Plugin changes and call figures for observers (the web page, the trace exporter).
    observatory: observe::Observatory,
    me: Weak<Shared>,
}

/// The kernel. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Kernel {
    shared: Arc<Shared>,
}

impl Default for Kernel {
    fn default() -> Self {
        Kernel::new(KernelConfig::default())
    }
}

enum Step {
    Activate(String),
    Deactivate(String),
}

impl Kernel {
    /// An empty kernel whose gates are locked down (no workspace, every approval denied,
    /// every host refused).
    pub fn new(config: KernelConfig) -> Self {
        Kernel::with_gates(config, GateConfig::locked_down())
    }

    /// An empty kernel with the session's gates set up by the host.
    pub fn with_gates(config: KernelConfig, gates: GateConfig) -> Self {
        let (host_events, _) = broadcast::channel(crate::quotas::HOST_EVENT_RING);
        Kernel {
            shared: Arc::new_cyclic(|me| Shared {
                inner: Mutex::new(Inner::default()),
                gates: Arc::new(SessionGates::new(gates)),
                lifecycle: tokio::sync::Mutex::new(()),
                config,
                host_events,
                queued_events: Arc::default(),
                boundary: Default::default(),
                editor: Default::default(),
                observatory: Default::default(),
                me: me.clone(),
            }),
        }
    }

    /// Whether the person's hooks run in this session: the plugin named `hooks` that the host
    /// handed them provides their service. The host asks before it sends that plugin the
    /// person's prompt, by the same rule the dispatcher keeps for tool calls.
    pub fn person_hooks_run(&self) -> bool {
        let s = &self.shared;
        crate::dispatch::hooks_provider(&s.gates, s.provider_of(crate::dispatch::HOOKS_SERVICE))
            .is_some()
    }

    /// Every byte that crossed between the kernel and its plugins so far, either way (see
    /// `boundary.rs`): what a bench divides by the steps of a turn.
    pub fn boundary_bytes(&self) -> u64 {
        self.shared.boundary.total()
    }

    /// Load a plugin. It activates now if every required provider is active, otherwise it
    /// waits (see [`list`](Self::list)). A failed activation is reported in the returned status,
    /// not as an error: the rest of the system keeps running.
    pub async fn load(&self, package: PluginPackage) -> Result<PluginStatus, LifecycleError> {
        let s = &self.shared;
        let _lifecycle = s.lifecycle.lock().await;
        let name = package.manifest.name.clone();
        if s.lock().plugins.contains_key(&name) {
            return Err(LifecycleError::AlreadyLoaded(name));
        }
        if let Some(old) = &package.manifest.replaces
            && s.lock().plugins.contains_key(old)
        {
            s.unload_locked(old).await?;
        }
        {
            let inner = s.lock();
            PluginGraph::build(
                inner
                    .plugins
                    .values()
                    .map(|r| &*r.manifest)
                    .chain([&package.manifest]),
            )?;
        }
        s.insert_record(package);
        s.settle_locked().await?;
        s.status(&name).ok_or(LifecycleError::NotLoaded(name))
    }

    /// Unload a plugin: its dependents are deactivated first (they wait for a provider again),
    /// then it is deactivated, its undo log replayed and its kernel-held state discarded.
    pub async fn unload(&self, name: &str) -> Result<(), LifecycleError> {
        let s = &self.shared;
        let _lifecycle = s.lifecycle.lock().await;
        s.unload_locked(name).await?;
        s.settle_locked().await
    }

    /// Replace a loaded plugin by a new version: quiesce the old instance (calls wait), undo
    /// it, activate the new one with the kernel-held state handed over, and release the waiting
    /// calls to it. If the new version fails to activate, the old one is restored. Dependents
    /// are re-wired only when what it provides is no longer compatible.
    pub async fn reload(&self, package: PluginPackage) -> Result<PluginStatus, LifecycleError> {
        let s = &self.shared;
        let _lifecycle = s.lifecycle.lock().await;
        let name = package.manifest.name.clone();
        let slot = {
            let inner = s.lock();
            let record = inner
                .plugins
                .get(&name)
                .ok_or_else(|| LifecycleError::NotLoaded(name.clone()))?;
            PluginGraph::build(
                inner
                    .plugins
                    .values()
                    .filter(|r| r.manifest.name != name)
                    .map(|r| &*r.manifest)
                    .chain([&package.manifest]),
            )?;
            record.slot.clone()
        };
        let result = s.reload_locked(&name, slot, package).await;
        s.settle_locked().await?;
        result?;
        s.status(&name).ok_or(LifecycleError::NotLoaded(name))
    }

    /// Unload every plugin, dependents first.
    pub async fn shutdown(&self) -> Result<(), LifecycleError> {
        let s = &self.shared;
        let _lifecycle = s.lifecycle.lock().await;
        let order = s.graph()?.stop_order();
        for name in order {
            s.unload_locked(&name).await?;
        }
        Ok(())
    }

    /// Call `method` of `service` on behalf of the host (the CLI, a test).
    pub async fn call_service(
        &self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, KernelError> {
        self.shared
            .call_service(
                &CallChain::starting_at(KERNEL_NAME),
                service,
                method,
                payload,
            )
            .await
    }

    /// `call` through its service's typed door on behalf of the host: to the provider's
    /// typed export, or its `handle-call` as JSON when it has none.
    pub async fn call_service_typed(
        &self,
        call: &crate::ServiceCall,
    ) -> Result<crate::ServiceAnswer, KernelError> {
        self.shared
            .call_service_typed(&CallChain::starting_at(KERNEL_NAME), call)
            .await
    }

    /// Run the tool `name` with its JSON input.
    pub async fn invoke_tool(&self, name: &str, input: &str) -> Result<String, KernelError> {
        self.shared
            .invoke_tool(&CallChain::starting_at(KERNEL_NAME), name, input)
            .await
    }

    /// Start a new turn: replays are limited to calls of the current turn, and a pending
    /// cancellation is cleared.
    pub fn begin_turn(&self) {
        self.shared.gates.begin_turn();
    }

    /// Record the workspace before a turn of `session` (`[checkpoints]`): the state `keel
    /// rewind --turn N` restores. `None` when checkpoints are off; an error says why none was
    /// taken (the turn may still run).
    pub fn checkpoint_before_turn(
        &self,
        session: &str,
    ) -> Option<Result<crate::checkpoints::Checkpoint, String>> {
        self.shared.gates.checkpoint_before_turn(session)
    }

    /// Record the workspace after a turn's last call (what its commands and tools left).
    pub fn checkpoint_after_turn(&self) -> Option<Result<crate::checkpoints::Checkpoint, String>> {
        self.shared.gates.checkpoint_after_turn()
    }

    /// Switch plan mode on or off (see `plan_mode.rs`): while on, the model is offered only
    /// read-only tools, other calls are refused before approval, and commands run only when
    /// they only read, in the read-only sandbox without network. The host's door alone: no
    /// plugin import reaches it. Switch between turns.
    pub fn set_plan_mode(&self, on: bool) {
        self.shared.gates.set_plan_mode(on);
    }

    /// Attach the editor driving this session (`None` detaches it): the file tools then read
    /// a workspace file as the editor holds it (`keel.editor`, see `editor.rs`). The host's
    /// door only.
    pub fn attach_editor(&self, files: Option<Arc<dyn crate::EditorFiles>>) {
        self.shared.editor.attach(files);
    }

    /// Whether plan mode is on.
    pub fn plan_mode(&self) -> bool {
        self.shared.gates.plan_mode()
    }

    /// Which confinement the commands of this session run under (see
    /// [`crate::sandbox::Confinement::describe`] for the words).
    pub fn confinement(&self) -> crate::sandbox::Confinement {
        self.shared.gates.confinement().clone()
    }

    /// The person's answers that still stand (approvals for the session or always, network
    /// approvals, refusals), for `/approvals`.
    pub fn standing_answers(&self) -> Vec<crate::StandingAnswer> {
        self.shared.gates.standing_answers()
    }

    /// Withdraw one of the person's standing answers; keel asks again next time.
    pub fn withdraw(&self, answer: &crate::StandingAnswer) -> Result<(), KernelError> {
        self.shared.gates.withdraw(answer)
    }

    /// Ask the current turn to stop (Ctrl-C): the agent sees `cancelled` and ends the turn.
    pub fn cancel_turn(&self) {
        self.shared.gates.cancel_turn();
    }

    /// Ask the `model` service for a completion, as the agent would (the kernel records the
    /// response's tool calls).
    pub async fn complete(&self, request: &str) -> Result<String, KernelError> {
        self.shared
            .agent_complete(&CallChain::starting_at(KERNEL_NAME), None, request)
            .await
    }

    /// Dispatch recorded tool calls through the gate pipeline, as the agent would.
    pub async fn dispatch(&self, call_ids: &[String]) -> Vec<String> {
        self.shared
            .agent_dispatch(&CallChain::starting_at(KERNEL_NAME), call_ids)
            .await
            .iter()
            .map(|o| serde_json::to_string(o).unwrap_or_default())
            .collect()
    }

    /// Run the tool `name` with the JSON `input` on the person's behalf, through the same gate
    /// pipeline as a model's call; returns the `ToolOutcome` as JSON.
    pub async fn call_tool(&self, name: &str, input: &str) -> String {
        let id = self.shared.gates.record_host_call(name, input);
        self.dispatch(&[id]).await.pop().unwrap_or_default()
    }

    /// Emit an event from the host to every subscriber of `topic`.
    pub fn emit(&self, topic: &str, payload: &str) -> Result<(), KernelError> {
        validate_topic(topic, false)?;
        self.shared.fan_out(Event {
            topic: topic.to_owned(),
            source: KERNEL_NAME.to_owned(),
            payload: payload.to_owned(),
        })
    }

    /// Wait until the events already emitted have been handled by their subscribers (each
    /// plugin's queue for at most the quiesce timeout), so that what a turn emitted is, for
    /// example, in the session log before the host reads the log back.
    pub async fn settle_events(&self) {
        let names: Vec<String> = self.shared.lock().plugins.keys().cloned().collect();
        for name in names {
            self.shared.drain_events(&name).await;
        }
    }

    /// Every event emitted from now on, whatever its topic.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.host_events.subscribe()
    }

    /// Every change of a plugin's lifecycle from now on (loaded, reloaded, restarted, a new
    /// state, unloaded), as the kernel makes it. A receiver that falls more than 256 changes
    /// behind is told it lagged and should read [`list`](Self::list) again.
    pub fn plugin_changes(&self) -> broadcast::Receiver<PluginChange> {
        self.shared.observatory.subscribe()
    }

    /// The calls made into each plugin so far: count, failures, wall time, guest CPU.
    pub fn call_figures(&self) -> BTreeMap<String, CallFigures> {
        self.shared.observatory.figures()
    }

    /// Every loaded plugin, by name.
    pub fn list(&self) -> Vec<PluginStatus> {
        let inner = self.shared.lock();
        inner
            .plugins
            .iter()
            .map(|(name, r)| status_of(name, r))
            .collect()
    }

    /// The manifest a loaded plugin was loaded with (the person's config and limits laid
    /// over it): what it declares it may do.
    pub fn manifest(&self, name: &str) -> Option<Arc<Manifest>> {
        self.shared
            .lock()
            .plugins
            .get(name)
            .map(|r| r.manifest.clone())
    }

    /// One plugin's status.
    pub fn status(&self, name: &str) -> Option<PluginStatus> {
        self.shared.status(name)
    }

    /// The dependency graph of the loaded plugins.
    pub fn graph(&self) -> Result<PluginGraph, GraphError> {
        self.shared.graph()
    }

    /// A copy of the shared environment.
    pub fn env(&self) -> Env {
        self.shared.lock().env.clone()
    }

    /// The environment's fingerprint.
    pub fn fingerprint(&self) -> String {
        self.shared.lock().env.fingerprint()
    }

    /// Registered tools, sorted by name.
    pub fn tools(&self) -> Vec<ToolSpec> {
        self.shared
            .lock()
            .env
            .tools()
            .values()
            .map(|t| t.spec.clone())
            .collect()
    }
}

fn status_of(name: &str, r: &Record) -> PluginStatus {
    PluginStatus {
        name: name.to_owned(),
        version: r.manifest.version.clone(),
        kind: r.manifest.kind,
        state: r.state.clone(),
        provides: r
            .manifest
            .provides
            .iter()
            .map(|(s, v)| format!("{s} {v}"))
            .collect(),
        requires: r
            .manifest
            .requires
            .iter()
            .map(|(s, q)| format!("{s} {}{}", q.range, if q.optional { "?" } else { "" }))
            .collect(),
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock would be a kernel bug; the data is still the best
        // record there is, so keep serving rather than poisoning every later call.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn status(&self, name: &str) -> Option<PluginStatus> {
        self.lock().plugins.get(name).map(|r| status_of(name, r))
    }

    fn graph(&self) -> Result<PluginGraph, GraphError> {
        PluginGraph::build(self.lock().plugins.values().map(|r| &*r.manifest))
    }

    pub(crate) fn apply_effect(
        &self,
        plugin: &str,
        generation: u64,
        effect: Effect,
    ) -> Result<(), KernelError> {
        let mut inner = self.lock();
        let Inner { env, plugins, .. } = &mut *inner;
        let r = live_record(plugins, plugin, generation)?;
        let undone = match &effect {
            Effect::WithdrawTool { name } => Some(Inverse::UnregisterTool { name: name.clone() }),
            Effect::StopProcess { id } => Some(Inverse::StopProcess { id: *id }),
            _ => None,
        };
        if let Some(inverse) = env.apply(plugin, &r.manifest, effect)? {
            r.undo.push(inverse);
        }
        if let Some(inverse) = undone {
            r.undo.forget(&inverse);
        }
        self.gates.processes.reap(plugin, env);
        Ok(())
    }
}

/// Undo everything `name`'s instance did: its changes to the environment (newest first) and
/// the processes it started, which the environment no longer records.
fn undo_instance(gates: &SessionGates, r: &mut Record, name: &str, env: &mut Env) {
    r.undo.replay(name, env);
    r.extra.clear();
    gates.processes.reap(name, env);
}

/// The record of `plugin` if `generation` is its live instance and it may change the
/// environment now (loading or active); otherwise why not.
fn live_record<'a>(
    plugins: &'a mut BTreeMap<String, Record>,
    plugin: &str,
    generation: u64,
) -> Result<&'a mut Record, KernelError> {
    let r = plugins
        .get_mut(plugin)
        .ok_or_else(|| KernelError::Denied(format!("plugin `{plugin}` is not loaded")))?;
    if r.generation != generation {
        return Err(KernelError::Denied(format!(
            "this instance of plugin `{plugin}` was replaced; its requests are refused"
        )));
    }
    match &r.state {
        PluginState::Loading | PluginState::Active => Ok(r),
        PluginState::Unloading => Err(KernelError::Denied(format!(
            "plugin `{plugin}` is unloading; changes to the environment are refused during unload \
             (register in activate, not deactivate)"
        ))),
        other => Err(KernelError::Denied(format!(
            "plugin `{plugin}` is {}; it cannot change the environment",
            other.name()
        ))),
    }
}
