//! ABI 0.5.0: the host side of the kernel's own services as typed interfaces (`caller`,
//! `prompt-context`, `conversation`, `agents`). Everything else a 0.5.0 component imports is
//! an earlier version's (bound in [`super::since_v0_2`] and [`super::since_v0_3`]); its export
//! is 0.4.0's `plugin`.
//!
//! Each function ends in the [`HostHandle`](crate::HostHandle) method that calls the same
//! typed core the JSON door (`services.call("keel.prompt", …)`) calls, after the same
//! declaration check: this module only converts between the WIT records and
//! `keel_protocol`'s types.

use keel_protocol as protocol;

use crate::wasm_host::store::StoreState;

use super::since_v0_2::keel::plugin::types::KernelError;

wasmtime::component::bindgen!({
    path: [
        "../wit/keel-plugin-0.2.0",
        "../wit/keel-plugin-0.3.0",
        "../wit/keel-plugin-0.4.0",
        "../wit/keel-plugin-0.5.0",
    ],
    world: "keel:plugin/keel-plugin@0.5.0",
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
    },
});

use keel::plugin0_5_0::agents::{ChildScope, OpenRequest};
use keel::plugin0_5_0::conversation::Message;
use keel::plugin0_5_0::prompt_context::PromptFragment;

impl keel::plugin0_5_0::caller::Host for StoreState {
    async fn name(&mut self) -> String {
        let _host = self.meter.host_call();
        self.host.caller_name()
    }

    async fn provider(&mut self, service: String) -> Option<String> {
        let _host = self.meter.host_call();
        self.host.caller_provider(&service)
    }
}

impl keel::plugin0_5_0::prompt_context::Host for StoreState {
    async fn fragments(&mut self) -> Result<Vec<PromptFragment>, KernelError> {
        let _host = self.meter.host_call();
        Ok(self
            .host
            .prompt_fragments()?
            .into_iter()
            .map(|f| PromptFragment {
                plugin: f.plugin,
                id: f.id,
                text: f.text,
            })
            .collect())
    }

    async fn fence(&mut self, source: String, text: String) -> Result<String, KernelError> {
        let _host = self.meter.host_call();
        self.host.prompt_fence(&source, &text).map_err(Into::into)
    }

    async fn generation(&mut self) -> Result<u64, KernelError> {
        let _host = self.meter.host_call();
        self.host.prompt_generation().map_err(Into::into)
    }
}

impl keel::plugin0_5_0::conversation::Host for StoreState {
    async fn read(&mut self, start: u32, end: u32) -> Result<Vec<Message>, KernelError> {
        let _host = self.meter.host_call();
        let range = protocol::ConversationRead {
            from: start as usize,
            to: end as usize,
        };
        Ok(self
            .host
            .conversation_read(range)?
            .into_iter()
            .map(super::conversions::message_to_wit)
            .collect())
    }
}

impl keel::plugin0_5_0::agents::Host for StoreState {
    async fn open(&mut self, request: OpenRequest) -> Result<ChildScope, KernelError> {
        let _host = self.meter.host_call();
        let scope = self.host.agents_open(&protocol::OpenChild {
            label: request.label,
            tools: request.tools,
        })?;
        Ok(ChildScope {
            child: scope.child,
            label: scope.label,
            depth: scope.depth,
            parent_call: scope.parent_call,
            tools: scope.tools,
            withheld: scope.withheld,
        })
    }
}
