//! The one door from a plugin into the kernel. Every host import a plugin can reach (WIT
//! imports for components, the callback table for native libraries) ends in a method of
//! [`HostHandle`]; none of them can reach the gates, another plugin's state, or the lifecycle.

use std::sync::{Arc, Weak};

use crate::env::Effect;
use crate::instance::CallChain;
use crate::lifecycle::Shared;
use crate::types::{KernelError, Level, ToolSpec};

/// A plugin instance's handle on the kernel. Cheap to clone; holds the kernel weakly so an
/// instance never keeps a dropped kernel alive.
#[derive(Clone)]
pub struct HostHandle {
    shared: Weak<Shared>,
    plugin: Arc<str>,
    generation: u64,
    chain: CallChain,
}

impl std::fmt::Debug for HostHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostHandle")
            .field("plugin", &self.plugin)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl HostHandle {
    pub(crate) fn new(shared: Weak<Shared>, plugin: &str, generation: u64) -> Self {
        HostHandle {
            shared,
            plugin: Arc::from(plugin),
            generation,
            chain: CallChain::starting_at(plugin),
        }
    }

    /// The plugin this handle belongs to.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Set the call chain of the call about to run in this plugin; calls it makes carry it.
    pub fn enter(&mut self, chain: &CallChain) {
        self.chain = chain.clone();
    }

    fn shared(&self) -> Result<Arc<Shared>, KernelError> {
        self.shared
            .upgrade()
            .ok_or_else(|| KernelError::Unavailable("the kernel has shut down".into()))
    }

    /// Write a log line tagged with the plugin's name.
    pub fn log(&self, level: Level, message: &str) {
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn effect(&self, effect: Effect) -> Result<(), KernelError> {
        self.shared()?
            .apply_effect(&self.plugin, self.generation, effect)
    }

    /// Start serving `name` at `version` (must be declared under `provides`).
    pub fn provide(&self, name: &str, version: &str) -> Result<(), KernelError> {
        let version = semver::Version::parse(version).map_err(|e| {
            KernelError::Invalid(format!(
                "service `{name}`: version `{version}` is not semver ({e}); use e.g. `1.0.0`"
            ))
        })?;
        self.effect(Effect::ProvideService {
            name: name.to_owned(),
            version,
        })
    }

    /// Register a tool.
    pub fn register_tool(&self, spec: ToolSpec) -> Result<(), KernelError> {
        self.effect(Effect::RegisterTool(spec))
    }

    /// Receive events of `topic`.
    pub fn subscribe(&self, topic: &str) -> Result<(), KernelError> {
        self.effect(Effect::Subscribe {
            topic: topic.to_owned(),
        })
    }

    /// Add a system-prompt fragment under `id`.
    pub fn add_prompt_fragment(&self, id: &str, text: &str) -> Result<(), KernelError> {
        self.effect(Effect::AddPromptFragment {
            id: id.to_owned(),
            text: text.to_owned(),
        })
    }

    /// Emit an event to every other subscriber of `topic`.
    pub fn emit(&self, topic: &str, payload: &str) -> Result<(), KernelError> {
        self.shared()?
            .emit_from_plugin(&self.plugin, self.generation, topic, payload)
    }

    /// The value of `key` in this plugin's kernel-held state.
    pub fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        self.shared().ok()?.state_get(&self.plugin, key)
    }

    /// Store `value` under `key` in this plugin's kernel-held state.
    pub fn state_set(&self, key: &str, value: Vec<u8>) -> Result<(), KernelError> {
        self.shared()?
            .state_set(&self.plugin, self.generation, key, value)
    }

    /// Remove `key` from this plugin's kernel-held state.
    pub fn state_remove(&self, key: &str) {
        if let Ok(shared) = self.shared() {
            shared.state_remove(&self.plugin, self.generation, key);
        }
    }

    /// Every key of this plugin's kernel-held state, sorted.
    pub fn state_keys(&self) -> Vec<String> {
        self.shared()
            .map(|s| s.state_keys(&self.plugin))
            .unwrap_or_default()
    }

    /// Call `method` of service `name` through the kernel.
    pub async fn call(
        &self,
        name: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, KernelError> {
        self.shared()?
            .call_service(&self.chain, name, method, payload)
            .await
    }
}
