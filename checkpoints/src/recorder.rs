//! A session's checkpoints as the kernel takes them: before each turn, before each tool call
//! that may change files, after each turn; and around a rewind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::journal::{DEFAULT_MAX_WATCHED_DIRS, Drained, Journal};
use crate::snapshot::{Manifest, Scope, WalkPlan, too_many_entries, walk};
use crate::store::{Checkpoint, Kind, MAX_CHANGED, Retention, Store};
use crate::{Result, Settings};

/// Takes the checkpoints of one workspace for the session currently running in it.
#[derive(Debug)]
pub struct Recorder {
    store: Store,
    settings: Settings,
    /// The most directories the change journal watches.
    max_watched_dirs: usize,
    /// The retention applied when the recorder goes (as its session ends).
    collect_at_end: Option<Retention>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    session: Option<String>,
    turn: u64,
    /// The manifest of this process's last checkpoint of the session, and its hash: the base
    /// of the next incremental walk.
    last: Option<(String, Manifest)>,
    /// Whether this process recorded `last` (so every content it names was stored by it).
    last_is_own: bool,
    journal: JournalState,
}

/// The change journal ([`crate::journal`]): started by the first walk of everything, off for
/// good once it cannot be exact (every checkpoint then walks everything).
#[derive(Debug, Default)]
enum JournalState {
    #[default]
    NotStarted,
    On(Journal),
    Off(String),
}

impl Recorder {
    /// A recorder for `store`'s workspace.
    pub fn new(store: Store, settings: Settings) -> Recorder {
        Recorder {
            store,
            settings,
            max_watched_dirs: DEFAULT_MAX_WATCHED_DIRS,
            collect_at_end: None,
            state: Mutex::new(State::default()),
        }
    }

    /// The same recorder with its change journal watching at most `dirs` directories (a
    /// workspace with more is walked whole at every checkpoint; 0 turns the journal off).
    pub fn with_max_watched_dirs(mut self, dirs: usize) -> Recorder {
        self.max_watched_dirs = dirs;
        self
    }

    /// The same recorder, collecting the store's garbage by `retention` when it is dropped
    /// (the session's end), unless another keel process is recording in the store then: the
    /// end of a session never waits for the store.
    pub fn collect_at_end(mut self, retention: Retention) -> Recorder {
        self.collect_at_end = Some(retention);
        self
    }

    /// The store it records into.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The settings it records with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Switch to `session` (the turn count and the base of the next walk come from its index).
    fn enter(&self, state: &mut State, session: &str) -> Result<()> {
        if state.session.as_deref() == Some(session) {
            return Ok(());
        }
        let last = self.store.last(session)?;
        state.session = Some(session.to_owned());
        // Turns only ever count up in an index, so its last line has the highest.
        state.turn = last.as_ref().map_or(0, |c| c.turn);
        state.last =
            last.and_then(|c| Some((c.manifest.clone(), self.store.manifest(&c.manifest).ok()?)));
        state.last_is_own = false;
        Ok(())
    }

    /// The checkpoint before a turn of `session`; the turn's number is one more than the last
    /// one the session's index records.
    pub fn before_turn(&self, session: &str) -> Result<Checkpoint> {
        let mut state = self.state();
        self.enter(&mut state, session)?;
        state.turn += 1;
        self.record_locked(&mut state, Kind::BeforeTurn, None, None, None)
    }

    /// The checkpoint before tool call `call` of `tool`; none when no turn of a session began.
    pub fn before_call(&self, call: &str, tool: &str) -> Result<Option<Checkpoint>> {
        let mut state = self.state();
        if state.session.is_none() {
            return Ok(None);
        }
        self.record_locked(&mut state, Kind::BeforeCall, Some(call), Some(tool), None)
            .map(Some)
    }

    /// The checkpoint after a turn's last call: what the turn left, shell commands included.
    pub fn after_turn(&self) -> Result<Option<Checkpoint>> {
        let mut state = self.state();
        if state.session.is_none() {
            return Ok(None);
        }
        self.record_locked(&mut state, Kind::AfterTurn, None, None, None)
            .map(Some)
    }

    /// A checkpoint of `session` of any kind (the rewind's safety and after-rewind ones), with
    /// its manifest.
    pub fn record(
        &self,
        session: &str,
        kind: Kind,
        note: Option<String>,
    ) -> Result<(Checkpoint, Manifest)> {
        let mut state = self.state();
        self.enter(&mut state, session)?;
        let checkpoint = self.record_locked(&mut state, kind, None, None, note)?;
        let manifest = state
            .last
            .as_ref()
            .map(|(_, m)| m.clone())
            .unwrap_or_default();
        Ok((checkpoint, manifest))
    }

    fn record_locked(
        &self,
        state: &mut State,
        kind: Kind,
        call: Option<&str>,
        tool: Option<&str>,
        note: Option<String>,
    ) -> Result<Checkpoint> {
        // No garbage collection runs from the first object this writes until its index line
        // is appended.
        let _busy = self.store.busy()?;
        let session = state.session.clone().unwrap_or_default();
        // The base of the walk and of what changed: the session's last checkpoint, whoever
        // took it (a rewind run by another keel process appends to the same index). A
        // collection always keeps it, so every hash the walk reuses from it is stored.
        let previous_hash = self
            .store
            .last(&session)?
            .filter(|c| !c.is_dropped())
            .map(|c| c.manifest);
        // After a pause, a rewind of this session may have been stopped part way (killed):
        // its temp files go, and what it changed is not counted as changed outside keel.
        let keel_made = if kind.follows_a_pause() {
            crate::rewind::KeelMade::of(&self.store, &session)
        } else {
            None
        };
        if let Some(made) = &keel_made {
            made.remove_temp_files(self.store.workspace());
        }
        // The journal is drained before anything is looked at: whatever changes from here on
        // is queued for the next checkpoint. Until this one is recorded it counts from none.
        let journal_base = match &mut state.journal {
            JournalState::On(j) => j.base.take(),
            _ => None,
        };
        let drained = match &mut state.journal {
            JournalState::NotStarted => {
                Drained::Everything("the change journal starts with this checkpoint".into())
            }
            JournalState::Off(why) => Drained::Everything(format!("no change journal: {why}")),
            JournalState::On(j) => j.drain(),
        };
        let last_is_base = journal_base.is_some()
            && journal_base == previous_hash
            && state.last.as_ref().map(|(h, _)| h) == previous_hash.as_ref();
        let mut plan = match drained {
            // Between turns and before a rewind the person may have done anything, a hard
            // link from outside the workspace included (whose writes no watch here reports):
            // those checkpoints look at everything.
            _ if kind.follows_a_pause() => {
                Err(format!("a {} checkpoint looks at everything", kind.label()))
            }
            Drained::Everything(why) => Err(why),
            Drained::Paths(_) if !last_is_base => Err(
                "the session's last checkpoint is not the one the change journal counts from"
                    .into(),
            ),
            Drained::Paths(paths) => Ok(paths),
        };

        let loaded;
        let previous = match (&previous_hash, &state.last) {
            (Some(p), Some((h, m))) if p == h => Some(m),
            (Some(p), _) => {
                loaded = self.store.manifest(p).ok();
                loaded.as_ref()
            }
            (None, _) => None,
        };
        if plan.is_ok() && previous.is_none() {
            plan = Err("the session's last checkpoint could not be read".into());
        }

        let mut walked_manifest: Option<Manifest> = None;
        // The newest checkpoint of the workspace, a session's first walk's base: its first
        // manifest is stored as the differences from it (a one-shot run in an unchanged
        // workspace then stores a few lines, not the workspace's whole manifest again).
        let mut newest: Option<(String, Manifest)> = None;
        // What a walk narrowed by the journal found, as changes to the last manifest.
        let mut scoped: Option<ScopedChanges> = None;
        let mut walk_note = String::new();
        if let (Ok(paths), JournalState::On(journal), Some(previous)) =
            (&plan, &mut state.journal, previous)
        {
            if paths.is_empty() {
                walk_note = "journal: nothing changed".into();
            } else {
                let scope = Arc::new(Scope::new(paths.iter().cloned()));
                let walked = walk(
                    &self.store,
                    self.store.workspace(),
                    &self.settings,
                    Some(previous),
                    &WalkPlan {
                        scope: Some(Arc::clone(&scope)),
                        on_dir: Some(journal.hook()),
                        covered: Some(previous),
                    },
                )?;
                if walked.pathless_error {
                    plan = Err("an entry could not be read, and the error names no path".into());
                } else if let Some(why) = journal.failed() {
                    plan = Err(why);
                } else {
                    journal.end_scoped(&scope, walked.multi_linked);
                    walk_note = format!("journal: {} paths looked at", paths.len());
                    scoped = Some(scoped_changes(previous, &scope, walked.manifest));
                }
            }
        }
        if let Err(why) = &plan {
            walk_note = format!("everything: {why}");
            // A session's first walk starts from the newest checkpoint of any session of this
            // workspace (a collection keeps it too), so a new session reads only what changed
            // since; what changed is still counted from the session's own checkpoints only.
            let base = match previous {
                Some(p) => Some(p),
                None => {
                    newest = self.store.newest_manifest_named();
                    newest.as_ref().map(|(_, m)| m)
                }
            };
            // A file whose stat is unchanged keeps the base's hash unread: a base this process
            // did not record itself is used only when every content it names is stored (the
            // machine may have stopped before the last checkpoints reached the disk); else
            // every file is read again, and what was lost is stored anew.
            let own = state.last_is_own
                && matches!((&state.last, &previous_hash), (Some((h, _)), Some(p)) if h == p);
            let base = base.filter(|b| own || self.store.missing_content(b).is_none());
            if matches!(state.journal, JournalState::NotStarted) {
                state.journal = match Journal::start(self.store.workspace(), self.max_watched_dirs)
                {
                    Ok(j) => JournalState::On(j),
                    Err(why) => JournalState::Off(why),
                };
            }
            let on_dir = match &mut state.journal {
                JournalState::On(j) => Some(j.begin_everything()),
                _ => None,
            };
            let walked = walk(
                &self.store,
                self.store.workspace(),
                &self.settings,
                base,
                &WalkPlan {
                    scope: None,
                    on_dir,
                    // What the session's checkpoints recorded stays recorded while it is
                    // there: ignore rules the turn writes do not shrink what they cover.
                    covered: previous,
                },
            )?;
            if let JournalState::On(j) = &mut state.journal {
                match j.failed() {
                    // Without every watch the journal cannot vouch for anything: it stops,
                    // and its watches go back to the person's budget.
                    Some(why) => state.journal = JournalState::Off(why),
                    None => j.end_everything(walked.multi_linked),
                }
            }
            walked_manifest = Some(walked.manifest);
        }

        let (hash, changed, manifest) = match (walked_manifest, scoped) {
            // The journal's paths: the last manifest (this process's own, `previous`) is
            // changed in place and stored as those changes, so a call that changed one file
            // of a large workspace costs about one file, not the workspace.
            (None, Some(changes)) => {
                let (base_hash, mut manifest) = state
                    .last
                    .take()
                    .ok_or_else(|| crate::Error("no manifest to record".into()))?;
                let same = changes.entries.is_empty()
                    && changes.removed.is_empty()
                    && changes.skipped == manifest.skipped;
                manifest.taken_ns = changes.taken_ns;
                for path in &changes.removed {
                    manifest.entries.remove(path);
                }
                manifest.entries.extend(changes.entries.clone());
                manifest.skipped = changes.skipped;
                if manifest.entries.len() > self.settings.max_entries {
                    return Err(too_many_entries(self.store.workspace(), &self.settings));
                }
                let hash = if same && self.store.has_manifest(&base_hash) {
                    base_hash
                } else if same {
                    self.store.put_manifest(&manifest)?
                } else {
                    self.store.put_manifest_changes(
                        &manifest,
                        &base_hash,
                        changes.entries,
                        changes.removed,
                    )?
                };
                (hash, changes.changed, Some(manifest))
            }
            (Some(manifest), _) => {
                let changed = previous
                    .map(|p| p.changed_paths(&manifest))
                    .unwrap_or_default();
                // Nothing changed (most calls): the previous manifest is named again instead
                // of a new one written; this walk's manifest stays the base of the next.
                let hash = match (&previous_hash, previous) {
                    (Some(h), Some(p))
                        if p.entries == manifest.entries
                            && p.skipped == manifest.skipped
                            && self.store.has_manifest(h) =>
                    {
                        h.clone()
                    }
                    // Stored as its differences from the previous one when they are few.
                    (Some(h), Some(p)) => self.store.put_manifest_over(&manifest, Some((h, p)))?,
                    _ => self.store.put_manifest_over(
                        &manifest,
                        newest.as_ref().map(|(h, m)| (h.as_str(), m)),
                    )?,
                };
                (hash, changed, Some(manifest))
            }
            // The journal saw nothing: the last checkpoint's manifest, named again as it is
            // (written again, whole, should it be missing from the store).
            (None, None) => match (&previous_hash, &state.last) {
                (Some(h), Some((_, m))) if !self.store.has_manifest(h) => {
                    (self.store.put_manifest(m)?, Vec::new(), None)
                }
                _ => (previous_hash.clone().unwrap_or_default(), Vec::new(), None),
            },
        };
        let recorded = manifest
            .as_ref()
            .or(state.last.as_ref().map(|(_, m)| m))
            .ok_or_else(|| crate::Error("no manifest to record".into()))?;
        let mut changed = changed;
        if let Some(made) = &keel_made {
            changed.retain(|p| !made.made(p, recorded.entries.get(p)));
        }
        let (files, bytes) = recorded.totals();
        let skipped = recorded.skipped.clone();
        let turn = state.turn;
        let line = |_: u64, _: Option<&Checkpoint>| Checkpoint {
            id: String::new(),
            seq: 0,
            session: String::new(),
            turn,
            kind,
            call: call.map(str::to_owned),
            tool: tool.map(str::to_owned),
            time_ms: crate::now_ms(),
            manifest: hash.clone(),
            files,
            bytes,
            skipped,
            changed_count: changed.len() as u64,
            outside: kind.follows_a_pause() && !changed.is_empty(),
            changed: changed.into_iter().take(MAX_CHANGED).collect(),
            note,
            not_covered: self.settings.not_covered.clone(),
            walk: Some(walk_note),
        };
        // Before a tool call the state is captured (every file read and stored, the line
        // written) and made durable on another thread, so the call does not wait on the disk;
        // every other checkpoint is durable, with all before it, when it returns.
        let checkpoint = if kind == Kind::BeforeCall {
            self.store.append_deferred(&session, line)?
        } else {
            self.store.append(&session, line)?
        };
        match manifest {
            Some(manifest) => {
                state.last = Some((hash.clone(), manifest));
                state.last_is_own = true;
            }
            None => {
                if let Some(last) = &mut state.last {
                    last.0 = hash.clone();
                }
            }
        }
        if let JournalState::On(j) = &mut state.journal {
            j.base = Some(hash);
        }
        Ok(checkpoint)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(retention) = &self.collect_at_end {
            // A failure leaves the garbage to the next session's start, which says so.
            let _ = self.store.collect_garbage_if_idle(retention);
        }
    }
}

/// What a walk narrowed to `scope` found, as changes to `base` (whose entries outside the
/// scope did not change since).
struct ScopedChanges {
    /// When the walk began.
    taken_ns: i64,
    /// Entries new or not equal (a file's stat included).
    entries: BTreeMap<String, crate::Node>,
    /// Paths gone.
    removed: Vec<String>,
    /// Paths whose content, mode, kind or presence changed (a stat alone aside), sorted.
    changed: Vec<String>,
    /// Everything not kept, the scope's as the walk found them.
    skipped: Vec<crate::Skipped>,
}

/// Compare what a walk narrowed to `scope` found with what `base` holds under the scope; only
/// those paths are looked at, whatever the size of `base`.
fn scoped_changes(base: &Manifest, scope: &Scope, walked: Manifest) -> ScopedChanges {
    let mut old: BTreeMap<&String, &crate::Node> = BTreeMap::new();
    for path in scope.paths() {
        if let Some((k, v)) = base.entries.get_key_value(path) {
            old.insert(k, v);
        }
        // Everything beneath `path/`: '0' is the character after '/'.
        old.extend(base.entries.range(format!("{path}/")..format!("{path}0")));
    }
    let mut entries = BTreeMap::new();
    let mut changed = Vec::new();
    for (path, node) in walked.entries {
        match old.remove(&path) {
            Some(o) if *o == node => {}
            Some(o) => {
                if !o.same_as(&node) {
                    changed.push(path.clone());
                }
                entries.insert(path, node);
            }
            None => {
                changed.push(path.clone());
                entries.insert(path, node);
            }
        }
    }
    let removed: Vec<String> = old.into_keys().cloned().collect();
    changed.extend(removed.iter().cloned());
    changed.sort();
    let mut skipped = base.skipped.clone();
    skipped.retain(|s| !scope.covers(&s.path));
    skipped.extend(walked.skipped);
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    ScopedChanges {
        taken_ns: walked.taken_ns,
        entries,
        removed,
        changed,
        skipped,
    }
}
