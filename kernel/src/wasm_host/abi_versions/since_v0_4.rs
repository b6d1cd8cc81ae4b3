//! ABI 0.4.0: every import is an earlier version's (bound in [`super::since_v0_2`] and
//! [`super::since_v0_3`]); what it changes is the plugin's own export, whose errors are
//! variants. They map one to one onto the kernel's [`PluginError`].

use crate::instance::PluginError;

wasmtime::component::bindgen!({
    path: [
        "../wit/keel-plugin-0.2.0",
        "../wit/keel-plugin-0.3.0",
        "../wit/keel-plugin-0.4.0",
    ],
    world: "keel:plugin/keel-plugin@0.4.0",
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
    },
});

use exports::keel::plugin0_4_0::plugin::{ActivateError, CallError, ToolError};

impl From<ActivateError> for PluginError {
    fn from(e: ActivateError) -> Self {
        match e {
            ActivateError::InvalidConfig(m) => PluginError::InvalidConfig(m),
            ActivateError::Unavailable(m) => PluginError::Unavailable(m),
            ActivateError::Failed(m) => PluginError::Failed(m),
        }
    }
}

impl From<CallError> for PluginError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::UnknownMethod(m) => PluginError::Unknown(m),
            CallError::InvalidInput(m) => PluginError::InvalidInput(m),
            CallError::Denied(m) => PluginError::Denied(m),
            CallError::Unavailable(m) => PluginError::Unavailable(m),
            CallError::Failed(m) => PluginError::Failed(m),
        }
    }
}

impl From<ToolError> for PluginError {
    fn from(e: ToolError) -> Self {
        match e {
            ToolError::InvalidInput(m) => PluginError::InvalidInput(m),
            ToolError::UnknownTool(m) => PluginError::Unknown(m),
            ToolError::Denied(m) => PluginError::Denied(m),
            ToolError::Unavailable(m) => PluginError::Unavailable(m),
            ToolError::Failed(m) => PluginError::Failed(m),
        }
    }
}
