//! A plugin's index: an append-only JSONL log of records, each naming the hash of the one
//! before it, and the client's memory of the last head it saw of each log (rollback check).

use std::collections::BTreeMap;
use std::path::Path;

use semver::Version;
use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::{atomic_write, read_optional};
use crate::keys::PublicKey;
use crate::name::PluginName;
use crate::record::{Action, GENESIS, Record, Release};

/// A parsed, chain-checked index.
#[derive(Debug, Clone)]
pub struct IndexLog {
    name: PluginName,
    records: Vec<Record>,
    hashes: Vec<String>,
    signers: Vec<Option<PublicKey>>,
    /// Bytes after the last newline: a write that was cut off. Not part of the log.
    torn_tail: usize,
}

/// A released version as the index shows it.
#[derive(Debug, Clone)]
pub struct VersionInfo<'a> {
    /// The release record.
    pub record: &'a Record,
    /// Its body.
    pub release: &'a Release,
    /// Who signed it (verified); `None` when unsigned, or when the log was parsed without
    /// signature checks.
    pub signer: Option<PublicKey>,
    /// The yank record, when yanked.
    pub yanked_by: Option<&'a Record>,
}

impl IndexLog {
    /// An empty index for `name`.
    pub fn empty(name: PluginName) -> IndexLog {
        IndexLog {
            name,
            records: Vec::new(),
            hashes: Vec::new(),
            signers: Vec::new(),
            torn_tail: 0,
        }
    }

    /// Parse and check `text`: every line canonical, numbered in order, naming the hash of the
    /// line before it, about `name`, with a valid signature (or none); releases unique per
    /// version; yanks only of released versions. A last line without its newline is a cut-off
    /// write and is ignored.
    pub fn parse(name: &PluginName, text: &[u8]) -> Result<IndexLog, RegistryError> {
        Self::parse_with(name, text, true)
    }

    /// Like [`parse`](Self::parse) but without checking signatures: the chain, order and
    /// version rules are checked, and [`VersionInfo::signer`] is `None` throughout. For
    /// resolution over a whole registry, where only the chosen releases' signatures matter
    /// (the install checks those with [`Record::signer`]).
    pub fn parse_unsigned_checks(
        name: &PluginName,
        text: &[u8],
    ) -> Result<IndexLog, RegistryError> {
        Self::parse_with(name, text, false)
    }

    fn parse_with(
        name: &PluginName,
        text: &[u8],
        check_signatures: bool,
    ) -> Result<IndexLog, RegistryError> {
        let text = std::str::from_utf8(text).map_err(|_| RegistryError::Corrupt {
            what: format!("the index of {name}"),
            reason: "it is not UTF-8".into(),
        })?;
        let complete = text.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let mut log = IndexLog::empty(name.clone());
        log.torn_tail = text.len() - complete;
        for (i, line) in text[..complete].lines().enumerate() {
            let what = format!("the index of {name}, record {i}");
            let record = Record::parse_line(line, &what)?;
            let corrupt = |reason: String| RegistryError::Corrupt {
                what: what.clone(),
                reason,
            };
            if record.seq != i as u64 {
                return Err(corrupt(format!("it says it is record {}", record.seq)));
            }
            let expected_prev = log.hashes.last().map(String::as_str).unwrap_or(GENESIS);
            if record.prev != expected_prev {
                return Err(corrupt(format!(
                    "it names {} as the previous record, but the previous record's hash is {expected_prev}; the index was rewritten",
                    record.prev
                )));
            }
            if record.name != name.to_string() {
                return Err(corrupt(format!("it is about `{}`", record.name)));
            }
            match record.action {
                Action::Release if log.release(&record.version).is_some() => {
                    return Err(corrupt(format!(
                        "version {} is released twice",
                        record.version
                    )));
                }
                Action::Yank if log.release(&record.version).is_none() => {
                    return Err(corrupt(format!(
                        "it yanks version {}, which was never released",
                        record.version
                    )));
                }
                _ => {}
            }
            let signer = if check_signatures {
                record.signer()?
            } else {
                None
            };
            log.hashes.push(Record::hash_line(line));
            log.signers.push(signer);
            log.records.push(record);
        }
        Ok(log)
    }

    /// The plugin.
    pub fn name(&self) -> &PluginName {
        &self.name
    }

    /// Every record, oldest first.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the log has no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes of a cut-off last line, ignored.
    pub fn torn_tail(&self) -> usize {
        self.torn_tail
    }

    /// The last record's hash, [`GENESIS`] when empty: the next record's `prev`.
    pub fn head_hash(&self) -> &str {
        self.hashes.last().map(String::as_str).unwrap_or(GENESIS)
    }

    /// The head as the client remembers it; `None` for an empty log.
    pub fn head(&self) -> Option<Head> {
        self.hashes.last().map(|h| Head {
            seq: self.hashes.len() as u64 - 1,
            hash: h.clone(),
        })
    }

    fn release(&self, version: &Version) -> Option<usize> {
        self.records
            .iter()
            .position(|r| r.action == Action::Release && &r.version == version)
    }

    /// Every released version, oldest first, with its yank state.
    pub fn versions(&self) -> Vec<VersionInfo<'_>> {
        let mut out = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            if let (Action::Release, Some(release)) = (r.action, &r.release) {
                out.push(VersionInfo {
                    record: r,
                    release,
                    signer: self.signers[i],
                    yanked_by: self
                        .records
                        .iter()
                        .find(|y| y.action == Action::Yank && y.version == r.version),
                });
            }
        }
        out
    }

    /// The version `version`, if released.
    pub fn version(&self, version: &Version) -> Option<VersionInfo<'_>> {
        self.versions()
            .into_iter()
            .find(|v| &v.record.version == version)
    }

    /// Refuse a log that does not extend `seen`, the head this client saw last.
    pub fn check_extends(&self, seen: &Head, registry: &str) -> Result<(), RegistryError> {
        let matches = self
            .hashes
            .get(seen.seq as usize)
            .is_some_and(|h| *h == seen.hash);
        if matches {
            Ok(())
        } else {
            Err(RegistryError::Rollback {
                name: self.name.to_string(),
                registry: registry.to_owned(),
                seen_records: seen.seq + 1,
                seen_head: seen.hash.clone(),
                now_records: self.records.len() as u64,
            })
        }
    }
}

/// The last record of a log a client has seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// Its `seq`.
    pub seq: u64,
    /// Its line's hash.
    pub hash: String,
}

/// `<home>/registry-heads.json`: registry → plugin → last head seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heads {
    /// Registry location → `namespace:name` → head.
    #[serde(default)]
    pub registries: BTreeMap<String, BTreeMap<String, Head>>,
}

impl Heads {
    /// Read `path`; missing means nothing seen yet.
    pub fn load(path: &Path) -> Result<Heads, RegistryError> {
        match read_optional(path).map_err(|e| RegistryError::io(path, e))? {
            None => Ok(Heads::default()),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
                what: path.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// Write to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let text = serde_json::to_string_pretty(self).map_err(RegistryError::internal)?;
        atomic_write(path, text.as_bytes(), false).map_err(|e| RegistryError::io(path, e))
    }

    /// Check `log` from `registry` against the remembered head and remember its new head.
    pub fn observe(&mut self, registry: &str, log: &IndexLog) -> Result<(), RegistryError> {
        let key = log.name().to_string();
        if let Some(seen) = self.registries.get(registry).and_then(|m| m.get(&key)) {
            log.check_extends(seen, registry)?;
        }
        if let Some(head) = log.head() {
            self.registries
                .entry(registry.to_owned())
                .or_default()
                .insert(key, head);
        }
        Ok(())
    }

    /// Take into `self` (read from disk under the heads' lock) what `seen` observed in this
    /// command: the later of two heads of a log wins, so two commands saving at once keep both
    /// their observations; `forgotten` (registry, `namespace:name`) are removed.
    pub fn merge_seen(&mut self, seen: &Heads, forgotten: &[(String, String)]) {
        for (registry, name) in forgotten {
            if let Some(m) = self.registries.get_mut(registry) {
                m.remove(name);
            }
        }
        for (registry, heads) in &seen.registries {
            let kept = self.registries.entry(registry.clone()).or_default();
            for (name, head) in heads {
                if kept.get(name).is_none_or(|k| k.seq <= head.seq) {
                    kept.insert(name.clone(), head.clone());
                }
            }
        }
    }

    /// Forget what was seen of `name` in `registry` (after a deliberate restore).
    pub fn forget(&mut self, registry: &str, name: &PluginName) -> bool {
        self.registries
            .get_mut(registry)
            .is_some_and(|m| m.remove(&name.to_string()).is_some())
    }
}
