//! ABI 0.3.0: the host side of the two interfaces it adds (`processes`, `tool-list`).
//! Everything else a 0.3.0 component imports is 0.2.0's, bound in [`super::since_v0_2`]; its
//! export is 0.2.0's `plugin`. ABI 0.4.0 imports these two by name as well.

use crate::wasm_host::store::StoreState;

use super::since_v0_2::keel::plugin::types::KernelError;

wasmtime::component::bindgen!({
    path: ["../wit/keel-plugin-0.2.0", "../wit/keel-plugin-0.3.0"],
    world: "keel:plugin/keel-plugin@0.3.0",
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
        "keel:plugin/plugin@0.2.0": super::since_v0_2::exports::keel::plugin::plugin,
    },
});

use keel::plugin0_3_0::processes::ProcessStatus;

impl keel::plugin0_3_0::processes::Host for StoreState {
    async fn entries(&mut self) -> Vec<String> {
        let _host = self.meter.host_call();
        self.host.process_entries()
    }

    async fn start(&mut self, entry: String) -> Result<u32, KernelError> {
        let _host = self.meter.host_call();
        self.host.process_start(&entry).map_err(Into::into)
    }

    async fn write(
        &mut self,
        process: u32,
        bytes: Vec<u8>,
        timeout_ms: u32,
    ) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host
            .process_write(
                process,
                &bytes,
                std::time::Duration::from_millis(timeout_ms.into()),
            )
            .await
            .map_err(Into::into)
    }

    async fn read(
        &mut self,
        process: u32,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let _host = self.meter.host_call();
        self.host
            .process_read(
                process,
                max_bytes as usize,
                std::time::Duration::from_millis(timeout_ms.into()),
            )
            .await
            .map_err(Into::into)
    }

    async fn status(&mut self, process: u32) -> Result<ProcessStatus, KernelError> {
        let _host = self.meter.host_call();
        match self.host.process_status(process)? {
            crate::processes::ProcessStatus::Running => Ok(ProcessStatus::Running),
            crate::processes::ProcessStatus::Exited(code) => Ok(ProcessStatus::Exited(code)),
        }
    }

    async fn kill(&mut self, process: u32) {
        let _host = self.meter.host_call();
        self.host.process_kill(process);
    }
}

impl keel::plugin0_3_0::tool_list::Host for StoreState {
    async fn unregister(&mut self, name: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.withdraw_tool(&name).map_err(Into::into)
    }
}
