//! Locks the OS lets go of when their holder dies: an exclusive `flock` on a lock file, for
//! the shared files keel reads, changes and writes back (the memory folders, the approvals of a
//! workspace's skills and memory). A keel killed with SIGKILL releases its lock at that moment,
//! so the next writer never waits for a lock nobody holds; and a lock has no age, so a slow
//! writer never has its lock taken over by a second one.
//!
//! The `memory` plugin is a WebAssembly component and WASI has no `flock`: the host takes the
//! folder's lock around each call of the plugin that writes memory (its `remember` tool), by
//! wrapping the plugin's instances ([`serve_memory_locked`]). The plugin itself takes no lock;
//! `keel memory consolidate --apply` takes the same one.
//!
//! A lock file stays once made: removing it while another process waits on it would let two
//! writers in (the second locks a file no longer at the path).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_agent_kit::memory_store;
use keel_kernel::{
    CallChain, Event, GuardVerdict, HostHandle, InstanceError, PluginError, PluginInstance,
    PluginPackage, PluginSource, ServiceAnswer, ServiceCall,
};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// How long a `remember` waits for another keel writing the same memory folder (a write
/// holds it for milliseconds; `consolidate --apply` for as long as its few writes take).
const REMEMBER_WAIT: Duration = Duration::from_secs(5);

/// An exclusive `flock` on a lock file, held until dropped (the OS drops it too when the
/// process ends, however it ends).
#[derive(Debug)]
pub struct OsLock {
    _file: File,
}

impl OsLock {
    /// Lock the file `path` (made 0600 when missing; a link there is refused, not followed),
    /// waiting at most `wait` for another process holding it.
    pub fn at(path: &Path, wait: Duration) -> Result<OsLock, String> {
        let parent = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .ok_or_else(|| format!("{} names no lock file", path.display()))?;
        let dir = open_dir(parent, OFlag::empty())
            .map_err(|e| format!("cannot open {}: {e}", parent.display()))?;
        OsLock::in_dir(&dir, Path::new(name), path, wait)
    }

    /// Lock the file `name` of the directory open as `dir` (`shown` names it in errors).
    fn in_dir(
        dir: &impl AsFd,
        name: &Path,
        shown: &Path,
        wait: Duration,
    ) -> Result<OsLock, String> {
        let fd = nix::fcntl::openat(
            dir,
            name,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ELOOP => format!(
                "cannot lock {}: it is a link; remove it (keel makes its own lock files)",
                shown.display()
            ),
            e => format!("cannot lock {}: {e}", shown.display()),
        })?;
        let file = File::from(fd);
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(OsLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < wait => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(format!(
                        "busy: another keel is writing here (it holds {}); try again in a \
                         moment",
                        shown.display()
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("cannot lock {}: {e}", shown.display()));
                }
            }
        }
    }

    /// Lock `<root>/<folder>/<file>`, opening every directory below `root` without following
    /// a link (`.keel/memory` of a cloned repository may be one: the lock file is then not made
    /// wherever it leads).
    pub fn beneath(
        root: &Path,
        folder: &Path,
        file: &str,
        wait: Duration,
    ) -> Result<OsLock, String> {
        let shown = root.join(folder).join(file);
        let mut dir = open_dir(root, OFlag::empty())
            .map_err(|e| format!("cannot open {}: {e}", root.display()))?;
        for part in folder.components() {
            let Component::Normal(part) = part else {
                return Err(format!("{} is not a plain folder", folder.display()));
            };
            dir = nix::fcntl::openat(
                &dir,
                part,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => format!(
                    "{} is a link or not a folder: keel writes no memory through it",
                    root.join(folder).display()
                ),
                e => format!("cannot open {}: {e}", root.join(folder).display()),
            })?;
        }
        OsLock::in_dir(&dir, Path::new(file), &shown, wait)
    }
}

fn open_dir(path: &Path, extra: OFlag) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | extra,
        Mode::empty(),
    )
}

/// Where the `memory` plugin's folders are on the host: the project's below the workspace,
/// the person's in keel's data directory.
#[derive(Clone, Debug)]
struct MemoryFolders {
    workspace: PathBuf,
    user: PathBuf,
}

impl MemoryFolders {
    /// The lock of the folder a `remember` with `input` writes; `None` when the input names no
    /// folder (the plugin refuses it without writing).
    fn lock_for(&self, input: &str) -> Option<Result<OsLock, String>> {
        let input: serde_json::Value = serde_json::from_str(input).ok()?;
        match input.get("scope").and_then(serde_json::Value::as_str) {
            None | Some("project") => Some(OsLock::beneath(
                &self.workspace,
                Path::new(".keel/memory"),
                memory_store::LOCK_FILE,
                REMEMBER_WAIT,
            )),
            Some("user") => Some(OsLock::at(
                &self.user.join(memory_store::LOCK_FILE),
                REMEMBER_WAIT,
            )),
            Some(_) => None,
        }
    }
}

/// Serve the `memory` plugin of `package` (any other is left as it is) with the host holding
/// the memory folder's lock around each `remember`: `workspace` holds the project's folder,
/// `data_dir` the person's (`$KEEL_DATA/memory`).
pub fn serve_memory_locked(package: &mut PluginPackage, workspace: &Path, data_dir: &Path) {
    if package.manifest.name != "memory" {
        return;
    }
    package.source = Arc::new(LockedMemorySource {
        inner: package.source.clone(),
        folders: MemoryFolders {
            workspace: workspace.to_path_buf(),
            user: data_dir.join("memory"),
        },
    });
}

struct LockedMemorySource {
    inner: Arc<dyn PluginSource>,
    folders: MemoryFolders,
}

#[async_trait]
impl PluginSource for LockedMemorySource {
    async fn instantiate(
        &self,
        host: HostHandle,
    ) -> Result<Box<dyn PluginInstance>, InstanceError> {
        Ok(Box::new(LockedMemory {
            inner: self.inner.instantiate(host).await?,
            folders: self.folders.clone(),
        }))
    }
}

struct LockedMemory {
    inner: Box<dyn PluginInstance>,
    folders: MemoryFolders,
}

#[async_trait]
impl PluginInstance for LockedMemory {
    async fn activate(&mut self, chain: &CallChain, config: &str) -> Result<(), InstanceError> {
        self.inner.activate(chain, config).await
    }

    async fn deactivate(&mut self, chain: &CallChain) -> Result<(), InstanceError> {
        self.inner.deactivate(chain).await
    }

    async fn handle_call(
        &mut self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, InstanceError> {
        self.inner
            .handle_call(chain, service, method, payload)
            .await
    }

    async fn call_typed(
        &mut self,
        chain: &CallChain,
        call: &ServiceCall,
    ) -> Result<Option<ServiceAnswer>, InstanceError> {
        self.inner.call_typed(chain, call).await
    }

    async fn invoke_tool(
        &mut self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, InstanceError> {
        // `remember` is the one call of the plugin that writes; the lock is held until the
        // plugin's writes are renamed into place (or the call is stopped and dropped).
        let _lock = if name == "remember" {
            let folders = self.folders.clone();
            let input = input.to_owned();
            match tokio::task::spawn_blocking(move || folders.lock_for(&input)).await {
                Ok(Some(Ok(lock))) => Some(lock),
                Ok(Some(Err(why))) => {
                    return Err(InstanceError::Returned(PluginError::Unavailable(why)));
                }
                Ok(None) => None,
                Err(e) => {
                    return Err(InstanceError::Host(format!(
                        "keel could not lock the memory folder: {e}"
                    )));
                }
            }
        } else {
            None
        };
        self.inner.invoke_tool(chain, name, input).await
    }

    async fn on_event(&mut self, chain: &CallChain, event: &Event) -> Result<(), InstanceError> {
        self.inner.on_event(chain, event).await
    }

    async fn check_tool_call(
        &mut self,
        chain: &CallChain,
        guard: &str,
        tool: &str,
        input: &str,
    ) -> Result<GuardVerdict, InstanceError> {
        self.inner.check_tool_call(chain, guard, tool, input).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_a_link_is_not_followed() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join(".memory.lock");
        let first = OsLock::at(&path, Duration::ZERO)?;
        let busy = OsLock::at(&path, Duration::from_millis(20));
        assert!(busy.is_err_and(|e| e.contains("busy")));
        drop(first);
        drop(OsLock::at(&path, Duration::ZERO)?);

        // A clone's `.keel/memory` leading out of the workspace: no lock file made there.
        let ws = tempfile::tempdir().map_err(|e| e.to_string())?;
        let outside = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::create_dir(ws.path().join(".keel")).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(outside.path(), ws.path().join(".keel/memory"))
            .map_err(|e| e.to_string())?;
        let refused = OsLock::beneath(
            ws.path(),
            Path::new(".keel/memory"),
            ".memory.lock",
            Duration::ZERO,
        );
        assert!(refused.is_err_and(|e| e.contains("link")));
        assert!(!outside.path().join(".memory.lock").exists());
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("linked.lock"))
            .map_err(|e| e.to_string())?;
        assert!(OsLock::at(&dir.path().join("linked.lock"), Duration::ZERO).is_err());
        Ok(())
    }
}
