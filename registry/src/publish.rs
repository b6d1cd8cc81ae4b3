//! Validating a plugin for publication, publishing it and yanking it.

use std::path::Path;

use keel_kernel::{
    ComponentReport, Manifest, PluginKind, WasmHost, check_imports, inspect_component,
};
use semver::Version;

use crate::RegistryError;
use crate::home::Session;
use crate::keys::KeyPair;
use crate::local::Step;
use crate::name::PluginName;
use crate::record::{Action, Record, Release, ServiceReq, now};

/// The custom section in which keel-sdk's `export_plugin!` records the plugin crate's
/// version.
pub const VERSION_SECTION: &str = "keel-plugin-version";

/// The file name of an installed plugin's code.
pub fn installed_code_name(kind: PluginKind) -> String {
    match kind {
        PluginKind::Wasm => "plugin.wasm".to_owned(),
        PluginKind::Native => format!(
            "{}plugin{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ),
    }
}

/// A validated plugin, ready to publish.
#[derive(Debug, Clone)]
pub struct Package {
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The manifest as it will be installed: `component` points at the installed file.
    pub manifest_text: String,
    /// The component (or native library).
    pub code: Vec<u8>,
    /// What the component declares (WebAssembly only).
    pub report: Option<ComponentReport>,
}

/// The version the component declares in its `keel-plugin-version` section(s), or why it
/// cannot be read.
pub fn component_version(bytes: &[u8]) -> Result<Option<Version>, String> {
    let mut found: Option<String> = None;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("the component cannot be parsed: {e}"))?;
        if let wasmparser::Payload::CustomSection(section) = payload
            && section.name() == VERSION_SECTION
        {
            let text = String::from_utf8_lossy(section.data()).into_owned();
            match &found {
                Some(previous) if *previous != text => {
                    return Err(format!(
                        "the component declares two versions, `{previous}` and `{text}`"
                    ));
                }
                _ => found = Some(text),
            }
        }
    }
    found
        .map(|v| {
            Version::parse(&v).map_err(|e| {
                format!("the component declares version `{v}`, which is not semver ({e})")
            })
        })
        .transpose()
}

/// Validate a plugin for publication: the manifest parses; a component is a keel component
/// of the supported ABI, every import is covered by a requested capability, and the version it
/// was built as equals the manifest's.
pub fn validate(
    host: &WasmHost,
    manifest_file: &Path,
    manifest_text: &str,
    code: Vec<u8>,
) -> Result<Package, RegistryError> {
    let manifest = Manifest::parse(manifest_text, manifest_file).map_err(|e| {
        RegistryError::InvalidPackage {
            name: manifest_file.display().to_string(),
            problems: vec![e.to_string()],
        }
    })?;
    let mut problems = control_characters(manifest_text);
    let mut report = None;
    match manifest.kind {
        PluginKind::Wasm => {
            match inspect_component(host, &manifest.name, &code) {
                Ok(r) => {
                    problems.extend(check_imports(&r, &manifest.capabilities));
                    report = Some(r);
                }
                Err(e) => problems.push(e.to_string()),
            }
            match component_version(&code) {
                Ok(Some(v)) if v == manifest.version => {}
                Ok(Some(v)) => problems.push(format!(
                    "keel.toml says version {}, but the component was built as version {v}; make `version` in keel.toml and Cargo.toml equal",
                    manifest.version
                )),
                Ok(None) => problems.push(format!(
                    "the component does not declare its version (custom section `{VERSION_SECTION}`); build it with keel-sdk, whose `export_plugin!` records the crate's version"
                )),
                Err(e) => problems.push(e),
            }
        }
        PluginKind::Native => {
            if code.is_empty() {
                problems.push("the native library is empty".into());
            }
        }
    }
    if !problems.is_empty() {
        return Err(RegistryError::InvalidPackage {
            name: format!("{} {}", manifest.name, manifest.version),
            problems,
        });
    }
    let manifest_text = installed_manifest(manifest_text, manifest.kind).map_err(|e| {
        RegistryError::InvalidPackage {
            name: manifest.name.clone(),
            problems: vec![e],
        }
    })?;
    Ok(Package {
        manifest,
        manifest_text,
        code,
        report,
    })
}

/// A problem for every string of the manifest (keys included) that holds a control
/// character. `keel search`, `keel info` and `keel install`'s consent print the manifest's
/// text; a string with escape sequences could move the cursor and erase lines of the consent
/// (keel cleans what it prints from a registry, and refuses to publish it in the first place).
fn control_characters(manifest_text: &str) -> Vec<String> {
    fn walk(value: &toml::Value, at: &str, problems: &mut Vec<String>) {
        let check = |text: &str, what: &str, problems: &mut Vec<String>| {
            if let Some(c) = text.chars().find(|c| c.is_control()) {
                problems.push(format!(
                    "{what} holds the control character U+{:04X}; keel refuses escape sequences and control characters in a manifest (they could rewrite what `keel install` shows): remove it",
                    u32::from(c)
                ));
            }
        };
        match value {
            toml::Value::String(text) => check(text, &format!("`{at}`"), problems),
            toml::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{at}[{i}]"), problems);
                }
            }
            toml::Value::Table(table) => {
                for (key, item) in table {
                    let path = if at.is_empty() {
                        key.escape_debug().to_string()
                    } else {
                        format!("{at}.{}", key.escape_debug())
                    };
                    check(key, &format!("the key `{path}`"), problems);
                    walk(item, &path, problems);
                }
            }
            _ => {}
        }
    }
    let mut problems = Vec::new();
    // A manifest that does not parse was already refused, with the parser's words.
    if let Ok(table) = manifest_text.parse::<toml::Table>() {
        walk(&toml::Value::Table(table), "", &mut problems);
    }
    problems
}

/// The manifest text with `component` pointing at the installed code file.
fn installed_manifest(text: &str, kind: PluginKind) -> Result<String, String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    table.insert(
        "component".into(),
        toml::Value::String(installed_code_name(kind)),
    );
    let out = toml::to_string(&table).map_err(|e| e.to_string())?;
    Manifest::parse(&out, Path::new("keel.toml")).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Publish `package` as `name`, signed with `key` (`None`: unsigned, which installs refuse
/// unless the user passes `--allow-unverified`). `hook` observes the steps (tests stop the
/// process there).
pub fn publish(
    session: &mut Session,
    name: &PluginName,
    package: &Package,
    key: Option<&KeyPair>,
    hook: &mut dyn FnMut(Step),
) -> Result<Record, RegistryError> {
    let manifest = &package.manifest;
    if manifest.name != name.name() {
        return Err(RegistryError::InvalidPackage {
            name: name.to_string(),
            problems: vec![format!(
                "the manifest names the plugin `{}`; publish it as `{}:{}` or change `name` in keel.toml",
                manifest.name,
                name.namespace(),
                manifest.name
            )],
        });
    }
    let release = Release {
        sha256: crate::fsutil::sha256_hex(&package.code),
        size: package.code.len() as u64,
        kind: manifest.kind,
        description: manifest.description.clone(),
        provides: manifest.provides.clone(),
        requires: manifest
            .requires
            .iter()
            .map(|(service, r)| {
                (
                    service.clone(),
                    ServiceReq {
                        range: r.range.to_string(),
                        optional: r.optional,
                    },
                )
            })
            .collect(),
        capabilities: manifest.capabilities.clone(),
        manifest: package.manifest_text.clone(),
    };
    let mut build = |log: &crate::index::IndexLog| {
        if log.version(&manifest.version).is_some() {
            return Err(RegistryError::VersionExists {
                name: name.to_string(),
                version: manifest.version.to_string(),
            });
        }
        let mut record = Record {
            seq: log.len() as u64,
            prev: log.head_hash().to_owned(),
            action: Action::Release,
            name: name.to_string(),
            version: manifest.version.clone(),
            time: now(),
            release: Some(release.clone()),
            key: String::new(),
            signature: String::new(),
        };
        if let Some(key) = key {
            record.sign(key)?;
        }
        Ok(record)
    };
    let record = session
        .registry
        .append(name, Some(&package.code), &mut build, hook)?;
    session.log(name)?;
    Ok(record)
}

/// Append a yank of `name@version`, signed with `key`.
pub fn yank(
    session: &mut Session,
    name: &PluginName,
    version: &Version,
    key: Option<&KeyPair>,
) -> Result<Record, RegistryError> {
    // Refuse early, with the registry's own wording, when the version does not exist.
    let log = session.log(name)?;
    if log.is_empty() {
        return Err(RegistryError::NoSuchPlugin {
            name: name.to_string(),
            registry: session.location().to_owned(),
        });
    }
    let mut build = |log: &crate::index::IndexLog| {
        let mut record = Record {
            seq: log.len() as u64,
            prev: log.head_hash().to_owned(),
            action: Action::Yank,
            name: name.to_string(),
            version: version.clone(),
            time: now(),
            release: None,
            key: String::new(),
            signature: String::new(),
        };
        if let Some(key) = key {
            record.sign(key)?;
        }
        Ok(record)
    };
    let record = session
        .registry
        .append(name, None, &mut build, &mut |_| {})?;
    session.log(name)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::control_characters;

    #[test]
    fn control_characters_in_any_manifest_string_are_refused() {
        let clean = "name = \"a\"\ndescription = \"plain text, « unicode » too\"\n[capabilities]\nemits = [\"a.b\"]\n";
        assert!(control_characters(clean).is_empty());
        for hostile in [
            "description = \"ok\\u001b[1A\\u001b[2Khidden\"\n",
            "description = \"two\\nlines\"\n",
            "[capabilities]\nemits = [\"a.b\", \"x\\u009b2K\"]\n",
            "[requires]\n\"svc\\u0007\" = \"1\"\n",
        ] {
            let problems = control_characters(hostile);
            assert_eq!(problems.len(), 1, "{hostile}: {problems:?}");
            assert!(problems[0].contains("control character U+"), "{problems:?}");
        }
        let problems = control_characters("[capabilities]\nemits = [\"a.b\", \"x\\u009b2K\"]\n");
        assert!(
            problems[0].contains("capabilities.emits[1]"),
            "{problems:?}"
        );
    }
}
