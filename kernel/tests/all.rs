//! The integration tests of the kernel, as one test binary: each module was a binary of its own,
//! and linking one binary instead of several keeps builds and CI short.

mod common;

mod composability;
mod door_properties;
mod gate_pipeline;
mod lifecycle;
mod native_host;
mod plan_mode;
