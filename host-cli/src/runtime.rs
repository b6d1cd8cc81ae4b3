//! Building a kernel with the bundled plugins and the user's own.

use anyhow::Context as _;
use keel_kernel::{
    Kernel, LoaderConfig, PluginLoader, PluginPackage, PluginStatus, WasmHost, WasmHostConfig,
};

use crate::config::Context;

/// The bundled example plugins, always listed.
const EXAMPLES: &[&str] = &["greeter", "greeter-client", "echo-tool"];

/// A kernel with its loader.
pub struct Runtime {
    pub kernel: Kernel,
    pub loader: PluginLoader,
}

/// The plugin loader of this config: the component cache, the workspace, the data
/// directory, the trusted native plugins and the sealed paths no grant may contain.
pub fn loader(ctx: &Context) -> anyhow::Result<PluginLoader> {
    let wasm = WasmHost::new(WasmHostConfig {
        cache_dir: Some(ctx.component_cache()),
        ..WasmHostConfig::default()
    })
    .context("cannot start the WebAssembly host")?;
    Ok(PluginLoader::new(
        wasm,
        LoaderConfig {
            workspace: ctx.workspace.clone(),
            trusted_native: ctx.config.trust.native.clone(),
            data_dir: Some(ctx.data_dir()),
            sealed: ctx.sealed_paths(),
            granted_limits: ctx.config.limits.clone(),
            home: Some(ctx.home.clone()),
            granted_dirs: ctx
                .config
                .grants
                .iter()
                .map(|(plugin, g)| (plugin.clone(), g.dirs.clone()))
                .collect(),
        },
    ))
}

/// Lay the user's `[config.<name>]` settings over `package`'s `[config]` defaults.
pub fn apply_user_config(
    user_config: &std::collections::BTreeMap<String, toml::Table>,
    package: &mut PluginPackage,
) -> anyhow::Result<()> {
    if let Some(user) = user_config.get(&package.manifest.name) {
        let settings = user
            .iter()
            .map(|(k, v)| Ok((k.clone(), serde_json::to_value(v)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        overlay_config(package, settings);
    }
    if package.manifest.name == "mcp" {
        grant_mcp_reach(package);
    }
    Ok(())
}

/// The `mcp` plugin declares no host: it reaches exactly the Streamable HTTP servers the
/// person's config names (`[mcp.servers.NAME] url`, laid into its config) or an editor passed
/// and the person approved, and sends only the bearer secrets named there and the secrets
/// carrying an editor's headers. Those hosts and secrets are added to its manifest here, so the
/// kernel's network gate checks every request against them like any declared host.
fn grant_mcp_reach(package: &mut PluginPackage) {
    let servers = package.manifest.config["servers"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let caps = &mut package.manifest.capabilities;
    for server in servers.values() {
        if let Some(url) = server["url"].as_str().and_then(|u| url::Url::parse(u).ok())
            && let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default())
        {
            let entry = crate::settings::host_port(&url, host, port);
            if !caps.network.contains(&entry) {
                caps.network.push(entry);
            }
        }
        let header_secrets = server["secret_headers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["secret"].as_str());
        for secret in server["bearer_secret"]
            .as_str()
            .into_iter()
            .chain(header_secrets)
        {
            if !caps.secrets.iter().any(|s| s == secret) {
                caps.secrets.push(secret.to_owned());
            }
        }
    }
}

/// Set `settings` in `package`'s config object (made an object if it was not one).
pub fn overlay_config(
    package: &mut PluginPackage,
    settings: impl IntoIterator<Item = (String, serde_json::Value)>,
) {
    let config = &mut package.manifest.config;
    if !config.is_object() {
        *config = serde_json::Value::Object(Default::default());
    }
    if let Some(map) = config.as_object_mut() {
        map.extend(settings);
    }
}

/// The package of a bundled plugin, by name.
pub fn bundled_package(
    loader: &PluginLoader,
    bundled: &keel_bundled_plugins::Bundled,
) -> anyhow::Result<PluginPackage> {
    Ok(loader.from_shipped(
        &format!("bundled {}", bundled.name),
        bundled.manifest,
        bundled.shipped(),
    )?)
}

/// Plugins installed from a registry, each re-hashed against the lockfile first.
pub fn installed_packages(
    ctx: &Context,
    loader: &PluginLoader,
) -> anyhow::Result<Vec<PluginPackage>> {
    keel_registry::load_installed(&keel_registry::Home::new(&ctx.home))?
        .into_iter()
        .map(|installed| installed_package(loader, installed))
        .collect()
}

/// The package of one installed plugin (already re-hashed against the lockfile).
fn installed_package(
    loader: &PluginLoader,
    installed: keel_registry::InstalledPlugin,
) -> anyhow::Result<PluginPackage> {
    Ok(match installed.component {
        Some(bytes) => loader.from_component(installed.manifest, &bytes)?,
        None => loader.from_path(&installed.dir)?,
    })
}

/// The installed plugin `name` (its own name, or `namespace:name`), re-hashed against the
/// lockfile, if one is installed.
pub fn find_installed(
    home: &std::path::Path,
    loader: &PluginLoader,
    name: &str,
) -> anyhow::Result<Option<PluginPackage>> {
    keel_registry::load_installed(&keel_registry::Home::new(home))?
        .into_iter()
        .find(|installed| {
            installed.manifest.name == name || installed.entry.name.to_string() == name
        })
        .map(|installed| installed_package(loader, installed))
        .transpose()
}

/// The names of the installed plugins (for Tab completion); none when the lockfile cannot
/// be read.
pub fn installed_names(home: &std::path::Path) -> Vec<String> {
    keel_registry::Lockfile::load(&keel_registry::Home::new(home).lock_path())
        .map(|lock| {
            lock.plugins
                .iter()
                .map(|p| p.name.name().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Where one of a session's plugins comes from.
pub enum PluginSource {
    /// A bundled plugin, by its entry.
    Bundled(&'static keel_bundled_plugins::Bundled),
    /// A plugin directory (or manifest) named in `[profile] plugins` or `[plugins] paths`.
    Path(std::path::PathBuf),
    /// A plugin installed from a registry, re-hashed against the lockfile.
    Installed(Box<PluginPackage>),
}

/// The plugins of a session of this config, in load order: the profile's entries (bundled
/// names or paths), then `[plugins] paths`, then the installed plugins. The one list every
/// command builds its kernel from (`keel run`/`exec`, `keel plugin`, `keel tool`).
pub fn session_plugins(ctx: &Context, loader: &PluginLoader) -> anyhow::Result<Vec<PluginSource>> {
    let mut sources = Vec::new();
    for entry in crate::settings::profile(ctx) {
        if entry.contains('/') || entry.starts_with('.') {
            sources.push(PluginSource::Path(entry.into()));
        } else if let Some(bundled) = keel_bundled_plugins::get(&entry) {
            sources.push(PluginSource::Bundled(bundled));
        } else {
            anyhow::bail!(
                "profile plugin `{entry}` is neither bundled nor a path; the bundled plugins \
                 are: {}",
                keel_bundled_plugins::all()
                    .iter()
                    .map(|b| b.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    sources.extend(
        ctx.config
            .plugins
            .paths
            .iter()
            .cloned()
            .map(PluginSource::Path),
    );
    for package in installed_packages(ctx, loader)? {
        sources.push(PluginSource::Installed(Box::new(package)));
    }
    Ok(sources)
}

/// Where a loaded plugin came from, to load it again (`/reload`).
#[derive(Clone)]
pub enum Origin {
    /// A bundled plugin.
    Bundled(&'static keel_bundled_plugins::Bundled),
    /// A plugin directory.
    Path(std::path::PathBuf),
    /// A plugin installed from a registry, by name: loaded again, it is re-hashed against the
    /// lockfile again.
    Installed(String),
}

/// A session plugin's package, ready to load, and where it came from.
pub struct Prepared {
    /// The package, or why it could not be read.
    pub package: anyhow::Result<PluginPackage>,
    /// Where it came from.
    pub origin: Origin,
}

/// The packages of `sources`, in their order, read on all the machine's cores: reading a
/// compiled component from the cache (an HMAC over it and wasmtime's deserialize) or compiling
/// it is most of a session's start, and no plugin needs another for it. Loading them into the
/// kernel stays in order.
pub fn prepare(loader: &PluginLoader, sources: Vec<PluginSource>) -> Vec<Prepared> {
    let one = |source: PluginSource| match source {
        PluginSource::Bundled(bundled) => Prepared {
            package: bundled_package(loader, bundled),
            origin: Origin::Bundled(bundled),
        },
        PluginSource::Path(path) => Prepared {
            package: loader
                .from_path(&path)
                .with_context(|| format!("cannot load the plugin at `{}`", path.display())),
            origin: Origin::Path(path),
        },
        PluginSource::Installed(package) => Prepared {
            origin: Origin::Installed(package.manifest.name.clone()),
            package: Ok(*package),
        },
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(sources.len());
    if workers <= 1 {
        return sources.into_iter().map(one).collect();
    }
    let count = sources.len();
    let queue = std::sync::Mutex::new(sources.into_iter().enumerate());
    let done = std::sync::Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let next = queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .next();
                    let Some((index, source)) = next else { break };
                    let prepared = one(source);
                    done.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((index, prepared));
                }
            });
        }
    });
    let mut done = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, prepared)| prepared).collect()
}

/// On a terminal, say so before the bundled plugins are compiled for this machine (a first run,
/// or the first after an upgrade): it takes seconds, and a blank screen that long looks hung.
pub fn say_if_compiling(loader: &PluginLoader, sources: &[PluginSource]) {
    use std::io::IsTerminal as _;
    if !std::io::stderr().is_terminal() {
        return;
    }
    let to_compile = sources
        .iter()
        .filter(|source| match source {
            PluginSource::Bundled(bundled) => loader.wasm().compiles(&bundled.shipped()),
            _ => false,
        })
        .count();
    if to_compile > 0 {
        stderrln!(
            "compiling {to_compile} bundled plugin(s) for this machine (once; later starts load \
             them from the component cache)…"
        );
    }
}

impl Runtime {
    /// A kernel with no plugins yet, with the person's gates, sandbox, timeouts and limits
    /// (`session::KernelBuilder`, as every command's).
    pub fn new(ctx: &Context) -> anyhow::Result<Runtime> {
        crate::session::KernelBuilder::new(ctx).build()
    }

    /// A kernel holding the bundled plugins, the user's configured ones and `extra`.
    pub async fn with_plugins(
        ctx: &Context,
        extra: &[std::path::PathBuf],
    ) -> anyhow::Result<Runtime> {
        let rt = Runtime::new(ctx)?;
        // The example plugins, then what a session of this config would load, then `extra`.
        let examples = EXAMPLES
            .iter()
            .filter_map(|name| keel_bundled_plugins::get(name))
            .map(PluginSource::Bundled);
        let extra = extra.iter().cloned().map(PluginSource::Path);
        let sources = examples
            .chain(session_plugins(ctx, &rt.loader)?)
            .chain(extra)
            .collect();
        for prepared in prepare(&rt.loader, sources) {
            rt.load(ctx, prepared.package?).await?;
        }
        Ok(rt)
    }

    /// Load `package` with the user's `[config.<name>]` settings laid over its defaults.
    async fn load(&self, ctx: &Context, mut package: PluginPackage) -> anyhow::Result<()> {
        apply_user_config(&ctx.config.config, &mut package)?;
        crate::home_locks::serve_memory_locked(&mut package, &ctx.workspace, &ctx.data_dir());
        self.kernel.load(package).await?;
        Ok(())
    }

    pub fn list(&self) -> Vec<PluginStatus> {
        self.kernel.list()
    }
}
