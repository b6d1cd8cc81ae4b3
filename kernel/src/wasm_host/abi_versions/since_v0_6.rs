//! ABI 0.6.0: the services plugins provide, typed (`memory`, `compaction`, `tool-registry`,
//! `turns` for the `agent` service, and `verifier`), and the kernel's `keel.editor` as
//! `editor`, whose host side calls the same core as its JSON door.
//!
//! Both sides of a typed service call are here: the host side of the import a caller uses,
//! which routes the call through the kernel
//! ([`HostHandle::call_typed`](crate::HostHandle::call_typed)), and the provider's export the
//! kernel calls ([`ServiceExports`]). The kernel routes the call in `keel_protocol`'s types
//! ([`ServiceCall`]); this module only converts between them and each side's WIT records.
//! Both sides are type-checked: the caller's import when the component is linked, against the
//! host functions bound here; the provider's export when it is instantiated
//! ([`ServiceIndices::load`]), which a load does before the plugin activates. A component built
//! against other types for these names does not load.

use keel_protocol as protocol;
use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre};

use super::conversions;
use super::since_v0_2::keel::plugin::types::KernelError;
use crate::instance::PluginError;
use crate::typed_services::{ServiceAnswer, ServiceCall};
use crate::wasm_host::abi::ComponentReport;
use crate::wasm_host::store::StoreState;

wasmtime::component::bindgen!({
    path: [
        "../wit/keel-plugin-0.2.0",
        "../wit/keel-plugin-0.3.0",
        "../wit/keel-plugin-0.4.0",
        "../wit/keel-plugin-0.5.0",
        "../wit/keel-plugin-0.6.0",
    ],
    world: "keel:plugin/keel-plugin@0.6.0",
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
    },
});

/// The providers' side: every typed service a provider may export (each provider's component
/// exports its one, in its own `*-service` world), bound once for their export indices.
mod provider_exports {
    wasmtime::component::bindgen!({
        path: [
            "../wit/keel-plugin-0.2.0",
            "../wit/keel-plugin-0.3.0",
            "../wit/keel-plugin-0.4.0",
            "../wit/keel-plugin-0.5.0",
            "../wit/keel-plugin-0.6.0",
        ],
        inline: "
            package keel:host;

            world provider-exports {
                export keel:plugin/memory@0.6.0;
                export keel:plugin/compaction@0.6.0;
                export keel:plugin/tool-registry@0.6.0;
                export keel:plugin/turns@0.6.0;
                export keel:plugin/verifier@0.6.0;
            }
        ",
        world: "keel:host/provider-exports",
        exports: { default: async },
        with: {
            "keel:plugin/types@0.2.0": crate::wasm_host::abi_versions::since_v0_2::keel::plugin::types,
            "keel:plugin/conversation@0.5.0": crate::wasm_host::abi_versions::since_v0_5::keel::plugin0_5_0::conversation,
            "keel:plugin/verifier-types@0.6.0": crate::wasm_host::abi_versions::since_v0_6::keel::plugin0_6_0::verifier_types,
        },
    });
}

use keel::plugin0_6_0::{compaction, editor, memory, tool_registry, turns, verifier};
use provider_exports::exports::keel::plugin0_6_0::{
    compaction as compaction_export, memory as memory_export, tool_registry as registry_export,
    turns as turns_export, verifier as verifier_export,
};

/// The export of a plugin that provides `memory` through its typed door.
pub(crate) const MEMORY_EXPORT: &str = "keel:plugin/memory@0.6.0";
/// The export of a plugin that provides `compaction` through its typed door.
pub(crate) const COMPACTION_EXPORT: &str = "keel:plugin/compaction@0.6.0";
/// The export of a plugin that provides `tool-registry` through its typed door.
pub(crate) const TOOL_REGISTRY_EXPORT: &str = "keel:plugin/tool-registry@0.6.0";
/// The export of a plugin that provides `agent` through its typed door.
pub(crate) const TURNS_EXPORT: &str = "keel:plugin/turns@0.6.0";
/// The export of a plugin that provides `verifier` through its typed door.
pub(crate) const VERIFIER_EXPORT: &str = "keel:plugin/verifier@0.6.0";

/// A typed call's answer of the wrong kind: the kernel routes each call to the one export that
/// answers it, so this is a kernel bug, said as one rather than a panic.
fn mismatched(call: &str) -> KernelError {
    KernelError::Failed(format!(
        "keel routed a typed `{call}` call and got another method's answer; please report this"
    ))
}

impl memory::Host for StoreState {
    async fn recall(
        &mut self,
        request: memory::RecallRequest,
    ) -> Result<Vec<memory::RecalledEntry>, KernelError> {
        // May wait for another plugin: the meter stays paused across the await.
        let _host = self.meter.host_call();
        let call = ServiceCall::Recall(protocol::RecallRequest {
            session: request.session,
            input: request.input,
        });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Recalled(entries) => Ok(entries
                .into_iter()
                .map(|e| memory::RecalledEntry {
                    source: e.source,
                    text: e.text,
                })
                .collect()),
            _ => Err(mismatched("memory.recall")),
        }
    }
}

impl compaction::Host for StoreState {
    async fn summarize(
        &mut self,
        request: compaction::SummarizeRequest,
    ) -> Result<String, KernelError> {
        let _host = self.meter.host_call();
        let call = ServiceCall::Summarize(protocol::SummarizeRequest {
            messages: request
                .messages
                .into_iter()
                .map(conversions::message_from_wit)
                .collect(),
            focus: request.focus,
            budget_chars: usize::try_from(request.budget_chars).unwrap_or(usize::MAX),
        });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Summary(text) => Ok(text),
            _ => Err(mismatched("compaction.summarize")),
        }
    }
}

impl tool_registry::Host for StoreState {
    async fn list(&mut self) -> Result<Vec<tool_registry::ToolDef>, KernelError> {
        let _host = self.meter.host_call();
        match self.host.call_typed(&ServiceCall::ListTools).await? {
            ServiceAnswer::Tools(tools) => Ok(tools
                .into_iter()
                .map(|t| tool_registry::ToolDef {
                    input_schema: t.input_schema.to_string(),
                    name: t.name,
                    description: t.description,
                })
                .collect()),
            _ => Err(mismatched("tool-registry.list")),
        }
    }

    async fn resolve(&mut self, name: String) -> Result<tool_registry::Resolution, KernelError> {
        use tool_registry::{DisabledTool, Resolution};
        let _host = self.meter.host_call();
        let call = ServiceCall::ResolveTool(protocol::ResolveRequest { name });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Resolution(resolution) => Ok(match resolution {
                protocol::Resolution::Found { name } => Resolution::Found(name),
                protocol::Resolution::Unknown { did_you_mean } => Resolution::Unknown(did_you_mean),
                protocol::Resolution::Disabled { name, reason } => {
                    Resolution::Disabled(DisabledTool { name, reason })
                }
            }),
            _ => Err(mismatched("tool-registry.resolve")),
        }
    }
}

impl verifier::Host for StoreState {
    async fn verify(
        &mut self,
        request: verifier::VerifyRequest,
    ) -> Result<Option<verifier::Verdict>, KernelError> {
        let _host = self.meter.host_call();
        match self
            .host
            .call_typed(&ServiceCall::Verify(conversions::verify_request_from_wit(
                request,
            )))
            .await?
        {
            ServiceAnswer::Verdict(verdict) => Ok(verdict.map(conversions::verdict_to_wit)),
            _ => Err(mismatched("verifier.verify")),
        }
    }
}

impl editor::Host for StoreState {
    async fn read(&mut self, path: String) -> Result<Option<String>, KernelError> {
        // The editor may take its time to answer: the meter stays paused.
        let _host = self.meter.host_call();
        self.host.editor_read(&path).await.map_err(Into::into)
    }
}

/// A turn's report as a 0.6.0 caller reads it.
fn report_to_import(report: protocol::TurnReport) -> turns::TurnReport {
    turns::TurnReport {
        end: conversions::turn_end_to_wit(report.end),
        text: report.text,
        steps: report.steps,
        tool_calls: report.tool_calls,
        usage: conversions::usage_to_wit(report.usage),
        detail: report.detail,
    }
}

impl turns::Host for StoreState {
    async fn turn(
        &mut self,
        request: turns::TurnRequest,
    ) -> Result<turns::TurnReport, KernelError> {
        let _host = self.meter.host_call();
        let call = ServiceCall::Turn(protocol::TurnRequest {
            session: request.session,
            input: request.input,
        });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::TurnReport(report) => Ok(report_to_import(report)),
            _ => Err(mismatched("turns.turn")),
        }
    }

    async fn load(&mut self, request: turns::LoadRequest) -> Result<u32, KernelError> {
        let _host = self.meter.host_call();
        let call = ServiceCall::LoadConversation(protocol::LoadRequest {
            session: request.session,
            messages: request
                .messages
                .into_iter()
                .map(conversions::message_from_wit)
                .collect(),
            context_window: request.context_window,
        });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Loaded(n) => Ok(n),
            _ => Err(mismatched("turns.load")),
        }
    }

    async fn compact(
        &mut self,
        session: String,
        focus: String,
    ) -> Result<turns::Compacted, KernelError> {
        let _host = self.meter.host_call();
        let call = ServiceCall::Compact(protocol::CompactRequest { session, focus });
        match self.host.call_typed(&call).await? {
            ServiceAnswer::Compacted(done) => Ok(turns::Compacted {
                replaced: done.replaced,
                tokens_before: done.tokens_before,
                tokens_after: done.tokens_after,
            }),
            _ => Err(mismatched("turns.compact")),
        }
    }
}

/// A turn's report as the provider's export answered it, in the kernel's vocabulary.
fn report_from_export(report: turns_export::TurnReport) -> protocol::TurnReport {
    use turns_export::TurnEnd;
    protocol::TurnReport {
        end: match report.end {
            TurnEnd::Completed => protocol::TurnEnd::Completed,
            TurnEnd::Interrupted => protocol::TurnEnd::Interrupted,
            TurnEnd::StepLimit => protocol::TurnEnd::StepLimit,
            TurnEnd::LoopGuard => protocol::TurnEnd::LoopGuard,
            TurnEnd::Cancelled => protocol::TurnEnd::Cancelled,
            TurnEnd::ModelError => protocol::TurnEnd::ModelError,
        },
        text: report.text,
        steps: report.steps,
        tool_calls: report.tool_calls,
        usage: protocol::Usage {
            input_tokens: report.usage.input_tokens,
            output_tokens: report.usage.output_tokens,
            cache_read_tokens: report.usage.cache_read_tokens,
            cache_write_tokens: report.usage.cache_write_tokens,
        },
        detail: report.detail,
    }
}

/// Where each typed service a component exports is, found when it is linked.
#[derive(Default)]
pub(crate) struct ServiceIndices {
    memory: Option<memory_export::GuestIndices>,
    compaction: Option<compaction_export::GuestIndices>,
    tool_registry: Option<registry_export::GuestIndices>,
    turns: Option<turns_export::GuestIndices>,
    verifier: Option<verifier_export::GuestIndices>,
}

impl ServiceIndices {
    /// The typed services `report` lists among the component's exports.
    pub(crate) fn new(
        pre: &InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<ServiceIndices> {
        let exports = |name: &str| report.exports.iter().any(|e| e == name);
        Ok(ServiceIndices {
            memory: exports(MEMORY_EXPORT)
                .then(|| memory_export::GuestIndices::new(pre))
                .transpose()?,
            compaction: exports(COMPACTION_EXPORT)
                .then(|| compaction_export::GuestIndices::new(pre))
                .transpose()?,
            tool_registry: exports(TOOL_REGISTRY_EXPORT)
                .then(|| registry_export::GuestIndices::new(pre))
                .transpose()?,
            turns: exports(TURNS_EXPORT)
                .then(|| turns_export::GuestIndices::new(pre))
                .transpose()?,
            verifier: exports(VERIFIER_EXPORT)
                .then(|| verifier_export::GuestIndices::new(pre))
                .transpose()?,
        })
    }

    /// The exports of `instance`, each type-checked against this package's WIT: one of
    /// another shape fails the instance, naming the export.
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<ServiceExports> {
        let shape = super::wrong_shape;
        // The index of a service's export, loaded from the instance when the component has it.
        macro_rules! load {
            ($index:expr, $export:expr) => {
                $index
                    .as_ref()
                    .map(|i| i.load(&mut *store, instance))
                    .transpose()
                    .map_err(|e| e.context(shape($export)))?
            };
        }
        Ok(ServiceExports {
            memory: load!(self.memory, MEMORY_EXPORT),
            compaction: load!(self.compaction, COMPACTION_EXPORT),
            tool_registry: load!(self.tool_registry, TOOL_REGISTRY_EXPORT),
            turns: load!(self.turns, TURNS_EXPORT),
            verifier: load!(self.verifier, VERIFIER_EXPORT),
        })
    }
}

/// The typed services an instance exports.
pub(crate) struct ServiceExports {
    memory: Option<memory_export::Guest>,
    compaction: Option<compaction_export::Guest>,
    tool_registry: Option<registry_export::Guest>,
    turns: Option<turns_export::Guest>,
    verifier: Option<verifier_export::Guest>,
}

/// What a provider's typed export answered with, in the kernel's vocabulary.
fn answered<T>(
    answer: wasmtime::Result<Result<T, KernelError>>,
    into: impl FnOnce(T) -> ServiceAnswer,
) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
    answer.map(|r| r.map(into).map_err(provider_error))
}

/// A provider's `kernel-error`, as the kernel reads what a plugin answered: the same kind
/// reaches the caller.
pub(super) fn provider_error(e: KernelError) -> PluginError {
    match e {
        KernelError::Invalid(m) => PluginError::InvalidInput(m),
        KernelError::Denied(m) => PluginError::Denied(m),
        KernelError::Unavailable(m) => PluginError::Unavailable(m),
        KernelError::Conflict(m) | KernelError::Failed(m) | KernelError::TimedOut(m) => {
            PluginError::Failed(m)
        }
    }
}

impl ServiceExports {
    /// Whether the instance serves `call` through its typed door.
    pub(crate) fn serves(&self, call: &ServiceCall) -> bool {
        match call {
            ServiceCall::Recall(_) => self.memory.is_some(),
            ServiceCall::Summarize(_) => self.compaction.is_some(),
            ServiceCall::ListTools | ServiceCall::ResolveTool(_) => self.tool_registry.is_some(),
            ServiceCall::Turn(_) | ServiceCall::LoadConversation(_) | ServiceCall::Compact(_) => {
                self.turns.is_some()
            }
            ServiceCall::Verify(_) => self.verifier.is_some(),
            // Later versions', served by `since_v0_7` and `since_v0_8`.
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
        match call {
            ServiceCall::Recall(request) => {
                let memory = self.memory.as_ref().ok_or_else(no_door)?;
                let request = memory_export::RecallRequest {
                    session: request.session.clone(),
                    input: request.input.clone(),
                };
                answered(memory.call_recall(store, &request).await, |entries| {
                    ServiceAnswer::Recalled(
                        entries
                            .into_iter()
                            .map(|e| protocol::RecalledEntry {
                                source: e.source,
                                text: e.text,
                            })
                            .collect(),
                    )
                })
            }
            ServiceCall::Summarize(request) => {
                let compaction = self.compaction.as_ref().ok_or_else(no_door)?;
                let request = compaction_export::SummarizeRequest {
                    messages: request
                        .messages
                        .iter()
                        .cloned()
                        .map(conversions::message_to_wit)
                        .collect(),
                    focus: request.focus.clone(),
                    budget_chars: u64::try_from(request.budget_chars).unwrap_or(u64::MAX),
                };
                answered(
                    compaction.call_summarize(store, &request).await,
                    ServiceAnswer::Summary,
                )
            }
            ServiceCall::ListTools => {
                let registry = self.tool_registry.as_ref().ok_or_else(no_door)?;
                let tools = match registry.call_list(store).await? {
                    Ok(tools) => tools,
                    Err(e) => return Ok(Err(provider_error(e))),
                };
                let mut defs = Vec::with_capacity(tools.len());
                for tool in tools {
                    // The schema is the tool's own JSON text; one that does not parse is the
                    // provider's failure, said with the tool's name.
                    let schema = match serde_json::from_str(&tool.input_schema) {
                        Ok(schema) => schema,
                        Err(e) => {
                            return Ok(Err(PluginError::Failed(format!(
                                "the input schema of tool `{}` is not JSON: {e}",
                                tool.name
                            ))));
                        }
                    };
                    defs.push(protocol::ToolDef {
                        name: tool.name,
                        description: tool.description,
                        input_schema: schema,
                    });
                }
                Ok(Ok(ServiceAnswer::Tools(defs)))
            }
            ServiceCall::ResolveTool(request) => {
                use registry_export::Resolution;
                let registry = self.tool_registry.as_ref().ok_or_else(no_door)?;
                answered(
                    registry.call_resolve(store, &request.name).await,
                    |resolution| {
                        ServiceAnswer::Resolution(match resolution {
                            Resolution::Found(name) => protocol::Resolution::Found { name },
                            Resolution::Unknown(did_you_mean) => {
                                protocol::Resolution::Unknown { did_you_mean }
                            }
                            Resolution::Disabled(d) => protocol::Resolution::Disabled {
                                name: d.name,
                                reason: d.reason,
                            },
                        })
                    },
                )
            }
            ServiceCall::Turn(request) => {
                let turns = self.turns.as_ref().ok_or_else(no_door)?;
                let request = turns_export::TurnRequest {
                    session: request.session.clone(),
                    input: request.input.clone(),
                };
                answered(turns.call_turn(store, &request).await, |report| {
                    ServiceAnswer::TurnReport(report_from_export(report))
                })
            }
            ServiceCall::LoadConversation(request) => {
                let turns = self.turns.as_ref().ok_or_else(no_door)?;
                let request = turns_export::LoadRequest {
                    session: request.session.clone(),
                    messages: request
                        .messages
                        .iter()
                        .cloned()
                        .map(conversions::message_to_wit)
                        .collect(),
                    context_window: request.context_window,
                };
                answered(
                    turns.call_load(store, &request).await,
                    ServiceAnswer::Loaded,
                )
            }
            ServiceCall::Compact(request) => {
                let turns = self.turns.as_ref().ok_or_else(no_door)?;
                answered(
                    turns
                        .call_compact(store, &request.session, &request.focus)
                        .await,
                    |done| {
                        ServiceAnswer::Compacted(protocol::Compacted {
                            replaced: done.replaced,
                            tokens_before: done.tokens_before,
                            tokens_after: done.tokens_after,
                        })
                    },
                )
            }
            ServiceCall::Verify(request) => {
                let verifier = self.verifier.as_ref().ok_or_else(no_door)?;
                let request = conversions::verify_request_to_wit(request.clone());
                answered(verifier.call_verify(store, &request).await, |verdict| {
                    ServiceAnswer::Verdict(verdict.map(conversions::verdict_from_wit))
                })
            }
            _ => Err(no_door()),
        }
    }
}
