//! What the kernel tells an observer (the web page, the trace exporter) about its plugins:
//! every change of a plugin's lifecycle as the kernel makes it, and per-plugin call figures.
//!
//! Changes are found by comparing each plugin's state, version and generation with what was
//! last published, at the end of every lifecycle operation (settle, unload, a failed call, a
//! restart). One comparison covers every path that changes a record, so no path can forget to
//! announce itself; the cost is a walk over the records (a few dozen) per operation.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use semver::Version;
use serde::Serialize;
use tokio::sync::broadcast;

use super::{PluginState, PluginStatus, Shared, status_of};

/// Plugin changes an observer that falls behind may miss (it is told how many, and can read
/// the whole list again).
const CHANGE_RING: usize = 256;

/// What happened to a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "kebab-case")]
pub enum PluginChangeKind {
    /// It was loaded (its state says whether it is active yet).
    Loaded,
    /// A new version or build replaced its instance (`Kernel::reload`, `/reload`, `keel dev`).
    Reloaded {
        /// The version before.
        from: Version,
    },
    /// Its instance was replaced by a fresh one of the same build, after a call was stopped
    /// halfway or hit a limit.
    Restarted,
    /// Its state changed (active, pending, failed).
    State {
        /// The state before.
        from: String,
    },
    /// It was unloaded; nothing of it is left.
    Unloaded,
}

/// One change of one plugin, with its status after the change (none once unloaded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginChange {
    /// The plugin's name.
    pub plugin: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: PluginChangeKind,
    /// Its status now; `None` when it was unloaded.
    pub status: Option<PluginStatus>,
}

/// The calls the kernel made into one plugin so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CallFigures {
    /// Calls made into it (tool, service, guard, turn, event handler).
    pub calls: u64,
    /// Of those, how many ended in an error.
    pub failed: u64,
    /// Wall-clock time inside its calls, in microseconds.
    pub wall_us: u64,
    /// Guest CPU charged while its calls ran, in microseconds. Includes the CPU of plugins it
    /// called in turn (they share the account of the call that started them).
    pub cpu_us: u64,
}

#[derive(Clone, PartialEq)]
struct Seen {
    state: PluginState,
    version: Version,
    generation: u64,
    reloads: u64,
}

/// The observer side of the kernel: one broadcast of changes and the call figures.
pub(super) struct Observatory {
    changes: broadcast::Sender<PluginChange>,
    seen: Mutex<BTreeMap<String, Seen>>,
    figures: Mutex<BTreeMap<String, CallFigures>>,
}

impl Default for Observatory {
    fn default() -> Self {
        Observatory {
            changes: broadcast::channel(CHANGE_RING).0,
            seen: Mutex::default(),
            figures: Mutex::default(),
        }
    }
}

impl Observatory {
    pub(super) fn subscribe(&self) -> broadcast::Receiver<PluginChange> {
        self.changes.subscribe()
    }

    pub(super) fn record_call(&self, plugin: &str, ok: bool, wall: Duration, cpu: Duration) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let mut figures = lock_or_recover(&self.figures);
        // No allocation on the hot path once the plugin has an entry.
        if !figures.contains_key(plugin) {
            figures.insert(plugin.to_owned(), CallFigures::default());
        }
        let Some(f) = figures.get_mut(plugin) else {
            return;
        };
        f.calls += 1;
        f.failed += u64::from(!ok);
        f.wall_us = f.wall_us.saturating_add(micros(wall));
        f.cpu_us = f.cpu_us.saturating_add(micros(cpu));
    }

    pub(super) fn figures(&self) -> BTreeMap<String, CallFigures> {
        lock_or_recover(&self.figures).clone()
    }
}

impl Shared {
    /// Compare every plugin with what was last published and announce the differences.
    pub(super) fn publish_changes(&self) {
        let now: BTreeMap<String, (Seen, PluginStatus)> = {
            let inner = self.lock();
            inner
                .plugins
                .iter()
                .map(|(name, r)| {
                    let seen = Seen {
                        state: r.state.clone(),
                        version: r.manifest.version.clone(),
                        generation: r.generation,
                        reloads: r.reloads,
                    };
                    (name.clone(), (seen, status_of(name, r)))
                })
                .collect()
        };
        let obs = &self.observatory;
        let mut seen = lock_or_recover(&obs.seen);
        let mut out = Vec::new();
        for (name, (then, status)) in &now {
            let kind = match seen.get(name) {
                None => Some(PluginChangeKind::Loaded),
                Some(before) if before == then => None,
                Some(before)
                    if before.reloads != then.reloads || before.version != then.version =>
                {
                    Some(PluginChangeKind::Reloaded {
                        from: before.version.clone(),
                    })
                }
                // A new instance of the same build: a reload of an unchanged build or a
                // restart when it was active, a re-activation when it was waiting.
                Some(before)
                    if before.generation != then.generation
                        && before.state == PluginState::Active =>
                {
                    Some(PluginChangeKind::Restarted)
                }
                Some(before) => Some(PluginChangeKind::State {
                    from: before.state.name().to_owned(),
                }),
            };
            if let Some(kind) = kind {
                out.push(PluginChange {
                    plugin: name.clone(),
                    kind,
                    status: Some(status.clone()),
                });
            }
        }
        for name in seen.keys().filter(|n| !now.contains_key(*n)) {
            out.push(PluginChange {
                plugin: name.clone(),
                kind: PluginChangeKind::Unloaded,
                status: None,
            });
        }
        *seen = now.into_iter().map(|(n, (s, _))| (n, s)).collect();
        // Sent under the lock, so two operations finishing together publish in order.
        for change in out {
            // No receiver is not an error: nobody is watching.
            let _ = obs.changes.send(change);
        }
    }
}

/// The figures and the last-seen table are plain maps; a panic while one was held leaves
/// nothing half-made worth refusing every later call for.
fn lock_or_recover<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
