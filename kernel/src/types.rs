//! Plain data shared by the kernel, its hosts and the CLI: the host-side mirror of the WIT
//! `types` interface.

use serde::{Deserialize, Serialize};

/// Severity of a plugin's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Very detailed diagnostics.
    Trace,
    /// Diagnostics for the plugin's author.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}

pub use keel_gates::ToolCapabilities;

/// A tool a plugin offers to the agent: the one tool type guests and the kernel share.
pub use keel_protocol::ToolSpec;

/// An event on the kernel's bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Dot-separated topic.
    pub topic: String,
    /// The plugin that emitted it, or `keel` for the kernel and the host.
    pub source: String,
    /// Payload, usually JSON text.
    pub payload: String,
}

/// Why the kernel refused or could not complete a plugin's request. Mirrors the WIT
/// `kernel-error` variant, so every message reaches the plugin unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "lowercase")]
pub enum KernelError {
    /// The request was malformed: a bad name, version or argument.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Something else already owns what the request asked for.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The plugin is not allowed to do this now.
    #[error("denied: {0}")]
    Denied(String),
    /// The target is absent, waiting, failed or being unloaded.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The target plugin ran and returned an error or trapped.
    #[error("failed: {0}")]
    Failed(String),
    /// Nothing arrived within the time the caller allowed.
    #[error("timed out: {0}")]
    TimedOut(String),
}

/// A guard's decision about a tool call: the gates' one ordered [`Decision`](keel_gates::Decision),
/// so a guard's verdict combines with the exec policy's and the network policy's by maximum
/// and a guard can only tighten.
pub use keel_gates::Decision as GuardDecision;

/// A guard's answer about one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardVerdict {
    /// The decision.
    pub decision: GuardDecision,
    /// Why, when it is not `allow`.
    pub reason: String,
}

/// The name the kernel and the host use as an event source and in call chains.
pub const KERNEL_NAME: &str = "keel";

/// Service names starting with this prefix belong to the kernel; no plugin may provide them.
pub const RESERVED_SERVICE_PREFIX: &str = "keel.";

/// Whether `name` reads like the kernel's own: `keel`, or `keel` and a separator (`keel-x`,
/// `keel_x`, `keel.x`), in any letter case. No plugin, tool, guard or service may be named so:
/// a refusal or an event from `keel_gate` would pass for a kernel verdict.
pub fn reads_like_kernel(name: &str) -> bool {
    let Some(head) = name.get(..KERNEL_NAME.len()) else {
        return false;
    };
    head.eq_ignore_ascii_case(KERNEL_NAME)
        && name[KERNEL_NAME.len()..]
            .chars()
            .next()
            .is_none_or(|c| matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::reads_like_kernel;

    #[test]
    fn kernel_like_names() {
        for name in [
            "keel",
            "KEEL",
            "keel-gate",
            "keel_verdict",
            "keel.audit",
            "Keel_x",
        ] {
            assert!(reads_like_kernel(name), "{name}");
        }
        for name in ["keelhaul", "kee", "", "my-keel", "k\u{e9}el-x", "keels"] {
            assert!(!reads_like_kernel(name), "{name}");
        }
    }
}
