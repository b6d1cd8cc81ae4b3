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

impl Runtime {
    /// A kernel with no plugins yet.
    pub fn new(ctx: &Context) -> anyhow::Result<Runtime> {
        let wasm = WasmHost::new(WasmHostConfig {
            cache_dir: Some(ctx.component_cache()),
            ..WasmHostConfig::default()
        })
        .context("cannot start the WebAssembly host")?;
        let loader = PluginLoader::new(
            wasm,
            LoaderConfig {
                workspace: ctx.workspace.clone(),
                trusted_native: ctx.config.trust.native.clone(),
                data_dir: Some(ctx.data_dir()),
                sealed: ctx.sealed_paths(),
            },
        );
        Ok(Runtime {
            kernel: Kernel::new(KernelConfig::default()),
            loader,
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
                Some(bundled) => rt.loader.from_embedded(
                    &format!("bundled {}", bundled.name),
                    bundled.manifest,
                    bundled.component,
                )?,
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
        // Plugins installed from a registry, each re-hashed against the lockfile first.
        for installed in keel_registry::load_installed(&keel_registry::Home::new(&ctx.home))? {
            let package = match installed.component {
                Some(bytes) => rt.loader.from_component(installed.manifest, &bytes)?,
                None => rt.loader.from_path(&installed.dir)?,
            };
            rt.load(ctx, package).await?;
        }
        Ok(rt)
    }

    /// Load `package` with the user's `[config.<name>]` settings laid over its defaults.
    async fn load(&self, ctx: &Context, mut package: PluginPackage) -> anyhow::Result<()> {
        if let Some(user) = ctx.config.config.get(&package.manifest.name) {
            let defaults = &mut package.manifest.config;
            if !defaults.is_object() {
                *defaults = serde_json::Value::Object(Default::default());
            }
            if let Some(map) = defaults.as_object_mut() {
                for (key, value) in user {
                    map.insert(key.clone(), serde_json::to_value(value)?);
                }
            }
        }
        self.kernel.load(package).await?;
        Ok(())
    }

    pub fn list(&self) -> Vec<PluginStatus> {
        self.kernel.list()
    }
}
