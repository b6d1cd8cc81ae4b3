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
//! `list` and `resolve` are served typed too (ABI 0.6.0's `tool-registry-service`), to
//! callers of 0.6.0 and the kernel's dispatcher; callers of earlier versions keep the JSON door.
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
        world: "keel:plugin/tool-registry-service@0.6.0",
        with: {
            "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
        },
    });
}

use keel_sdk::bindings::keel::plugin0_2_0::types::KernelError as RawKernelError;
use typed::exports::keel::plugin0_6_0::tool_registry as registry_export;

struct TypedRegistry;

impl registry_export::Guest for TypedRegistry {
    fn list() -> Result<Vec<registry_export::ToolDef>, RawKernelError> {
        Ok(registry()
            .list()
            .into_iter()
            .map(|def| registry_export::ToolDef {
                input_schema: def.input_schema.to_string(),
                name: def.name,
                description: def.description,
            })
            .collect())
    }

    fn resolve(name: String) -> Result<registry_export::Resolution, RawKernelError> {
        use keel_protocol::Resolution;
        use registry_export::{DisabledTool, Resolution as Typed};
        Ok(match registry().resolve(&name) {
            Resolution::Found { name } => Typed::Found(name),
            Resolution::Unknown { did_you_mean } => Typed::Unknown(did_you_mean),
            Resolution::Disabled { name, reason } => Typed::Disabled(DisabledTool { name, reason }),
        })
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedRegistry with_types_in typed);
};
