//! The user's trust: which keys may sign each namespace, and the one registry each namespace
//! comes from. Stored in `<home>/trust.toml`, replaced atomically.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::{atomic_write, read_optional};
use crate::keys::PublicKey;
use crate::name::{PluginName, is_valid_namespace};

/// One namespace's binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceTrust {
    /// The registry this namespace is installed from (a canonical directory or an `http://`
    /// URL); no other registry may serve it.
    pub registry: String,
    /// Keys trusted to sign its records.
    #[serde(default)]
    pub keys: BTreeSet<PublicKey>,
}

/// `<home>/trust.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustConfig {
    /// Namespace → binding.
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceTrust>,
}

/// How a record's signer stands with the user's trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Signed by a key trusted for the namespace, from the namespace's registry.
    Trusted(PublicKey),
    /// Unsigned or signed by an unknown key, accepted because the user passed
    /// `--allow-unverified`.
    Unverified,
}

impl TrustConfig {
    /// Read `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<TrustConfig, RegistryError> {
        let Some(bytes) = read_optional(path).map_err(|e| RegistryError::io(path, e))? else {
            return Ok(TrustConfig::default());
        };
        let text = String::from_utf8_lossy(&bytes);
        toml::from_str(&text).map_err(|e| RegistryError::Corrupt {
            what: path.display().to_string(),
            reason: format!(
                "{}; fix the file or remove the entry (`keel key untrust`)",
                e.message().trim()
            ),
        })
    }

    /// Write to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let text = toml::to_string_pretty(self).map_err(RegistryError::internal)?;
        atomic_write(path, text.as_bytes(), false).map_err(|e| RegistryError::io(path, e))
    }

    /// Trust `key` for `namespace`, binding the namespace to `registry` if it is not bound
    /// yet. Refused when the namespace is bound to another registry. Returns whether anything
    /// changed.
    pub fn trust(
        &mut self,
        namespace: &str,
        key: PublicKey,
        registry: &str,
    ) -> Result<bool, RegistryError> {
        if !is_valid_namespace(namespace) {
            return Err(RegistryError::InvalidName {
                name: namespace.to_owned(),
                reason: "a namespace is lowercase letters, digits and `-`, starting with a letter"
                    .into(),
            });
        }
        match self.namespaces.get_mut(namespace) {
            Some(entry) if entry.registry != registry => Err(RegistryError::NamespaceBound {
                namespace: namespace.to_owned(),
                bound: entry.registry.clone(),
                requested: registry.to_owned(),
            }),
            Some(entry) => Ok(entry.keys.insert(key)),
            None => {
                self.namespaces.insert(
                    namespace.to_owned(),
                    NamespaceTrust {
                        registry: registry.to_owned(),
                        keys: BTreeSet::from([key]),
                    },
                );
                Ok(true)
            }
        }
    }

    /// Stop trusting `key` for `namespace`; the binding goes with its last key. Returns
    /// whether anything changed.
    pub fn untrust(&mut self, namespace: &str, key: &PublicKey) -> bool {
        let Some(entry) = self.namespaces.get_mut(namespace) else {
            return false;
        };
        let removed = entry.keys.remove(key);
        if entry.keys.is_empty() {
            self.namespaces.remove(namespace);
        }
        removed
    }

    /// Refuse `name` from `registry` when its namespace is bound to another registry.
    pub fn check_registry(&self, name: &PluginName, registry: &str) -> Result<(), RegistryError> {
        match self.namespaces.get(name.namespace()) {
            Some(entry) if entry.registry != registry => Err(RegistryError::WrongRegistry {
                name: name.to_string(),
                bound: entry.registry.clone(),
                registry: registry.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Judge a record of `name` from `registry` signed by `key` (`None`: unsigned).
    pub fn judge(
        &self,
        name: &PluginName,
        version: &semver::Version,
        registry: &str,
        key: Option<&PublicKey>,
        allow_unverified: bool,
    ) -> Result<Verdict, RegistryError> {
        self.check_registry(name, registry)?;
        let trusted = self
            .namespaces
            .get(name.namespace())
            .is_some_and(|entry| key.is_some_and(|k| entry.keys.contains(k)));
        match key {
            Some(k) if trusted => Ok(Verdict::Trusted(*k)),
            _ if allow_unverified => Ok(Verdict::Unverified),
            Some(k) => Err(RegistryError::UntrustedKey {
                name: name.to_string(),
                version: version.to_string(),
                key: *k,
                namespace: name.namespace().to_owned(),
            }),
            None => Err(RegistryError::Unsigned {
                name: name.to_string(),
                version: version.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyPair;

    #[test]
    fn a_namespace_has_one_registry() -> Result<(), RegistryError> {
        let key = KeyPair::from_seed("k", None, [1; 32]).public();
        let mut trust = TrustConfig::default();
        assert!(trust.trust("acme", key, "/r1")?);
        assert!(!trust.trust("acme", key, "/r1")?);
        let err = trust.trust("acme", key, "/r2").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("/r1") && e.contains("/r2")));
        let name: PluginName = "acme:echo".parse()?;
        let v = semver::Version::new(1, 0, 0);
        assert_eq!(
            trust.judge(&name, &v, "/r1", Some(&key), false)?,
            Verdict::Trusted(key)
        );
        assert!(trust.judge(&name, &v, "/r2", Some(&key), true).is_err());
        let other = KeyPair::from_seed("o", None, [2; 32]).public();
        let err = trust
            .judge(&name, &v, "/r1", Some(&other), false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("keel key trust"), "{err}");
        assert!(err.contains(&other.short()), "{err}");
        assert_eq!(
            trust.judge(&name, &v, "/r1", None, true)?,
            Verdict::Unverified
        );
        assert!(trust.untrust("acme", &key));
        assert!(trust.namespaces.is_empty());
        Ok(())
    }
}
