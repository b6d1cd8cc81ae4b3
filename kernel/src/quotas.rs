//! How much of the kernel's own memory plugins can make it hold. Everything a plugin can grow on
//! the kernel side is bounded here, per plugin and across all plugins, with a clear error at the
//! limit, so no plugin (nor several together) can make the host grow without bound: the
//! WebAssembly memory cap covers each guest, these cover what guests hand to the kernel.

/// Largest event payload a plugin may emit. A session's `context` event (the system prompt and
/// every tool's schema) is the largest real one, far below this.
pub const MAX_EVENT_PAYLOAD: usize = 1 << 20;

/// Bytes of events queued for one subscriber and not yet handled; an emitter that would go
/// past it is told the subscriber is not keeping up, as for a full queue.
pub const MAX_QUEUED_EVENT_BYTES: usize = 16 << 20;

/// Bytes of events queued for all subscribers together. An event is queued once and shared
/// by its subscribers, but counted against each queue it waits in.
pub const MAX_QUEUED_EVENT_BYTES_TOTAL: usize = 64 << 20;

/// Largest event payload the host's display ring keeps; a larger one is kept as a note of its
/// size (subscribers, such as the session log, get it whole).
pub const MAX_HOST_EVENT_PAYLOAD: usize = 256 << 10;

/// Tools one plugin may register.
pub const MAX_TOOLS_PER_PLUGIN: usize = 128;

/// Longest tool description.
pub const MAX_TOOL_DESCRIPTION: usize = 16 << 10;

/// Bytes of one plugin's tools together (names, descriptions, schemas): every one of them goes
/// into every model request.
pub const MAX_TOOL_BYTES_PER_PLUGIN: usize = 1 << 20;

/// Bytes of all plugins' tools together.
pub const MAX_TOOL_BYTES_TOTAL: usize = 4 << 20;

/// Prompt fragments one plugin may add.
pub const MAX_FRAGMENTS_PER_PLUGIN: usize = 16;

/// Bytes of one plugin's prompt fragments together; they too go into every model request.
pub const MAX_FRAGMENT_BYTES_PER_PLUGIN: usize = 128 << 10;

/// Bytes of all plugins' prompt fragments together.
pub const MAX_FRAGMENT_BYTES_TOTAL: usize = 512 << 10;

/// Largest key and value in a plugin's kernel-held state, its total, and all plugins' total.
pub const MAX_STATE_KEY: usize = 256;
/// See [`MAX_STATE_KEY`].
pub const MAX_STATE_VALUE: usize = 1 << 20;
/// See [`MAX_STATE_KEY`].
pub const MAX_STATE_BYTES_PER_PLUGIN: usize = 16 << 20;
/// See [`MAX_STATE_KEY`].
pub const MAX_STATE_BYTES_TOTAL: usize = 64 << 20;

/// Topics (or patterns) one plugin may subscribe to.
pub const MAX_SUBSCRIPTIONS_PER_PLUGIN: usize = 64;

/// Guards one plugin may register (each is asked about every tool call).
pub const MAX_GUARDS_PER_PLUGIN: usize = 8;

/// Bytes of long tool outputs one session may spill to `.keel/spill` in the workspace; past
/// it, outputs are cut to head and tail without a spilled copy.
pub const MAX_SPILL_BYTES_PER_SESSION: u64 = 256 << 20;

/// Events kept for the host's display (a ring: the oldest are dropped first).
pub const HOST_EVENT_RING: usize = 256;
