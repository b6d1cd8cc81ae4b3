//! The call path into a plugin: routing a service, tool, guard or event to the plugin that
//! serves it, bounding the call by its chain's budget (deadline, Ctrl-C), and replacing an
//! instance that was stopped halfway or ran into a limit.

use std::time::Duration;

use super::*;
use crate::typed_services::{ServiceAnswer, ServiceCall};

impl Shared {
    /// Wait until every reload in progress has released its plugin.
    pub(super) async fn wait_for_reloads(&self) {
        let slots: Vec<Slot> = self
            .lock()
            .plugins
            .values()
            .filter(|r| r.reloading)
            .map(|r| r.slot.clone())
            .collect();
        for slot in slots {
            drop(slot.lock().await);
        }
    }

    pub(crate) async fn call_service(
        &self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, KernelError> {
        if service == keel_protocol::services::EDITOR {
            return match method {
                "read" => {
                    self.editor
                        .read(self.gates.workspace.as_deref(), payload)
                        .await
                }
                other => Err(KernelError::Invalid(format!(
                    "the kernel's `{service}` service has no method `{other}`; it has `read`"
                ))),
            };
        }
        if service.starts_with(RESERVED_SERVICE_PREFIX) {
            return self.kernel_service(chain, service, method, payload);
        }
        let request = Request::Service {
            service,
            method,
            payload,
        };
        self.call_provider(chain, service, request)
            .await
            .map(Reply::text)
    }

    /// `call` through the typed door of its service (ABI 0.6.0): to the provider's typed
    /// export when it has one, else to its `handle-call` as JSON, the answer read back.
    pub(crate) async fn call_service_typed(
        &self,
        chain: &CallChain,
        call: &ServiceCall,
    ) -> Result<ServiceAnswer, KernelError> {
        match self
            .call_provider(chain, call.service(), Request::Typed { call })
            .await?
        {
            Reply::Typed(answer) => Ok(answer),
            Reply::Text(text) => call.answer_from_json(&text).map_err(KernelError::Failed),
        }
    }

    /// Route `request` to the plugin that provides `service` now, waiting once for reloads in
    /// progress.
    async fn call_provider(
        &self,
        chain: &CallChain,
        service: &str,
        request: Request<'_>,
    ) -> Result<Reply, KernelError> {
        let mut waited = false;
        loop {
            let route = {
                let mut inner = self.lock();
                let provider = inner
                    .env
                    .services()
                    .get(service)
                    .map(|entry| entry.provider.clone());
                match provider {
                    Some(provider) => {
                        let reentrant = chain.contains(&provider);
                        match inner.plugins.get_mut(&provider) {
                            Some(r) => match seat(r, reentrant) {
                                Some(seat) => Ok((provider, seat)),
                                None => {
                                    return Err(KernelError::Denied(format!(
                                        "re-entrant call refused: {chain} → {provider} (service \
                                         `{service}`); `{provider}` is already inside a call on \
                                         this chain{}",
                                        busy_note(r)
                                    )));
                                }
                            },
                            None => Err(Self::explain_missing(&inner, service)),
                        }
                    }
                    None => Err(Self::explain_missing(&inner, service)),
                }
            };
            match route {
                Ok((provider, seat)) => {
                    return self.call_into(chain, &provider, seat, request).await;
                }
                Err(why) if waited => return Err(KernelError::Unavailable(why)),
                Err(why) => {
                    if !self.lock().plugins.values().any(|r| r.reloading) {
                        return Err(KernelError::Unavailable(why));
                    }
                    self.wait_for_reloads().await;
                    waited = true;
                }
            }
        }
    }

    pub(crate) async fn invoke_tool(
        &self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, KernelError> {
        let mut waited = false;
        loop {
            let route = {
                let mut inner = self.lock();
                let owner = inner.env.tools().get(name).map(|t| t.owner.clone());
                match owner.and_then(|o| inner.plugins.get_mut(&o).map(|r| (o, r))) {
                    Some((owner, r)) => match seat(r, chain.contains(&owner)) {
                        Some(seat) => Some((owner, seat)),
                        None => {
                            return Err(KernelError::Denied(format!(
                                "re-entrant call refused: {chain} → {owner} (tool `{name}`){}",
                                busy_note(r)
                            )));
                        }
                    },
                    None => None,
                }
            };
            match route {
                Some((owner, seat)) => {
                    return self
                        .call_into(chain, &owner, seat, Request::Tool { name, input })
                        .await
                        .map(Reply::text);
                }
                None if waited || !self.lock().plugins.values().any(|r| r.reloading) => {
                    return Err(KernelError::Unavailable(format!(
                        "no tool named `{name}` is registered; the registered tools are: {}",
                        self.lock()
                            .env
                            .tools()
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                None => {
                    self.wait_for_reloads().await;
                    waited = true;
                }
            }
        }
    }

    /// Run `request` on `plugin`'s instance once its slot is free, re-checking after the wait
    /// that the plugin still owns the target: a reload may have changed that.
    ///
    /// The call is bounded by its chain's budget (see [`crate::call_chain`]): at the deadline,
    /// or at Ctrl-C when it is part of a turn, it is stopped wherever it is (waiting for the
    /// slot, in guest code, in a nested call) and the caller gets an error at once. An
    /// instance stopped halfway, or one that ran into a limit, is replaced by a fresh instance
    /// before its next call, so the plugin stays usable.
    pub(super) async fn call_into(
        &self,
        chain: &CallChain,
        plugin: &str,
        seat: impl Into<Seat>,
        request: Request<'_>,
    ) -> Result<Reply, KernelError> {
        let started = std::time::Instant::now();
        let mut account = None;
        let result = self
            .call_into_bounded(chain, plugin, seat.into(), request, &mut account)
            .await;
        let cpu = account
            .map(
                |(cpu, before): (std::sync::Arc<crate::CpuAccount>, Duration)| {
                    cpu.charged_ever().saturating_sub(before)
                },
            )
            .unwrap_or_default();
        self.observatory
            .record_call(plugin, result.is_ok(), started.elapsed(), cpu);
        result
    }

    /// [`call_into`](Self::call_into) without the figures.
    async fn call_into_bounded(
        &self,
        chain: &CallChain,
        plugin: &str,
        seat: Seat,
        request: Request<'_>,
        account: &mut Option<(std::sync::Arc<crate::CpuAccount>, Duration)>,
    ) -> Result<Reply, KernelError> {
        let what = request.describe();
        let mut kind = request.kind(chain);
        // A plugin that drives agents may serve a tool call by running a child agent, whose
        // own model and tool calls are bounded each: the call gets the longer deadline of a
        // child's run, and its nested calls inherit it, but only once it opened a child (see
        // `overdue`).
        if kind == CallKind::Tool
            && self
                .manifest_of(plugin)
                .is_some_and(|m| m.capabilities.agent)
        {
            kind = CallKind::Child;
        }
        let plain = request.plain(kind);
        let callee = chain.enter(
            plugin,
            kind,
            &self.config.deadlines,
            tokio::time::Instant::now(),
        );
        *account = Some((callee.cpu().clone(), callee.cpu().charged_ever()));
        if let Some(limit) = callee.cpu().limit()
            && callee.cpu().spent() > limit
        {
            // Refused before the guest runs at all: a caller that ignores the error and calls
            // again gets nothing more out of the chain's spent account.
            tracing::info!(plugin, door = what, %chain, "not called: the chain's CPU is spent");
            return Err(KernelError::Failed(format!(
                "plugin `{plugin}` was not called for {plain}: the work it is part of already \
                 used {:.2} s of guest CPU, over its limit of {}",
                callee.cpu().spent().as_secs_f64(),
                crate::wasm_host::limits::format_limit(limit)
            )));
        }
        let started = tokio::time::Instant::now();
        let overdue = async {
            let Some(d) = callee.deadline() else {
                return std::future::pending().await;
            };
            // A tool call that has not opened a child agent by the tool-call deadline is an
            // ordinary one, whatever capability its plugin declared.
            if kind == CallKind::Child {
                let tool = Deadline {
                    at: started + self.config.deadlines.tool,
                    kind: CallKind::Tool,
                    length: self.config.deadlines.tool,
                };
                if tool.at < d.at {
                    tokio::time::sleep_until(tool.at).await;
                    if callee.opened_agent().is_none() {
                        return tool;
                    }
                }
            }
            // At a turn's own deadline its inner calls are stopped first; the agent then gets
            // the grace of a cancelled turn to end the turn itself and record it.
            let at = if kind == CallKind::Turn && d.kind == CallKind::Turn {
                d.at + TURN_CANCEL_GRACE
            } else {
                d.at
            };
            tokio::time::sleep_until(at).await;
            d
        };
        let bounded = async {
            tokio::select! {
                biased;
                result = self.run_seated(&callee, plugin, seat, request) => result,
                d = overdue => {
                    tracing::info!(plugin, door = what, %chain, "stopped at its deadline");
                    Err(overdue_error(plugin, &plain, kind, d))
                }
            }
        };
        if !callee.interruptible() {
            return bounded.await;
        }
        let stopped = || {
            KernelError::Denied(format!(
                "plugin `{plugin}` was stopped in {plain}: the person cancelled the turn (Ctrl-C)"
            ))
        };
        // The agent ends a cancelled turn itself, recording it, once what it waits on has
        // been stopped: it gets longer.
        let grace = if kind == CallKind::Turn {
            TURN_CANCEL_GRACE
        } else {
            if self.gates.is_cancelled() {
                return Err(stopped());
            }
            CANCEL_GRACE
        };
        tokio::pin!(bounded);
        tokio::select! {
            biased;
            result = &mut bounded => return result,
            () = self.gates.until_cancelled() => {}
        }
        // The cancel has already ended what the call waits on (a model stream, a command), so
        // a plugin that handles it returns at once, with what it has so far (a partial answer,
        // a command's output); one that does not is stopped after the grace.
        tokio::time::timeout(grace, bounded)
            .await
            .unwrap_or_else(|_| Err(stopped()))
    }

    /// The part of [`call_into`](Self::call_into) that holds the instance.
    async fn run_seated(
        &self,
        callee: &CallChain,
        plugin: &str,
        seat: Seat,
        request: Request<'_>,
    ) -> Result<Reply, KernelError> {
        let mut guard = match seat {
            Seat::First(slot) => slot.lock_owned().await,
            Seat::FirstHeld(guard) => guard,
            Seat::Extra(guard) => return self.run_in_extra(callee, plugin, guard, request).await,
        };
        let what = request.describe();
        let restart = {
            let inner = self.lock();
            let Some(r) = inner.plugins.get(plugin) else {
                return Err(KernelError::Unavailable(format!(
                    "plugin `{plugin}` was unloaded before the call to {what} could run"
                )));
            };
            if r.state != PluginState::Active || !request.routed_to(&inner.env, plugin) {
                return Err(KernelError::Unavailable(format!(
                    "plugin `{plugin}` is {} and no longer serves {what}",
                    r.state.name()
                )));
            }
            r.restart
                .clone()
                .or_else(|| guard.is_none().then(|| "its instance was gone".to_owned()))
        };
        let mut generation = self.lock().plugins.get(plugin).map(|r| r.generation);
        if let Some(why) = restart {
            guard = self.restart(plugin, guard, why).await?;
            let inner = self.lock();
            generation = inner
                .plugins
                .get(plugin)
                .filter(|_| request.routed_to(&inner.env, plugin))
                .map(|r| r.generation);
        }
        let Some(generation) = generation else {
            return Err(KernelError::Unavailable(format!(
                "plugin `{plugin}` no longer serves {what}"
            )));
        };
        let Some(instance) = guard.as_mut() else {
            return Err(KernelError::Unavailable(format!(
                "plugin `{plugin}` has no running instance"
            )));
        };
        // Dropped before it is disarmed only if this future is dropped while the instance is
        // running: then the instance stopped halfway and must be replaced.
        let mut halfway = RestartIfStopped {
            shared: self,
            plugin,
            generation,
            what: &what,
            armed: true,
        };
        let outcome = request
            .serve(instance.as_mut(), callee, &self.boundary)
            .await;
        halfway.armed = false;
        match outcome {
            Ok(out) => Ok(out),
            Err(e) => {
                let error = plugin_failure(plugin, &what, &e);
                if matches!(e, crate::instance::InstanceError::Limit { .. }) {
                    // A limit is the plugin's bound doing its job, not a broken plugin: the
                    // next call gets a fresh instance.
                    *guard = None;
                    self.mark_for_restart(plugin, generation, format!("{what} {e}"));
                } else if e.is_fatal() {
                    *guard = None;
                    drop(guard);
                    self.instance_died(plugin, generation, e.to_string());
                }
                Err(error)
            }
        }
    }

    /// Run `request` in an extra instance of `plugin` (activated on first use, and again
    /// after the plugin was re-activated). It changes nothing in the environment; one that
    /// is stopped halfway, traps or hits a limit is simply dropped.
    async fn run_in_extra(
        &self,
        callee: &CallChain,
        plugin: &str,
        mut guard: tokio::sync::OwnedMutexGuard<Option<(u64, Box<dyn PluginInstance>)>>,
        request: Request<'_>,
    ) -> Result<Reply, KernelError> {
        let what = request.describe();
        let (generation, source, config) = {
            let inner = self.lock();
            let r = inner
                .plugins
                .get(plugin)
                .filter(|r| r.state == PluginState::Active && request.routed_to(&inner.env, plugin))
                .ok_or_else(|| {
                    KernelError::Unavailable(format!("plugin `{plugin}` no longer serves {what}"))
                })?;
            (
                r.generation,
                r.source.clone(),
                r.manifest.config.to_string(),
            )
        };
        let mut instance = match guard.take() {
            Some((g, instance)) if g == generation => instance,
            _ => {
                let host = HostHandle::extra(self.me.clone(), plugin, generation);
                self.start_instance(plugin, source.as_ref(), host, &config)
                    .await
                    .map_err(|e| {
                        KernelError::Unavailable(format!("another instance of `{plugin}`: {e}"))
                    })?
            }
        };
        let outcome = request
            .serve(instance.as_mut(), callee, &self.boundary)
            .await;
        match outcome {
            Ok(out) => {
                *guard = Some((generation, instance));
                Ok(out)
            }
            Err(e) => {
                if !e.is_fatal() {
                    *guard = Some((generation, instance));
                }
                Err(plugin_failure(plugin, &what, &e))
            }
        }
    }

    /// Note that `plugin`'s instance of `generation` must be replaced before its next call.
    pub(super) fn mark_for_restart(&self, plugin: &str, generation: u64, why: String) {
        if let Some(r) = self.lock().plugins.get_mut(plugin)
            && r.generation == generation
        {
            tracing::info!(plugin, "instance to be replaced: {why}");
            r.restart.get_or_insert(why);
        }
    }

    /// Replace `plugin`'s instance with a fresh, activated one, its old effects undone. Runs
    /// in a task of its own that owns the slot, so a caller that gives up halfway cannot leave
    /// the plugin half restarted.
    async fn restart(
        &self,
        plugin: &str,
        guard: tokio::sync::OwnedMutexGuard<Option<Box<dyn PluginInstance>>>,
        why: String,
    ) -> Result<tokio::sync::OwnedMutexGuard<Option<Box<dyn PluginInstance>>>, KernelError> {
        let Some(shared) = self.me.upgrade() else {
            return Err(KernelError::Unavailable("the kernel has shut down".into()));
        };
        let name = plugin.to_owned();
        let task = tokio::spawn(async move {
            let mut guard = guard;
            {
                let mut inner = shared.lock();
                let Inner { env, plugins, .. } = &mut *inner;
                if let Some(r) = plugins.get_mut(&name) {
                    r.reloading = true;
                    super::undo_instance(&shared.gates, r, &name, env);
                }
            }
            // The old instance cannot run again; dropping it is all that is left of it.
            *guard = None;
            shared.gates.net.close_all(&name);
            tracing::info!(plugin = %name, "restarting: {why}");
            let activated = shared.activate_holding(&name, &mut guard).await;
            if let Some(r) = shared.lock().plugins.get_mut(&name) {
                r.reloading = false;
            }
            shared.publish_changes();
            match activated {
                Ok(()) => Ok(guard),
                Err(reason) => {
                    drop(guard);
                    shared.resettle_later();
                    Err(KernelError::Unavailable(format!(
                        "plugin `{name}` had to be restarted ({why}) and could not be: {reason}"
                    )))
                }
            }
        });
        task.await.unwrap_or_else(|e| {
            Err(KernelError::Failed(format!(
                "restarting plugin `{plugin}` failed: {e}"
            )))
        })
    }
}

/// Marks an instance for replacement if the call running in it is dropped halfway.
struct RestartIfStopped<'a> {
    shared: &'a Shared,
    plugin: &'a str,
    generation: u64,
    what: &'a str,
    armed: bool,
}

impl Drop for RestartIfStopped<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.mark_for_restart(
                self.plugin,
                self.generation,
                format!("a call to {} was stopped before it finished", self.what),
            );
        }
    }
}

/// Which instance of a plugin a call runs in.
pub(super) enum Seat {
    /// The plugin's first instance, once its slot is free.
    First(Slot),
    /// The first instance, its slot already taken for this call.
    FirstHeld(tokio::sync::OwnedMutexGuard<Option<Box<dyn PluginInstance>>>),
    /// An extra instance, taken for this call.
    Extra(tokio::sync::OwnedMutexGuard<Option<(u64, Box<dyn PluginInstance>)>>),
}

impl From<Slot> for Seat {
    fn from(slot: Slot) -> Self {
        Seat::First(slot)
    }
}

/// Where a tool or service call into `r` runs. A plugin with one instance: its slot (waiting
/// for it), or nothing when the call re-enters it (A → B → A would wait for itself). One with
/// several: whichever instance is free, a new one while there is room; when none is, a call
/// from outside waits for the first, a re-entering one gets nothing (it could wait on its
/// own caller).
fn seat(r: &mut Record, reentrant: bool) -> Option<Seat> {
    let instances = usize::try_from(r.manifest.limits.instances.unwrap_or(1)).unwrap_or(1);
    if instances <= 1 || r.state != PluginState::Active || r.reloading {
        return (!reentrant).then(|| Seat::First(r.slot.clone()));
    }
    if let Ok(held) = r.slot.clone().try_lock_owned() {
        return Some(Seat::FirstHeld(held));
    }
    for extra in &r.extra {
        if let Ok(held) = extra.clone().try_lock_owned() {
            return Some(Seat::Extra(held));
        }
    }
    if r.extra.len() + 1 < instances {
        let extra: ExtraSlot = Arc::default();
        let held = extra.clone().try_lock_owned().ok()?;
        r.extra.push(extra);
        return Some(Seat::Extra(held));
    }
    (!reentrant).then(|| Seat::First(r.slot.clone()))
}

/// Why a call into `r` found no instance, beyond re-entering it.
fn busy_note(r: &Record) -> String {
    match r.manifest.limits.instances.unwrap_or(1) {
        0 | 1 => String::new(),
        n => format!(" and all its {n} instances are busy"),
    }
}

/// How long a call of a cancelled turn may take to return on its own before it is stopped.
const CANCEL_GRACE: Duration = Duration::from_millis(50);

/// How long the agent may take to end a cancelled turn before its turn call is stopped too.
const TURN_CANCEL_GRACE: Duration = Duration::from_secs(2);

/// The error of a call stopped at its chain's deadline.
fn overdue_error(plugin: &str, plain: &str, kind: CallKind, deadline: Deadline) -> KernelError {
    let (name, key) = deadline.kind.deadline_name();
    let whose = if deadline.kind == kind {
        String::new()
    } else {
        format!(" of the {name} it is part of")
    };
    KernelError::TimedOut(format!(
        "plugin `{plugin}` did not finish {} within {} s, the {name} deadline{whose}; it was \
         stopped and starts afresh for its next call (the person running keel can raise \
         [timeouts] {key} in keel's config)",
        plain,
        deadline.length.as_secs_f64()
    ))
}

/// A call the kernel routes into a plugin.
pub(super) enum Request<'a> {
    Service {
        service: &'a str,
        method: &'a str,
        payload: &'a str,
    },
    Tool {
        name: &'a str,
        input: &'a str,
    },
    Guard {
        guard: &'a str,
        tool: &'a str,
        input: &'a str,
    },
    Event {
        event: &'a Event,
    },
    /// A typed service call (ABI 0.6.0), routed by its service like [`Request::Service`].
    Typed {
        call: &'a ServiceCall,
    },
}

/// What a plugin answered a [`Request`].
pub(super) enum Reply {
    /// Text: a service's or tool's answer, a guard's verdict as JSON, nothing for an event;
    /// also a typed call's answer from a provider without the typed door, to be read back.
    Text(String),
    /// A typed call's answer through the provider's typed door.
    Typed(ServiceAnswer),
}

impl Reply {
    /// The text of a reply to a request other than a typed call, which is always text.
    pub(super) fn text(self) -> String {
        match self {
            Reply::Text(text) => text,
            // Only a `Request::Typed` is answered in records, and its caller reads them.
            Reply::Typed(_) => String::new(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Reply::Text(text) => text.len(),
            Reply::Typed(answer) => answer.bytes(),
        }
    }
}

/// The error a caller gets when `plugin`'s code did not answer its call to `door`: what the
/// plugin said, of the kind it said (ABI 0.4.0's typed errors keep theirs), or what became of
/// the plugin. The caller reads what happened, not the kernel's routing; the routing goes to
/// the log.
fn plugin_failure(plugin: &str, door: &str, error: &crate::instance::InstanceError) -> KernelError {
    use crate::instance::{InstanceError, PluginError};
    tracing::info!(plugin, door, "the call failed: {error}");
    match error {
        InstanceError::Returned(returned) => match returned.clone() {
            PluginError::InvalidInput(m) | PluginError::Unknown(m) => KernelError::Invalid(m),
            PluginError::InvalidConfig(m) => {
                KernelError::Invalid(format!("invalid configuration: {m}"))
            }
            PluginError::Denied(m) => KernelError::Denied(m),
            PluginError::Unavailable(m) => KernelError::Unavailable(m),
            PluginError::Failed(m) => KernelError::Failed(m),
        },
        InstanceError::Trap(why) => KernelError::Failed(format!(
            "plugin `{plugin}` crashed ({why}); its next call runs in a fresh instance"
        )),
        InstanceError::Limit { .. } => KernelError::Failed(format!("plugin `{plugin}` {error}")),
        InstanceError::Host(why) => {
            KernelError::Failed(format!("plugin `{plugin}` could not run the call: {why}"))
        }
    }
}

impl Request<'_> {
    /// Run it in `instance`, on `callee` (the chain including the plugin).
    async fn serve(
        &self,
        instance: &mut dyn PluginInstance,
        callee: &CallChain,
        meter: &crate::boundary::BoundaryMeter,
    ) -> Result<Reply, crate::instance::InstanceError> {
        meter.crossed(self.bytes_in());
        let answer = self.serve_unmetered(instance, callee).await;
        meter.crossed(answer.as_ref().map_or(0, Reply::bytes));
        answer
    }

    /// What the request hands the plugin, in bytes.
    fn bytes_in(&self) -> usize {
        match self {
            Request::Service { payload, .. } => payload.len(),
            Request::Tool { input, .. } | Request::Guard { input, .. } => input.len(),
            Request::Event { event } => event.payload.len(),
            Request::Typed { call } => call.bytes(),
        }
    }

    async fn serve_unmetered(
        &self,
        instance: &mut dyn PluginInstance,
        callee: &CallChain,
    ) -> Result<Reply, crate::instance::InstanceError> {
        let text = match self {
            Request::Service {
                service,
                method,
                payload,
            } => instance.handle_call(callee, service, method, payload).await,
            Request::Tool { name, input } => instance.invoke_tool(callee, name, input).await,
            Request::Guard { guard, tool, input } => instance
                .check_tool_call(callee, guard, tool, input)
                .await
                .map(|v| serde_json::to_string(&v).unwrap_or_default()),
            Request::Event { event } => instance
                .on_event(callee, event)
                .await
                .map(|()| String::new()),
            Request::Typed { call } => match instance.call_typed(callee, call).await? {
                Some(answer) => return Ok(Reply::Typed(answer)),
                // A provider without the typed door serves the same call as JSON.
                None => {
                    instance
                        .handle_call(callee, call.service(), call.method(), &call.to_json())
                        .await
                }
            },
        };
        text.map(Reply::Text)
    }

    /// The door this request came through, made on `chain`.
    pub(super) fn kind(&self, chain: &CallChain) -> CallKind {
        match self {
            Request::Service { service, .. } if *service == keel_protocol::services::MODEL => {
                CallKind::Model
            }
            Request::Typed { call }
                if call.service() == keel_protocol::services::AGENT && chain.is_root() =>
            {
                CallKind::Turn
            }
            Request::Typed { call } if call.service() == keel_protocol::services::MODEL => {
                CallKind::Model
            }
            Request::Typed { .. } => CallKind::Service,
            Request::Service { service, .. }
                if *service == keel_protocol::services::AGENT && chain.is_root() =>
            {
                CallKind::Turn
            }
            Request::Service { .. } => CallKind::Service,
            Request::Tool { .. } => CallKind::Tool,
            Request::Guard { .. } => CallKind::Guard,
            Request::Event { .. } => CallKind::Event,
        }
    }

    /// The call in a person's words, for the errors its caller reads: what was asked of the
    /// plugin, not the door the kernel routed it through (that is `describe`, for the log).
    fn plain(&self, kind: CallKind) -> String {
        match (self, kind) {
            (_, CallKind::Turn) => "the turn".into(),
            (_, CallKind::Model) => "the model call".into(),
            (Request::Tool { name, .. }, CallKind::Child) => {
                format!("the subagent's run for the tool call `{name}`")
            }
            (Request::Tool { name, .. }, _) => format!("the tool call `{name}`"),
            (Request::Guard { guard, tool, .. }, _) => {
                format!("its check `{guard}` of the tool call `{tool}`")
            }
            (Request::Event { event }, _) => format!("its handler of `{}` events", event.topic),
            (Request::Service { service, .. }, _) => format!("a call to its `{service}` service"),
            (Request::Typed { call }, _) => {
                format!("a call to its `{}` service", call.service())
            }
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Request::Service {
                service, method, ..
            } => format!("service `{service}`, method `{method}`"),
            Request::Tool { name, .. } => format!("tool `{name}`"),
            Request::Guard { guard, .. } => format!("guard `{guard}`"),
            Request::Event { event } => format!("event `{}`", event.topic),
            Request::Typed { call } => format!(
                "service `{}`, method `{}` (typed)",
                call.service(),
                call.method()
            ),
        }
    }

    /// Whether `plugin` still serves this request.
    pub(super) fn routed_to(&self, env: &Env, plugin: &str) -> bool {
        match self {
            Request::Service { service, .. } => env
                .services()
                .get(*service)
                .is_some_and(|e| e.provider == plugin),
            Request::Typed { call } => env
                .services()
                .get(call.service())
                .is_some_and(|e| e.provider == plugin),
            Request::Tool { name, .. } => env.tools().get(*name).is_some_and(|t| t.owner == plugin),
            Request::Guard { guard, .. } => env.guards().any(|(g, p)| g == *guard && p == plugin),
            Request::Event { .. } => true,
        }
    }
}
