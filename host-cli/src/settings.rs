//! What a session's settings are, derived from the user's config and the environment: the
//! model choice and its config for the model plugin, the profile of plugins, the exec policy,
//! the network policy, the secrets bound to their hosts, the sandbox, and the `--approval`
//! parser. Commands read them here; none reaches into another command for them.

use std::path::PathBuf;

use anyhow::Context as _;
use keel_kernel::Secrets;
use keel_kernel::gates::exec_policy::{ApprovalMode, ExecPolicy};
use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
use keel_kernel::sandbox::{CommandNetwork, SandboxConfig, SandboxMode};

use crate::config::Context;

/// The `--approval` value parser shared by every command that takes one: `ask`, `never` or
/// `auto`, read straight into the gates' [`ApprovalMode`].
pub fn approval_parser() -> impl clap::builder::TypedValueParser<Value = ApprovalMode> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(["ask", "never", "auto"])
        .map(|mode: String| ApprovalMode::parse(&mode).unwrap_or_default())
}

/// The plugins a session loads when the profile does not say.
pub fn default_profile(provider: &str) -> Vec<String> {
    vec![
        format!("model-{provider}"),
        "tool-registry".into(),
        "fs-tools".into(),
        "shell".into(),
        "session-log".into(),
        "verifier".into(),
        "memory".into(),
        "skills".into(),
        "compaction".into(),
        "subagents".into(),
        "agent-loop".into(),
    ]
}

/// The plugins of a session: `[profile] plugins`, or the default set for the provider; with
/// the MCP client when servers are configured, and the `hooks` plugin when hooks are.
pub fn profile(ctx: &Context) -> Vec<String> {
    let mut plugins = if ctx.config.profile.plugins.is_empty() {
        default_profile(&ModelChoice::from(ctx).provider)
    } else {
        ctx.config.profile.plugins.clone()
    };
    if !ctx.config.mcp.servers.is_empty() && !plugins.iter().any(|p| p == "mcp") {
        plugins.push("mcp".into());
    }
    if crate::hooks::any_running(&ctx.config) && !plugins.iter().any(|p| p == "hooks") {
        plugins.push("hooks".into());
    }
    plugins
}

/// The processes the `mcp` plugin may start: one per `[mcp.servers.NAME]`, with its grants
/// resolved (paths against the workspace, `~/` against your home).
pub fn mcp_entries(
    ctx: &Context,
) -> anyhow::Result<std::collections::BTreeMap<String, keel_kernel::ProcessEntry>> {
    let config_file = ctx.home.join("config.toml");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let resolve = |name: &str, p: &str| -> anyhow::Result<PathBuf> {
        let path = match (p.strip_prefix("~/"), &home) {
            (Some(rest), Some(home)) => home.join(rest),
            (Some(_), None) => anyhow::bail!(
                "{}: [mcp.servers.{name}]: `{p}` starts with `~/` but HOME is not set",
                config_file.display()
            ),
            (None, _) => ctx.workspace.join(p),
        };
        Ok(path)
    };
    let mut entries = std::collections::BTreeMap::new();
    for (name, server) in &ctx.config.mcp.servers {
        let at = || format!("{}: [mcp.servers.{name}]", config_file.display());
        if !keel_kernel::is_valid_plugin_name(name) {
            anyhow::bail!(
                "{}: the server name must be lowercase letters, digits and `-` (it becomes part \
                 of its tools' names)",
                at()
            );
        }
        let command = match (&server.command, &server.url) {
            (Some(command), None) => command.clone(),
            // A Streamable HTTP server is no process: the plugin reaches it through the
            // kernel's HTTP client.
            (None, Some(url)) => {
                mcp_url(name, url).with_context(at)?;
                continue;
            }
            _ => anyhow::bail!("{}: give `command` (and `args`), or `url`", at()),
        };
        let mut entry = keel_kernel::ProcessEntry {
            command,
            args: server.args.clone(),
            cwd: server
                .cwd
                .as_deref()
                .map(|c| resolve(name, c))
                .transpose()?,
            dirs: server
                .dirs
                .iter()
                .map(|d| resolve(name, d))
                .collect::<anyhow::Result<_>>()?,
            read: server
                .read
                .iter()
                .map(|d| resolve(name, d))
                .collect::<anyhow::Result<_>>()?,
            hosts: server.hosts.clone(),
            ..keel_kernel::ProcessEntry::default()
        };
        for (var, value) in &server.env {
            match value {
                crate::config::EnvValue::Plain(v) => {
                    entry.env.insert(var.clone(), v.clone());
                }
                crate::config::EnvValue::Secret { secret } => {
                    entry.secret_env.insert(var.clone(), secret.clone());
                }
            }
        }
        entries.insert(name.clone(), entry);
    }
    Ok(entries)
}

/// The provider, model and endpoint after environment overrides.
pub struct ModelChoice {
    pub provider: String,
    pub model: Option<String>,
    pub base_url: Option<String>,
}

impl ModelChoice {
    pub fn from(ctx: &Context) -> ModelChoice {
        let env = |k: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| ctx.env_overrides && !v.is_empty())
        };
        ModelChoice {
            provider: env("KEEL_PROVIDER")
                .or_else(|| ctx.config.model.provider.clone())
                .unwrap_or_else(|| "openai".into()),
            model: env("KEEL_MODEL").or_else(|| ctx.config.model.model.clone()),
            base_url: env("KEEL_BASE_URL").or_else(|| ctx.config.model.base_url.clone()),
        }
    }

    /// The API endpoint: `[model] base-url`, or the provider's public API.
    pub fn endpoint(&self) -> Option<String> {
        self.base_url.clone().or(match self.provider.as_str() {
            "openai" => Some("https://api.openai.com/v1".into()),
            "anthropic" => Some("https://api.anthropic.com/v1".into()),
            _ => None,
        })
    }

    /// The secret the provider's plugin sends, if any.
    pub fn secret_name(&self) -> Option<&'static str> {
        match self.provider.as_str() {
            "openai" => Some("OPENAI_API_KEY"),
            "anthropic" => Some("ANTHROPIC_API_KEY"),
            _ => None,
        }
    }
}

/// Kernel-held secrets, each bound to its hosts: the environment wins over `[secrets]` in the
/// config for the value; the hosts are those `[secrets]` names plus, for a model key, the
/// provider's public API and the configured model endpoint.
pub fn secrets(ctx: &Context) -> Secrets {
    let choice = ModelChoice::from(ctx);
    let mut secrets = Secrets::new();
    // The model keys, the named secrets, and those an MCP server's environment names or
    // sends as its bearer token.
    let server_secrets = ctx.config.mcp.servers.values().flat_map(|s| {
        s.env
            .values()
            .filter_map(|v| match v {
                crate::config::EnvValue::Secret { secret } => Some(secret.clone()),
                crate::config::EnvValue::Plain(_) => None,
            })
            .chain(s.bearer_secret.clone())
    });
    for name in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
        .into_iter()
        .map(str::to_owned)
        .chain(ctx.config.secrets.keys().cloned())
        .chain(server_secrets)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let setting = ctx.config.secrets.get(&name);
        let Some(value) = secret_value(ctx, &name) else {
            continue;
        };
        let mut hosts: Vec<String> = setting.map(|s| s.hosts().to_vec()).unwrap_or_default();
        hosts.extend(model_key_hosts(&name, &choice));
        // A bearer secret goes to its own server's host.
        for (server_name, server) in &ctx.config.mcp.servers {
            if server.bearer_secret.as_deref() == Some(name.as_str())
                && let Some(url) = &server.url
                && let Ok(parsed) = mcp_url(server_name, url)
                && let (Some(host), Some(port)) =
                    (parsed.host_str(), parsed.port_or_known_default())
            {
                hosts.push(host_port(&parsed, host, port));
            }
        }
        secrets.insert(&name, &value, &hosts);
    }
    // The headers an editor passed with its approved HTTP server: each a secret bound to
    // that server's origin alone.
    for (server_name, server) in &ctx.config.mcp.servers {
        if let Some(url) = server.url.as_deref().filter(|_| server.from_editor)
            && let Ok(parsed) = mcp_url(server_name, url)
            && let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default())
        {
            let hosts = [host_port(&parsed, host, port)];
            for (_, secret, value) in server.editor_headers.secrets(server_name) {
                secrets.insert(&secret, value, &hosts);
            }
        }
    }
    secrets
}

/// The value of the secret `name`: its environment variable, else its `[secrets]` value.
pub fn secret_value(ctx: &Context, name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            ctx.config
                .secrets
                .get(name)
                .and_then(|s| s.value())
                .map(str::to_owned)
        })
}

/// Where a model key may go: its provider's public API, and the configured endpoint when the
/// key is the one the chosen provider sends.
pub(crate) fn model_key_hosts(name: &str, choice: &ModelChoice) -> Vec<String> {
    let mut hosts = Vec::new();
    match name {
        "OPENAI_API_KEY" => hosts.push("api.openai.com".to_owned()),
        "ANTHROPIC_API_KEY" => hosts.push("api.anthropic.com".to_owned()),
        _ => return hosts,
    }
    if choice.secret_name() == Some(name)
        && let Some(endpoint) = choice.endpoint()
        && let Ok(url) = url::Url::parse(&endpoint)
        && let (Some(host), Some(port)) = (url.host(), url.port_or_known_default())
    {
        hosts.push(match host {
            url::Host::Ipv6(a) => format!("[{a}]:{port}"),
            other => format!("{other}:{port}"),
        });
    }
    hosts
}

/// The OS sandbox of commands: `[sandbox]` over the defaults (workspace-write, the built-in
/// deny-read list, keel's home hidden).
pub fn sandbox_config(ctx: &Context) -> anyhow::Result<SandboxConfig> {
    let settings = &ctx.config.sandbox;
    let mode = match &settings.mode {
        Some(m) => SandboxMode::parse(m).map_err(|e| {
            anyhow::anyhow!(
                "{}: [sandbox] mode: {e}",
                ctx.home.join("config.toml").display()
            )
        })?,
        None => SandboxMode::default(),
    };
    let network = match &settings.network {
        Some(n) => CommandNetwork::parse(n).map_err(|e| {
            anyhow::anyhow!(
                "{}: [sandbox] network: {e}",
                ctx.home.join("config.toml").display()
            )
        })?,
        None => CommandNetwork::default(),
    };
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let expand = |p: &str| match (p.strip_prefix("~/"), &home) {
        (Some(rest), Some(home)) => Some(home.join(rest)),
        (Some(_), None) => None,
        (None, _) => Some(PathBuf::from(p)),
    };
    let deny_read = keel_kernel::sandbox::DEFAULT_DENY_READ
        .iter()
        .map(|p| format!("~/{p}"))
        .chain(settings.deny_read.iter().cloned())
        .filter_map(|p| expand(&p))
        .collect();
    Ok(SandboxConfig {
        mode,
        network,
        deny_read,
        keel_home: Some(ctx.home.clone()),
        pass_env: settings.env.clone(),
        ..SandboxConfig::default()
    })
}

/// The network policy: the user's `[network]`, plus the model endpoint the user configured
/// (named explicitly, so a loopback server such as Ollama becomes reachable).
pub fn network_policy(ctx: &Context, choice: &ModelChoice) -> anyhow::Result<NetPolicy> {
    let (policy, warnings) = network_policy_quiet(ctx, choice)?;
    for w in warnings {
        stderrln!("warning: {w}");
    }
    Ok(policy)
}

/// [`network_policy`] with the `[network]` table's warnings handed back instead of printed
/// (for a second reader of the same policy, such as the telemetry exporter).
pub fn network_policy_quiet(
    ctx: &Context,
    choice: &ModelChoice,
) -> anyhow::Result<(
    NetPolicy,
    Vec<keel_kernel::gates::net_policy::NetPolicyWarning>,
)> {
    let (mut policy, warnings) = NetPolicy::from_toml(&ctx.config_text).map_err(|e| {
        anyhow::anyhow!("{}: [network]: {e}", ctx.home.join("config.toml").display())
    })?;
    if let Some(base) = choice.endpoint().as_deref() {
        let url = url::Url::parse(base).with_context(|| {
            format!("model base URL `{base}` is not a URL; fix [model] base-url")
        })?;
        policy = allow_endpoint(policy, &url, choice.base_url.is_some())
            .map_err(|e| anyhow::anyhow!("model base URL `{base}`: {e}"))?;
    }
    // The Streamable HTTP MCP servers the person configured, like a configured model endpoint.
    for (name, server) in &ctx.config.mcp.servers {
        if let Some(url) = server.url.as_deref().filter(|_| !server.from_project) {
            let parsed = mcp_url(name, url)?;
            policy = allow_endpoint(policy, &parsed, true)
                .map_err(|e| anyhow::anyhow!("[mcp.servers.{name}] url `{url}`: {e}"))?;
        }
    }
    // An editor's approved HTTP server: its origin for the `mcp` plugin alone (no rule any
    // other plugin or command could use), a loopback address exempt only when the URL names
    // one.
    for (name, server) in &ctx.config.mcp.servers {
        if let Some(url) = server.url.as_deref().filter(|_| server.from_editor) {
            let parsed = mcp_url(name, url)?;
            policy = policy
                .with_origin_for("mcp", url, is_loopback(&parsed))
                .map_err(|e| anyhow::anyhow!("the editor's MCP server `{name}`: {e}"))?;
        }
    }
    Ok((policy, warnings))
}

/// `policy` with `url`'s host allowed, and with `private` its exact `host:port` exempt from the
/// refusal of private and loopback addresses (an endpoint the person named).
fn allow_endpoint(
    mut policy: NetPolicy,
    url: &url::Url,
    private: bool,
) -> anyhow::Result<NetPolicy> {
    if let Some(host) = url.host_str() {
        policy = policy.with_rule(host, NetDecision::Allow)?;
        if private && let Some(port) = url.port_or_known_default() {
            policy = policy.with_allow_private(&host_port(url, host, port))?;
        }
    }
    Ok(policy)
}

/// `host:port` as the network gate's lists spell it (an IPv6 address in brackets).
pub(crate) fn host_port(url: &url::Url, host: &str, port: u16) -> String {
    match url.host() {
        Some(url::Host::Ipv6(a)) => format!("[{a}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Whether `url` names this machine's loopback: `localhost`, `127.0.0.0/8` or `[::1]`.
pub(crate) fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The URL of an HTTP MCP server, checked.
fn mcp_url(name: &str, url: &str) -> anyhow::Result<url::Url> {
    let parsed = url::Url::parse(url)
        .with_context(|| format!("[mcp.servers.{name}] url `{url}` is not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        anyhow::bail!("[mcp.servers.{name}] url `{url}`: give an http:// or https:// URL");
    }
    Ok(parsed)
}

/// Config handed to the model plugin from `[model]` and the environment.
pub(crate) fn model_overrides(
    ctx: &Context,
    choice: &ModelChoice,
) -> anyhow::Result<Vec<(String, String, serde_json::Value)>> {
    let plugin = format!("model-{}", choice.provider);
    let mut out = Vec::new();
    if let Some(m) = &choice.model {
        out.push((plugin.clone(), "model".into(), m.clone().into()));
    }
    if let Some(b) = &choice.base_url {
        out.push((plugin.clone(), "base-url".into(), b.clone().into()));
    }
    // The agent loop compacts against the model's window: configured, or known by name.
    let window = ctx.config.model.context_window.or_else(|| {
        choice
            .model
            .as_deref()
            .and_then(keel_agent_kit::compaction::known_context_window)
    });
    if let Some(window) = window {
        out.push(("agent-loop".into(), "context-window".into(), window.into()));
    }
    if choice.provider == "scripted"
        && let Some(path) = &ctx.config.model.script
    {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the model script {}", path.display()))?;
        out.push((plugin, "script".into(), text.into()));
    }
    Ok(out)
}

/// The user's exec policy, tightened by the project's.
pub fn load_policy(ctx: &Context) -> anyhow::Result<ExecPolicy> {
    let mut policy = ExecPolicy::from_toml(&ctx.config_text)
        .with_context(|| format!("in {}", ctx.home.join("config.toml").display()))?;
    if let Some((path, text)) = ctx.project_config()? {
        let warnings = policy
            .tighten_with_project(&text)
            .with_context(|| format!("in {}", path.display()))?;
        for w in warnings {
            stderrln!("warning: {}: {w}", path.display());
        }
    }
    for w in policy.warnings() {
        stderrln!("warning: {w}");
    }
    Ok(policy)
}
