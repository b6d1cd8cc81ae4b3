//! What a tool declares it may do: the gates weigh it when no exec policy decides a call.

use serde::{Deserialize, Serialize};

/// What a tool may do when it runs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ToolCapabilities {
    /// The tool reads files.
    pub reads_files: bool,
    /// The tool creates, changes or removes files.
    pub writes_files: bool,
    /// The tool runs commands or code.
    pub executes_code: bool,
    /// The tool talks to the network.
    pub network: bool,
}
