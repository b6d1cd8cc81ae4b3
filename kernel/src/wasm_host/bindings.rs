//! Generated bindings of the `keel-plugin` world and the host side of every keel import.
//!
//! Each import ends in exactly one [`HostHandle`](crate::HostHandle) method, and pauses the
//! instance's CPU meter while it runs (see [`limits`](super::limits)).

use super::store::StoreState;
use crate::types;

wasmtime::component::bindgen!({
    path: "../wit/keel-plugin-0.1.0",
    world: "keel-plugin",
    imports: { default: async },
    exports: { default: async },
});

use keel::plugin::types::{KernelError, Level, ToolCapabilities, ToolSpec};

impl From<types::KernelError> for KernelError {
    fn from(e: types::KernelError) -> Self {
        match e {
            types::KernelError::Invalid(m) => KernelError::Invalid(m),
            types::KernelError::Conflict(m) => KernelError::Conflict(m),
            types::KernelError::Denied(m) => KernelError::Denied(m),
            types::KernelError::Unavailable(m) => KernelError::Unavailable(m),
            types::KernelError::Failed(m) => KernelError::Failed(m),
        }
    }
}

impl From<Level> for types::Level {
    fn from(level: Level) -> Self {
        match level {
            Level::Trace => types::Level::Trace,
            Level::Debug => types::Level::Debug,
            Level::Info => types::Level::Info,
            Level::Warn => types::Level::Warn,
            Level::Error => types::Level::Error,
        }
    }
}

impl From<ToolSpec> for types::ToolSpec {
    fn from(spec: ToolSpec) -> Self {
        let caps = spec.capabilities;
        types::ToolSpec {
            name: spec.name,
            description: spec.description,
            input_schema: spec.input_schema,
            capabilities: types::ToolCapabilities {
                reads_files: caps.contains(ToolCapabilities::READS_FILES),
                writes_files: caps.contains(ToolCapabilities::WRITES_FILES),
                executes_code: caps.contains(ToolCapabilities::EXECUTES_CODE),
                network: caps.contains(ToolCapabilities::NETWORK),
            },
            parallel_safe: spec.parallel_safe,
        }
    }
}

impl From<&types::Event> for keel::plugin::types::Event {
    fn from(event: &types::Event) -> Self {
        keel::plugin::types::Event {
            topic: event.topic.clone(),
            source: event.source.clone(),
            payload: event.payload.clone(),
        }
    }
}

impl keel::plugin::types::Host for StoreState {}

impl keel::plugin::log::Host for StoreState {
    async fn log(&mut self, level: Level, message: String) {
        let _host = self.meter.host_call();
        self.host.log(level.into(), &message);
    }
}

impl keel::plugin::services::Host for StoreState {
    async fn provide(&mut self, name: String, version: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.provide(&name, &version).map_err(Into::into)
    }

    async fn call(
        &mut self,
        name: String,
        method: String,
        payload: String,
    ) -> Result<String, KernelError> {
        // The one import that may wait for a long time (another plugin, a model stream): the
        // meter stays paused across the await, so waiting is never charged as guest CPU.
        let _host = self.meter.host_call();
        self.host
            .call(&name, &method, &payload)
            .await
            .map_err(Into::into)
    }
}

impl keel::plugin::tools::Host for StoreState {
    async fn register(&mut self, spec: ToolSpec) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.register_tool(spec.into()).map_err(Into::into)
    }
}

impl keel::plugin::events::Host for StoreState {
    async fn subscribe(&mut self, topic: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.subscribe(&topic).map_err(Into::into)
    }

    async fn emit(&mut self, topic: String, payload: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.emit(&topic, &payload).map_err(Into::into)
    }
}

impl keel::plugin::prompt::Host for StoreState {
    async fn add_fragment(&mut self, id: String, text: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host
            .add_prompt_fragment(&id, &text)
            .map_err(Into::into)
    }
}

impl keel::plugin::state::Host for StoreState {
    async fn get(&mut self, key: String) -> Option<Vec<u8>> {
        let _host = self.meter.host_call();
        self.host.state_get(&key)
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.state_set(&key, value).map_err(Into::into)
    }

    async fn remove(&mut self, key: String) {
        let _host = self.meter.host_call();
        self.host.state_remove(&key);
    }

    async fn keys(&mut self) -> Vec<String> {
        let _host = self.meter.host_call();
        self.host.state_keys()
    }
}
