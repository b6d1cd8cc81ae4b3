//! The checkpoint store of one workspace, in keel's home (`<home>/checkpoints/<key>/`, the key
//! a hash of the workspace's path):
//!
//! ```text
//! workspace            the workspace's path, for people reading the folder
//! blobs/ab/<sha256>    a file's content, zstd-compressed, named by the SHA-256 of the content
//! manifests/ab/<sha256> a snapshot's manifest (JSON, zstd), named by the hash of its JSON:
//!                      whole, or the differences from another manifest (a chain of at most 32)
//! pending/ab/<kind>-<sha256>-<unique>  an object written and not yet known to be on disk
//! sessions/<id>.jsonl  a session's checkpoints, one line each, append-only
//! lock                 held (flock) around every index append and a garbage collection
//! busy                 flock shared by recordings and rewinds, exclusive for a collection
//! ```
//!
//! Objects are written to `pending/` (a temp name renamed, so two sessions writing the same
//! content both leave it whole) and moved into place only after they are synced, so an object
//! in place is always whole on disk; one left in `pending/` by a process killed, or a machine
//! that stopped, is checked against its hash when the store is next opened, and moved into
//! place or removed. A durable index line is appended and synced under the lock only after
//! everything the store wrote is in place; a deferred one (before a tool call) is written at
//! once and made durable, in the same order, on another thread (see [`Store::sync`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::snapshot::{Manifest, Skipped};
use crate::{Error, Result, io_error};

/// Why a checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Before a turn began: the state `--turn N` restores.
    BeforeTurn,
    /// Before a tool call that may change files: the state `--call ID` restores.
    BeforeCall,
    /// After a turn's last call: what the turn left.
    AfterTurn,
    /// Before a rewind changed anything: restoring it undoes the rewind.
    Safety,
    /// Right after a rewind: what the rewind left.
    Restored,
}

impl Kind {
    /// Whether changes since the session's previous checkpoint were made outside keel: between
    /// turns (or before a rewind) no tool of this session runs.
    pub fn follows_a_pause(self) -> bool {
        matches!(self, Kind::BeforeTurn | Kind::Safety)
    }

    /// The kind as `list` shows it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::BeforeTurn => "before turn",
            Kind::BeforeCall => "before call",
            Kind::AfterTurn => "after turn",
            Kind::Safety => "safety (before rewind)",
            Kind::Restored => "after rewind",
        }
    }
}

/// One line of a session's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The checkpoint's id in its session (`c1`, `c2`, …).
    pub id: String,
    /// Its position in the session's index, from 1.
    pub seq: u64,
    /// The session.
    pub session: String,
    /// The turn it belongs to (from 1; 0 before the first turn).
    pub turn: u64,
    /// Why it was taken.
    pub kind: Kind,
    /// The tool call it precedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// That call's tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// When (ms since the Unix epoch).
    pub time_ms: u64,
    /// The manifest's hash in the store.
    pub manifest: String,
    /// Files recorded.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Paths not recorded, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// Paths that differ from the session's previous checkpoint (at most [`MAX_CHANGED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    /// How many paths differ (the list may be cut).
    #[serde(default)]
    pub changed_count: u64,
    /// Whether those changes were made outside keel ([`Kind::follows_a_pause`]).
    #[serde(default)]
    pub outside: bool,
    /// What a rewind restored (for [`Kind::Safety`] and [`Kind::Restored`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Places outside the workspace the session could change that no checkpoint records
    /// ([`crate::Settings::not_covered`]): a rewind does not bring them back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_covered: Vec<String>,
    /// How the workspace was looked at: `journal: …` when the change journal named what to
    /// look at, `everything: <why>` for a walk of the whole tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk: Option<String>,
}

impl Checkpoint {
    /// Whether this line stands for checkpoints the retention dropped by age: it names no
    /// manifest, and is kept only so the session's turns go on being numbered where they
    /// stood.
    pub fn is_dropped(&self) -> bool {
        self.manifest.is_empty()
    }

    /// The line that stands for a session's checkpoints once the last one is dropped by age.
    fn as_dropped(&self) -> Checkpoint {
        Checkpoint {
            manifest: String::new(),
            files: 0,
            bytes: 0,
            skipped: Vec::new(),
            changed: Vec::new(),
            changed_count: 0,
            outside: false,
            call: None,
            tool: None,
            walk: None,
            not_covered: Vec::new(),
            note: Some(
                "older than `[checkpoints] max-age-days`: dropped, with every checkpoint of \
                 the session before it; nothing of it can be restored"
                    .into(),
            ),
            ..self.clone()
        }
    }
}

/// The most changed paths an index line lists.
pub const MAX_CHANGED: usize = 1000;

/// How long an index append waits for another keel process holding the lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The store of one workspace.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    workspace: PathBuf,
    /// What this store wrote that is not durable yet, shared with the thread that makes it so.
    durability: Arc<Durability>,
    /// How deep in a chain of deltas each manifest this store wrote or read lies (0: whole).
    depths: Mutex<HashMap<String, u32>>,
}

/// Objects written to `pending/` and indexes appended to without a sync, and the lock held
/// while they are made durable (so a durable append waits for a background sync in flight).
#[derive(Debug, Default)]
struct Durability {
    unsynced: Mutex<Unsynced>,
    syncing: Mutex<()>,
    /// A background sync is scheduled and has not taken the list yet.
    scheduled: AtomicBool,
}

#[derive(Debug, Default)]
struct Unsynced {
    /// This store's own objects in `pending/`: whole (it wrote them), not yet synced.
    objects: Vec<PendingObject>,
    /// Their hashes, so a content written twice before it is moved into place is written once.
    hashes: HashSet<(&'static str, String)>,
    /// Indexes with lines appended and not synced.
    indexes: BTreeSet<PathBuf>,
}

/// An object in `pending/`, and where it goes once durable.
#[derive(Debug, Clone)]
struct PendingObject {
    pending: PathBuf,
    kind: &'static str,
    hash: String,
}

/// Up to this many new objects are synced one by one (with their directories); more are
/// synced with one `syncfs`, which also flushes whatever else is pending on that file system.
const SYNC_EACH_UP_TO: usize = 64;

/// The most deltas between a manifest and the whole one it is read from: past it a whole
/// manifest is written again, so reading one costs at most this many small files more.
const MAX_DELTA_DEPTH: u32 = 32;

/// Where objects wait until they are durable (see [`Store::sync`]).
const PENDING: &str = "pending";

/// A temp file in `pending/` left this long by a writer that was killed is removed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name for a temp file no other writer in this or another process uses.
pub(crate) fn temp_name(prefix: &str) -> String {
    format!("{prefix}{}.tmp", unique())
}

/// A unique part of a file name: no other writer in this or another process uses it.
pub(crate) fn unique() -> String {
    format!(
        "{}-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
        crate::now_ns()
    )
}

fn object_path(root: &Path, kind: &str, hash: &str) -> PathBuf {
    root.join(kind).join(&hash[..2]).join(&hash[2..])
}

/// The directory in `pending/` of an object (fanned out as the objects in place are, so no
/// directory grows large when a first checkpoint writes thousands).
fn pending_dir(root: &Path, hash: &str) -> PathBuf {
    root.join(PENDING).join(&hash[..2])
}

/// The kind and hash of an object's name in `pending/` (`<kind>-<hash>-<unique>`).
fn parse_pending(name: &str) -> Option<(&'static str, String)> {
    let (kind, rest) = if let Some(rest) = name.strip_prefix("blobs-") {
        ("blobs", rest)
    } else {
        ("manifests", name.strip_prefix("manifests-")?)
    };
    let hash = rest.get(..64)?;
    (valid_hash(hash).is_ok() && rest[64..].starts_with('-')).then(|| (kind, hash.to_owned()))
}

/// A stored object's content: unpacked and checked against `hash`, or why not.
fn unpack_checked(packed: &[u8], hash: &str) -> std::result::Result<Vec<u8>, String> {
    let content =
        zstd::stream::decode_all(packed).map_err(|e| format!("cannot be unpacked ({e})"))?;
    if hash_hex(&content) == hash {
        Ok(content)
    } else {
        Err("does not match its hash".into())
    }
}

/// A manifest read while the checkpoints of an index are checked in order
/// ([`Store::unrestorable`]), with its paths whose content is not stored.
struct Resolved {
    hash: String,
    manifest: Manifest,
    missing: BTreeSet<String>,
}

/// The `version` of a manifest stored as the differences from another.
const DELTA_VERSION: u32 = 2;

/// A manifest as stored: whole (version 1, written as a [`Manifest`]), or the differences
/// from the manifest `base` (version 2): the entries added or changed, the paths removed,
/// and everything not kept (the whole list, usually short).
#[derive(Debug, Serialize, Deserialize)]
struct StoredManifest {
    version: u32,
    taken_ns: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<String>,
    entries: BTreeMap<String, crate::Node>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<String>,
    #[serde(default)]
    skipped: Vec<Skipped>,
}

/// The entries of `to` that `from` lacks or holds otherwise (a file's stat included), and the
/// paths of `from` that `to` lacks: one pass over both, as both are sorted.
fn differences(from: &Manifest, to: &Manifest) -> (BTreeMap<String, crate::Node>, Vec<String>) {
    let mut changed = BTreeMap::new();
    let mut removed = Vec::new();
    let mut old = from.entries.iter().peekable();
    for (path, node) in &to.entries {
        while let Some((p, _)) = old.next_if(|(p, _)| *p < path) {
            removed.push(p.clone());
        }
        match old.next_if(|(p, _)| *p == path) {
            Some((_, n)) if n == node => {}
            _ => {
                changed.insert(path.clone(), node.clone());
            }
        }
    }
    removed.extend(old.map(|(p, _)| p.clone()));
    (changed, removed)
}

impl Durability {
    fn unsynced(&self) -> std::sync::MutexGuard<'_, Unsynced> {
        self.unsynced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn syncing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.syncing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Store::sync`]; on a failure what was not made durable stays listed for the next.
    fn sync(&self, root: &Path) -> Result<()> {
        let _syncing = self.syncing();
        // Whatever is written from here on gets a background sync of its own.
        self.scheduled.store(false, Ordering::Release);
        let (objects, indexes) = {
            let mut unsynced = self.unsynced();
            unsynced.hashes.clear();
            (
                std::mem::take(&mut unsynced.objects),
                std::mem::take(&mut unsynced.indexes),
            )
        };
        let put_back = |objects: Vec<PendingObject>, indexes: BTreeSet<PathBuf>| {
            let mut unsynced = self.unsynced();
            unsynced.objects.extend(objects);
            unsynced.indexes.extend(indexes);
        };
        if let Err(e) = promote(root, objects.clone(), true) {
            put_back(objects, indexes);
            return Err(e);
        }
        for index in &indexes {
            match File::open(index).and_then(|f| f.sync_data()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    put_back(Vec::new(), indexes.clone());
                    return Err(Error(format!("syncing {}: {e}", index.display())));
                }
            }
        }
        Ok(())
    }
}

/// Make `objects` durable and move them from `pending/` into place: their content synced
/// first (each file, or the whole file system past [`SYNC_EACH_UP_TO`]), then each renamed to
/// its name, then the renames synced. An object is thus in place only once it is whole on
/// disk. Objects another process left (`own` false) are checked against their hash first, and
/// one that is not whole is removed: the machine stopped before it reached the disk. One
/// another keel process moved meanwhile is in place already.
fn promote(root: &Path, mut objects: Vec<PendingObject>, own: bool) -> Result<()> {
    if objects.is_empty() {
        return Ok(());
    }
    let failed = |e: std::io::Error| Error(format!("syncing the checkpoint store: {e}"));
    if !own {
        objects.retain(|o| match fs::read(&o.pending) {
            Ok(packed) if unpack_checked(&packed, &o.hash).is_ok() => true,
            Ok(_) => {
                let _ = fs::remove_file(&o.pending);
                false
            }
            Err(_) => false,
        });
    }
    let many = objects.len() > SYNC_EACH_UP_TO;
    let sync_all = || {
        let dir = File::open(root).map_err(io_error("opening the checkpoint store"))?;
        nix::unistd::syncfs(&dir).map_err(|e| failed(e.into()))
    };
    if many {
        sync_all()?;
    } else {
        for o in &objects {
            match File::open(&o.pending).and_then(|f| f.sync_all()) {
                Ok(()) => {}
                // Moved into place by another keel process, which synced it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(e)),
            }
        }
    }
    let mut dirs = BTreeSet::new();
    for o in &objects {
        let dest = object_path(root, o.kind, &o.hash);
        let fan = dest.parent().unwrap_or(root).to_owned();
        if !dirs.contains(&fan) {
            // Not recursive: a store removed meanwhile is not made again.
            use std::os::unix::fs::DirBuilderExt;
            match fs::DirBuilder::new().mode(0o700).create(&fan) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(failed(e)),
            }
        }
        match fs::rename(&o.pending, &dest) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(e)),
        }
        // The object's directory, and the one above it, which may have just gained it.
        if let Some(kind_dir) = fan.parent() {
            dirs.insert(kind_dir.to_owned());
        }
        dirs.insert(fan);
    }
    // Emptied fan directories of `pending/` go, so opening the store reads few directories.
    let emptied: BTreeSet<PathBuf> = objects
        .iter()
        .filter_map(|o| o.pending.parent().map(Path::to_owned))
        .collect();
    for dir in emptied {
        let _ = fs::remove_dir(dir);
    }
    if many {
        return sync_all();
    }
    for dir in dirs {
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(failed)?;
    }
    Ok(())
}

impl Drop for Store {
    fn drop(&mut self) {
        // What the store's last deferred checkpoints wrote is durable when it goes (a session
        // that ends); a failure leaves it in `pending/` for the next store opened.
        let _ = self.sync();
    }
}

/// The store's key for `workspace`: the start of the SHA-256 of its path.
pub fn workspace_key(workspace: &Path) -> String {
    let digest = Sha256::digest(workspace.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..12])
}

fn hash_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn valid_hash(hash: &str) -> Result<()> {
    if hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        Ok(())
    } else {
        Err(Error(format!(
            "`{hash}` is not a content hash; the checkpoint store is damaged"
        )))
    }
}

/// Whether `id` can name a session's index file.
fn valid_session(id: &str) -> Result<()> {
    if !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.')
    {
        Ok(())
    } else {
        Err(Error(format!(
            "`{id}` is not a session id; `keel sessions list` shows them"
        )))
    }
}

impl Store {
    /// The store of `workspace` under `checkpoints_dir` (`<home>/checkpoints`), made if
    /// missing (owner-only). What a keel process left in `pending/` (it was killed, or the
    /// machine stopped, before its objects were durable) is checked and moved into place.
    pub fn open(checkpoints_dir: &Path, workspace: &Path) -> Result<Store> {
        let root = checkpoints_dir.join(workspace_key(workspace));
        for dir in [
            checkpoints_dir.to_owned(),
            root.clone(),
            root.join("blobs"),
            root.join("manifests"),
            root.join("sessions"),
            root.join(PENDING),
        ] {
            make_private_dir(&dir)?;
        }
        let marker = root.join("workspace");
        if !marker.exists() {
            write_atomic(&marker, workspace.as_os_str().as_encoded_bytes(), true)?;
        }
        let store = Store {
            root,
            workspace: workspace.to_owned(),
            durability: Arc::default(),
            depths: Mutex::default(),
        };
        // Best effort: what is not moved now stays readable in `pending/`, and the next
        // store opened or durable checkpoint taken tries again.
        let _ = store.recover_pending();
        Ok(store)
    }

    /// The workspace this store records.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The store's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn object_path(&self, kind: &str, hash: &str) -> PathBuf {
        object_path(&self.root, kind, hash)
    }

    /// Whether the blob `hash` is stored (in place, or written and not yet durable).
    pub fn has_blob(&self, hash: &str) -> bool {
        self.stored("blobs", hash)
    }

    /// Whether the manifest `hash` is stored (in place, or written and not yet durable).
    pub fn has_manifest(&self, hash: &str) -> bool {
        self.stored("manifests", hash)
    }

    /// Whether an object is in place or in `pending/` (looked for in place again after, as a
    /// sync may move it in between).
    fn stored(&self, kind: &'static str, hash: &str) -> bool {
        if valid_hash(hash).is_err() {
            return false;
        }
        let path = self.object_path(kind, hash);
        path.exists()
            || self
                .durability
                .unsynced()
                .hashes
                .contains(&(kind, hash.to_owned()))
            || !self.pending_copies(kind, hash).is_empty()
            || path.exists()
    }

    /// Store `content` under `hash` (its SHA-256) unless it is there; whether it was written.
    /// It goes to `pending/`, not synced: [`Store::sync`] makes it durable and moves it into
    /// place (on another thread soon after a deferred checkpoint, before a durable one).
    pub fn put_blob(&self, hash: &str, content: &[u8]) -> Result<bool> {
        valid_hash(hash)?;
        if self.present("blobs", hash) {
            return Ok(false);
        }
        let packed = zstd::bulk::compress(content, 1).map_err(io_error("compressing a file"))?;
        self.put_pending("blobs", hash, &packed)?;
        Ok(true)
    }

    /// Whether the object is in place (touched, so a garbage collection running now keeps it
    /// for its grace period while the checkpoint naming it is being recorded) or this store
    /// wrote it to `pending/` already.
    fn present(&self, kind: &'static str, hash: &str) -> bool {
        let path = self.object_path(kind, hash);
        if path.exists() {
            if let Ok(f) = File::options().write(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            return true;
        }
        self.durability
            .unsynced()
            .hashes
            .contains(&(kind, hash.to_owned()))
    }

    /// Write an object to `pending/` under a name of its own (a temp file renamed, so a name
    /// there always holds what its writer wrote whole, as far as the page cache goes).
    fn put_pending(&self, kind: &'static str, hash: &str, packed: &[u8]) -> Result<()> {
        let dir = pending_dir(&self.root, hash);
        let pending = dir.join(format!("{kind}-{hash}-{}", unique()));
        // A sync removes a fan directory it emptied: made again if it went meanwhile.
        let mut tries = 0;
        loop {
            make_private_dir(&dir)?;
            match write_atomic(&pending, packed, false) {
                Ok(()) => break,
                Err(_) if tries < 3 && !dir.exists() => tries += 1,
                Err(e) => return Err(e),
            }
        }
        let mut unsynced = self.durability.unsynced();
        unsynced.hashes.insert((kind, hash.to_owned()));
        unsynced.objects.push(PendingObject {
            pending,
            kind,
            hash: hash.to_owned(),
        });
        Ok(())
    }

    /// The copies of an object waiting in `pending/`.
    fn pending_copies(&self, kind: &str, hash: &str) -> Vec<PathBuf> {
        let prefix = format!("{kind}-{hash}-");
        let Ok(entries) = fs::read_dir(pending_dir(&self.root, hash)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .map(|e| e.path())
            .collect()
    }

    /// An object's content, unpacked and checked against its hash: in place, else a copy
    /// waiting in `pending/`, else in place again (a copy may have been moved in between the
    /// two looks).
    fn read_object(&self, kind: &'static str, hash: &str, what: &str) -> Result<Vec<u8>> {
        valid_hash(hash)?;
        let path = self.object_path(kind, hash);
        let mut damaged = None;
        for attempt in 0..3 {
            let candidates = if attempt == 1 {
                self.pending_copies(kind, hash)
            } else {
                vec![path.clone()]
            };
            for candidate in candidates {
                match fs::read(&candidate) {
                    Ok(packed) => match unpack_checked(&packed, hash) {
                        Ok(bytes) => return Ok(bytes),
                        Err(why) => damaged = Some(why),
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(io_error(format!(
                            "reading {what} {hash} ({})",
                            candidate.display()
                        ))(e));
                    }
                }
            }
        }
        Err(Error(match damaged {
            Some(why) => format!(
                "{what} {hash} {why}; the checkpoint store at {} is damaged",
                self.root.display()
            ),
            None => format!(
                "{what} {hash} is missing from the checkpoint store at {} (a checkpoint taken \
                 just before the machine stopped may not have reached the disk)",
                self.root.display()
            ),
        }))
    }

    /// The content stored under `hash`, checked against it.
    pub fn blob(&self, hash: &str) -> Result<Vec<u8>> {
        self.read_object("blobs", hash, "the stored content")
    }

    /// Store `manifest` whole; its hash.
    pub fn put_manifest(&self, manifest: &Manifest) -> Result<String> {
        let json =
            serde_json::to_vec(manifest).map_err(|e| Error(format!("encoding a manifest: {e}")))?;
        let hash = self.put_manifest_json(&json)?;
        self.set_depth(&hash, 0);
        Ok(hash)
    }

    /// Store `manifest` as its differences from `base` (the base's hash and manifest) when
    /// they are few and the base's chain of deltas is short, else whole; its hash. A checkpoint
    /// that changed a few paths of a large workspace then writes a few lines, not all of them.
    pub fn put_manifest_over(
        &self,
        manifest: &Manifest,
        base: Option<(&str, &Manifest)>,
    ) -> Result<String> {
        let Some((base_hash, base)) = base else {
            return self.put_manifest(manifest);
        };
        let (entries, removed) = differences(base, manifest);
        self.put_manifest_changes(manifest, base_hash, entries, removed)
    }

    /// [`Store::put_manifest_over`] with the differences known: `entries` added or changed
    /// and `removed` since the manifest `base_hash`.
    pub(crate) fn put_manifest_changes(
        &self,
        manifest: &Manifest,
        base_hash: &str,
        entries: BTreeMap<String, crate::Node>,
        removed: Vec<String>,
    ) -> Result<String> {
        let depth = self
            .depths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(base_hash)
            .copied();
        let Some(depth) = depth.filter(|d| *d < MAX_DELTA_DEPTH) else {
            return self.put_manifest(manifest);
        };
        if (entries.len() + removed.len()) * 4 > manifest.entries.len().max(64) {
            return self.put_manifest(manifest);
        }
        let delta = StoredManifest {
            version: DELTA_VERSION,
            taken_ns: manifest.taken_ns,
            base: Some(base_hash.to_owned()),
            entries,
            removed,
            skipped: manifest.skipped.clone(),
        };
        let json =
            serde_json::to_vec(&delta).map_err(|e| Error(format!("encoding a manifest: {e}")))?;
        let hash = self.put_manifest_json(&json)?;
        self.set_depth(&hash, depth + 1);
        Ok(hash)
    }

    fn put_manifest_json(&self, json: &[u8]) -> Result<String> {
        let hash = hash_hex(json);
        if !self.present("manifests", &hash) {
            let packed = zstd::bulk::compress(json, 3).map_err(io_error("compressing"))?;
            self.put_pending("manifests", &hash, &packed)?;
        }
        Ok(hash)
    }

    fn set_depth(&self, hash: &str, depth: u32) {
        self.depths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(hash.to_owned(), depth);
    }

    /// The manifest stored under `hash` (read through its chain of deltas), each part checked
    /// against its hash.
    pub fn manifest(&self, hash: &str) -> Result<Manifest> {
        self.manifest_chain(hash).1
    }

    /// The manifest `hash` resolved, and the hashes of the stored manifests it is read from
    /// (itself first, its whole one last), as far as they could be read.
    fn manifest_chain(&self, hash: &str) -> (Vec<String>, Result<Manifest>) {
        let mut chain: Vec<String> = Vec::new();
        let mut deltas: Vec<StoredManifest> = Vec::new();
        let mut next = hash.to_owned();
        let whole = loop {
            chain.push(next.clone());
            let mut stored = match self.stored_manifest(&next) {
                Ok(m) => m,
                Err(e) => break Err(e),
            };
            match stored.base.take() {
                None => break Ok(stored),
                Some(_) if deltas.len() as u32 >= MAX_DELTA_DEPTH => {
                    break Err(Error(format!(
                        "the manifest {hash} is read through more than {MAX_DELTA_DEPTH} \
                         others; the checkpoint store at {} is damaged",
                        self.root.display()
                    )));
                }
                Some(base) => {
                    deltas.push(stored);
                    next = base;
                }
            }
        };
        let resolved = whole.map(|whole| {
            let mut manifest = Manifest {
                version: whole.version,
                taken_ns: whole.taken_ns,
                entries: whole.entries,
                skipped: whole.skipped,
            };
            for delta in deltas.into_iter().rev() {
                for path in &delta.removed {
                    manifest.entries.remove(path);
                }
                manifest.entries.extend(delta.entries);
                manifest.skipped = delta.skipped;
                manifest.taken_ns = delta.taken_ns;
            }
            manifest
        });
        if resolved.is_ok() {
            self.set_depth(hash, chain.len() as u32 - 1);
        }
        (chain, resolved)
    }

    /// The first path of `manifest` whose content is not stored, if any.
    pub fn missing_content(&self, manifest: &Manifest) -> Option<String> {
        self.missing_content_cached(manifest, &mut HashMap::new())
    }

    fn missing_content_cached(
        &self,
        manifest: &Manifest,
        stored: &mut HashMap<String, bool>,
    ) -> Option<String> {
        manifest.entries.iter().find_map(|(path, node)| match node {
            crate::Node::File { hash, .. } => {
                let here = *stored
                    .entry(hash.clone())
                    .or_insert_with(|| self.has_blob(hash));
                (!here).then(|| path.clone())
            }
            _ => None,
        })
    }

    /// The checkpoints of `index` that cannot be restored, by id, with why: their manifest,
    /// or the stored content of a file they name, is missing or damaged. A crash of the
    /// machine can leave the last checkpoints before it so (see [`Store::sync`]); a rewind to
    /// one is refused, and the others restore as before.
    pub fn unrestorable(&self, index: &[Checkpoint]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut verdicts: HashMap<String, Option<String>> = HashMap::new();
        let mut stored: HashMap<String, bool> = HashMap::new();
        // The manifest read last: the next is usually stored as changes to it, so each is
        // read as those changes, not whole again.
        let mut current: Option<Resolved> = None;
        for c in index.iter().filter(|c| !c.is_dropped()) {
            let verdict = match verdicts.get(&c.manifest) {
                Some(verdict) => verdict.clone(),
                None => {
                    let verdict = match self.resolve_after(&c.manifest, &mut current, &mut stored) {
                        Err(e) => Some(e.0),
                        Ok(resolved) => resolved.missing.first().map(|path| {
                            format!(
                                "the stored content of `{path}` is missing (a checkpoint taken \
                                 just before the machine stopped may not have reached the disk)"
                            )
                        }),
                    };
                    verdicts.insert(c.manifest.clone(), verdict.clone());
                    verdict
                }
            };
            if let Some(why) = verdict {
                out.insert(c.id.clone(), why);
            }
        }
        out
    }

    /// The manifest `hash` resolved, with the paths whose content is not stored: read through
    /// its chain of deltas down to `current` (changed in place) or to a whole one. On an error
    /// `current` is left as it was.
    fn resolve_after<'a>(
        &self,
        hash: &str,
        current: &'a mut Option<Resolved>,
        stored: &mut HashMap<String, bool>,
    ) -> Result<&'a Resolved> {
        let mut is_stored = |hash: &String| {
            *stored
                .entry(hash.clone())
                .or_insert_with(|| self.has_blob(hash))
        };
        let mut deltas: Vec<StoredManifest> = Vec::new();
        let mut next = hash.to_owned();
        let mut resolved = loop {
            if current.as_ref().is_some_and(|c| c.hash == next) {
                break current.take().ok_or_else(|| Error("no manifest".into()))?;
            }
            if deltas.len() as u32 > MAX_DELTA_DEPTH {
                return Err(Error(format!(
                    "the manifest {hash} is read through more than {MAX_DELTA_DEPTH} others; \
                     the checkpoint store at {} is damaged",
                    self.root.display()
                )));
            }
            let mut part = self.stored_manifest(&next)?;
            match part.base.take() {
                Some(base) => {
                    deltas.push(part);
                    next = base;
                }
                None => {
                    let missing = part
                        .entries
                        .iter()
                        .filter_map(|(path, node)| match node {
                            crate::Node::File { hash, .. } if !is_stored(hash) => {
                                Some(path.clone())
                            }
                            _ => None,
                        })
                        .collect();
                    break Resolved {
                        hash: next,
                        manifest: Manifest {
                            version: part.version,
                            taken_ns: part.taken_ns,
                            entries: part.entries,
                            skipped: part.skipped,
                        },
                        missing,
                    };
                }
            }
        };
        for delta in deltas.into_iter().rev() {
            for path in &delta.removed {
                resolved.manifest.entries.remove(path);
                resolved.missing.remove(path);
            }
            for (path, node) in delta.entries {
                match &node {
                    crate::Node::File { hash, .. } if !is_stored(hash) => {
                        resolved.missing.insert(path.clone());
                    }
                    _ => {
                        resolved.missing.remove(&path);
                    }
                }
                resolved.manifest.entries.insert(path, node);
            }
            resolved.manifest.skipped = delta.skipped;
            resolved.manifest.taken_ns = delta.taken_ns;
        }
        resolved.hash = hash.to_owned();
        Ok(current.insert(resolved))
    }

    /// One stored manifest, whole or a delta, checked against its hash.
    fn stored_manifest(&self, hash: &str) -> Result<StoredManifest> {
        let json = self.read_object("manifests", hash, "the manifest")?;
        serde_json::from_slice(&json)
            .map_err(|e| Error(format!("reading the manifest {hash}: {e}")))
    }

    /// Make what this store wrote durable, in an order that keeps the store whole: its objects
    /// (each synced, then moved from `pending/` into place, the moves synced), then the indexes
    /// it appended to without a sync. A durable append ([`Store::append`]) runs this before its
    /// own line, so everything a durable line names is on disk first. A deferred line
    /// ([`Store::append_deferred`]) may reach the disk before its objects if the machine stops
    /// in between: an object in place is always whole, one left in `pending/` is checked
    /// against its hash before it is moved, and a checkpoint naming what is missing is
    /// reported by [`Store::unrestorable`] and refused by a rewind, never restored wrong.
    pub fn sync(&self) -> Result<()> {
        self.durability.sync(&self.root)
    }

    /// Move what other keel processes left in `pending/` into place, each checked against its
    /// hash first (one the machine stopped before it reached the disk is removed).
    fn recover_pending(&self) -> Result<()> {
        let Ok(fans) = fs::read_dir(self.root.join(PENDING)) else {
            return Ok(());
        };
        let fans: Vec<PathBuf> = fans.flatten().map(|fan| fan.path()).collect();
        let mut found = Vec::new();
        for entry in fans
            .iter()
            .filter_map(|fan| fs::read_dir(fan).ok())
            .flat_map(|entries| entries.flatten())
        {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if name.starts_with('.') {
                // A temp file of a writer killed mid-write; one being written now is young.
                let stale = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > STALE_TEMP);
                if stale {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            if let Some((kind, hash)) = parse_pending(name) {
                found.push(PendingObject {
                    pending: entry.path(),
                    kind,
                    hash,
                });
            }
        }
        let promoted = if found.is_empty() {
            Ok(())
        } else {
            let _syncing = self.durability.syncing();
            promote(&self.root, found, false)
        };
        for fan in fans {
            // Only when empty; a writer that finds it gone makes it again.
            let _ = fs::remove_dir(fan);
        }
        promoted
    }

    /// Make what this store wrote durable on another thread, soon: the caller of a deferred
    /// checkpoint does not wait for it.
    fn sync_in_background(&self) {
        if self.durability.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let durability = Arc::clone(&self.durability);
        let root = self.root.clone();
        let spawned = std::thread::Builder::new()
            .name("keel-checkpoint-sync".into())
            .spawn(move || {
                // A failure leaves the objects in `pending/`, readable, for the next sync.
                let _ = durability.sync(&root);
            });
        if spawned.is_err() {
            // The next durable checkpoint, or the store's end, syncs them.
            self.durability.scheduled.store(false, Ordering::Release);
        }
    }

    /// Where a rewind of `session` in progress is recorded until it is done
    /// ([`crate::rewind::Unfinished`]).
    pub(crate) fn unfinished_path(&self, session: &str) -> Result<PathBuf> {
        valid_session(session)?;
        Ok(self.root.join("rewinds").join(format!("{session}.json")))
    }

    fn index_path(&self, session: &str) -> Result<PathBuf> {
        valid_session(session)?;
        Ok(self.root.join("sessions").join(format!("{session}.jsonl")))
    }

    /// The checkpoints of `session`, oldest first (none when it has none). A torn last line
    /// (a process killed mid-append) is skipped.
    pub fn index(&self, session: &str) -> Result<Vec<Checkpoint>> {
        let path = self.index_path(session)?;
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(format!("reading {}", path.display()))(e)),
        };
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    /// The last checkpoint of `session`, read from the end of its index: the cost does not
    /// grow with the session's length. A torn last line is skipped.
    pub fn last(&self, session: &str) -> Result<Option<Checkpoint>> {
        let path = self.index_path(session)?;
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(format!("reading {}", path.display()))(e)),
        };
        last_in(&file).map_err(io_error(format!("reading {}", path.display())))
    }

    /// The sessions with checkpoints in this store.
    pub fn sessions(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let dir = self.root.join("sessions");
        for entry in fs::read_dir(&dir).map_err(io_error(format!("reading {}", dir.display())))? {
            let entry = entry.map_err(io_error("listing sessions"))?;
            if let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".jsonl"))
            {
                out.push(id.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The manifest of the last checkpoint of the session that appended to its index most
    /// recently; none when there is none, or it cannot be read.
    pub fn newest_manifest(&self) -> Option<Manifest> {
        self.newest_manifest_named().map(|(_, m)| m)
    }

    /// [`Store::newest_manifest`] with its hash. Sessions whose last line names no manifest
    /// that can be read (one the retention dropped by age) are passed over, a few at most.
    pub(crate) fn newest_manifest_named(&self) -> Option<(String, Manifest)> {
        let mut sessions: Vec<_> = fs::read_dir(self.root.join("sessions"))
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(".jsonl"))
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.file_name())))
            .collect();
        sessions.sort_unstable_by(|a, b| b.cmp(a));
        sessions.into_iter().take(8).find_map(|(_, name)| {
            let session = name.to_str()?.strip_suffix(".jsonl")?.to_owned();
            let last = self.last(&session).ok()??;
            let manifest = self.manifest(&last.manifest).ok()?;
            Some((last.manifest, manifest))
        })
    }

    /// Append a checkpoint of `session` under the store's lock, durably: `fill` gets the
    /// sequence number (1 + the last one) and the last checkpoint, and returns the line to
    /// write. Everything the store wrote is made durable first ([`Store::sync`]), then the line
    /// is written and synced.
    pub fn append(
        &self,
        session: &str,
        fill: impl FnOnce(u64, Option<&Checkpoint>) -> Checkpoint,
    ) -> Result<Checkpoint> {
        self.append_with(session, fill, true)
    }

    /// [`Store::append`] without waiting for the disk: the line and what it names are written
    /// (a keel process killed now loses nothing), and made durable, in that same order, on
    /// another thread soon after. If the machine stops before, the line may be lost, or name
    /// what is missing: [`Store::unrestorable`] says which.
    pub fn append_deferred(
        &self,
        session: &str,
        fill: impl FnOnce(u64, Option<&Checkpoint>) -> Checkpoint,
    ) -> Result<Checkpoint> {
        let checkpoint = self.append_with(session, fill, false)?;
        self.sync_in_background();
        Ok(checkpoint)
    }

    fn append_with(
        &self,
        session: &str,
        fill: impl FnOnce(u64, Option<&Checkpoint>) -> Checkpoint,
        durable: bool,
    ) -> Result<Checkpoint> {
        let path = self.index_path(session)?;
        let _lock = self.lock()?;
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode_private()
            .open(&path)
            .map_err(io_error(format!("opening {}", path.display())))?;
        let last = last_in(&file).map_err(io_error(format!("reading {}", path.display())))?;
        let seq = last.as_ref().map_or(1, |c| c.seq + 1);
        let mut checkpoint = fill(seq, last.as_ref());
        checkpoint.seq = seq;
        checkpoint.id = format!("c{seq}");
        checkpoint.session = session.to_owned();
        let mut line = serde_json::to_vec(&checkpoint)
            .map_err(|e| Error(format!("encoding a checkpoint: {e}")))?;
        line.push(b'\n');
        if durable {
            self.sync()?;
        }
        // A line torn by a killed writer is ended first, so this one parses.
        if !ends_with_newline(&file).map_err(io_error(format!("reading {}", path.display())))? {
            line.insert(0, b'\n');
        }
        file.write_all(&line)
            .and_then(|()| if durable { file.sync_data() } else { Ok(()) })
            .map_err(io_error(format!("writing {}", path.display())))?;
        if !durable {
            self.durability.unsynced().indexes.insert(path);
        }
        Ok(checkpoint)
    }

    /// Give the new session `to` (a fork of `from`) the checkpoints of `from` that `keep`
    /// selects, renumbered as its own: their manifests and contents are shared, as everything
    /// in the store is named by its hash. Refused when `to` has checkpoints already.
    pub fn fork_index(
        &self,
        from: &str,
        to: &str,
        keep: impl Fn(&Checkpoint) -> bool,
    ) -> Result<usize> {
        let path = self.index_path(to)?;
        // Under the lock, so a collection does not drop a manifest between this read and
        // the new index naming it.
        let _lock = self.lock()?;
        if path.exists() {
            return Err(Error(format!(
                "session `{to}` has checkpoints already; a fork's are copied only once"
            )));
        }
        let mut text = Vec::new();
        let mut seq = 0;
        for mut c in self.index(from)?.into_iter().filter(|c| keep(c)) {
            seq += 1;
            c.seq = seq;
            c.id = format!("c{seq}");
            c.session = to.to_owned();
            serde_json::to_writer(&mut text, &c)
                .map_err(|e| Error(format!("encoding a checkpoint: {e}")))?;
            text.push(b'\n');
        }
        if seq > 0 {
            write_atomic(&path, &text, true)?;
        }
        Ok(seq as usize)
    }

    /// The store's lock, held by one keel process at a time (around index appends and GC).
    pub fn lock(&self) -> Result<StoreLock> {
        self.flock("lock", LockHow::Exclusive, LOCK_WAIT)?
            .ok_or_else(|| {
                Error(format!(
                    "another keel process has held the checkpoint lock {} for over {} s; \
                     wait for it to finish, or end it if it hangs",
                    self.root.join("lock").display(),
                    LOCK_WAIT.as_secs()
                ))
            })
    }

    /// The `flock` on the store's file `name`, waiting at most `wait`; `None` when it is still
    /// held the other way after that.
    fn flock(&self, name: &str, how: LockHow, wait: Duration) -> Result<Option<StoreLock>> {
        let path = self.root.join(name);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode_private()
            .open(&path)
            .map_err(io_error(format!("opening {}", path.display())))?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let tried = match how {
                LockHow::Shared => file.try_lock_shared(),
                LockHow::Exclusive => file.try_lock(),
            };
            match tried {
                Ok(()) => return Ok(Some(StoreLock { _file: file })),
                Err(fs::TryLockError::WouldBlock) if started.elapsed() < wait => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(fs::TryLockError::WouldBlock) => return Ok(None),
                Err(fs::TryLockError::Error(e)) => {
                    return Err(io_error(format!("locking {}", path.display()))(e));
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum LockHow {
    Shared,
    Exclusive,
}

/// The store's lock; released when dropped.
pub struct StoreLock {
    _file: File,
}

/// Whether `index` is empty or ends with a whole line.
fn ends_with_newline(index: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = index.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    let mut last = [0u8; 1];
    index.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

/// The first chunk of an index read from its end; it doubles until it holds a whole line.
const TAIL_CHUNK: u64 = 8 << 10;

/// The last line of the index `index` that is a checkpoint, read from the end in chunks that
/// double only while no whole line in them parses: a line torn by a writer killed mid-append
/// (the last, or one that later appends ended) is skipped, and a line is taken as whole only
/// when the byte before it is a newline or the start of the file.
fn last_in(index: &File) -> std::io::Result<Option<Checkpoint>> {
    use std::os::unix::fs::FileExt;
    let len = index.metadata()?.len();
    let mut chunk = TAIL_CHUNK;
    // How far from the end lines were already tried, so a doubled chunk parses only the new.
    let mut tried_from = len;
    loop {
        let start = len.saturating_sub(chunk);
        let mut buf = vec![0u8; (len - start) as usize];
        index.read_exact_at(&mut buf, start)?;
        let mut end = buf.len();
        // Whole lines end at `end`; walk back over them, newest first.
        while end > 0 {
            let begin = buf[..end]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            if begin == 0 && start > 0 {
                // Its beginning is before this chunk: read more.
                break;
            }
            if start + (begin as u64) < tried_from
                && let Ok(c) = serde_json::from_slice::<Checkpoint>(&buf[begin..end])
            {
                return Ok(Some(c));
            }
            end = begin.saturating_sub(1);
        }
        tried_from = start + end as u64;
        if start == 0 {
            return Ok(None);
        }
        chunk = chunk.saturating_mul(2);
    }
}

trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

pub(crate) fn make_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(io_error(format!("making {}", dir.display()))(e)),
    }
}

/// Write `bytes` to `path` through a temp file renamed over it (synced first when `durable`).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(temp_name("."));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode_private()
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_error(format!("writing {}", path.display())))
}

/// What a folder holds on disk: its files' bytes and how many files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of the regular files (their lengths).
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
}

/// What `dir` holds, every folder beneath it included (links not followed); nothing when it
/// cannot be read.
pub fn usage(dir: &Path) -> Usage {
    let mut usage = Usage::default();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                usage.files += 1;
                usage.bytes += entry.metadata().map_or(0, |m| m.len());
            }
        }
    }
    usage
}

/// What garbage collection keeps.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Checkpoints older than this are dropped, a session's last one too: the session's index
    /// then keeps one line naming no manifest ([`Checkpoint::dropped`]), so a resumed session
    /// goes on numbering its turns where it stood.
    pub max_age: Duration,
    /// At most this many checkpoints per session, the newest.
    pub per_session: usize,
    /// At most this many bytes of stored objects in the whole store: past it the oldest
    /// checkpoints of any session are dropped (a session's last one is always kept, so the
    /// store may stay above it when those alone are larger; [`Collected::over_by`] says so).
    pub max_total_bytes: u64,
    /// Objects nothing names are deleted only once this old. No keel process records while a
    /// collection runs ([`Store::busy`]), so no grace is needed for them; a longer one keeps
    /// what a crashed recording left a little longer.
    pub grace: Duration,
}

/// The default bound of a store's total bytes: 2 GiB.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 2 << 30;

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(30 * 24 * 3600),
            per_session: 1000,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            grace: Duration::ZERO,
        }
    }
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// Checkpoints dropped from the indexes.
    pub checkpoints: usize,
    /// Blobs and manifests deleted.
    pub objects: usize,
    /// Their bytes (as stored).
    pub bytes: u64,
    /// The stored bytes the kept checkpoints name.
    pub kept_bytes: u64,
    /// By how much the kept checkpoints exceed [`Retention::max_total_bytes`]: the sessions'
    /// last checkpoints alone are larger (0 when the bound is held).
    pub over_by: u64,
}

/// How long an automatic collection waits for keel processes recording in this store.
const AUTOMATIC_WAIT: Duration = Duration::from_secs(2);

/// One stored object, as a collection sees it.
struct Object {
    path: PathBuf,
    bytes: u64,
    age: Duration,
}

impl Store {
    /// Held (shared) while a keel process records a checkpoint or rewinds: from its first
    /// object written until its index line is appended, or from reading the checkpoint to
    /// restore until the restore is done. A garbage collection holds it exclusively, so it
    /// never deletes an object a recording is about to name nor drops a checkpoint a rewind is
    /// restoring.
    pub fn busy(&self) -> Result<StoreLock> {
        self.flock("busy", LockHow::Shared, LOCK_WAIT)?
            .ok_or_else(|| {
                Error(format!(
                    "a garbage collection of the checkpoint store {} has run for over {} s; wait \
                 for it to finish, or end the keel process running it if it hangs",
                    self.root.display(),
                    LOCK_WAIT.as_secs()
                ))
            })
    }

    /// Drop the checkpoints `retention` does not keep and delete what no kept checkpoint
    /// names, waiting for keel processes that are recording in this store.
    pub fn collect_garbage(&self, retention: &Retention) -> Result<Collected> {
        let busy = self
            .flock("busy", LockHow::Exclusive, LOCK_WAIT)?
            .ok_or_else(|| {
                Error(format!(
                    "keel processes kept recording in the checkpoint store {} for over {} s; \
                     run the collection again when they are done",
                    self.root.display(),
                    LOCK_WAIT.as_secs()
                ))
            })?;
        self.collect_holding(retention, busy)
    }

    /// The collection a session runs when it starts: skipped (`None`) when other keel
    /// processes keep recording in this store for a while, and cheap when nothing is due: the
    /// manifests are read only when a checkpoint is to be dropped by age or count, or the
    /// stored objects exceed the bound.
    pub fn collect_garbage_automatically(
        &self,
        retention: &Retention,
    ) -> Result<Option<Collected>> {
        let Some(busy) = self.flock("busy", LockHow::Exclusive, AUTOMATIC_WAIT)? else {
            return Ok(None);
        };
        if !self.collection_due(retention)? {
            return Ok(Some(Collected::default()));
        }
        self.collect_holding(retention, busy).map(Some)
    }

    /// [`Store::collect_garbage_automatically`] as a session ends: it never waits for the
    /// store, skipping the collection (the next session's start runs it) when another keel
    /// process is recording; `None` then.
    pub fn collect_garbage_if_idle(&self, retention: &Retention) -> Result<Option<Collected>> {
        let Some(busy) = self.flock("busy", LockHow::Exclusive, Duration::ZERO)? else {
            return Ok(None);
        };
        if !self.collection_due(retention)? {
            return Ok(Some(Collected::default()));
        }
        self.collect_holding(retention, busy).map(Some)
    }

    /// Whether a checkpoint is to be dropped by age or count, or the store is over its bound.
    fn collection_due(&self, retention: &Retention) -> Result<bool> {
        let now_ms = crate::now_ms();
        let max_age_ms = retention.max_age.as_millis() as u64;
        for session in self.sessions()? {
            let index = self.index(&session)?;
            if index.len() > retention.per_session.max(1)
                || index.first().is_some_and(|c| {
                    !c.is_dropped() && now_ms.saturating_sub(c.time_ms) > max_age_ms
                })
            {
                return Ok(true);
            }
        }
        let stored: u64 = self
            .objects("manifests")
            .values()
            .map(|o| o.bytes)
            .sum::<u64>()
            + self.objects("blobs").values().map(|o| o.bytes).sum::<u64>();
        Ok(stored > retention.max_total_bytes)
    }

    /// Every object of `kind` (`blobs` or `manifests`), by hash.
    fn objects(&self, kind: &str) -> BTreeMap<String, Object> {
        let mut out = BTreeMap::new();
        let Ok(fans) = fs::read_dir(self.root.join(kind)) else {
            return out;
        };
        for fan in fans.flatten() {
            let prefix = fan.file_name().to_string_lossy().into_owned();
            let Ok(objects) = fs::read_dir(fan.path()) else {
                continue;
            };
            for object in objects.flatten() {
                let name = object.file_name().to_string_lossy().into_owned();
                let hash = format!("{prefix}{name}");
                // Temp files of writes in progress or killed are not objects.
                if valid_hash(&hash).is_err() {
                    continue;
                }
                let Ok(meta) = object.metadata() else {
                    continue;
                };
                let age = meta
                    .modified()
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .unwrap_or_default();
                out.insert(
                    hash,
                    Object {
                        path: object.path(),
                        bytes: meta.len(),
                        age,
                    },
                );
            }
        }
        out
    }

    /// The collection itself, `busy` held exclusively. Crash-safe in this order: every
    /// index is rewritten (temp, sync, rename, directory synced) before any object is deleted,
    /// and only objects no line of the rewritten indexes names are deleted; a collection killed
    /// at any point leaves every kept checkpoint whole.
    fn collect_holding(&self, retention: &Retention, _busy: StoreLock) -> Result<Collected> {
        let _lock = self.lock()?;
        let mut collected = Collected::default();
        let now_ms = crate::now_ms();
        let max_age_ms = retention.max_age.as_millis() as u64;
        let manifest_objects = self.objects("manifests");
        let blob_objects = self.objects("blobs");
        // Each session's index, and which of its lines age and count keep.
        let mut sessions: Vec<(String, Vec<Checkpoint>, Vec<bool>)> = Vec::new();
        for session in self.sessions()? {
            let index = self.index(&session)?;
            let n = index.len();
            let young = |c: &Checkpoint| now_ms.saturating_sub(c.time_ms) <= max_age_ms;
            // A session's last checkpoint stays unless it is past the age too (then the
            // session's index keeps only the line that says so); a line that says so stays.
            let keep = index
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    (i + 1 == n && (young(c) || c.is_dropped()))
                        || (n - i <= retention.per_session && young(c))
                })
                .collect();
            sessions.push((session, index, keep));
        }
        // How many kept lines name each manifest, and how many kept manifests each blob.
        let mut manifest_refs: BTreeMap<String, usize> = BTreeMap::new();
        for (_, index, keep) in &sessions {
            for (c, _) in index.iter().zip(keep).filter(|(_, k)| **k) {
                if !c.is_dropped() {
                    *manifest_refs.entry(c.manifest.clone()).or_default() += 1;
                }
            }
        }
        // The blobs each manifest names, and the stored manifests it is read from (itself and
        // the chain of deltas down to a whole one: kept while a kept manifest needs them). A
        // manifest that cannot be read names nothing more; its blobs may go, and the restore
        // that needs it fails with the reason.
        let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut blob_refs: BTreeMap<String, usize> = BTreeMap::new();
        let mut chain_users: BTreeMap<String, usize> = BTreeMap::new();
        for hash in manifest_refs.keys() {
            let (chain, manifest) = self.manifest_chain(hash);
            let blobs: Vec<String> = match manifest {
                Ok(m) => {
                    let set: std::collections::BTreeSet<&String> = m
                        .entries
                        .values()
                        .filter_map(|node| match node {
                            crate::Node::File { hash, .. } => Some(hash),
                            _ => None,
                        })
                        .collect();
                    set.into_iter().cloned().collect()
                }
                Err(_) => Vec::new(),
            };
            for b in &blobs {
                *blob_refs.entry(b.clone()).or_default() += 1;
            }
            for m in &chain {
                *chain_users.entry(m.clone()).or_default() += 1;
            }
            names.insert(hash.clone(), blobs);
            chains.insert(hash.clone(), chain);
        }
        let size = |objects: &BTreeMap<String, Object>, hash: &str| {
            objects.get(hash).map_or(0, |o| o.bytes)
        };
        let mut kept_bytes: u64 = chain_users
            .keys()
            .map(|h| size(&manifest_objects, h))
            .sum::<u64>()
            + blob_refs
                .keys()
                .map(|h| size(&blob_objects, h))
                .sum::<u64>();
        // Over the bound: drop the oldest checkpoints of any session (never a session's last)
        // until what the rest name fits.
        if kept_bytes > retention.max_total_bytes {
            let mut candidates: Vec<(u64, u64, usize, usize)> = Vec::new();
            for (s, (_, index, keep)) in sessions.iter().enumerate() {
                for (i, c) in index.iter().enumerate() {
                    if keep[i] && i + 1 < index.len() {
                        candidates.push((c.time_ms, c.seq, s, i));
                    }
                }
            }
            candidates.sort_unstable();
            for (_, _, s, i) in candidates {
                if kept_bytes <= retention.max_total_bytes {
                    break;
                }
                let (_, index, keep) = &mut sessions[s];
                keep[i] = false;
                let manifest = &index[i].manifest;
                let Some(refs) = manifest_refs.get_mut(manifest) else {
                    continue;
                };
                *refs -= 1;
                if *refs > 0 {
                    continue;
                }
                manifest_refs.remove(manifest);
                for m in chains.remove(manifest).unwrap_or_default() {
                    if let Some(n) = chain_users.get_mut(&m) {
                        *n -= 1;
                        if *n == 0 {
                            chain_users.remove(&m);
                            kept_bytes -= size(&manifest_objects, &m);
                        }
                    }
                }
                for b in names.remove(manifest).unwrap_or_default() {
                    if let Some(n) = blob_refs.get_mut(&b) {
                        *n -= 1;
                        if *n == 0 {
                            blob_refs.remove(&b);
                            kept_bytes -= size(&blob_objects, &b);
                        }
                    }
                }
            }
        }
        collected.kept_bytes = kept_bytes;
        collected.over_by = kept_bytes.saturating_sub(retention.max_total_bytes);
        // First the indexes, durably…
        let mut rewrote = false;
        for (session, index, keep) in &sessions {
            let dropped = keep.iter().filter(|k| !**k).count();
            if dropped == 0 {
                continue;
            }
            collected.checkpoints += dropped;
            let mut text = Vec::new();
            let mut lines: Vec<Checkpoint> = index
                .iter()
                .zip(keep)
                .filter(|(_, k)| **k)
                .map(|(c, _)| c.clone())
                .collect();
            if lines.is_empty()
                && let Some(last) = index.last()
            {
                lines.push(last.as_dropped());
                // Its unfinished rewind, if any, named what is gone.
                if let Ok(path) = self.unfinished_path(session) {
                    let _ = fs::remove_file(path);
                }
            }
            for c in &lines {
                serde_json::to_writer(&mut text, c)
                    .map_err(|e| Error(format!("encoding a checkpoint: {e}")))?;
                text.push(b'\n');
            }
            write_atomic(&self.index_path(session)?, &text, true)?;
            rewrote = true;
        }
        if rewrote {
            let dir = self.root.join("sessions");
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io_error(format!("syncing {}", dir.display())))?;
        }
        // …then what no kept line names.
        for (objects, keep) in [
            (&manifest_objects, &chain_users),
            (&blob_objects, &blob_refs),
        ] {
            for (hash, object) in objects {
                if keep.contains_key(hash) || object.age < retention.grace {
                    continue;
                }
                if fs::remove_file(&object.path).is_ok() {
                    collected.objects += 1;
                    collected.bytes += object.bytes;
                }
            }
        }
        Ok(collected)
    }
}
