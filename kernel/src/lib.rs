//! keel's sealed kernel: the plugin dependency graph, the lifecycle with per-plugin undo logs,
//! the WebAssembly and native hosts, and the mediation of every call between plugins.
//!
//! Plugins reach the kernel only through [`HostHandle`]; the host (the CLI) drives it through
//! [`Kernel`].

mod agents;
mod boundary;
mod call_chain;
pub mod consent;
mod dispatch;
mod editor;
mod env;
mod graph;
mod host_api;
mod instance;
mod lifecycle;
mod loader;
mod manifest;
mod native_host;
mod net_client;
mod plan_mode;
mod processes;
pub mod quotas;
pub mod sandbox;
mod session_gates;
mod typed_services;
mod types;
mod undo;
mod wasm_host;

/// The sealed gates' pure policies live in their own crate (`kernel/gates/`) so they build and
/// fuzz without the runtime; the kernel owns their session state and is their only caller.
pub use keel_checkpoints as checkpoints;
pub use keel_gates as gates;

pub use agents::SubagentPolicy;
pub use call_chain::{CallChain, CallKind, CpuAccount, Deadline, Deadlines};
pub use dispatch::HOOKS_SERVICE;
pub use editor::EditorFiles;
pub use env::{Env, ProcessRecord, ServiceEntry, ToolEntry};
pub use graph::{GraphError, PluginGraph};
pub use host_api::HostHandle;
pub use instance::{InstanceError, PluginError, PluginInstance, PluginSource};
pub use lifecycle::{
    CallFigures, Kernel, KernelConfig, LifecycleError, PluginChange, PluginChangeKind,
    PluginPackage, PluginState, PluginStatus,
};
pub use loader::{
    DATA_DIR_PREFIX, LoadError, LoaderConfig, PluginLoader, code_path, manifest_path,
};
pub use manifest::{
    CALLER_SERVICE, Capabilities, DirAccess, DirCapability, Limits, Manifest, ManifestError,
    PluginKind, Requirement, is_valid_plugin_name, is_valid_service_name,
};
pub use native_host::{KeelBuf, KeelHostApi, NATIVE_ABI_VERSION, NativeError, open as open_native};
pub use net_client::{HttpHead, HttpRequest, NetConfig, SecretHeader, Secrets, host_declared};
pub use processes::{OUTPUT_TOPIC as PROCESS_OUTPUT_TOPIC, ProcessEntry, ProcessStatus};
pub use sandbox::runner::{ExecCommand, ExecOutcome};
pub use session_gates::{GateConfig, KEEP_HEAD, KEEP_TAIL, StandingAnswer};
pub use typed_services::{ModelCall, ServiceAnswer, ServiceCall};
pub use types::{
    Event, GuardDecision, GuardVerdict, KERNEL_NAME, KernelError, Level, ToolCapabilities, ToolSpec,
};
pub use wasm_host::{
    CacheStatus, ComponentReport, GrantedDir, Precompiled, SUPPORTED_ABI, Shipped, WasmComponent,
    WasmError, WasmGrants, WasmHost, WasmHostConfig, WasmLimits, check_declarations, check_imports,
    check_instantiation, inspect_component,
};
