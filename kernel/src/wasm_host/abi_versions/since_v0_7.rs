//! ABI 0.7.0: the model, typed. The kernel's `agent` door at 0.7.0 (`complete`, `dispatch`,
//! `replay`, `cancelled` in records), the `model` service a plugin that declared it imports,
//! and the `model` export of a model adapter. And HTTP bodies and processes as resources: the
//! handle the component holds is the kernel's number as the resource's representation, so
//! the same `HostHandle` methods serve both versions, and dropping the handle releases the
//! body or kills the process.
//!
//! As in [`super::since_v0_6`], both sides of a call are here and the kernel routes it in
//! `keel_protocol`'s types: the import side ends in the same
//! [`HostHandle`](crate::HostHandle) methods as 0.2.0's JSON door (`agent_complete_typed`
//! behind `agent_complete`, the same checks), and a model call reaches the adapter's typed
//! export when it has one ([`ModelExports`]), its `handle-call` with JSON otherwise. The
//! records of `model-types` are shared by both sides' bindings, so one conversion
//! (`super::conversions`) serves them.

use wasmtime::component::{ComponentType, Instance, InstancePre, Lift, Linker, Resource, WasmList};
use wasmtime::{Store, StoreContextMut};

use super::conversions::{
    model_request_from_wit as request_from_wit, model_request_to_wit as request_to_wit,
    model_response_from_wit as response_from_wit, model_response_to_wit as response_to_wit,
    outcome_to_wit,
};
use super::since_v0_2::keel::plugin::types::KernelError;
// The resources' methods are 0.2.0's and 0.3.0's numbered doors, the handle's representation
// the number: one host implementation, with the same owner checks, serves both versions.
use super::since_v0_2::RequestParts;
use super::since_v0_2::keel::plugin::http::{
    Header, Host as NumberedHttp, Request as HttpRequest, ResponseHead, SecretHeader,
};
use super::since_v0_3::keel::plugin0_3_0::processes::{Host as NumberedProcesses, ProcessStatus};
use crate::instance::PluginError;
use crate::typed_services::{ModelCall, ServiceAnswer, ServiceCall};
use crate::wasm_host::abi::ComponentReport;
use crate::wasm_host::store::StoreState;

wasmtime::component::bindgen!({
    path: [
        "../wit/keel-plugin-0.2.0",
        "../wit/keel-plugin-0.3.0",
        "../wit/keel-plugin-0.4.0",
        "../wit/keel-plugin-0.5.0",
        "../wit/keel-plugin-0.6.0",
        "../wit/keel-plugin-0.7.0",
    ],
    world: "keel:plugin/keel-plugin@0.7.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "keel:plugin/types@0.2.0": super::since_v0_2::keel::plugin::types,
        "keel:plugin/log@0.2.0": super::since_v0_2::keel::plugin::log,
        "keel:plugin/services@0.2.0": super::since_v0_2::keel::plugin::services,
        "keel:plugin/tools@0.2.0": super::since_v0_2::keel::plugin::tools,
        "keel:plugin/events@0.2.0": super::since_v0_2::keel::plugin::events,
        "keel:plugin/prompt@0.2.0": super::since_v0_2::keel::plugin::prompt,
        "keel:plugin/state@0.2.0": super::since_v0_2::keel::plugin::state,
        "keel:plugin/guards@0.2.0": super::since_v0_2::keel::plugin::guards,
        "keel:plugin/http@0.2.0": super::since_v0_2::keel::plugin::http,
        "keel:plugin/exec@0.2.0": super::since_v0_2::keel::plugin::exec,
        "keel:plugin/agent@0.2.0": super::since_v0_2::keel::plugin::agent,
        "keel:plugin/processes@0.3.0": super::since_v0_3::keel::plugin0_3_0::processes,
        "keel:plugin/tool-list@0.3.0": super::since_v0_3::keel::plugin0_3_0::tool_list,
        "keel:plugin/plugin@0.4.0": super::since_v0_4::exports::keel::plugin0_4_0::plugin,
        "keel:plugin/caller@0.5.0": super::since_v0_5::keel::plugin0_5_0::caller,
        "keel:plugin/prompt-context@0.5.0": super::since_v0_5::keel::plugin0_5_0::prompt_context,
        "keel:plugin/conversation@0.5.0": super::since_v0_5::keel::plugin0_5_0::conversation,
        "keel:plugin/agents@0.5.0": super::since_v0_5::keel::plugin0_5_0::agents,
        "keel:plugin/memory@0.6.0": super::since_v0_6::keel::plugin0_6_0::memory,
        "keel:plugin/compaction@0.6.0": super::since_v0_6::keel::plugin0_6_0::compaction,
        "keel:plugin/tool-registry@0.6.0": super::since_v0_6::keel::plugin0_6_0::tool_registry,
        "keel:plugin/turns@0.6.0": super::since_v0_6::keel::plugin0_6_0::turns,
        "keel:plugin/verifier-types@0.6.0": super::since_v0_6::keel::plugin0_6_0::verifier_types,
        "keel:plugin/verifier@0.6.0": super::since_v0_6::keel::plugin0_6_0::verifier,
        "keel:plugin/editor@0.6.0": super::since_v0_6::keel::plugin0_6_0::editor,
    },
});

/// The providers' side: a model adapter's `model` export, its records those of the import
/// side, and a hooks plugin's `hooks` export.
mod provider_exports {
    wasmtime::component::bindgen!({
        path: [
            "../wit/keel-plugin-0.2.0",
            "../wit/keel-plugin-0.3.0",
            "../wit/keel-plugin-0.4.0",
            "../wit/keel-plugin-0.5.0",
            "../wit/keel-plugin-0.6.0",
            "../wit/keel-plugin-0.7.0",
        ],
        inline: "
            package keel:host;

            world provider-exports {
                export keel:plugin/model@0.7.0;
                export keel:plugin/hooks@0.7.0;
            }
        ",
        world: "keel:host/provider-exports",
        exports: { default: async },
        with: {
            "keel:plugin/types@0.2.0": crate::wasm_host::abi_versions::since_v0_2::keel::plugin::types,
            "keel:plugin/conversation@0.5.0": crate::wasm_host::abi_versions::since_v0_5::keel::plugin0_5_0::conversation,
            "keel:plugin/tool-registry@0.6.0": crate::wasm_host::abi_versions::since_v0_6::keel::plugin0_6_0::tool_registry,
            "keel:plugin/turns@0.6.0": crate::wasm_host::abi_versions::since_v0_6::keel::plugin0_6_0::turns,
            "keel:plugin/model-types@0.7.0": crate::wasm_host::abi_versions::since_v0_7::keel::plugin0_7_0::model_types,
        },
    });
}

use super::since_v0_6::keel::plugin0_6_0::verifier_types;
use keel::plugin0_7_0::{agent, http, model, model_types, processes};
use provider_exports::exports::keel::plugin0_7_0::{hooks as hooks_export, model as model_export};

/// The export of a plugin that provides `model` through its typed door.
pub(crate) const MODEL_EXPORT: &str = "keel:plugin/model@0.7.0";
/// The export of the plugin keel hands the person's hooks, its typed door.
pub(crate) const HOOKS_EXPORT: &str = "keel:plugin/hooks@0.7.0";

impl model_types::Host for StoreState {}

impl agent::Host for StoreState {
    async fn complete(
        &mut self,
        request: model_types::ModelRequest,
    ) -> Result<model_types::ModelResponse, KernelError> {
        // The model streams for a while: the meter stays paused across the await.
        let _host = self.meter.host_call();
        let request = request_from_wit(request).map_err(KernelError::Invalid)?;
        let response = self.host.agent_complete_typed(request).await?;
        Ok(response_to_wit(response))
    }

    async fn dispatch(&mut self, call_ids: Vec<String>) -> Vec<verifier_types::ToolOutcome> {
        let _host = self.meter.host_call();
        self.host
            .agent_dispatch_typed(&call_ids)
            .await
            .into_iter()
            .map(outcome_to_wit)
            .collect()
    }

    async fn replay(
        &mut self,
        call_id: String,
    ) -> Result<verifier_types::ToolOutcome, KernelError> {
        let _host = self.meter.host_call();
        Ok(outcome_to_wit(
            self.host.agent_replay_typed(&call_id).await?,
        ))
    }

    async fn cancelled(&mut self) -> bool {
        self.host.agent_cancelled()
    }
}

impl model::Host for StoreState {
    async fn complete(
        &mut self,
        request: model_types::ModelRequest,
    ) -> Result<model_types::ModelResponse, KernelError> {
        let _host = self.meter.host_call();
        let request = request_from_wit(request).map_err(KernelError::Invalid)?;
        let call = ServiceCall::Complete(Box::new(ModelCall::new(request)));
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Completion(response) => Ok(response_to_wit(*response)),
            _ => Err(KernelError::Failed(
                "keel routed a typed `model.complete` call and got another method's answer; \
                 please report this"
                    .into(),
            )),
        }
    }
}

impl http::Host for StoreState {
    // What bindgen links; [`send_from_guest_memory`] replaces it in every linker keel builds.
    async fn send(
        &mut self,
        req: HttpRequest,
    ) -> Result<(ResponseHead, Resource<http::Body>), KernelError> {
        let (id, head) = NumberedHttp::send(self, req).await?;
        Ok((head, Resource::new_own(id)))
    }
}

/// 0.7.0's `request` record as [`send_from_guest_memory`] lifts it: the body left in the
/// plugin's memory.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RequestInPlace {
    method: String,
    url: String,
    headers: Vec<Header>,
    #[component(name = "secret-headers")]
    secret_headers: Vec<SecretHeader>,
    body: WasmList<u8>,
    #[component(name = "timeout-ms")]
    timeout_ms: u32,
}

/// Link 0.7.0's `http.send` so that the body is copied once, straight from the plugin's
/// memory into the kernel's reused request buffer (`net_client::request_buffers`), instead of
/// bindgen's lift into a fresh `Vec` per request: a model request is the whole conversation,
/// a few kilobytes larger at each step of a long turn, and a fresh allocation of megabytes per
/// step cost more than the copy itself. Call after bindgen's `http::add_to_linker`.
pub(super) fn send_from_guest_memory(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let linked = linker
        .instance("keel:plugin/http@0.7.0")
        .and_then(|mut http| {
            http.func_wrap_async(
                "send",
                |mut store: StoreContextMut<'_, StoreState>, (req,): (RequestInPlace,)| {
                    let body = store
                        .data()
                        .host
                        .http_request_body(req.body.as_le_slice(&store));
                    let parts = RequestParts {
                        method: req.method,
                        url: req.url,
                        headers: req.headers,
                        secret_headers: req.secret_headers,
                        timeout_ms: req.timeout_ms,
                    };
                    Box::new(async move {
                        let sent = store
                            .data_mut()
                            .http_send(parts, body)
                            .await
                            .map(|(id, head)| (head, Resource::<http::Body>::new_own(id)));
                        Ok((sent,))
                    })
                },
            )
        });
    linker.allow_shadowing(false);
    linked
}

impl http::HostBody for StoreState {
    async fn next_chunk(
        &mut self,
        body: Resource<http::Body>,
        idle_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        NumberedHttp::next_chunk(self, body.rep(), idle_ms).await
    }

    async fn drop(&mut self, body: Resource<http::Body>) -> wasmtime::Result<()> {
        NumberedHttp::close(self, body.rep()).await;
        Ok(())
    }
}

impl processes::Host for StoreState {
    async fn entries(&mut self) -> Vec<String> {
        NumberedProcesses::entries(self).await
    }

    async fn start(&mut self, entry: String) -> Result<Resource<processes::Process>, KernelError> {
        Ok(Resource::new_own(
            NumberedProcesses::start(self, entry).await?,
        ))
    }
}

impl processes::HostProcess for StoreState {
    async fn id(&mut self, process: Resource<processes::Process>) -> u32 {
        process.rep()
    }

    async fn write(
        &mut self,
        process: Resource<processes::Process>,
        bytes: Vec<u8>,
        timeout_ms: u32,
    ) -> Result<(), KernelError> {
        NumberedProcesses::write(self, process.rep(), bytes, timeout_ms).await
    }

    async fn read(
        &mut self,
        process: Resource<processes::Process>,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        NumberedProcesses::read(self, process.rep(), max_bytes, timeout_ms).await
    }

    async fn status(
        &mut self,
        process: Resource<processes::Process>,
    ) -> Result<ProcessStatus, KernelError> {
        NumberedProcesses::status(self, process.rep()).await
    }

    async fn drop(&mut self, process: Resource<processes::Process>) -> wasmtime::Result<()> {
        // The program lives as long as its handle.
        NumberedProcesses::kill(self, process.rep()).await;
        Ok(())
    }
}

/// The person's hooks' types and the `hooks` export's records, by the macro the hooks plugin
/// expands too.
mod hook_records {
    use super::hooks_export as hooks;

    keel_protocol::wit_hook_conversions!();
}

/// Where each typed service a component exports (0.7.0's `model`, `hooks`) is, found when it
/// is linked.
#[derive(Default)]
pub(crate) struct ServiceIndices {
    model: Option<model_export::GuestIndices>,
    hooks: Option<hooks_export::GuestIndices>,
}

impl ServiceIndices {
    /// The typed services `report` lists among the component's exports.
    pub(crate) fn new(
        pre: &InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<ServiceIndices> {
        let exports = |name: &str| report.exports.iter().any(|e| e == name);
        Ok(ServiceIndices {
            model: exports(MODEL_EXPORT)
                .then(|| model_export::GuestIndices::new(pre))
                .transpose()?,
            hooks: exports(HOOKS_EXPORT)
                .then(|| hooks_export::GuestIndices::new(pre))
                .transpose()?,
        })
    }

    /// The exports of `instance`, each type-checked against this package's WIT: one of another
    /// shape fails the instance, naming the export.
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<ServiceExports> {
        let shape = super::wrong_shape;
        Ok(ServiceExports {
            model: self
                .model
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()
                .map_err(|e| e.context(shape(MODEL_EXPORT)))?,
            hooks: self
                .hooks
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()
                .map_err(|e| e.context(shape(HOOKS_EXPORT)))?,
        })
    }
}

/// The 0.7.0 typed services an instance exports.
pub(crate) struct ServiceExports {
    model: Option<model_export::Guest>,
    hooks: Option<hooks_export::Guest>,
}

impl ServiceExports {
    /// Whether the instance serves `call` through a 0.7.0 typed door.
    pub(crate) fn serves(&self, call: &ServiceCall) -> bool {
        match call {
            ServiceCall::Complete(_) => self.model.is_some(),
            ServiceCall::HookSessionStart(_)
            | ServiceCall::HookToolUse(_)
            | ServiceCall::HookPrompt(_)
            | ServiceCall::HookStop(_) => self.hooks.is_some(),
            _ => false,
        }
    }

    /// `call` through the typed export; only for a call it [`serves`](Self::serves).
    pub(crate) async fn call(
        &self,
        store: &mut Store<StoreState>,
        call: &ServiceCall,
    ) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
        let no_door =
            || wasmtime::format_err!("the instance has no typed door for `{}`", call.service());
        let answered = |answer: wasmtime::Result<Result<ServiceAnswer, KernelError>>| {
            answer.map(|r| r.map_err(super::since_v0_6::provider_error))
        };
        match call {
            ServiceCall::Complete(call) => {
                let model = self.model.as_ref().ok_or_else(no_door)?;
                // The kept messages of a named conversation are decoded here, for the record;
                // an adapter that reads conversations itself gets none.
                let request = match call.to_request() {
                    Ok(request) => request_to_wit(request),
                    Err(e) => return Ok(Err(PluginError::Failed(e))),
                };
                answered(
                    model.call_complete(store, &request).await.map(|r| {
                        r.map(|r| ServiceAnswer::Completion(Box::new(response_from_wit(r))))
                    }),
                )
            }
            ServiceCall::HookSessionStart(r) => {
                let hooks = self.hooks.as_ref().ok_or_else(no_door)?;
                let request = hook_records::session_start_to_wit(r.clone());
                answered(hooks.call_session_start(store, &request).await.map(|r| {
                    r.map(|c| ServiceAnswer::HookContext(hook_records::hook_context_from_wit(c)))
                }))
            }
            ServiceCall::HookToolUse(r) => {
                let hooks = self.hooks.as_ref().ok_or_else(no_door)?;
                let call = hook_records::tool_use_to_wit(r.clone());
                answered(
                    hooks
                        .call_post_tool_use(store, &call)
                        .await
                        .map(|r| r.map(ServiceAnswer::HookAdded)),
                )
            }
            ServiceCall::HookPrompt(r) => {
                let hooks = self.hooks.as_ref().ok_or_else(no_door)?;
                let request = hook_records::prompt_to_wit(r.clone());
                answered(
                    hooks
                        .call_user_prompt_submit(store, &request)
                        .await
                        .map(|r| {
                            r.map(|v| {
                                ServiceAnswer::PromptVerdict(hook_records::prompt_verdict_from_wit(
                                    v,
                                ))
                            })
                        }),
                )
            }
            ServiceCall::HookStop(r) => {
                let hooks = self.hooks.as_ref().ok_or_else(no_door)?;
                let request = hook_records::stop_to_wit(r.clone());
                answered(hooks.call_stop(store, &request).await.map(|r| {
                    r.map(|v| ServiceAnswer::StopVerdict(hook_records::stop_verdict_from_wit(v)))
                }))
            }
            _ => Err(no_door()),
        }
    }
}
