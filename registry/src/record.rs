//! Index records: a release or a yank of one version, hash-chained to the record before it
//! and signed over a canonical serialization.
//!
//! A record's line in the index is its canonical JSON (fields in declaration order, maps
//! sorted, no whitespace). The signature covers the same JSON with `signature` empty,
//! prefixed by [`SIGNING_DOMAIN`]; it therefore covers the plugin's name and version, the
//! blob's SHA-256 and size, its requirements, what it provides, the capabilities it requests,
//! the manifest text, and `prev`, the hash of the record before it.

use std::collections::BTreeMap;

use keel_kernel::{Capabilities, PluginKind};
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fsutil::sha256_hex;
use crate::keys::{KeyPair, PublicKey};

/// Prefix of the signed bytes, so a record signature can never be mistaken for another use of
/// the same key.
pub const SIGNING_DOMAIN: &[u8] = b"keel-registry-record/1\n";

/// `prev` of the first record of an index.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Publishes a version.
    Release,
    /// Hides a published version from new resolutions; lockfiles that pin it still work.
    Yank,
}

/// A required service, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceReq {
    /// Semver range, e.g. `^1.0`.
    pub range: String,
    /// Optional requirements do not take part in resolution.
    pub optional: bool,
}

/// The body of a release record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// Lowercase hex SHA-256 of the component (or native library).
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// How it is hosted.
    pub kind: PluginKind,
    /// The manifest's description.
    pub description: String,
    /// Services it provides.
    pub provides: BTreeMap<String, Version>,
    /// Services it requires.
    pub requires: BTreeMap<String, ServiceReq>,
    /// The capabilities it requests.
    pub capabilities: Capabilities,
    /// The manifest as installed (`component = "plugin.wasm"`).
    pub manifest: String,
}

/// One line of an index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Position in the index, from 0.
    pub seq: u64,
    /// Hash of the previous record's line ([`GENESIS`] for the first).
    pub prev: String,
    /// Release or yank.
    pub action: Action,
    /// `namespace:name`.
    pub name: String,
    /// The version released or yanked.
    pub version: Version,
    /// Seconds since the Unix epoch when it was signed (informational).
    pub time: u64,
    /// Present on releases only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Release>,
    /// Hex public key of the signer; empty when unsigned.
    pub key: String,
    /// Hex ed25519 signature; empty when unsigned.
    pub signature: String,
}

impl Record {
    /// The canonical line (without the newline).
    pub fn line(&self) -> Result<String, RegistryError> {
        serde_json::to_string(self).map_err(RegistryError::internal)
    }

    /// The bytes the signature covers.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, RegistryError> {
        let mut unsigned = self.clone();
        unsigned.signature.clear();
        let mut bytes = SIGNING_DOMAIN.to_vec();
        bytes.extend(serde_json::to_vec(&unsigned).map_err(RegistryError::internal)?);
        Ok(bytes)
    }

    /// Sign with `key` (sets `key` and `signature`).
    pub fn sign(&mut self, key: &KeyPair) -> Result<(), RegistryError> {
        self.key = key.public().to_string();
        self.signature.clear();
        let bytes = self.signing_bytes()?;
        self.signature = key.sign(&bytes);
        Ok(())
    }

    /// The signer, `None` when unsigned. Fails when the signature does not verify: such a
    /// record was altered after signing.
    pub fn signer(&self) -> Result<Option<PublicKey>, RegistryError> {
        if self.key.is_empty() && self.signature.is_empty() {
            return Ok(None);
        }
        let bad = |reason: &str| RegistryError::BadSignature {
            name: self.name.clone(),
            version: self.version.to_string(),
            seq: self.seq,
            reason: reason.to_owned(),
        };
        let key: PublicKey = self.key.parse().map_err(|_| bad("its key is malformed"))?;
        if key.verify(&self.signing_bytes()?, &self.signature) {
            Ok(Some(key))
        } else {
            Err(bad("the signature does not match the record's content"))
        }
    }

    /// Hash of a canonical line, as the next record's `prev`.
    pub fn hash_line(line: &str) -> String {
        sha256_hex(line.as_bytes())
    }

    /// Parse one line, refusing anything that is not the canonical form of a record.
    pub fn parse_line(line: &str, what: &str) -> Result<Record, RegistryError> {
        let record: Record = serde_json::from_str(line).map_err(|e| RegistryError::Corrupt {
            what: what.to_owned(),
            reason: format!("not a record: {e}"),
        })?;
        if record.line()? != line {
            return Err(RegistryError::Corrupt {
                what: what.to_owned(),
                reason: "the record is not in canonical form".into(),
            });
        }
        if (record.action == Action::Release) != record.release.is_some() {
            return Err(RegistryError::Corrupt {
                what: what.to_owned(),
                reason: "a release record must have a release body and a yank must not".into(),
            });
        }
        Ok(record)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// SHA-256 over the canonical JSON of `caps` (every object's keys sorted, no whitespace):
/// the lockfile's capability digest.
pub fn capability_digest(kind: PluginKind, caps: &Capabilities) -> String {
    let json = serde_json::json!({ "kind": kind, "capabilities": caps });
    sha256_hex(sorted_keys(json).to_string().as_bytes())
}

/// `value` with every object's keys in sorted order. serde_json's map keeps insertion order
/// when a dependency turns on its `preserve_order` (`agent-client-protocol` does, for the
/// whole workspace), so a digest must sort for itself to stay the one lockfiles hold.
fn sorted_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, sorted_keys(value)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted_keys).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_digest_is_over_sorted_keys_whatever_the_map_keeps() {
        let caps = Capabilities::default();
        let mut fields: Vec<(String, serde_json::Value)> = match serde_json::to_value(&caps) {
            Ok(serde_json::Value::Object(map)) => map.into_iter().collect(),
            other => panic!("capabilities are an object: {other:?}"),
        };
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let inner: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{}", serde_json::json!(k), sorted_keys(v.clone())))
            .collect();
        let kind = serde_json::to_value(PluginKind::Wasm).unwrap_or_default();
        let canonical = format!(
            "{{\"capabilities\":{{{}}},\"kind\":{kind}}}",
            inner.join(",")
        );
        assert_eq!(
            capability_digest(PluginKind::Wasm, &caps),
            sha256_hex(canonical.as_bytes()),
            "{canonical}"
        );
    }

    fn record() -> Record {
        Record {
            seq: 0,
            prev: GENESIS.into(),
            action: Action::Release,
            name: "acme:echo".into(),
            version: Version::new(1, 0, 0),
            time: 1,
            release: Some(Release {
                sha256: "ab".repeat(32),
                size: 3,
                kind: PluginKind::Wasm,
                description: String::new(),
                provides: BTreeMap::new(),
                requires: BTreeMap::from([(
                    "example.greeting".into(),
                    ServiceReq {
                        range: "^1".into(),
                        optional: false,
                    },
                )]),
                capabilities: Capabilities {
                    network: vec!["api.example.com".into()],
                    ..Capabilities::default()
                },
                manifest: "name = \"echo\"\n".into(),
            }),
            key: String::new(),
            signature: String::new(),
        }
    }

    #[test]
    fn signature_covers_hash_requirements_and_capabilities() -> Result<(), RegistryError> {
        let key = KeyPair::from_seed("k", None, [7; 32]);
        let mut r = record();
        r.sign(&key)?;
        assert_eq!(r.signer()?, Some(key.public()));
        let line = r.line()?;
        assert_eq!(Record::parse_line(&line, "t")?, r);
        let tamper: [fn(&mut Release); 3] = [
            |b| b.sha256 = "cd".repeat(32),
            |b| {
                b.requires.clear();
            },
            |b| b.capabilities.exec = true,
        ];
        for t in tamper {
            let mut bad = r.clone();
            if let Some(body) = bad.release.as_mut() {
                t(body);
            }
            assert!(bad.signer().is_err());
        }
        let mut bad = r.clone();
        bad.prev = "11".repeat(32);
        assert!(bad.signer().is_err(), "prev is signed too");
        Ok(())
    }

    #[test]
    fn non_canonical_lines_are_refused() -> Result<(), RegistryError> {
        let line = record().line()?;
        assert!(Record::parse_line(&line, "t").is_ok());
        let spaced = line.replacen(",", ", ", 1);
        assert!(Record::parse_line(&spaced, "t").is_err());
        assert!(Record::parse_line("{}", "t").is_err());
        Ok(())
    }
}
