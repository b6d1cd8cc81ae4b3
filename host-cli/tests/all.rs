//! The integration tests of the `keel` binary, as one test binary: each module was a binary of its own,
//! and linking one binary instead of several keeps builds and CI short.

mod common;

mod acp;
mod agent;
mod agent_wire;
mod checkpoints;
mod cli;
mod crash_safety;
mod exit_codes;
mod hooks;
mod interactive;
mod learning;
mod long_sessions;
mod long_turns;
mod mcp;
mod mcp_client;
mod nothing_lost;
mod plan_mode;
mod registry;
mod session_builder;
mod subagents;
mod telemetry;
mod terminal;
mod untrusted_text;
mod web;
