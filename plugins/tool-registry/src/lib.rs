//! keel plugin `tool-registry`: the service `tool-registry` 1.0.0.
//!
//! Methods (payloads are JSON, types from `keel-protocol`):
//! - `list` (payload ignored) → `Vec<ToolDef>`, sorted by name. An invalid definition is
//!   replaced by a fail-closed placeholder (its schema accepts nothing); a tool with an
//!   invalid name is left out.
//! - `resolve` (`ResolveRequest`) → `Resolution`: exact, then case-, separator- and
//!   CamelCase-insensitive, then `_tool` suffix; otherwise `Unknown` with "did you mean"
//!   suggestions. The kernel's dispatcher calls it for names not registered exactly.
//! - `problems` (payload ignored) → `Vec<String>`: why definitions were disabled.
//!
//! The registry is rebuilt from the kernel's registered tools on every call, so tools that
//! come and go with hot reload are always current.

use keel_agent_kit::registry::Registry;
use keel_agent_kit::tools::{ToolCapabilities, ToolSpec as KitSpec};
use keel_protocol::{ResolveRequest, services};
use keel_sdk::{Plugin, services as kernel_services, tools};

/// The plugin instance; it holds nothing itself.
struct ToolRegistry;

/// The registered tools, validated.
fn registry() -> Registry {
    Registry::new(tools::registered().into_iter().map(|spec| KitSpec {
        capabilities: ToolCapabilities::from_abi_bits(spec.capabilities.bits()),
        name: spec.name,
        description: spec.description,
        input_schema: spec.input_schema,
        parallel_safe: spec.parallel_safe,
    }))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode the answer: {e}"))
}

impl Plugin for ToolRegistry {
    fn activate(_config: &str) -> Result<Self, String> {
        kernel_services::provide(services::TOOL_REGISTRY, "1.0.0")?;
        Ok(ToolRegistry)
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != services::TOOL_REGISTRY {
            return Err(format!("no such service: {service}"));
        }
        match method {
            "list" => to_json(&registry().list()),
            "resolve" => {
                let request: ResolveRequest = serde_json::from_str(payload).map_err(|e| {
                    format!("resolve: the payload is not a ResolveRequest ({e}); send {{\"name\": \"read_file\"}}")
                })?;
                to_json(&registry().resolve(&request.name))
            }
            "problems" => to_json(&registry().problems()),
            other => Err(format!(
                "tool-registry has no method `{other}`; the methods are list, resolve and problems"
            )),
        }
    }
}

keel_sdk::export_plugin!(ToolRegistry);
