//! The pure, natively testable core of keel's agent plugins.
//!
//! The wasm guest plugins (tools, tool registry, session log, agent loop, claim verifier) are
//! thin wrappers around this crate. Everything here compiles for `wasm32-wasip2` as well as
//! natively: file access goes through `std::fs` (in a guest it only reaches the preopened
//! workspace), and nothing reads a clock, spawns a thread or process, or opens a socket — times
//! and random values are parameters.
//!
//! Modules by concept:
//! - [`agent_loop`]: the agent loop, over the kernel's doors as a trait.
//! - [`tools`]: the file tools (`read_file`, `write_file`, `edit_file`, `list_dir`, `grep`).
//! - [`registry`]: validating, listing and resolving registered tools.
//! - [`session_log`]: the append-only JSONL session log.
//! - [`loop_guard`]: repeated-call and consecutive-failure guard of the agent loop.
//! - [`batch`]: grouping a turn's tool calls into concurrent and serial batches.
//! - [`claims`]: detecting "tests pass"/"build succeeds" claims and judging replays.

pub mod agent_loop;
pub mod append;
pub mod batch;
pub mod claims;
pub mod compaction;
pub mod conversations;
pub mod loop_guard;
pub mod memory;
pub mod memory_store;
pub mod registry;
pub mod review;
pub mod session_log;
pub mod skills;
pub mod tools;

pub mod text;
