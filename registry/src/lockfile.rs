//! `<home>/keel.lock`: every installed plugin with its version, registry, artifact hash,
//! manifest hash, signer and capability digest. Replaced atomically.

use std::path::Path;

use keel_kernel::PluginKind;
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::{atomic_write, read_optional};
use crate::name::PluginName;

/// The lockfile format this code writes.
pub const LOCK_FORMAT: u32 = 1;

/// One installed plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockEntry {
    /// `namespace:name`.
    pub name: PluginName,
    /// The installed version.
    pub version: Version,
    /// The registry it came from.
    pub registry: String,
    /// How it is hosted.
    pub kind: PluginKind,
    /// SHA-256 of the component (or library).
    pub sha256: String,
    /// SHA-256 of the installed keel.toml.
    pub manifest_sha256: String,
    /// Digest of the requested capabilities (see `capability_digest`).
    pub capabilities: String,
    /// The key that signed the release; absent when installed unverified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Installed with `--allow-unverified` without a trusted signature.
    #[serde(default)]
    pub unverified: bool,
    /// The user consented to a native (full-trust) plugin with `--allow-native`.
    #[serde(default)]
    pub native_consent: bool,
}

/// The lockfile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lockfile {
    /// Format version.
    pub format: u32,
    /// Installed plugins, sorted by name.
    #[serde(default, rename = "plugin")]
    pub plugins: Vec<LockEntry>,
}

impl Default for Lockfile {
    fn default() -> Self {
        Lockfile {
            format: LOCK_FORMAT,
            plugins: Vec::new(),
        }
    }
}

impl Lockfile {
    /// Read `path`; missing means nothing installed.
    pub fn load(path: &Path) -> Result<Lockfile, RegistryError> {
        let Some(bytes) = read_optional(path).map_err(|e| RegistryError::io(path, e))? else {
            return Ok(Lockfile::default());
        };
        let lock: Lockfile = toml::from_str(&String::from_utf8_lossy(&bytes)).map_err(|e| {
            RegistryError::Corrupt {
                what: path.display().to_string(),
                reason: format!(
                    "{}; restore it from a backup, or remove it and install again",
                    e.message().trim()
                ),
            }
        })?;
        if lock.format != LOCK_FORMAT {
            return Err(RegistryError::Corrupt {
                what: path.display().to_string(),
                reason: format!(
                    "lockfile format {} is not supported; upgrade keel",
                    lock.format
                ),
            });
        }
        Ok(lock)
    }

    /// Write to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let mut sorted = self.clone();
        sorted.plugins.sort_by(|a, b| a.name.cmp(&b.name));
        let text = format!(
            "# Written by keel install; every load re-checks these hashes.\n{}",
            toml::to_string_pretty(&sorted).map_err(RegistryError::internal)?
        );
        atomic_write(path, text.as_bytes(), false).map_err(|e| RegistryError::io(path, e))
    }

    /// The entry for `name`.
    pub fn get(&self, name: &PluginName) -> Option<&LockEntry> {
        self.plugins.iter().find(|e| &e.name == name)
    }
}
