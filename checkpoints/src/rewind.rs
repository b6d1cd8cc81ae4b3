//! A whole rewind of the workspace's files: find the checkpoint, see what would change, refuse
//! what would overwrite changes made outside keel, take a safety checkpoint, restore, and
//! record what the rewind left.

use std::collections::BTreeSet;

use crate::recorder::Recorder;
use crate::restore::{self, Applied, Plan};
use crate::snapshot::{Manifest, Skipped, snapshot};
use crate::store::{Checkpoint, Kind};
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
    let found = match target {
        Target::Turn(n) => index
            .iter()
            .find(|c| c.kind == Kind::BeforeTurn && c.turn == *n),
        Target::Call(id) => index
            .iter()
            .find(|c| c.kind == Kind::BeforeCall && c.call.as_deref() == Some(id)),
        Target::Checkpoint(id) => index.iter().find(|c| &c.id == id),
    };
    found.cloned().ok_or_else(|| {
        Error(if index.is_empty() {
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
    let current = snapshot(store, store.workspace(), recorder.settings(), last.as_ref())?;
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
    let applied = restore::apply(recorder.store(), recorder.store().workspace(), &plan)?;
    let (restored, _) = recorder.record(
        session,
        Kind::Restored,
        Some(format!(
            "rewound to {} ({target}); {} undoes it",
            preview.target.id, safety.id
        )),
    )?;
    Ok(Report {
        preview,
        safety,
        restored,
        applied,
    })
}
