//! The user's configuration (`$KEEL_HOME/config.toml`) and the paths keel uses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// The user's config file. Unknown keys are refused: a misspelt setting must not be ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// What the user trusts.
    #[serde(default)]
    pub trust: Trust,
    /// Plugins loaded in addition to the bundled ones.
    #[serde(default)]
    pub plugins: Plugins,
    /// Per-plugin settings, `[config.<plugin>]`, laid over the manifest's `[config]` defaults.
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, toml::Table>,
    /// The exec policy, `[exec]`: parsed and validated from the raw text by the kernel's
    /// policy parser, only accepted here.
    #[serde(default, rename = "exec")]
    _exec: Option<serde::de::IgnoredAny>,
    /// The network policy, `[network]`: parsed by the kernel's network gate from the raw text.
    #[serde(default, rename = "network")]
    _network: Option<serde::de::IgnoredAny>,
    /// Which model a session talks to.
    #[serde(default)]
    pub model: ModelConfig,
    /// Which plugins a session loads.
    #[serde(default)]
    pub profile: Profile,
    /// Secrets (API keys) by name; the environment variable of the same name wins.
    #[serde(default)]
    pub secrets: std::collections::BTreeMap<String, SecretSetting>,
    /// The OS sandbox commands run in.
    #[serde(default)]
    pub sandbox: SandboxSettings,
    /// Limits above the defaults, `[limits.<plugin>] memory-mib / cpu-ms`: a manifest cannot
    /// raise its own.
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, keel_kernel::Limits>,
    /// Directories a plugin may be granted beyond the workspace and its own data directory,
    /// `[grants.<plugin>] dirs = [...]`, written as in its manifest.
    #[serde(default)]
    pub grants: std::collections::BTreeMap<String, GrantSettings>,
    /// Wall-clock deadlines of calls into plugins, `[timeouts]`.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// How a session is shown, `[display]`.
    #[serde(default)]
    pub display: DisplaySettings,
    /// MCP servers whose tools a session offers, `[mcp.servers.NAME]`.
    #[serde(default)]
    pub mcp: McpSettings,
    /// What child agents (the `task` tool) may have, `[subagents]`.
    #[serde(default)]
    pub subagents: SubagentSettings,
    /// Registries by name, `[registries.NAME]`: OCI registries and how to reach them.
    #[serde(default)]
    pub registries: std::collections::BTreeMap<String, RegistrySettings>,
    /// Workspace checkpoints, `[checkpoints]`.
    #[serde(default)]
    pub checkpoints: CheckpointSettings,
    /// Commands run at points of a session, `[[hooks.EVENT]]` (the `hooks` plugin).
    #[serde(default)]
    pub hooks: HookSettings,
    /// OpenTelemetry export, `[telemetry]` (off unless `otlp-endpoint` is set).
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// The hooks a session here runs: these and the workspace's approved ones, read once when
    /// the context is made (`crate::hooks::session_hooks`).
    #[serde(skip)]
    pub session_hooks: Vec<crate::hooks::SessionHook>,
}

/// `[hooks]`: the person's hooks by event, `[[hooks.pre-tool-use]]` and so on; each a
/// command run in the OS sandbox (see `crate::hooks`).
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HookSettings {
    #[serde(default)]
    pub session_start: Vec<HookSetting>,
    #[serde(default)]
    pub user_prompt_submit: Vec<HookSetting>,
    #[serde(default)]
    pub pre_tool_use: Vec<HookSetting>,
    #[serde(default)]
    pub post_tool_use: Vec<HookSetting>,
    #[serde(default)]
    pub pre_compact: Vec<HookSetting>,
    #[serde(default)]
    pub stop: Vec<HookSetting>,
    #[serde(default)]
    pub subagent_stop: Vec<HookSetting>,
}

impl HookSettings {
    /// Every hook with its event's name, in the order of the events and of the file.
    pub fn by_event(&self) -> Vec<(&'static str, &HookSetting)> {
        let events: [(&'static str, &Vec<HookSetting>); 7] = [
            ("session-start", &self.session_start),
            ("user-prompt-submit", &self.user_prompt_submit),
            ("pre-tool-use", &self.pre_tool_use),
            ("post-tool-use", &self.post_tool_use),
            ("pre-compact", &self.pre_compact),
            ("stop", &self.stop),
            ("subagent-stop", &self.subagent_stop),
        ];
        events
            .into_iter()
            .flat_map(|(event, hooks)| hooks.iter().map(move |h| (event, h)))
            .collect()
    }
}

/// One hook: `matcher` (a regular expression the whole tool name must match; empty or `*`
/// for every tool), `command` (run with `sh -c` in the workspace), `timeout-secs` (default
/// 10) and `network` (default `false`: the hook reaches no network).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HookSetting {
    #[serde(default)]
    pub matcher: String,
    pub command: String,
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub network: bool,
}

/// `[checkpoints]`: the workspace recorded before each turn and each tool call that may change
/// files, in keel's home, for `keel rewind`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CheckpointSettings {
    /// `false` turns checkpoints off (on by default).
    pub enabled: Option<bool>,
    /// Gitignore-style patterns not recorded, besides what `.gitignore` excludes.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// Files larger than this many MiB are not recorded (said in `keel checkpoints list`);
    /// default 16.
    pub max_file_mib: Option<u64>,
    /// A workspace with more files and directories than this is not recorded (default
    /// 200,000).
    pub max_entries: Option<usize>,
    /// The workspace's store keeps at most this many MiB: past it the oldest checkpoints of
    /// any session are dropped when a session starts (default 2048).
    pub max_total_mib: Option<u64>,
    /// Checkpoints older than this many days are dropped when a session starts (default 30).
    pub max_age_days: Option<u64>,
    /// At most this many checkpoints per session, the newest (default 1000).
    pub max_per_session: Option<usize>,
}

impl CheckpointSettings {
    /// The recorder's settings.
    pub fn settings(&self) -> keel_kernel::checkpoints::Settings {
        let defaults = keel_kernel::checkpoints::Settings::default();
        keel_kernel::checkpoints::Settings {
            max_file_bytes: self
                .max_file_mib
                .map_or(defaults.max_file_bytes, |m| m.saturating_mul(1 << 20)),
            ignore: self.ignore.clone(),
            max_entries: self.max_entries.unwrap_or(defaults.max_entries),
            not_covered: Vec::new(),
        }
    }

    /// What the collection a session runs when it starts keeps (each session's last
    /// checkpoint always stays).
    pub fn retention(&self) -> keel_kernel::checkpoints::Retention {
        let defaults = keel_kernel::checkpoints::Retention::default();
        keel_kernel::checkpoints::Retention {
            max_age: self.max_age_days.map_or(defaults.max_age, |d| {
                std::time::Duration::from_secs(d.saturating_mul(24 * 3600))
            }),
            per_session: self.max_per_session.unwrap_or(defaults.per_session),
            max_total_bytes: self
                .max_total_mib
                .map_or(defaults.max_total_bytes, |m| m.saturating_mul(1 << 20)),
            ..defaults
        }
    }
}

/// `[registries.NAME]`: an OCI registry keel publishes to and installs from, named for
/// `--registry NAME` (or matched by its URL).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RegistrySettings {
    /// `oci://HOST[:PORT]/PATH`.
    pub url: String,
    /// Speak plain HTTP instead of TLS: refused unless the host is this machine.
    #[serde(default)]
    pub plain_http: bool,
    /// The user name to log in with; the password comes from `password-secret`.
    pub username: Option<String>,
    /// The kernel-held secret (environment variable, or `[secrets]`) holding the password or
    /// access token. Without `username`, the credentials `docker login` stored are used.
    pub password_secret: Option<String>,
    /// The PEM certificate of a private authority that signed the registry's certificate.
    pub ca_file: Option<PathBuf>,
}

/// `[subagents]`: a child agent gets read-only tools unless `allow` names more (never more
/// than its parent has), and children nest at most `max-depth` deep.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SubagentSettings {
    /// How deep children may nest (default 1: the main agent's children start none).
    pub max_depth: Option<u32>,
    /// Tools a child may be given although they write, run code or reach the network.
    #[serde(default)]
    pub allow: Vec<String>,
}

impl SubagentSettings {
    /// The kernel's policy from these settings.
    pub fn policy(&self) -> keel_kernel::SubagentPolicy {
        let default = keel_kernel::SubagentPolicy::default();
        keel_kernel::SubagentPolicy {
            max_depth: self.max_depth.unwrap_or(default.max_depth),
            allow: self.allow.iter().cloned().collect(),
        }
    }
}

/// `[mcp]`: the MCP servers a session starts (each in the OS sandbox) and offers the tools of.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct McpSettings {
    /// How long a server may take to start and list its tools, in milliseconds.
    pub init_timeout_ms: Option<u32>,
    /// How long one tool call may take, in milliseconds.
    pub call_timeout_ms: Option<u32>,
    /// The servers by name.
    #[serde(default)]
    pub servers: std::collections::BTreeMap<String, McpServer>,
}

/// `[mcp.servers.NAME]`: one server, started as `command args…` (stdio).
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct McpServer {
    /// The program (a name on `PATH` or a path).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// A Streamable HTTP server's URL (instead of `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The kernel-held secret sent to an HTTP server as `Authorization: Bearer …` (only to its
    /// host; the plugin never sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_secret: Option<String>,
    /// Environment variables: a value, or `{ secret = "NAME" }` for a kernel-held secret.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, EnvValue>,
    /// Working directory (relative to the workspace; `~/` is your home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Directories it may write (relative to the workspace; `~/` is your home). Nothing else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
    /// Directories it may read where the sandbox hides them (a server installed under `/tmp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    /// Hosts it may reach through keel's network gate. None by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Its tools that run without asking: names as the server gives them, or `*` for all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// How long one of its tool calls may take, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
    /// Whether it comes from the project's `.mcp.json` or an editor (approved for this
    /// workspace, granted nothing) rather than the user's config.
    #[serde(skip)]
    pub from_project: bool,
    /// Whether an editor passed it over ACP (`keel acp`): an HTTP server of an editor reaches
    /// only its own origin, granted to the `mcp` plugin alone.
    #[serde(skip)]
    pub from_editor: bool,
    /// The headers an editor passed with its HTTP server: each becomes a kernel-held secret
    /// bound to the server's origin, which the kernel puts into that server's requests alone.
    #[serde(skip)]
    pub editor_headers: EditorHeaders,
}

/// Headers an editor passed with an HTTP MCP server, as (name, value). Their values often
/// carry tokens: they are never written, logged or shown (`Debug` names the headers only).
#[derive(Clone, Default, PartialEq)]
pub struct EditorHeaders(pub Vec<(String, String)>);

impl std::fmt::Debug for EditorHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

impl EditorHeaders {
    /// Each header with the name of the kernel-held secret that carries its value in server
    /// `server`'s requests. The names cannot be environment variables (they hold a `:`), so
    /// no variable keel was started with is ever taken for one.
    pub fn secrets<'a>(
        &'a self,
        server: &'a str,
    ) -> impl Iterator<Item = (&'a str, String, &'a str)> + 'a {
        self.0.iter().enumerate().map(move |(at, (name, value))| {
            (
                name.as_str(),
                format!("keel-acp:{server}:{at}"),
                value.as_str(),
            )
        })
    }
}

/// One environment variable of a server: a plain value, or a kernel-held secret by name.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(untagged, deny_unknown_fields)]
pub enum EnvValue {
    /// The value as written.
    Plain(String),
    /// `{ secret = "NAME" }`: the value of the secret `NAME` (from `[secrets]` or the
    /// environment), which keel puts into this server's environment only.
    Secret {
        /// The secret's name.
        secret: String,
    },
}

impl UserConfig {
    /// What the `mcp` plugin is configured with besides its manifest's defaults: each server's
    /// `allow` and timeout, and the `[mcp]` timeouts, laid over `[config.mcp]`.
    pub(crate) fn configure_mcp_plugin(&mut self) {
        if self.mcp.servers.is_empty() {
            return;
        }
        let table = self.config.entry("mcp".to_owned()).or_default();
        let mut servers = toml::Table::new();
        for (name, server) in &self.mcp.servers {
            let mut entry = toml::Table::new();
            entry.insert(
                "allow".into(),
                toml::Value::Array(
                    server
                        .allow
                        .iter()
                        .cloned()
                        .map(toml::Value::String)
                        .collect(),
                ),
            );
            if let Some(ms) = server.timeout_ms {
                entry.insert("timeout_ms".into(), toml::Value::Integer(ms.into()));
            }
            // A project's file names no URL keel uses: only stdio servers come from there. An
            // editor's approved HTTP server does, its headers named by their secrets.
            if let Some(url) = server
                .url
                .as_ref()
                .filter(|_| !server.from_project || server.from_editor)
            {
                entry.insert("url".into(), toml::Value::String(url.clone()));
                if let Some(secret) = &server.bearer_secret {
                    entry.insert("bearer_secret".into(), toml::Value::String(secret.clone()));
                }
                let headers: Vec<toml::Value> = server
                    .editor_headers
                    .secrets(name)
                    .map(|(header, secret, _)| {
                        let mut named = toml::Table::new();
                        named.insert("header".into(), toml::Value::String(header.to_owned()));
                        named.insert("secret".into(), toml::Value::String(secret));
                        toml::Value::Table(named)
                    })
                    .collect();
                if !headers.is_empty() {
                    entry.insert("secret_headers".into(), toml::Value::Array(headers));
                }
            }
            servers.insert(name.clone(), toml::Value::Table(entry));
        }
        table.insert("servers".into(), toml::Value::Table(servers));
        for (key, value) in [
            ("init_timeout_ms", self.mcp.init_timeout_ms),
            ("call_timeout_ms", self.mcp.call_timeout_ms),
        ] {
            if let Some(ms) = value {
                table.insert(key.into(), toml::Value::Integer(ms.into()));
            }
        }
    }
}

/// `[telemetry]`: a session's turns, model calls, tool calls, gate decisions and plugin
/// changes exported as OpenTelemetry spans and metrics over OTLP/HTTP (protobuf), through the
/// network gate like any other destination (`crate::telemetry`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TelemetrySettings {
    /// The collector's base URL (`http://127.0.0.1:4318`); spans go to `/v1/traces` under
    /// it and metrics to `/v1/metrics`. Nothing is exported without it.
    pub otlp_endpoint: Option<String>,
    /// `true` exports the prompt, the model's text, tool arguments, tool results and command
    /// lines as attributes (each cut to a bound); off by default.
    #[serde(default)]
    pub content: bool,
}

/// `[display]`: how a session is shown on the terminal.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DisplaySettings {
    /// How many of a tool result's last lines the transcript shows (default 4; 0 shows only
    /// its label; `/expand` shows the last result whole).
    pub result_lines: Option<usize>,
}

/// `[timeouts]`: how long a call into a plugin may take before the kernel stops it, in
/// seconds, by the door it came through. A call stopped at its deadline ends with an error
/// the model reads, and the plugin starts afresh for its next call.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Timeouts {
    /// A tool call (default 300).
    pub tool_secs: Option<f64>,
    /// A subagent's whole run, the `task` tool's call (default 1800).
    pub subagent_secs: Option<f64>,
    /// One model completion, streamed (default 600).
    pub model_secs: Option<f64>,
    /// Any other call between plugins, a guard, an activation (default 120).
    pub service_secs: Option<f64>,
    /// One event handled by one plugin (default 30).
    pub event_secs: Option<f64>,
    /// A whole turn (default none: a turn runs until the model is done, its step limit or
    /// Ctrl-C).
    pub turn_secs: Option<f64>,
}

impl Timeouts {
    /// The kernel's deadlines: these settings over its defaults.
    pub fn deadlines(&self) -> anyhow::Result<keel_kernel::Deadlines> {
        let defaults = keel_kernel::Deadlines::default();
        let pick = |key: &str, set: Option<f64>, default: std::time::Duration| match set {
            None => Ok(default),
            Some(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
                Ok(std::time::Duration::from_secs_f64(secs))
            }
            Some(secs) => bail!(
                "[timeouts] {key} = {secs} is not a number of seconds between 0 and 86400; \
                 fix it in keel's config or remove it for the default ({} s)",
                default.as_secs()
            ),
        };
        Ok(keel_kernel::Deadlines {
            tool: pick("tool-secs", self.tool_secs, defaults.tool)?,
            subagent: pick("subagent-secs", self.subagent_secs, defaults.subagent)?,
            model: pick("model-secs", self.model_secs, defaults.model)?,
            service: pick("service-secs", self.service_secs, defaults.service)?,
            event: pick("event-secs", self.event_secs, defaults.event)?,
            turn: match self.turn_secs {
                None => None,
                Some(secs) => Some(pick("turn-secs", Some(secs), std::time::Duration::ZERO)?),
            },
        })
    }
}

/// `[grants.<plugin>]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantSettings {
    /// Manifest directory paths the user allows for this plugin.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
}

/// `[sandbox]`: how commands are confined.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SandboxSettings {
    /// `workspace-write` (the default), `read-only`, or `off` (dangerous: no confinement).
    pub mode: Option<String>,
    /// Paths hidden from commands besides the built-in list (`~/` is your home).
    #[serde(default)]
    pub deny_read: Vec<String>,
    /// Which commands may reach the network through keel's gate: `approved` (the default),
    /// `none` or `all`.
    pub network: Option<String>,
    /// Environment variables commands and servers inherit besides keel's short list of
    /// harmless ones (`PATH`, `HOME`, `LANG`, toolchain locations, …); anything else keel was
    /// started with, tokens above all, stays with keel.
    #[serde(default)]
    pub env: Vec<String>,
}

/// One `[secrets]` entry: `NAME = "value"`, or `NAME = { value = "...", hosts = [...] }` to
/// bind it to the hosts it is for (the value may then come from the environment alone). A
/// secret goes only to its hosts; the model keys are bound to the model endpoint already.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum SecretSetting {
    /// The value alone: the secret is bound to no host unless it is a model key.
    Value(String),
    /// A value and/or the hosts it may be sent to (patterns as in a manifest's `network`).
    Bound(BoundSecret),
}

/// The table form of a `[secrets]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundSecret {
    /// The value; the environment variable of the same name wins.
    pub value: Option<String>,
    /// The hosts the secret may be sent to.
    #[serde(default)]
    pub hosts: Vec<String>,
}

impl TryFrom<toml::Value> for SecretSetting {
    type Error = String;

    fn try_from(value: toml::Value) -> Result<Self, String> {
        const FORMS: &str =
            "a secret is `NAME = \"value\"` or `NAME = { value = \"...\", hosts = [\"host\"] }`";
        match value {
            toml::Value::String(v) => Ok(SecretSetting::Value(v)),
            table @ toml::Value::Table(_) => table
                .try_into::<BoundSecret>()
                .map(SecretSetting::Bound)
                .map_err(|e| format!("{FORMS}: {}", e.message())),
            other => Err(format!("{FORMS} (found: {})", other.type_str())),
        }
    }
}

impl SecretSetting {
    /// The value written in the config, if any.
    pub fn value(&self) -> Option<&str> {
        match self {
            SecretSetting::Value(v) => Some(v),
            SecretSetting::Bound(b) => b.value.as_deref(),
        }
    }

    /// The hosts the config binds the secret to.
    pub fn hosts(&self) -> &[String] {
        match self {
            SecretSetting::Value(_) => &[],
            SecretSetting::Bound(b) => &b.hosts,
        }
    }
}

/// `[model]`: the provider and model of a session. Environment overrides: `KEEL_PROVIDER`,
/// `KEEL_MODEL`, `KEEL_BASE_URL`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ModelConfig {
    /// `openai` (also any OpenAI-compatible server), `anthropic` or `scripted`.
    pub provider: Option<String>,
    /// The model name.
    pub model: Option<String>,
    /// The API's base URL, e.g. `http://127.0.0.1:11434/v1` for a local Ollama.
    pub base_url: Option<String>,
    /// For `scripted`: the script file.
    pub script: Option<PathBuf>,
    /// The model's context window in tokens, when keel does not know it from the model's name
    /// (a local model, say); conversations are compacted before they pass `compact-at` of it.
    pub context_window: Option<u64>,
}

/// `[profile]`: the plugins of a session.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Bundled plugin names, installed plugin names, or paths to plugin directories. When
    /// empty, the default set for the provider.
    #[serde(default)]
    pub plugins: Vec<String>,
}

/// `[trust]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    /// Native plugins allowed to load, by name. They run with the user's full rights.
    #[serde(default)]
    pub native: BTreeSet<String>,
}

/// `[plugins]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plugins {
    /// Plugin directories (or manifests) to load.
    #[serde(default)]
    pub paths: Vec<PathBuf>,
}

/// Where keel keeps things, and the user's settings.
pub struct Context {
    /// keel's home directory.
    pub home: PathBuf,
    /// The workspace directory, canonical.
    pub workspace: PathBuf,
    /// The user's settings.
    pub config: UserConfig,
    /// The text of the user's config file (empty when there is none).
    pub config_text: String,
    /// Whether `KEEL_PROVIDER`, `KEEL_MODEL` and `KEEL_BASE_URL` apply (not in the demo).
    pub env_overrides: bool,
}

impl Context {
    pub fn new(home: Option<PathBuf>, workspace: PathBuf) -> anyhow::Result<Context> {
        let home = match home {
            Some(h) => h,
            None => match dirs::home_dir() {
                Some(h) => h.join(".keel"),
                None => bail!("cannot find your home directory; pass --home DIR or set KEEL_HOME"),
            },
        };
        // Absolute, so every use of it (the sandbox's hiding of it above all) means this
        // directory whatever the working directory is; and normalised, so `--home ../h` is
        // `<parent>/h` to every check that compares it with the workspace (`<ws>/../h` would
        // look inside it).
        let home = std::path::absolute(&home)
            .map(|h| keel_kernel::gates::approvals::normalize_lexically(&h))
            .with_context(|| format!("cannot resolve keel's home `{}`", home.display()))?;
        // The person's alone before anything is read from it or written to it.
        crate::home_modes::keep_private(&home)?;
        let workspace = workspace.canonicalize().with_context(|| {
            format!(
                "workspace `{}` does not exist; pass --workspace DIR",
                workspace.display()
            )
        })?;
        let (mut config, config_text) = load_config(&home.join("config.toml"))?;
        crate::project_mcp::add_approved(&home, &workspace, &mut config)?;
        config.configure_mcp_plugin();
        config.session_hooks = crate::hooks::session_hooks(&home, &workspace, &config);
        crate::hooks::configure_hooks_plugin(&workspace, &mut config);
        crate::commands::skills::configure_skills_plugin(&home, &workspace, &mut config);
        crate::commands::memory::configure_memory_plugin(&home, &workspace, &mut config);
        // What killed keel processes left in the places keel writes most (`sweep`).
        crate::sweep::at_start(&home, &home.join("cache").join("components"), &workspace);
        Ok(Context {
            home,
            workspace,
            config,
            config_text,
            env_overrides: true,
        })
    }

    /// keel's data directory (session logs, verdict ledger).
    pub fn data_dir(&self) -> PathBuf {
        self.home.join("data")
    }

    /// The verdict ledger of the claim verifier.
    pub fn verdict_ledger(&self) -> PathBuf {
        self.data_dir().join("verifier").join("verdicts.jsonl")
    }

    /// The network audit log (never inside a directory a plugin can be granted).
    pub fn audit_log(&self) -> PathBuf {
        self.home.join("audit.log")
    }

    /// The "always" approval grants.
    pub fn grants_file(&self) -> PathBuf {
        self.home.join("approvals.json")
    }

    /// What no plugin may ever see: the audit log, the approvals, the keys, the config.
    pub fn sealed_paths(&self) -> Vec<PathBuf> {
        vec![
            self.audit_log(),
            self.grants_file(),
            self.home.join("config.toml"),
            self.home.join("keys"),
        ]
    }

    /// The interactive prompt's history for this workspace, one file per workspace (named by
    /// its path, `/` written `%`).
    pub fn history_file(&self) -> PathBuf {
        let name: String = self
            .workspace
            .to_string_lossy()
            .chars()
            .map(|c| if c == '/' { '%' } else { c })
            .take(200)
            .collect();
        self.home.join("history").join(format!("{name}.txt"))
    }

    /// Where workspace checkpoints are kept (sealed: no plugin is granted keel's home).
    pub fn checkpoints_dir(&self) -> PathBuf {
        self.home.join("checkpoints")
    }

    /// The checkpoint store of this workspace (made if missing).
    pub fn checkpoint_store(&self) -> anyhow::Result<keel_kernel::checkpoints::Store> {
        keel_kernel::checkpoints::Store::open(&self.checkpoints_dir(), &self.workspace)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// The recorder a session's kernel takes checkpoints with; `None` when `[checkpoints]
    /// enabled = false`, or (with a warning) when the store cannot be opened.
    pub fn checkpoint_recorder(
        &self,
    ) -> Option<std::sync::Arc<keel_kernel::checkpoints::Recorder>> {
        if self.config.checkpoints.enabled == Some(false) {
            return None;
        }
        match self.checkpoint_store() {
            Ok(store) => {
                // The store's retention, applied as the session starts: skipped when other keel
                // processes keep recording in this workspace (the next session runs it).
                match store.collect_garbage_automatically(&self.config.checkpoints.retention()) {
                    Ok(Some(done)) if done.over_by > 0 => stderrln!(
                        "warning: the checkpoints of this workspace's sessions take {} MiB, \
                         over `[checkpoints] max-total-mib`: each session's last checkpoint \
                         is always kept; raise the bound, or leave large files out with \
                         `[checkpoints] ignore` or `max-file-mib`",
                        done.kept_bytes >> 20
                    ),
                    Ok(_) => {}
                    Err(e) => stderrln!("warning: checkpoints were not collected: {e}"),
                }
                let settings = keel_kernel::checkpoints::Settings {
                    not_covered: self.writable_outside_the_workspace(),
                    ..self.config.checkpoints.settings()
                };
                // And again as the session ends, so a long session's checkpoints do not wait
                // for the next one to go.
                Some(std::sync::Arc::new(
                    keel_kernel::checkpoints::Recorder::new(store, settings)
                        .collect_at_end(self.config.checkpoints.retention()),
                ))
            }
            Err(e) => {
                stderrln!("warning: no checkpoints this session: {e}");
                None
            }
        }
    }

    /// What a session may write outside the workspace, which checkpoints do not record: every
    /// path when `[sandbox] mode = "off"`, and each MCP server's writable `dirs` elsewhere
    /// (commands otherwise write the workspace and a private `/tmp` only).
    fn writable_outside_the_workspace(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.config.sandbox.mode.as_deref().map(str::trim) == Some("off") {
            out.push(
                "everything outside the workspace (`[sandbox] mode = \"off\"` lets commands \
                 write anywhere)"
                    .to_owned(),
            );
        }
        // A configuration error here is reported where the session builds its servers.
        if let Ok(entries) = crate::settings::mcp_entries(self) {
            for (name, entry) in entries {
                for dir in entry.dirs {
                    // `data/../..` is not inside the workspace, though it starts with it.
                    let dir = dir.canonicalize().unwrap_or_else(|_| {
                        dir.components().fold(PathBuf::new(), |mut p, c| {
                            match c {
                                std::path::Component::ParentDir => {
                                    p.pop();
                                }
                                c => p.push(c),
                            }
                            p
                        })
                    });
                    if !dir.starts_with(&self.workspace) {
                        out.push(format!(
                            "{} (writable by the MCP server `{name}`)",
                            dir.display()
                        ));
                    }
                }
            }
        }
        out
    }

    /// Directory of the compiled-component cache.
    pub fn component_cache(&self) -> PathBuf {
        self.home.join("cache").join("components")
    }
}

fn load_config(path: &Path) -> anyhow::Result<(UserConfig, String)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((UserConfig::default(), String::new()));
        }
        Err(e) => bail!("{}: cannot read your keel config: {e}", path.display()),
    };
    let config: UserConfig = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(0);
        anyhow::anyhow!(
            "{}:{line}: {}; fix or remove that setting",
            path.display(),
            e.message().trim()
        )
    })?;
    config
        .timeouts
        .deadlines()
        .with_context(|| format!("{}", path.display()))?;
    Ok((config, text))
}

impl Context {
    /// The context of `keel demo`: the same home, the demo workspace, the scripted model, the
    /// default profile and built-in policies (so the demo behaves the same everywhere).
    pub fn for_demo(&self, workspace: &Path) -> Context {
        let mut config = UserConfig::default();
        config.model.provider = Some("scripted".into());
        Context {
            home: self.home.clone(),
            workspace: workspace.to_path_buf(),
            config,
            config_text: String::new(),
            env_overrides: false,
        }
    }

    /// The project-local config, `<workspace>/.keel/config.toml`, if there is one. It may only
    /// tighten what the user's config allows.
    pub fn project_config(&self) -> anyhow::Result<Option<(PathBuf, String)>> {
        use std::io::Read as _;
        /// A config is a few hundred lines; a larger file is not one.
        const MAX_BYTES: u64 = 1024 * 1024;
        let path = self.workspace.join(".keel").join("config.toml");
        // A cloned repository's file: neither it nor `.keel` may lead out of the workspace
        // (a link to the person's secrets would be read, and a parse error would print it).
        let file = match crate::project_approvals::open_no_follow(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => bail!(
                "{}: cannot read the project config ({e}); keel reads it only as a regular file \
                 inside the workspace, not through a link",
                path.display()
            ),
        };
        let inside = match (path.canonicalize(), self.workspace.canonicalize()) {
            (Ok(real), Ok(workspace)) => real.starts_with(workspace),
            _ => false,
        };
        if !inside || !file.metadata().is_ok_and(|m| m.is_file()) {
            bail!(
                "{}: the project config is not a regular file inside the workspace (`.keel` \
                 leads elsewhere); keel does not read it. Remove the link or move the file",
                path.display()
            );
        }
        let mut text = String::new();
        file.take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("{}: cannot read the project config", path.display()))?;
        if text.len() as u64 > MAX_BYTES {
            bail!(
                "{}: the project config is larger than {} KiB; keel does not read it",
                path.display(),
                MAX_BYTES >> 10
            );
        }
        Ok(Some((path, text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sandbox hides keel's home by its path; a relative one would name another directory
    /// inside the sandbox (bubblewrap reads it from `/`), leaving the real home readable.
    #[test]
    fn a_relative_home_is_made_absolute() -> anyhow::Result<()> {
        let ws = tempfile::tempdir()?;
        let ctx = Context::new(
            Some(PathBuf::from("relative-home")),
            ws.path().to_path_buf(),
        )?;
        assert!(ctx.home.is_absolute(), "{}", ctx.home.display());
        assert_eq!(ctx.home, std::env::current_dir()?.join("relative-home"));
        Ok(())
    }

    /// A cloned repository's `.keel/config.toml` (or `.keel` itself) linked to a file of the
    /// person's is not read: a parse error would print it.
    #[test]
    fn a_project_config_leading_out_of_the_workspace_is_not_read() -> anyhow::Result<()> {
        let home = tempfile::tempdir()?;
        let outside = tempfile::tempdir()?;
        let secret = outside.path().join("id_rsa");
        std::fs::write(&secret, "-----BEGIN OPENSSH PRIVATE KEY-----\n")?;
        std::fs::create_dir_all(outside.path().join("dotkeel"))?;
        std::fs::write(outside.path().join("dotkeel/config.toml"), "SECRET = \n")?;
        let linked_file = tempfile::tempdir()?;
        std::fs::create_dir_all(linked_file.path().join(".keel"))?;
        std::os::unix::fs::symlink(&secret, linked_file.path().join(".keel/config.toml"))?;
        let linked_dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(
            outside.path().join("dotkeel"),
            linked_dir.path().join(".keel"),
        )?;
        for ws in [&linked_file, &linked_dir] {
            let ctx = Context::new(Some(home.path().to_path_buf()), ws.path().to_path_buf())?;
            let err = match ctx.project_config() {
                Ok(found) => anyhow::bail!("read through a link: {found:?}"),
                Err(e) => format!("{e:#}"),
            };
            assert!(
                err.contains("not through a link") || err.contains("leads elsewhere"),
                "{err}"
            );
            assert!(!err.contains("BEGIN") && !err.contains("SECRET"), "{err}");
        }
        let plain = tempfile::tempdir()?;
        std::fs::create_dir_all(plain.path().join(".keel"))?;
        std::fs::write(plain.path().join(".keel/config.toml"), "[sandbox]\n")?;
        let ctx = Context::new(Some(home.path().to_path_buf()), plain.path().to_path_buf())?;
        assert_eq!(
            ctx.project_config()?.map(|(_, t)| t).as_deref(),
            Some("[sandbox]\n")
        );
        Ok(())
    }

    /// `--home ../h` names a sibling of the workspace; unnormalised it would start with the
    /// workspace's path and be taken for a directory inside it.
    #[test]
    fn a_home_given_through_dot_dot_is_normalised() -> anyhow::Result<()> {
        let ws = tempfile::tempdir()?;
        let given = std::env::current_dir()?.join("..").join("h");
        let ctx = Context::new(Some(given), ws.path().to_path_buf())?;
        let parent = std::env::current_dir()?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        assert_eq!(ctx.home, parent.join("h"));
        Ok(())
    }

    /// Each checkpoint names what the session may write outside the workspace, which it does
    /// not record: every path with the sandbox off, an MCP server's `dirs` elsewhere (one
    /// reached through `..` too), not its `dirs` inside the workspace.
    #[test]
    fn what_checkpoints_do_not_cover_is_named() -> anyhow::Result<()> {
        let home = tempfile::tempdir()?;
        let ws = tempfile::tempdir()?;
        let mut ctx = Context::new(Some(home.path().to_path_buf()), ws.path().to_path_buf())?;
        assert_eq!(ctx.writable_outside_the_workspace(), Vec::<String>::new());
        ctx.config = toml::from_str(
            "[sandbox]\nmode = \"off\"\n[mcp.servers.files]\ncommand = \"node\"\n\
             dirs = [\"data\", \"data/../../elsewhere\"]\n",
        )?;
        let named = ctx.writable_outside_the_workspace();
        assert_eq!(named.len(), 2, "{named:?}");
        assert!(named[0].contains("mode = \"off\""), "{named:?}");
        assert!(
            named[1].contains("elsewhere") && named[1].contains("MCP server `files`"),
            "{named:?}"
        );
        Ok(())
    }

    #[test]
    fn mcp_servers_configure_the_mcp_plugin() -> anyhow::Result<()> {
        let mut config: UserConfig = toml::from_str(
            "[mcp]\ncall-timeout-ms = 5000\n[mcp.servers.files]\ncommand = \"node\"\n\
             allow = [\"read\"]\ntimeout-ms = 700\nenv = { A = \"plain\", B = { secret = \"S\" } }\n",
        )?;
        config.configure_mcp_plugin();
        let mcp = &config.config["mcp"];
        assert_eq!(mcp["call_timeout_ms"].as_integer(), Some(5000));
        assert_eq!(
            mcp["servers"]["files"]["timeout_ms"].as_integer(),
            Some(700)
        );
        let server = &config.mcp.servers["files"];
        assert_eq!(server.env["A"], EnvValue::Plain("plain".into()));
        assert_eq!(server.env["B"], EnvValue::Secret { secret: "S".into() });
        assert!(
            toml::from_str::<UserConfig>("[mcp.servers.x]\ncommand = \"a\"\nport = 1\n").is_err()
        );
        Ok(())
    }
}
