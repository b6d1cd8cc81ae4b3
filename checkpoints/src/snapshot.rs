//! A snapshot of the workspace: every tracked path with what it is, as a [`Manifest`].
//!
//! The walk never follows a link (a link is recorded with its target), honours `.gitignore`
//! (in and outside git repositories) and `[checkpoints] ignore`, never enters a control
//! directory ([`crate::NEVER_TRACKED`]), and records in the manifest what it did not keep and
//! why (a file over the size limit, a special file, a name that is not UTF-8, an unreadable
//! entry). It is incremental: a file whose size, modification and change times, inode and mode
//! are what the previous manifest recorded is not read again, unless it was modified so close
//! to that snapshot that a later write could share its timestamps ([`RACY_NS`]).

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::Store;
use crate::{Error, Result, Settings};

/// One tracked path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Node {
    /// A regular file.
    File {
        /// Permission bits (with setuid, setgid, sticky).
        mode: u32,
        /// SHA-256 of the content (hex); the content is in the store under it.
        hash: String,
        /// What the walk saw, to skip re-reading an unchanged file next time.
        stat: Stat,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link, never followed.
    Symlink {
        /// Where it points, as written.
        target: String,
    },
}

impl Node {
    /// Whether `self` and `other` are the same content (a file's stat aside).
    pub fn same_as(&self, other: &Node) -> bool {
        match (self, other) {
            (
                Node::File { mode, hash, .. },
                Node::File {
                    mode: m2, hash: h2, ..
                },
            ) => mode == m2 && hash == h2,
            (Node::Dir { mode }, Node::Dir { mode: m2 }) => mode == m2,
            (Node::Symlink { target }, Node::Symlink { target: t2 }) => target == t2,
            _ => false,
        }
    }

    /// The kind's name as shown.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Node::File { .. } => "file",
            Node::Dir { .. } => "directory",
            Node::Symlink { .. } => "link",
        }
    }
}

/// A file's metadata as the walk saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Size in bytes.
    pub size: u64,
    /// Modification time (ns since the epoch).
    pub mtime_ns: i64,
    /// Change time (ns since the epoch): moves on every write, chmod or rename, and cannot be
    /// set back by a program.
    pub ctime_ns: i64,
    /// Inode number.
    pub ino: u64,
}

impl Stat {
    fn of(meta: &Metadata) -> Stat {
        Stat {
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
            ino: meta.ino(),
        }
    }
}

/// A path the snapshot did not keep, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The path, relative to the workspace (lossy for a name that is not UTF-8).
    pub path: String,
    /// Why.
    pub reason: String,
}

/// The state of the workspace at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// When the walk began (ns since the epoch).
    pub taken_ns: i64,
    /// Every tracked path (relative, `/`-separated), sorted.
    pub entries: BTreeMap<String, Node>,
    /// What was not kept.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

/// How the reason of a file the checkpoint store could not keep begins.
pub const NOT_STORED: &str = "not stored: keel's checkpoint store could not keep it";

/// A file modified this close (ns) before the previous snapshot began is read again even when
/// its stat is unchanged: a write in the same clock tick can leave every stat field as it was.
pub const RACY_NS: i64 = 2_000_000_000;

impl Manifest {
    /// Regular files and their total size.
    pub fn totals(&self) -> (u64, u64) {
        self.entries
            .values()
            .fold((0, 0), |(n, b), node| match node {
                Node::File { stat, .. } => (n + 1, b + stat.size),
                _ => (n, b),
            })
    }

    /// The paths whose node differs between `self` and `other` (present in one only, or not
    /// the same), sorted.
    pub fn changed_paths(&self, other: &Manifest) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (path, node) in &self.entries {
            match other.entries.get(path) {
                Some(o) if o.same_as(node) => {}
                _ => out.push(path.clone()),
            }
        }
        for path in other.entries.keys() {
            if !self.entries.contains_key(path) {
                out.push(path.clone());
            }
        }
        out.sort();
        out
    }
}

/// Whether a path component names a directory never tracked.
fn never_tracked(name: &std::ffi::OsStr) -> bool {
    crate::NEVER_TRACKED.iter().any(|n| name == *n)
}

/// Walk `workspace` and record it, storing the content of every new or changed file in
/// `store`; files whose stat matches `previous` keep its hash unread.
pub fn snapshot(
    store: &Store,
    workspace: &Path,
    settings: &Settings,
    previous: Option<&Manifest>,
) -> Result<Manifest> {
    walk(store, workspace, settings, previous, &WalkPlan::default()).map(|w| w.manifest)
}

/// [`snapshot`], recording again every path `covered` (the session's last checkpoint)
/// recorded that is still in the workspace, whatever ignore rules were written since.
pub fn snapshot_covering(
    store: &Store,
    workspace: &Path,
    settings: &Settings,
    previous: Option<&Manifest>,
    covered: Option<&Manifest>,
) -> Result<Manifest> {
    let plan = WalkPlan {
        covered,
        ..WalkPlan::default()
    };
    walk(store, workspace, settings, previous, &plan).map(|w| w.manifest)
}

/// The paths a narrowed walk records: each of them and everything beneath it (the change
/// journal's dirty paths). The walk still goes down from the workspace through their
/// parents, so the same ignore rules decide what is kept as in a walk of everything.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    paths: HashSet<String>,
    /// Every proper ancestor of a path in `paths`: entered, not recorded.
    ancestors: HashSet<String>,
}

impl Scope {
    pub(crate) fn new(paths: impl IntoIterator<Item = String>) -> Scope {
        let paths: HashSet<String> = paths.into_iter().collect();
        let mut ancestors = HashSet::new();
        for path in &paths {
            for (i, _) in path.match_indices('/') {
                ancestors.insert(path[..i].to_owned());
            }
        }
        Scope { paths, ancestors }
    }

    /// The paths, in no order.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &String> {
        self.paths.iter()
    }

    /// Whether `rel` is one of the paths or lies beneath one.
    pub(crate) fn covers(&self, rel: &str) -> bool {
        self.paths.contains(rel)
            || rel
                .match_indices('/')
                .any(|(i, _)| self.paths.contains(&rel[..i]))
    }

    fn leads_to(&self, rel: &str) -> bool {
        self.ancestors.contains(rel)
    }
}

/// Called with every directory a walk will enter (its path and its relative path), before
/// the walk reads it or the ignore files in it: the journal watches it there.
pub(crate) type OnDir = Arc<dyn Fn(&Path, &str) + Send + Sync>;

/// How a walk is narrowed, and who hears of the directories it enters.
#[derive(Default)]
pub(crate) struct WalkPlan<'a> {
    /// Record only these paths (none: everything).
    pub scope: Option<Arc<Scope>>,
    pub on_dir: Option<OnDir>,
    /// The session's last checkpoint: every path it recorded that is still there is recorded
    /// again, whatever ignore rules were written since ([`still_covered`]).
    pub covered: Option<&'a Manifest>,
}

/// What a walk found besides its manifest.
pub(crate) struct Walked {
    pub manifest: Manifest,
    /// Regular files with more than one link: one can change through a name outside the
    /// watched directories, so the journal stats them at every checkpoint.
    pub multi_linked: Vec<String>,
    /// An entry failed without a path: a narrowed walk cannot say which part it misses.
    pub pathless_error: bool,
}

/// [`snapshot`], narrowed to `plan.scope` when it has one (the manifest then holds only what
/// the scope covers).
pub(crate) fn walk(
    store: &Store,
    workspace: &Path,
    settings: &Settings,
    previous: Option<&Manifest>,
    plan: &WalkPlan<'_>,
) -> Result<Walked> {
    let taken_ns = crate::now_ns();
    let mut manifest = Manifest {
        version: 1,
        taken_ns,
        entries: BTreeMap::new(),
        skipped: Vec::new(),
    };
    let mut overrides = ignore::overrides::OverrideBuilder::new(workspace);
    for pattern in &settings.ignore {
        overrides.add(&format!("!{pattern}")).map_err(|e| {
            Error(format!(
                "`[checkpoints] ignore` has a pattern keel cannot read (`{pattern}`: {e}); fix \
                 it in the config"
            ))
        })?;
    }
    let overrides = overrides
        .build()
        .map_err(|e| Error(format!("`[checkpoints] ignore`: {e}")))?;
    // Files are opened beneath this descriptor, so a directory swapped for a link while the
    // walk runs leads nowhere outside the workspace.
    let root = File::open(workspace).map_err(|e| {
        Error(format!(
            "opening the workspace {}: {e}",
            workspace.display()
        ))
    })?;
    let mut walker = ignore::WalkBuilder::new(workspace);
    walker
        .hidden(false)
        .parents(false)
        .ignore(false)
        .git_ignore(true)
        .git_global(false)
        .git_exclude(true)
        .require_git(false)
        .follow_links(false)
        .overrides(overrides.clone());
    let (scope, on_dir, ws) = (
        plan.scope.clone(),
        plan.on_dir.clone(),
        workspace.to_owned(),
    );
    walker.filter_entry(move |entry| {
        if entry.depth() == 0 {
            return true;
        }
        if never_tracked(entry.file_name()) {
            return false;
        }
        let rel = relative(&ws, entry.path());
        let in_scope = scope.as_ref().is_none_or(|s| s.covers(&rel));
        if !in_scope && !scope.as_ref().is_some_and(|s| s.leads_to(&rel)) {
            return false;
        }
        if let Some(on_dir) = &on_dir
            && in_scope
            && entry.file_type().is_some_and(|t| t.is_dir())
        {
            on_dir(entry.path(), &rel);
        }
        true
    });
    // What a narrowed walk passes through on the way to its scope is not recorded.
    let keep = |found: &Found| {
        let Some(scope) = &plan.scope else {
            return true;
        };
        match found {
            Found::Node(rel, ..) => scope.covers(rel),
            Found::Read(file) => scope.covers(&file.rel),
            Found::Skipped(s) => s.path.is_empty() || scope.covers(&s.path),
        }
    };
    // A workspace the previous walk found small is walked on this thread; a large one (or one
    // not walked before) on one thread per core, each stat-ing the entries it visits.
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_READERS);
    // A narrowed walk enters few directories: on this thread.
    let parallel = threads > 1
        && plan.scope.is_none()
        && previous.is_none_or(|p| p.entries.len() >= WALK_IN_PARALLEL_FROM);
    let kept = AtomicUsize::new(0);
    let too_many = AtomicBool::new(false);
    // Whether the walk may go on after `found`: false once more entries than the limit are kept.
    let count = |found: &Found| {
        if matches!(found, Found::Node(..) | Found::Read(..))
            && kept.fetch_add(1, Ordering::Relaxed) >= settings.max_entries
        {
            too_many.store(true, Ordering::Relaxed);
            return false;
        }
        true
    };
    let mut found: Vec<Found> = Vec::new();
    if parallel {
        let shared = Mutex::new(Vec::new());
        walker.threads(threads).build_parallel().run(|| {
            let (shared, count, keep) = (&shared, &count, &keep);
            Box::new(move |item| {
                let Some(f) = visit(item, workspace, settings, previous).filter(keep) else {
                    return ignore::WalkState::Continue;
                };
                if !count(&f) {
                    return ignore::WalkState::Quit;
                }
                shared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(f);
                ignore::WalkState::Continue
            })
        });
        found = shared.into_inner().unwrap_or_else(PoisonError::into_inner);
    } else {
        for item in walker.build() {
            let Some(f) = visit(item, workspace, settings, previous).filter(keep) else {
                continue;
            };
            if !count(&f) {
                break;
            }
            found.push(f);
        }
    }
    if too_many.load(Ordering::Relaxed) {
        return Err(too_many_entries(workspace, settings));
    }
    if let Some(covered) = plan.covered {
        let again = still_covered(
            &root,
            workspace,
            settings,
            previous,
            covered,
            plan.scope.as_deref(),
            &overrides,
            &found,
            plan.on_dir.as_ref(),
        );
        for f in again {
            if !count(&f) {
                return Err(too_many_entries(workspace, settings));
            }
            found.push(f);
        }
    }
    let mut to_read: Vec<ToRead> = Vec::new();
    let mut multi_linked = Vec::new();
    let mut pathless_error = false;
    for f in found {
        match f {
            Found::Node(rel, node, links) => {
                if links > 1 {
                    multi_linked.push(rel.clone());
                }
                manifest.entries.insert(rel, node);
            }
            Found::Read(file) => to_read.push(file),
            Found::Skipped(skipped) => {
                pathless_error |= skipped.path.is_empty();
                manifest.skipped.push(skipped);
            }
        }
    }
    let read = read_all(store, &root, workspace, &to_read, settings.max_file_bytes);
    for (file, result) in to_read.into_iter().zip(read) {
        let ToRead {
            rel,
            mode,
            stat,
            links,
            ..
        } = file;
        let reason = match result {
            Ok(Recorded::Stored { hash }) => {
                if links > 1 {
                    multi_linked.push(rel.clone());
                }
                manifest
                    .entries
                    .insert(rel, Node::File { mode, hash, stat });
                continue;
            }
            Ok(Recorded::Changed) => "changed into something else while it was read".to_owned(),
            Ok(Recorded::TooLarge(size)) => format!(
                "{size} bytes or more, over the size limit of {}",
                settings.max_file_bytes
            ),
            Ok(Recorded::NotStored(why)) => format!(
                "{NOT_STORED} ({why}); free space on the disk of keel's home, or leave large \
                 files out with `[checkpoints] ignore` or `max-file-mib`"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => format!("could not be read ({e})"),
        };
        manifest.skipped.push(Skipped { path: rel, reason });
    }
    // In path order whichever thread found them, so two walks of one tree compare equal.
    manifest.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Walked {
        manifest,
        multi_linked,
        pathless_error,
    })
}

/// The error of a checkpoint of a workspace over `[checkpoints] max-entries`.
pub(crate) fn too_many_entries(workspace: &Path, settings: &Settings) -> Error {
    Error(format!(
        "the workspace {} holds more than {} files and directories, so no checkpoint is \
         taken (one that left some out would have a rewind remove them); exclude what need \
         not be recorded with `.gitignore` or `[checkpoints] ignore`, raise `[checkpoints] \
         max-entries`, or turn checkpoints off with `[checkpoints] enabled = false`",
        workspace.display(),
        settings.max_entries
    ))
}

/// A file the walk found new or changed, to read and store.
struct ToRead {
    rel: String,
    path: std::path::PathBuf,
    mode: u32,
    stat: Stat,
    /// Its link count.
    links: u64,
}

/// Fewer new or changed files than this are read on the walk's thread: starting threads
/// would cost more than it saves.
const READ_IN_PARALLEL_FROM: usize = 16;

/// The most threads reading files at once.
const MAX_READERS: usize = 4;

/// Read and store every file of `files` (hash and compress), on up to one thread per core,
/// each taking the next file when done with one, so one large file does not hold up the rest.
/// The results are in the order of `files`.
fn read_all(
    store: &Store,
    root: &File,
    workspace: &Path,
    files: &[ToRead],
    limit: u64,
) -> Vec<std::io::Result<Recorded>> {
    let read = |f: &ToRead| record_file(store, root, workspace, &f.path, limit);
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_READERS);
    if threads < 2 || files.len() < READ_IN_PARALLEL_FROM {
        return files.iter().map(read).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(file) = files.get(i) else {
                return done;
            };
            done.push((i, read(file)));
        }
    };
    let mut results: Vec<Option<std::io::Result<Recorded>>> =
        std::iter::repeat_with(|| None).take(files.len()).collect();
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
        let mine = work();
        for done in helpers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .chain([mine])
        {
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(std::io::Error::other("not read"))))
        .collect()
}

/// What the walk found at one path.
enum Found {
    /// A path and what it is (with a regular file's link count; 1 otherwise).
    Node(String, Node, u64),
    /// A new or changed file, read after the walk.
    Read(ToRead),
    Skipped(Skipped),
}

/// Walks of workspaces with fewer entries than this the last time run on one thread.
const WALK_IN_PARALLEL_FROM: usize = 2000;

/// What one entry of the walk is; none for the workspace itself and what vanished meanwhile.
fn visit(
    item: std::result::Result<ignore::DirEntry, ignore::Error>,
    workspace: &Path,
    settings: &Settings,
    previous: Option<&Manifest>,
) -> Option<Found> {
    let entry = match item {
        Ok(entry) => entry,
        Err(e) => {
            let path = match &e {
                ignore::Error::WithPath { path, .. } => relative(workspace, path),
                _ => String::new(),
            };
            return Some(Found::Skipped(Skipped {
                path,
                reason: format!("could not be read ({e})"),
            }));
        }
    };
    if entry.depth() == 0 {
        return None;
    }
    let Some(rel) = entry
        .path()
        .strip_prefix(workspace)
        .ok()
        .and_then(|p| p.to_str())
        .map(str::to_owned)
    else {
        return Some(Found::Skipped(Skipped {
            path: relative(workspace, entry.path()),
            reason: "its name is not UTF-8, which checkpoints do not record".into(),
        }));
    };
    let meta = match std::fs::symlink_metadata(entry.path()) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            return Some(Found::Skipped(Skipped {
                path: rel,
                reason: format!("could not be read ({e})"),
            }));
        }
    };
    let mode = meta.mode() & 0o7777;
    let ft = meta.file_type();
    let node = if ft.is_dir() {
        Node::Dir { mode }
    } else if ft.is_symlink() {
        match std::fs::read_link(entry.path()) {
            Ok(target) => match target.to_str() {
                Some(t) => Node::Symlink {
                    target: t.to_owned(),
                },
                None => {
                    return Some(Found::Skipped(Skipped {
                        path: rel,
                        reason: "a link whose target is not UTF-8".into(),
                    }));
                }
            },
            Err(e) => {
                return Some(Found::Skipped(Skipped {
                    path: rel,
                    reason: format!("could not be read ({e})"),
                }));
            }
        }
    } else if ft.is_file() {
        let stat = Stat::of(&meta);
        return Some(regular_file(
            rel,
            entry.into_path(),
            mode,
            stat,
            meta.nlink(),
            settings,
            previous,
        ));
    } else {
        return Some(special_file(rel));
    };
    Some(Found::Node(rel, node, 1))
}

fn special_file(rel: String) -> Found {
    Found::Skipped(Skipped {
        path: rel,
        reason: "a special file (socket, FIFO or device), which checkpoints do not record".into(),
    })
}

/// What the walk makes of a regular file at `rel`: skipped when over the size limit, its hash
/// taken from `previous` when its stat is unchanged, else to be read.
fn regular_file(
    rel: String,
    path: std::path::PathBuf,
    mode: u32,
    stat: Stat,
    links: u64,
    settings: &Settings,
    previous: Option<&Manifest>,
) -> Found {
    if stat.size > settings.max_file_bytes {
        return Found::Skipped(Skipped {
            path: rel,
            reason: format!(
                "{} bytes, over the size limit of {} (`[checkpoints] max-file-mib`)",
                stat.size, settings.max_file_bytes
            ),
        });
    }
    let unchanged = previous.and_then(|p| match p.entries.get(&rel) {
        Some(Node::File {
            mode: m,
            hash,
            stat: s,
        }) if *m == mode
            && *s == stat
            && s.mtime_ns < p.taken_ns - RACY_NS
            && s.ctime_ns < p.taken_ns - RACY_NS =>
        {
            Some(hash.clone())
        }
        _ => None,
    });
    match unchanged {
        Some(hash) => Found::Node(rel, Node::File { mode, hash, stat }, links),
        // Read after the walk, on as many threads as there are cores.
        None => Found::Read(ToRead {
            rel,
            path,
            mode,
            stat,
            links,
        }),
    }
}

/// The entries of `covered` (the session's last checkpoint) that the walk did not find but
/// that are still in the workspace: what ignore rules written since (a `.gitignore` of `*`
/// by a command of the turn) hide from the walk. Once a checkpoint of the session recorded a
/// path, it stays recorded while it exists; only the person's `[checkpoints] ignore` and the
/// control directories still leave it out. Each is looked at through directories opened from
/// the workspace with `O_NOFOLLOW`, so a parent swapped for a link leads nowhere outside.
#[allow(clippy::too_many_arguments)]
fn still_covered(
    root: &File,
    workspace: &Path,
    settings: &Settings,
    previous: Option<&Manifest>,
    covered: &Manifest,
    scope: Option<&Scope>,
    overrides: &ignore::overrides::Override,
    found: &[Found],
    on_dir: Option<&OnDir>,
) -> Vec<Found> {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::{SFlag, fstatat};
    let seen: HashSet<&str> = found
        .iter()
        .map(|f| match f {
            Found::Node(rel, ..) => rel.as_str(),
            Found::Read(file) => file.rel.as_str(),
            Found::Skipped(s) => s.path.as_str(),
        })
        .collect();
    let Ok(root) = root.try_clone().map(std::os::fd::OwnedFd::from) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // Directories that could not be opened (gone, or a link): nothing beneath them is looked
    // at again.
    let mut unreachable: HashSet<String> = HashSet::new();
    for (rel, node) in &covered.entries {
        if seen.contains(rel.as_str()) || scope.is_some_and(|s| !s.covers(rel)) {
            continue;
        }
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.iter().any(|p| never_tracked(std::ffi::OsStr::new(p)))
            || overrides
                .matched(workspace.join(rel), matches!(node, Node::Dir { .. }))
                .is_ignore()
        {
            continue;
        }
        let Some((name, parents)) = parts.split_last() else {
            continue;
        };
        let parent = parents.join("/");
        if (1..=parents.len()).any(|n| unreachable.contains(&parents[..n].join("/"))) {
            continue;
        }
        let Ok(dir) = crate::restore::open_parent(&root, parents, rel) else {
            unreachable.insert(parent);
            continue;
        };
        let st = match fstatat(&dir, *name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => {
                out.push(Found::Skipped(Skipped {
                    path: rel.clone(),
                    reason: format!("could not be read ({e})"),
                }));
                continue;
            }
        };
        let mode = st.st_mode & 0o7777;
        let found = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => {
                if let Some(on_dir) = on_dir {
                    on_dir(&workspace.join(rel), rel);
                }
                Found::Node(rel.clone(), Node::Dir { mode }, 1)
            }
            SFlag::S_IFLNK => match nix::fcntl::readlinkat(&dir, *name) {
                Ok(target) => match target.into_string() {
                    Ok(target) => Found::Node(rel.clone(), Node::Symlink { target }, 1),
                    Err(_) => Found::Skipped(Skipped {
                        path: rel.clone(),
                        reason: "a link whose target is not UTF-8".into(),
                    }),
                },
                Err(e) => Found::Skipped(Skipped {
                    path: rel.clone(),
                    reason: format!("could not be read ({e})"),
                }),
            },
            SFlag::S_IFREG => {
                let stat = Stat {
                    size: st.st_size as u64,
                    mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
                    ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
                    ino: st.st_ino,
                };
                regular_file(
                    rel.clone(),
                    workspace.join(rel),
                    mode,
                    stat,
                    st.st_nlink,
                    settings,
                    previous,
                )
            }
            _ => special_file(rel.clone()),
        };
        out.push(found);
    }
    out
}

fn relative(workspace: &Path, path: &Path) -> String {
    path.strip_prefix(workspace)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

enum Recorded {
    Stored {
        hash: String,
    },
    /// Not a regular file any more when opened.
    Changed,
    /// Grew past the limit.
    TooLarge(u64),
    /// Read, but the store could not keep it (its disk is full…).
    NotStored(String),
}

/// Read the regular file at `path` and store its content. It is opened beneath `root` (the
/// workspace, at `workspace`) with no link in any part of its path, so a file or a parent
/// directory replaced by a link while the walk ran (by a command or a server working in the
/// workspace) never has keel read, and a later rewind restore, something outside it.
fn record_file(
    store: &Store,
    root: &File,
    workspace: &Path,
    path: &Path,
    limit: u64,
) -> std::io::Result<Recorded> {
    let Ok(rel) = path.strip_prefix(workspace) else {
        return Ok(Recorded::Changed);
    };
    let mut file = open_beneath(root, rel).map_err(|e| {
        if e.raw_os_error() == Some(nix::libc::ELOOP) || e.raw_os_error() == Some(nix::libc::EXDEV)
        {
            std::io::Error::other("it or a directory above it became a link while it was read")
        } else {
            e
        }
    })?;
    if !file.metadata()?.is_file() {
        return Ok(Recorded::Changed);
    }
    let mut content = Vec::new();
    (&mut file as &mut File)
        .take(limit + 1)
        .read_to_end(&mut content)?;
    if content.len() as u64 > limit {
        return Ok(Recorded::TooLarge(content.len() as u64));
    }
    let hash = hex::encode(Sha256::digest(&content));
    if let Err(e) = store.put_blob(&hash, &content) {
        return Ok(Recorded::NotStored(e.0));
    }
    Ok(Recorded::Stored { hash })
}

/// Open `rel` for reading beneath `root`, following no link on the way (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`); a FIFO does not block the open.
fn open_beneath(root: &File, rel: &Path) -> std::io::Result<File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    match openat2(root, rel, how) {
        Ok(fd) => Ok(File::from(fd)),
        // A kernel without openat2 (before Linux 5.6): the last part is still never followed,
        // and the file is read only when it really lies in the workspace.
        Err(nix::errno::Errno::ENOSYS) => {
            let workspace = root_path(root)?;
            let file = OpenOptions::new()
                .read(true)
                .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
                .open(workspace.join(rel))?;
            match root_path(&file) {
                Ok(real) if real.starts_with(&workspace) => Ok(file),
                _ => Err(std::io::Error::from_raw_os_error(nix::libc::EXDEV)),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Where an open file really is, as the kernel knows it.
fn root_path(file: &File) -> std::io::Result<std::path::PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state a race leaves: the walk saw `src/secret.txt` in the workspace, and by the
    /// time the file is opened `src` is a link to a directory outside holding a file of that
    /// name. Nothing outside is read.
    #[test]
    fn a_directory_swapped_for_a_link_is_not_read_through() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&ws).expect("ws");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret.txt"), "the person's key").expect("secret");
        std::os::unix::fs::symlink(&outside, ws.join("src")).expect("link");
        std::fs::write(ws.join("plain.txt"), "plain").expect("plain");
        let root = File::open(&ws).expect("root");

        let e = open_beneath(&root, Path::new("src/secret.txt")).expect_err("through a link");
        assert!(
            matches!(e.raw_os_error(), Some(nix::libc::ELOOP | nix::libc::EXDEV)),
            "{e}"
        );
        let mut text = String::new();
        open_beneath(&root, Path::new("plain.txt"))
            .expect("a plain file")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "plain");
    }
}
