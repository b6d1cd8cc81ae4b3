//! One plugin instance: a store (its data holds the plugin's [`HostHandle`], its WASI context,
//! its limiter and its CPU meter) and the instantiated bindings.

use std::sync::Arc;

use async_trait::async_trait;
use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::abi_versions::PluginExports;
use super::carve_out::CarvedOut;
use super::limits::{CpuMeter, MemoryLimiter, Metered, Overrun, Verdict, format_limit, format_mib};
use super::{WasmComponent, WasmGrants, wasi};
use crate::call_chain::CallChain;
use crate::host_api::HostHandle;
use crate::instance::{InstanceError, PluginError, PluginInstance, PluginSource};
use crate::typed_services::{ServiceAnswer, ServiceCall};
use crate::types::{Event, GuardVerdict};

/// The data of a plugin's store.
pub(crate) struct StoreState {
    /// The plugin's only door into the kernel.
    pub(crate) host: HostHandle,
    /// Guest-CPU stopwatch, paused by every host import.
    pub(crate) meter: CpuMeter,
    pub(crate) limiter: MemoryLimiter,
    /// Directories carved out of the granted ones; `None` for most plugins.
    pub(crate) carved: Option<Arc<CarvedOut>>,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Makes instances of one compiled component with one set of grants.
pub(crate) struct WasmSource {
    pub(crate) component: WasmComponent,
    pub(crate) grants: WasmGrants,
}

#[async_trait]
impl PluginSource for WasmSource {
    async fn instantiate(
        &self,
        host: HostHandle,
    ) -> Result<Box<dyn PluginInstance>, InstanceError> {
        let plugin: Arc<str> = Arc::from(host.plugin());
        let wasi = wasi::build_ctx(&plugin, &self.grants.dirs).map_err(InstanceError::Host)?;
        let limits = &self.grants.limits;
        let meter = CpuMeter::new(limits.cpu);
        let state = StoreState {
            host,
            meter: meter.clone(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            carved: CarvedOut::of(&self.grants),
            wasi,
            table: ResourceTable::new(),
        };
        let mut store = Store::new(self.component.engine(), state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_callback(|ctx| match ctx.data().meter.check() {
            // Under the limit: let the executor run other tasks, then look again in a tick.
            Verdict::Continue => Ok(UpdateDeadline::Yield(1)),
            Verdict::Exceeded(overrun) => Err(wasmtime::format_err!(
                "guest CPU bound exceeded: {overrun:?}"
            )),
        });

        // Instantiation runs guest code too (start functions), under the same bound.
        store.set_epoch_deadline(1);
        meter.start_call(std::sync::Arc::default());
        let instantiated = Metered::new(
            meter.clone(),
            self.component.pre().instantiate_async(&mut store),
        )
        .await;
        meter.end_call();
        let bindings = match instantiated {
            Ok(bindings) => bindings,
            Err(e) => {
                return Err(match limit_error(&plugin, store.data()) {
                    Some(limit) => limit,
                    None if e.downcast_ref::<Trap>().is_some() => {
                        trap_error(&plugin, "instantiation", &e)
                    }
                    None => InstanceError::Host(format!(
                        "plugin `{plugin}` could not be instantiated: {e:#}"
                    )),
                });
            }
        };
        Ok(Box::new(WasmInstance {
            store,
            bindings,
            plugin,
            poisoned: None,
            in_call: None,
            _component: self.component.clone(),
        }))
    }
}

/// A live plugin instance.
struct WasmInstance {
    store: Store<StoreState>,
    bindings: PluginExports,
    plugin: Arc<str>,
    /// Why the instance must not be entered again, after a trap, an exceeded limit, or a call
    /// that was cancelled halfway.
    poisoned: Option<String>,
    /// The export currently running; still set at the next call if a call was cancelled.
    in_call: Option<&'static str>,
    /// Keeps the engine's epoch ticker running as long as the instance lives.
    _component: WasmComponent,
}

impl WasmInstance {
    fn begin(
        &mut self,
        export: &'static str,
        chain: &CallChain,
    ) -> Result<CpuMeter, InstanceError> {
        if let Some(previous) = self.in_call.take() {
            self.poisoned.get_or_insert_with(|| {
                format!("a call to `{previous}` was cancelled before it finished")
            });
        }
        if let Some(why) = &self.poisoned {
            return Err(InstanceError::Trap(format!(
                "plugin `{}`: instance is poisoned by an earlier trap ({why}); it must be \
                 instantiated again before `{export}` can run",
                self.plugin
            )));
        }
        self.store.data_mut().host.enter(chain);
        self.store.set_epoch_deadline(1);
        let meter = self.store.data().meter.clone();
        // The first metered plugin on a chain sets the limit of the chain's account.
        chain.cpu().limit_or(meter.limit());
        meter.start_call(chain.cpu().clone());
        self.in_call = Some(export);
        Ok(meter)
    }

    fn finish<R>(
        &mut self,
        export: &'static str,
        result: wasmtime::Result<Result<R, PluginError>>,
    ) -> Result<R, InstanceError> {
        self.in_call = None;
        let spent = self.store.data().meter.end_call();
        tracing::trace!(
            plugin = &*self.plugin,
            export,
            guest_us = spent.as_micros() as u64,
            "call finished"
        );
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(InstanceError::Returned(message)),
            Err(e) => {
                tracing::debug!(plugin = &*self.plugin, export, "call failed: {e:?}");
                let error = limit_error(&self.plugin, self.store.data())
                    .unwrap_or_else(|| trap_error(&self.plugin, export, &e));
                self.poisoned = Some(error.to_string());
                Err(error)
            }
        }
    }
}

/// The limit error for a failed call, if a limit was exceeded.
fn limit_error(plugin: &str, state: &StoreState) -> Option<InstanceError> {
    match state.meter.exceeded() {
        Some(Overrun::Call(spent)) => {
            return Some(InstanceError::Limit {
                limit: "cpu",
                detail: format!(
                    "it ran {:.2} s of guest CPU in one call (limit {}); the person running \
                     keel can raise it with [limits.{plugin}] cpu-ms in keel's config if this is \
                     expected",
                    spent.as_secs_f64(),
                    format_limit(state.meter.limit())
                ),
            });
        }
        Some(Overrun::Chain { spent, limit }) => {
            return Some(InstanceError::Limit {
                limit: "cpu",
                detail: format!(
                    "the calls it was part of used {:.2} s of guest CPU together (limit {}, set \
                     by the call that started them); `{plugin}` was running when the limit was \
                     reached",
                    spent.as_secs_f64(),
                    format_limit(limit)
                ),
            });
        }
        None => {}
    }
    if let Some(refusal) = state.limiter.refused() {
        return Some(InstanceError::Limit {
            limit: "memory",
            detail: format!(
                "it tried to grow its memory to {} (limit {}); the person running keel can \
                 raise it with [limits.{plugin}] memory-mib in keel's config if this is \
                 expected",
                format_mib(refusal.wanted),
                format_mib(state.limiter.limit())
            ),
        });
    }
    None
}

fn trap_error(plugin: &str, export: &str, e: &wasmtime::Error) -> InstanceError {
    let what = match e.downcast_ref::<Trap>() {
        Some(Trap::UnreachableCodeReached) => format!(
            "{} (a panicking Rust plugin ends like this; its message is in the log, on the \
             plugin's stderr)",
            Trap::UnreachableCodeReached
        ),
        Some(trap) => trap.to_string(),
        None => e.root_cause().to_string(),
    };
    InstanceError::Trap(format!("plugin `{plugin}` trapped in `{export}`: {what}"))
}

/// `Ok(())` for exports whose WIT result is empty, so every call goes through `finish`.
fn unit(result: wasmtime::Result<()>) -> wasmtime::Result<Result<(), PluginError>> {
    result.map(Ok)
}

#[async_trait]
impl PluginInstance for WasmInstance {
    async fn activate(&mut self, chain: &CallChain, config: &str) -> Result<(), InstanceError> {
        let meter = self.begin("activate", chain)?;
        let call = self.bindings.activate(&mut self.store, config);
        let result = Metered::new(meter, call).await;
        self.finish("activate", result)
    }

    async fn deactivate(&mut self, chain: &CallChain) -> Result<(), InstanceError> {
        let meter = self.begin("deactivate", chain)?;
        let call = self.bindings.deactivate(&mut self.store);
        let result = Metered::new(meter, call).await;
        self.finish("deactivate", unit(result))
    }

    async fn handle_call(
        &mut self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, InstanceError> {
        let meter = self.begin("handle-call", chain)?;
        let call = self
            .bindings
            .handle_call(&mut self.store, service, method, payload);
        let result = Metered::new(meter, call).await;
        self.finish("handle-call", result)
    }

    async fn call_typed(
        &mut self,
        chain: &CallChain,
        call: &ServiceCall,
    ) -> Result<Option<ServiceAnswer>, InstanceError> {
        let export = match call {
            ServiceCall::Recall(_) => "memory.recall",
            ServiceCall::Summarize(_) => "compaction.summarize",
            ServiceCall::ListTools => "tool-registry.list",
            ServiceCall::ResolveTool(_) => "tool-registry.resolve",
            ServiceCall::Turn(_) => "turns.turn",
            ServiceCall::LoadConversation(_) => "turns.load",
            ServiceCall::Compact(_) => "turns.compact",
            ServiceCall::Verify(_) => "verifier.verify",
            ServiceCall::Complete(_) => "model.complete",
            ServiceCall::HookSessionStart(_) => "hooks.session-start",
            ServiceCall::HookToolUse(_) => "hooks.post-tool-use",
            ServiceCall::HookPrompt(_) => "hooks.user-prompt-submit",
            ServiceCall::HookStop(_) => "hooks.stop",
            ServiceCall::LogAppend(_) => "session-log.append",
            ServiceCall::LogStarted { .. } => "session-log.started",
            ServiceCall::LogList => "session-log.list",
            ServiceCall::LogRead(_) => "session-log.read",
            ServiceCall::LogConversation(_) => "session-log.conversation",
            ServiceCall::LogResume(_) => "session-log.resume",
            ServiceCall::LogHealth => "session-log.health",
        };
        if !self.bindings.serves(call) {
            // No typed door: the kernel sends the call as JSON instead.
            return Ok(None);
        }
        let meter = self.begin(export, chain)?;
        let result = Metered::new(meter, self.bindings.call_typed(&mut self.store, call)).await;
        self.finish(export, result).map(Some)
    }

    async fn invoke_tool(
        &mut self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, InstanceError> {
        let meter = self.begin("invoke-tool", chain)?;
        let call = self.bindings.invoke_tool(&mut self.store, name, input);
        let result = Metered::new(meter, call).await;
        self.finish("invoke-tool", result)
    }

    async fn on_event(&mut self, chain: &CallChain, event: &Event) -> Result<(), InstanceError> {
        let meter = self.begin("on-event", chain)?;
        let call = self.bindings.on_event(&mut self.store, event);
        let result = Metered::new(meter, call).await;
        self.finish("on-event", unit(result))
    }

    async fn check_tool_call(
        &mut self,
        chain: &CallChain,
        guard: &str,
        tool: &str,
        input: &str,
    ) -> Result<GuardVerdict, InstanceError> {
        let meter = self.begin("check-tool-call", chain)?;
        let call = self
            .bindings
            .check_tool_call(&mut self.store, guard, tool, input);
        let result = Metered::new(meter, call).await;
        self.finish("check-tool-call", result.map(Ok))
    }
}
