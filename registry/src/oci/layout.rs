//! How keel's index and releases are laid out in an OCI repository: tag names, the Wasm OCI
//! artifact of a release, and the manifests that carry signed records.
//!
//! One repository per plugin (`PATH/<ns>/<name>`). Every record of the plugin's index is an
//! image manifest tagged `keel-record-<seq>-<sha256 of its line>-<claim>` whose annotation
//! `dev.keel.record` is the signed line; a release's manifest is also the standard Wasm OCI
//! artifact (config `application/vnd.wasm.config.v0+json`, one `application/wasm` layer: the
//! component), tagged with its version once it has landed. See registry/README.md.

use std::collections::BTreeMap;

use keel_kernel::PluginKind;
use serde_json::json;

use crate::fsutil::sha256_hex;
use crate::name::PluginName;
use crate::record::{Action, Record};

/// The manifest media type keel writes and reads.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The Wasm OCI artifact's config media type.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The Wasm OCI artifact's layer media type: the component, as is.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// A native plugin's layer: the shared library, as is.
pub const NATIVE_LAYER_MEDIA_TYPE: &str = "application/vnd.keel.plugin.native.v1";
/// The OCI empty descriptor's media type (config and layer of manifests with no content).
pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The annotation holding a record's canonical line.
pub const RECORD_ANNOTATION: &str = "dev.keel.record";
/// The annotation naming the plugin a catalog entry stands for.
pub const PLUGIN_ANNOTATION: &str = "dev.keel.plugin";
/// The repository (under the registry's path) whose tags name every plugin.
pub const CATALOG_REPOSITORY: &str = "keel-catalog";
/// The bytes of the OCI empty descriptor.
pub const EMPTY_BLOB: &[u8] = b"{}";

const RECORD_TAG: &str = "keel-record-";
const WITHDRAWN_TAG: &str = "keel-withdrawn-";
const LANDED_TAG: &str = "keel-landed-";

/// The tag of one claim of the record at `seq` whose line hashes to `hash`; `claim` (16 hex
/// digits, random) tells apart two claims of the same record, one withdrawn.
pub fn record_tag(seq: u64, hash: &str, claim: &str) -> String {
    format!("{RECORD_TAG}{seq}-{hash}-{claim}")
}

/// The tag a publisher adds to its claim `hash-claim` after losing a race for its position.
pub fn withdrawn_tag(hash: &str, claim: &str) -> String {
    format!("{WITHDRAWN_TAG}{hash}-{claim}")
}

/// A claim of a record, parsed from its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The record's position.
    pub seq: u64,
    /// The SHA-256 of its line.
    pub hash: &'a str,
    /// `hash-claim`: what a withdrawn tag names.
    pub id: &'a str,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The claim a record tag stands for; `None` for any other tag.
pub fn parse_record_tag(tag: &str) -> Option<Claim<'_>> {
    let rest = tag.strip_prefix(RECORD_TAG)?;
    let (seq, id) = rest.split_once('-')?;
    let (hash, claim) = id.split_once('-')?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    (is_hex(hash, 64) && is_hex(claim, 16)).then_some(Claim {
        seq: seq.parse().ok()?,
        hash,
        id,
    })
}

/// The claim (`hash-claim`) a withdrawn tag names.
pub fn parse_withdrawn_tag(tag: &str) -> Option<&str> {
    tag.strip_prefix(WITHDRAWN_TAG)
}

/// The tag a publisher adds to its claim once it saw no rival: the record is in the index.
pub fn landed_tag(hash: &str, claim: &str) -> String {
    format!("{LANDED_TAG}{hash}-{claim}")
}

/// The claim (`hash-claim`) a landed tag names.
pub fn parse_landed_tag(tag: &str) -> Option<&str> {
    tag.strip_prefix(LANDED_TAG)
}

/// The tag `oras pull`/`wkg` users name a release by: its version (`+` is not allowed in a
/// tag and becomes `_`, as Helm does).
pub fn version_tag(version: &semver::Version) -> String {
    version.to_string().replace('+', "_")
}

/// The catalog's tag for `name`: `ns.name` (names have no dots, so this is unambiguous).
pub fn catalog_tag(name: &PluginName) -> String {
    format!("{}.{}", name.namespace(), name.name())
}

/// The plugin a catalog tag names.
pub fn parse_catalog_tag(tag: &str) -> Option<PluginName> {
    let (ns, name) = tag.split_once('.')?;
    PluginName::new(ns, name).ok()
}

/// A content descriptor.
pub fn descriptor(
    media_type: &str,
    bytes: &[u8],
    annotations: Option<BTreeMap<&str, String>>,
) -> serde_json::Value {
    let mut d = json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
    });
    if let Some(a) = annotations {
        d["annotations"] = json!(a);
    }
    d
}

/// The blobs a record's manifest refers to, beyond the empty blob.
pub struct Blobs {
    /// The config blob's media type and bytes.
    pub config: (&'static str, Vec<u8>),
    /// The layer's media type.
    pub layer_media_type: &'static str,
    /// The file name `oras pull` writes the layer to.
    pub layer_title: String,
}

/// The Wasm OCI config of a release (CNCF TAG Runtime's Wasm artifact layout): what it is,
/// when it was made, the layer it describes, and the component's top-level imports and
/// exports.
pub fn wasm_config(record: &Record, code: &[u8]) -> Vec<u8> {
    let (imports, exports) = component_world(code);
    let created = chrono::DateTime::from_timestamp(record.time as i64, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let config = json!({
        "architecture": "wasm",
        "os": "wasip2",
        "created": created,
        "author": record.key,
        "layerDigests": [format!("sha256:{}", sha256_hex(code))],
        "component": { "imports": imports, "exports": exports, "target": null },
    });
    config.to_string().into_bytes()
}

/// The names a component imports and exports at its top level.
fn component_world(code: &[u8]) -> (Vec<String>, Vec<String>) {
    use wasmparser::{Parser, Payload};
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(code) {
        let Ok(payload) = payload else { break };
        match payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(s) if depth == 0 => {
                imports.extend(s.into_iter().flatten().map(|i| i.name.0.to_owned()));
            }
            Payload::ComponentExportSection(s) if depth == 0 => {
                exports.extend(s.into_iter().flatten().map(|e| e.name.0.to_owned()));
            }
            _ => {}
        }
    }
    (imports, exports)
}

/// What a release's manifest refers to: its config and its one layer.
pub fn release_blobs(record: &Record, code: &[u8]) -> Blobs {
    let plugin = record.name.split(':').nth(1).unwrap_or("plugin").to_owned();
    match record.release.as_ref().map(|r| r.kind) {
        Some(PluginKind::Native) => Blobs {
            config: (EMPTY_MEDIA_TYPE, EMPTY_BLOB.to_vec()),
            layer_media_type: NATIVE_LAYER_MEDIA_TYPE,
            layer_title: format!("{plugin}.so"),
        },
        _ => Blobs {
            config: (WASM_CONFIG_MEDIA_TYPE, wasm_config(record, code)),
            layer_media_type: WASM_LAYER_MEDIA_TYPE,
            layer_title: format!("{plugin}.wasm"),
        },
    }
}

/// The manifest carrying `record` (whose canonical line is `line`): for a release, the Wasm
/// artifact of `code` with `blobs`; for a yank, the empty config and layer.
pub fn record_manifest(record: &Record, line: &str, release: Option<(&Blobs, &[u8])>) -> Vec<u8> {
    let mut annotations = BTreeMap::from([
        (RECORD_ANNOTATION, line.to_owned()),
        (
            "org.opencontainers.image.version",
            record.version.to_string(),
        ),
        ("org.opencontainers.image.title", record.name.clone()),
    ]);
    let (config, layer) = match (record.action, release) {
        (Action::Release, Some((blobs, code))) => {
            if let Some(r) = &record.release {
                annotations.insert(
                    "org.opencontainers.image.description",
                    r.description.clone(),
                );
            }
            let title =
                BTreeMap::from([("org.opencontainers.image.title", blobs.layer_title.clone())]);
            (
                descriptor(blobs.config.0, &blobs.config.1, None),
                descriptor(blobs.layer_media_type, code, Some(title)),
            )
        }
        _ => (
            descriptor(EMPTY_MEDIA_TYPE, EMPTY_BLOB, None),
            descriptor(EMPTY_MEDIA_TYPE, EMPTY_BLOB, None),
        ),
    };
    json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config,
        "layers": [layer],
        "annotations": annotations,
    })
    .to_string()
    .into_bytes()
}

/// The catalog entry of `name`: empty content, the plugin named in an annotation.
pub fn catalog_manifest(name: &PluginName) -> Vec<u8> {
    json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(EMPTY_MEDIA_TYPE, EMPTY_BLOB, None),
        "layers": [descriptor(EMPTY_MEDIA_TYPE, EMPTY_BLOB, None)],
        "annotations": { PLUGIN_ANNOTATION: name.to_string() },
    })
    .to_string()
    .into_bytes()
}

/// The record line a manifest carries, if it is one of keel's.
pub fn record_line(manifest: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(manifest).ok()?;
    value
        .get("annotations")?
        .get(RECORD_ANNOTATION)?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_tags_round_trip_and_others_are_not_records() {
        let hash = "ab".repeat(32);
        let claim = "0123456789abcdef";
        let tag = record_tag(12, &hash, claim);
        assert!(tag.len() <= 128, "a tag has at most 128 characters");
        let parsed = parse_record_tag(&tag).expect("a record tag");
        assert_eq!((parsed.seq, parsed.hash), (12, hash.as_str()));
        assert_eq!(
            parse_withdrawn_tag(&withdrawn_tag(&hash, claim)),
            Some(parsed.id)
        );
        assert_eq!(parse_landed_tag(&landed_tag(&hash, claim)), Some(parsed.id));
        assert!(landed_tag(&hash, claim).len() <= 128);
        for other in [
            "0.1.0",
            "keel-record-",
            "keel-record-x-abc",
            &format!("keel-record--{hash}-{claim}"),
            &format!("keel-record-1-{}-{claim}", "AB".repeat(32)),
            &format!("keel-record-1-{hash}0-{claim}"),
            &format!("keel-record-1-{hash}"),
            &format!("keel-record-1-{hash}-{claim}0"),
        ] {
            assert_eq!(parse_record_tag(other), None, "{other}");
        }
        assert_eq!(
            version_tag(&"1.0.0+build.5".parse().expect("version")),
            "1.0.0_build.5"
        );
        let name = PluginName::new("acme", "echo").expect("name");
        assert_eq!(parse_catalog_tag(&catalog_tag(&name)), Some(name));
        assert_eq!(parse_catalog_tag("nodot"), None);
    }
}
