//! Signing keys: ed25519 key pairs in `<home>/keys/NAME.key` (mode 0600), public keys as hex.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::atomic_write;
use crate::name::is_valid_namespace;

/// An ed25519 public key, written as 64 lowercase hex digits (an `ed25519:` prefix is
/// accepted on input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The first 8 hex digits, for messages (`ab12cd34…`).
    pub fn short(&self) -> String {
        format!("{}…", &self.to_string()[..8])
    }

    /// Whether `signature` (hex) is this key's signature over `message`.
    pub fn verify(&self, message: &[u8], signature_hex: &str) -> bool {
        let Ok(key) = VerifyingKey::from_bytes(&self.0) else {
            return false;
        };
        let Ok(bytes) = hex::decode(signature_hex) else {
            return false;
        };
        let Ok(sig) = Signature::from_slice(&bytes) else {
            return false;
        };
        key.verify(message, &sig).is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl FromStr for PublicKey {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.trim().strip_prefix("ed25519:").unwrap_or(s.trim());
        let bad = |reason: &str| RegistryError::InvalidKey {
            key: s.to_owned(),
            reason: reason.to_owned(),
        };
        let bytes = hex::decode(hex_part).map_err(|_| bad("it is not hex"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| bad("an ed25519 public key is 32 bytes (64 hex digits)"))?;
        VerifyingKey::from_bytes(&bytes).map_err(|_| bad("it is not a valid ed25519 point"))?;
        Ok(PublicKey(bytes))
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A key pair that signs records, with the namespace it publishes to by default.
pub struct KeyPair {
    name: String,
    namespace: Option<String>,
    signing: SigningKey,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("KeyPair")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("public", &self.public().to_string())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    public: PublicKey,
    secret: String,
}

impl KeyPair {
    /// A fresh key pair from the operating system's random source.
    pub fn generate(name: &str, namespace: Option<&str>) -> Result<KeyPair, RegistryError> {
        check_key_name(name)?;
        if let Some(ns) = namespace
            && !is_valid_namespace(ns)
        {
            return Err(RegistryError::InvalidName {
                name: ns.to_owned(),
                reason: "a namespace is lowercase letters, digits and `-`, starting with a letter"
                    .into(),
            });
        }
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| RegistryError::Io {
            what: "the operating system's random source".into(),
            reason: e.to_string(),
        })?;
        Ok(KeyPair {
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
            signing: SigningKey::from_bytes(&seed),
        })
    }

    /// A key pair from a fixed seed (tests and benchmarks).
    pub fn from_seed(name: &str, namespace: Option<&str>, seed: [u8; 32]) -> KeyPair {
        KeyPair {
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The key's name (its file is `keys/NAME.key`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace it publishes to when `keel publish` is given none.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }

    /// Hex signature over `message`.
    pub fn sign(&self, message: &[u8]) -> String {
        hex::encode(self.signing.sign(message).to_bytes())
    }

    /// Write the key to `dir/NAME.key` (mode 0600); refuses to overwrite an existing key.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, RegistryError> {
        let path = key_path(dir, &self.name);
        if path.exists() {
            return Err(RegistryError::KeyExists {
                name: self.name.clone(),
                path,
            });
        }
        std::fs::create_dir_all(dir).map_err(|e| RegistryError::io(dir, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        let file = KeyFile {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            public: self.public(),
            secret: hex::encode(self.signing.to_bytes()),
        };
        let text = serde_json::to_string_pretty(&file).map_err(RegistryError::internal)?;
        atomic_write(&path, text.as_bytes(), true).map_err(|e| RegistryError::io(&path, e))?;
        Ok(path)
    }

    /// Read the key `name` from `dir`.
    pub fn load(dir: &Path, name: &str) -> Result<KeyPair, RegistryError> {
        check_key_name(name)?;
        let path = key_path(dir, name);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RegistryError::NoSuchKey {
                    name: name.to_owned(),
                    path: path.clone(),
                }
            } else {
                RegistryError::io(&path, e)
            }
        })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            if let Ok(meta) = std::fs::metadata(&path)
                && meta.permissions().mode() & 0o077 != 0
            {
                return Err(RegistryError::KeyPermissions { path });
            }
        }
        let file: KeyFile = serde_json::from_str(&text).map_err(|e| RegistryError::Corrupt {
            what: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let seed: [u8; 32] = hex::decode(&file.secret)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| RegistryError::Corrupt {
                what: path.display().to_string(),
                reason: "the secret is not 32 hex-encoded bytes".into(),
            })?;
        let pair = KeyPair::from_seed(&file.name, file.namespace.as_deref(), seed);
        if pair.public() != file.public {
            return Err(RegistryError::Corrupt {
                what: path.display().to_string(),
                reason: "the public key does not belong to the secret".into(),
            });
        }
        Ok(pair)
    }

    /// Every key in `dir`: (name, namespace, public key), sorted by name.
    pub fn list(dir: &Path) -> Result<Vec<(String, Option<String>, PublicKey)>, RegistryError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(RegistryError::io(dir, e)),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "key")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                let key = KeyPair::load(dir, stem)?;
                out.push((key.name.clone(), key.namespace.clone(), key.public()));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn key_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.key"))
}

fn check_key_name(name: &str) -> Result<(), RegistryError> {
    if keel_kernel::is_valid_plugin_name(name) {
        Ok(())
    } else {
        Err(RegistryError::InvalidName {
            name: name.to_owned(),
            reason: "a key name is lowercase letters, digits and `-`, starting with a letter"
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sign() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let key = KeyPair::generate("default", Some("acme"))?;
        key.save(dir.path())?;
        let again = KeyPair::load(dir.path(), "default")?;
        assert_eq!(again.public(), key.public());
        assert_eq!(again.namespace(), Some("acme"));
        let sig = again.sign(b"hello");
        assert!(key.public().verify(b"hello", &sig));
        assert!(!key.public().verify(b"hellO", &sig));
        assert!(key.save(dir.path()).is_err(), "never overwrites a key");
        let parsed: PublicKey = format!("ed25519:{}", key.public()).parse()?;
        assert_eq!(parsed, key.public());
        assert!("abcd".parse::<PublicKey>().is_err());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join("default.key"))?
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!format!("{key:?}").contains(&hex::encode(key.signing.to_bytes())));
        Ok(())
    }
}
