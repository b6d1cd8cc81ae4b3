//! The integration tests of keel end to end (real plugin components), as one test binary: each module was a binary of its own,
//! and linking one binary instead of several keeps builds and CI short.

mod abi_versions;
mod agent_session;
mod call_bounds;
mod home_sealing;
mod hostile_plugins;
mod kernel_mimicry;
mod memory_bounds;
mod model_wire_e2e;
mod processes;
mod secret_binding;
mod service_doors;
mod tool_plugins;
mod wasm_plugins;
