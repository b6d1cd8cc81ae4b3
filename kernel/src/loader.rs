//! From files to loadable packages: read a plugin's manifest, find its component or library,
//! and turn the capabilities it requests into the grants its instances get.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::lifecycle::PluginPackage;
use crate::manifest::{DirAccess, Manifest, ManifestError, PluginKind};
use crate::native_host::{self, NativeError};
use crate::wasm_host::{GrantedDir, WasmError, WasmGrants, WasmHost};

/// Settings of the [`PluginLoader`].
#[derive(Debug, Clone, Default)]
pub struct LoaderConfig {
    /// Relative directory capabilities resolve against this directory.
    pub workspace: PathBuf,
    /// Native plugins the user trusts, by name.
    pub trusted_native: BTreeSet<String>,
}

/// Why a plugin could not be prepared for loading.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The manifest is missing or invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The component or library file could not be read.
    #[error(
        "{file}: cannot read plugin `{plugin}`'s code: {reason}; build it first, or set `component` in its keel.toml"
    )]
    Read {
        /// The plugin.
        plugin: String,
        /// The file.
        file: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// The component was refused or failed to compile.
    #[error(transparent)]
    Wasm(#[from] WasmError),
    /// The native library was refused or failed to load.
    #[error(transparent)]
    Native(#[from] NativeError),
    /// A requested directory cannot be granted.
    #[error("plugin `{plugin}` asks for directory `{path}`, which cannot be granted: {reason}")]
    Grant {
        /// The plugin.
        plugin: String,
        /// The directory as written in the manifest.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Turns plugin directories and bundled bytes into [`PluginPackage`]s.
#[derive(Clone)]
pub struct PluginLoader {
    wasm: WasmHost,
    config: Arc<LoaderConfig>,
}

/// The manifest file for `path`: `path` itself if it is a file, else `path/keel.toml`.
pub fn manifest_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("keel.toml")
    } else {
        path.to_owned()
    }
}

/// The code file a manifest names: its `component` relative to the manifest's directory, or
/// `<name>.wasm` (`lib<name>.so` and the like for native plugins) beside it.
pub fn code_path(manifest_file: &Path, manifest: &Manifest) -> PathBuf {
    let dir = manifest_file.parent().unwrap_or(Path::new("."));
    match (&manifest.component, manifest.kind) {
        (Some(c), _) => dir.join(c),
        (None, PluginKind::Wasm) => dir.join(format!("{}.wasm", manifest.name)),
        (None, PluginKind::Native) => dir.join(format!(
            "{}{}{}",
            std::env::consts::DLL_PREFIX,
            manifest.name.replace('-', "_"),
            std::env::consts::DLL_SUFFIX
        )),
    }
}

impl PluginLoader {
    /// A loader compiling components with `wasm`.
    pub fn new(wasm: WasmHost, config: LoaderConfig) -> Self {
        PluginLoader {
            wasm,
            config: Arc::new(config),
        }
    }

    /// The WebAssembly host.
    pub fn wasm(&self) -> &WasmHost {
        &self.wasm
    }

    /// Read the plugin at `path` (a directory holding `keel.toml`, or the manifest itself).
    pub fn from_path(&self, path: &Path) -> Result<PluginPackage, LoadError> {
        let file = manifest_path(path);
        let manifest = Manifest::load(&file)?;
        let code = code_path(&file, &manifest);
        match manifest.kind {
            PluginKind::Wasm => {
                let bytes = std::fs::read(&code).map_err(|e| LoadError::Read {
                    plugin: manifest.name.clone(),
                    file: code.clone(),
                    reason: e.to_string(),
                })?;
                self.from_component(manifest, &bytes)
            }
            PluginKind::Native => {
                let source = native_host::open(&manifest, &code, &self.config.trusted_native)?;
                Ok(PluginPackage { manifest, source })
            }
        }
    }

    /// A WebAssembly plugin from its manifest and component bytes (bundled plugins).
    pub fn from_component(
        &self,
        manifest: Manifest,
        bytes: &[u8],
    ) -> Result<PluginPackage, LoadError> {
        let component = self.wasm.compile(&manifest.name, bytes)?;
        let grants = self.grants(&manifest)?;
        let source = self.wasm.source(&component, grants);
        Ok(PluginPackage { manifest, source })
    }

    /// A WebAssembly plugin whose manifest text and component are embedded in the binary
    /// (bundled plugins, test fixtures); `origin` names it in manifest errors.
    pub fn from_embedded(
        &self,
        origin: &str,
        manifest: &str,
        component: &[u8],
    ) -> Result<PluginPackage, LoadError> {
        let manifest = Manifest::parse(manifest, Path::new(&format!("<{origin}>/keel.toml")))?;
        self.from_component(manifest, component)
    }

    /// The grants a plugin's instances get: exactly the directories it requests (resolved
    /// against the workspace; each must exist) and its limits.
    pub fn grants(&self, manifest: &Manifest) -> Result<WasmGrants, LoadError> {
        let mut dirs = Vec::new();
        for d in &manifest.capabilities.dirs {
            let grant_err = |reason: String| LoadError::Grant {
                plugin: manifest.name.clone(),
                path: d.path.clone(),
                reason,
            };
            let host = self
                .config
                .workspace
                .join(&d.path)
                .canonicalize()
                .map_err(|e| grant_err(format!("{e}; create it or change the manifest")))?;
            if !host.is_dir() {
                return Err(grant_err("it is not a directory".into()));
            }
            dirs.push(GrantedDir {
                host,
                guest: d.guest.clone(),
                read_only: d.access == DirAccess::Read,
            });
        }
        Ok(WasmGrants {
            dirs,
            limits: self.wasm.limits_for(&manifest.limits),
        })
    }
}
