//! What a tool declares it may do: the gates weigh it when no exec policy decides a call.

/// What a tool may do when it runs: one type with the tool's description
/// ([`keel_protocol::ToolSpec`]), which guests build too.
pub use keel_protocol::ToolCapabilities;
