//! ABI 0.2.0: the bindings of its `keel-plugin` world and the host side of every import it
//! defines. Every later ABI imports these interfaces by name, so their host side here serves
//! every component; a 0.2.0 (or 0.3.0) component also exports 0.2.0's `plugin`, which
//! [`super::PluginExports`] adapts onto the newest shape.
//!
//! Each import ends in exactly one [`HostHandle`](crate::HostHandle) method, and pauses the
//! instance's CPU meter while it runs (see [`limits`](crate::wasm_host::limits)).

use crate::net_client::{HttpRequest, SecretHeader};
use crate::sandbox::runner::ExecCommand;
use crate::types;
use crate::wasm_host::store::StoreState;

wasmtime::component::bindgen!({
    path: "../wit/keel-plugin-0.2.0",
    world: "keel-plugin",
    imports: { default: async },
    exports: { default: async },
});

use keel::plugin::types::{
    GuardDecision, GuardVerdict, KernelError, Level, ToolCapabilities, ToolSpec,
};

impl From<types::KernelError> for KernelError {
    fn from(e: types::KernelError) -> Self {
        match e {
            types::KernelError::Invalid(m) => KernelError::Invalid(m),
            types::KernelError::Conflict(m) => KernelError::Conflict(m),
            types::KernelError::Denied(m) => KernelError::Denied(m),
            types::KernelError::Unavailable(m) => KernelError::Unavailable(m),
            types::KernelError::Failed(m) => KernelError::Failed(m),
            types::KernelError::TimedOut(m) => KernelError::TimedOut(m),
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

impl From<GuardVerdict> for types::GuardVerdict {
    fn from(v: GuardVerdict) -> Self {
        types::GuardVerdict {
            decision: match v.decision {
                GuardDecision::Allow => types::GuardDecision::Allow,
                GuardDecision::Prompt => types::GuardDecision::Prompt,
                GuardDecision::Forbid => types::GuardDecision::Forbid,
            },
            reason: v.reason,
        }
    }
}

impl From<types::ToolSpec> for ToolSpec {
    fn from(spec: types::ToolSpec) -> Self {
        let c = spec.capabilities;
        let mut caps = ToolCapabilities::empty();
        for (on, flag) in [
            (c.reads_files, ToolCapabilities::READS_FILES),
            (c.writes_files, ToolCapabilities::WRITES_FILES),
            (c.executes_code, ToolCapabilities::EXECUTES_CODE),
            (c.network, ToolCapabilities::NETWORK),
        ] {
            if on {
                caps |= flag;
            }
        }
        ToolSpec {
            name: spec.name,
            description: spec.description,
            input_schema: spec.input_schema,
            capabilities: caps,
            parallel_safe: spec.parallel_safe,
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

    async fn registered(&mut self) -> Vec<ToolSpec> {
        let _host = self.meter.host_call();
        self.host.tools().into_iter().map(Into::into).collect()
    }
}

impl keel::plugin::guards::Host for StoreState {
    async fn register(&mut self, name: String) -> Result<(), KernelError> {
        let _host = self.meter.host_call();
        self.host.register_guard(&name).map_err(Into::into)
    }
}

impl keel::plugin::http::Host for StoreState {
    async fn send(
        &mut self,
        req: keel::plugin::http::Request,
    ) -> Result<(u32, keel::plugin::http::ResponseHead), KernelError> {
        let body = bytes::Bytes::from(req.body);
        let parts = RequestParts {
            method: req.method,
            url: req.url,
            headers: req.headers,
            secret_headers: req.secret_headers,
            timeout_ms: req.timeout_ms,
        };
        self.http_send(parts, body).await
    }

    async fn next_chunk(
        &mut self,
        body: u32,
        idle_ms: u32,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let _host = self.meter.host_call();
        self.host
            .http_next_chunk(body, std::time::Duration::from_millis(u64::from(idle_ms)))
            .await
            .map_err(Into::into)
    }

    async fn close(&mut self, body: u32) {
        let _host = self.meter.host_call();
        self.host.http_close(body);
    }
}

/// An HTTP request's record without its body, which each version's door lifts its own way.
pub(super) struct RequestParts {
    pub(super) method: String,
    pub(super) url: String,
    pub(super) headers: Vec<keel::plugin::http::Header>,
    pub(super) secret_headers: Vec<keel::plugin::http::SecretHeader>,
    pub(super) timeout_ms: u32,
}

impl StoreState {
    /// Send a request through the kernel's HTTP client: the response body's number and head.
    pub(super) async fn http_send(
        &mut self,
        req: RequestParts,
        body: bytes::Bytes,
    ) -> Result<(u32, keel::plugin::http::ResponseHead), KernelError> {
        let _host = self.meter.host_call();
        let request = HttpRequest {
            method: req.method,
            url: req.url,
            headers: req.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            secret_headers: req
                .secret_headers
                .into_iter()
                .map(|h| SecretHeader {
                    secret: h.secret,
                    header: h.header,
                    prefix: h.prefix,
                })
                .collect(),
            body,
            timeout: std::time::Duration::from_millis(u64::from(req.timeout_ms)),
        };
        let (id, head) = self.host.http_send(request).await?;
        Ok((
            id,
            keel::plugin::http::ResponseHead {
                status: head.status,
                headers: head
                    .headers
                    .into_iter()
                    .map(|(name, value)| keel::plugin::http::Header { name, value })
                    .collect(),
                url: head.url,
            },
        ))
    }
}

impl keel::plugin::exec::Host for StoreState {
    async fn run(
        &mut self,
        cmd: keel::plugin::exec::Command,
    ) -> Result<keel::plugin::exec::Outcome, KernelError> {
        let _host = self.meter.host_call();
        let outcome = self
            .host
            .exec(ExecCommand {
                line: cmd.line,
                cwd: cmd.cwd,
                timeout: std::time::Duration::from_millis(u64::from(cmd.timeout_ms)),
            })
            .await?;
        Ok(keel::plugin::exec::Outcome {
            exit_code: outcome.exit_code,
            output: outcome.output,
            timed_out: outcome.timed_out,
            cwd: outcome.cwd,
            note: outcome.note,
        })
    }
}

impl keel::plugin::agent::Host for StoreState {
    async fn complete(&mut self, request: String) -> Result<String, KernelError> {
        let _host = self.meter.host_call();
        // A new step of the agent: its own CPU bound starts afresh, with the account its
        // turn (or child run) shares with the services it calls.
        if self.host.chain().renew_step() {
            self.meter.renew_step();
        }
        self.host.agent_complete(&request).await.map_err(Into::into)
    }

    async fn dispatch(&mut self, call_ids: Vec<String>) -> Vec<String> {
        let _host = self.meter.host_call();
        self.host.agent_dispatch(&call_ids).await
    }

    async fn replay(&mut self, call_id: String) -> Result<String, KernelError> {
        let _host = self.meter.host_call();
        self.host.agent_replay(&call_id).await.map_err(Into::into)
    }

    async fn cancelled(&mut self) -> bool {
        let _host = self.meter.host_call();
        self.host.agent_cancelled()
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
