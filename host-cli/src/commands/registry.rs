//! `keel publish`, `yank`, `install`, `search`, `info`, `key …` and `registry …`: the plugin
//! registry from the command line. Every command takes `--registry DIR|URL` (default
//! `<home>/registry`).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use keel_kernel::{Manifest, WasmHost, WasmHostConfig, code_path, manifest_path};
use keel_registry::{
    Home, InstallOptions, InstallPlan, KeyPair, LocalRegistry, PluginName, Registry, ServeOptions,
    Session, apply_install, check_bind_address, parse_spec, plan_install, publish, validate, yank,
};

use super::key::KeyCommand;
use crate::config::Context;
use crate::session::terminal_safe;

/// `text` from a registry (a manifest's description, service and topic names, a path it
/// asks for), as one line that is safe to print: escape sequences and control characters are
/// removed, so a hostile release cannot move the cursor, erase lines of the consent above it,
/// or start a line that looks like keel's own.
fn shown(text: &str) -> String {
    terminal_safe(text).replace(['\n', '\t'], " ")
}

/// `--registry DIR|URL`.
#[derive(Args, Clone)]
pub struct RegistryArg {
    /// The registry: a directory, an `http://` URL of `keel registry serve`, an OCI
    /// registry `oci://HOST[:PORT]/PATH`, or the name of a `[registries]` entry (default
    /// `<home>/registry`).
    #[arg(long, env = "KEEL_REGISTRY", value_name = "DIR|URL|NAME")]
    pub registry: Option<String>,
}

#[derive(Subcommand)]
pub enum RegistryCommand {
    /// Signing keys and trusted keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Validate a plugin (manifest, ABI, imports vs capabilities, version) and publish it,
    /// signed, to the registry.
    Publish(PublishArgs),
    /// Hide NAME@VERSION from new installs (lockfiles that pin it keep it). Appends a signed
    /// yank record; nothing is removed.
    Yank(YankArgs),
    /// Install plugins: resolve versions, verify every hash and signature, show what each
    /// plugin asks to be allowed to do, ask for approval, write them and the lockfile.
    Install(InstallArgs),
    /// Find plugins whose name or description contains TEXT.
    Search(SearchArgs),
    /// A plugin's versions with their requirements, capabilities, signer and yanked state.
    Info(InfoArgs),
    /// Create, share and repair registries.
    #[command(subcommand)]
    Registry(AdminCommand),
}

/// The arguments of `keel publish`.
#[derive(Args)]
pub struct PublishArgs {
    /// The plugin directory (with keel.toml) or its manifest.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// The namespace to publish under (default: the signing key's namespace).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// The signing key's name.
    #[arg(long, default_value = "default")]
    pub key: String,
    /// Publish without a signature (installs then need --allow-unverified).
    #[arg(long, conflicts_with = "key")]
    pub unsigned: bool,
    /// The component to publish, if not where the manifest says.
    #[arg(long, value_name = "FILE")]
    pub component: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArg,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `keel yank`.
#[derive(Args)]
pub struct YankArgs {
    /// `namespace:name@version`.
    pub spec: String,
    /// The signing key's name.
    #[arg(long, default_value = "default")]
    pub key: String,
    #[command(flatten)]
    pub registry: RegistryArg,
}

/// The arguments of `keel install`.
#[derive(Args)]
pub struct InstallArgs {
    /// `namespace:name[@range]`, e.g. `acme:echo` or `acme:echo@^1.2`.
    #[arg(required = true)]
    pub specs: Vec<String>,
    /// Approve without asking (for scripts).
    #[arg(long)]
    pub yes: bool,
    /// Install unsigned plugins or plugins signed by keys you do not trust; the lockfile
    /// records it.
    #[arg(long)]
    pub allow_unverified: bool,
    /// Install native plugins, which run outside the sandbox with your full rights.
    #[arg(long)]
    pub allow_native: bool,
    #[command(flatten)]
    pub registry: RegistryArg,
    /// The plan and the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `keel search`.
#[derive(Args)]
pub struct SearchArgs {
    /// Text to look for (case-insensitive); empty lists everything.
    #[arg(default_value = "")]
    pub text: String,
    #[command(flatten)]
    pub registry: RegistryArg,
    /// One JSON array on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `keel info`.
#[derive(Args)]
pub struct InfoArgs {
    /// `namespace:name`.
    pub name: String,
    #[command(flatten)]
    pub registry: RegistryArg,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Create an empty registry directory.
    Init {
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Share a registry directory over HTTP (publish, index, blobs) until interrupted.
    Serve {
        /// Where to listen; loopback only unless --expose-registry-to-network.
        #[arg(long, default_value = "127.0.0.1:7878")]
        addr: SocketAddr,
        /// Listen on a non-loopback address: every host that can reach it may read the
        /// registry and publish to it.
        #[arg(long)]
        expose_registry_to_network: bool,
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Forget the last head seen of NAME's index, accepting the registry's current history
    /// (after a deliberate restore that the rollback check refuses).
    ForgetHead {
        /// `namespace:name`.
        name: String,
        #[command(flatten)]
        registry: RegistryArg,
    },
}

/// The registry spec of `arg`, or the default one in keel's home.
pub fn registry_spec(ctx: &Context, arg: &RegistryArg) -> String {
    arg.registry
        .clone()
        .unwrap_or_else(|| ctx.home.join("registry").display().to_string())
}

/// Open the registry `arg` names (creating a directory when `create`): a `[registries]`
/// entry by name or by URL is reached as it says; any other `oci://` URL over TLS, with the
/// credentials `docker login` stored.
pub fn open_registry(ctx: &Context, arg: &RegistryArg, create: bool) -> anyhow::Result<Registry> {
    let spec = registry_spec(ctx, arg);
    let entry = match ctx.config.registries.get(&spec) {
        Some(entry) => Some((spec.clone(), entry)),
        None if spec.starts_with("oci://") => {
            let location = keel_registry::parse_oci_url(&spec)?.location;
            ctx.config.registries.iter().find_map(|(name, entry)| {
                let same = keel_registry::parse_oci_url(&entry.url)
                    .is_ok_and(|url| url.location == location);
                same.then(|| (name.clone(), entry))
            })
        }
        None => None,
    };
    // Records read from OCI registries are kept, named by their hash.
    let cache = Some(ctx.home.join("cache").join("oci-records"));
    let Some((name, entry)) = entry else {
        if spec.starts_with("oci://") {
            let options = keel_registry::OciOptions {
                cache,
                ..keel_registry::OciOptions::default()
            };
            return Ok(Registry::open_oci(&spec, options)?);
        }
        return Ok(Registry::open(&spec, create)?);
    };
    let credentials = match (&entry.username, &entry.password_secret) {
        (Some(username), Some(secret)) => {
            // A secret bound to hosts goes only to them (read as the kernel reads them).
            let url = keel_registry::parse_oci_url(&entry.url)?;
            let bound = ctx
                .config
                .secrets
                .get(secret)
                .map(|s| s.hosts())
                .unwrap_or_default();
            if !bound.is_empty() && !keel_kernel::host_declared(bound, &url.host, url.port) {
                bail!(
                    "[registries.{name}] names the secret `{secret}`, which [secrets] binds to {} only, not to {}: add \"{}\" to its hosts",
                    bound.join(", "),
                    url.authority,
                    url.authority
                );
            }
            let password = crate::settings::secret_value(ctx, secret).ok_or_else(|| {
                anyhow::anyhow!(
                    "[registries.{name}] names the password secret `{secret}`, which is not set: export {secret}=… or add it to [secrets] in {}",
                    ctx.home.join("config.toml").display()
                )
            })?;
            Some(keel_registry::Credentials {
                username: username.clone(),
                password,
            })
        }
        (None, None) => None,
        _ => anyhow::bail!(
            "[registries.{name}] needs both `username` and `password-secret`, or neither (then the credentials `docker login` stored are used)"
        ),
    };
    Registry::open_oci(
        &entry.url,
        keel_registry::OciOptions {
            plain_http: entry.plain_http,
            credentials,
            cache,
            ca_file: entry.ca_file.clone(),
        },
    )
    .with_context(|| {
        format!(
            "[registries.{name}] in {}",
            ctx.home.join("config.toml").display()
        )
    })
}

fn wasm_host(ctx: &Context) -> anyhow::Result<WasmHost> {
    WasmHost::new(WasmHostConfig {
        cache_dir: Some(ctx.component_cache()),
        ..WasmHostConfig::default()
    })
    .context("cannot start the WebAssembly host")
}

pub async fn run(ctx: &Context, cmd: RegistryCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        RegistryCommand::Key(cmd) => tokio::task::block_in_place(|| super::key::run(ctx, cmd)),
        RegistryCommand::Registry(AdminCommand::Serve {
            addr,
            expose_registry_to_network,
            registry,
        }) => serve(ctx, addr, expose_registry_to_network, &registry).await,
        // The HTTP client blocks; tell the runtime this worker does.
        other => tokio::task::block_in_place(|| run_blocking(ctx, other)),
    }
}

fn run_blocking(ctx: &Context, cmd: RegistryCommand) -> anyhow::Result<ExitCode> {
    let home = Home::new(ctx.home.clone());
    match cmd {
        RegistryCommand::Key(_) | RegistryCommand::Registry(AdminCommand::Serve { .. }) => {
            bail!("internal: dispatched to the wrong runner")
        }
        RegistryCommand::Publish(args) => publish_plugin(ctx, home, args),
        RegistryCommand::Yank(args) => yank_release(ctx, home, args),
        RegistryCommand::Install(args) => install_plugins(ctx, home, args),
        RegistryCommand::Search(args) => search(ctx, home, args),
        RegistryCommand::Info(args) => info(ctx, home, args),
        RegistryCommand::Registry(AdminCommand::Init { registry }) => {
            let registry = open_registry(ctx, &registry, true)?;
            stdoutln!("registry ready at {}", registry.location());
            Ok(ExitCode::SUCCESS)
        }
        RegistryCommand::Registry(AdminCommand::ForgetHead { name, registry }) => {
            forget_head(ctx, home, &name, &registry)
        }
    }
}

/// `keel registry forget-head`.
fn forget_head(
    ctx: &Context,
    home: Home,
    name: &str,
    registry: &RegistryArg,
) -> anyhow::Result<ExitCode> {
    let name: PluginName = name.parse()?;
    let registry = open_registry(ctx, registry, false)?;
    let mut session = Session::new(home, registry)?;
    let forgot = session.forget_head(&name);
    session.finish()?;
    if forgot {
        stdoutln!(
            "forgot the head seen of {name}; the next read accepts {}'s current history",
            session.location()
        );
    } else {
        stdoutln!("nothing remembered of {name} in {}", session.location());
    }
    Ok(ExitCode::SUCCESS)
}

/// `keel publish`.
fn publish_plugin(ctx: &Context, home: Home, args: PublishArgs) -> anyhow::Result<ExitCode> {
    let PublishArgs {
        path,
        namespace,
        key,
        unsigned,
        component,
        registry,
        json,
    } = args;
    let file = manifest_path(&path);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "cannot read `{}`; pass the plugin directory (with keel.toml)",
            file.display()
        )
    })?;
    let manifest = Manifest::parse(&text, &file)?;
    let code_file = component.unwrap_or_else(|| code_path(&file, &manifest));
    let code = std::fs::read(&code_file).with_context(|| {
            format!(
                "cannot read `{}`; build the plugin first (`keel plugin build {}`), or pass --component FILE",
                code_file.display(),
                path.display()
            )
        })?;
    let key = if unsigned {
        None
    } else {
        Some(KeyPair::load(&home.keys_dir(), &key)?)
    };
    let namespace = match namespace
        .or_else(|| key.as_ref().and_then(|k| k.namespace().map(str::to_owned)))
    {
        Some(ns) => ns,
        None => bail!(
            "refused to publish `{}`: no namespace; pass --namespace NS, or create the key with `keel key new --namespace NS`",
            manifest.name
        ),
    };
    let name = PluginName::new(&namespace, &manifest.name)?;
    let package = validate(&wasm_host(ctx)?, &file, &text, code)?;
    let registry = open_registry(ctx, &registry, true)?;
    let mut session = Session::new(home, registry)?;
    let record = publish(&mut session, &name, &package, key.as_ref(), &mut |_| {})?;
    session.finish()?;
    let sha = record
        .release
        .as_ref()
        .map(|r| r.sha256.clone())
        .unwrap_or_default();
    if json {
        stdoutln!(
            "{}",
            serde_json::json!({
                "name": name,
                "version": record.version.to_string(),
                "sha256": sha,
                "key": key.as_ref().map(|k| k.public().to_string()),
                "registry": session.location(),
            })
        );
    } else {
        stdoutln!(
            "published {name} {} to {}",
            record.version,
            session.location()
        );
        stdoutln!("  sha256 {sha}");
        match &key {
            Some(k) => stdoutln!("  signed by {} ({})", k.public(), k.name()),
            None => stdoutln!("  UNSIGNED: installs need --allow-unverified"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `keel yank`.
fn yank_release(ctx: &Context, home: Home, args: YankArgs) -> anyhow::Result<ExitCode> {
    let YankArgs {
        spec,
        key,
        registry,
    } = args;
    let Some((name, version)) = spec.split_once('@') else {
        bail!("`{spec}`: write NAME@VERSION, e.g. `acme:echo@0.2.0`");
    };
    let name: PluginName = name.parse()?;
    let version = semver::Version::parse(version)
        .with_context(|| format!("`{version}` is not a version; write e.g. 0.2.0"))?;
    let key = KeyPair::load(&home.keys_dir(), &key)?;
    let registry = open_registry(ctx, &registry, false)?;
    let mut session = Session::new(home, registry)?;
    yank(&mut session, &name, &version, Some(&key))?;
    session.finish()?;
    stdoutln!("yanked {name} {version}: new installs skip it; lockfiles that pin it keep it");
    Ok(ExitCode::SUCCESS)
}

/// `keel install`.
fn install_plugins(ctx: &Context, home: Home, args: InstallArgs) -> anyhow::Result<ExitCode> {
    let InstallArgs {
        specs,
        yes,
        allow_unverified,
        allow_native,
        registry,
        json,
    } = args;
    let wanted = specs
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>, _>>()?;
    let registry = open_registry(ctx, &registry, false)?;
    let mut session = Session::new(home.clone(), registry)?;
    let plan = plan_install(
        &mut session,
        &wanted,
        InstallOptions {
            allow_unverified,
            allow_native,
            on_download: std::io::stderr()
                .is_terminal()
                .then_some(say_downloading as fn(&PluginName, &semver::Version, u64)),
        },
    )?;
    session.finish()?;
    install(ctx, &home, &plan, yes, json)
}

/// The progress line of one download, on a terminal.
fn say_downloading(name: &PluginName, version: &semver::Version, size: u64) {
    stderrln!(
        "downloading {name} {version} ({:.1} KiB)…",
        size as f64 / 1024.0
    );
}

/// `keel search`.
fn search(ctx: &Context, home: Home, args: SearchArgs) -> anyhow::Result<ExitCode> {
    let SearchArgs {
        text,
        registry,
        json,
    } = args;
    let registry = open_registry(ctx, &registry, false)?;
    let mut session = Session::new(home, registry)?;
    let needle = text.to_lowercase();
    let mut hits = Vec::new();
    for name in session.registry.names()? {
        let log = match session.log(&name) {
            Ok(log) => log,
            Err(e) => {
                stderrln!("warning: {}", shown(&e.to_string()));
                continue;
            }
        };
        let versions = log.versions();
        let Some(latest) = versions.iter().rev().find(|v| v.yanked_by.is_none()) else {
            continue;
        };
        let description = latest.release.description.clone();
        if name.to_string().contains(&needle) || description.to_lowercase().contains(&needle) {
            hits.push(serde_json::json!({
                "name": name,
                "version": latest.record.version.to_string(),
                "description": description,
            }));
        }
    }
    session.finish()?;
    if json {
        stdoutln!("{}", serde_json::to_string_pretty(&hits)?);
    } else if hits.is_empty() {
        stdoutln!("no plugin matches `{text}` in {}", session.location());
    } else {
        for h in &hits {
            stdoutln!(
                "{} {}  {}",
                shown(h["name"].as_str().unwrap_or_default()),
                shown(h["version"].as_str().unwrap_or_default()),
                shown(h["description"].as_str().unwrap_or_default())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `keel info`.
fn info(ctx: &Context, home: Home, args: InfoArgs) -> anyhow::Result<ExitCode> {
    let InfoArgs {
        name,
        registry,
        json,
    } = args;
    let name: PluginName = name.parse()?;
    let registry = open_registry(ctx, &registry, false)?;
    let mut session = Session::new(home, registry)?;
    let log = session.log(&name)?;
    session.finish()?;
    if log.is_empty() {
        bail!(
            "registry {} has no plugin {name}; `keel search TEXT --registry {}` lists what it has",
            session.location(),
            session.location()
        );
    }
    let trusted = |key: &Option<keel_registry::PublicKey>| {
        key.is_some_and(|k| {
            session
                .trust
                .namespaces
                .get(name.namespace())
                .is_some_and(|t| t.keys.contains(&k) && t.registry == session.location())
        })
    };
    let versions: Vec<serde_json::Value> = log
        .versions()
        .iter()
        .map(|v| {
            serde_json::json!({
                "version": v.record.version.to_string(),
                "yanked": v.yanked_by.is_some(),
                "sha256": v.release.sha256,
                "size": v.release.size,
                "kind": v.release.kind,
                "description": v.release.description,
                "requires": v.release.requires,
                "provides": v.release.provides,
                "capabilities": v.release.capabilities,
                "signer": v.signer.map(|k| k.to_string()),
                "trusted": trusted(&v.signer),
            })
        })
        .collect();
    if json {
        stdoutln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "name": name,
                "registry": session.location(),
                "versions": versions,
            }))?
        );
    } else {
        stdoutln!("{name}  ({})", session.location());
        for v in log.versions() {
            stdoutln!(
                "{} {}{}",
                shown(&v.record.version.to_string()),
                v.release.kind,
                if v.yanked_by.is_some() {
                    "  YANKED"
                } else {
                    ""
                }
            );
            if !v.release.description.is_empty() {
                stdoutln!("  {}", shown(&v.release.description));
            }
            stdoutln!(
                "  signer:       {}",
                match &v.signer {
                    Some(k) if trusted(&v.signer) => format!("{k} (trusted)"),
                    Some(k) => format!("{k} (NOT trusted for `{}`)", name.namespace()),
                    None => "unsigned".to_owned(),
                }
            );
            let reqs: Vec<String> = v
                .release
                .requires
                .iter()
                .map(|(s, r)| {
                    format!(
                        "{s} {}{}",
                        r.range,
                        if r.optional { " (optional)" } else { "" }
                    )
                })
                .collect();
            let provides: Vec<String> = v
                .release
                .provides
                .iter()
                .map(|(s, ver)| format!("{s} {ver}"))
                .collect();
            stdoutln!("  requires:     {}", shown(&none_if_empty(&reqs)));
            stdoutln!("  provides:     {}", shown(&none_if_empty(&provides)));
            stdoutln!(
                "  capabilities: {}",
                shown(&none_if_empty(&capability_summary(&v.release.capabilities)))
            );
            stdoutln!("  sha256:       {}", shown(&v.release.sha256));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn none_if_empty(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

fn capability_summary(caps: &keel_kernel::Capabilities) -> Vec<String> {
    let mut out: Vec<String> = caps
        .network
        .iter()
        .map(|h| format!("network {h}"))
        .collect();
    if caps.exec {
        out.push("exec".to_owned());
    }
    for d in &caps.dirs {
        out.push(format!("dir {} ({:?})", d.path.display(), d.access).to_lowercase());
    }
    out
}

fn install(
    ctx: &Context,
    home: &Home,
    plan: &InstallPlan,
    yes: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let changes: Vec<_> = plan.changes().collect();
    let describe = |p: &keel_registry::PlannedPlugin| {
        serde_json::json!({
            "name": p.name,
            "version": p.version.to_string(),
            "previous": p.previous.as_ref().map(ToString::to_string),
            "kind": p.release.kind,
            "yanked": p.yanked,
            "verified": p.verified,
            "signer": p.signer.map(|k| k.to_string()),
            "capabilities": p.release.capabilities,
            "requests": p.capability_lines(),
            "sha256": p.release.sha256,
        })
    };
    if !json {
        for p in &plan.plugins {
            let action = match (&p.previous, p.changes()) {
                (_, false) => "keep",
                (Some(_), true) => "change",
                (None, true) => "install",
            };
            let from = match (&p.previous, p.changes()) {
                (Some(old), true) => format!(" (from {old})"),
                _ => String::new(),
            };
            let yanked = if p.yanked {
                "  [yanked; kept because the lockfile pins it]"
            } else {
                ""
            };
            stdoutln!(
                "{action} {} {}{}{yanked}",
                p.name,
                shown(&p.version.to_string()),
                shown(&from)
            );
            if p.changes() {
                stdoutln!(
                    "  signed by: {}",
                    match (&p.signer, p.verified) {
                        (Some(k), true) => format!("{} (trusted for `{}`)", k, p.name.namespace()),
                        (Some(k), false) => format!("{k} — UNVERIFIED (--allow-unverified)"),
                        (None, _) => "nobody — UNVERIFIED (--allow-unverified)".to_owned(),
                    }
                );
                stdoutln!("  requests:");
                for line in p.capability_lines() {
                    stdoutln!("    {}", shown(&line));
                }
            }
        }
    }
    if changes.is_empty() {
        if json {
            stdoutln!(
                "{}",
                serde_json::json!({ "installed": [], "plugins": plan.plugins.iter().map(describe).collect::<Vec<_>>() })
            );
        } else {
            stdoutln!("nothing to install: everything asked for is installed");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !yes {
        let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
        if !interactive {
            bail!(
                "approval needed: {} plugin(s) would be installed with the access listed above; nothing was installed; run again with --yes to approve",
                changes.len()
            );
        }
        stderr!("Install with the access listed above? [y/N] ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            stderrln!("not installed: not approved");
            return Ok(ExitCode::from(1));
        }
    }
    apply_install(home, plan)?;
    // Compiled for this machine now, into the component cache, so the first session that uses
    // them does not wait for it.
    let compiled = crate::runtime::loader(ctx)
        .and_then(|loader| crate::runtime::installed_packages(ctx, &loader));
    if let Err(e) = compiled {
        stderrln!(
            "warning: installed, but compiling the installed plugins failed ({e:#}); a session \
             will try again and report it"
        );
    }
    if json {
        stdoutln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "installed": changes.iter().map(|p| describe(p)).collect::<Vec<_>>(),
                "plugins": plan.plugins.iter().map(describe).collect::<Vec<_>>(),
                "lockfile": home.lock_path(),
            }))?
        );
    } else {
        stdoutln!(
            "installed {} plugin(s); lockfile {}",
            changes.len(),
            home.lock_path().display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn serve(
    ctx: &Context,
    addr: SocketAddr,
    expose: bool,
    registry: &RegistryArg,
) -> anyhow::Result<ExitCode> {
    check_bind_address(addr, expose)?;
    let spec = registry_spec(ctx, registry);
    if spec.starts_with("http://") || spec.starts_with("https://") {
        bail!("`keel registry serve` shares a directory; pass --registry DIR");
    }
    let local = LocalRegistry::open(std::path::Path::new(&spec), true)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        stderrln!(
            "warning: serving {} to the network at {bound}: any host that reaches it can read and publish",
            local.location()
        );
    }
    // Whoever reads this may stop reading; the server keeps serving regardless.
    let mut out = std::io::stdout();
    let _ = writeln!(
        out,
        "serving {} at http://{bound}\nuse it with: --registry http://{bound}",
        local.location()
    );
    let _ = out.flush();
    let options = ServeOptions {
        validator: Some(wasm_host(ctx)?),
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    keel_registry::serve(listener, local, options, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
