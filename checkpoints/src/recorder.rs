//! A session's checkpoints as the kernel takes them: before each turn, before each tool call
//! that may change files, after each turn; and around a rewind.

use std::sync::{Mutex, PoisonError};

use crate::snapshot::{Manifest, snapshot};
use crate::store::{Checkpoint, Kind, MAX_CHANGED, Store};
use crate::{Result, Settings};

/// Takes the checkpoints of one workspace for the session currently running in it.
#[derive(Debug)]
pub struct Recorder {
    store: Store,
    settings: Settings,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    session: Option<String>,
    turn: u64,
    /// The manifest of this process's last checkpoint of the session, and its hash: the base
    /// of the next incremental walk.
    last: Option<(String, Manifest)>,
}

impl Recorder {
    /// A recorder for `store`'s workspace.
    pub fn new(store: Store, settings: Settings) -> Recorder {
        Recorder {
            store,
            settings,
            state: Mutex::new(State::default()),
        }
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
        let previous_hash = self.store.last(&session)?.map(|c| c.manifest);
        let loaded;
        let previous = match (&previous_hash, &state.last) {
            (Some(p), Some((h, m))) if p == h => Some(m),
            (Some(p), _) => {
                loaded = self.store.manifest(p).ok();
                loaded.as_ref()
            }
            (None, _) => None,
        };
        // A session's first walk starts from the newest checkpoint of any session of this
        // workspace (a collection keeps it too), so a new session reads only what changed since;
        // what changed is still counted from the session's own checkpoints only.
        let newest;
        let base = match previous {
            Some(p) => Some(p),
            None => {
                newest = self.store.newest_manifest();
                newest.as_ref()
            }
        };
        let manifest = snapshot(&self.store, self.store.workspace(), &self.settings, base)?;
        let changed = previous
            .map(|p| p.changed_paths(&manifest))
            .unwrap_or_default();
        // Nothing changed (most calls): the previous manifest is named again instead of a new
        // one written; this walk's manifest stays the base of the next.
        let hash = match (&previous_hash, previous) {
            (Some(h), Some(p))
                if p.entries == manifest.entries && p.skipped == manifest.skipped =>
            {
                h.clone()
            }
            _ => self.store.put_manifest(&manifest)?,
        };
        let (files, bytes) = manifest.totals();
        let turn = state.turn;
        let checkpoint = self.store.append(&session, |_, _| Checkpoint {
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
            skipped: manifest.skipped.clone(),
            changed_count: changed.len() as u64,
            outside: kind.follows_a_pause() && !changed.is_empty(),
            changed: changed.into_iter().take(MAX_CHANGED).collect(),
            note,
            not_covered: self.settings.not_covered.clone(),
        })?;
        state.last = Some((hash, manifest));
        Ok(checkpoint)
    }
}
