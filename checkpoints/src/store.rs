//! The checkpoint store of one workspace, in keel's home (`<home>/checkpoints/<key>/`, the key
//! a hash of the workspace's path):
//!
//! ```text
//! workspace            the workspace's path, for people reading the folder
//! blobs/ab/<sha256>    a file's content, zstd-compressed, named by the SHA-256 of the content
//! manifests/ab/<sha256> a snapshot's manifest (JSON, zstd), named by the hash of its JSON
//! sessions/<id>.jsonl  a session's checkpoints, one line each, append-only
//! lock                 held (flock) around every index append and a garbage collection
//! busy                 flock shared by recordings and rewinds, exclusive for a collection
//! ```
//!
//! Content-addressed files are written to a temp name and renamed into place, so two sessions
//! writing the same blob at once both leave it whole; an index line is appended and synced
//! under the lock only after the blobs and manifest it names are on disk.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The most changed paths an index line lists.
pub const MAX_CHANGED: usize = 1000;

/// How long an index append waits for another keel process holding the lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The store of one workspace.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    workspace: PathBuf,
    /// The objects written since the last [`Store::sync`], not yet durable.
    unsynced: std::sync::Mutex<Vec<PathBuf>>,
}

/// Up to this many new objects are synced one by one (with their directories); more are
/// synced with one `syncfs`, which also flushes whatever else is pending on that file system.
const SYNC_EACH_UP_TO: usize = 64;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name for a temp file no other writer in this or another process uses.
pub(crate) fn temp_name(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}-{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
        crate::now_ns()
    )
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
    /// missing (owner-only).
    pub fn open(checkpoints_dir: &Path, workspace: &Path) -> Result<Store> {
        let root = checkpoints_dir.join(workspace_key(workspace));
        for dir in [
            checkpoints_dir.to_owned(),
            root.clone(),
            root.join("blobs"),
            root.join("manifests"),
            root.join("sessions"),
        ] {
            make_private_dir(&dir)?;
        }
        let marker = root.join("workspace");
        if !marker.exists() {
            write_atomic(&marker, workspace.as_os_str().as_encoded_bytes(), true)?;
        }
        Ok(Store {
            root,
            workspace: workspace.to_owned(),
            unsynced: std::sync::Mutex::default(),
        })
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
        self.root.join(kind).join(&hash[..2]).join(&hash[2..])
    }

    /// Whether the blob `hash` is stored.
    pub fn has_blob(&self, hash: &str) -> bool {
        valid_hash(hash).is_ok() && self.object_path("blobs", hash).exists()
    }

    /// Store `content` under `hash` (its SHA-256) unless it is there; whether it was written.
    /// Not synced: [`Store::sync`] makes every new blob durable at once before an index line
    /// names it.
    pub fn put_blob(&self, hash: &str, content: &[u8]) -> Result<bool> {
        valid_hash(hash)?;
        let path = self.object_path("blobs", hash);
        if path.exists() {
            // Touched, so a garbage collection running now keeps it for its grace period
            // while the checkpoint naming it is being recorded.
            if let Ok(f) = File::options().write(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            return Ok(false);
        }
        let packed = zstd::bulk::compress(content, 1).map_err(io_error("compressing a file"))?;
        make_private_dir(path.parent().unwrap_or(&self.root))?;
        write_atomic(&path, &packed, false)?;
        self.written(path);
        Ok(true)
    }

    /// The content stored under `hash`, checked against it.
    pub fn blob(&self, hash: &str) -> Result<Vec<u8>> {
        valid_hash(hash)?;
        let path = self.object_path("blobs", hash);
        let packed = fs::read(&path).map_err(io_error(format!(
            "reading the stored content {hash} ({})",
            path.display()
        )))?;
        let content = zstd::stream::decode_all(&packed[..])
            .map_err(io_error(format!("unpacking the stored content {hash}")))?;
        if hash_hex(&content) != hash {
            return Err(Error(format!(
                "the stored content {hash} does not match its hash; the checkpoint store at {} \
                 is damaged",
                self.root.display()
            )));
        }
        Ok(content)
    }

    /// Store `manifest`; its hash.
    pub fn put_manifest(&self, manifest: &Manifest) -> Result<String> {
        let json =
            serde_json::to_vec(manifest).map_err(|e| Error(format!("encoding a manifest: {e}")))?;
        let hash = hash_hex(&json);
        let path = self.object_path("manifests", &hash);
        if path.exists() {
            // Touched for a garbage collection running now, as a blob is.
            if let Ok(f) = File::options().write(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
        } else {
            let packed = zstd::bulk::compress(&json, 3).map_err(io_error("compressing"))?;
            make_private_dir(path.parent().unwrap_or(&self.root))?;
            write_atomic(&path, &packed, false)?;
            self.written(path);
        }
        Ok(hash)
    }

    /// The manifest stored under `hash`, checked against it.
    pub fn manifest(&self, hash: &str) -> Result<Manifest> {
        valid_hash(hash)?;
        let path = self.object_path("manifests", hash);
        let packed = fs::read(&path).map_err(io_error(format!(
            "reading the manifest {hash} ({})",
            path.display()
        )))?;
        let json = zstd::stream::decode_all(&packed[..])
            .map_err(io_error(format!("unpacking the manifest {hash}")))?;
        if hash_hex(&json) != hash {
            return Err(Error(format!(
                "the manifest {hash} does not match its hash; the checkpoint store at {} is \
                 damaged",
                self.root.display()
            )));
        }
        serde_json::from_slice(&json)
            .map_err(|e| Error(format!("reading the manifest {hash}: {e}")))
    }

    fn written(&self, path: PathBuf) {
        self.unsynced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(path);
    }

    /// Make every object written so far durable: a checkpoint that changed a few files syncs
    /// those objects and their directories, so a tool call waits on its own writes only; a
    /// large first checkpoint syncs the store's file system once instead of thousands of files.
    pub fn sync(&self) -> Result<()> {
        let written = std::mem::take(
            &mut *self
                .unsynced
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if written.is_empty() {
            return Ok(());
        }
        let failed = |e: std::io::Error| Error(format!("syncing the checkpoint store: {e}"));
        if written.len() > SYNC_EACH_UP_TO {
            let dir = File::open(&self.root).map_err(io_error("opening the checkpoint store"))?;
            return nix::unistd::syncfs(&dir).map_err(|e| failed(e.into()));
        }
        let mut dirs = std::collections::BTreeSet::new();
        for path in &written {
            File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(failed)?;
            // The object's directory, and the one above it, which may have just gained it.
            for dir in path.ancestors().skip(1).take(2) {
                dirs.insert(dir.to_owned());
            }
        }
        for dir in dirs {
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(failed)?;
        }
        Ok(())
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
        let newest = fs::read_dir(self.root.join("sessions"))
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(".jsonl"))
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.file_name())))
            .max()?;
        let session = newest.1.to_str()?.strip_suffix(".jsonl")?.to_owned();
        let last = self.last(&session).ok()??;
        self.manifest(&last.manifest).ok()
    }

    /// Append a checkpoint of `session` under the store's lock: `fill` gets the sequence
    /// number (1 + the last one) and the last checkpoint, and returns the line to write. Everything the line names must
    /// already be stored; it is synced first.
    pub fn append(
        &self,
        session: &str,
        fill: impl FnOnce(u64, Option<&Checkpoint>) -> Checkpoint,
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
        self.sync()?;
        // A line torn by a killed writer is ended first, so this one parses.
        if !ends_with_newline(&file).map_err(io_error(format!("reading {}", path.display())))? {
            line.insert(0, b'\n');
        }
        file.write_all(&line)
            .and_then(|()| file.sync_data())
            .map_err(io_error(format!("writing {}", path.display())))?;
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

fn make_private_dir(dir: &Path) -> Result<()> {
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

/// What garbage collection keeps.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Checkpoints older than this are dropped (a session's last one is always kept).
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
                || index.len() > 1 && now_ms.saturating_sub(index[0].time_ms) > max_age_ms
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
            let keep = index
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    i + 1 == n
                        || (n - i <= retention.per_session
                            && now_ms.saturating_sub(c.time_ms) <= max_age_ms)
                })
                .collect();
            sessions.push((session, index, keep));
        }
        // How many kept lines name each manifest, and how many kept manifests each blob.
        let mut manifest_refs: BTreeMap<String, usize> = BTreeMap::new();
        for (_, index, keep) in &sessions {
            for (c, _) in index.iter().zip(keep).filter(|(_, k)| **k) {
                *manifest_refs.entry(c.manifest.clone()).or_default() += 1;
            }
        }
        // The blobs each manifest names. A manifest that cannot be read names nothing more;
        // its blobs may go, and the restore that needs it fails with the reason.
        let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut blob_refs: BTreeMap<String, usize> = BTreeMap::new();
        for hash in manifest_refs.keys() {
            let blobs: Vec<String> = match self.manifest(hash) {
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
            names.insert(hash.clone(), blobs);
        }
        let size = |objects: &BTreeMap<String, Object>, hash: &str| {
            objects.get(hash).map_or(0, |o| o.bytes)
        };
        let mut kept_bytes: u64 = manifest_refs
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
                kept_bytes -= size(&manifest_objects, manifest);
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
            for (c, _) in index.iter().zip(keep).filter(|(_, k)| **k) {
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
            (&manifest_objects, &manifest_refs),
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
