//! What keel processes that died (SIGKILL, a power cut) left behind: the temp files of their
//! atomic writes, their command markers in the system's temp folder, the lock files of the sessions they ran. Each start sweeps the few places keel writes to
//! most ([`at_start`]: keel's home, its `running` and component cache folders, the workspace's
//! spill folder and the system's temp folder, one directory read each); `keel doctor --fix`
//! sweeps all of keel's home, the workspace and the memory folders ([`thorough`]).
//!
//! A file is removed only when it is keel's and its owner is known to be gone:
//!
//! - keel's by its name (each family of temp file below names the pid of the process writing
//!   it), owned by the person, a regular file (a link is never followed or removed);
//! - gone: no process has that pid, or the one that has it started after the file last
//!   changed (a pid used again by a later process is not the writer); a command marker also
//!   carries its keel's `flock` for its life, so one held is never removed whatever its pid
//!   says (a keel in another PID namespace sharing the temp folder);
//! - without a pid (a memory folder's `.keeltmp`, written inside WASI): only holding the
//!   folder's lock, which every writer holds.

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use keel_agent_kit::memory_store;

/// The command markers' names begin with this and the pid of the keel that made them
/// (`keel_kernel::sandbox::runner`).
const MARKER_PREFIX: &str = "keel-cwd-";
/// Entries [`thorough`] looks at in one tree at most.
const THOROUGH_ENTRIES: usize = 200_000;
/// Folders of a workspace [`thorough`] does not descend into: keel writes nothing there.
const NOT_KEELS: &[&str] = &[".git", ".hg", ".jj", ".svn", "node_modules", "target"];

/// What a sweep removed.
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<PathBuf>,
}

/// The cheap sweep of each start: the top of keel's `home`, its `running` locks and
/// component `cache`, the `workspace`'s spill folder and the system's temp folder.
pub fn at_start(home: &Path, cache: &Path, workspace: &Path) -> Swept {
    let owners = Owners::new();
    let mut swept = Swept::default();
    for dir in [home, cache, &workspace.join(".keel/spill")] {
        sweep_temps_in(dir, &owners, &mut swept, |_| true);
    }
    sweep_running(&home.join("running"), &mut swept);
    sweep_system_temp(&std::env::temp_dir(), &owners, &mut swept);
    swept
}

/// `keel doctor --fix`: all of keel's `home` and the `workspace` (their temp files), the
/// memory folders (the person's, `user_memory`, and the project's: the `.keeltmp` files of
/// writers that died), the session locks and the system's temp folder.
pub fn thorough(home: &Path, workspace: &Path, user_memory: &Path) -> Swept {
    let owners = Owners::new();
    let mut swept = Swept::default();
    // In the workspace, only what keel writes there: anything under `.keel`, and a restore's
    // files beside the person's (a name of theirs is never taken for keel's).
    let keels = workspace.join(".keel");
    for root in [home, workspace] {
        let mut stack = vec![root.to_path_buf()];
        let mut seen = 0usize;
        while let Some(dir) = stack.pop() {
            if root == home || dir.starts_with(&keels) {
                sweep_temps_in(&dir, &owners, &mut swept, |_| true);
            } else {
                sweep_temps_in(&dir, &owners, &mut swept, |n| {
                    n.starts_with(".keel-restore-")
                });
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > THOROUGH_ENTRIES {
                    break;
                }
                let skip = entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| NOT_KEELS.contains(&n));
                if !skip && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }
    sweep_running(&home.join("running"), &mut swept);
    sweep_system_temp(&std::env::temp_dir(), &owners, &mut swept);
    let project = Path::new(crate::commands::memory::PROJECT_DIR);
    let locks = [
        crate::home_locks::OsLock::at(&user_memory.join(memory_store::LOCK_FILE), Duration::ZERO)
            .map(|lock| (lock, user_memory.to_path_buf())),
        // Opened without following a link: a clone's `.keel/memory` may lead anywhere.
        crate::home_locks::OsLock::beneath(
            workspace,
            project,
            memory_store::LOCK_FILE,
            Duration::ZERO,
        )
        .map(|lock| (lock, workspace.join(project))),
    ];
    for (_lock, dir) in locks.into_iter().flatten() {
        sweep_memory_folder(&dir, &mut swept);
    }
    swept
}

/// The pid a keel temp file's `name` says its writer had, for each family keel writes:
///
/// - `.<file>.<pid>-<n>-<unique>.tmp`: keel's atomic writes in its home (`keel_registry`:
///   config, lockfile, trust, plugins) and the spilled tool outputs of the workspace;
/// - `.<pid>-<n>-<ns>.tmp` and `.keel-restore-<pid>-<n>-<ns>.tmp`: the checkpoint store and a
///   restore's files;
/// - `.<16 hex>.<pid>.<n>.tmp` and `.mac.<pid>.<n>.tmp`: the component cache;
/// - `.<file>.tmp-<pid>-<n>`: the approvals store.
fn temp_owner(name: &str) -> Option<i32> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let body = name.strip_prefix('.')?;
    if let Some((file, rest)) = body.rsplit_once(".tmp-") {
        let (pid, n) = rest.split_once('-')?;
        return (!file.is_empty() && digits(n)).then(|| pid.parse().ok())?;
    }
    let body = body.strip_suffix(".tmp")?;
    let dotted: Vec<&str> = body.split('.').collect();
    if let [head, pid, n] = dotted[..]
        && (head == "mac" || (head.len() == 16 && head.bytes().all(|b| b.is_ascii_hexdigit())))
        && digits(n)
    {
        return pid.parse().ok();
    }
    let tail = body.rsplit('.').next()?;
    let tail = tail.strip_prefix("keel-restore-").unwrap_or(tail);
    let parts: Vec<&str> = tail.split('-').collect();
    match parts[..] {
        [pid, n, unique]
            if digits(pid)
                && digits(n)
                && !unique.is_empty()
                && unique.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            pid.parse().ok()
        }
        _ => None,
    }
}

/// Remove the temp files of gone writers directly in `dir` whose name passes `family`.
fn sweep_temps_in(dir: &Path, owners: &Owners, swept: &mut Swept, family: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .filter(|n| family(n))
            .and_then(temp_owner)
        else {
            continue;
        };
        let path = entry.path();
        if let Some(meta) = persons_file(&path)
            && owners.gone(pid, &meta)
            && std::fs::remove_file(&path).is_ok()
        {
            swept.removed.push(path);
        }
    }
}

/// The metadata of `path` when it is a regular file (not a link) of the person's.
fn persons_file(path: &Path) -> Option<std::fs::Metadata> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    (meta.is_file() && meta.uid() == nix::unistd::geteuid().as_raw()).then_some(meta)
}

/// Command markers in the system's temp folder whose keel is gone and that no keel holds.
fn sweep_system_temp(dir: &Path, owners: &Owners, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix(MARKER_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        if let Some(meta) = persons_file(&path)
            && owners.gone(pid, &meta)
            && !held(&path)
            && std::fs::remove_file(&path).is_ok()
        {
            swept.removed.push(path);
        }
    }
}

/// Whether another process holds a `flock` on the file at `path`.
fn held(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt as _;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    else {
        return true;
    };
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Session lock files (`running/<id>.lock`) no process holds: a killed keel's. Removed while
/// locked, as their holder removes them (`session::running`).
fn sweep_running(dir: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lock") || persons_file(&path).is_none() {
            continue;
        }
        if let Some(_locked) = lock_now(&path)
            && std::fs::remove_file(&path).is_ok()
        {
            swept.removed.push(path);
        }
    }
}

/// The file at `path` locked (`flock`, exclusive) if no one holds it now.
fn lock_now(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

/// The `.keeltmp` files of a memory folder, removed by the holder of the folder's lock (every
/// writer holds it while its temp file exists).
fn sweep_memory_folder(dir: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let path = entry.path();
        if name.starts_with('.')
            && name.ends_with(memory_store::TMP_SUFFIX)
            && persons_file(&path).is_some()
            && std::fs::remove_file(&path).is_ok()
        {
            swept.removed.push(path);
        }
    }
}

/// Whether the process a file names is gone.
struct Owners {
    /// When the machine started, to turn a process's start (in clock ticks since then) into a
    /// time; `None` when it cannot be known for sure, and then a live pid always counts as the
    /// file's owner.
    boot: Option<SystemTime>,
}

/// Clock ticks a second in `/proc/<pid>/stat` (`USER_HZ`, 100 on the architectures keel runs
/// on). Checked against keel's own start in [`Owners::new`] before it is relied on.
const TICKS: u64 = 100;

impl Owners {
    fn new() -> Owners {
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|stat| {
            let secs = stat
                .lines()
                .find_map(|l| l.strip_prefix("btime "))?
                .trim()
                .parse::<u64>()
                .ok()?;
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        });
        let owners = Owners { boot };
        // This process started moments ago: if its start does not come out so, the ticks are
        // not what they are taken for, and start times are not used.
        let own = owners.started(std::process::id() as i32);
        let now = SystemTime::now();
        let sane = own.is_some_and(|t| {
            t <= now + Duration::from_secs(2)
                && now.duration_since(t).unwrap_or_default() < Duration::from_secs(3600)
        });
        if sane { owners } else { Owners { boot: None } }
    }

    /// When process `pid` started, if it runs.
    fn started(&self, pid: i32) -> Option<SystemTime> {
        let boot = self.boot?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command's name, in parentheses, may hold spaces: the fields follow the last `)`.
        let after = &stat[stat.rfind(')')? + 1..];
        let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
        Some(boot + Duration::from_millis(ticks * 1000 / TICKS))
    }

    /// Whether the writer `pid` of the file described by `meta` is gone: no such process, or
    /// the process with that pid started after the file last changed.
    fn gone(&self, pid: i32, meta: &std::fs::Metadata) -> bool {
        if pid <= 0 {
            return false;
        }
        let running = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            != Err(nix::errno::Errno::ESRCH);
        if !running {
            return true;
        }
        // A second of slack for the ticks' and the file system's rounding.
        match (self.started(pid), meta.modified()) {
            (Some(started), Ok(changed)) => started > changed + Duration::from_secs(1),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keel_temp_names_give_their_writer_and_other_names_none() {
        for (name, pid) in [
            (".config.toml.4242-0-0123456789abcdef.tmp", 4242),
            (".keel.lock.17-3-00ff00ff00ff00ff.tmp", 17),
            (".4242-1-1700000000000000000.tmp", 4242),
            (".keel-restore-99-0-1700000000000000000.tmp", 99),
            (".0123456789abcdef.55.2.tmp", 55),
            (".mac.55.0.tmp", 55),
            (".approvals.json.tmp-808-3", 808),
            (".call-1.txt.31-0-a1B2c3.tmp", 31),
        ] {
            assert_eq!(temp_owner(name), Some(pid), "{name}");
        }
        for name in [
            "config.toml",
            ".config.toml",
            ".tmp",
            ".tmpAbC123",
            "notes.tmp",
            ".notes.tmp",
            ".config.toml.x-0-0123.tmp",
            ".MEMORY.md.4194304-0-0123456789abcdef.keeltmp",
            ".a.b.c.tmp",
            ".approvals.json.tmp-x-3",
        ] {
            assert_eq!(temp_owner(name), None, "{name}");
        }
    }

    #[test]
    fn a_live_writer_keeps_its_file_and_a_pid_used_again_does_not() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let owners = Owners::new();
        assert!(owners.boot.is_some(), "start times are known here");
        let me = std::process::id() as i32;
        let file = dir.path().join("f");
        std::fs::write(&file, "x")?;
        let meta = std::fs::metadata(&file)?;
        assert!(!owners.gone(me, &meta));
        // Last changed before this process started: not this process's.
        File::options()
            .write(true)
            .open(&file)?
            .set_modified(SystemTime::now() - Duration::from_secs(3 * 3600))?;
        assert!(owners.gone(me, &std::fs::metadata(&file)?));
        Ok(())
    }
}
