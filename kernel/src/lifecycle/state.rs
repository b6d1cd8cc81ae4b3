//! Kernel-held state: what a plugin keeps across reloads, bounded per plugin and in total,
//! written only by the plugin's live instance.

use super::*;

/// One plugin's kernel-held state, with its size kept as it changes: a plugin that keeps
/// one key per message must not make every `set` walk all of its keys.
#[derive(Default)]
pub(super) struct KeptState {
    entries: BTreeMap<String, Vec<u8>>,
    /// Sum of key and value lengths over `entries`.
    bytes: usize,
}

impl KeptState {
    /// Keeps `value` under `key`; answers whether it replaced a value.
    pub(super) fn insert(&mut self, key: &str, value: Vec<u8>) -> Result<bool, String> {
        let old = self.entries.get(key).map(|v| key.len() + v.len());
        let replaced = old.unwrap_or(0);
        let bytes = self.bytes - replaced + key.len() + value.len();
        if bytes > MAX_STATE_BYTES_PER_PLUGIN {
            return Err(format!(
                "more than {MAX_STATE_BYTES_PER_PLUGIN} bytes of state"
            ));
        }
        self.entries.insert(key.to_owned(), value);
        self.bytes = bytes;
        Ok(old.is_some())
    }

    pub(super) fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries.get(key).map(Vec::as_slice)
    }

    /// Drops `key`; answers whether it held a value.
    pub(super) fn remove(&mut self, key: &str) -> bool {
        match self.entries.remove(key) {
            Some(v) => {
                self.bytes -= key.len() + v.len();
                true
            }
            None => false,
        }
    }
}

use crate::quotas::{MAX_STATE_BYTES_PER_PLUGIN, MAX_STATE_KEY, MAX_STATE_VALUE};

impl Shared {
    pub(crate) fn state_get(&self, plugin: &str, key: &str) -> Option<Vec<u8>> {
        self.lock().state.get(plugin)?.entries.get(key).cloned()
    }

    pub(crate) fn state_set(
        &self,
        plugin: &str,
        generation: u64,
        key: &str,
        value: Vec<u8>,
    ) -> Result<(), KernelError> {
        if key.is_empty() || key.len() > MAX_STATE_KEY {
            return Err(KernelError::Invalid(format!(
                "state keys must be 1-{MAX_STATE_KEY} bytes"
            )));
        }
        if value.len() > MAX_STATE_VALUE {
            return Err(KernelError::Invalid(format!(
                "state value for `{key}` is {} bytes; the limit is {MAX_STATE_VALUE}",
                value.len()
            )));
        }
        let mut inner = self.lock();
        live_record(&mut inner.plugins, plugin, generation)?;
        let all: usize = inner.state.values().map(|kept| kept.bytes).sum();
        if all + key.len() + value.len() > crate::quotas::MAX_STATE_BYTES_TOTAL {
            return Err(KernelError::Invalid(format!(
                "the kernel already holds {all} bytes of plugins' state, the most it keeps for \
                 all plugins together; remove keys first"
            )));
        }
        let replaced = inner
            .state
            .entry(plugin.to_owned())
            .or_default()
            .insert(key, value)
            .map_err(|what| {
                KernelError::Invalid(format!(
                    "plugin `{plugin}` would hold {what}; remove keys first"
                ))
            })?;
        if replaced && key.starts_with(keel_protocol::CONVERSATION_KEY_PREFIX) {
            inner.conversation_revision += 1;
        }
        Ok(())
    }

    pub(crate) fn state_remove(&self, plugin: &str, generation: u64, key: &str) {
        let mut inner = self.lock();
        if live_record(&mut inner.plugins, plugin, generation).is_ok()
            && let Some(kept) = inner.state.get_mut(plugin)
            && kept.remove(key)
            && key.starts_with(keel_protocol::CONVERSATION_KEY_PREFIX)
        {
            inner.conversation_revision += 1;
        }
    }

    pub(crate) fn state_keys(&self, plugin: &str) -> Vec<String> {
        self.lock()
            .state
            .get(plugin)
            .map(|kept| kept.entries.keys().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_state_counts_replacements_and_removals_toward_its_limit() {
        let mut kept = KeptState::default();
        let half = MAX_STATE_BYTES_PER_PLUGIN / 2;
        kept.insert("a", vec![0; half - 1]).expect("half fits");
        // Replacing a key counts its new value only, not both.
        kept.insert("a", vec![0; half - 1])
            .expect("a replacement fits");
        assert_eq!(kept.bytes, half);
        kept.insert("b", vec![0; half - 1])
            .expect("the second half fits");
        assert_eq!(kept.bytes, MAX_STATE_BYTES_PER_PLUGIN);
        let err = kept
            .insert("c", vec![0])
            .expect_err("one byte more is refused");
        assert!(err.contains("bytes of state"), "{err}");
        assert_eq!(
            kept.bytes, MAX_STATE_BYTES_PER_PLUGIN,
            "a refused insert changes nothing"
        );
        assert!(!kept.entries.contains_key("c"));
        kept.remove("a");
        kept.remove("missing");
        assert_eq!(kept.bytes, half);
        kept.insert("c", vec![0; 10])
            .expect("room again after a removal");
        assert_eq!(kept.bytes, half + 11);
    }
}
