//! The WebAssembly host: one wasmtime engine for the whole kernel, components compiled (and
//! cached on disk) after an ABI check, and instances whose only door into the kernel is their
//! [`HostHandle`](crate::HostHandle), bounded in memory and in guest CPU per call, with a WASI
//! context built only from the plugin's grants.
//!
//! ```text
//! bytes ──precheck──▶ compile / cache ──ABI check──▶ link (InstancePre) = WasmComponent
//! WasmComponent + WasmGrants ──source()──▶ PluginSource ──instantiate(HostHandle)──▶ PluginInstance
//! ```

mod abi;
mod abi_versions;
mod cache;
mod carve_out;
mod keep_mode;
pub(crate) mod limits;
mod store;
#[cfg(test)]
mod tests;
mod wasi;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

pub use abi::{ComponentReport, SUPPORTED_ABI, check_declarations, check_imports};

use abi_versions::PluginPre;
use cache::{DiskCache, Miss};
use limits::Ticker;
use store::{StoreState, WasmSource};

use crate::instance::PluginSource;

const MIB: u64 = 1024 * 1024;

/// Why a component could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WasmError {
    /// The engine could not be set up.
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
    /// The bytes are not a WebAssembly component (empty, garbage, a core module).
    #[error("plugin `{plugin}` is not a WebAssembly component: {reason}")]
    NotAComponent {
        /// The plugin's name.
        plugin: String,
        /// What the bytes are instead.
        reason: String,
    },
    /// The component is malformed or uses features this engine does not support.
    #[error("plugin `{plugin}` could not be compiled: {message}")]
    Compile {
        /// The plugin's name.
        plugin: String,
        /// The compiler's message.
        message: String,
    },
    /// The component was built against another version of the keel ABI.
    #[error(
        "plugin `{plugin}` was built against keel ABI {found}; this keel hosts ABI {supported}; \
         rebuild it against this keel's keel-sdk and WIT (`keel plugin new` vendors both)"
    )]
    AbiMismatch {
        /// The plugin's name.
        plugin: String,
        /// The ABI version the component declares.
        found: String,
        /// The ABI version this kernel hosts.
        supported: String,
    },
    /// The component does not export the keel plugin interface.
    #[error(
        "plugin `{plugin}` is not a keel plugin: it does not export `{}` \
         (its exports: {}); build it with keel-sdk", abi_versions::PLUGIN_EXPORT_0_4, list(.exports)
    )]
    NotAPlugin {
        /// The plugin's name.
        plugin: String,
        /// What the component exports instead.
        exports: Vec<String>,
    },
    /// The component imports something keel does not provide.
    #[error("plugin `{plugin}` cannot be linked: {message}")]
    Link {
        /// The plugin's name.
        plugin: String,
        /// The linker's message, naming the import.
        message: String,
    },
}

/// "0.1" for "0.1.0": the keel-sdk series that targets an ABI version.
fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Resource limits of one plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WasmLimits {
    /// Cap on the instance's total linear memory, in bytes (default 64 MiB).
    pub memory_bytes: u64,
    /// Guest CPU time one call may use (default 1 s). Time the call spends waiting on the
    /// kernel (another plugin, a model stream) does not count.
    pub cpu: Duration,
}

impl Default for WasmLimits {
    fn default() -> Self {
        WasmLimits {
            memory_bytes: 64 * MIB,
            cpu: Duration::from_secs(1),
        }
    }
}

impl WasmLimits {
    /// These limits with the values a manifest's `[limits]` sets replacing them.
    pub fn with_manifest(self, limits: &crate::manifest::Limits) -> Self {
        WasmLimits {
            memory_bytes: limits
                .memory_mib
                .map_or(self.memory_bytes, |mib| mib.saturating_mul(MIB)),
            cpu: limits.cpu_ms.map_or(self.cpu, Duration::from_millis),
        }
    }
}

/// A host directory a plugin instance sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedDir {
    /// Absolute host path, already resolved by the kernel.
    pub host: PathBuf,
    /// Where the plugin sees it, e.g. `/workspace`.
    pub guest: String,
    /// Whether the plugin may only read.
    pub read_only: bool,
}

/// Everything a plugin instance is granted. The WASI context is built from this and nothing
/// else: no environment, no arguments, no stdin, no sockets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasmGrants {
    /// Preopened directories.
    pub dirs: Vec<GrantedDir>,
    /// Memory and CPU limits.
    pub limits: WasmLimits,
    /// Directories carved out of the preopened ones (keel's home inside a workspace grant):
    /// a path resolving inside one is refused, unless it lies in a preopened directory of its
    /// own (`carve_out`).
    pub hidden: Vec<PathBuf>,
}

/// Settings of the [`WasmHost`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasmHostConfig {
    /// Directory of the compiled-component cache; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// Limits for plugins whose manifest sets none (see [`WasmLimits::with_manifest`]).
    pub default_limits: WasmLimits,
}

/// Where a [`WasmComponent`]'s machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// No cache is configured, or the caller asked to bypass it.
    Disabled,
    /// Loaded from a verified cache entry.
    Hit,
    /// Compiled; there was no entry (one has been written).
    Miss,
    /// Compiled; there was an entry, but it was corrupt, truncated or foreign, so it was
    /// ignored and rewritten.
    Replaced,
    /// Loaded from machine code compiled ahead of time and shipped with keel (the cache is
    /// neither read nor written).
    Shipped,
}

/// A component's machine code compiled ahead of time, shipped inside keel's binary: the
/// zstd-compressed output of `Engine::precompile_component` and the fingerprint of the engine
/// that made it (`keel_engine::fingerprint`). A host whose engine has another fingerprint
/// compiles the component instead.
#[derive(Clone, Copy)]
pub struct Precompiled<'a> {
    engine: [u8; 32],
    packed: &'a [u8],
}

impl fmt::Debug for Precompiled<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Precompiled")
            .field("bytes", &self.packed.len())
            .finish_non_exhaustive()
    }
}

/// A component keel ships in its binary: compressed with zstd, and with its machine code from
/// keel's build when there is any.
#[derive(Clone, Copy)]
pub struct Shipped<'a> {
    /// The component, compressed with zstd.
    pub packed: &'a [u8],
    /// Its machine code, for the engine that made it.
    pub code: Option<Precompiled<'a>>,
    /// The dictionary both were compressed with, if any.
    pub dictionary: Option<&'a zstd::dict::DecoderDictionary<'static>>,
}

impl fmt::Debug for Shipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shipped")
            .field("bytes", &self.packed.len())
            .field("code", &self.code)
            .field("dictionary", &self.dictionary.is_some())
            .finish()
    }
}

/// `packed` unpacked, with the dictionary it was compressed with.
fn unpack(
    packed: &[u8],
    dictionary: Option<&zstd::dict::DecoderDictionary<'static>>,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    match dictionary {
        Some(dictionary) => {
            zstd::stream::read::Decoder::with_prepared_dictionary(packed, dictionary)?
                .read_to_end(&mut out)?;
        }
        None => {
            zstd::stream::read::Decoder::with_buffer(packed)?.read_to_end(&mut out)?;
        }
    }
    Ok(out)
}

impl Shipped<'_> {
    /// The component, unpacked (`plugin` names it in the error).
    pub fn unpack(&self, plugin: &str) -> Result<Vec<u8>, WasmError> {
        unpack(self.packed, self.dictionary).map_err(|e| WasmError::NotAComponent {
            plugin: plugin.to_owned(),
            reason: format!("its packed component does not unpack ({e})"),
        })
    }
}

impl<'a> Precompiled<'a> {
    /// Machine code for a component.
    ///
    /// # Safety
    ///
    /// It is run as machine code: `packed` must be the zstd-compressed output of
    /// `Engine::precompile_component`, for the component it is passed with, by an engine built
    /// from `keel_engine::config()` whose `keel_engine::fingerprint` is `engine`, and it must
    /// come from a source as trusted as keel's own binary (it is meant for what keel's build
    /// compiled and embedded, nothing read at run time).
    #[allow(unsafe_code)]
    pub unsafe fn new(engine: [u8; 32], packed: &'a [u8]) -> Self {
        Precompiled { engine, packed }
    }
}

struct HostInner {
    engine: Engine,
    linker: Linker<StoreState>,
    cache: Option<DiskCache>,
    fingerprint: [u8; 32],
    default_limits: WasmLimits,
    _ticker: Ticker,
}

/// The kernel's WebAssembly host: one engine, one linker, one epoch ticker. Cheap to clone.
///
/// The ticker thread runs while the host, or any component or instance made from it, is alive.
#[derive(Clone)]
pub struct WasmHost {
    inner: Arc<HostInner>,
}

impl fmt::Debug for WasmHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WasmHost")
            .field("cache", &self.inner.cache)
            .field("default_limits", &self.inner.default_limits)
            .finish_non_exhaustive()
    }
}

impl WasmHost {
    /// Set up the engine (component model, epoch interruption, Cranelift optimizing for
    /// speed), the linker with WASI 0.2 and the keel imports, and the epoch ticker.
    pub fn new(config: WasmHostConfig) -> Result<WasmHost, WasmError> {
        Self::with_engine_config(config, |_| {})
    }

    fn with_engine_config(
        config: WasmHostConfig,
        tweak: impl FnOnce(&mut Config),
    ) -> Result<WasmHost, WasmError> {
        let engine_error = |e: wasmtime::Error| WasmError::Engine(format!("{e:#}"));
        let mut engine_config = keel_engine::config();
        tweak(&mut engine_config);
        let engine = Engine::new(&engine_config).map_err(engine_error)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        keep_mode::add_to_linker(&mut linker).map_err(engine_error)?;
        carve_out::add_to_linker(&mut linker).map_err(engine_error)?;
        abi_versions::add_to_linker(&mut linker).map_err(engine_error)?;

        let ticker = Ticker::start(engine.clone())
            .map_err(|e| WasmError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        Ok(WasmHost {
            inner: Arc::new(HostInner {
                fingerprint: keel_engine::fingerprint(&engine),
                engine,
                linker,
                cache: config.cache_dir.and_then(|dir| {
                    DiskCache::open(dir.clone())
                        .map_err(|e| {
                            tracing::warn!(
                                dir = %dir.display(),
                                "the compiled-component cache is off: its key cannot be read or \
                                 made ({e})"
                            );
                        })
                        .ok()
                }),
                default_limits: config.default_limits,
                _ticker: ticker,
            }),
        })
    }

    /// The limits for a plugin: the host's defaults, overridden by its manifest's `[limits]`.
    pub fn limits_for(&self, limits: &crate::manifest::Limits) -> WasmLimits {
        self.inner.default_limits.with_manifest(limits)
    }

    /// Check, compile (or load from the cache) and link the component of `plugin`.
    ///
    /// Compiling takes tens to hundreds of milliseconds of CPU; call it off the async
    /// executor (`tokio::task::spawn_blocking`) when that matters.
    pub fn compile(&self, plugin: &str, bytes: &[u8]) -> Result<WasmComponent, WasmError> {
        self.compile_with(plugin, bytes, true)
    }

    /// A component keel ships: from its machine code when this host's engine is the one that
    /// made it (no compile, no cache), otherwise unpacked and compiled as
    /// [`compile`](Self::compile) does.
    pub fn compile_shipped(
        &self,
        plugin: &str,
        shipped: Shipped<'_>,
    ) -> Result<WasmComponent, WasmError> {
        if let Some(component) = shipped
            .code
            .filter(|code| self.runs(code))
            .and_then(|code| self.deserialize_shipped(plugin, code, shipped.dictionary))
        {
            return self.link(plugin, component, CacheStatus::Shipped);
        }
        self.compile(plugin, &shipped.unpack(plugin)?)
    }

    /// Whether loading `shipped` will compile it (its machine code is not for this engine and
    /// the cache has no entry for it), for a host to say that a first run is compiling.
    pub fn compiles(&self, shipped: &Shipped<'_>) -> bool {
        !shipped.code.is_some_and(|code| self.runs(&code))
            && shipped
                .unpack("")
                .is_ok_and(|bytes| !self.is_compiled(&bytes))
    }

    /// Whether this host can run `precompiled` (its engine made it), so loading it will not
    /// compile.
    pub fn runs(&self, precompiled: &Precompiled<'_>) -> bool {
        precompiled.engine == self.inner.fingerprint
    }

    /// Whether `bytes` have an entry in the compiled-component cache, so a load will not
    /// compile them (the entry is still checked when it is read). For a host to say that a
    /// first run is compiling.
    pub fn is_compiled(&self, bytes: &[u8]) -> bool {
        self.inner.cache.as_ref().is_some_and(|cache| {
            cache
                .path(&cache::key(&self.inner.fingerprint, bytes))
                .exists()
        })
    }

    /// [`compile`](Self::compile) without reading or writing the cache (to measure a cold
    /// compile).
    pub fn compile_uncached(&self, plugin: &str, bytes: &[u8]) -> Result<WasmComponent, WasmError> {
        self.compile_with(plugin, bytes, false)
    }

    /// Instances of `component` with `grants`, for the kernel's lifecycle.
    pub fn source(&self, component: &WasmComponent, grants: WasmGrants) -> Arc<dyn PluginSource> {
        Arc::new(WasmSource {
            component: component.clone(),
            grants,
        })
    }

    fn compile_with(
        &self,
        plugin: &str,
        bytes: &[u8],
        use_cache: bool,
    ) -> Result<WasmComponent, WasmError> {
        abi::precheck(plugin, bytes)?;
        let (component, cache) = self.load(plugin, bytes, use_cache)?;
        self.link(plugin, component, cache)
    }

    /// Check `component`'s ABI and link it as every load does.
    fn link(
        &self,
        plugin: &str,
        component: Component,
        cache: CacheStatus,
    ) -> Result<WasmComponent, WasmError> {
        let report = abi::report(&self.inner.engine, plugin, &component)?;
        let link_error = |e: wasmtime::Error| WasmError::Link {
            plugin: plugin.to_owned(),
            message: format!("{e:#}"),
        };
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(link_error)?;
        let pre = PluginPre::new(pre, &report).map_err(link_error)?;
        Ok(WasmComponent {
            inner: Arc::new(ComponentInner {
                plugin: plugin.to_owned(),
                pre,
                report,
                cache,
                host: Arc::clone(&self.inner),
            }),
        })
    }

    fn build(&self, plugin: &str, bytes: &[u8]) -> Result<Component, WasmError> {
        Component::new(&self.inner.engine, bytes).map_err(|e| WasmError::Compile {
            plugin: plugin.to_owned(),
            message: format!("{e:#}"),
        })
    }

    /// The component in `code`, or `None` (logged) when it cannot be used, so the caller
    /// compiles instead.
    fn deserialize_shipped(
        &self,
        plugin: &str,
        code: Precompiled<'_>,
        dictionary: Option<&zstd::dict::DecoderDictionary<'static>>,
    ) -> Option<Component> {
        let unpacked = match unpack(code.packed, dictionary) {
            Ok(unpacked) => unpacked,
            Err(e) => {
                tracing::warn!(
                    plugin,
                    "cannot unpack its shipped machine code ({e}); compiling"
                );
                return None;
            }
        };
        // SAFETY: `Precompiled::new`'s contract: these are wasmtime's own artifact for this
        // component, made by an engine with this host's fingerprint (checked by the caller),
        // embedded in keel's binary. wasmtime checks its header, the engine's settings and the
        // CPU's features again and refuses a mismatch.
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize(&self.inner.engine, &unpacked) };
        loaded
            .map_err(|e| {
                tracing::warn!(
                    plugin,
                    "wasmtime refused its shipped machine code ({e:#}); compiling"
                );
            })
            .ok()
    }

    /// The compiled component, from the cache when allowed and valid.
    fn load(
        &self,
        plugin: &str,
        bytes: &[u8],
        use_cache: bool,
    ) -> Result<(Component, CacheStatus), WasmError> {
        let Some(cache) = self.inner.cache.as_ref().filter(|_| use_cache) else {
            return Ok((self.build(plugin, bytes)?, CacheStatus::Disabled));
        };
        let key = cache::key(&self.inner.fingerprint, bytes);
        let path = cache.path(&key);
        let status = match cache.read(&key) {
            Ok(payload) => {
                // SAFETY: `Component::deserialize` requires bytes produced by
                // `Component::serialize` of a compatible engine; anything else may be
                // executed as machine code. The payload passed every check first: the entry
                // is named by, and its header repeats, a key that covers the component's
                // sha256, this engine's compatibility hash and the wasmtime version, and the
                // payload carries an HMAC under the cache's secret key, which only keel
                // writing this entry could compute, so it is the unmodified output of
                // `serialize` for these bytes and this engine (wasmtime additionally checks
                // its own header and engine settings). A plugin able to write into the cache
                // directory cannot forge it; the key file is in keel's sealed home.
                #[allow(unsafe_code)]
                let loaded = unsafe { Component::deserialize(&self.inner.engine, &payload) };
                match loaded {
                    Ok(component) => return Ok((component, CacheStatus::Hit)),
                    Err(e) => {
                        tracing::warn!(
                            plugin,
                            path = %path.display(),
                            "ignoring a compiled-component cache entry wasmtime refused ({e:#}); recompiling"
                        );
                        CacheStatus::Replaced
                    }
                }
            }
            Err(Miss::Absent) => CacheStatus::Miss,
            Err(Miss::Rejected(why)) => {
                tracing::warn!(
                    plugin,
                    path = %path.display(),
                    "ignoring a compiled-component cache entry: {why}; recompiling"
                );
                CacheStatus::Replaced
            }
        };
        let component = self.build(plugin, bytes)?;
        let written = component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|payload| cache.write(&key, &payload).map_err(|e| e.to_string()));
        if let Err(e) = written {
            tracing::warn!(
                plugin,
                path = %path.display(),
                "cannot write the compiled-component cache ({e}); the plugin still loads"
            );
        }
        Ok((component, status))
    }
}

/// Read what a component declares, checking that it is a keel plugin of the ABI this kernel
/// hosts (the component is compiled, or loaded from the cache, to read its type). For
/// `keel plugin check`, pass the report to [`check_imports`].
pub fn inspect_component(
    host: &WasmHost,
    plugin: &str,
    bytes: &[u8],
) -> Result<ComponentReport, WasmError> {
    abi::precheck(plugin, bytes)?;
    let (component, _) = host.load(plugin, bytes, true)?;
    let mut report = abi::report(&host.inner.engine, plugin, &component)?;
    // Linked exactly as a load links it, so a check that passes means the load links too.
    if let Err(e) = host
        .inner
        .linker
        .instantiate_pre(&component)
        .and_then(|pre| PluginPre::new(pre, &report))
    {
        report.link_error = Some(format!("{e:#}"));
    }
    Ok(report)
}

/// Instantiate `bytes` as a load would (the same linker, the default CPU and memory bounds),
/// with nothing granted, no kernel behind its imports (every call answers that the kernel is
/// gone) and without activating it; `Err` says why an instance could not be made. Finding an
/// export does not check its types: an instance does, as it loads each export's functions, so
/// this is what finds a typed service export of another shape than keel's WIT, which
/// [`inspect_component`] passes and a load would refuse (`keel plugin check`). It runs the
/// component's instantiation code (start functions), bounded as a load bounds it.
pub async fn check_instantiation(
    host: &WasmHost,
    plugin: &str,
    bytes: &[u8],
) -> Result<(), String> {
    let component = host.compile(plugin, bytes).map_err(|e| e.to_string())?;
    let nothing = WasmGrants {
        limits: host.inner.default_limits,
        ..WasmGrants::default()
    };
    let source = host.source(&component, nothing);
    let detached = crate::HostHandle::new(std::sync::Weak::new(), plugin, 0);
    source
        .instantiate(detached)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

struct ComponentInner {
    plugin: String,
    pre: PluginPre,
    report: ComponentReport,
    cache: CacheStatus,
    host: Arc<HostInner>,
}

/// A compiled, ABI-checked and linked component, ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct WasmComponent {
    inner: Arc<ComponentInner>,
}

impl fmt::Debug for WasmComponent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WasmComponent")
            .field("plugin", &self.inner.plugin)
            .field("abi", &self.inner.report.abi_version)
            .field("cache", &self.inner.cache)
            .finish_non_exhaustive()
    }
}

impl WasmComponent {
    /// The plugin name it was compiled under.
    pub fn plugin(&self) -> &str {
        &self.inner.plugin
    }

    /// Its ABI version, imports and exports.
    pub fn report(&self) -> &ComponentReport {
        &self.inner.report
    }

    /// Whether its machine code came from the cache.
    pub fn cache_status(&self) -> CacheStatus {
        self.inner.cache
    }

    fn engine(&self) -> &Engine {
        &self.inner.host.engine
    }

    fn pre(&self) -> &PluginPre {
        &self.inner.pre
    }
}
