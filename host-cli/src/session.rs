//! An agent session: the kernel with the session's sealed gates, the profile's plugins, and
//! the turns the person drives. Nothing here is agent logic — the loop, the model, the tools,
//! the log and the verifier are plugins; this file wires the gates from the user's config and
//! shows what the plugins emit.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use keel_kernel::gates::approvals::{
    Answer, ApprovalRequest, Approver, GrantStore, PolicyApprover,
};
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
use keel_kernel::sandbox::{CommandNetwork, SandboxConfig, SandboxMode};
use keel_kernel::{
    Event, GateConfig, Kernel, KernelConfig, NetConfig, PluginLoader, PluginPackage, Secrets,
};
use keel_protocol::{
    Message, SessionEvent, StreamDelta, TurnEnd, TurnReport, TurnRequest, services, topics,
};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::commands::policy::load_policy;
use crate::config::Context;
use crate::runtime::{self, PluginSource};

/// The `--approval` value parser shared by every command that takes one: `ask`, `never` or
/// `auto`, read straight into the gates' [`ApprovalMode`].
pub fn approval_parser() -> impl clap::builder::TypedValueParser<Value = ApprovalMode> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(["ask", "never", "auto"])
        .map(|mode: String| ApprovalMode::parse(&mode).unwrap_or_default())
}

/// How a session shows what happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Streamed text and tool lines for a person.
    Human,
    /// One JSON event per line on stdout.
    Json,
}

/// Settings of one session.
pub struct SessionOptions {
    /// `--approval`; `None` means the config's `[exec] approval`.
    pub approval: Option<ApprovalMode>,
    /// Extra plugin directories for this session only.
    pub extra_plugins: Vec<PathBuf>,
    /// How to show events.
    pub display: Display,
    /// Resume this session instead of starting a new one.
    pub resume: Option<String>,
    /// Plugin config overrides laid over everything else, `(plugin, key, value)`.
    pub overrides: Vec<(String, String, serde_json::Value)>,
}

/// A running session.
pub struct Session {
    pub kernel: Kernel,
    pub loader: PluginLoader,
    pub id: String,
    display: Display,
    ctx_workspace: PathBuf,
    /// Where the session logs are, to give a newly loaded agent loop this conversation.
    sessions_dir: PathBuf,
    /// Where each plugin came from, for `/reload`.
    origins: Mutex<Vec<(String, Origin)>>,
    overrides: Vec<(String, String, serde_json::Value)>,
    user_config: std::collections::BTreeMap<String, toml::Table>,
}

#[derive(Clone)]
enum Origin {
    Bundled(&'static keel_bundled_plugins::Bundled),
    Path(PathBuf),
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
        "agent-loop".into(),
    ]
}

/// The plugins of a session: `[profile] plugins`, or the default set for the provider.
pub fn profile(ctx: &Context) -> Vec<String> {
    if ctx.config.profile.plugins.is_empty() {
        default_profile(&ModelChoice::from(ctx).provider)
    } else {
        ctx.config.profile.plugins.clone()
    }
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
    for name in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
        .into_iter()
        .map(str::to_owned)
        .chain(ctx.config.secrets.keys().cloned())
    {
        let setting = ctx.config.secrets.get(&name);
        let value = std::env::var(&name)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| setting.and_then(|s| s.value()).map(str::to_owned));
        let Some(value) = value else { continue };
        let mut hosts: Vec<String> = setting.map(|s| s.hosts().to_vec()).unwrap_or_default();
        hosts.extend(model_key_hosts(&name, &choice));
        secrets.insert(&name, &value, &hosts);
    }
    secrets
}

/// Where a model key may go: its provider's public API, and the configured endpoint when the
/// key is the one the chosen provider sends.
fn model_key_hosts(name: &str, choice: &ModelChoice) -> Vec<String> {
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
        ..SandboxConfig::default()
    })
}

/// The network policy: the user's `[network]`, plus the model endpoint the user configured
/// (named explicitly, so a loopback server such as Ollama becomes reachable).
pub fn network_policy(ctx: &Context, choice: &ModelChoice) -> anyhow::Result<NetPolicy> {
    let (mut policy, warnings) = NetPolicy::from_toml(&ctx.config_text).map_err(|e| {
        anyhow::anyhow!("{}: [network]: {e}", ctx.home.join("config.toml").display())
    })?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    if let Some(base) = choice.endpoint().as_deref() {
        let url = url::Url::parse(base).with_context(|| {
            format!("model base URL `{base}` is not a URL; fix [model] base-url")
        })?;
        if let Some(host) = url.host_str() {
            policy = policy
                .with_rule(host, NetDecision::Allow)
                .map_err(|e| anyhow::anyhow!("model base URL `{base}`: {e}"))?;
            if choice.base_url.is_some()
                && let Some(port) = url.port_or_known_default()
            {
                let entry = match url.host() {
                    Some(url::Host::Ipv6(a)) => format!("[{a}]:{port}"),
                    _ => format!("{host}:{port}"),
                };
                policy = policy
                    .with_allow_private(&entry)
                    .map_err(|e| anyhow::anyhow!("model base URL `{base}`: {e}"))?;
            }
        }
    }
    Ok(policy)
}

/// Asks on the terminal: once, for the session, always, or deny.
struct TerminalApprover;

impl Approver for TerminalApprover {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        let mut err = std::io::stderr();
        let always = if request.can_always {
            " / [a]lways"
        } else {
            ""
        };
        let _ = writeln!(
            err,
            "\n? {} wants to run: {}\n  why: {}\n  [y]es once / [s]ession{always} / [n]o: ",
            request.tool, request.summary, request.reason
        );
        let _ = err.flush();
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).is_err() {
            return Answer::Deny;
        }
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Answer::Once,
            "s" | "session" => Answer::Session,
            "a" | "always" if request.can_always => Answer::Always,
            _ => Answer::Deny,
        }
    }
}

fn approver_for(mode: ApprovalMode) -> Arc<dyn Approver> {
    match mode {
        ApprovalMode::Ask if std::io::stdin().is_terminal() => Arc::new(TerminalApprover),
        other => Arc::new(PolicyApprover(other)),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Session {
    /// Start (or resume) a session in `ctx.workspace`.
    pub async fn start(ctx: &Context, opts: SessionOptions) -> anyhow::Result<Session> {
        let choice = ModelChoice::from(ctx);
        let mut policy = load_policy(ctx)?;
        if let Some(flag) = opts.approval {
            policy = policy.with_approval(flag);
        }
        let approver = approver_for(policy.approval());
        let grants = match GrantStore::open(&ctx.grants_file(), &ctx.workspace) {
            Ok((store, warnings)) => {
                for w in warnings {
                    eprintln!("warning: {w}");
                }
                Some(store)
            }
            Err(e) => {
                eprintln!("warning: approvals will not be remembered across sessions: {e}");
                None
            }
        };
        let gates = GateConfig {
            workspace: Some(ctx.workspace.clone()),
            exec_policy: policy,
            approver,
            grants,
            network: NetConfig {
                policy: network_policy(ctx, &choice)?,
                secrets: secrets(ctx),
                audit_log: Some(ctx.audit_log()),
            },
            guard_timeout: std::time::Duration::from_secs(2),
            sandbox: sandbox_config(ctx)?,
        };
        let kernel = Kernel::with_gates(
            KernelConfig {
                deadlines: ctx.config.timeouts.deadlines()?,
                ..KernelConfig::default()
            },
            gates,
        );
        let loader = runtime::loader(ctx)?;
        let id = match &opts.resume {
            Some(id) => id.clone(),
            None => keel_agent_kit::session_log::new_session_id(now_ms(), rand_u32()),
        };
        let mut overrides = model_overrides(ctx, &choice)?;
        overrides.extend(opts.overrides);
        let session = Session {
            kernel,
            loader,
            id,
            display: opts.display,
            ctx_workspace: ctx.workspace.clone(),
            sessions_dir: ctx.sessions_dir(),
            origins: Mutex::new(Vec::new()),
            overrides,
            user_config: ctx.config.config.clone(),
        };
        for source in runtime::session_plugins(ctx, &session.loader)? {
            match source {
                PluginSource::Bundled(bundled) => {
                    let package = runtime::bundled_package(&session.loader, bundled)?;
                    session
                        .load_package(package, Origin::Bundled(bundled))
                        .await?;
                }
                PluginSource::Path(path) => session.load_path(&path, false).await?,
                PluginSource::Installed(package, dir) => {
                    session.load_package(*package, Origin::Path(dir)).await?;
                }
            }
        }
        for path in &opts.extra_plugins {
            session.load_path(path, true).await?;
        }
        session.check_ready()?;
        if let Some(resume) = &opts.resume {
            let n = session.seed_conversation(resume).await.with_context(|| {
                format!("cannot resume session `{resume}`; `keel sessions list` shows the sessions")
            })?;
            if session.display == Display::Human {
                eprintln!("resumed session {resume}: {n} messages");
            }
        }
        session.emit(&SessionEvent::SessionStarted {
            session: session.id.clone(),
            workspace: ctx.workspace.display().to_string(),
            model: choice
                .model
                .clone()
                .unwrap_or_else(|| choice.provider.clone()),
        });
        Ok(session)
    }

    /// Every plugin the session needs is active, or say what is missing and how to fix it.
    fn check_ready(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        for status in self.kernel.list() {
            match &status.state {
                keel_kernel::PluginState::Active => {}
                other => problems.push(format!("plugin `{}` is {other:?}", status.name)),
            }
        }
        if !self.kernel.env().services().contains_key(services::AGENT) {
            bail!(
                "no plugin provides the `agent` service ({}); add `agent-loop` to [profile] plugins",
                if problems.is_empty() {
                    "nothing failed".to_owned()
                } else {
                    problems.join("; ")
                }
            );
        }
        for p in problems {
            eprintln!("warning: {p}");
        }
        Ok(())
    }

    /// Give the agent plugin the conversation of session `id`, read back from its log; the
    /// number of messages.
    async fn seed_conversation(&self, id: &str) -> anyhow::Result<usize> {
        let read = keel_agent_kit::session_log::read_log(&self.sessions_dir, id)?;
        for w in &read.warnings {
            eprintln!("warning: session `{id}` line {}: {}", w.line, w.message);
        }
        let conversation = keel_agent_kit::session_log::conversation(&read.lines);
        let payload = serde_json::json!({"session": id, "messages": conversation.messages});
        self.kernel
            .call_service(services::AGENT, "load", &payload.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("the agent plugin could not load session `{id}`: {e}"))?;
        Ok(conversation.messages.len())
    }

    fn emit(&self, event: &SessionEvent) {
        if let Ok(json) = serde_json::to_string(event)
            && let Err(e) = self.kernel.emit(topics::SESSION_EVENT, &json)
        {
            eprintln!("warning: {e}");
        }
    }

    /// Load the plugin directory `path`; with `confirm`, show its capabilities first.
    pub async fn load_path(&self, path: &Path, confirm: bool) -> anyhow::Result<()> {
        self.load_path_providing(path, confirm).await.map(|_| ())
    }

    /// [`Self::load_path`], answering whether the plugin provides the agent service.
    async fn load_path_providing(&self, path: &Path, confirm: bool) -> anyhow::Result<bool> {
        let package = self
            .loader
            .from_path(path)
            .with_context(|| format!("cannot load the plugin at `{}`", path.display()))?;
        if confirm {
            confirm_capabilities(&package)?;
        }
        let agent = package.manifest.provides.contains_key(services::AGENT);
        self.load_package(package, Origin::Path(path.to_path_buf()))
            .await?;
        Ok(agent)
    }

    /// `/load DIR` in a running session. A plugin that takes over the agent service (one
    /// loaded after `/unload agent-loop`, say) starts with no conversation, so it is given
    /// this session's, read back from the log: the session goes on rather than starting over.
    pub async fn load_mid_session(&self, path: &Path) -> anyhow::Result<()> {
        if !self.load_path_providing(path, true).await? {
            return Ok(());
        }
        // What the last turn emitted may still be on its way to the log.
        self.kernel.settle_events().await;
        // Nothing logged yet (no turn so far, or no session log loaded): nothing to carry.
        let logged = keel_agent_kit::session_log::log_path(&self.sessions_dir, &self.id)
            .is_ok_and(|path| path.exists());
        if logged {
            let n = self.seed_conversation(&self.id).await.context(
                "the agent plugin is loaded but starts without this session's conversation",
            )?;
            eprintln!("the new agent plugin continues this session ({n} messages)");
        }
        Ok(())
    }

    /// The session's overrides (model choice, demo script), then the user's
    /// `[config.<name>]`, over the manifest's defaults.
    fn configure(&self, package: &mut PluginPackage) -> anyhow::Result<()> {
        let name = package.manifest.name.clone();
        runtime::overlay_config(
            package,
            self.overrides
                .iter()
                .filter(|(plugin, _, _)| *plugin == name)
                .map(|(_, key, value)| (key.clone(), value.clone())),
        );
        runtime::apply_user_config(&self.user_config, package)
    }

    async fn load_package(&self, mut package: PluginPackage, origin: Origin) -> anyhow::Result<()> {
        self.configure(&mut package)?;
        let name = package.manifest.name.clone();
        let status = self.kernel.load(package).await?;
        if let keel_kernel::PluginState::Failed { reason } = &status.state {
            bail!("plugin `{name}` failed to activate: {reason}");
        }
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        origins.retain(|(n, _)| *n != name);
        origins.push((name, origin));
        Ok(())
    }

    /// `/reload NAME`: load the plugin again from where it came from.
    pub async fn reload(&self, name: &str) -> anyhow::Result<()> {
        let origin = self
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, o)| o.clone());
        let mut package = match origin {
            Some(Origin::Bundled(b)) => runtime::bundled_package(&self.loader, b)?,
            Some(Origin::Path(p)) => self.loader.from_path(&p)?,
            None => bail!("plugin `{name}` was not loaded by this session; `/plugins` lists them"),
        };
        self.configure(&mut package)?;
        self.kernel.reload(package).await?;
        Ok(())
    }

    /// Run one turn, showing what happens; Ctrl-C cancels it.
    pub async fn turn(&self, input: &str) -> anyhow::Result<TurnReport> {
        self.kernel.begin_turn();
        let mut events = self.kernel.events();
        let display = self.display;
        let (turn_over, mut stop) = tokio::sync::oneshot::channel::<()>();
        let printer = tokio::spawn(async move {
            let mut printer = Printer::default();
            let mut draining = false;
            loop {
                let next = if draining {
                    // Everything the turn emitted was queued before its call returned: show
                    // what is left, then stop.
                    match events.try_recv() {
                        Ok(event) => Ok(event),
                        Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                        Err(_) => break,
                    }
                } else {
                    tokio::select! {
                        next = events.recv() => next,
                        _ = &mut stop => {
                            draining = true;
                            continue;
                        }
                    }
                };
                match next {
                    Ok(event) => printer.show(display, &event),
                    Err(RecvError::Lagged(n)) => {
                        if display == Display::Human {
                            eprintln!("[{n} display events skipped]");
                        }
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        });
        let request = TurnRequest {
            session: self.id.clone(),
            input: input.to_owned(),
        };
        let payload = serde_json::to_string(&request)?;
        let kernel = self.kernel.clone();
        let call = kernel.call_service(services::AGENT, "turn", &payload);
        tokio::pin!(call);
        let mut interrupts = 0;
        let answer = loop {
            tokio::select! {
                answer = &mut call => break answer,
                _ = tokio::signal::ctrl_c() => {
                    interrupts += 1;
                    if interrupts > 1 {
                        // The way out at once: the first Ctrl-C stops every call of the turn
                        // (the agent's own after 2 s); events still queued for the session
                        // log may be lost, which the person chose.
                        eprintln!("\n[second Ctrl-C: leaving now]");
                        std::process::exit(130);
                    }
                    self.kernel.cancel_turn();
                    if display == Display::Human {
                        eprintln!("\n[cancelling the turn; press Ctrl-C again to leave at once]");
                    }
                }
            }
        };
        let _ = turn_over.send(());
        let _ = printer.await;
        let answer = answer.map_err(|e| anyhow::anyhow!("the turn failed: {e}"))?;
        let report: TurnReport = serde_json::from_str(&answer)
            .map_err(|e| anyhow::anyhow!("the agent plugin answered malformed data: {e}"))?;
        if display == Display::Human {
            println!();
            if report.end != TurnEnd::Completed {
                eprintln!("[turn ended: {:?}: {}]", report.end, report.detail);
            } else if !report.detail.is_empty() {
                eprintln!("[{}]", report.detail);
            }
        }
        Ok(report)
    }

    /// The workspace of the session.
    pub fn workspace(&self) -> &Path {
        &self.ctx_workspace
    }

    /// Unload everything (the session log flushes as its plugin deactivates).
    pub async fn close(&self) {
        if let Err(e) = self.kernel.shutdown().await {
            eprintln!("warning: {e}");
        }
    }
}

/// Show what a plugin loaded with `--plugin` asks for, and require a yes.
fn confirm_capabilities(package: &PluginPackage) -> anyhow::Result<()> {
    let m = &package.manifest;
    let mut lines = vec![format!("plugin `{}` {} asks for:", m.name, m.version)];
    lines.extend(
        keel_kernel::consent::capability_lines(m)
            .into_iter()
            .map(|line| format!("  {line}")),
    );
    eprintln!("{}", lines.join("\n"));
    if std::env::var("KEEL_YES").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "refusing to load `{}` without confirmation: no terminal to ask on; set KEEL_YES=1 \
             to accept the capabilities above",
            m.name
        );
    }
    eprint!("load it? [y/N] ");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim().eq_ignore_ascii_case("y") {
        Ok(())
    } else {
        bail!("not loading `{}`", m.name)
    }
}

/// Config handed to the model plugin from `[model]` and the environment.
fn model_overrides(
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
    if choice.provider == "scripted"
        && let Some(path) = &ctx.config.model.script
    {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the model script {}", path.display()))?;
        out.push((plugin, "script".into(), text.into()));
    }
    Ok(out)
}

fn rand_u32() -> u32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

/// Renders bus events.
#[derive(Default)]
struct Printer {
    in_text: bool,
}

impl Printer {
    fn show(&mut self, display: Display, event: &Event) {
        match display {
            Display::Json => {
                let payload: serde_json::Value =
                    serde_json::from_str(&event.payload).unwrap_or(serde_json::Value::Null);
                let line = serde_json::json!({
                    "topic": event.topic,
                    "source": event.source,
                    "event": payload,
                });
                println!("{line}");
            }
            Display::Human => self.human(event),
        }
    }

    fn human(&mut self, event: &Event) {
        let mut out = std::io::stdout();
        if event.topic == topics::MODEL_DELTA {
            match serde_json::from_str::<StreamDelta>(&event.payload) {
                Ok(StreamDelta::Text { text }) => {
                    self.in_text = true;
                    let _ = write!(out, "{text}");
                    let _ = out.flush();
                }
                Ok(StreamDelta::Retry { attempt, reason }) => {
                    eprintln!("[model: retry {attempt}: {reason}]");
                }
                _ => {}
            }
            return;
        }
        if event.topic != topics::SESSION_EVENT {
            return;
        }
        let Ok(entry) = serde_json::from_str::<SessionEvent>(&event.payload) else {
            return;
        };
        match entry {
            SessionEvent::Message {
                message:
                    Message {
                        role: keel_protocol::Role::Assistant,
                        content,
                    },
                ..
            } => {
                for (_, name, args) in (Message {
                    role: keel_protocol::Role::Assistant,
                    content,
                })
                .tool_calls()
                {
                    if self.in_text {
                        println!();
                        self.in_text = false;
                    }
                    println!("⏺ {name} {}", short(args, 160));
                }
            }
            SessionEvent::ToolOutcome { outcome, .. } => {
                let head = outcome.content.lines().next().unwrap_or_default();
                println!("  ⎿ {:?}: {}", outcome.status, short(head, 200));
            }
            SessionEvent::Verdict { verdict, .. } => {
                if self.in_text {
                    println!();
                    self.in_text = false;
                }
                println!(
                    "✔ verifier: {:?} ({}) {}",
                    verdict.status,
                    verdict.dimension,
                    verdict.command.unwrap_or_default()
                );
            }
            _ => {}
        }
    }
}

fn short(s: &str, max: usize) -> String {
    let flat = s.replace('\n', " ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}
