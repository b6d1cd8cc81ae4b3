//! Cleaning of untrusted text before it enters a model's context, in one pure crate so the
//! kernel's output gate (`keel-gates` re-exports these modules) and guest plugins that see
//! untrusted text first (the MCP client, which cleans a server's tool descriptions) apply the
//! very same rules. No I/O, no async runtime, nothing of the kernel; never panics.
//!
//! - [`sanitize`]: invisible, private-use, unassigned and control characters, terminal escape
//!   sequences, NFKC, line breaks; the external-content fence; head/tail cuts.
//! - [`markers`]: role turns, special tokens, tool-call tags, fences and keel's own notice
//!   openers made visibly harmless (`‹…›`).
//! - [`prompt_text`]: the two together for text that goes into every request (tool
//!   descriptions, input schemas, prompt fragments), keeping kernel-made fences.

pub mod markers;
pub mod prompt_text;
pub mod sanitize;
