//! Writing a memory folder safely when several keel processes share it: two sessions
//! remembering a new topic at once, or a session and `keel memory consolidate --apply`.
//!
//! - One writer at a time per folder: an exclusive `flock` on [`LOCK_FILE`], which the host
//!   takes (`keel memory consolidate --apply`, and around each call of the `memory` plugin
//!   that writes: WASI has no `flock`). The OS releases it when its holder dies, and it has no
//!   age after which a slow writer would lose it.
//! - [`write_atomic`]: a new file beside the old (`create_new`, so never through a link),
//!   flushed to disk, renamed over it: a reader or a crash sees the old file or the new one,
//!   never part of one. The rename replaces a link at the path instead of following it.
//! - [`remove_leftovers`]: temporary files a killed writer left, removed by the next writer
//!   while it holds the lock (so none of them is another writer's file in progress).
//!
//! Readers take no lock: every file is replaced whole.

use std::io::Write as _;
use std::path::Path;
use std::time::SystemTime;

/// The lock file in a memory folder.
pub const LOCK_FILE: &str = ".memory.lock";
/// What every temporary file of a memory folder ends with.
pub const TMP_SUFFIX: &str = ".keeltmp";

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
