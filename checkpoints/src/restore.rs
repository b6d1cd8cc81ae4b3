//! Bringing the workspace from one recorded state to another.
//!
//! [`plan`] compares the current tree's manifest with the target's; [`apply`] carries the
//! plan out. Every path is checked to stay inside the workspace (relative, no `..`), and every
//! change is made through a directory opened component by component from the workspace with
//! `O_NOFOLLOW`: a link where a directory is expected (planted there, or made by a command) is
//! never followed, so a restore writes, removes and changes modes only inside the workspace.
//! Files are written to a temp name in their directory and renamed over the path, so a link
//! there is replaced, never written through. Directories are only ever removed empty: one that
//! still holds what checkpoints do not track (ignored files) stays, and is reported.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use crate::snapshot::{Manifest, Node};
use crate::store::{Store, temp_name};
use crate::{Error, Result};

/// One change a restore makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Remove a file or link.
    Remove(String),
    /// Remove an (empty) directory.
    RemoveDir(String),
    /// Make a directory (its mode is set after its contents).
    MakeDir(String),
    /// Write a file with this content hash and mode.
    Write {
        /// Where.
        path: String,
        /// The stored content.
        hash: String,
        /// Its mode.
        mode: u32,
    },
    /// Make a link.
    Link {
        /// Where.
        path: String,
        /// Its target, as recorded.
        target: String,
    },
    /// Set a directory's mode.
    DirMode {
        /// The directory.
        path: String,
        /// Its mode.
        mode: u32,
    },
}

impl Change {
    /// The path it changes.
    pub fn path(&self) -> &str {
        match self {
            Change::Remove(p) | Change::RemoveDir(p) | Change::MakeDir(p) => p,
            Change::Write { path, .. }
            | Change::Link { path, .. }
            | Change::DirMode { path, .. } => path,
        }
    }
}

/// What a restore from `current` to `target` does, in the order it does it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The changes, in order: removals deepest first, directories made shallowest first,
    /// files and links, then directory modes deepest first.
    pub changes: Vec<Change>,
}

impl Plan {
    /// The paths the plan touches (every change but a directory's mode alone).
    pub fn paths(&self) -> BTreeSet<String> {
        self.changes.iter().map(|c| c.path().to_owned()).collect()
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Lines for a person: `+ path` made, `- path` removed, `~ path` changed.
    pub fn describe(&self, current: &Manifest) -> Vec<String> {
        let mut out = Vec::new();
        let removed: BTreeSet<&str> = self
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::Remove(p) | Change::RemoveDir(p) => Some(p.as_str()),
                _ => None,
            })
            .collect();
        for change in &self.changes {
            let (sign, path) = match change {
                Change::Remove(p) | Change::RemoveDir(p) => ('-', p),
                Change::MakeDir(p) => ('+', p),
                Change::Write { path, .. } | Change::Link { path, .. } => {
                    if current.entries.contains_key(path) && !removed.contains(path.as_str()) {
                        ('~', path)
                    } else {
                        ('+', path)
                    }
                }
                Change::DirMode { path, .. } => {
                    if current.entries.contains_key(path) && !removed.contains(path.as_str()) {
                        ('~', path)
                    } else {
                        continue;
                    }
                }
            };
            let suffix = match change {
                Change::RemoveDir(_) | Change::MakeDir(_) | Change::DirMode { .. } => "/",
                _ => "",
            };
            // A name holding a newline would read as two entries: quoted as the model sees it.
            let path = keel_sanitize::sanitize::one_line_name(path).unwrap_or_else(|| path.clone());
            out.push(format!("{sign} {path}{suffix}"));
        }
        out
    }
}

/// Check that `path` is a plain relative path inside the workspace.
pub fn check_path(path: &str) -> Result<Vec<&str>> {
    let parts: Vec<&str> = path.split('/').collect();
    if path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(Error(format!(
            "`{path}` is not a path inside the workspace; the checkpoint is refused"
        )));
    }
    Ok(parts)
}

/// The changes that bring `current` to `target`.
pub fn plan(current: &Manifest, target: &Manifest) -> Result<Plan> {
    for path in current.entries.keys().chain(target.entries.keys()) {
        check_path(path)?;
    }
    let mut changes = Vec::new();
    // Removals, deepest first (a child sorts after its parent, so reverse order works).
    for (path, node) in current.entries.iter().rev() {
        let keep = match (node, target.entries.get(path)) {
            (Node::Dir { .. }, Some(Node::Dir { .. })) => true,
            // A file or link of the target is renamed over the old one, which stays until then.
            (
                Node::File { .. } | Node::Symlink { .. },
                Some(Node::File { .. } | Node::Symlink { .. }),
            ) => true,
            _ => false,
        };
        if !keep {
            changes.push(match node {
                Node::Dir { .. } => Change::RemoveDir(path.clone()),
                _ => Change::Remove(path.clone()),
            });
        }
    }
    // Directories, shallowest first.
    for (path, node) in &target.entries {
        if let Node::Dir { .. } = node
            && !matches!(current.entries.get(path), Some(Node::Dir { .. }))
        {
            changes.push(Change::MakeDir(path.clone()));
        }
    }
    for (path, node) in &target.entries {
        let same = current.entries.get(path).is_some_and(|c| c.same_as(node));
        match node {
            Node::File { mode, hash, .. } if !same => changes.push(Change::Write {
                path: path.clone(),
                hash: hash.clone(),
                mode: *mode,
            }),
            Node::Symlink { target } if !same => changes.push(Change::Link {
                path: path.clone(),
                target: target.clone(),
            }),
            _ => {}
        }
    }
    for (path, node) in target.entries.iter().rev() {
        if let Node::Dir { mode } = node
            && !current.entries.get(path).is_some_and(|c| c.same_as(node))
        {
            changes.push(Change::DirMode {
                path: path.clone(),
                mode: *mode,
            });
        }
    }
    Ok(Plan { changes })
}

/// What applying a plan did not manage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Changes made.
    pub done: usize,
    /// Changes not made, each with why.
    pub failed: Vec<String>,
}

/// Carry out `plan` in `workspace`, file contents from `store`. Each change is independent: a
/// failure is reported and the rest still run.
pub fn apply(store: &Store, workspace: &Path, plan: &Plan) -> Result<Applied> {
    apply_tagged(store, workspace, plan, &crate::store::unique())
}

/// The start of the names of the temp files a restore tagged `tag` writes beside each path.
pub(crate) fn temp_prefix(tag: &str) -> String {
    format!(".keel-restore-{tag}-")
}

/// [`apply`], its temp files named from `tag` ([`temp_prefix`]): a rewind records the tag
/// before it starts, so the temp file a rewind killed mid-write leaves is known as keel's own
/// by its name and place ([`remove_temp_files`]).
pub(crate) fn apply_tagged(
    store: &Store,
    workspace: &Path,
    plan: &Plan,
    tag: &str,
) -> Result<Applied> {
    let root = nix::fcntl::open(
        workspace,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        Error(format!(
            "opening the workspace {}: {e}",
            workspace.display()
        ))
    })?;
    let mut applied = Applied::default();
    let prefix = temp_prefix(tag);
    for change in &plan.changes {
        match apply_one(store, &root, change, &prefix) {
            Ok(()) => applied.done += 1,
            Err(e) => applied.failed.push(format!("{}: {e}", change.path())),
        }
    }
    Ok(applied)
}

fn apply_one(store: &Store, root: &OwnedFd, change: &Change, prefix: &str) -> Result<()> {
    let path = change.path();
    let parts = check_path(path)?;
    let (name, parents) = parts
        .split_last()
        .ok_or_else(|| Error("empty path".into()))?;
    let dir = open_parent(root, parents, path)?;
    let fail = |what: &str, e: Errno| Error(format!("cannot {what} ({e})"));
    match change {
        Change::Remove(_) => match unlinkat(&dir, *name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(fail("remove it", e)),
        },
        Change::RemoveDir(_) => match unlinkat(&dir, *name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => Err(Error(
                "left in place: it holds files checkpoints do not track (ignored or too large)"
                    .into(),
            )),
            Err(e) => Err(fail("remove the directory", e)),
        },
        Change::MakeDir(_) => match mkdirat(&dir, *name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST)
                if openat(
                    &dir,
                    *name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .is_ok() =>
            {
                // A directory the walk did not record (ignored): already what is wanted.
                Ok(())
            }
            Err(Errno::EEXIST) => {
                // Whatever is there (a file the plan did not know of, a link) is replaced.
                unlinkat(&dir, *name, UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| fail("replace what is there with a directory", e))?;
                mkdirat(&dir, *name, Mode::from_bits_truncate(0o700))
                    .map_err(|e| fail("make the directory", e))
            }
            Err(e) => Err(fail("make the directory", e)),
        },
        Change::Write { hash, mode, .. } => {
            let content = store.blob(hash)?;
            let tmp = temp_name(prefix);
            let fd = openat(
                &dir,
                tmp.as_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(|e| fail("write it", e))?;
            let mut file = File::from(fd);
            let written = file
                .write_all(&content)
                .map_err(|e| Error(format!("cannot write it ({e})")))
                .and_then(|()| {
                    fchmod(file.as_fd(), Mode::from_bits_truncate(*mode))
                        .map_err(|e| fail("set its mode", e))
                })
                .and_then(|()| {
                    file.sync_data()
                        .map_err(|e| Error(format!("cannot sync it ({e})")))
                })
                .and_then(|()| {
                    #[cfg(debug_assertions)]
                    killed_before_a_rename();
                    renameat(&dir, tmp.as_str(), &dir, *name)
                        .map_err(|e| fail("put it in place", e))
                });
            if written.is_err() {
                let _ = unlinkat(&dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            }
            written
        }
        Change::Link { target, .. } => {
            let tmp = temp_name(prefix);
            symlinkat(target.as_str(), &dir, tmp.as_str()).map_err(|e| fail("make the link", e))?;
            renameat(&dir, tmp.as_str(), &dir, *name).map_err(|e| {
                let _ = unlinkat(&dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
                fail("put the link in place", e)
            })
        }
        Change::DirMode { mode, .. } => {
            let fd = openat(
                &dir,
                *name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| not_followed(e, path))?;
            fchmod(&fd, Mode::from_bits_truncate(*mode)).map_err(|e| fail("set its mode", e))
        }
    }
}

/// A fault for the tests of an interrupted rewind, in debug builds only: with
/// `KEEL_FAULT_REWIND_KILLED_AT_WRITE=N`, the process kills itself (SIGKILL, as `kill -9`
/// does) when the Nth file of a restore is written and synced under its temp name, before it
/// is renamed into place.
#[cfg(debug_assertions)]
fn killed_before_a_rename() {
    static WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Some(at) = std::env::var("KEEL_FAULT_REWIND_KILLED_AT_WRITE")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return;
    };
    if WRITES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == at {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Remove the temp files a restore tagged `tag` may have left beside the paths `plan` writes
/// (it was killed between writing one and renaming it into place); how many. Only names that
/// start with the tag's prefix, in directories opened from the workspace without following a
/// link.
pub(crate) fn remove_temp_files(workspace: &Path, plan: &Plan, tag: &str) -> usize {
    let Ok(root) = nix::fcntl::open(
        workspace,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let prefix = temp_prefix(tag);
    let parents: BTreeSet<&str> = plan
        .changes
        .iter()
        .filter(|c| matches!(c, Change::Write { .. } | Change::Link { .. }))
        .map(|c| c.path().rsplit_once('/').map_or("", |(parent, _)| parent))
        .collect();
    let mut removed = 0;
    for parent in parents {
        let parts: Vec<&str> = if parent.is_empty() {
            Vec::new()
        } else {
            parent.split('/').collect()
        };
        let Ok(dir) = open_parent(&root, &parts, parent) else {
            continue;
        };
        // The directory the descriptor holds, listed through its /proc name (no link on the
        // way: the descriptor is fixed), each match removed beneath the descriptor.
        use std::os::fd::AsRawFd as _;
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.starts_with(&prefix))
                && unlinkat(&dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

fn not_followed(e: Errno, path: &str) -> Error {
    match e {
        Errno::ELOOP | Errno::ENOTDIR => Error(format!(
            "`{path}` is reached through a link or something that is not a directory; a \
             restore never follows a link, so it was not changed"
        )),
        e => Error(format!("cannot open `{path}` ({e})")),
    }
}

/// The directory holding `path`: each of `parents` opened from `root` with `O_NOFOLLOW`, so a
/// link anywhere on the way is refused instead of followed out of the workspace.
pub fn open_parent(root: &OwnedFd, parents: &[&str], path: &str) -> Result<OwnedFd> {
    let mut dir = root.try_clone().map_err(|e| Error(format!("{e}")))?;
    for part in parents {
        dir = openat(
            &dir,
            *part,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| not_followed(e, path))?;
    }
    Ok(dir)
}
