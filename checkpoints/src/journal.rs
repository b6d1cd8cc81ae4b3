//! The change journal: an inotify watch on every recorded directory of the workspace, so a
//! checkpoint re-reads only the paths changed since the last one instead of walking the
//! whole tree.
//!
//! The kernel queues an inotify event in the same system call that makes the change, so once
//! a command has exited (or a file tool returned), draining the queue yields every change it
//! made, whoever made it: a sandboxed command works on the same inodes through its bind
//! mounts. A directory watch reports what happens to the entries in it (created, deleted,
//! written, chmod-ed, renamed in or out) by name; the journal turns those into workspace
//! paths, and the recorder walks only them ([`crate::snapshot::Scope`]), reusing the last
//! manifest for the rest.
//!
//! Whenever that could miss something, the journal says "walk everything" instead
//! ([`Drained::Everything`]): the queue overflowed, a watch could not be added (the
//! person's `fs.inotify.max_user_watches`, or more directories than
//! [`DEFAULT_MAX_WATCHED_DIRS`]), the workspace itself was moved or removed, a `.gitignore`, a
//! `.git` or a repository's `info/exclude` changed (what is ignored changes for paths nobody
//! touched), a name is not UTF-8, or the queue could not be read. A new or moved-in
//! directory is not a reason: it is a dirty path, walked whole and watched as it is walked.
//! Regular files with more than one link are stat-ed at every checkpoint, as a write through
//! a name outside the watched directories reports nothing here.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};

use crate::snapshot::{OnDir, Scope};

/// The most directories the journal watches by default: inotify watches are a per-user
/// budget (`fs.inotify.max_user_watches`) the person's editor and tools share. A workspace
/// with more is walked whole at every checkpoint.
pub const DEFAULT_MAX_WATCHED_DIRS: usize = 16_384;

/// What a watch on a recorded directory reports. Links are never followed.
fn dir_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::DONT_FOLLOW
        | WatchMask::ONLYDIR
}

/// What a watch on a repository's git directory (or its `info`) reports: whatever happens to
/// `info`, `exclude` or `commondir` changes the ignore rules.
fn rules_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// What one watch is on.
#[derive(Debug, Clone)]
enum Watched {
    /// A recorded directory, by its path relative to the workspace ("" for the workspace).
    Dir(String),
    /// A repository's git directory or its `info` directory, where `info/exclude` lives.
    Rules,
}

struct Watchset {
    watches: Watches,
    by_wd: HashMap<WatchDescriptor, Watched>,
    limit: usize,
    /// Why a watch is missing, once one is: the journal cannot vouch for that directory.
    failed: Option<String>,
}

impl Watchset {
    fn add(&mut self, path: &Path, what: Watched) {
        if self.failed.is_some() {
            return;
        }
        let is_dir = matches!(what, Watched::Dir(_));
        if is_dir && self.by_wd.len() >= self.limit {
            self.failed = Some(format!(
                "the workspace has more than {} directories, the most the change journal \
                 watches",
                self.limit
            ));
            return;
        }
        let mask = if is_dir { dir_mask() } else { rules_mask() };
        match self.watches.add(path, mask) {
            // The same directory again (moved, or walked again) keeps its descriptor.
            Ok(wd) => {
                self.by_wd.insert(wd, what);
            }
            // Gone (or replaced by a file or link) since the walk saw it: the watch on its
            // parent has queued that, so the next checkpoint walks it again. A git directory
            // that does not exist has nothing to watch.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ENOENT | nix::libc::ENOTDIR)
                ) && !matches!(&what, Watched::Dir(rel) if rel.is_empty()) => {}
            Err(e) => {
                self.failed = Some(format!(
                    "{} could not be watched ({e}); raising `fs.inotify.max_user_watches` \
                     lets the journal work",
                    path.display()
                ));
            }
        }
    }

    /// Watch a directory the walk is about to enter, and the git directory of a repository
    /// whose root it is: the walk reads `.git/info/exclude` there as it enters.
    fn add_dir(&mut self, path: &Path, rel: &str) {
        self.add(path, Watched::Dir(rel.to_owned()));
        let git = path.join(".git");
        let Ok(meta) = std::fs::metadata(&git) else {
            // None yet: creating one is an event in this directory.
            return;
        };
        let mut git_dirs = Vec::new();
        if meta.is_dir() {
            git_dirs.push(git);
        } else if let Ok(text) = std::fs::read_to_string(&git) {
            // A linked worktree: `gitdir: <dir>`, whose `commondir` names the shared one.
            if let Some(dir) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) {
                let dir = path.join(dir.trim());
                if let Ok(common) = std::fs::read_to_string(dir.join("commondir")) {
                    git_dirs.push(dir.join(common.lines().next().unwrap_or("").trim()));
                }
                git_dirs.push(dir);
            }
        }
        for dir in git_dirs {
            self.add(&dir, Watched::Rules);
            self.add(&dir.join("info"), Watched::Rules);
        }
    }
}

/// What changed since the last drain.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Exactly these paths (each with whatever is beneath it) may differ from the last
    /// checkpoint; nothing else does.
    Paths(BTreeSet<String>),
    /// The journal cannot say: everything must be walked, for this reason.
    Everything(String),
}

/// The watches over one workspace and the queue of what changed in it.
pub(crate) struct Journal {
    inotify: Inotify,
    set: Arc<Mutex<Watchset>>,
    root: PathBuf,
    /// Watches of the last walk of everything not watched again by this one, removed when
    /// it ends.
    replaced: Option<HashMap<WatchDescriptor, Watched>>,
    /// The hash of the manifest the queued changes count from: the checkpoint taken at the
    /// last drain. None until a walk of everything has completed its watches, and while a
    /// checkpoint is being taken.
    pub base: Option<String>,
    /// Regular files with more than one link, stat-ed at every checkpoint.
    multi_linked: BTreeSet<String>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("root", &self.root)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// A journal over `root` watching at most `limit` directories; no watch yet.
    pub(crate) fn start(root: &Path, limit: usize) -> Result<Journal, String> {
        let inotify = Inotify::init().map_err(|e| format!("inotify is not available ({e})"))?;
        let set = Watchset {
            watches: inotify.watches(),
            by_wd: HashMap::new(),
            limit,
            failed: None,
        };
        Ok(Journal {
            inotify,
            set: Arc::new(Mutex::new(set)),
            root: root.to_owned(),
            replaced: None,
            base: None,
            multi_linked: BTreeSet::new(),
        })
    }

    fn set(&self) -> std::sync::MutexGuard<'_, Watchset> {
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Everything queued since the last drain, as the paths it dirtied.
    pub(crate) fn drain(&mut self) -> Drained {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut paths = BTreeSet::new();
        let mut everything: Option<String> = None;
        loop {
            let events = match self.inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    everything.get_or_insert(format!("the change queue could not be read ({e})"));
                    break;
                }
            };
            let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
            for event in events {
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    everything.get_or_insert("the change queue overflowed".into());
                    continue;
                }
                // A watch removed at the end of the last walk of everything.
                let Some(watched) = set.by_wd.get(&event.wd).cloned() else {
                    continue;
                };
                let is_root = matches!(&watched, Watched::Dir(rel) if rel.is_empty());
                if event.mask.contains(EventMask::IGNORED) {
                    set.by_wd.remove(&event.wd);
                    if is_root {
                        everything.get_or_insert("the workspace's watch went away".into());
                    }
                    continue;
                }
                if event.mask.contains(EventMask::UNMOUNT) {
                    everything.get_or_insert("a file system under the workspace went".into());
                    continue;
                }
                let gone_self = event
                    .mask
                    .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF);
                match (watched, event.name) {
                    (Watched::Rules, name) => {
                        if gone_self
                            || name
                                .is_some_and(|n| n == "info" || n == "exclude" || n == "commondir")
                        {
                            everything.get_or_insert(
                                "a repository's `info/exclude` (what git ignores) changed".into(),
                            );
                        }
                    }
                    // The directory itself: moved or removed (its parent's watch says so,
                    // except for the workspace's own), or chmod-ed.
                    (Watched::Dir(rel), None) => {
                        if is_root && gone_self {
                            everything.get_or_insert("the workspace was moved or removed".into());
                        } else if !is_root && !gone_self {
                            paths.insert(rel);
                        }
                    }
                    (Watched::Dir(rel), Some(name)) => {
                        let Some(name) = name.to_str() else {
                            everything.get_or_insert("a name that is not UTF-8 changed".into());
                            continue;
                        };
                        if name == ".gitignore" {
                            everything.get_or_insert("a `.gitignore` changed".into());
                        } else if name == ".git" {
                            everything.get_or_insert("a repository appeared, went or moved".into());
                        } else if !crate::NEVER_TRACKED.contains(&name) {
                            paths.insert(if rel.is_empty() {
                                name.to_owned()
                            } else {
                                format!("{rel}/{name}")
                            });
                        }
                    }
                }
            }
        }
        match everything {
            Some(why) => Drained::Everything(why),
            None => {
                paths.extend(self.multi_linked.iter().cloned());
                Drained::Paths(paths)
            }
        }
    }

    /// Start a walk of everything: the returned hook watches each directory the walk enters,
    /// the workspace first. The kernel keeps one watch per directory, so a directory watched
    /// before keeps it; [`Journal::end_everything`] removes the rest.
    pub(crate) fn begin_everything(&mut self) -> OnDir {
        {
            let shared = Arc::clone(&self.set);
            let mut set = shared.lock().unwrap_or_else(PoisonError::into_inner);
            let mut replaced = std::mem::take(&mut set.by_wd);
            // A walk of everything that failed left the watches before it unremoved.
            if let Some(earlier) = self.replaced.take() {
                replaced.extend(earlier);
            }
            self.replaced = Some(replaced);
            set.failed = None;
            let root = self.root.clone();
            set.add_dir(&root, "");
        }
        self.hook()
    }

    /// The hook of a narrowed walk: it watches the directories in its scope (new or moved
    /// in ones among them).
    pub(crate) fn hook(&self) -> OnDir {
        let set = Arc::clone(&self.set);
        Arc::new(move |path: &Path, rel: &str| {
            set.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .add_dir(path, rel);
        })
    }

    /// Why a watch is missing, if one is.
    pub(crate) fn failed(&self) -> Option<String> {
        self.set().failed.clone()
    }

    /// End a walk of everything that found `multi_linked`: the watches it did not renew go.
    pub(crate) fn end_everything(&mut self, multi_linked: Vec<String>) {
        let shared = Arc::clone(&self.set);
        let mut set = shared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = self.replaced.take() {
            for (wd, _) in old {
                if !set.by_wd.contains_key(&wd) {
                    // Already gone with its directory when this fails.
                    let _ = set.watches.remove(wd);
                }
            }
        }
        self.multi_linked = multi_linked.into_iter().collect();
    }

    /// After a narrowed walk of `scope` that found `multi_linked` in it.
    pub(crate) fn end_scoped(&mut self, scope: &Scope, multi_linked: Vec<String>) {
        self.multi_linked.retain(|p| !scope.covers(p));
        self.multi_linked.extend(multi_linked);
    }
}
