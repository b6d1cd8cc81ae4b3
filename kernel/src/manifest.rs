//! `keel.toml`: what a plugin is, what it provides and requires, and what it asks to be
//! allowed to do. A malformed manifest is refused with the file, the line and the field.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use semver::{Version, VersionReq};
use serde::{Deserialize, Serialize};
use toml::Spanned;

/// How a plugin's code is hosted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// A WebAssembly component, sandboxed.
    Wasm,
    /// A native shared library; loads only when the user trusts it.
    Native,
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginKind::Wasm => "wasm",
            PluginKind::Native => "native",
        })
    }
}

/// One required service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Requirement {
    /// Versions that satisfy it.
    pub range: VersionReq,
    /// An optional requirement does not hold back activation.
    pub optional: bool,
}

/// Access to a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirAccess {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

/// A directory the plugin asks to see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirCapability {
    /// The host path as written in the manifest; relative paths are relative to the workspace.
    pub path: PathBuf,
    /// Where the plugin sees it, e.g. `/workspace`.
    pub guest: String,
    /// Read or read-write.
    pub access: DirAccess,
}

/// What a plugin asks to be allowed to do. Nothing is granted that is not listed here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Directories to preopen.
    #[serde(default)]
    pub dirs: Vec<DirCapability>,
    /// Hosts it may send requests to.
    #[serde(default)]
    pub network: Vec<String>,
    /// Whether it may ask the kernel to run commands.
    #[serde(default)]
    pub exec: bool,
    /// Whether it may start the long-lived programs the person configured for it (ABI 0.3.0
    /// `processes`; the MCP client's servers). Which programs is the person's config alone.
    #[serde(default)]
    pub processes: bool,
    /// Whether it may drive the agent: ask the model for completions and dispatch tool
    /// calls through the gate pipeline (the agent loop and verifiers).
    #[serde(default)]
    pub agent: bool,
    /// Kernel-held secrets (e.g. `OPENAI_API_KEY`) the kernel may place into this plugin's
    /// outbound requests. The plugin never sees their values.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Services it may call besides those under `[requires]`: optional ones it uses when
    /// present, and the kernel's own (`keel.prompt`). `keel.caller` needs no declaration.
    #[serde(default)]
    pub services: Vec<String>,
    /// Event topics it may emit (exact, or ending in `.*`). Nothing else is delivered.
    #[serde(default)]
    pub emits: Vec<String>,
}

/// The kernel service every plugin may call undeclared: who is calling me, who provides X.
pub const CALLER_SERVICE: &str = "keel.caller";

impl Manifest {
    /// Whether this plugin declared that it calls `service` (`[requires]` or
    /// `capabilities.services`; its own services and [`CALLER_SERVICE`] are always allowed).
    pub fn may_call(&self, service: &str) -> bool {
        service == CALLER_SERVICE
            || self.requires.contains_key(service)
            || self.provides.contains_key(service)
            || self.capabilities.services.iter().any(|s| s == service)
    }

    /// Whether this plugin declared that it emits `topic`.
    pub fn may_emit(&self, topic: &str) -> bool {
        self.capabilities
            .emits
            .iter()
            .any(|pattern| topic_matches(pattern, topic))
    }
}

/// Resource limits; `None` means the kernel's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Limits {
    /// Memory cap in MiB (default 64).
    pub memory_mib: Option<u64>,
    /// Guest CPU time per call in milliseconds (default 1000).
    pub cpu_ms: Option<u64>,
    /// Instances that may serve calls at once (default 1, at most [`MAX_INSTANCES`]): a
    /// plugin whose calls are long and independent (a subagent's whole loop) asks for more,
    /// each with the memory cap above.
    pub instances: Option<u64>,
}

/// The most instances of one plugin the kernel runs at once.
pub const MAX_INSTANCES: u64 = 8;

/// A parsed and validated `keel.toml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Manifest {
    /// Unique plugin name, `[a-z][a-z0-9-]*`.
    pub name: String,
    /// The plugin's version.
    pub version: Version,
    /// How its code is hosted.
    pub kind: PluginKind,
    /// One line for people.
    pub description: String,
    /// The component or library file, relative to the manifest.
    pub component: Option<PathBuf>,
    /// A plugin this one replaces: loading it unloads that one first.
    pub replaces: Option<String>,
    /// Services it provides, with their versions.
    pub provides: BTreeMap<String, Version>,
    /// Services it requires.
    pub requires: BTreeMap<String, Requirement>,
    /// What it asks to be allowed to do.
    pub capabilities: Capabilities,
    /// Resource limits.
    pub limits: Limits,
    /// Default configuration (a JSON object).
    pub config: serde_json::Value,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("{file}: cannot read the plugin manifest: {reason}")]
    Read {
        /// The manifest file.
        file: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// The file was read but is not a valid manifest.
    #[error("{file}:{line}:{column}: field `{field}`: {message}")]
    Invalid {
        /// The manifest file.
        file: PathBuf,
        /// 1-based line of the offending item.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field, dotted (`requires.example.greeting`).
        field: String,
        /// What is wrong and what to write instead.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawManifest {
    name: Spanned<String>,
    version: Spanned<String>,
    kind: Spanned<String>,
    #[serde(default)]
    description: String,
    component: Option<String>,
    replaces: Option<Spanned<String>>,
    #[serde(default)]
    provides: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    requires: BTreeMap<String, Spanned<RawRequirement>>,
    #[serde(default)]
    capabilities: Option<Spanned<Capabilities>>,
    #[serde(default)]
    limits: Option<Spanned<Limits>>,
    #[serde(default)]
    config: toml::Table,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawRequirement {
    Range(String),
    Detailed {
        version: String,
        #[serde(default)]
        optional: bool,
    },
}

/// Whether `name` is a valid plugin name: `[a-z][a-z0-9-]*`, at most 64 bytes. Plugin names
/// become path components (cache, state, spill files), so this is also a safety check.
pub fn is_valid_plugin_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && crate::gates::safe_path::safe_component(name).is_ok()
}

/// Whether `name` is a valid service name: dot-separated `[a-z][a-z0-9-]*` words, at most 128
/// bytes (`example.greeting`).
pub fn is_valid_service_name(name: &str) -> bool {
    name.len() <= 128 && !name.is_empty() && name.split('.').all(is_valid_plugin_name)
}

impl Manifest {
    /// Read and parse the manifest at `path`.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError::Read {
            file: path.to_owned(),
            reason: e.to_string(),
        })?;
        Manifest::parse(&text, path)
    }

    /// Parse manifest `text`; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Manifest, ManifestError> {
        let err = |span: std::ops::Range<usize>, field: &str, message: String| {
            let (line, column) = line_col(text, span.start);
            ManifestError::Invalid {
                file: file.to_owned(),
                line,
                column,
                field: field.to_owned(),
                message,
            }
        };
        let raw: RawManifest = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let field = field_of_toml_error(e.message(), text, span.start);
            err(span, &field, e.message().trim().to_owned())
        })?;

        let name = raw.name.get_ref().clone();
        if !is_valid_plugin_name(&name) {
            return Err(err(
                raw.name.span(),
                "name",
                format!(
                    "`{}` is not a valid plugin name; use lowercase letters, digits and `-`, starting with a letter (e.g. `my-plugin`)",
                    name.escape_debug()
                ),
            ));
        }
        // The kernel's own name: a plugin called `keel` or `keel-…` (or replacing it) could
        // pass for the kernel in call chains, event sources and refusals.
        if crate::types::reads_like_kernel(&name) {
            return Err(err(
                raw.name.span(),
                "name",
                format!(
                    "`{name}` reads like the kernel's own name (`keel`, `keel-…`); choose another"
                ),
            ));
        }
        let version = Version::parse(raw.version.get_ref()).map_err(|e| {
            err(
                raw.version.span(),
                "version",
                format!(
                    "`{}` is not a semver version ({e}); write e.g. `0.1.0`",
                    raw.version.get_ref()
                ),
            )
        })?;
        let kind = match raw.kind.get_ref().as_str() {
            "wasm" => PluginKind::Wasm,
            "native" => PluginKind::Native,
            other => {
                return Err(err(
                    raw.kind.span(),
                    "kind",
                    format!("unknown kind `{other}`; use `wasm` or `native`"),
                ));
            }
        };
        if let Some(r) = &raw.replaces {
            if r.get_ref() == crate::types::KERNEL_NAME {
                return Err(err(
                    r.span(),
                    "replaces",
                    "the kernel and its gates are not a plugin and cannot be replaced".to_owned(),
                ));
            }
            if !is_valid_plugin_name(r.get_ref()) {
                return Err(err(
                    r.span(),
                    "replaces",
                    format!("`{}` is not a valid plugin name", r.get_ref()),
                ));
            }
        }
        let mut provides = BTreeMap::new();
        for (service, v) in &raw.provides {
            let field = format!("provides.{service}");
            if !is_valid_service_name(service) {
                return Err(err(
                    v.span(),
                    &field,
                    format!(
                        "`{service}` is not a valid service name; use dot-separated lowercase words like `example.greeting`"
                    ),
                ));
            }
            if crate::types::reads_like_kernel(service) {
                return Err(err(
                    v.span(),
                    &field,
                    format!(
                        "`{service}` is in the reserved `keel` namespace (`keel.…`, `keel-…`), which belongs to the kernel; choose another name"
                    ),
                ));
            }
            let version = Version::parse(v.get_ref()).map_err(|e| {
                err(
                    v.span(),
                    &field,
                    format!(
                        "`{}` is not a semver version ({e}); write e.g. `1.0.0`",
                        v.get_ref()
                    ),
                )
            })?;
            provides.insert(service.clone(), version);
        }
        let mut requires = BTreeMap::new();
        for (service, r) in &raw.requires {
            let field = format!("requires.{service}");
            if !is_valid_service_name(service) {
                return Err(err(
                    r.span(),
                    &field,
                    format!("`{service}` is not a valid service name"),
                ));
            }
            let (range, optional) = match r.get_ref() {
                RawRequirement::Range(s) => (s, false),
                RawRequirement::Detailed { version, optional } => (version, *optional),
            };
            let range = VersionReq::parse(range).map_err(|e| {
                err(
                    r.span(),
                    &field,
                    format!("`{range}` is not a semver range ({e}); write e.g. `^1.0`"),
                )
            })?;
            requires.insert(service.clone(), Requirement { range, optional });
        }
        let capabilities = match raw.capabilities {
            Some(c) => {
                let span = c.span();
                let caps = c.into_inner();
                for d in &caps.dirs {
                    if !d.guest.starts_with('/') || d.guest.split('/').any(|c| c == "..") {
                        return Err(err(
                            span,
                            "capabilities.dirs.guest",
                            format!(
                                "guest path `{}` must be absolute and must not contain `..`, e.g. `/workspace`",
                                d.guest
                            ),
                        ));
                    }
                }
                for h in &caps.network {
                    if h.is_empty() || h.contains(['/', ' ', '@']) {
                        return Err(err(
                            span,
                            "capabilities.network",
                            format!("`{h}` is not a host name; write e.g. `api.example.com`"),
                        ));
                    }
                }
                caps
            }
            None => Capabilities::default(),
        };
        let limits = match raw.limits {
            Some(l) => {
                let span = l.span();
                let limits = l.into_inner();
                if limits.memory_mib == Some(0) || limits.memory_mib.is_some_and(|m| m > 4096) {
                    return Err(err(
                        span,
                        "limits.memory-mib",
                        "must be between 1 and 4096".into(),
                    ));
                }
                if limits.instances == Some(0)
                    || limits.instances.is_some_and(|n| n > MAX_INSTANCES)
                {
                    return Err(err(
                        span,
                        "limits.instances",
                        format!("must be between 1 and {MAX_INSTANCES}"),
                    ));
                }
                if limits.cpu_ms == Some(0) || limits.cpu_ms.is_some_and(|m| m > 3_600_000) {
                    return Err(err(
                        span,
                        "limits.cpu-ms",
                        "must be between 1 and 3600000".into(),
                    ));
                }
                limits
            }
            None => Limits::default(),
        };
        let config = serde_json::to_value(&raw.config).map_err(|e| {
            err(
                0..0,
                "config",
                format!("cannot be represented as JSON: {e}"),
            )
        })?;
        Ok(Manifest {
            name,
            version,
            kind,
            description: raw.description,
            component: raw.component.map(PathBuf::from),
            replaces: raw.replaces.map(Spanned::into_inner),
            provides,
            requires,
            capabilities,
            limits,
            config,
        })
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The field a TOML deserialization error is about: named in the message (`missing field
/// `x``, `unknown field `x``), else the key written on the offending line.
fn field_of_toml_error(message: &str, text: &str, offset: usize) -> String {
    for marker in ["missing field `", "unknown field `", "duplicate key `"] {
        if let Some(rest) = message.split(marker).nth(1)
            && let Some(field) = rest.split('`').next()
        {
            return field.to_owned();
        }
    }
    let offset = text.floor_char_boundary(offset.min(text.len()));
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    match line.split_once('=') {
        Some((key, _)) => key.trim().trim_matches('"').to_owned(),
        None => line.trim().trim_matches(['[', ']']).to_owned(),
    }
}

/// Whether a subscription `pattern` (`a.b`, `a.*` or `*`) matches `topic`.
pub(crate) fn topic_matches(pattern: &str, topic: &str) -> bool {
    if pattern == "*" || pattern == topic {
        return true;
    }
    match pattern.strip_suffix(".*") {
        Some(prefix) => topic
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.')),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "greeter-client"
version = "0.1.0"
kind = "wasm"
description = "Greets"

[provides]
"example.client" = "1.2.0"

[requires]
"example.greeting" = "^1.0"
"example.extra" = { version = ">=2", optional = true }

[capabilities]
dirs = [{ path = ".", guest = "/workspace", access = "read-write" }]
network = ["api.example.com"]

[limits]
memory-mib = 32

[config]
greeting = "Hi"
"#;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("plugins/x/keel.toml"))
    }

    #[test]
    fn parses_a_full_manifest() -> Result<(), ManifestError> {
        let m = parse(GOOD)?;
        assert_eq!(m.name, "greeter-client");
        assert_eq!(m.kind, PluginKind::Wasm);
        assert_eq!(m.provides["example.client"], Version::new(1, 2, 0));
        assert!(!m.requires["example.greeting"].optional);
        assert!(m.requires["example.extra"].optional);
        assert_eq!(m.capabilities.dirs[0].access, DirAccess::ReadWrite);
        assert_eq!(m.limits.memory_mib, Some(32));
        assert_eq!(m.config["greeting"], "Hi");
        Ok(())
    }

    fn invalid(text: &str) -> (usize, String, String) {
        match parse(text) {
            Err(ManifestError::Invalid {
                line,
                field,
                message,
                file,
                ..
            }) => {
                assert_eq!(file, Path::new("plugins/x/keel.toml"));
                (line, field, message)
            }
            other => panic!("expected an invalid-manifest error, got {other:?}"),
        }
    }

    #[test]
    fn bad_version_names_line_and_field() {
        let text = GOOD.replace("version = \"0.1.0\"", "version = \"one\"");
        let (line, field, message) = invalid(&text);
        assert_eq!((line, field.as_str()), (3, "version"));
        assert!(message.contains("semver"), "{message}");
    }

    #[test]
    fn bad_range_names_the_requirement() {
        let text = GOOD.replace("\"^1.0\"", "\"^^1\"");
        let (line, field, _) = invalid(&text);
        assert_eq!((line, field.as_str()), (11, "requires.example.greeting"));
    }

    #[test]
    fn unknown_field_is_named() {
        let (line, field, _) = invalid(&GOOD.replace("description", "descripton"));
        assert_eq!((line, field.as_str()), (5, "descripton"));
    }

    #[test]
    fn missing_field_is_named() {
        let (_, field, _) = invalid("name = \"a\"\nkind = \"wasm\"\n");
        assert_eq!(field, "version");
    }

    #[test]
    fn wrong_type_names_the_key_on_the_line() {
        let (line, field, _) = invalid("name = \"a\"\nversion = 1\nkind = \"wasm\"\n");
        assert_eq!((line, field.as_str()), (2, "version"));
    }

    #[test]
    fn bad_kind_and_name_and_reserved_service() {
        assert_eq!(invalid(&GOOD.replace("\"wasm\"", "\"elf\"")).1, "kind");
        assert_eq!(
            invalid(&GOOD.replace("\"greeter-client\"", "\"Greeter\"")).1,
            "name"
        );
        let (_, field, message) = invalid(&GOOD.replace("example.client", "keel.gates"));
        assert_eq!(field, "provides.keel.gates");
        assert!(message.contains("reserved"));
    }

    #[test]
    fn garbage_and_binary_never_panic() {
        for text in ["", "\u{0}\u{1}", "[[[", "name = ", "x = \"\\u{zz}\""] {
            assert!(parse(text).is_err());
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
            let _ = parse(&text);
        }

        #[test]
        fn mutated_manifests_never_panic(cut in 0usize..400, insert in "[\\[\\]=\"{}.,a-z0-9 \n]{0,8}") {
            let at = GOOD.floor_char_boundary(cut.min(GOOD.len()));
            let text = format!("{}{insert}{}", &GOOD[..at], &GOOD[at..]);
            if let Err(e) = parse(&text) {
                // Every refusal names the file.
                proptest::prop_assert!(e.to_string().starts_with("plugins/x/keel.toml"));
            }
        }
    }

    #[test]
    fn missing_file_names_the_file() {
        let e = Manifest::load(Path::new("/nonexistent/keel.toml"));
        assert!(matches!(e, Err(ManifestError::Read { .. })));
        assert!(
            e.err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("/nonexistent/keel.toml")
        );
    }
}
