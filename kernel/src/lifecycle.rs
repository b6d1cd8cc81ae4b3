//! The kernel proper: plugin records and their states, load / unload / reload, the settle
//! loop that activates and deactivates plugins as their providers come and go, and the
//! mediation of every call between plugins.
//!
//! Locking: `Shared::inner` (a std mutex) guards the environment and the records and is never
//! held across an await. Each plugin's instance sits in its own async `slot` mutex, held for
//! the whole of a call into it, so a reload that takes the slot waits for the in-flight call
//! and makes new calls queue behind it. `Shared::lifecycle` serializes load, unload, reload
//! and settle.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use semver::Version;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use crate::call_chain::{CallChain, CallKind, Deadline, Deadlines};
use crate::dispatch::Mediator;
use crate::env::{Effect, Env, validate_topic};
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
use calls::Request;

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

struct Record {
    manifest: Arc<Manifest>,
    source: Arc<dyn PluginSource>,
    state: PluginState,
    undo: UndoLog,
    /// Bumped at every activation; a stale instance's requests are refused.
    generation: u64,
    slot: Slot,
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
    next_generation: u64,
}

/// One plugin's kernel-held state, with its size kept as it changes: a plugin that keeps
/// one key per message must not make every `set` walk all of its keys.
#[derive(Default)]
struct KeptState {
    entries: BTreeMap<String, Vec<u8>>,
    /// Sum of key and value lengths over `entries`.
    bytes: usize,
}

impl KeptState {
    fn insert(&mut self, key: &str, value: Vec<u8>) -> Result<(), String> {
        let replaced = self.entries.get(key).map_or(0, |v| key.len() + v.len());
        let bytes = self.bytes - replaced + key.len() + value.len();
        if bytes > MAX_STATE_BYTES_PER_PLUGIN {
            return Err(format!(
                "more than {MAX_STATE_BYTES_PER_PLUGIN} bytes of state"
            ));
        }
        self.entries.insert(key.to_owned(), value);
        self.bytes = bytes;
        Ok(())
    }

    fn remove(&mut self, key: &str) {
        if let Some(v) = self.entries.remove(key) {
            self.bytes -= key.len() + v.len();
        }
    }
}

use crate::quotas::{MAX_STATE_BYTES_PER_PLUGIN, MAX_STATE_KEY, MAX_STATE_VALUE};

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// The sealed gates of this session; reachable only through the kernel's own paths.
    pub(crate) gates: Arc<SessionGates>,
    lifecycle: tokio::sync::Mutex<()>,
    config: KernelConfig,
    host_events: broadcast::Sender<Event>,
    /// Bytes of events queued for all subscribers (see [`Backlog`]).
    queued_events: Arc<AtomicUsize>,
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
                me: me.clone(),
            }),
        }
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

    /// Which confinement the commands of this session run under (see
    /// [`crate::sandbox::Confinement::describe`] for the words).
    pub fn confinement(&self) -> crate::sandbox::Confinement {
        self.shared.gates.confinement().clone()
    }

    /// Ask the current turn to stop (Ctrl-C): the agent sees `cancelled` and ends the turn.
    pub fn cancel_turn(&self) {
        self.shared.gates.cancel_turn();
    }

    /// Ask the `model` service for a completion, as the agent would (the kernel records the
    /// response's tool calls).
    pub async fn complete(&self, request: &str) -> Result<String, KernelError> {
        self.shared
            .agent_complete(&CallChain::starting_at(KERNEL_NAME), request)
            .await
    }

    /// Dispatch recorded tool calls through the gate pipeline, as the agent would.
    pub async fn dispatch(&self, call_ids: &[String]) -> Vec<String> {
        self.shared
            .agent_dispatch(&CallChain::starting_at(KERNEL_NAME), call_ids)
            .await
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

    /// Every loaded plugin, by name.
    pub fn list(&self) -> Vec<PluginStatus> {
        let inner = self.shared.lock();
        inner
            .plugins
            .iter()
            .map(|(name, r)| status_of(name, r))
            .collect()
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

    fn insert_record(&self, package: PluginPackage) {
        let name = package.manifest.name.clone();
        let slot: Slot = Arc::new(tokio::sync::Mutex::new(None));
        let (tx, rx) = mpsc::channel(self.config.event_queue.max(1));
        let undelivered = Arc::new(Backlog::sharing(self.queued_events.clone()));
        tokio::spawn(deliver_events(
            self.me.clone(),
            name.clone(),
            slot.clone(),
            rx,
            undelivered.clone(),
        ));
        let mut inner = self.lock();
        inner.plugins.insert(
            name,
            Record {
                manifest: Arc::new(package.manifest),
                source: package.source,
                state: PluginState::Pending {
                    waiting_for: Vec::new(),
                },
                undo: UndoLog::default(),
                generation: 0,
                slot,
                events: tx,
                undelivered,
                reloading: false,
                restart: None,
            },
        );
    }

    /// The unmet required services of `manifest`, explained.
    fn unmet(inner: &Inner, manifest: &Manifest) -> Vec<String> {
        let mut unmet = Vec::new();
        for (service, req) in &manifest.requires {
            if req.optional {
                continue;
            }
            let active = inner.env.services().get(service).filter(|e| {
                req.range.matches(&e.version)
                    && inner
                        .plugins
                        .get(&e.provider)
                        .is_some_and(|r| r.state == PluginState::Active)
            });
            if active.is_some() {
                continue;
            }
            let declared: Vec<String> = inner
                .plugins
                .values()
                .filter_map(|r| {
                    let v = r.manifest.provides.get(service)?;
                    let why = if !req.range.matches(v) {
                        format!("which does not satisfy {}", req.range)
                    } else {
                        match &r.state {
                            PluginState::Active => "which has not provided it".to_owned(),
                            PluginState::Failed { reason } => format!("which failed: {reason}"),
                            other => format!("which is {}", other.name()),
                        }
                    };
                    Some(format!("`{}` {v}, {why}", r.manifest.name))
                })
                .collect();
            let available = if declared.is_empty() {
                "no loaded plugin provides it".to_owned()
            } else {
                format!("available: {}", declared.join("; "))
            };
            unmet.push(format!("service `{service}` {} ({available})", req.range));
        }
        unmet
    }

    /// Activate whatever can run and deactivate whatever lost a provider, until nothing
    /// changes. Caller holds the lifecycle lock.
    async fn settle_locked(&self) -> Result<(), LifecycleError> {
        loop {
            let step = {
                let mut inner = self.lock();
                let graph = PluginGraph::build(inner.plugins.values().map(|r| &*r.manifest))?;
                let mut step = None;
                for name in graph.stop_order() {
                    if let Some(r) = inner.plugins.get(&name)
                        && r.state == PluginState::Active
                        && !Self::unmet(&inner, &r.manifest).is_empty()
                    {
                        step = Some(Step::Deactivate(name));
                        break;
                    }
                }
                if step.is_none() {
                    for name in graph.start_order() {
                        let Some(r) = inner.plugins.get(&name) else {
                            continue;
                        };
                        if !matches!(r.state, PluginState::Pending { .. }) {
                            continue;
                        }
                        let unmet = Self::unmet(&inner, &r.manifest);
                        if unmet.is_empty() {
                            step = Some(Step::Activate(name));
                            break;
                        }
                        if let Some(r) = inner.plugins.get_mut(&name) {
                            r.state = PluginState::Pending { waiting_for: unmet };
                        }
                    }
                }
                step
            };
            match step {
                None => return Ok(()),
                Some(Step::Activate(name)) => self.activate(&name).await,
                Some(Step::Deactivate(name)) => {
                    let slot = match self.lock().plugins.get(&name) {
                        Some(r) => r.slot.clone(),
                        None => continue,
                    };
                    let mut guard = self.quiesce(&name, &slot).await?;
                    self.deactivate(&name, &mut guard).await;
                    let mut inner = self.lock();
                    let unmet = inner
                        .plugins
                        .get(&name)
                        .map(|r| Self::unmet(&inner, &r.manifest))
                        .unwrap_or_default();
                    if let Some(r) = inner.plugins.get_mut(&name) {
                        r.state = PluginState::Pending { waiting_for: unmet };
                    }
                }
            }
        }
    }

    /// Let the events already queued for `name` be handled, waiting at most the quiesce
    /// timeout (an emitter that never stops must not block an unload forever).
    async fn drain_events(&self, name: &str) {
        let Some(undelivered) = self.lock().plugins.get(name).map(|r| r.undelivered.clone()) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + self.config.quiesce_timeout;
        while undelivered.events.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Wait for `name`'s in-flight call to finish and take its slot.
    async fn quiesce(
        &self,
        name: &str,
        slot: &Slot,
    ) -> Result<tokio::sync::OwnedMutexGuard<Option<Box<dyn PluginInstance>>>, LifecycleError> {
        let waited = self.config.quiesce_timeout;
        tokio::time::timeout(waited, slot.clone().lock_owned())
            .await
            .map_err(|_| LifecycleError::Busy {
                name: name.to_owned(),
                waited,
            })
    }

    /// Instantiate and activate `name`. Failure marks it failed and undoes what it did.
    async fn activate(&self, name: &str) {
        let slot = match self.lock().plugins.get(name) {
            Some(r) => r.slot.clone(),
            None => return,
        };
        let mut guard = slot.lock().await;
        // A failure is recorded in the plugin's state; settle moves on to the others.
        let _ = self.activate_holding(name, &mut guard).await;
    }

    /// Deactivate the instance in `guard` and replay the undo log. The record stays.
    async fn deactivate(&self, name: &str, guard: &mut Option<Box<dyn PluginInstance>>) {
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.state = PluginState::Unloading;
        }
        let limit = self.config.deadlines.service;
        if let Some(mut instance) = guard.take() {
            let chain = CallChain::starting_at(KERNEL_NAME).enter(
                name,
                CallKind::Lifecycle,
                &self.config.deadlines,
                tokio::time::Instant::now(),
            );
            match tokio::time::timeout(limit, instance.deactivate(&chain)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(
                    plugin = name,
                    "deactivate returned an error (ignored; its effects are undone anyway): {e}"
                ),
                Err(_) => tracing::warn!(
                    plugin = name,
                    "deactivate did not finish within {} s (ignored; its effects are undone \
                     anyway)",
                    limit.as_secs()
                ),
            }
        }
        let mut inner = self.lock();
        let Inner { env, plugins, .. } = &mut *inner;
        if let Some(r) = plugins.get_mut(name) {
            r.undo.replay(name, env);
        }
    }

    /// Unload `name` and everything that depends on it. Caller holds the lifecycle lock.
    async fn unload_locked(&self, name: &str) -> Result<(), LifecycleError> {
        let (dependents, slot) = {
            let inner = self.lock();
            let r = inner
                .plugins
                .get(name)
                .ok_or_else(|| LifecycleError::NotLoaded(name.to_owned()))?;
            let graph = PluginGraph::build(inner.plugins.values().map(|r| &*r.manifest))?;
            (graph.dependents_of(name), r.slot.clone())
        };
        for dependent in dependents {
            let (active, dslot) = match self.lock().plugins.get(&dependent) {
                Some(r) => (r.state == PluginState::Active, r.slot.clone()),
                None => continue,
            };
            if active {
                self.drain_events(&dependent).await;
                let mut guard = self.quiesce(&dependent, &dslot).await?;
                self.deactivate(&dependent, &mut guard).await;
                if let Some(r) = self.lock().plugins.get_mut(&dependent) {
                    r.state = PluginState::Pending {
                        waiting_for: vec![format!("plugin `{name}`, which is being unloaded")],
                    };
                }
            }
        }
        self.drain_events(name).await;
        let mut guard = self.quiesce(name, &slot).await?;
        self.deactivate(name, &mut guard).await;
        // Deactivation replayed the undo log, and effects are refused from then on (the
        // record is unloading), so removing the record is all that is left.
        self.gates.net.close_all(name);
        let mut inner = self.lock();
        inner.plugins.remove(name);
        inner.state.remove(name);
        tracing::info!(plugin = name, "disposed");
        Ok(())
    }

    async fn reload_locked(
        &self,
        name: &str,
        slot: Slot,
        package: PluginPackage,
    ) -> Result<(), LifecycleError> {
        let mut guard = self.quiesce(name, &slot).await?;
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.reloading = true;
        }
        self.deactivate(name, &mut guard).await;
        let (old_manifest, old_source) = {
            let mut inner = self.lock();
            let Some(r) = inner.plugins.get_mut(name) else {
                return Err(LifecycleError::NotLoaded(name.to_owned()));
            };
            let old = (r.manifest.clone(), r.source.clone());
            r.manifest = Arc::new(package.manifest);
            r.source = package.source;
            old
        };
        // A plugin whose providers are missing stays pending; settle activates it later.
        {
            let mut inner = self.lock();
            let unmet = inner
                .plugins
                .get(name)
                .map(|r| Self::unmet(&inner, &r.manifest))
                .unwrap_or_default();
            if !unmet.is_empty() {
                if let Some(r) = inner.plugins.get_mut(name) {
                    r.state = PluginState::Pending { waiting_for: unmet };
                    r.reloading = false;
                }
                return Ok(());
            }
        }
        let first = self.activate_holding(name, &mut guard).await;
        let result = match first {
            Ok(()) => Ok(()),
            Err(reason) => {
                {
                    let mut inner = self.lock();
                    if let Some(r) = inner.plugins.get_mut(name) {
                        r.manifest = old_manifest;
                        r.source = old_source;
                    }
                }
                let rolled_back = self.activate_holding(name, &mut guard).await.is_ok();
                Err(LifecycleError::ReloadFailed {
                    name: name.to_owned(),
                    reason,
                    rolled_back,
                })
            }
        };
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.reloading = false;
        }
        drop(guard);
        result
    }

    /// Instantiate and activate `name` with its slot already held (reload keeps the slot from
    /// quiesce to release, so waiting calls reach only the new instance).
    async fn activate_holding(
        &self,
        name: &str,
        guard: &mut Option<Box<dyn PluginInstance>>,
    ) -> Result<(), String> {
        let (source, config, generation) = {
            let mut inner = self.lock();
            inner.next_generation += 1;
            let generation = inner.next_generation;
            let Some(r) = inner.plugins.get_mut(name) else {
                return Err(format!("plugin `{name}` vanished"));
            };
            r.state = PluginState::Loading;
            r.generation = generation;
            (r.source.clone(), r.manifest.config.to_string(), generation)
        };
        let host = HostHandle::new(self.me.clone(), name, generation);
        let chain = CallChain::starting_at(KERNEL_NAME).enter(
            name,
            CallKind::Lifecycle,
            &self.config.deadlines,
            tokio::time::Instant::now(),
        );
        let limit = self.config.deadlines.service;
        let bounded = async {
            match source.instantiate(host).await {
                Ok(mut instance) => match instance.activate(&chain, &config).await {
                    Ok(()) => Ok(instance),
                    Err(e) => Err(format!("activation failed: {e}")),
                },
                Err(e) => Err(format!("instantiation failed: {e}")),
            }
        };
        let outcome = tokio::time::timeout(limit, bounded)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "activation did not finish within {} s (the activation deadline, \
                     [timeouts] service-secs)",
                    limit.as_secs()
                ))
            });
        let mut inner = self.lock();
        let Inner { env, plugins, .. } = &mut *inner;
        let Some(r) = plugins.get_mut(name) else {
            return Err(format!("plugin `{name}` vanished"));
        };
        match outcome {
            Ok(instance) => {
                *guard = Some(instance);
                r.state = PluginState::Active;
                r.restart = None;
                tracing::info!(plugin = name, "active");
                Ok(())
            }
            Err(reason) => {
                r.undo.replay(name, env);
                tracing::warn!(plugin = name, "{reason}");
                r.state = PluginState::Failed {
                    reason: reason.clone(),
                };
                Err(reason)
            }
        }
    }

    /// A call trapped or hit a limit: the instance is gone. Mark the plugin failed and undo
    /// its effects now; dependents are deactivated by a settle that runs once the calls that
    /// led here have returned (running it inline could wait on the caller's own slot).
    fn instance_died(&self, name: &str, generation: u64, reason: String) {
        {
            let mut inner = self.lock();
            let Inner { env, plugins, .. } = &mut *inner;
            let Some(r) = plugins.get_mut(name) else {
                return;
            };
            if r.generation != generation {
                return;
            }
            r.undo.replay(name, env);
            tracing::warn!(plugin = name, "failed: {reason}");
            r.state = PluginState::Failed { reason };
        }
        self.gates.net.close_all(name);
        self.resettle_later();
    }

    /// Deactivate what lost a provider, in a task of its own: a settle run inline could wait
    /// on the slot of a caller further up the chain.
    fn resettle_later(&self) {
        let me = self.me.clone();
        tokio::spawn(async move {
            if let Some(shared) = me.upgrade() {
                let _lifecycle = shared.lifecycle.lock().await;
                if let Err(e) = shared.settle_locked().await {
                    tracing::warn!("re-wiring after a failed plugin: {e}");
                }
            }
        });
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
        if let Some(inverse) = env.apply(plugin, &r.manifest, effect)? {
            r.undo.push(inverse);
        }
        Ok(())
    }

    pub(crate) fn emit_from_plugin(
        &self,
        plugin: &str,
        generation: u64,
        topic: &str,
        payload: &str,
    ) -> Result<(), KernelError> {
        validate_topic(topic, false)?;
        if payload.len() > crate::quotas::MAX_EVENT_PAYLOAD {
            return Err(KernelError::Invalid(format!(
                "the `{topic}` event is {} bytes; at most {} may be emitted at once; send less \
                 (a path or an id instead of the content)",
                payload.len(),
                crate::quotas::MAX_EVENT_PAYLOAD
            )));
        }
        {
            let mut inner = self.lock();
            live_record(&mut inner.plugins, plugin, generation)?;
        }
        self.fan_out(Event {
            topic: topic.to_owned(),
            source: plugin.to_owned(),
            payload: payload.to_owned(),
        })
    }

    /// Queue `event` for every subscriber but its source, and for the host.
    fn fan_out(&self, event: Event) -> Result<(), KernelError> {
        let mut refused = Vec::new();
        let size = event_size(&event);
        // One copy, shared by every queue it waits in.
        let shared = Arc::new(event);
        let event = &*shared;
        {
            let inner = self.lock();
            for subscriber in inner.env.subscribers(&event.topic) {
                if subscriber == event.source {
                    continue;
                }
                if let Some(r) = inner.plugins.get(subscriber) {
                    if let Err(full) = r.undelivered.admit(size) {
                        refused.push((subscriber.to_owned(), full));
                        continue;
                    }
                    if r.events.try_send(shared.clone()).is_err() {
                        r.undelivered.release(size);
                        refused.push((subscriber.to_owned(), Full::Subscriber));
                    }
                }
            }
        }
        // No host receiver is fine: nobody asked for host delivery. The host's ring keeps a
        // copy of every event, so a large payload is kept only as a note of its size.
        let for_host = if event.payload.len() > crate::quotas::MAX_HOST_EVENT_PAYLOAD {
            Event {
                topic: event.topic.clone(),
                source: event.source.clone(),
                payload: serde_json::json!({
                    "omitted": format!(
                        "{} bytes, more than the display keeps; subscribers got it whole",
                        event.payload.len()
                    )
                })
                .to_string(),
            }
        } else {
            event.clone()
        };
        let _ = self.host_events.send(for_host);
        if refused.is_empty() {
            Ok(())
        } else {
            let names = |which: Full| {
                refused
                    .iter()
                    .filter(|(_, full)| *full == which)
                    .map(|(name, _)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut why = Vec::new();
            let own = names(Full::Subscriber);
            if !own.is_empty() {
                why.push(format!(
                    "{own}: its queue of {} events or {} MiB is full",
                    self.config.event_queue,
                    crate::quotas::MAX_QUEUED_EVENT_BYTES >> 20
                ));
            }
            let all = names(Full::All);
            if !all.is_empty() {
                why.push(format!(
                    "{all}: all subscribers' queues together hold {} MiB",
                    crate::quotas::MAX_QUEUED_EVENT_BYTES_TOTAL >> 20
                ));
            }
            Err(KernelError::Unavailable(format!(
                "event `{}` was not delivered ({}); emit less often or retry later",
                event.topic,
                why.join("; ")
            )))
        }
    }

    pub(crate) fn state_get(&self, plugin: &str, key: &str) -> Option<Vec<u8>> {
        self.lock().state.get(plugin)?.entries.get(key).cloned()
    }

    pub(crate) fn state_set(
        &self,
        plugin: &str,
        generation: u64,
        key: &str,
        value: Vec<u8>,
    ) -> Result<(), KernelError> {
        if key.is_empty() || key.len() > MAX_STATE_KEY {
            return Err(KernelError::Invalid(format!(
                "state keys must be 1-{MAX_STATE_KEY} bytes"
            )));
        }
        if value.len() > MAX_STATE_VALUE {
            return Err(KernelError::Invalid(format!(
                "state value for `{key}` is {} bytes; the limit is {MAX_STATE_VALUE}",
                value.len()
            )));
        }
        let mut inner = self.lock();
        live_record(&mut inner.plugins, plugin, generation)?;
        let all: usize = inner.state.values().map(|kept| kept.bytes).sum();
        if all + key.len() + value.len() > crate::quotas::MAX_STATE_BYTES_TOTAL {
            return Err(KernelError::Invalid(format!(
                "the kernel already holds {all} bytes of plugins' state, the most it keeps for \
                 all plugins together; remove keys first"
            )));
        }
        inner
            .state
            .entry(plugin.to_owned())
            .or_default()
            .insert(key, value)
            .map_err(|what| {
                KernelError::Invalid(format!(
                    "plugin `{plugin}` would hold {what}; remove keys first"
                ))
            })
    }

    pub(crate) fn state_remove(&self, plugin: &str, generation: u64, key: &str) {
        let mut inner = self.lock();
        if live_record(&mut inner.plugins, plugin, generation).is_ok()
            && let Some(kept) = inner.state.get_mut(plugin)
        {
            kept.remove(key);
        }
    }

    pub(crate) fn state_keys(&self, plugin: &str) -> Vec<String> {
        self.lock()
            .state
            .get(plugin)
            .map(|kept| kept.entries.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Why `service` has no provider right now, for the caller.
    fn explain_missing(inner: &Inner, service: &str) -> String {
        let declared: Vec<String> = inner
            .plugins
            .values()
            .filter(|r| r.manifest.provides.contains_key(service))
            .map(|r| match &r.state {
                PluginState::Pending { waiting_for } => format!(
                    "plugin `{}` would provide it but is waiting for {}",
                    r.manifest.name,
                    waiting_for.join(", ")
                ),
                PluginState::Failed { reason } => format!(
                    "plugin `{}` would provide it but failed: {reason}",
                    r.manifest.name
                ),
                other => format!(
                    "plugin `{}` would provide it but is {}",
                    r.manifest.name,
                    other.name()
                ),
            })
            .collect();
        if declared.is_empty() {
            format!(
                "no loaded plugin provides service `{service}`; load one that declares it under [provides]"
            )
        } else {
            format!(
                "service `{service}` is not available: {}",
                declared.join("; ")
            )
        }
    }
}

/// The doors of a turn (model completion, tool dispatch, replay) and what the gate pipeline
/// needs from the lifecycle.
impl Shared {
    /// Registered tools, sorted by name.
    pub(crate) fn tools(&self) -> Vec<ToolSpec> {
        self.lock()
            .env
            .tools()
            .values()
            .map(|t| t.spec.clone())
            .collect()
    }

    /// The manifest of a loaded plugin.
    pub(crate) fn manifest_of(&self, plugin: &str) -> Option<Arc<Manifest>> {
        self.lock().plugins.get(plugin).map(|r| r.manifest.clone())
    }

    async fn check_guard_call(
        &self,
        chain: &CallChain,
        guard: &str,
        tool: &str,
        input: &str,
    ) -> Result<GuardVerdict, KernelError> {
        let route = {
            let inner = self.lock();
            inner
                .env
                .guards()
                .find(|(g, _)| *g == guard)
                .and_then(|(_, p)| inner.plugins.get(p).map(|r| (p.to_owned(), r.slot.clone())))
        };
        let Some((plugin, slot)) = route else {
            return Err(KernelError::Unavailable(format!("guard `{guard}` is gone")));
        };
        if chain.contains(&plugin) {
            return Err(KernelError::Denied(format!(
                "re-entrant call refused: {chain} → {plugin} (guard `{guard}`)"
            )));
        }
        let text = self
            .call_into(chain, &plugin, slot, Request::Guard { guard, tool, input })
            .await?;
        serde_json::from_str(&text).map_err(|e| {
            KernelError::Failed(format!("guard `{guard}` answered malformed data: {e}"))
        })
    }

    /// `agent.complete`: ask the model service, record the calls, clean the text.
    pub(crate) async fn agent_complete(
        &self,
        chain: &CallChain,
        request: &str,
    ) -> Result<String, KernelError> {
        let answer = self
            .call_service(chain, keel_protocol::services::MODEL, "complete", request)
            .await
            .map_err(|e| redact_error(&self.gates, e))?;
        let response: keel_protocol::ModelResponse =
            serde_json::from_str(&answer).map_err(|e| {
                KernelError::Failed(format!(
                    "the model plugin answered something that is not a ModelResponse ({e})"
                ))
            })?;
        let response = self.gates.record_response(response);
        serde_json::to_string(&response)
            .map_err(|e| KernelError::Failed(format!("cannot encode the response: {e}")))
    }

    /// The plugin that provides `service` now.
    pub(crate) fn provider_of(&self, service: &str) -> Option<String> {
        self.lock()
            .env
            .services()
            .get(service)
            .map(|entry| entry.provider.clone())
    }

    /// The services in the reserved `keel.` namespace, which the kernel serves itself: read
    /// only, so no plugin gains anything by calling them.
    ///
    /// `keel.caller`: `name` answers the kernel-attested name of the plugin whose call the
    /// caller is serving (`keel` for the host, empty outside a call), so a provider can refuse
    /// callers; `provider` (payload: a service name) answers who provides that service now.
    fn kernel_service(
        &self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, KernelError> {
        match (service, method) {
            (crate::manifest::CALLER_SERVICE, "name") => {
                let plugins: Vec<&str> = chain.plugins().collect();
                Ok(match plugins.as_slice() {
                    [.., caller, _callee] => (*caller).to_owned(),
                    _ => String::new(),
                })
            }
            (crate::manifest::CALLER_SERVICE, "provider") => {
                Ok(self.provider_of(payload.trim()).unwrap_or_default())
            }
            (crate::manifest::CALLER_SERVICE, other) => Err(KernelError::Invalid(format!(
                "the kernel's `{service}` service has no method `{other}`; it has `name` and \
                 `provider`"
            ))),
            (keel_protocol::services::PROMPT, "fragments") => {
                let fragments: Vec<keel_protocol::PromptFragment> = self
                    .lock()
                    .env
                    .prompt_fragments()
                    .map(|(plugin, id, text)| keel_protocol::PromptFragment {
                        plugin: plugin.to_owned(),
                        id: id.to_owned(),
                        text: text.to_owned(),
                    })
                    .collect();
                serde_json::to_string(&fragments).map_err(|e| {
                    KernelError::Failed(format!("cannot encode the prompt fragments: {e}"))
                })
            }
            (keel_protocol::services::PROMPT, other) => Err(KernelError::Invalid(format!(
                "the kernel's `{service}` service has no method `{other}`; it has `fragments`"
            ))),
            _ => Err(KernelError::Unavailable(format!(
                "no service `{service}`: the `keel.` namespace belongs to the kernel, which \
                 serves only `{}` and `{}`",
                keel_protocol::services::PROMPT,
                crate::manifest::CALLER_SERVICE
            ))),
        }
    }

    /// `agent.dispatch`: run the calls concurrently through the gate pipeline; outcomes in
    /// the order of `ids`.
    pub(crate) async fn agent_dispatch(&self, chain: &CallChain, ids: &[String]) -> Vec<String> {
        let gates = self.gates.clone();
        let runs = ids
            .iter()
            .map(|id| crate::dispatch::dispatch_one(&gates, self, chain, id));
        futures::future::join_all(runs)
            .await
            .into_iter()
            .map(|o| serde_json::to_string(&o).unwrap_or_default())
            .collect()
    }

    /// `agent.replay`: re-run an approved call of this turn with the same input.
    pub(crate) async fn agent_replay(
        &self,
        chain: &CallChain,
        id: &str,
    ) -> Result<String, KernelError> {
        let gates = self.gates.clone();
        let outcome = crate::dispatch::replay(&gates, self, chain, id).await?;
        serde_json::to_string(&outcome)
            .map_err(|e| KernelError::Failed(format!("cannot encode the outcome: {e}")))
    }
}

/// Kernel errors carry plugin-produced text; secrets are removed before anyone sees it.
fn redact_error(gates: &SessionGates, e: KernelError) -> KernelError {
    match e {
        KernelError::Invalid(m) => KernelError::Invalid(gates.redact(&m)),
        KernelError::Conflict(m) => KernelError::Conflict(gates.redact(&m)),
        KernelError::Denied(m) => KernelError::Denied(gates.redact(&m)),
        KernelError::Unavailable(m) => KernelError::Unavailable(gates.redact(&m)),
        KernelError::Failed(m) => KernelError::Failed(gates.redact(&m)),
        KernelError::TimedOut(m) => KernelError::TimedOut(gates.redact(&m)),
    }
}

impl Mediator for Shared {
    fn call_service<'a>(
        &'a self,
        chain: &'a CallChain,
        service: &'a str,
        method: &'a str,
        payload: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<String, KernelError>> {
        Box::pin(Shared::call_service(self, chain, service, method, payload))
    }

    fn invoke_tool<'a>(
        &'a self,
        chain: &'a CallChain,
        name: &'a str,
        input: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<String, KernelError>> {
        Box::pin(Shared::invoke_tool(self, chain, name, input))
    }

    fn check_guard<'a>(
        &'a self,
        chain: &'a CallChain,
        guard: &'a str,
        tool: &'a str,
        input: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<GuardVerdict, KernelError>> {
        Box::pin(self.check_guard_call(chain, guard, tool, input))
    }

    fn tool(&self, name: &str) -> Option<(ToolSpec, String)> {
        self.lock()
            .env
            .tools()
            .get(name)
            .map(|t| (t.spec.clone(), t.owner.clone()))
    }

    fn guards(&self) -> Vec<(String, String)> {
        self.lock()
            .env
            .guards()
            .map(|(g, p)| (g.to_owned(), p.to_owned()))
            .collect()
    }

    fn has_service(&self, name: &str) -> bool {
        self.lock().env.services().contains_key(name)
    }
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

/// Deliver a plugin's queued events in order, one at a time, through its slot (so delivery
/// waits for a reload and reaches the new instance).
async fn deliver_events(
    shared: Weak<Shared>,
    name: String,
    slot: Slot,
    mut rx: mpsc::Receiver<Arc<Event>>,
    undelivered: Arc<Backlog>,
) {
    while let Some(event) = rx.recv().await {
        let size = event_size(&event);
        deliver_one(&shared, &name, &slot, &event).await;
        undelivered.release(size);
    }
}

/// Events queued for one subscriber and not yet handled: how many, and their bytes; and the
/// bytes queued for all subscribers, which every backlog shares.
#[derive(Default)]
struct Backlog {
    events: AtomicUsize,
    bytes: AtomicUsize,
    all: Arc<AtomicUsize>,
}

/// Which bound refused an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// The subscriber's own queue.
    Subscriber,
    /// All subscribers' queues together.
    All,
}

/// Add `size` to `counter` unless it would pass `limit`.
fn reserve(counter: &AtomicUsize, size: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
            let total = queued.checked_add(size)?;
            (total <= limit).then_some(total)
        })
        .is_ok()
}

impl Backlog {
    fn sharing(all: Arc<AtomicUsize>) -> Self {
        Backlog {
            all,
            ..Backlog::default()
        }
    }

    /// Count an event of `size` bytes in, unless the bytes would pass this subscriber's quota
    /// or all subscribers'. Counted before it is queued, so delivery never counts below zero.
    fn admit(&self, size: usize) -> Result<(), Full> {
        if !reserve(&self.bytes, size, crate::quotas::MAX_QUEUED_EVENT_BYTES) {
            return Err(Full::Subscriber);
        }
        if !reserve(&self.all, size, crate::quotas::MAX_QUEUED_EVENT_BYTES_TOTAL) {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            return Err(Full::All);
        }
        self.events.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn release(&self, size: usize) {
        self.events.fetch_sub(1, Ordering::SeqCst);
        self.bytes.fetch_sub(size, Ordering::SeqCst);
        self.all.fetch_sub(size, Ordering::SeqCst);
    }
}

/// What one queued copy of `event` holds.
fn event_size(event: &Event) -> usize {
    event.topic.len() + event.source.len() + event.payload.len()
}

/// Hand one event to the plugin's current instance, if it is active; bounded and restarted
/// like any call into a plugin.
async fn deliver_one(shared: &Weak<Shared>, name: &str, slot: &Slot, event: &Event) {
    let Some(s) = shared.upgrade() else { return };
    if s.lock()
        .plugins
        .get(name)
        .is_none_or(|r| r.state != PluginState::Active)
    {
        return;
    }
    let chain = CallChain::starting_at(KERNEL_NAME);
    let request = Request::Event { event };
    if let Err(e) = s.call_into(&chain, name, slot.clone(), request).await {
        tracing::warn!(plugin = %name, topic = %event.topic, "event handler failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_state_counts_replacements_and_removals_toward_its_limit() {
        let mut kept = KeptState::default();
        let half = MAX_STATE_BYTES_PER_PLUGIN / 2;
        kept.insert("a", vec![0; half - 1]).expect("half fits");
        // Replacing a key counts its new value only, not both.
        kept.insert("a", vec![0; half - 1])
            .expect("a replacement fits");
        assert_eq!(kept.bytes, half);
        kept.insert("b", vec![0; half - 1])
            .expect("the second half fits");
        assert_eq!(kept.bytes, MAX_STATE_BYTES_PER_PLUGIN);
        let err = kept
            .insert("c", vec![0])
            .expect_err("one byte more is refused");
        assert!(err.contains("bytes of state"), "{err}");
        assert_eq!(
            kept.bytes, MAX_STATE_BYTES_PER_PLUGIN,
            "a refused insert changes nothing"
        );
        assert!(!kept.entries.contains_key("c"));
        kept.remove("a");
        kept.remove("missing");
        assert_eq!(kept.bytes, half);
        kept.insert("c", vec![0; 10])
            .expect("room again after a removal");
        assert_eq!(kept.bytes, half + 11);
    }
}
