//! Atomic file replacement: write a temp file in the same directory, fsync it, rename it over
//! the target, fsync the directory. A crash, a kill or a full disk leaves either the old or the
//! new content, never half of it (nor an empty file); a failed write removes its temp file.
//!
//! An existing file keeps its permission bits. Natively the temp file is given them before
//! the rename. Inside a WASI guest nothing can read or set a mode, so the kernel's
//! `rename-at` gives the renamed file the mode of the one it replaces
//! (`keel-kernel`'s `wasm_host/keep_mode.rs`).
//!
//! Temp files are named `.<name>.keel-tmp-<unique>`. A killed write leaves one behind; the next
//! write of the same file removes it, and any write in that directory removes those over an
//! hour old.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Marks keel's temp files: `.<name>` + this + a unique suffix.
const TEMP_MARK: &str = ".keel-tmp-";

/// A temp file of another name older than this is a killed write's, not one in progress.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// Writes `bytes` to `target` atomically, keeping an existing file's permissions.
pub(crate) fn write_atomic(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    remove_leftovers(dir, &name);
    imp::write_atomic(dir, &name, target, bytes)
}

/// A temp file name for `name` that no other write uses.
fn temp_name(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".{name}{TEMP_MARK}{:x}-{n}", imp::unique())
}

/// Remove temp files a killed write left in `dir`: every one of `name` (a write of the same
/// file at the same moment is a lost update anyway, and its rename then fails cleanly), and
/// the abandoned ones of other files.
fn remove_leftovers(dir: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let own = format!(".{name}{TEMP_MARK}");
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let entry_name = entry.file_name();
        let entry_name = entry_name.to_string_lossy();
        if !entry_name.starts_with('.') || !entry_name.contains(TEMP_MARK) {
            continue;
        }
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let abandoned = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > ABANDONED_AFTER);
        if entry_name.starts_with(&own) || abandoned {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(not(all(target_os = "wasi", target_env = "p2")))]
mod imp {
    use std::fs::{self, File, OpenOptions};
    use std::io::{self, Write};
    use std::path::{Path, PathBuf};

    pub(super) fn unique() -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        (u64::from(std::process::id()) << 32) | u64::from(nanos)
    }

    pub(super) fn write_atomic(
        dir: &Path,
        name: &str,
        target: &Path,
        bytes: &[u8],
    ) -> io::Result<()> {
        let permissions = fs::metadata(target).ok().map(|m| m.permissions());
        let (tmp, mut file) = create_temp(dir, name)?;
        let result = (|| {
            file.write_all(bytes)?;
            file.sync_all()?;
            drop(file);
            if let Some(permissions) = permissions {
                fs::set_permissions(&tmp, permissions)?;
            }
            fs::rename(&tmp, target)?;
            // The rename itself on disk; a failure here leaves the new content in place.
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
        loop {
            let tmp = dir.join(super::temp_name(name));
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => return Ok((tmp, file)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(all(target_os = "wasi", target_env = "p2"))]
pub(crate) use imp::preopen_of;

/// Inside a WASI 0.2 guest the file is written through the descriptor's `write` (positioned,
/// run on the calling thread by the host) rather than std's streams: its error codes say what
/// went wrong (a full disk is `insufficient-space`, where a stream reports only "I/O error").
#[cfg(all(target_os = "wasi", target_env = "p2"))]
mod imp {
    use std::io;
    use std::path::{Component, Path};

    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{Descriptor, DescriptorFlags, ErrorCode, OpenFlags, PathFlags};

    /// The most one `write` call hands the host.
    const CHUNK: usize = 1 << 20;

    pub(super) fn unique() -> u64 {
        wasip2::random::random::get_random_u64()
    }

    /// An `io::Error` that says what happened in words a person acts on.
    fn error(what: &str, code: ErrorCode) -> io::Error {
        let kind = match code {
            ErrorCode::InsufficientSpace => {
                return io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("{what}: no space left on the device"),
                );
            }
            ErrorCode::Quota => {
                return io::Error::new(
                    io::ErrorKind::QuotaExceeded,
                    format!("{what}: the disk quota is used up"),
                );
            }
            ErrorCode::Exist => io::ErrorKind::AlreadyExists,
            ErrorCode::NoEntry => io::ErrorKind::NotFound,
            ErrorCode::Access | ErrorCode::NotPermitted => io::ErrorKind::PermissionDenied,
            ErrorCode::ReadOnly => io::ErrorKind::ReadOnlyFilesystem,
            ErrorCode::IsDirectory => io::ErrorKind::IsADirectory,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, format!("{what}: {}", code.message()))
    }

    /// The preopened directory holding `path` (the longest match) and the plain path below it
    /// (no `..`, no root): how a guest opens a file by the path it was granted under.
    pub(crate) fn preopen_of(path: &Path) -> io::Result<(Descriptor, String)> {
        let (dir, rest) = get_directories()
            .into_iter()
            .filter_map(|(dir, name)| {
                let rest = path.strip_prefix(&name).ok()?.to_path_buf();
                Some((name.len(), dir, rest))
            })
            .max_by_key(|(len, _, _)| *len)
            .map(|(_, dir, rest)| (dir, rest))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} is not inside a granted directory", path.display()),
                )
            })?;
        if rest
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} must be a plain path below its directory",
                    path.display()
                ),
            ));
        }
        let rest = rest
            .to_str()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path is not UTF-8"))?;
        Ok((dir, rest.to_owned()))
    }

    pub(super) fn write_atomic(
        _dir: &Path,
        name: &str,
        target: &Path,
        bytes: &[u8],
    ) -> io::Result<()> {
        let (root, rel) = preopen_of(target)?;
        let parent = rel.rsplit_once('/').map(|(parent, _)| parent);
        let (tmp, file) = loop {
            let tmp_name = super::temp_name(name);
            let tmp = match parent {
                Some(parent) => format!("{parent}/{tmp_name}"),
                None => tmp_name,
            };
            match root.open_at(
                PathFlags::empty(),
                &tmp,
                OpenFlags::CREATE | OpenFlags::EXCLUSIVE,
                DescriptorFlags::WRITE,
            ) {
                Ok(file) => break (tmp, file),
                Err(ErrorCode::Exist) => continue,
                Err(e) => return Err(error("creating the temp file", e)),
            }
        };
        let result = (|| {
            let mut offset = 0u64;
            for chunk in bytes.chunks(CHUNK) {
                let mut done = 0;
                while done < chunk.len() {
                    let wrote = file
                        .write(&chunk[done..], offset)
                        .map_err(|e| error("writing", e))?;
                    if wrote == 0 {
                        return Err(io::Error::from(io::ErrorKind::WriteZero));
                    }
                    done += wrote as usize;
                    offset += wrote;
                }
            }
            file.sync().map_err(|e| error("syncing", e))?;
            drop(file);
            root.rename_at(&tmp, &root, &rel)
                .map_err(|e| error("replacing the file", e))?;
            // The rename itself on disk; a failure here leaves the new content in place.
            if let Ok(dir) = root.open_at(
                PathFlags::empty(),
                parent.unwrap_or("."),
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ,
            ) {
                let _ = dir.sync();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = root.unlink_file_at(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_content_and_removes_a_killed_writes_temp_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("f.txt");
        fs::write(dir.path().join(".f.txt.keel-tmp-0"), "stale").expect("stale temp");
        fs::write(dir.path().join(".g.txt.keel-tmp-0"), "in progress").expect("other temp");
        write_atomic(&target, b"one").expect("first write");
        write_atomic(&target, b"two").expect("second write");
        assert_eq!(fs::read_to_string(&target).expect("reads"), "two");
        // Another file's fresh temp file may be a write in progress: kept.
        assert_eq!(names(dir.path()), vec![".g.txt.keel-tmp-0", "f.txt"]);
    }

    #[test]
    fn an_abandoned_temp_file_of_another_name_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = dir.path().join(".g.txt.keel-tmp-0");
        let file = fs::File::create(&old).expect("old temp");
        file.set_modified(SystemTime::now() - ABANDONED_AFTER * 2)
            .expect("backdates");
        drop(file);
        write_atomic(&dir.path().join("f.txt"), b"x").expect("writes");
        assert_eq!(names(dir.path()), vec!["f.txt"]);
    }

    #[cfg(unix)]
    #[test]
    fn an_existing_files_mode_is_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("run.sh");
        fs::write(&script, "#!/bin/sh\n").expect("writes");
        fs::set_permissions(&script, fs::Permissions::from_mode(0o751)).expect("chmod");
        write_atomic(&script, b"#!/bin/sh\necho hi\n").expect("replaces");
        let mode = fs::metadata(&script).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o751);
    }

    /// A write that fails midway (here: the target is a directory, so the rename fails after
    /// the temp file was written) leaves the old state and no temp file.
    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("d");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("inside"), "kept").expect("writes");
        assert!(write_atomic(&target, b"new").is_err());
        assert_eq!(names(dir.path()), vec!["d"]);
        assert_eq!(
            fs::read_to_string(target.join("inside")).expect("reads"),
            "kept"
        );
    }
}
