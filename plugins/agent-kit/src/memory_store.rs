//! Writing a memory folder safely when several keel processes share it: two sessions
//! remembering a new topic at once, or a session and `keel memory consolidate --apply`.
//!
//! - [`FolderLock`]: one writer at a time per folder, as a lock file made with `O_EXCL`
//!   (`create_new`), the one exclusive primitive both a WASI guest (the `memory` plugin) and
//!   the host have; advisory `flock` is not in WASI. A lock older than [`STALE_AFTER`] was left
//!   by a killed writer (a write holds it for milliseconds) and is taken over.
//! - [`write_atomic`]: a new file beside the old (`create_new`, so never through a link),
//!   flushed to disk, renamed over it: a reader or a crash sees the old file or the new one,
//!   never part of one. The rename replaces a link at the path instead of following it.
//! - [`remove_leftovers`]: temporary files a killed writer left, removed by the next writer
//!   while it holds the lock (so none of them is another writer's file in progress).
//!
//! Readers take no lock: every file is replaced whole.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The lock file in a memory folder.
pub const LOCK_FILE: &str = ".memory.lock";
/// A lock file older than this was left by a writer that died.
pub const STALE_AFTER: Duration = Duration::from_secs(10);
/// What every temporary file of a memory folder ends with.
pub const TMP_SUFFIX: &str = ".keeltmp";

/// The folder's write lock, released when dropped.
pub struct FolderLock {
    path: PathBuf,
}

impl FolderLock {
    /// Takes `dir`'s lock, waiting at most `wait` for another writer (a stale lock is taken
    /// over); an error in words when the folder stays busy or cannot be written.
    pub fn acquire(dir: &Path, wait: Duration) -> Result<FolderLock, String> {
        FolderLock::acquire_at(dir.join(LOCK_FILE), wait)
    }

    /// The same lock protocol on the lock file `path`, for a shared file outside a memory
    /// folder (keel's approvals in its home).
    pub fn acquire_at(path: PathBuf, wait: Duration) -> Result<FolderLock, String> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    let _ = writeln!(file, "{}", unique());
                    return Ok(FolderLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::symlink_metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age > STALE_AFTER);
                    if stale {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    if started.elapsed() >= wait {
                        return Err(format!(
                            "busy: another keel is writing here (its lock {} is held); try \
                             again in a moment",
                            path.display()
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("cannot lock {}: {e}", path.display())),
            }
        }
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A name no other writer uses at the same moment: the time and random bits (std's hasher
/// keys come from the OS, or WASI's `random`; `std::process::id` does not exist in WASI).
fn unique() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u128(nanos);
    format!(
        "{nanos:x}-{:x}-{}",
        random.finish(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Replaces `path` with `bytes` atomically (see the module documentation). The caller holds
/// the folder's lock.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}{TMP_SUFFIX}", unique()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Removes the temporary files killed writers left in `dir`. Call it holding the lock.
pub fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(TMP_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_at_a_time_and_a_stale_lock_is_taken_over() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let first = FolderLock::acquire(dir.path(), Duration::from_millis(10))?;
        let busy = FolderLock::acquire(dir.path(), Duration::from_millis(30));
        assert!(busy.is_err_and(|e| e.contains("busy")));
        drop(first);
        let again = FolderLock::acquire(dir.path(), Duration::from_millis(10))?;
        drop(again);
        // A lock a killed writer left, older than STALE_AFTER.
        let lock = dir.path().join(LOCK_FILE);
        let file = std::fs::File::create(&lock).map_err(|e| e.to_string())?;
        file.set_modified(SystemTime::now() - STALE_AFTER - Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        let taken = FolderLock::acquire(dir.path(), Duration::from_millis(10))?;
        drop(taken);
        assert!(!lock.exists());
        Ok(())
    }

    #[test]
    fn an_atomic_write_replaces_a_link_instead_of_following_it() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let outside = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        std::fs::write(outside.path(), "secret").map_err(|e| e.to_string())?;
        let path = dir.path().join("MEMORY.md");
        std::os::unix::fs::symlink(outside.path(), &path).map_err(|e| e.to_string())?;
        write_atomic(&path, b"# Memory\n")?;
        assert_eq!(
            std::fs::read_to_string(outside.path()).map_err(|e| e.to_string())?,
            "secret"
        );
        assert!(!path.is_symlink());
        assert_eq!(
            std::fs::read_to_string(&path).map_err(|e| e.to_string())?,
            "# Memory\n"
        );
        std::fs::write(dir.path().join(".MEMORY.md.1-2-3.keeltmp"), "torn")
            .map_err(|e| e.to_string())?;
        remove_leftovers(dir.path());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .map_err(|e| e.to_string())?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("MEMORY.md")]);
        Ok(())
    }
}
