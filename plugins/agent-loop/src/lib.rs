//! keel's agent loop as a plugin: the loop itself is `keel_agent_kit::agent_loop`; this crate
//! gives it the kernel's doors through the SDK's imports and serves the `agent` service
//! (`turn`, and `load` to seed a resumed session).

use keel_agent_kit::agent_loop::{AgentDoors, AgentLoop, DoorError, LoadRequest};
use keel_protocol::{ModelRequest, ModelResponse, ToolOutcome};
use keel_protocol::{PromptFragment, ToolCapabilities, ToolDef, ToolSpec};
use keel_protocol::{RecallRequest, RecalledEntry, SummarizeRequest, Verdict, VerifyRequest};
use keel_protocol::{TurnRequest, services};
use keel_sdk::{
    CallError, KernelError, Plugin, agent, caller, compaction, events, log, memory, prompt_context,
    services as kernel_services, session_log, state, tool_registry, tools, verifier,
};

/// The kernel's doors, through the SDK.
struct KernelDoors;

fn door_error(e: KernelError) -> DoorError {
    DoorError {
        kind: e.kind(),
        message: e.message().to_owned(),
    }
}

impl AgentDoors for KernelDoors {
    fn cancelled(&mut self) -> bool {
        agent::cancelled()
    }

    fn call(&mut self, service: &str, method: &str, payload: &str) -> Result<String, DoorError> {
        kernel_services::call(service, method, payload).map_err(door_error)
    }

    fn registered_tools(&mut self) -> Vec<ToolSpec> {
        tools::registered()
            .into_iter()
            .map(|t| ToolSpec {
                capabilities: ToolCapabilities::from_abi_bits(t.capabilities.bits()),
                name: t.name,
                description: t.description,
                input_schema: t.input_schema,
                parallel_safe: t.parallel_safe,
            })
            .collect()
    }

    fn emit(&mut self, topic: &str, payload: &str) -> Result<(), DoorError> {
        events::emit(topic, payload).map_err(door_error)
    }

    fn keeps_conversation(&self) -> bool {
        true
    }

    fn state_get(&mut self, key: &str) -> Option<Vec<u8>> {
        state::get(key)
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), DoorError> {
        state::set(key, value).map_err(door_error)
    }

    fn state_keys(&mut self) -> Vec<String> {
        state::keys()
    }

    fn state_remove(&mut self, key: &str) {
        state::remove(key);
    }

    fn warn(&mut self, message: &str) {
        log::warn(message);
    }

    // The kernel's own services, typed (ABI 0.5.0): records, not JSON text to parse.

    fn prompt_generation(&mut self) -> Result<u64, DoorError> {
        prompt_context::generation().map_err(door_error)
    }

    fn prompt_fragments(&mut self) -> Result<Vec<PromptFragment>, DoorError> {
        Ok(prompt_context::fragments()
            .map_err(door_error)?
            .into_iter()
            .map(|f| PromptFragment {
                plugin: f.plugin,
                id: f.id,
                text: f.text,
            })
            .collect())
    }

    fn fence(&mut self, source: &str, text: &str) -> Result<String, DoorError> {
        prompt_context::fence(source, text).map_err(door_error)
    }

    fn provider(&mut self, service: &str) -> Option<String> {
        caller::provider(service)
    }

    // The model and the dispatcher, typed (ABI 0.7.0): the request and the outcomes cross as
    // records, not JSON text each side encodes and parses.

    fn complete_request(&mut self, request: &ModelRequest) -> Result<ModelResponse, DoorError> {
        let request = keel_sdk_protocol::model_request_to_wit(request.clone());
        agent::complete_request(&request)
            .map(keel_sdk_protocol::model_response_from_wit)
            .map_err(door_error)
    }

    fn dispatch_outcomes(&mut self, call_ids: &[String]) -> Vec<ToolOutcome> {
        agent::dispatch_outcomes(call_ids)
            .into_iter()
            .map(keel_sdk_protocol::outcome_from_wit)
            .collect()
    }

    // The services plugins provide to each other, typed (ABI 0.6.0): the request crosses as
    // records, to the provider's typed export or, for one built against an earlier ABI, to its
    // JSON door by the kernel.

    fn recall(&mut self, request: &RecallRequest) -> Result<Vec<RecalledEntry>, DoorError> {
        let request = memory::RecallRequest {
            session: request.session.clone(),
            input: request.input.clone(),
        };
        Ok(memory::recall(&request)
            .map_err(door_error)?
            .into_iter()
            .map(|e| RecalledEntry {
                source: e.source,
                text: e.text,
            })
            .collect())
    }

    fn list_tools(&mut self) -> Result<Vec<ToolDef>, DoorError> {
        tool_registry::list()
            .map_err(door_error)?
            .into_iter()
            // The schema is the tool's own JSON text, which the registry checked.
            .map(|tool| {
                keel_sdk_protocol::tool_def_from_wit(tool).map_err(|message| DoorError {
                    kind: "failed",
                    message,
                })
            })
            .collect()
    }

    fn verify(&mut self, request: &VerifyRequest) -> Result<Option<Verdict>, DoorError> {
        let request = keel_sdk_protocol::verify_request_to_wit(request.clone());
        Ok(verifier::verify(&request)
            .map_err(door_error)?
            .map(keel_sdk_protocol::verdict_from_wit))
    }

    fn log_started(&mut self, session: &str, calls: &[String]) -> Result<(), DoorError> {
        session_log::started(session, calls)
            .map(drop)
            .map_err(door_error)
    }

    fn summarize(&mut self, request: &SummarizeRequest) -> Result<String, DoorError> {
        let request = compaction::SummarizeRequest {
            messages: request
                .messages
                .iter()
                .cloned()
                .map(keel_sdk_protocol::message_to_wit)
                .collect(),
            focus: request.focus.clone(),
            budget_chars: u64::try_from(request.budget_chars).unwrap_or(u64::MAX),
        };
        compaction::summarize(&request).map_err(door_error)
    }
}

/// `Ok` when keel itself (the kernel-attested caller) calls the `agent` service, through
/// either door: only keel runs turns, seeds a session or compacts it. A plugin that could would
/// put words in the person's mouth: a turn's input is logged as the person's message, and
/// `keel resume` replays it as theirs.
fn keel_only() -> Result<(), String> {
    let caller = caller::name();
    if caller == keel_sdk::KERNEL_NAME {
        return Ok(());
    }
    Err(format!(
        "the agent loop runs turns, loads and compacts sessions only for keel; `{caller}` may \
         not"
    ))
}

/// The plugin: the agent loop over the kernel's doors.
pub struct AgentLoopPlugin(AgentLoop<KernelDoors>);

impl Plugin for AgentLoopPlugin {
    fn activate(config: &str) -> Result<Self, String> {
        let inner = AgentLoop::new(config, KernelDoors)?;
        kernel_services::provide(services::AGENT, "1.0.0").map_err(|e| e.to_string())?;
        Ok(AgentLoopPlugin(inner))
    }

    fn handle_call_typed(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, CallError> {
        keel_only().map_err(CallError::Denied)?;
        self.handle_call(service, method, payload)
            .map_err(CallError::Failed)
    }

    fn handle_call(
        &mut self,
        _service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        match method {
            "turn" => {
                let req: TurnRequest = serde_json::from_str(payload)
                    .map_err(|e| format!("`turn` takes a TurnRequest: {e}"))?;
                let report = self.0.turn(req);
                serde_json::to_string(&report).map_err(|e| e.to_string())
            }
            "load" => {
                let req: LoadRequest = serde_json::from_str(payload)
                    .map_err(|e| format!("`load` takes {{session, messages}}: {e}"))?;
                Ok(self.0.load(req).to_string())
            }
            "compact" => {
                let req: serde_json::Value = serde_json::from_str(payload)
                    .map_err(|e| format!("`compact` takes {{session, focus}}: {e}"))?;
                let session = req["session"].as_str().ok_or("`compact` needs `session`")?;
                let done = self
                    .0
                    .compact_now(session, req["focus"].as_str().unwrap_or_default())?;
                serde_json::to_string(&done).map_err(|e| e.to_string())
            }
            other => Err(format!(
                "the agent service has no method `{other}`; it has `turn`, `load` and `compact`"
            )),
        }
    }
}

keel_sdk::export_plugin!(AgentLoopPlugin);

/// `agent` served typed (ABI 0.6.0's world `agent-service`): keel runs turns, seeds resumed
/// sessions and compacts through this export; callers of earlier versions use `handle-call`.
#[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
mod typed {
    wit_bindgen::generate!({
        path: [
            "../../wit/keel-plugin-0.2.0",
            "../../wit/keel-plugin-0.3.0",
            "../../wit/keel-plugin-0.4.0",
            "../../wit/keel-plugin-0.5.0",
            "../../wit/keel-plugin-0.6.0",
        ],
        world: "keel:plugin/agent-service@0.6.0",
        with: {
            "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
            "keel:plugin/conversation@0.5.0": keel_sdk::bindings::keel::plugin0_5_0::conversation,
        },
    });
}

use keel_sdk::bindings::keel::plugin0_2_0::types::KernelError as RawKernelError;
use typed::exports::keel::plugin0_6_0::turns;

/// A turn's report as the typed door carries it.
fn report_to_wit(report: keel_protocol::TurnReport) -> turns::TurnReport {
    use keel_protocol::TurnEnd;
    turns::TurnReport {
        end: match report.end {
            TurnEnd::Completed => turns::TurnEnd::Completed,
            TurnEnd::Interrupted => turns::TurnEnd::Interrupted,
            TurnEnd::StepLimit => turns::TurnEnd::StepLimit,
            TurnEnd::LoopGuard => turns::TurnEnd::LoopGuard,
            TurnEnd::Cancelled => turns::TurnEnd::Cancelled,
            TurnEnd::ModelError => turns::TurnEnd::ModelError,
        },
        text: report.text,
        steps: report.steps,
        tool_calls: report.tool_calls,
        usage: turns::Usage {
            input_tokens: report.usage.input_tokens,
            output_tokens: report.usage.output_tokens,
            cache_read_tokens: report.usage.cache_read_tokens,
            cache_write_tokens: report.usage.cache_write_tokens,
        },
        detail: report.detail,
    }
}

struct TypedTurns;

impl turns::Guest for TypedTurns {
    fn turn(request: turns::TurnRequest) -> Result<turns::TurnReport, RawKernelError> {
        keel_only().map_err(RawKernelError::Denied)?;
        let request = TurnRequest {
            session: request.session,
            input: request.input,
        };
        let report = keel_sdk::with_plugin(|agent: &mut AgentLoopPlugin| agent.0.turn(request))?;
        Ok(report_to_wit(report))
    }

    fn load(request: turns::LoadRequest) -> Result<u32, RawKernelError> {
        keel_only().map_err(RawKernelError::Denied)?;
        let request = LoadRequest {
            session: request.session,
            messages: request
                .messages
                .into_iter()
                .map(keel_sdk_protocol::message_from_wit)
                .collect(),
            context_window: request.context_window,
        };
        let held = keel_sdk::with_plugin(|agent: &mut AgentLoopPlugin| agent.0.load(request))?;
        Ok(u32::try_from(held).unwrap_or(u32::MAX))
    }

    fn compact(session: String, focus: String) -> Result<turns::Compacted, RawKernelError> {
        keel_only().map_err(RawKernelError::Denied)?;
        let done = keel_sdk::with_plugin(|agent: &mut AgentLoopPlugin| {
            agent.0.compact_now(&session, &focus)
        })?
        .map_err(RawKernelError::Failed)?;
        Ok(turns::Compacted {
            replaced: done.replaced,
            tokens_before: done.tokens_before,
            tokens_after: done.tokens_after,
        })
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedTurns with_types_in typed);
};
