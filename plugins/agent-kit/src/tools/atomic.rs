//! Atomic file replacement: write a temp file in the same directory, fsync it, rename it over
//! the target. A crash leaves either the old or the new content, never half of it.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `target` atomically, keeping an existing file's permissions.
///
/// Inside a WASI guest an existing file is rewritten in place instead: WASI has no permission
/// bits (`set_permissions` is unsupported), so a replacement file would get the default mode
/// and an executable script would lose its `x` bit. Writing in place keeps mode, owner and
/// links at the cost of atomicity; new files are still created atomically.
pub(crate) fn write_atomic(target: &Path, bytes: &[u8]) -> io::Result<()> {
    #[cfg(target_os = "wasi")]
    if target.is_file() {
        let mut file = OpenOptions::new().write(true).truncate(true).open(target)?;
        file.write_all(bytes)?;
        return file.sync_all();
    }
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let permissions = fs::metadata(target).ok().map(|m| m.permissions());

    let (tmp, mut file) = create_temp(dir, &name)?;
    let result = (|| {
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        if let Some(permissions) = permissions {
            fs::set_permissions(&tmp, permissions)?;
        }
        fs::rename(&tmp, target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, fs::File)> {
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.keel-tmp-{n}"));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            // Left over from an earlier run (the counter restarts per process): try the next.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < u64::MAX => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("f.txt");
        fs::write(dir.path().join(".f.txt.keel-tmp-0"), "stale").expect("stale temp");
        write_atomic(&target, b"one").expect("first write");
        write_atomic(&target, b"two").expect("second write");
        assert_eq!(fs::read_to_string(&target).expect("reads"), "two");
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
