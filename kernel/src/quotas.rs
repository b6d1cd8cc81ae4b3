//! How much of the kernel's own memory one plugin can make it hold. Everything a plugin can grow
//! on the kernel side is bounded here, per plugin, with a clear error at the limit, so no plugin
//! can make the host grow without bound: the WebAssembly memory cap covers the guest, these
//! cover what the guest hands to the kernel.
//!
//! Still bounded only by count (not yet in bytes per plugin): kernel-held state has its own
//! limits (1 MiB per value, 16 MiB per plugin, in `lifecycle`).

/// Largest event payload a plugin may emit. A session's `context` event (the system prompt and
/// every tool's schema) is the largest real one, far below this.
pub const MAX_EVENT_PAYLOAD: usize = 1 << 20;

/// Bytes of events queued for one subscriber and not yet handled; an emitter that would go
/// past it is told the subscriber is not keeping up, as for a full queue.
pub const MAX_QUEUED_EVENT_BYTES: usize = 16 << 20;

/// Tools one plugin may register.
pub const MAX_TOOLS_PER_PLUGIN: usize = 128;

/// Longest tool description.
pub const MAX_TOOL_DESCRIPTION: usize = 16 << 10;

/// Bytes of one plugin's tools together (names, descriptions, schemas): every one of them goes
/// into every model request.
pub const MAX_TOOL_BYTES_PER_PLUGIN: usize = 1 << 20;

/// Prompt fragments one plugin may add.
pub const MAX_FRAGMENTS_PER_PLUGIN: usize = 16;

/// Bytes of one plugin's prompt fragments together; they too go into every model request.
pub const MAX_FRAGMENT_BYTES_PER_PLUGIN: usize = 128 << 10;

/// Events kept for the host's display (a ring: the oldest are dropped first).
pub const HOST_EVENT_RING: usize = 256;
