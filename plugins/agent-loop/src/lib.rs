//! keel's agent loop as a plugin: the loop itself is `keel_agent_kit::agent_loop`; this crate
//! gives it the kernel's doors through the SDK's imports and serves the `agent` service
//! (`turn`, and `load` to seed a resumed session).

use keel_agent_kit::agent_loop::{AgentDoors, AgentLoop, DoorError, LoadRequest};
use keel_protocol::{Block, Message, RecallRequest, RecalledEntry, Role, SummarizeRequest};
use keel_protocol::{PromptFragment, ToolCapabilities, ToolDef, ToolSpec};
use keel_protocol::{TurnRequest, services};
use keel_sdk::{
    KernelError, Plugin, agent, caller, compaction, conversation, events, log, memory,
    prompt_context, services as kernel_services, state, tool_registry, tools,
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
    fn complete(&mut self, request: &str) -> Result<String, DoorError> {
        agent::complete(request).map_err(door_error)
    }

    fn dispatch(&mut self, call_ids: &[String]) -> Vec<String> {
        agent::dispatch(call_ids)
    }

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
            .map(|tool| {
                // The schema is the tool's own JSON text, which the registry checked.
                let input_schema =
                    serde_json::from_str(&tool.input_schema).map_err(|e| DoorError {
                        kind: "failed",
                        message: format!(
                            "the input schema of tool `{}` is not JSON: {e}",
                            tool.name
                        ),
                    })?;
                Ok(ToolDef {
                    name: tool.name,
                    description: tool.description,
                    input_schema,
                })
            })
            .collect()
    }

    fn summarize(&mut self, request: &SummarizeRequest) -> Result<String, DoorError> {
        let request = compaction::SummarizeRequest {
            messages: request.messages.iter().map(to_wit).collect(),
            focus: request.focus.clone(),
            budget_chars: u64::try_from(request.budget_chars).unwrap_or(u64::MAX),
        };
        compaction::summarize(&request).map_err(door_error)
    }
}

/// A message of the loop's conversation as the typed doors carry it.
fn to_wit(message: &Message) -> conversation::Message {
    conversation::Message {
        role: match message.role {
            Role::User => conversation::Role::User,
            Role::Assistant => conversation::Role::Assistant,
        },
        content: message
            .content
            .iter()
            .map(|block| match block {
                Block::Text { text } => conversation::Block::Text(text.clone()),
                Block::Thinking { text } => conversation::Block::Thinking(text.clone()),
                Block::ToolCall {
                    id,
                    name,
                    arguments,
                } => conversation::Block::ToolCall(conversation::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                Block::ToolResult {
                    call_id,
                    content,
                    is_error,
                } => conversation::Block::ToolResult(conversation::ToolResult {
                    call_id: call_id.clone(),
                    content: content.clone(),
                    is_error: *is_error,
                }),
            })
            .collect(),
    }
}

/// The plugin: the agent loop over the kernel's doors.
pub struct AgentLoopPlugin(AgentLoop<KernelDoors>);

impl Plugin for AgentLoopPlugin {
    fn activate(config: &str) -> Result<Self, String> {
        let inner = AgentLoop::new(config, KernelDoors)?;
        kernel_services::provide(services::AGENT, "1.0.0").map_err(|e| e.to_string())?;
        Ok(AgentLoopPlugin(inner))
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
                self.0
                    .compact_now(session, req["focus"].as_str().unwrap_or_default())
            }
            other => Err(format!(
                "the agent service has no method `{other}`; it has `turn`, `load` and `compact`"
            )),
        }
    }
}

keel_sdk::export_plugin!(AgentLoopPlugin);
