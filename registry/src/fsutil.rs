//! Durable file writes: temp file, fsync, rename, fsync the directory.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A unique suffix for temp files: process id, a counter and random bits.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut random = [0u8; 8];
    // Uniqueness within this process comes from the counter; the random bits only keep two
    // processes that reuse a pid apart, so a failing random source is not fatal.
    let _ = getrandom::fill(&mut random);
    format!(
        "{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        hex::encode(random)
    )
}

/// Flush a directory's entries (a created or renamed file) to disk.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replace `path` with `bytes` atomically: readers see the old or the new content, never a
/// mix, and after a crash one of the two is on disk. `private` makes the file mode 0600.
pub fn atomic_write(path: &Path, bytes: &[u8], private: bool) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.{}.tmp", unique_suffix()));
    let result = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// How long a command waits for another keel process to finish its update of the same file
/// before giving up with an error that names the lock.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// An exclusive advisory lock (`flock`) taken for a read-modify-write of one of keel's shared
/// files. The operating system releases it when this is dropped or the process dies, so a
/// killed keel never leaves it held.
#[derive(Debug)]
pub struct UpdateLock {
    _file: File,
}

/// The lock file guarding `target`: `.<name>.lock` beside it. It is never removed (removing a
/// lock file another process is waiting on would let two writers in).
pub fn lock_path_for(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.lock"))
}

/// Lock `target` for a read-modify-write: read it only after this returns, write it with
/// [`atomic_write`] before dropping the lock. Waits (up to a minute) for another keel process
/// updating the same file. Under the lock, temp files that a killed writer of `target` left
/// beside it are removed: every writer of a locked file holds this lock, so none is in use.
pub fn lock_for_update(target: &Path) -> io::Result<UpdateLock> {
    let dir = target.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let path = lock_path_for(target);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    let started = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another keel process has held the lock {} for over {} s; wait for it \
                         to finish, or end it if it hangs",
                        path.display(),
                        LOCK_WAIT.as_secs()
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
    if let Some(name) = target.file_name() {
        remove_stale_temps(dir, &name.to_string_lossy());
    }
    Ok(UpdateLock { _file: file })
}

/// Whether `entry` is a temp file [`atomic_write`] makes for `file_name` (`None`: for any
/// file): `.<file_name>.<pid>-<n>-<16 hex>.tmp`.
fn is_temp_of(entry: &str, file_name: Option<&str>) -> bool {
    let Some(rest) = entry.strip_prefix('.').and_then(|e| e.strip_suffix(".tmp")) else {
        return false;
    };
    let (name, suffix) = match file_name {
        Some(name) => match rest.strip_prefix(name).and_then(|r| r.strip_prefix('.')) {
            Some(suffix) => (name, suffix),
            None => return false,
        },
        None => match rest.rsplit_once('.') {
            Some(split) => split,
            None => return false,
        },
    };
    let parts: Vec<&str> = suffix.split('-').collect();
    !name.is_empty()
        && parts.len() == 3
        && parts[0].bytes().all(|b| b.is_ascii_digit())
        && parts[1].bytes().all(|b| b.is_ascii_digit())
        && parts[2].len() == 16
        && parts[2].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Remove the temp files a killed writer of `file_name` left in `dir`. Only under the lock
/// that every writer of that file holds.
fn remove_stale_temps(dir: &Path, file_name: &str) {
    remove_temps_where(dir, |entry| is_temp_of(entry, Some(file_name)));
}

/// Remove every temp file [`atomic_write`] left anywhere under `dir`. Only under a lock that
/// every writer under `dir` holds.
pub(crate) fn remove_stale_temps_under(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            remove_stale_temps_under(&entry.path());
        } else if kind.is_file() && is_temp_of(&entry.file_name().to_string_lossy(), None) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn remove_temps_where(dir: &Path, stale: impl Fn(&str) -> bool) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if stale(&entry.file_name().to_string_lossy())
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Read a file, `None` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_exactly() {
        let temp = format!(".keel.lock.{}.tmp", unique_suffix());
        assert!(is_temp_of(&temp, Some("keel.lock")));
        assert!(is_temp_of(&temp, None));
        assert!(!is_temp_of(&temp, Some("keel")));
        assert!(!is_temp_of(".keel.lock.tmp", Some("keel.lock")));
        assert!(!is_temp_of("keel.lock", None));
        assert!(!is_temp_of(".keel.lock.lock", None));
        assert!(!is_temp_of(".notes.1-2-nothex.tmp", None));
    }

    #[test]
    fn a_locked_update_removes_a_killed_writers_temp_files_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("config.toml");
        let stale = dir
            .path()
            .join(format!(".config.toml.{}.tmp", unique_suffix()));
        let other = dir
            .path()
            .join(format!(".other.toml.{}.tmp", unique_suffix()));
        fs::write(&stale, "half").expect("stale");
        fs::write(&other, "someone else's").expect("other");
        let lock = lock_for_update(&target).expect("locks");
        assert!(!stale.exists(), "the killed writer's temp file is removed");
        assert!(other.exists(), "another file's temp file is left alone");
        atomic_write(&target, b"x = 1\n", true).expect("writes");
        drop(lock);
        assert_eq!(fs::read(&target).expect("reads"), b"x = 1\n");
    }

    #[test]
    fn the_lock_excludes_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("keel.lock");
        let first = lock_for_update(&target).expect("locks");
        let second = File::options()
            .write(true)
            .open(lock_path_for(&target))
            .expect("opens the lock file");
        assert!(matches!(second.try_lock(), Err(TryLockError::WouldBlock)));
        drop(first);
        second
            .try_lock()
            .expect("free once the first holder is gone");
    }
}
