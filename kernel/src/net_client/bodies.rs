//! Open response bodies, per plugin, by id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Most response bodies one plugin may hold open at once; `send` refuses beyond it.
pub(crate) const MAX_OPEN_BODIES: usize = 16;

/// Largest chunk handed to a plugin by one `next_chunk`; longer network chunks are split.
pub(crate) const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// One response body being read.
pub(crate) struct Body {
    /// The response, until its end or a transport error.
    pub(crate) response: Option<reqwest::Response>,
    /// Bytes received but not yet handed out (the rest of an oversized chunk).
    pub(crate) pending: Vec<u8>,
    /// Set after a transport error: every later read repeats it.
    pub(crate) failed: Option<String>,
}

impl Body {
    /// Take at most [`MAX_CHUNK_BYTES`] from `bytes`, keeping the rest pending.
    pub(crate) fn hand_out(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        if bytes.len() > MAX_CHUNK_BYTES {
            let rest = bytes.split_off(MAX_CHUNK_BYTES);
            self.pending = rest;
        }
        bytes
    }

    /// The next pending piece, if any.
    pub(crate) fn take_pending(&mut self) -> Option<Vec<u8>> {
        if self.pending.is_empty() {
            return None;
        }
        let bytes = std::mem::take(&mut self.pending);
        Some(self.hand_out(bytes))
    }
}

pub(crate) type SharedBody = Arc<tokio::sync::Mutex<Body>>;

#[derive(Default)]
struct PluginBodies {
    next: u32,
    open: HashMap<u32, SharedBody>,
}

/// Every plugin's open bodies.
#[derive(Default)]
pub(crate) struct Bodies {
    by_plugin: Mutex<HashMap<String, PluginBodies>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Bodies {
    /// How many bodies `plugin` holds open.
    pub(crate) fn open_count(&self, plugin: &str) -> usize {
        lock(&self.by_plugin)
            .get(plugin)
            .map_or(0, |b| b.open.len())
    }

    /// Keep `response` for `plugin`; its id, or `None` when the plugin is at the cap.
    pub(crate) fn insert(&self, plugin: &str, response: reqwest::Response) -> Option<u32> {
        let mut all = lock(&self.by_plugin);
        let mine = all.entry(plugin.to_owned()).or_default();
        if mine.open.len() >= MAX_OPEN_BODIES {
            return None;
        }
        // Ids start at 1 and are not reused while open (the cap keeps the search short).
        let mut id = mine.next.wrapping_add(1).max(1);
        while mine.open.contains_key(&id) {
            id = id.wrapping_add(1).max(1);
        }
        mine.next = id;
        mine.open.insert(
            id,
            Arc::new(tokio::sync::Mutex::new(Body {
                response: Some(response),
                pending: Vec::new(),
                failed: None,
            })),
        );
        Some(id)
    }

    /// Body `id` of `plugin`.
    pub(crate) fn get(&self, plugin: &str, id: u32) -> Option<SharedBody> {
        lock(&self.by_plugin)
            .get(plugin)
            .and_then(|b| b.open.get(&id))
            .cloned()
    }

    /// Drop body `id` of `plugin` (closing its connection).
    pub(crate) fn remove(&self, plugin: &str, id: u32) {
        let mut all = lock(&self.by_plugin);
        // The plugin's entry stays (with its id counter), so a closed id is not handed out
        // again soon.
        if let Some(mine) = all.get_mut(plugin) {
            mine.open.remove(&id);
        }
    }

    /// Drop every body of `plugin`.
    pub(crate) fn remove_all(&self, plugin: &str) {
        lock(&self.by_plugin).remove(plugin);
    }
}
