//! Workspace checkpoints and rewind.
//!
//! Before each turn and before every tool call that may change files, the kernel records the
//! state of the workspace ([`Recorder`]): a [`Manifest`] (every tracked path with its kind,
//! mode and content hash, or link target) whose file contents go into a content-addressed
//! [`Store`] in keel's home, never into the person's `.git`. Snapshots before and after a
//! command are exact for whatever it did to the tree (create, modify, delete, rename, chmod,
//! mkdir, rmdir), whoever did it: the difference between two manifests is what changed.
//!
//! A rewind ([`rewind::rewind`]) restores the tree of a checkpoint: it takes a safety
//! checkpoint first (so the rewind can itself be undone), refuses — naming them — files that
//! changed outside keel since the checkpoint unless told to overwrite, and writes only through
//! directories it opened without following a link ([`restore`]), so nothing outside the
//! workspace is ever touched.
//!
//! Module map: [`store`] (blobs, manifests, session indexes, the lock), [`snapshot`] (the
//! walk and the manifest), [`restore`] (the plan between two manifests and applying it),
//! [`recorder`] (a session's checkpoints, as the kernel takes them), [`journal`] (the inotify
//! change journal that spares a checkpoint the walk of everything), [`rewind`] (the whole
//! rewind, as the CLI runs it).

pub mod journal;
pub mod recorder;
pub mod restore;
pub mod rewind;
pub mod snapshot;
pub mod store;

pub use journal::DEFAULT_MAX_WATCHED_DIRS;
pub use recorder::Recorder;
pub use snapshot::{Manifest, Node, Skipped};
pub use store::{Checkpoint, Collected, Kind, Retention, Store};

/// Directories never recorded nor restored, at any depth: the version-control and keel control
/// directories. Rewinding the person's repository state (refs, index, objects) is not keel's to
/// do; `.keel` is keel's own (spilled outputs, memory). The sandbox keeps commands out of the
/// same directories, and `.claude/skills` too (`keel_kernel::sandbox::PROTECTED_IN_WORKSPACE`).
pub const NEVER_TRACKED: &[&str] = &[".git", ".hg", ".jj", ".svn", ".keel"];

/// What the person configured in `[checkpoints]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Files larger than this are not recorded (and said to be skipped).
    pub max_file_bytes: u64,
    /// Gitignore-style patterns never recorded, besides what `.gitignore` excludes.
    pub ignore: Vec<String>,
    /// A workspace with more entries than this is not recorded at all (a checkpoint that
    /// left some out would have a restore remove them): the checkpoint fails and says so.
    pub max_entries: usize,
    /// Places outside the workspace the session lets something write (an MCP server's
    /// writable `dirs`, every path when the sandbox is off), each said the way a person reads
    /// it: only the workspace is recorded, so each checkpoint names these as not covered.
    pub not_covered: Vec<String>,
}

/// The default size limit of one recorded file: 16 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 << 20;

/// The default most entries (files, directories, links) of a recorded workspace.
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            ignore: Vec::new(),
            max_entries: DEFAULT_MAX_ENTRIES,
            not_covered: Vec::new(),
        }
    }
}

/// A checkpoint operation that failed, with what to do next in its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Shorthand for this crate's results.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_error(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error(format!("{what}: {e}"))
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
