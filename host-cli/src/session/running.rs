//! Which sessions a keel process is running: each running session holds an exclusive `flock`
//! on `<home>/running/<id>.lock` for as long as the process runs it (the kernel drops it when
//! the process ends, however it ends). `keel rewind` takes the same lock, so it never restores
//! files or appends to a log under a session that is still working in the workspace, and a
//! second `keel resume` of a session another process runs is refused.
//!
//! The folder is in keel's home, which no plugin is granted (the session logs' folder, which
//! the session-log plugin may write, would let a plugin remove the file and so the lock).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A session's lock, held until dropped; the file is removed then (still locked, so whoever
/// opens it next finds either no file or an unlocked one that [`take`] sees is gone).
#[derive(Debug)]
pub(crate) struct Running {
    path: PathBuf,
    _file: File,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why a session's lock could not be taken.
#[derive(Debug)]
pub(crate) enum NotTaken {
    /// Another process runs the session.
    Held,
    /// The lock file could not be opened or locked.
    Failed(String),
}

/// Whether `id` can name a lock file: the characters of keel's session ids.
fn valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn lock_path(home: &Path, id: &str) -> Result<PathBuf, NotTaken> {
    if !valid(id) {
        return Err(NotTaken::Failed(format!(
            "`{id}` is not a session id; `keel sessions list` shows them"
        )));
    }
    Ok(home.join("running").join(format!("{id}.lock")))
}

/// How long [`take`] lets a lock held by another process go before it says the session is
/// running. A keel process that was killed lets go at once, but a child it was starting when it
/// died holds a copy of the descriptor until that child execs or exits (a fraction of a
/// second): a resume right after a kill must not be refused for it.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Take the lock of session `id`, waiting at most [`GRACE`] for another process to let go.
/// The file is empty (it takes no space on a full disk beyond its entry).
pub(crate) fn take(home: &Path, id: &str) -> Result<Running, NotTaken> {
    let until = std::time::Instant::now() + GRACE;
    loop {
        match try_take(home, id) {
            Err(NotTaken::Held) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// [`take`] without waiting.
fn try_take(home: &Path, id: &str) -> Result<Running, NotTaken> {
    use std::os::unix::fs::MetadataExt as _;
    let path = lock_path(home, id)?;
    let failed = |e: std::io::Error| NotTaken::Failed(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    // A holder removes the file as it lets go: a lock taken on a file no longer at the path
    // is taken again on the one there now.
    for _ in 0..8 {
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
                .map_err(failed)?
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(NotTaken::Held),
            Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
        }
        let same = match (file.metadata(), std::fs::symlink_metadata(&path)) {
            (Ok(held), Ok(there)) => held.ino() == there.ino() && held.dev() == there.dev(),
            _ => false,
        };
        if same {
            return Ok(Running { path, _file: file });
        }
    }
    Err(NotTaken::Failed(format!(
        "{} keeps being replaced while keel locks it",
        path.display()
    )))
}

/// Words for session `id` found running.
pub(crate) fn held_words(id: &str) -> String {
    format!("session {id} is running in another keel process")
}
