//! keel plugin `subagents`: the `task` tool. Each call opens a child agent in the kernel
//! (`keel.agents` `open`, for exactly this tool call) and runs the agent loop of
//! `keel_agent_kit::agent_loop` for it: its own conversation and step limit, the tools the
//! kernel gave it (read-only unless the person's `[subagents] allow` names more, never more
//! than its parent's), its model requests and tool calls through the kernel as the child.
//! The child's final answer is the tool's result; its entries go to the session log under
//! the `task` call (`subagent.event`). The plugin asks for several instances, so the calls of
//! one model response run their children side by side.

use std::collections::BTreeSet;

use keel_agent_kit::agent_loop::{
    AgentDoors, AgentLoop, DoorError, outcomes_from_json, response_from_json,
};
use keel_protocol::{
    ChildScope, ModelRequest, ModelResponse, OpenChild, SessionEvent, SubagentEvent, ToolDef,
    ToolOutcome, TurnEnd, TurnRequest, services, topics,
};
use keel_sdk::{
    KernelError, Plugin, ToolCapabilities, ToolSpec, agent, events, log,
    services as kernel_services, tools,
};
use serde::Deserialize;

const TASK_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "description": {"type": "string", "description": "A short name for the sub-task (3-5 words), shown to the person"},
    "prompt": {"type": "string", "description": "The whole sub-task: what to find or do and what to report back. The subagent sees nothing of this conversation but this text."},
    "tools": {"type": "array", "items": {"type": "string"}, "description": "The tools the subagent needs; leave out for every read-only tool. Tools that write, run commands or reach the network are given only if the person allowed them for subagents."}
  },
  "required": ["description", "prompt"],
  "additionalProperties": false
}"#;

/// The `task` tool's input.
#[derive(Deserialize)]
struct TaskInput {
    description: String,
    prompt: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
}

/// The plugin's `[config]`: the child loop's settings.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Config {
    max_steps: u32,
    max_tokens: u32,
    system: String,
}

/// The kernel's doors for one child: the agent doors act as the child the kernel opened for
/// this call; services are the prompt's and the tool registry's only (a child does not
/// recall memory, compact or verify); its conversation lives only as long as the call; its
/// log entries are filed under the parent's call.
struct ChildDoors {
    scope: ChildScope,
    tools: BTreeSet<String>,
}

fn door_error(e: KernelError) -> DoorError {
    DoorError {
        kind: e.kind(),
        message: e.message().to_owned(),
    }
}

impl AgentDoors for ChildDoors {
    // The child's model calls and dispatches go through 0.2.0's JSON door: this plugin is a
    // 0.4.0 component, loadable by every keel that has `keel.agents`' JSON door.
    fn complete_request(&mut self, request: &ModelRequest) -> Result<ModelResponse, DoorError> {
        let request = serde_json::to_string(request).map_err(|e| DoorError {
            kind: "invalid",
            message: e.to_string(),
        })?;
        response_from_json(&agent::complete(&request).map_err(door_error)?)
    }

    fn dispatch_outcomes(&mut self, call_ids: &[String]) -> Vec<ToolOutcome> {
        outcomes_from_json(call_ids, agent::dispatch(call_ids))
    }

    fn cancelled(&mut self) -> bool {
        agent::cancelled()
    }

    fn call(&mut self, service: &str, method: &str, payload: &str) -> Result<String, DoorError> {
        if service == services::PROMPT {
            return kernel_services::call(service, method, payload).map_err(door_error);
        }
        if service == services::TOOL_REGISTRY && method == "list" {
            let listed = kernel_services::call(service, method, payload).map_err(door_error)?;
            let defs: Vec<ToolDef> = serde_json::from_str(&listed).map_err(|e| DoorError {
                kind: "failed",
                message: format!("the tool registry's list is malformed: {e}"),
            })?;
            let mine: Vec<ToolDef> = defs
                .into_iter()
                .filter(|d| self.tools.contains(&d.name))
                .collect();
            return serde_json::to_string(&mine).map_err(|e| DoorError {
                kind: "failed",
                message: e.to_string(),
            });
        }
        Err(DoorError {
            kind: "unavailable",
            message: format!("a subagent does not use `{service}`"),
        })
    }

    fn registered_tools(&mut self) -> Vec<keel_protocol::ToolSpec> {
        tools::registered()
            .into_iter()
            .filter(|t| self.tools.contains(&t.name))
            .map(|t| keel_protocol::ToolSpec {
                capabilities: keel_protocol::ToolCapabilities::from_abi_bits(t.capabilities.bits()),
                name: t.name,
                description: t.description,
                input_schema: t.input_schema,
                parallel_safe: t.parallel_safe,
            })
            .collect()
    }

    fn emit(&mut self, topic: &str, payload: &str) -> Result<(), DoorError> {
        if topic != topics::SESSION_EVENT {
            return Ok(());
        }
        let event: SessionEvent = serde_json::from_str(payload).map_err(|e| DoorError {
            kind: "invalid",
            message: e.to_string(),
        })?;
        let entry = SubagentEvent {
            parent_call: self.scope.parent_call.clone(),
            child: self.scope.child,
            label: self.scope.label.clone(),
            event,
        };
        let json = serde_json::to_string(&entry).map_err(|e| DoorError {
            kind: "invalid",
            message: e.to_string(),
        })?;
        events::emit(topics::SUBAGENT_EVENT, &json).map_err(door_error)
    }

    fn state_get(&mut self, _key: &str) -> Option<Vec<u8>> {
        None
    }

    fn state_set(&mut self, _key: &str, _value: &[u8]) -> Result<(), DoorError> {
        Ok(())
    }

    fn state_keys(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn state_remove(&mut self, _key: &str) {}

    fn warn(&mut self, message: &str) {
        log::warn(message);
    }
}

/// The plugin: the `task` tool.
pub struct Subagents {
    config: serde_json::Value,
}

impl Subagents {
    fn task(&self, input: &str) -> Result<String, String> {
        let input: TaskInput = serde_json::from_str(input)
            .map_err(|e| format!("`task` takes {{description, prompt, tools?}}: {e}"))?;
        let open = serde_json::to_string(&OpenChild {
            label: input.description.clone(),
            tools: input.tools.clone(),
        })
        .map_err(|e| e.to_string())?;
        let scope: ChildScope = kernel_services::call(services::AGENTS, "open", &open)
            .map_err(|e| format!("no subagent was started: {}", e.message()))
            .and_then(|json| {
                serde_json::from_str(&json).map_err(|e| format!("the kernel's answer: {e}"))
            })?;
        let name = format!("subagent `{}` #{}", scope.label, scope.child);
        if scope.tools.is_empty() {
            return Err(format!(
                "{name} was given no tools ({}); do the sub-task yourself",
                scope.withheld.join("; ")
            ));
        }
        let mut config = self.config.clone();
        // The child starts with a clean conversation; it is not compacted (it is short).
        config["context-window"] = serde_json::json!(0);
        let doors = ChildDoors {
            tools: scope.tools.iter().cloned().collect(),
            scope: scope.clone(),
        };
        let mut child = AgentLoop::new(&config.to_string(), doors)?;
        let report = child.turn(TurnRequest {
            session: format!("subagent-{}", scope.child),
            input: input.prompt,
        });
        let mut out = report.text.trim().to_owned();
        if !scope.withheld.is_empty() {
            out.push_str(&format!(
                "\n[keel: {name} was not given: {}]",
                scope.withheld.join("; ")
            ));
        }
        match report.end {
            TurnEnd::Completed => {}
            TurnEnd::Cancelled => return Err(format!("{name} was cancelled (Ctrl-C)")),
            other => out.push_str(&format!(
                "\n[keel: {name} ended early ({other:?}): {}]",
                report.detail
            )),
        }
        if out.is_empty() {
            out = format!("[keel: {name} finished without an answer]");
        }
        Ok(out)
    }
}

impl Plugin for Subagents {
    fn activate(config: &str) -> Result<Self, String> {
        let parsed: Config =
            serde_json::from_str(config).map_err(|e| format!("invalid [config.subagents]: {e}"))?;
        let config = serde_json::json!({
            "max-steps": parsed.max_steps,
            "max-tokens": parsed.max_tokens,
            "system": parsed.system,
        });
        tools::register(
            ToolSpec::new(
                "task",
                "Hand a self-contained sub-task to a subagent: a fresh agent with its own \
                 conversation and, unless the person allowed more, read-only tools. Use it to \
                 search or read widely without filling this conversation, or to run several \
                 independent investigations at once (call it several times in one response). \
                 Its final answer is the result; it cannot see this conversation, so say \
                 everything it needs in `prompt`.",
                TASK_SCHEMA,
            )
            .capabilities(ToolCapabilities::empty())
            .parallel_safe(true),
        )?;
        Ok(Subagents { config })
    }

    fn handle_call(
        &mut self,
        _service: &str,
        method: &str,
        _payload: &str,
    ) -> Result<String, String> {
        Err(format!("subagents serves no service (method `{method}`)"))
    }

    fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String, String> {
        match name {
            "task" => self.task(input),
            other => Err(format!("subagents has no tool `{other}`")),
        }
    }
}

keel_sdk::export_plugin!(Subagents);
