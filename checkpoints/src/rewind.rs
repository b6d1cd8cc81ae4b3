//! A whole rewind of the workspace's files: find the checkpoint, see what would change, refuse
//! what would overwrite changes made outside keel, take a safety checkpoint, restore, and
//! record what the rewind left.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::recorder::Recorder;
use crate::restore::{self, Applied, Plan};
use crate::snapshot::{Manifest, Node, Skipped, snapshot_covering};
use crate::store::{Checkpoint, Kind, Store};
use crate::{Error, Result};

/// Which recorded state to go back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The state before turn N.
    Turn(u64),
    /// The state before tool call ID.
    Call(String),
    /// A checkpoint by id (`c7`), such as a rewind's safety checkpoint.
    Checkpoint(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Turn(n) => write!(f, "before turn {n}"),
            Target::Call(id) => write!(f, "before call {id}"),
            Target::Checkpoint(id) => write!(f, "checkpoint {id}"),
        }
    }
}

/// The checkpoint of `session` that `target` names.
pub fn find(index: &[Checkpoint], session: &str, target: &Target) -> Result<Checkpoint> {
    // A line standing for checkpoints dropped by age names nothing to go back to.
    let dropped = index.iter().any(Checkpoint::is_dropped);
    let index: Vec<&Checkpoint> = index.iter().filter(|c| !c.is_dropped()).collect();
    let found = match target {
        Target::Turn(n) => index
            .iter()
            .find(|c| c.kind == Kind::BeforeTurn && c.turn == *n),
        Target::Call(id) => index
            .iter()
            .find(|c| c.kind == Kind::BeforeCall && c.call.as_deref() == Some(id)),
        Target::Checkpoint(id) => index.iter().find(|c| &c.id == id),
    };
    found.map(|c| (*c).clone()).ok_or_else(|| {
        Error(if index.is_empty() && dropped {
            format!(
                "session `{session}` has no checkpoint {target} any more: the retention \
                 dropped its checkpoints, older than `[checkpoints] max-age-days`"
            )
        } else if index.is_empty() {
            format!(
                "session `{session}` has no checkpoints in this workspace (checkpoints are \
                 taken per workspace; run keel in the workspace the session worked in, or \
                 pass --workspace)"
            )
        } else {
            format!(
                "session `{session}` has no checkpoint {target}; `keel checkpoints list \
                 {session}` shows them"
            )
        })
    })
}

/// The error of a rewind to a checkpoint whose stored state cannot be read whole.
fn cannot_restore(session: &str, checkpoint: &Checkpoint, e: Error) -> Error {
    Error(format!(
        "checkpoint {} cannot be restored, so nothing was changed: {e}. `keel checkpoints list \
         {session}` marks the checkpoints that cannot be restored; rewind to another one",
        checkpoint.id
    ))
}

/// Read every content `plan` writes that is not in `checked` yet, each checked against its
/// hash.
fn check_contents(
    recorder: &Recorder,
    session: &str,
    target: &Checkpoint,
    plan: &Plan,
    checked: &mut BTreeSet<String>,
) -> Result<()> {
    for change in &plan.changes {
        if let restore::Change::Write { hash, .. } = change
            && !checked.contains(hash)
        {
            recorder
                .store()
                .blob(hash)
                .map_err(|e| cannot_restore(session, target, e))?;
            checked.insert(hash.clone());
        }
    }
    Ok(())
}

/// A rewind of the files in progress, recorded in the store (`rewinds/<session>.json`, synced)
/// once its safety checkpoint is taken and before the restore changes anything, and removed
/// once what it left is recorded. Found later, it is a rewind that was stopped (killed, the
/// machine stopped) part way: what it changed is keel's own doing, not a change made outside
/// keel ([`KeelMade`]), so the next rewind finishes or undoes it without `--force`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unfinished {
    /// The checkpoint the rewind was restoring.
    pub target: String,
    /// Its manifest.
    pub target_manifest: String,
    /// The safety checkpoint taken before it changed anything: restoring it undoes the rewind.
    pub safety: String,
    /// Its manifest.
    pub safety_manifest: String,
    /// The tag of its temp files' names ([`restore::temp_prefix`]).
    pub temp_tag: String,
    /// When it started (ms since the Unix epoch).
    pub time_ms: u64,
}

/// The unfinished rewind of `session`'s files, if one was stopped part way (an unreadable
/// record counts as none: the rewind's changes are then named as made outside keel, as
/// before such records were kept).
pub fn unfinished(store: &Store, session: &str) -> Option<Unfinished> {
    let path = store.unfinished_path(session).ok()?;
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

fn record_unfinished(store: &Store, session: &str, rewind: &Unfinished) -> Result<()> {
    let path = store.unfinished_path(session)?;
    let dir = path.parent().unwrap_or(store.root());
    crate::store::make_private_dir(dir)?;
    let json = serde_json::to_vec(rewind).map_err(|e| Error(format!("encoding a rewind: {e}")))?;
    crate::store::write_atomic(&path, &json, true)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(crate::io_error(format!("syncing {}", dir.display())))
}

fn finished(store: &Store, session: &str) {
    if let Ok(path) = store.unfinished_path(session) {
        let _ = std::fs::remove_file(path);
    }
}

/// What an unfinished rewind changed: the paths its plan touched, each now as the rewind's
/// safety checkpoint or its target recorded it (a directory of either's kind, whatever its
/// mode: a restore sets directory modes last), and the temp files it names by its tag. Such a
/// path holds nothing that is not stored, so it is keel's own doing, never a change made
/// outside keel; a path holding anything else (an edit the person made since) is not.
#[derive(Debug)]
pub(crate) struct KeelMade {
    rewind: Unfinished,
    touched: BTreeSet<String>,
    safety: Manifest,
    target: Manifest,
    plan: Plan,
}

impl KeelMade {
    /// The unfinished rewind of `session`, with the manifests it went between; none when
    /// there is none or they cannot be read.
    pub(crate) fn of(store: &Store, session: &str) -> Option<KeelMade> {
        let rewind = unfinished(store, session)?;
        let safety = store.manifest(&rewind.safety_manifest).ok()?;
        let target = store.manifest(&rewind.target_manifest).ok()?;
        let plan = restore::plan(&safety, &target).ok()?;
        Some(KeelMade {
            touched: plan.paths(),
            rewind,
            safety,
            target,
            plan,
        })
    }

    /// Whether `path`, now `now`, is as the unfinished rewind left it.
    pub(crate) fn made(&self, path: &str, now: Option<&Node>) -> bool {
        let prefix = restore::temp_prefix(&self.rewind.temp_tag);
        if path
            .rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with(&prefix))
        {
            return true;
        }
        let matches = |recorded: Option<&Node>| match (now, recorded) {
            (None, None) => true,
            (Some(Node::Dir { .. }), Some(Node::Dir { .. })) => true,
            (Some(a), Some(b)) => a.same_as(b),
            _ => false,
        };
        self.touched.contains(path)
            && (matches(self.safety.entries.get(path)) || matches(self.target.entries.get(path)))
    }

    /// Remove the temp files the rewind left (they hold nothing a checkpoint lacks).
    pub(crate) fn remove_temp_files(&self, workspace: &std::path::Path) -> usize {
        restore::remove_temp_files(workspace, &self.plan, &self.rewind.temp_tag)
    }
}

/// What a rewind would do, before it does anything.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The checkpoint restored.
    pub target: Checkpoint,
    /// The workspace as it is now.
    pub current: Manifest,
    /// The changes.
    pub plan: Plan,
    /// Paths the plan would change that changed outside keel since the checkpoint (or are too
    /// large for the safety checkpoint to keep): overwriting them cannot be undone.
    pub conflicts: Vec<String>,
    /// What the checkpoint did not record (too large, unreadable…), so cannot bring back.
    pub not_recorded: Vec<Skipped>,
}

impl Preview {
    /// The plan as lines for a person (`+`, `-`, `~`).
    pub fn lines(&self) -> Vec<String> {
        self.plan.describe(&self.current)
    }
}

/// What a rewind did.
#[derive(Debug, Clone)]
pub struct Report {
    /// What it set out to do.
    pub preview: Preview,
    /// The checkpoint taken before anything changed: restoring it undoes the rewind.
    pub safety: Checkpoint,
    /// The checkpoint of what the rewind left.
    pub restored: Checkpoint,
    /// Changes made and changes that failed.
    pub applied: Applied,
}

/// See what rewinding `session`'s files to `target` would change.
pub fn prepare(recorder: &Recorder, session: &str, target: &Target) -> Result<Preview> {
    let store = recorder.store();
    // No garbage collection drops what this reads, nor the objects its walk writes, meanwhile.
    let _busy = store.busy()?;
    let index = store.index(session)?;
    let checkpoint = find(&index, session, target)?;
    let wanted = store
        .manifest(&checkpoint.manifest)
        .map_err(|e| cannot_restore(session, &checkpoint, e))?;
    // The session's last checkpoint that can be read (one the machine stopped before it
    // reached the disk is passed over: what changed since the one before counts as changed
    // outside keel, so it is named, not overwritten unasked).
    let last = index
        .iter()
        .rev()
        .find_map(|c| store.manifest(&c.manifest).ok());
    let current = snapshot_covering(
        store,
        store.workspace(),
        recorder.settings(),
        last.as_ref(),
        last.as_ref(),
    )?;
    let plan = restore::plan(&current, &wanted)?;
    // Changed outside keel: recorded as such by a checkpoint after the target, or since the
    // session's last checkpoint.
    let mut outside: BTreeSet<String> = index
        .iter()
        .filter(|c| c.seq > checkpoint.seq && c.outside)
        .flat_map(|c| c.changed.iter().cloned())
        .collect();
    if let Some(last) = &last {
        outside.extend(last.changed_paths(&current));
    }
    // A rewind of this session stopped part way: what it changed, and nothing else, is
    // keel's own doing.
    if let Some(made) = KeelMade::of(store, session) {
        outside.retain(|p| !made.made(p, current.entries.get(p)));
    }
    outside.extend(current.skipped.iter().map(|s| s.path.clone()));
    let touched = plan.paths();
    let conflicts = outside
        .into_iter()
        .filter(|p| touched.contains(p))
        .collect();
    Ok(Preview {
        target: checkpoint,
        current,
        plan,
        conflicts,
        not_recorded: wanted.skipped.clone(),
    })
}

/// Rewind `session`'s files to `target`. Refused, naming the files, when the rewind would
/// overwrite changes made outside keel since the checkpoint, unless `force`.
pub fn rewind(recorder: &Recorder, session: &str, target: &Target, force: bool) -> Result<Report> {
    // Held until the restore is done: no garbage collection drops the checkpoint restored or
    // the content it names meanwhile.
    let _busy = recorder.store().busy()?;
    // The temp files of a rewind stopped part way go first, so no walk records them.
    if let Some(made) = KeelMade::of(recorder.store(), session) {
        made.remove_temp_files(recorder.store().workspace());
    }
    let preview = prepare(recorder, session, target)?;
    if !preview.conflicts.is_empty() && !force {
        return Err(Error(format!(
            "not rewound: {} changed outside keel since {} ({}) and would be overwritten: {}. \
             Pass --force to overwrite them (the safety checkpoint keeps what fits its size \
             limit), or save them elsewhere first",
            if preview.conflicts.len() == 1 {
                "this file".to_owned()
            } else {
                format!("{} files", preview.conflicts.len())
            },
            preview.target.id,
            target,
            preview.conflicts.join(", ")
        )));
    }
    // Every content the restore writes is read and checked against its hash before anything
    // changes: a checkpoint the machine stopped before it reached the disk is refused whole,
    // never restored in part or with wrong bytes.
    let mut checked = BTreeSet::new();
    check_contents(
        recorder,
        session,
        &preview.target,
        &preview.plan,
        &mut checked,
    )?;
    let (safety, now) = recorder.record(
        session,
        Kind::Safety,
        Some(format!(
            "before rewinding to {} ({target})",
            preview.target.id
        )),
    )?;
    let wanted = recorder
        .store()
        .manifest(&preview.target.manifest)
        .map_err(|e| cannot_restore(session, &preview.target, e))?;
    // Planned again from the safety checkpoint: exactly the state it can bring back.
    let plan = restore::plan(&now, &wanted)?;
    check_contents(recorder, session, &preview.target, &plan, &mut checked)?;
    // Recorded (synced) before the first change: should this process be stopped part way, the
    // next rewind or checkpoint knows what it changed as keel's own.
    let journal = Unfinished {
        target: preview.target.id.clone(),
        target_manifest: preview.target.manifest.clone(),
        safety: safety.id.clone(),
        safety_manifest: safety.manifest.clone(),
        temp_tag: crate::store::unique(),
        time_ms: crate::now_ms(),
    };
    record_unfinished(recorder.store(), session, &journal)?;
    let applied = restore::apply_tagged(
        recorder.store(),
        recorder.store().workspace(),
        &plan,
        &journal.temp_tag,
    )?;
    let (restored, _) = recorder.record(
        session,
        Kind::Restored,
        Some(format!(
            "rewound to {} ({target}); {} undoes it",
            preview.target.id, safety.id
        )),
    )?;
    // What it left is recorded: nothing is unfinished any more.
    finished(recorder.store(), session);
    Ok(Report {
        preview,
        safety,
        restored,
        applied,
    })
}
