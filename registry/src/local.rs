//! A registry directory: `config.json`, `index/<ns>/<name>.jsonl`, `blobs/sha256/<ab>/<hex>`,
//! and `.lock`, which every writer holds while it appends.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::{atomic_write, read_optional, sha256_hex, sync_dir, unique_suffix};
use crate::index::IndexLog;
use crate::name::PluginName;
use crate::record::{Action, Record};

/// The registry format this code reads and writes.
pub const REGISTRY_FORMAT: u32 = 1;

/// `config.json` of a registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// On-disk format version.
    pub format: u32,
    /// Largest blob accepted, in bytes.
    pub max_blob_bytes: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            format: REGISTRY_FORMAT,
            max_blob_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Points in an append where tests may stop the process (fault injection) or observe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The registry lock is held.
    Locked,
    /// The blob is durably in `blobs/`; no record names it yet.
    BlobWritten,
    /// An OCI registry: the record's position is claimed, and it has not landed yet.
    Claimed,
    /// The record is durably appended.
    RecordAppended,
}

/// A registry on the local filesystem.
#[derive(Debug, Clone)]
pub struct LocalRegistry {
    root: PathBuf,
    location: String,
    config: RegistryConfig,
}

/// Held while appending; released on drop (and by the OS if the process dies).
#[derive(Debug)]
pub struct RegistryLock {
    _file: File,
}

impl LocalRegistry {
    /// Open the registry at `root`, creating it when `create` is set and it does not exist.
    pub fn open(root: &Path, create: bool) -> Result<LocalRegistry, RegistryError> {
        let config_path = root.join("config.json");
        let existing =
            read_optional(&config_path).map_err(|e| RegistryError::io(&config_path, e))?;
        let config = match existing {
            Some(bytes) => {
                let config: RegistryConfig =
                    serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
                        what: config_path.display().to_string(),
                        reason: e.to_string(),
                    })?;
                if config.format != REGISTRY_FORMAT {
                    return Err(RegistryError::Corrupt {
                        what: config_path.display().to_string(),
                        reason: format!(
                            "registry format {} is not supported (this keel reads format {REGISTRY_FORMAT}); upgrade keel",
                            config.format
                        ),
                    });
                }
                config
            }
            None if create => {
                let config = RegistryConfig::default();
                for dir in ["index", "blobs/sha256", "blobs/tmp"] {
                    let d = root.join(dir);
                    fs::create_dir_all(&d).map_err(|e| RegistryError::io(&d, e))?;
                }
                let text =
                    serde_json::to_string_pretty(&config).map_err(RegistryError::internal)?;
                atomic_write(&config_path, text.as_bytes(), false)
                    .map_err(|e| RegistryError::io(&config_path, e))?;
                config
            }
            None => {
                return Err(RegistryError::NoRegistry {
                    location: root.display().to_string(),
                });
            }
        };
        let canonical = root
            .canonicalize()
            .map_err(|e| RegistryError::io(root, e))?;
        Ok(LocalRegistry {
            location: canonical.display().to_string(),
            root: canonical,
            config,
        })
    }

    /// The canonical directory, which is also the registry's identity in trust bindings.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The registry directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Its configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    fn index_path(&self, name: &PluginName) -> PathBuf {
        self.root
            .join("index")
            .join(name.namespace())
            .join(format!("{}.jsonl", name.name()))
    }

    /// Where the blob with this SHA-256 lives.
    pub fn blob_path(&self, sha256: &str) -> Result<PathBuf, RegistryError> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RegistryError::Corrupt {
                what: format!("blob name `{sha256}`"),
                reason: "a blob is named by 64 lowercase hex digits".into(),
            });
        }
        let sha = sha256.to_ascii_lowercase();
        Ok(self.root.join("blobs/sha256").join(&sha[..2]).join(&sha))
    }

    /// Every plugin with an index, sorted.
    pub fn names(&self) -> Result<Vec<PluginName>, RegistryError> {
        let mut names = Vec::new();
        let index = self.root.join("index");
        let namespaces = match fs::read_dir(&index) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
            Err(e) => return Err(RegistryError::io(&index, e)),
        };
        for ns in namespaces.flatten() {
            let Some(ns_name) = ns.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Ok(files) = fs::read_dir(ns.path()) else {
                continue;
            };
            for file in files.flatten() {
                let file_name = file.file_name();
                let Some(plugin) = file_name.to_str().and_then(|f| f.strip_suffix(".jsonl")) else {
                    continue;
                };
                if let Ok(name) = PluginName::new(&ns_name, plugin) {
                    names.push(name);
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The raw index of `name`; empty when it has none.
    pub fn read_index(&self, name: &PluginName) -> Result<Vec<u8>, RegistryError> {
        let path = self.index_path(name);
        Ok(read_optional(&path)
            .map_err(|e| RegistryError::io(&path, e))?
            .unwrap_or_default())
    }

    /// The bytes of a blob (unchecked: readers verify the hash themselves).
    pub fn read_blob(&self, sha256: &str) -> Result<Vec<u8>, RegistryError> {
        let path = self.blob_path(sha256)?;
        read_optional(&path)
            .map_err(|e| RegistryError::io(&path, e))?
            .ok_or_else(|| RegistryError::MissingBlob {
                sha256: sha256.to_owned(),
                registry: self.location.clone(),
            })
    }

    /// Store `bytes` under their SHA-256: temp file, fsync, rename, fsync the directory.
    /// Storing what is already there is a no-op. Returns the hash.
    pub fn write_blob(&self, bytes: &[u8]) -> Result<String, RegistryError> {
        if bytes.len() as u64 > self.config.max_blob_bytes {
            return Err(RegistryError::TooLarge {
                size: bytes.len() as u64,
                limit: self.config.max_blob_bytes,
            });
        }
        let sha = sha256_hex(bytes);
        let path = self.blob_path(&sha)?;
        if let Ok(existing) = fs::read(&path)
            && sha256_hex(&existing) == sha
        {
            return Ok(sha);
        }
        let dir = path.parent().unwrap_or(&self.root).to_owned();
        fs::create_dir_all(&dir).map_err(|e| RegistryError::io(&dir, e))?;
        let tmp_dir = self.root.join("blobs/tmp");
        fs::create_dir_all(&tmp_dir).map_err(|e| RegistryError::io(&tmp_dir, e))?;
        let tmp = tmp_dir.join(format!("{sha}.{}.part", unique_suffix()));
        let written = (|| {
            let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, &path)?;
            sync_dir(&dir)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(RegistryError::io(&path, e));
        }
        Ok(sha)
    }

    /// Remove blob temp files (`blobs/tmp/<sha>.<pid>-<n>-<hex>.part`) whose writer is gone:
    /// a publisher killed between writing a blob and renaming it. Run by the next writer under
    /// the lock; a part whose process still runs (`keel registry serve` storing a blob for a
    /// remote publisher, which takes the lock only to append) is left alone.
    fn remove_dead_parts(&self) {
        let Ok(entries) = fs::read_dir(self.root.join("blobs/tmp")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let writer = name
                .to_str()
                .and_then(|n| n.strip_suffix(".part"))
                .and_then(|n| n.rsplit_once('.'))
                .and_then(|(_, suffix)| suffix.split('-').next()?.parse::<u32>().ok());
            if writer.is_some_and(|pid| !process_runs(pid)) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Take the registry-wide writer lock, waiting for other writers (other threads and
    /// processes). The OS releases it if the holder dies.
    pub fn lock(&self) -> Result<RegistryLock, RegistryError> {
        let path = self.root.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| RegistryError::io(&path, e))?;
        file.lock().map_err(|e| RegistryError::io(&path, e))?;
        Ok(RegistryLock { _file: file })
    }

    /// Append one record to `name`'s index under the lock.
    ///
    /// `build` sees the current log and returns the signed record to append (it may refuse,
    /// e.g. because the version exists). The record is checked against the log (position,
    /// chain, signature, version rules); a release's blob must be `blob` (written first) or
    /// already stored. Nothing is edited in place: a cut-off line left by a writer that died
    /// mid-append is dropped before the new line is written.
    pub fn append(
        &self,
        name: &PluginName,
        blob: Option<&[u8]>,
        build: &mut dyn FnMut(&IndexLog) -> Result<Record, RegistryError>,
        hook: &mut dyn FnMut(Step),
    ) -> Result<Record, RegistryError> {
        let _lock = self.lock()?;
        self.remove_dead_parts();
        hook(Step::Locked);
        let path = self.index_path(name);
        let text = self.read_index(name)?;
        let log = IndexLog::parse(name, &text)?;
        let record = build(&log)?;
        check_append(&log, &record)?;
        let line = record.line()?;

        if let Some(release) = &record.release {
            match blob {
                Some(bytes) => {
                    let sha = self.write_blob(bytes)?;
                    if sha != release.sha256 || bytes.len() as u64 != release.size {
                        return Err(RegistryError::BlobMismatch {
                            name: name.to_string(),
                            version: record.version.to_string(),
                            expected: release.sha256.clone(),
                            actual: sha,
                        });
                    }
                }
                None => {
                    let stored = self.read_blob(&release.sha256)?;
                    let sha = sha256_hex(&stored);
                    if sha != release.sha256 || stored.len() as u64 != release.size {
                        return Err(RegistryError::BlobMismatch {
                            name: name.to_string(),
                            version: record.version.to_string(),
                            expected: release.sha256.clone(),
                            actual: sha,
                        });
                    }
                }
            }
            hook(Step::BlobWritten);
        }

        let dir = path.parent().unwrap_or(&self.root).to_owned();
        fs::create_dir_all(&dir).map_err(|e| RegistryError::io(&dir, e))?;
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| RegistryError::io(&path, e))?;
        if log.torn_tail() > 0 {
            let keep = (text.len() - log.torn_tail()) as u64;
            file.set_len(keep)
                .map_err(|e| RegistryError::io(&path, e))?;
        }
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| RegistryError::io(&path, e))?;
        if created {
            sync_dir(&dir).map_err(|e| RegistryError::io(&dir, e))?;
        }
        hook(Step::RecordAppended);
        Ok(record)
    }
}

/// Whether process `pid` runs; where that cannot be told (no `/proc`), it is taken to run.
fn process_runs(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether `record` may follow `log`.
pub(crate) fn check_append(log: &IndexLog, record: &Record) -> Result<(), RegistryError> {
    if record.name != log.name().to_string() {
        return Err(RegistryError::Refused(format!(
            "the record is about `{}`, not `{}`",
            record.name,
            log.name()
        )));
    }
    if record.seq != log.len() as u64 || record.prev != log.head_hash() {
        return Err(RegistryError::Conflict {
            name: log.name().to_string(),
        });
    }
    // Canonical form and signature, as every reader will check them.
    let line = record.line()?;
    Record::parse_line(&line, "the new record")?;
    record.signer()?;
    let existing = log.version(&record.version);
    match record.action {
        Action::Release if existing.is_some() => Err(RegistryError::VersionExists {
            name: log.name().to_string(),
            version: record.version.to_string(),
        }),
        Action::Yank => match existing {
            None => Err(RegistryError::NoSuchVersion {
                name: log.name().to_string(),
                version: record.version.to_string(),
            }),
            Some(v) if v.yanked_by.is_some() => Err(RegistryError::AlreadyYanked {
                name: log.name().to_string(),
                version: record.version.to_string(),
            }),
            Some(_) => Ok(()),
        },
        Action::Release => Ok(()),
    }
}
