//! The approval gate: whether a tool call may run, must be approved first, or is refused,
//! and how approvals are remembered.
//!
//! * A tool's declared capabilities give its baseline ([`Approval`]): running code is
//!   `Required`, writing files is `Suggested`, anything else is `Automatic`.
//! * For command tools the exec policy's verdict on the actual command refines that baseline
//!   ([`required_approval`]): Forbidden is refused without asking, Prompt asks, Allow runs.
//! * The user answers a request once, for the session, always, or denies it ([`Answer`]).
//!   Session approvals ([`SessionApprovals`]) match by the arity-aware approval key, so
//!   approving `cargo build` covers `cargo build --release`; rejections match only the exact
//!   command text.
//! * "Always" grants ([`GrantStore`]) live in a file in the user's home, never in the
//!   workspace, keyed by the canonical workspace path. Writes are atomic, private (0600 on
//!   unix) and merged with what is on disk under an exclusive lock; a revoked grant leaves a
//!   tombstone so a concurrent writer holding a stale copy cannot bring it back. Stored grants
//!   are re-checked against the current request when consulted: nothing on disk can authorize
//!   a command the exec policy now forbids.
//!
//! The verdict handed to this module should be the one from `ExecPolicy::decide` (approval
//! policy applied): under `never` a Prompt is already Forbidden, so neither session approvals
//! nor stored grants can override the `never` policy.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::exec_policy::{ApprovalMode, Decision, Verdict};
use crate::ToolCapabilities;

/// Longest approval key accepted into a session or the grant store; longer keys are never
/// remembered (they are not the short, stable prefixes remembering is meant for).
pub const MAX_KEY_LEN: usize = 1024;

/// How much approval a tool needs, from its declared capabilities alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    /// Runs without asking (reads, network-free queries).
    Automatic,
    /// Changes files: asked for under the `ask` policy, approved under `auto`.
    Suggested,
    /// Runs commands or code: always needs approval unless the exec policy allows the
    /// specific command.
    Required,
}

impl Approval {
    /// The baseline for a tool: executes code → `Required`, writes files → `Suggested`,
    /// otherwise `Automatic`.
    pub fn from_capabilities(caps: &ToolCapabilities) -> Approval {
        if caps.executes_code {
            Approval::Required
        } else if caps.writes_files {
            Approval::Suggested
        } else {
            Approval::Automatic
        }
    }
}

/// What has to happen before one particular call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// The call runs without asking.
    Proceed,
    /// The approver must be asked.
    Ask {
        /// Whether the "always" answer may be offered. Only command tools whose command was
        /// judged Prompt qualify (their approval key is a stable prefix); other tools have no
        /// key that a later call could meaningfully match.
        can_always: bool,
    },
    /// The call is refused without asking.
    Refuse {
        /// Why, for the user and the model.
        reason: String,
    },
}

/// The requirement for one call.
///
/// `exec_verdict` is the exec policy's verdict on the command for command tools (and `None`
/// for every other tool); it should come from `ExecPolicy::decide`. Rules:
///
/// * Forbidden → [`Requirement::Refuse`], whatever the capabilities (never asked, so never
///   offered "always").
/// * Prompt → ask, with "always" offerable.
/// * Allow → proceed. The per-input verdict overrides the capability baseline completely:
///   the exec policy already raises any command that writes outside the workspace, to
///   sensitive paths or through redirections it cannot read, so a command tool that also
///   declares `writes_files` is not asked about an allowed command.
/// * No verdict → the baseline: `Required` and `Suggested` ask (without "always"),
///   `Automatic` proceeds. The approval policy decides what asking means
///   ([`PolicyApprover`]: `auto` approves, `never` denies).
pub fn required_approval(caps: &ToolCapabilities, exec_verdict: Option<&Verdict>) -> Requirement {
    match exec_verdict {
        Some(v) => match v.decision {
            Decision::Forbid => Requirement::Refuse {
                reason: v.reason.clone(),
            },
            Decision::Prompt => Requirement::Ask { can_always: true },
            Decision::Allow => Requirement::Proceed,
        },
        None => match Approval::from_capabilities(caps) {
            Approval::Automatic => Requirement::Proceed,
            Approval::Suggested | Approval::Required => Requirement::Ask { can_always: false },
        },
    }
}

/// The approver's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Run this call only.
    Once,
    /// Run it, and calls with the same approval key, for the rest of the session.
    Session,
    /// Run it, and remember the approval key for this workspace across sessions.
    Always,
    /// Do not run it; the exact command is not asked about again this session.
    Deny,
}

/// Why a call without a command needs approval, from what its tool declared it does.
fn capability_reason(caps: &ToolCapabilities) -> String {
    match (caps.executes_code, caps.writes_files) {
        (true, _) => "the tool runs code or commands".into(),
        (false, true) => {
            "the tool changes files in the workspace, and the approval mode asks first".into()
        }
        (false, false) => "a guard asked for approval of this call".into(),
    }
}

/// One question put to the approver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The tool being called.
    pub tool: String,
    /// What would happen: the command line, or the path being written.
    pub summary: String,
    /// The arity-aware approval key a session or "always" answer would remember, if the call
    /// can be remembered at all.
    pub key: Option<String>,
    /// Why approval is needed.
    pub reason: String,
    /// Whether "always" may be offered; an [`Answer::Always`] to a request without it is
    /// treated as [`Answer::Session`].
    pub can_always: bool,
    /// The change a file tool was asked to make, so the approver can show it (a diff) rather
    /// than only the path.
    pub preview: Option<Preview>,
    /// Who asks when it is not the main agent: a subagent, named (`subagent `explore` #2`).
    pub requester: Option<String>,
}

/// The change a file tool call asks for, taken from its arguments: what the person approves is
/// what the tool receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preview {
    /// The whole file at `path` (relative to the workspace, or absolute) becomes `content`.
    Write {
        /// The path as the tool received it.
        path: String,
        /// The new content.
        content: String,
    },
    /// `old` becomes `new` in the file at `path` (every occurrence when `all`).
    Edit {
        /// The path as the tool received it.
        path: String,
        /// The text replaced.
        old: String,
        /// Its replacement.
        new: String,
        /// Whether every occurrence is replaced.
        all: bool,
    },
}

impl Preview {
    /// The preview of a call with `input`: a `path` with `content` is a write, a `path` with
    /// `old_string` and `new_string` an edit (the arguments of the bundled file tools and of
    /// the common file-editing tool shapes); anything else has none.
    pub fn of(input: &serde_json::Value) -> Option<Preview> {
        let text = |key: &str| input.get(key).and_then(serde_json::Value::as_str);
        let path = text("path")?.to_owned();
        if let (Some(old), Some(new)) = (text("old_string"), text("new_string")) {
            return Some(Preview::Edit {
                path,
                old: old.to_owned(),
                new: new.to_owned(),
                all: input.get("replace_all") == Some(&serde_json::Value::Bool(true)),
            });
        }
        text("content").map(|content| Preview::Write {
            path,
            content: content.to_owned(),
        })
    }
}

/// Whoever answers approval requests: an interactive prompt, or a fixed policy.
pub trait Approver: Send + Sync {
    /// Answers one request. Must not panic; when in doubt, [`Answer::Deny`].
    fn ask(&self, request: &ApprovalRequest) -> Answer;

    /// Answers one request, with what the person said to do instead when the answer is
    /// [`Answer::Deny`] ("no, and …"); it reaches the model with the refusal. By default,
    /// [`Approver::ask`] and nothing said.
    fn ask_why(&self, request: &ApprovalRequest) -> (Answer, Option<String>) {
        (self.ask(request), None)
    }
}

/// The most of what a person said with a "no" that reaches the model.
pub const INSTEAD_MAX: usize = 2_000;

/// The approver when there is nobody to ask: every request is denied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DenyAll;

impl Approver for DenyAll {
    fn ask(&self, _request: &ApprovalRequest) -> Answer {
        Answer::Deny
    }
}

/// A non-interactive approver for `--approval ask|never|auto`: `auto` approves each request
/// once (it never remembers anything), `never` denies, and `ask` denies too, since there is
/// no terminal to ask on (interactive front ends supply their own [`Approver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyApprover(pub ApprovalMode);

impl Approver for PolicyApprover {
    fn ask(&self, _request: &ApprovalRequest) -> Answer {
        match self.0 {
            ApprovalMode::Auto => Answer::Once,
            ApprovalMode::Ask | ApprovalMode::Never => Answer::Deny,
        }
    }
}

/// Errors of the approval gate (the grant store, in practice).
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// The grant store would live inside the workspace it authorizes.
    #[error("grant store {store} is inside workspace {workspace}; grants must live outside it")]
    StoreInsideWorkspace {
        /// The store path.
        store: PathBuf,
        /// The canonical workspace.
        workspace: PathBuf,
    },
    /// A grant was written for a workspace other than the store's.
    #[error("grant store is keyed by workspace {expected}, not {given}")]
    WorkspaceMismatch {
        /// The store's canonical workspace.
        expected: PathBuf,
        /// The workspace given.
        given: PathBuf,
    },
    /// The key cannot be remembered (empty, too long, or containing control characters).
    #[error("approval key cannot be remembered: {0:?}")]
    InvalidKey(String),
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The grants could not be serialized.
    #[error("serializing grants: {0}")]
    Serialize(#[from] serde_json::Error),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ApprovalError + use<> {
    let path = path.to_path_buf();
    move |source| ApprovalError::Io {
        action,
        path,
        source,
    }
}

/// Locks a mutex, recovering from poisoning: the guarded data are plain sets and maps with no
/// invariant a panicking holder could have left half-made, and losing them (re-prompting for
/// everything) would be worse.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key_ok(key: &str) -> bool {
    !key.trim().is_empty() && key.len() <= MAX_KEY_LEN && !key.chars().any(char::is_control)
}

#[derive(Debug, Default)]
struct SessionState {
    approved_keys: HashSet<String>,
    rejected: HashSet<String>,
}

/// What this session already answered.
///
/// Approvals are remembered by approval key (approving `cargo build` covers
/// `cargo build --release`, not `cargo test`); rejections by the exact command text, and a
/// rejection of the exact text wins over an approval of its key. Nothing remembered ever
/// applies to a Forbidden verdict.
#[derive(Debug, Default)]
pub struct SessionApprovals {
    state: Mutex<SessionState>,
}

impl SessionApprovals {
    /// An empty session.
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers an approval for `key` for the rest of the session. Keys that cannot be
    /// remembered (empty, overlong, control characters) are ignored; returns whether it was
    /// remembered.
    pub fn approve(&self, key: &str) -> bool {
        if !key_ok(key) {
            return false;
        }
        lock(&self.state).approved_keys.insert(key.to_owned());
        true
    }

    /// Remembers a rejection of exactly `command`.
    pub fn reject(&self, command: &str) {
        lock(&self.state).rejected.insert(command.to_owned());
    }

    /// Whether exactly `command` was rejected this session.
    pub fn is_rejected(&self, command: &str) -> bool {
        lock(&self.state).rejected.contains(command)
    }

    /// The approval keys approved for the rest of the session, sorted.
    pub fn approved_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.state).approved_keys.iter().cloned().collect();
        keys.sort();
        keys
    }

    /// The commands refused word for word this session, sorted.
    pub fn rejected(&self) -> Vec<String> {
        let mut commands: Vec<String> = lock(&self.state).rejected.iter().cloned().collect();
        commands.sort();
        commands
    }

    /// Withdraws the session approval of `key`: its calls are asked about again. Whether there
    /// was one.
    pub fn revoke(&self, key: &str) -> bool {
        lock(&self.state).approved_keys.remove(key)
    }

    /// Forgets the rejection of exactly `command`: it is asked about again. Whether there was
    /// one.
    pub fn forget_rejection(&self, command: &str) -> bool {
        lock(&self.state).rejected.remove(command)
    }

    /// Whether a session approval covers a call with approval key `key` and the current
    /// `verdict`: never for a Forbidden verdict, never for a command rejected word for word.
    pub fn is_approved(&self, key: &str, verdict: &Verdict) -> bool {
        if verdict.decision == Decision::Forbid {
            return false;
        }
        let state = lock(&self.state);
        !state.rejected.contains(&verdict.command) && state.approved_keys.contains(key)
    }
}

/// A problem the grant store worked around rather than failing on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreWarning {
    /// The store file concerned.
    pub path: PathBuf,
    /// What happened.
    pub message: String,
}

impl fmt::Display for StoreWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

/// One stored key: a grant, or a tombstone recording that it was revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// False for a tombstone.
    granted: bool,
    /// The store's logical clock at the time of the change; the higher stamp wins a merge,
    /// and on equal stamps the tombstone wins.
    stamp: u64,
    /// Wall-clock seconds since the epoch, for people reading the file.
    #[serde(default)]
    at: u64,
}

impl Entry {
    fn beats(&self, other: &Entry) -> bool {
        self.stamp > other.stamp || (self.stamp == other.stamp && !self.granted && other.granted)
    }
}

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Doc {
    version: u32,
    /// The highest stamp ever handed out.
    clock: u64,
    /// Canonical workspace path → key → entry.
    workspaces: BTreeMap<String, BTreeMap<String, Entry>>,
}

const DOC_VERSION: u32 = 1;

impl Doc {
    /// Merges `other` into `self`, entry by entry; the newer stamp wins.
    fn merge(&mut self, other: &Doc) {
        self.clock = self.clock.max(other.clock);
        for (ws, entries) in &other.workspaces {
            let mine = self.workspaces.entry(ws.clone()).or_default();
            for (key, theirs) in entries {
                match mine.get(key) {
                    Some(e) if !theirs.beats(e) => {}
                    _ => {
                        mine.insert(key.clone(), theirs.clone());
                    }
                }
            }
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Persistent "always" grants, in a file outside the workspace (e.g.
/// `~/.keel/approvals.json`), keyed by canonical workspace path.
///
/// Every change is a read-merge-write under an exclusive lock on a sibling `.lock` file: the
/// file on disk is read, the one change is merged into it with a fresh stamp (one above the
/// file's logical clock), and the result is written to a temp file in the same directory
/// (mode 0600 on unix, fsynced), renamed over the file, and the directory fsynced. A store
/// never writes back a cached copy of the file, so concurrent stores cannot undo each
/// other's changes, and a user's hand edit or deletion of the file is respected. A revoke
/// leaves a tombstone, and the merge lets the higher stamp win (a tombstone wins a tie), so a
/// revoked grant is not resurrected by merging in any older state. Reads ([`is_granted`],
/// [`list`]) consult the file every time. An unreadable file is moved aside as
/// `<name>.corrupt-<time>` (under the lock) and treated as empty, with a [`StoreWarning`].
/// Tombstones are kept indefinitely (a few bytes each).
///
/// [`is_granted`]: GrantStore::is_granted
/// [`list`]: GrantStore::list
#[derive(Debug)]
pub struct GrantStore {
    path: PathBuf,
    lock_path: PathBuf,
    workspace: PathBuf,
    warnings: Mutex<Vec<StoreWarning>>,
}

impl GrantStore {
    /// Opens (without creating) the store at `path` for `workspace`, returning it with any
    /// warnings from reading the file. Refuses a `path` inside `workspace` (after resolving
    /// symlinks): a workspace must not be able to authorize itself. Creates the store's
    /// directory if missing.
    pub fn open(path: &Path, workspace: &Path) -> Result<(Self, Vec<StoreWarning>), ApprovalError> {
        Self::open_in_home(path, workspace, None)
    }

    /// As [`open`](GrantStore::open), except that a `path` inside keel's `home` is accepted
    /// even when the workspace holds that home (keel run in the person's home directory): the
    /// kernel carves keel's home out of every grant of the workspace and the sandbox hides it
    /// from commands, so the workspace still cannot authorize itself.
    pub fn open_in_home(
        path: &Path,
        workspace: &Path,
        home: Option<&Path>,
    ) -> Result<(Self, Vec<StoreWarning>), ApprovalError> {
        let home = home.and_then(|h| fs::canonicalize(h).ok());
        let workspace = fs::canonicalize(workspace).map_err(io_err("resolving", workspace))?;
        let file_name = path.file_name().ok_or_else(|| ApprovalError::Io {
            action: "opening grant store",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        })?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let parent_canon = fs::canonicalize(&parent).ok();
        let mut resolved = match &parent_canon {
            Some(p) => p.join(file_name),
            None => resolve_lenient(&parent)?.join(file_name),
        };
        if let Ok(target) = fs::canonicalize(&resolved) {
            resolved = target;
        }
        // Lexically normalised: `<ws>/../h` is a sibling of the workspace, yet `starts_with`
        // on the unnormalised `<ws>/../h/approvals.json` would call it inside.
        let lexical = normalize_lexically(&absolute(path)?);
        let in_home = home.as_ref().is_some_and(|h| resolved.starts_with(h));
        if (resolved.starts_with(&workspace) || lexical.starts_with(&workspace)) && !in_home {
            return Err(ApprovalError::StoreInsideWorkspace {
                store: path.to_path_buf(),
                workspace,
            });
        }
        if parent_canon.is_none() {
            create_private_dir(&parent)?;
        }
        let path = resolved;
        let mut lock_name = file_name.to_os_string();
        lock_name.push(".lock");
        let lock_path = path.with_file_name(lock_name);
        let store = GrantStore {
            path,
            lock_path,
            workspace,
            warnings: Mutex::new(Vec::new()),
        };
        let mut warnings = Vec::new();
        store.read_disk(false, &mut warnings)?;
        Ok((store, warnings))
    }

    /// The store file (resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The canonical workspace this store is keyed by.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Drains the warnings collected by reads since the last call.
    pub fn take_warnings(&self) -> Vec<StoreWarning> {
        std::mem::take(&mut *lock(&self.warnings))
    }

    /// Grants `key` for `workspace` (which must be the store's workspace) across sessions.
    /// Returns warnings from reading the file (a corrupt file is set aside, not fatal).
    pub fn grant(&self, workspace: &Path, key: &str) -> Result<Vec<StoreWarning>, ApprovalError> {
        self.change(workspace, key, true)
    }

    /// Revokes `key` for `workspace`, leaving a tombstone. Revoking an unknown key still
    /// records the tombstone (it also stops a concurrent stale grant).
    pub fn revoke(&self, workspace: &Path, key: &str) -> Result<Vec<StoreWarning>, ApprovalError> {
        self.change(workspace, key, false)
    }

    /// Whether a stored grant authorizes a call with approval key `key` in `workspace` whose
    /// current verdict is `verdict`. Re-checked on every call against the file on disk:
    /// false for a Forbidden verdict or one decided under the `never` policy, for a workspace
    /// other than the store's, for a key that cannot be remembered, and for revoked keys. An
    /// unreadable file grants nothing (see [`GrantStore::take_warnings`]).
    pub fn is_granted(&self, workspace: &Path, key: &str, verdict: &Verdict) -> bool {
        if verdict.decision == Decision::Forbid
            || verdict.approval == Some(ApprovalMode::Never)
            || !key_ok(key)
        {
            return false;
        }
        let Ok(ws) = self.check_workspace(workspace) else {
            return false;
        };
        let mut warnings = Vec::new();
        let granted = match self.read_disk(false, &mut warnings) {
            Ok(disk) => disk
                .workspaces
                .get(&ws)
                .and_then(|m| m.get(key))
                .is_some_and(|e| e.granted),
            Err(e) => {
                warnings.push(StoreWarning {
                    path: self.path.clone(),
                    message: format!("{e}; no stored grants used"),
                });
                false
            }
        };
        lock(&self.warnings).extend(warnings);
        granted
    }

    /// The keys currently granted for `workspace`, sorted (empty for another workspace).
    pub fn list(&self, workspace: &Path) -> Result<Vec<String>, ApprovalError> {
        let ws = self.check_workspace(workspace)?;
        let mut warnings = Vec::new();
        let disk = self.read_disk(false, &mut warnings)?;
        lock(&self.warnings).extend(warnings);
        Ok(disk
            .workspaces
            .get(&ws)
            .map(|m| {
                m.iter()
                    .filter(|(_, e)| e.granted)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    fn check_workspace(&self, workspace: &Path) -> Result<String, ApprovalError> {
        let given = fs::canonicalize(workspace).map_err(io_err("resolving", workspace))?;
        if given != self.workspace {
            return Err(ApprovalError::WorkspaceMismatch {
                expected: self.workspace.clone(),
                given,
            });
        }
        Ok(given.to_string_lossy().into_owned())
    }

    fn change(
        &self,
        workspace: &Path,
        key: &str,
        granted: bool,
    ) -> Result<Vec<StoreWarning>, ApprovalError> {
        if !key_ok(key) {
            return Err(ApprovalError::InvalidKey(key.to_owned()));
        }
        let ws = self.check_workspace(workspace)?;
        let lock_file = open_private(&self.lock_path, false)?;
        lock_file
            .lock()
            .map_err(io_err("locking", &self.lock_path))?;
        // Every writer holds this lock, so a temp file of the store now is a killed writer's.
        self.remove_stale_temps();
        let mut warnings = Vec::new();
        let result = (|| {
            let mut doc = self.read_disk(true, &mut warnings)?;
            let stamp = doc.clock.saturating_add(1);
            let mut change = Doc {
                version: DOC_VERSION,
                clock: stamp,
                workspaces: BTreeMap::new(),
            };
            let entry = Entry {
                granted,
                stamp,
                at: now_secs(),
            };
            change
                .workspaces
                .entry(ws)
                .or_default()
                .insert(key.to_owned(), entry);
            doc.merge(&change);
            doc.version = DOC_VERSION;
            self.write_atomic(&doc)
        })();
        // Dropping the file releases the lock as well; unlocking first just says so.
        let _ = lock_file.unlock();
        result.map(|()| warnings)
    }

    /// Reads the file. Missing → empty. Unparseable → empty plus a warning; when `set_aside`
    /// (only under the lock) the file is also renamed to `<name>.corrupt-<time>`.
    fn read_disk(
        &self,
        set_aside: bool,
        warnings: &mut Vec<StoreWarning>,
    ) -> Result<Doc, ApprovalError> {
        let mut text = String::new();
        match File::open(&self.path) {
            Ok(mut f) => {
                if let Err(e) = f.read_to_string(&mut text) {
                    if e.kind() != io::ErrorKind::InvalidData {
                        return Err(io_err("reading", &self.path)(e));
                    }
                    text.clear();
                    text.push('\u{0}');
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Doc::default()),
            Err(e) => return Err(io_err("reading", &self.path)(e)),
        }
        match serde_json::from_str::<Doc>(&text) {
            Ok(doc) if doc.version <= DOC_VERSION => Ok(doc),
            parsed => {
                let why = match parsed {
                    Ok(doc) => format!("unknown version {}", doc.version),
                    Err(e) => e.to_string(),
                };
                let mut message = format!("grant store is unreadable ({why}); treated as empty");
                if set_aside {
                    let aside = self.aside_path();
                    match fs::rename(&self.path, &aside) {
                        Ok(()) => message.push_str(&format!("; kept as {}", aside.display())),
                        Err(e) => {
                            return Err(io_err("setting aside corrupt grant store", &self.path)(e));
                        }
                    }
                }
                warnings.push(StoreWarning {
                    path: self.path.clone(),
                    message,
                });
                Ok(Doc::default())
            }
        }
    }

    fn aside_path(&self) -> PathBuf {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut n = 0u32;
        loop {
            let candidate = if n == 0 {
                self.path.with_file_name(format!("{name}.corrupt-{stamp}"))
            } else {
                self.path
                    .with_file_name(format!("{name}.corrupt-{stamp}-{n}"))
            };
            if !candidate.exists() {
                return candidate;
            }
            n = n.saturating_add(1);
        }
    }

    /// Removes the temp files (`.<name>.tmp-<pid>-<n>`) a killed writer left. Only under the
    /// lock.
    fn remove_stale_temps(&self) {
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return;
        };
        let prefix = format!(".{}.tmp-", name.to_string_lossy());
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix)
                && entry.file_type().is_ok_and(|t| t.is_file())
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    fn write_atomic(&self, doc: &Doc) -> Result<(), ApprovalError> {
        let text = serde_json::to_string_pretty(doc)?;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = self.path.with_file_name(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = open_private(&tmp, true)?;
            f.write_all(text.as_bytes())
                .map_err(io_err("writing", &tmp))?;
            f.write_all(b"\n").map_err(io_err("writing", &tmp))?;
            f.sync_all().map_err(io_err("syncing", &tmp))?;
            fs::rename(&tmp, &self.path).map_err(io_err("replacing", &self.path))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        sync_dir(&self.path)
    }
}

fn absolute(path: &Path) -> Result<PathBuf, ApprovalError> {
    std::path::absolute(path).map_err(io_err("resolving", path))
}

/// `path` with `.` and `..` components resolved by name alone (no symlinks followed); `..`
/// at the root stays at the root.
pub fn normalize_lexically(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                Some(Component::ParentDir | Component::CurDir) | None => out.push(part),
            },
            other => out.push(other),
        }
    }
    out
}

/// Resolves symlinks in the longest existing ancestor of `path` and appends the rest.
fn resolve_lenient(path: &Path) -> Result<PathBuf, ApprovalError> {
    let abs = absolute(path)?;
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(canon) = fs::canonicalize(cur) {
            return Ok(rest.iter().rev().fold(canon, |acc, part| acc.join(part)));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return Ok(abs),
        }
    }
}

/// Opens `path` for writing with mode 0600 on unix (`create_new` for temp files).
fn open_private(path: &Path, create_new: bool) -> Result<File, ApprovalError> {
    let mut opts = OpenOptions::new();
    opts.write(true);
    if create_new {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(false);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let f = opts.open(path).map_err(io_err("opening", path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(io_err("restricting permissions of", path))?;
    }
    Ok(f)
}

fn create_private_dir(dir: &Path) -> Result<(), ApprovalError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(io_err("creating", dir))
}

/// Makes a rename durable by syncing its directory (a no-op where directories cannot be
/// opened, i.e. off unix).
fn sync_dir(file: &Path) -> Result<(), ApprovalError> {
    #[cfg(unix)]
    {
        if let Some(dir) = file.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err("syncing", dir))?;
        }
    }
    #[cfg(not(unix))]
    let _ = file;
    Ok(())
}

/// Everything the gate consults for one call.
pub struct Approvals<'a> {
    /// This session's answers.
    pub session: &'a SessionApprovals,
    /// The persistent grants, if any.
    pub grants: Option<&'a GrantStore>,
    /// The workspace the call runs in.
    pub workspace: &'a Path,
    /// Who answers requests ([`DenyAll`] when nobody can).
    pub approver: &'a dyn Approver,
}

/// The gate's ruling on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The call may run.
    Run,
    /// The call must not run.
    Refused {
        /// Why.
        reason: String,
    },
}

/// A ruling plus anything worth telling the user (e.g. an "always" grant that could not be
/// saved and was kept for the session instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruling {
    /// The ruling.
    pub outcome: Outcome,
    /// Problems worked around.
    pub warnings: Vec<String>,
}

impl Approvals<'_> {
    /// Rules on one call of `tool` (capabilities `caps`) doing `summary`. For command tools
    /// pass the command's approval key (`ExecPolicy::approval_key`) and its verdict
    /// (`ExecPolicy::decide`). Order: refusals and allowed calls are settled by
    /// [`required_approval`]; then an exact-text session rejection refuses; a session
    /// approval or stored grant for the key runs; otherwise the approver is asked.
    pub fn authorize(
        &self,
        tool: &str,
        caps: &ToolCapabilities,
        summary: &str,
        key: Option<&str>,
        verdict: Option<&Verdict>,
        preview: Option<Preview>,
    ) -> Ruling {
        self.authorize_for(None, tool, caps, summary, key, verdict, preview)
    }

    /// [`authorize`](Self::authorize) for a call `requester` (a subagent, named) made; the
    /// question names it.
    #[allow(clippy::too_many_arguments)]
    pub fn authorize_for(
        &self,
        requester: Option<&str>,
        tool: &str,
        caps: &ToolCapabilities,
        summary: &str,
        key: Option<&str>,
        verdict: Option<&Verdict>,
        preview: Option<Preview>,
    ) -> Ruling {
        let mut warnings = Vec::new();
        let can_always = match required_approval(caps, verdict) {
            Requirement::Proceed => return ruling(Outcome::Run, warnings),
            Requirement::Refuse { reason } => {
                return ruling(Outcome::Refused { reason }, warnings);
            }
            Requirement::Ask { can_always } => can_always,
        };
        if self.session.is_rejected(summary) {
            let reason = format!("`{summary}` was already denied this session");
            return ruling(Outcome::Refused { reason }, warnings);
        }
        let key = key.filter(|k| key_ok(k));
        if let (Some(k), Some(v)) = (key, verdict) {
            if self.session.is_approved(k, v) {
                return ruling(Outcome::Run, warnings);
            }
            if let Some(store) = self.grants {
                let granted = store.is_granted(self.workspace, k, v);
                warnings.extend(store.take_warnings().iter().map(ToString::to_string));
                if granted {
                    return ruling(Outcome::Run, warnings);
                }
            }
        }
        let request = ApprovalRequest {
            tool: tool.to_owned(),
            summary: summary.to_owned(),
            key: key.map(str::to_owned),
            reason: verdict.map_or_else(|| capability_reason(caps), |v| v.reason.clone()),
            can_always: can_always && key.is_some() && self.grants.is_some(),
            preview,
            requester: requester.map(str::to_owned),
        };
        let (mut answer, instead) = self.approver.ask_why(&request);
        if answer == Answer::Always && !request.can_always {
            answer = Answer::Session;
        }
        match answer {
            Answer::Once => {}
            Answer::Session => {
                if let Some(k) = key {
                    self.session.approve(k);
                }
            }
            Answer::Always => {
                if let (Some(k), Some(store)) = (key, self.grants) {
                    match store.grant(self.workspace, k) {
                        Ok(w) => warnings.extend(w.iter().map(ToString::to_string)),
                        Err(e) => {
                            warnings.push(format!("{e}; approved for this session only"));
                        }
                    }
                    self.session.approve(k);
                }
            }
            Answer::Deny => {
                self.session.reject(summary);
                let reason = match instead.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
                    Some(said) => {
                        let said: String = said.chars().take(INSTEAD_MAX).collect();
                        format!("the user denied `{summary}` and said: {said}")
                    }
                    None => format!("the user denied `{summary}`"),
                };
                return ruling(Outcome::Refused { reason }, warnings);
            }
        }
        ruling(Outcome::Run, warnings)
    }
}

fn ruling(outcome: Outcome, warnings: Vec<String>) -> Ruling {
    Ruling { outcome, warnings }
}

#[cfg(test)]
#[path = "approvals_tests.rs"]
mod tests;
