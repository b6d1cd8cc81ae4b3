//! keel's home as the registry uses it, and a session that reads indexes through the
//! rollback check.

use std::path::{Path, PathBuf};

use crate::RegistryError;
use crate::fsutil::lock_for_update;
use crate::index::{Heads, IndexLog};
use crate::name::PluginName;
use crate::registry::Registry;
use crate::trust::TrustConfig;

/// keel's home directory (`~/.keel`): keys, trust, lockfile, heads seen, installed plugins.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// The home at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Home {
        Home { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `keys/`: signing keys, mode 0600.
    pub fn keys_dir(&self) -> PathBuf {
        self.root.join("keys")
    }

    /// `trust.toml`: trusted keys per namespace, and each namespace's registry.
    pub fn trust_path(&self) -> PathBuf {
        self.root.join("trust.toml")
    }

    /// `keel.lock`: what is installed.
    pub fn lock_path(&self) -> PathBuf {
        self.root.join("keel.lock")
    }

    /// `registry-heads.json`: the last head seen of every index.
    pub fn heads_path(&self) -> PathBuf {
        self.root.join("registry-heads.json")
    }

    /// `plugins/`: installed plugins, `<ns>/<name>/<version>/`.
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }

    /// `registry/`: the default registry.
    pub fn default_registry(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// The user's trust configuration.
    pub fn trust(&self) -> Result<TrustConfig, RegistryError> {
        TrustConfig::load(&self.trust_path())
    }
}

/// A registry opened for one command: every index read goes through the chain check and the
/// rollback check against the heads this home saw before.
#[derive(Debug)]
pub struct Session {
    /// The registry.
    pub registry: Registry,
    /// keel's home.
    pub home: Home,
    /// The user's trust.
    pub trust: TrustConfig,
    heads: Heads,
    /// Heads forgotten in this session, (registry, `namespace:name`).
    forgotten: Vec<(String, String)>,
}

impl Session {
    /// Open a session on `registry` for `home`.
    pub fn new(home: Home, registry: Registry) -> Result<Session, RegistryError> {
        let heads = Heads::load(&home.heads_path())?;
        let trust = home.trust()?;
        Ok(Session {
            registry,
            home,
            trust,
            heads,
            forgotten: Vec::new(),
        })
    }

    /// The registry's identity.
    pub fn location(&self) -> &str {
        self.registry.location()
    }

    /// Read, check and remember `name`'s index.
    pub fn log(&mut self, name: &PluginName) -> Result<IndexLog, RegistryError> {
        let text = self.registry.read_index(name)?;
        let log = IndexLog::parse(name, &text)?;
        let location = self.registry.location().to_owned();
        self.heads.observe(&location, &log)?;
        Ok(log)
    }

    /// Read the indexes of `names` with the chain and rollback checks but without checking
    /// signatures (for resolution over a whole registry; see
    /// [`IndexLog::parse_unsigned_checks`]).
    pub fn logs_for_resolution(
        &mut self,
        names: &[PluginName],
    ) -> Vec<Result<IndexLog, RegistryError>> {
        let location = self.registry.location().to_owned();
        let texts = self.registry.read_indexes(names);
        names
            .iter()
            .zip(texts)
            .map(|(name, text)| {
                let log = IndexLog::parse_unsigned_checks(name, &text?)?;
                self.heads.observe(&location, &log)?;
                Ok(log)
            })
            .collect()
    }

    /// Forget the head seen of `name` (after a deliberate restore of the registry).
    pub fn forget_head(&mut self, name: &PluginName) -> bool {
        let location = self.registry.location().to_owned();
        self.forgotten.push((location.clone(), name.to_string()));
        self.heads.forget(&location, name)
    }

    /// Save the heads seen, merged under the heads file's lock into what other commands saved
    /// since this one read it.
    pub fn finish(&self) -> Result<(), RegistryError> {
        let path = self.home.heads_path();
        let _lock = lock_for_update(&path).map_err(|e| RegistryError::io(&path, e))?;
        let mut heads = Heads::load(&path)?;
        heads.merge_seen(&self.heads, &self.forgotten);
        heads.save(&path)
    }
}
