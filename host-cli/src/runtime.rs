//! Building a kernel with the bundled plugins and the user's own.

use anyhow::Context as _;
use keel_kernel::{
    Kernel, KernelConfig, LoaderConfig, PluginLoader, PluginPackage, PluginStatus, WasmHost,
    WasmHostConfig,
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
    Ok(())
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
        bundled.component,
    )?)
}

/// Plugins installed from a registry, each re-hashed against the lockfile first, with the
/// directory each was installed to.
pub fn installed_packages(
    ctx: &Context,
    loader: &PluginLoader,
) -> anyhow::Result<Vec<(PluginPackage, std::path::PathBuf)>> {
    keel_registry::load_installed(&keel_registry::Home::new(&ctx.home))?
        .into_iter()
        .map(|installed| {
            let package = match installed.component {
                Some(bytes) => loader.from_component(installed.manifest, &bytes)?,
                None => loader.from_path(&installed.dir)?,
            };
            Ok((package, installed.dir))
        })
        .collect()
}

impl Runtime {
    /// A kernel with no plugins yet.
    pub fn new(ctx: &Context) -> anyhow::Result<Runtime> {
        Ok(Runtime {
            kernel: Kernel::new(KernelConfig::default()),
            loader: loader(ctx)?,
        })
    }

    /// A kernel holding the bundled plugins, the user's configured ones and `extra`.
    pub async fn with_plugins(
        ctx: &Context,
        extra: &[std::path::PathBuf],
    ) -> anyhow::Result<Runtime> {
        let rt = Runtime::new(ctx)?;
        // The example plugins, then what a session of this config would load.
        let mut names: Vec<String> = EXAMPLES.iter().map(|n| (*n).to_owned()).collect();
        names.extend(crate::session::profile(ctx));
        for name in &names {
            let package = match keel_bundled_plugins::get(name) {
                Some(bundled) => bundled_package(&rt.loader, bundled)?,
                None => rt
                    .loader
                    .from_path(std::path::Path::new(name))
                    .with_context(|| {
                        format!("profile plugin `{name}` is neither bundled nor a plugin directory")
                    })?,
            };
            rt.load(ctx, package).await?;
        }
        for path in ctx.config.plugins.paths.iter().chain(extra) {
            let package = rt
                .loader
                .from_path(path)
                .with_context(|| format!("cannot load the plugin at `{}`", path.display()))?;
            rt.load(ctx, package).await?;
        }
        for (package, _) in installed_packages(ctx, &rt.loader)? {
            rt.load(ctx, package).await?;
        }
        Ok(rt)
    }

    /// Load `package` with the user's `[config.<name>]` settings laid over its defaults.
    async fn load(&self, ctx: &Context, mut package: PluginPackage) -> anyhow::Result<()> {
        apply_user_config(&ctx.config.config, &mut package)?;
        self.kernel.load(package).await?;
        Ok(())
    }

    pub fn list(&self) -> Vec<PluginStatus> {
        self.kernel.list()
    }
}
