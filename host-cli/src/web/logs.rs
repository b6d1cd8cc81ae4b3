//! The session logs, watched for `keel web`: a session another keel process is running grows
//! on the page as its log is appended to. The folder is watched (inotify, debounced), not
//! polled; what changed is named by file, and the page reads the log again.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use notify_debouncer_mini::notify::RecursiveMode;
use tokio::sync::broadcast;

/// How long writes settle before the page is told (a turn appends in bursts).
const SETTLE: Duration = Duration::from_millis(250);

pub(super) struct LogWatch {
    _watcher: notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>,
    changed: broadcast::Sender<Vec<String>>,
}

impl LogWatch {
    pub(super) fn start(dir: &Path) -> anyhow::Result<LogWatch> {
        // The session-log plugin makes it at its first entry; a fresh home has none yet.
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("cannot make `{}`", dir.display()))?;
        }
        let (events, settled) = std::sync::mpsc::channel();
        let mut watcher = notify_debouncer_mini::new_debouncer(SETTLE, events)
            .context("cannot watch the session logs")?;
        watcher
            .watcher()
            .watch(dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("cannot watch `{}`", dir.display()))?;
        let changed = broadcast::channel(64).0;
        let tx = changed.clone();
        // A log only counts as changed when its size or time did: reading one (the page asking
        // for it) is an event too, and must not make the page read it again.
        let mut seen: HashMap<String, (u64, Option<SystemTime>)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| Some((session_of(&entry.path())?, stamp(&entry.path()))))
            .collect();
        std::thread::spawn(move || {
            for result in settled {
                let Ok(events) = result else { continue };
                let ids: BTreeSet<String> = events
                    .iter()
                    .filter_map(|e| {
                        let id = session_of(&e.path)?;
                        let now = stamp(&e.path);
                        (seen.insert(id.clone(), now) != Some(now)).then_some(id)
                    })
                    .collect();
                if !ids.is_empty() {
                    // Nobody watching is not an error; the watcher ends with the page.
                    let _ = tx.send(ids.into_iter().collect());
                }
            }
        });
        Ok(LogWatch {
            _watcher: watcher,
            changed,
        })
    }

    pub(super) fn sender(&self) -> broadcast::Sender<Vec<String>> {
        self.changed.clone()
    }
}

/// A log's size and time, to tell a write from a read.
fn stamp(path: &Path) -> (u64, Option<SystemTime>) {
    std::fs::symlink_metadata(path)
        .map(|m| (m.len(), m.modified().ok()))
        .unwrap_or_default()
}

/// The session a changed path is the log of: `<id>.jsonl`, the id as keel makes them.
fn session_of(path: &Path) -> Option<String> {
    let id = path.file_name()?.to_str()?.strip_suffix(".jsonl")?;
    let plain = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_session_logs_are_named() {
        assert_eq!(
            session_of(Path::new("/h/data/sessions/20261205-120000-00aa.jsonl")).as_deref(),
            Some("20261205-120000-00aa")
        );
        assert_eq!(session_of(Path::new("/h/data/sessions/x.lock")), None);
        assert_eq!(session_of(Path::new("/h/data/sessions/.jsonl")), None);
        assert_eq!(session_of(Path::new("/h/data/sessions/a b.jsonl")), None);
    }
}
