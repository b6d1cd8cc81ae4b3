//! A kernel with a WebAssembly host, for end-to-end tests and benchmarks.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use keel_kernel::{
    GateConfig, Kernel, KernelConfig, LoaderConfig, PluginLoader, PluginPackage, PluginStatus,
    WasmHost, WasmHostConfig,
};

/// A kernel and the loader that feeds it.
pub struct Harness {
    /// The kernel.
    pub kernel: Kernel,
    /// Compiles components and resolves grants.
    pub loader: PluginLoader,
}

impl Harness {
    /// A kernel whose relative directory grants resolve against `workspace`, caching compiled
    /// components in `cache` (if given).
    pub fn new(workspace: &Path, cache: Option<PathBuf>) -> anyhow::Result<Harness> {
        Harness::with_gates(workspace, None, cache, GateConfig::locked_down())
    }

    /// A kernel with locked-down gates whose `$KEEL_DATA/…` grants resolve under `data_dir`
    /// (the session log's directory, for one), compiling components afresh.
    pub fn with_data_dir(workspace: &Path, data_dir: &Path) -> anyhow::Result<Harness> {
        Harness::with_gates(
            workspace,
            Some(data_dir.to_owned()),
            None,
            GateConfig::locked_down(),
        )
    }

    /// A kernel whose gates are set up by `gates` and whose loader resolves relative
    /// directory grants against `workspace` and `$KEEL_DATA/…` under `data_dir`.
    pub fn with_gates(
        workspace: &Path,
        data_dir: Option<PathBuf>,
        cache: Option<PathBuf>,
        gates: GateConfig,
    ) -> anyhow::Result<Harness> {
        Harness::with_kernel(workspace, data_dir, cache, KernelConfig::default(), gates)
    }

    /// Like [`with_gates`](Self::with_gates), with the kernel's own settings (deadlines,
    /// queues) too.
    pub fn with_kernel(
        workspace: &Path,
        data_dir: Option<PathBuf>,
        cache: Option<PathBuf>,
        kernel: KernelConfig,
        gates: GateConfig,
    ) -> anyhow::Result<Harness> {
        let wasm = WasmHost::new(WasmHostConfig {
            cache_dir: cache,
            ..WasmHostConfig::default()
        })?;
        Ok(Harness {
            kernel: Kernel::with_gates(kernel, gates),
            loader: PluginLoader::new(
                wasm,
                LoaderConfig {
                    workspace: workspace.to_owned(),
                    data_dir,
                    ..LoaderConfig::default()
                },
            ),
        })
    }

    /// The package of a plugin under test (see [`crate::plugins`]).
    pub fn plugin(&self, name: &str) -> anyhow::Result<PluginPackage> {
        let b = crate::plugins::plugin(name)
            .with_context(|| format!("no plugin under test `{name}`"))?;
        Ok(self
            .loader
            .from_shipped(&format!("plugin {name}"), b.manifest, b.shipped())?)
    }

    /// Load a plugin under test.
    pub async fn load_plugin(&self, name: &str) -> anyhow::Result<PluginStatus> {
        Ok(self.kernel.load(self.plugin(name)?).await?)
    }

    /// The package of a bundled plugin.
    pub fn bundled(&self, name: &str) -> anyhow::Result<PluginPackage> {
        let b = keel_bundled_plugins::get(name)
            .with_context(|| format!("no bundled plugin `{name}`"))?;
        Ok(self
            .loader
            .from_shipped(&format!("bundled {name}"), b.manifest, b.shipped())?)
    }

    /// The package of a test fixture.
    pub fn fixture(&self, name: &str) -> anyhow::Result<PluginPackage> {
        let (manifest, component) =
            crate::fixtures::fixture(name).with_context(|| format!("no fixture `{name}`"))?;
        Ok(self
            .loader
            .from_embedded(&format!("fixture {name}"), manifest, component)?)
    }

    /// Load a bundled plugin.
    pub async fn load_bundled(&self, name: &str) -> anyhow::Result<PluginStatus> {
        Ok(self.kernel.load(self.bundled(name)?).await?)
    }

    /// Load a fixture.
    pub async fn load_fixture(&self, name: &str) -> anyhow::Result<PluginStatus> {
        Ok(self.kernel.load(self.fixture(name)?).await?)
    }

    /// Load `model-scripted` playing `script` (TOML, see keel-model-wire's `scripted`).
    pub async fn load_scripted_model(&self, script: &str) -> anyhow::Result<PluginStatus> {
        let package = crate::models::package(
            &self.loader,
            "model-scripted",
            serde_json::json!({ "script": script }),
        )?;
        Ok(self.kernel.load(package).await?)
    }
}
