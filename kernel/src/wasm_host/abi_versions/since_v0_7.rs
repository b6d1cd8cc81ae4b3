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
//! records of `model-types` are shared by both sides' bindings, so one conversion serves
//! them.

use keel_protocol as protocol;
use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre, Resource};

use super::since_v0_2::keel::plugin::types::KernelError;
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

/// A model adapter's side: the `model` export, its records those of the import side.
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

            world model-exports {
                export keel:plugin/model@0.7.0;
            }
        ",
        world: "keel:host/model-exports",
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

use super::since_v0_6::keel::plugin0_6_0::{tool_registry, turns, verifier_types};
use keel::plugin0_7_0::{agent, http, model, model_types, processes};
use provider_exports::exports::keel::plugin0_7_0::model as model_export;

/// The export of a plugin that provides `model` through its typed door.
pub(crate) const MODEL_EXPORT: &str = "keel:plugin/model@0.7.0";

/// A request as a 0.7.0 caller sent it, in the kernel's vocabulary. A tool's input schema is
/// the tool's own JSON text; one that does not parse is refused, naming the tool.
fn request_from_wit(request: model_types::ModelRequest) -> Result<protocol::ModelRequest, String> {
    let mut tools = Vec::with_capacity(request.tools.len());
    for tool in request.tools {
        let input_schema = serde_json::from_str(&tool.input_schema)
            .map_err(|e| format!("the input schema of tool `{}` is not JSON: {e}", tool.name))?;
        tools.push(protocol::ToolDef {
            name: tool.name,
            description: tool.description,
            input_schema,
        });
    }
    Ok(protocol::ModelRequest {
        model: request.model,
        system: request.system,
        messages: request.messages.into_iter().map(Into::into).collect(),
        tools,
        max_tokens: request.max_tokens,
        compacts_on_overflow: request.compacts_on_overflow,
        conversation: request.conversation.map(|c| protocol::ConversationRef {
            session: c.session,
            messages: c.messages as usize,
            held: c.held.map(|h| protocol::HeldConversation {
                keeper: h.keeper,
                revision: h.revision,
            }),
        }),
    })
}

/// A request as an adapter's typed export gets it.
fn request_to_wit(request: protocol::ModelRequest) -> model_types::ModelRequest {
    model_types::ModelRequest {
        model: request.model,
        system: request.system,
        messages: request.messages.into_iter().map(Into::into).collect(),
        tools: request
            .tools
            .into_iter()
            .map(|t| tool_registry::ToolDef {
                input_schema: t.input_schema.to_string(),
                name: t.name,
                description: t.description,
            })
            .collect(),
        max_tokens: request.max_tokens,
        compacts_on_overflow: request.compacts_on_overflow,
        conversation: request.conversation.map(|c| model_types::ConversationRef {
            session: c.session,
            messages: u32::try_from(c.messages).unwrap_or(u32::MAX),
            held: c.held.map(|h| model_types::HeldConversation {
                keeper: h.keeper,
                revision: h.revision,
            }),
        }),
    }
}

fn stop_reason_from_wit(reason: model_types::StopReason) -> protocol::StopReason {
    use model_types::StopReason;
    match reason {
        StopReason::EndTurn => protocol::StopReason::EndTurn,
        StopReason::ToolUse => protocol::StopReason::ToolUse,
        StopReason::MaxTokens => protocol::StopReason::MaxTokens,
        StopReason::StopSequence => protocol::StopReason::StopSequence,
        StopReason::Refusal => protocol::StopReason::Refusal,
        StopReason::Interrupted => protocol::StopReason::Interrupted,
    }
}

fn stop_reason_to_wit(reason: protocol::StopReason) -> model_types::StopReason {
    use model_types::StopReason;
    match reason {
        protocol::StopReason::EndTurn => StopReason::EndTurn,
        protocol::StopReason::ToolUse => StopReason::ToolUse,
        protocol::StopReason::MaxTokens => StopReason::MaxTokens,
        protocol::StopReason::StopSequence => StopReason::StopSequence,
        protocol::StopReason::Refusal => StopReason::Refusal,
        protocol::StopReason::Interrupted => StopReason::Interrupted,
    }
}

/// The response an adapter's typed export answered, in the kernel's vocabulary.
fn response_from_wit(response: model_types::ModelResponse) -> protocol::ModelResponse {
    protocol::ModelResponse {
        message: response.message.into(),
        stop_reason: stop_reason_from_wit(response.stop_reason),
        stop_reason_raw: response.stop_reason_raw,
        usage: protocol::Usage {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
            cache_read_tokens: response.usage.cache_read_tokens,
            cache_write_tokens: response.usage.cache_write_tokens,
        },
        model: response.model,
        retries: response.retries,
    }
}

/// The response as a 0.7.0 caller reads it.
fn response_to_wit(response: protocol::ModelResponse) -> model_types::ModelResponse {
    model_types::ModelResponse {
        message: response.message.into(),
        stop_reason: stop_reason_to_wit(response.stop_reason),
        stop_reason_raw: response.stop_reason_raw,
        usage: turns::Usage {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
            cache_read_tokens: response.usage.cache_read_tokens,
            cache_write_tokens: response.usage.cache_write_tokens,
        },
        model: response.model,
        retries: response.retries,
    }
}

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
            .map(Into::into)
            .collect()
    }

    async fn replay(
        &mut self,
        call_id: String,
    ) -> Result<verifier_types::ToolOutcome, KernelError> {
        let _host = self.meter.host_call();
        Ok(self.host.agent_replay_typed(&call_id).await?.into())
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
    async fn send(
        &mut self,
        req: super::since_v0_2::keel::plugin::http::Request,
    ) -> Result<
        (
            super::since_v0_2::keel::plugin::http::ResponseHead,
            Resource<http::Body>,
        ),
        KernelError,
    > {
        // 0.2.0's door, whose body handle becomes the resource's representation.
        let (id, head) = super::since_v0_2::keel::plugin::http::Host::send(self, req).await?;
        Ok((head, Resource::new_own(id)))
    }
}

impl http::HostBody for StoreState {
    async fn next_chunk(
        &mut self,
        body: Resource<http::Body>,
        idle_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let _host = self.meter.host_call();
        self.host
            .http_next_chunk(
                body.rep(),
                std::time::Duration::from_millis(u64::from(idle_ms)),
            )
            .await
            .map_err(Into::into)
    }

    async fn drop(&mut self, body: Resource<http::Body>) -> wasmtime::Result<()> {
        self.host.http_close(body.rep());
        Ok(())
    }
}

impl processes::Host for StoreState {
    async fn entries(&mut self) -> Vec<String> {
        let _host = self.meter.host_call();
        self.host.process_entries()
    }

    async fn start(&mut self, entry: String) -> Result<Resource<processes::Process>, KernelError> {
        let _host = self.meter.host_call();
        let id = self.host.process_start(&entry)?;
        Ok(Resource::new_own(id))
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
        let _host = self.meter.host_call();
        self.host
            .process_write(
                process.rep(),
                &bytes,
                std::time::Duration::from_millis(timeout_ms.into()),
            )
            .await
            .map_err(Into::into)
    }

    async fn read(
        &mut self,
        process: Resource<processes::Process>,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let _host = self.meter.host_call();
        self.host
            .process_read(
                process.rep(),
                max_bytes as usize,
                std::time::Duration::from_millis(timeout_ms.into()),
            )
            .await
            .map_err(Into::into)
    }

    async fn status(
        &mut self,
        process: Resource<processes::Process>,
    ) -> Result<super::since_v0_3::keel::plugin0_3_0::processes::ProcessStatus, KernelError> {
        super::since_v0_3::keel::plugin0_3_0::processes::Host::status(self, process.rep()).await
    }

    async fn drop(&mut self, process: Resource<processes::Process>) -> wasmtime::Result<()> {
        // The program lives as long as its handle.
        self.host.process_kill(process.rep());
        Ok(())
    }
}

/// Where a component's `model` export is, found when it is linked.
#[derive(Default)]
pub(crate) struct ModelIndices(Option<model_export::GuestIndices>);

impl ModelIndices {
    /// The `model` export `report` lists among the component's exports, if any.
    pub(crate) fn new(
        pre: &InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<ModelIndices> {
        Ok(ModelIndices(
            report
                .exports
                .iter()
                .any(|e| e == MODEL_EXPORT)
                .then(|| model_export::GuestIndices::new(pre))
                .transpose()?,
        ))
    }

    /// The export of `instance`, type-checked against this package's WIT: one of another
    /// shape fails the instance, naming the export.
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<ModelExports> {
        let export = self
            .0
            .as_ref()
            .map(|i| i.load(&mut *store, instance))
            .transpose()
            .map_err(|e| {
                e.context(format!(
                    "its export `{MODEL_EXPORT}` does not have the functions and types of \
                     keel's WIT for it; rebuild the plugin against this keel's WIT"
                ))
            })?;
        Ok(ModelExports(export))
    }
}

/// The `model` export of an instance, when it has one.
pub(crate) struct ModelExports(Option<model_export::Guest>);

impl ModelExports {
    /// Whether the instance serves `call` through its typed `model` door.
    pub(crate) fn serves(&self, call: &ServiceCall) -> bool {
        matches!(call, ServiceCall::Complete(_)) && self.0.is_some()
    }

    /// `call` through the typed export; only for a call it [`serves`](Self::serves).
    pub(crate) async fn call(
        &self,
        store: &mut Store<StoreState>,
        call: &ServiceCall,
    ) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
        let (Some(model), ServiceCall::Complete(call)) = (&self.0, call) else {
            return Err(wasmtime::format_err!(
                "the instance has no typed door for `{}`",
                call.service()
            ));
        };
        // The kept messages of a named conversation are decoded here, for the record; an
        // adapter that reads conversations itself gets none.
        let request = match call.to_request() {
            Ok(request) => request_to_wit(request),
            Err(e) => return Ok(Err(PluginError::Failed(e))),
        };
        Ok(model
            .call_complete(store, &request)
            .await?
            .map(|r| ServiceAnswer::Completion(Box::new(response_from_wit(r))))
            .map_err(super::since_v0_6::provider_error))
    }
}
