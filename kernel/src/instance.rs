//! The contract between the kernel and whatever hosts a plugin's code: a WebAssembly
//! component, a trusted native library, or (in tests) an in-process Rust type.
//!
//! The kernel never touches a plugin's code except through [`PluginInstance`], and a plugin
//! never touches the kernel except through the [`HostHandle`](crate::HostHandle) its source was
//! given at instantiation. That is what lets every host share one lifecycle and undo contract.

use async_trait::async_trait;

use crate::call_chain::CallChain;
use crate::host_api::HostHandle;
use crate::typed_services::{ServiceAnswer, ServiceCall};
use crate::types::{Event, GuardVerdict};

/// What a plugin answered when it refused or failed a call, by kind: ABI 0.4.0's
/// `tool-error`, `call-error` and `activate-error` in one vocabulary. A plugin built against an
/// older ABI, a native plugin or an in-process test plugin answers with a bare message, which
/// is [`PluginError::Failed`].
///
/// The text (`Display`) is what the caller and the model read: the kind first, except for a
/// plain failure and an unknown name, whose messages say it themselves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The input or payload is not what the tool or method accepts; the caller should
    /// correct it.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The configuration is not what the plugin accepts (only from `activate`).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The plugin has no tool, service or method of that name.
    #[error("{0}")]
    Unknown(String),
    /// The plugin refuses the call.
    #[error("denied: {0}")]
    Denied(String),
    /// Something the plugin needs is absent now; the same call may succeed later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The plugin ran and failed.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for PluginError {
    /// A bare message (an older ABI's error string): a failure.
    fn from(message: String) -> Self {
        PluginError::Failed(message)
    }
}

impl From<&str> for PluginError {
    fn from(message: &str) -> Self {
        PluginError::Failed(message.to_owned())
    }
}

/// Why a call into a plugin's code did not return a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceError {
    /// The plugin ran and returned an error of its own.
    #[error("{0}")]
    Returned(PluginError),
    /// The plugin's code trapped or panicked; the instance cannot be used again.
    #[error("trapped: {0}")]
    Trap(String),
    /// The plugin exceeded a resource limit; the instance cannot be used again.
    #[error("exceeded its {limit} limit: {detail}")]
    Limit {
        /// Which limit: `cpu` or `memory`.
        limit: &'static str,
        /// The limit's value and how to raise it.
        detail: String,
    },
    /// The host could not run the call at all (instantiation, ABI mismatch, I/O).
    #[error("{0}")]
    Host(String),
}

impl InstanceError {
    /// Whether the instance is unusable after this error (a trap or an exceeded limit).
    pub fn is_fatal(&self) -> bool {
        matches!(self, InstanceError::Trap(_) | InstanceError::Limit { .. })
    }
}

/// One running instance of a plugin. The kernel holds it behind an exclusive lock, so methods
/// take `&mut self` and never run concurrently on the same instance.
///
/// `chain` is the call chain including this plugin itself; an instance hands it to its
/// [`HostHandle`] (via [`HostHandle::enter`]) before running guest code, so calls the guest
/// makes through the kernel carry it.
#[async_trait]
pub trait PluginInstance: Send {
    /// Activate with the plugin's configuration (a JSON object as text).
    async fn activate(&mut self, chain: &CallChain, config: &str) -> Result<(), InstanceError>;
    /// Release what the plugin holds itself; the kernel undoes its effects afterwards.
    async fn deactivate(&mut self, chain: &CallChain) -> Result<(), InstanceError>;
    /// Serve `method` of the provided service `service`.
    async fn handle_call(
        &mut self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, InstanceError>;
    /// Serve `call` through the plugin's typed door for its service (ABI 0.6.0); `None` when
    /// the plugin has none (an earlier ABI, a native or in-process plugin), and the kernel
    /// sends the same call through [`handle_call`](Self::handle_call) as JSON text.
    async fn call_typed(
        &mut self,
        chain: &CallChain,
        call: &ServiceCall,
    ) -> Result<Option<ServiceAnswer>, InstanceError> {
        let _ = (chain, call);
        Ok(None)
    }
    /// Run the registered tool `name` with its JSON input.
    async fn invoke_tool(
        &mut self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, InstanceError>;
    /// Deliver an event of a subscribed topic.
    async fn on_event(&mut self, chain: &CallChain, event: &Event) -> Result<(), InstanceError>;
    /// Answer for the registered guard `guard` whether tool `tool` may run with `input`.
    /// Hosts that cannot run guards answer with an error, which counts as forbid.
    async fn check_tool_call(
        &mut self,
        chain: &CallChain,
        guard: &str,
        tool: &str,
        input: &str,
    ) -> Result<GuardVerdict, InstanceError> {
        let _ = (chain, tool, input);
        Err(InstanceError::Host(format!(
            "this plugin's host cannot answer for guard `{guard}`"
        )))
    }
}

/// Makes instances of one plugin version: a compiled component, a loaded library, a Rust type.
/// The kernel keeps the source of every loaded plugin so it can re-instantiate it (after a
/// provider comes back, or to roll back a failed reload).
#[async_trait]
pub trait PluginSource: Send + Sync {
    /// A fresh instance whose only door into the kernel is `host`.
    async fn instantiate(&self, host: HostHandle)
    -> Result<Box<dyn PluginInstance>, InstanceError>;
}
