//! From files to loadable packages: read a plugin's manifest, find its component or library,
//! and turn the capabilities it requests into the grants its instances get.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::lifecycle::PluginPackage;
use crate::manifest::{DirAccess, Manifest, ManifestError, PluginKind};
use crate::native_host::{self, NativeError};
use crate::wasm_host::{GrantedDir, WasmError, WasmGrants, WasmHost, WasmLimits};

/// Settings of the [`PluginLoader`].
#[derive(Debug, Clone, Default)]
pub struct LoaderConfig {
    /// Relative directory capabilities resolve against this directory.
    pub workspace: PathBuf,
    /// Native plugins the user trusts, by name.
    pub trusted_native: BTreeSet<String>,
    /// keel's data directory (session logs, verdict ledgers). A manifest directory path
    /// starting with [`DATA_DIR_PREFIX`] resolves under it, and is created when missing;
    /// `None` refuses such paths.
    pub data_dir: Option<PathBuf>,
    /// Files and directories of the sealed kernel (the audit log, the approvals file, the
    /// signing keys, the user's config): no granted directory may contain one.
    pub sealed: Vec<PathBuf>,
    /// Limits above the defaults the user granted, by plugin (`[limits.<plugin>]`). A
    /// manifest asking for more than the default and its grant gets the default or the grant,
    /// with a warning. Plugins keel ships ([`PluginLoader::from_shipped`]) keep theirs.
    pub granted_limits: std::collections::BTreeMap<String, crate::manifest::Limits>,
    /// keel's home, sealed as a whole: no grant may reach into it except a plugin's own data
    /// directory, `$KEEL_DATA/<plugin>`; a grant holding it (the workspace is the person's home
    /// directory) gets it carved out. `None` in tests without a home.
    pub home: Option<PathBuf>,
    /// Directories the user granted beyond the workspace and the plugin's own data directory,
    /// by plugin (`[grants.<plugin>] dirs`), written as in the manifest.
    pub granted_dirs: std::collections::BTreeMap<String, Vec<PathBuf>>,
}

/// The prefix of a manifest directory path that names keel's data directory
/// ([`LoaderConfig::data_dir`]): `$KEEL_DATA/sessions` is the `sessions` folder in it.
pub const DATA_DIR_PREFIX: &str = "$KEEL_DATA";

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
                let manifest = self.with_granted_instances(manifest);
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
        let manifest = self.with_granted_instances(manifest);
        let source = self.wasm.source(&component, grants);
        Ok(PluginPackage { manifest, source })
    }

    /// A plugin keel ships in its binary: keel vouches for its manifest, so its directory
    /// grants and limits are taken as written (the sealed files stay sealed). Everything else
    /// — a directory, a registry install, a test fixture — is a third party's.
    pub fn from_shipped(
        &self,
        origin: &str,
        manifest: &str,
        shipped: crate::Shipped<'_>,
    ) -> Result<PluginPackage, LoadError> {
        let manifest = Manifest::parse(manifest, Path::new(&format!("<{origin}>/keel.toml")))?;
        let compiled = self.wasm.compile_shipped(&manifest.name, shipped)?;
        let grants = self.grants_for(&manifest, true)?;
        let source = self.wasm.source(&compiled, grants);
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

    /// The grants a third-party plugin's instances get: exactly the directories it requests
    /// (resolved against the workspace; each must exist) and its limits.
    pub fn grants(&self, manifest: &Manifest) -> Result<WasmGrants, LoadError> {
        self.grants_for(manifest, false)
    }

    fn grants_for(&self, manifest: &Manifest, shipped: bool) -> Result<WasmGrants, LoadError> {
        let mut dirs = Vec::new();
        let mut hidden = Vec::new();
        for d in &manifest.capabilities.dirs {
            let grant_err = |reason: String| LoadError::Grant {
                plugin: manifest.name.clone(),
                path: d.path.clone(),
                reason,
            };
            let user_granted = self
                .config
                .granted_dirs
                .get(&manifest.name)
                .is_some_and(|dirs| dirs.contains(&d.path));
            if !shipped && !user_granted {
                self.check_reach(&manifest.name, &d.path)
                    .map_err(grant_err)?;
            }
            // A workspace folder keel's own plugins name is made when missing (the project's
            // memory before its first entry), never through a link out of the workspace.
            let host = self
                .host_dir(&d.path, shipped && !user_granted)
                .map_err(grant_err)?;
            if !shipped && !user_granted {
                self.check_home(&manifest.name, &host).map_err(grant_err)?;
            }
            if !host.is_dir() {
                return Err(grant_err("it is not a directory".into()));
            }
            // A grant holding keel's home (the workspace is the person's home directory)
            // has the home carved out: no path through it reaches inside.
            let carved = self.home_inside(&host);
            if let Some(home) = &carved
                && !hidden.contains(home)
            {
                hidden.push(home.clone());
            }
            if let Some(sealed) = self.exposes_sealed(&host, carved.as_deref()) {
                return Err(grant_err(format!(
                    "it contains `{}`, which belongs to keel's sealed kernel and no plugin may \
                     see; grant a narrower directory",
                    sealed.display()
                )));
            }
            dirs.push(GrantedDir {
                host,
                guest: d.guest.clone(),
                read_only: d.access == DirAccess::Read,
            });
        }
        Ok(WasmGrants {
            dirs,
            limits: if shipped {
                self.wasm.limits_for(&manifest.limits)
            } else {
                self.limits_for(manifest)
            },
            hidden,
        })
    }

    /// What a manifest may grant on its own: a relative path inside the workspace, or its own
    /// data directory `$KEEL_DATA/<plugin>/…`. Anything else needs the user's config.
    fn check_reach(&self, plugin: &str, path: &Path) -> Result<(), String> {
        let ask_user = |what: &str| {
            format!(
                "{what}; a manifest grants only paths inside the workspace or its own data \
                 directory `{DATA_DIR_PREFIX}/{plugin}`; to grant it anyway add `dirs = [\"{}\"]` \
                 under [grants.{plugin}] in config.toml",
                path.display()
            )
        };
        let mut components = path.components();
        if components
            .next()
            .is_some_and(|c| c.as_os_str() == DATA_DIR_PREFIX)
        {
            return match components.next() {
                Some(std::path::Component::Normal(first)) if first == plugin => Ok(()),
                _ => Err(ask_user("it is another plugin's data or keel's own")),
            };
        }
        if path.is_absolute() {
            return Err(ask_user("it is an absolute path"));
        }
        let inside = self
            .config
            .workspace
            .canonicalize()
            .ok()
            .zip(self.config.workspace.join(path).canonicalize().ok())
            .is_some_and(|(ws, p)| p.starts_with(ws));
        if !inside {
            return Err(ask_user("it leads outside the workspace"));
        }
        Ok(())
    }

    /// keel's home, canonical, when it lies strictly inside the granted directory `host`.
    fn home_inside(&self, host: &Path) -> Option<PathBuf> {
        let home = self.config.home.as_ref()?.canonicalize().ok()?;
        (home != host && home.starts_with(host)).then_some(home)
    }

    /// keel's home is sealed as a whole (installed plugins, the component cache, the lockfile,
    /// trust, keys, other plugins' data): a grant may not reach into it, except the plugin's
    /// own data directory. A grant holding it gets it carved out (`WasmGrants::hidden`).
    fn check_home(&self, plugin: &str, host: &Path) -> Result<(), String> {
        let Some(home) = self
            .config
            .home
            .as_ref()
            .and_then(|h| h.canonicalize().ok())
        else {
            return Ok(());
        };
        let own = self
            .config
            .data_dir
            .as_ref()
            .and_then(|d| d.join(plugin).canonicalize().ok());
        if own.as_ref().is_some_and(|own| host.starts_with(own)) {
            return Ok(());
        }
        if host.starts_with(&home) {
            return Err(format!(
                "it reaches keel's home `{}`, which is sealed (installed plugins, the compiled \
                 cache, keys, other plugins' data); grant a directory outside it",
                home.display()
            ));
        }
        Ok(())
    }

    /// The limits `manifest` asks for, no higher than the default or what the user granted
    /// this plugin: a manifest can lower its limits, never raise them on its own.
    pub fn limits_for(&self, manifest: &Manifest) -> WasmLimits {
        let asked = self.wasm.limits_for(&manifest.limits);
        let default = self.wasm.limits_for(&crate::manifest::Limits::default());
        let granted = self
            .config
            .granted_limits
            .get(&manifest.name)
            .map_or(default, |g| self.wasm.limits_for(g));
        let ceiling = WasmLimits {
            memory_bytes: default.memory_bytes.max(granted.memory_bytes),
            cpu: default.cpu.max(granted.cpu),
        };
        let limits = WasmLimits {
            memory_bytes: asked.memory_bytes.min(ceiling.memory_bytes),
            cpu: asked.cpu.min(ceiling.cpu),
        };
        if limits != asked {
            tracing::warn!(
                plugin = %manifest.name,
                "the manifest asks for {} MiB and {} ms per call; it gets {} MiB and {} ms \
                 (raise them with [limits.{}] memory-mib / cpu-ms in config.toml)",
                asked.memory_bytes >> 20,
                asked.cpu.as_millis(),
                limits.memory_bytes >> 20,
                limits.cpu.as_millis(),
                manifest.name
            );
        }
        limits
    }

    /// `manifest` with at most the instances the user granted it (`[limits.<plugin>]
    /// instances`), one without a grant: each instance is another memory cap's worth.
    fn with_granted_instances(&self, mut manifest: Manifest) -> Manifest {
        let granted = self
            .config
            .granted_limits
            .get(&manifest.name)
            .and_then(|g| g.instances)
            .unwrap_or(1);
        let asked = manifest.limits.instances.unwrap_or(1);
        if asked > granted {
            tracing::warn!(
                plugin = %manifest.name,
                "the manifest asks for {asked} instances; it gets {granted} (raise it with \
                 [limits.{}] instances in config.toml)",
                manifest.name
            );
            manifest.limits.instances = Some(granted);
        }
        manifest
    }

    /// The first sealed path inside `dir` (canonical), if any; one in `carved` (keel's home,
    /// carved out of this grant) is out of reach.
    fn exposes_sealed(&self, dir: &Path, carved: Option<&Path>) -> Option<&Path> {
        self.config.sealed.iter().map(PathBuf::as_path).find(|s| {
            // A sealed file may not exist yet; judge where it would be.
            let canonical = s.canonicalize().ok().or_else(|| {
                let parent = s.parent()?.canonicalize().ok()?;
                Some(parent.join(s.file_name()?))
            });
            canonical
                .is_some_and(|c| c.starts_with(dir) && !carved.is_some_and(|h| c.starts_with(h)))
        })
    }

    /// The host directory a manifest path names, canonical: under the data directory for
    /// `$KEEL_DATA/…` (created when missing), else relative to the workspace (must exist).
    ///
    /// `shipped`: a folder inside the workspace is created when missing, and it must resolve
    /// inside the workspace (a cloned repository may make `.keel` a link to anywhere).
    fn host_dir(&self, path: &Path, shipped: bool) -> Result<PathBuf, String> {
        let mut components = path.components();
        let in_data = components
            .next()
            .is_some_and(|c| c.as_os_str() == DATA_DIR_PREFIX);
        if !in_data {
            let host = self.config.workspace.join(path);
            if !shipped || path.is_absolute() {
                return host
                    .canonicalize()
                    .map_err(|e| format!("{e}; create it or change the manifest"));
            }
            let workspace = self
                .config
                .workspace
                .canonicalize()
                .map_err(|e| format!("the workspace is not available: {e}"))?;
            let inside = |p: &Path| {
                p.canonicalize()
                    .is_ok_and(|canonical| canonical.starts_with(&workspace))
            };
            // The nearest folder that exists must already be inside: nothing is created
            // through a link.
            let existing = host.ancestors().find(|a| a.exists()).unwrap_or(&workspace);
            if !inside(existing) {
                return Err("it leads outside the workspace (through a link)".into());
            }
            std::fs::create_dir_all(&host).map_err(|e| format!("cannot create it: {e}"))?;
            if !inside(&host) {
                return Err("it leads outside the workspace (through a link)".into());
            }
            return host.canonicalize().map_err(|e| e.to_string());
        }
        let Some(data) = &self.config.data_dir else {
            return Err(format!(
                "no data directory is configured, so `{DATA_DIR_PREFIX}` cannot be resolved"
            ));
        };
        let rest = components.as_path();
        // The data directory is keel's own: a manifest may name folders in it, never climb out.
        if rest
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "paths under `{DATA_DIR_PREFIX}` must be plain folder names, without `..` or a root"
            ));
        }
        let host = data.join(rest);
        std::fs::create_dir_all(&host).map_err(|e| format!("cannot create it: {e}"))?;
        host.canonicalize().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[path = "loader_tests.rs"]
mod tests;
