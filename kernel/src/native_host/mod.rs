//! The native host: trusted plugins as shared libraries (libloading), behind the same
//! [`PluginSource`] / [`PluginInstance`](crate::PluginInstance) contract and the same [`HostHandle`](crate::HostHandle)
//! door as WebAssembly plugins, so their effects land in the same undo log.
//!
//! A native plugin runs with the user's full rights: nothing confines it. [`open`] therefore
//! refuses every library whose plugin the user has not trusted by name, and every manifest
//! that asks for confinement keel cannot give native code (`[limits]`, directory or network
//! capabilities).
//!
//! # The C ABI, version 1 ([`NATIVE_ABI_VERSION`])
//!
//! ```c
//! typedef struct { uint8_t *ptr; size_t len; } KeelBuf;   /* ptr == NULL: no buffer */
//! typedef struct {
//!     void   *ctx;                                          /* pass back to call */
//!     KeelBuf (*call)(void *ctx, const uint8_t *req_ptr, size_t req_len);
//!     void    (*free)(KeelBuf buf);                         /* for buffers call returned */
//! } KeelHostApi;
//!
//! uint32_t keel_native_abi_version(void);                   /* must return 1 */
//! void    *keel_native_create(const KeelHostApi *host);     /* NULL: failed */
//! void     keel_native_destroy(void *instance);
//! KeelBuf  keel_native_call(void *instance, const uint8_t *req_ptr, size_t req_len);
//! void     keel_native_free(KeelBuf buf);                   /* for buffers call returned */
//! ```
//!
//! - The version is read first; any other value is refused, naming both versions.
//! - Memory is freed by the allocator that made it: the kernel releases every
//!   `keel_native_call` answer with `keel_native_free`; the plugin releases every
//!   `KeelHostApi.call` answer with `KeelHostApi.free`. Request buffers are only borrowed for
//!   the duration of the call.
//! - `host` (the table and its `ctx`) stays valid until `keel_native_destroy` returns; the
//!   plugin must not use it afterwards, and must stop any thread of its own before returning
//!   from `keel_native_destroy`.
//! - Calls into one instance never overlap, but may come from different threads. A plugin
//!   must not unwind out of an exported function (Rust: `extern "C"` aborts on panic).
//! - `KeelHostApi.call` never unwinds and never returns a null buffer. Requests that wait on
//!   another plugin (`call`) must be made from inside a `keel_native_call`.
//!
//! Kernel → plugin (`keel_native_call`), answered `{"ok": <string or null>}` or
//! `{"err": "<message>"}`; `handle_call` and `invoke_tool` must answer with a string:
//!
//! ```json
//! {"op":"activate","config":"<JSON object as text>"}
//! {"op":"deactivate"}
//! {"op":"handle_call","service":"..","method":"..","payload":".."}
//! {"op":"invoke_tool","name":"..","input":".."}
//! {"op":"on_event","event":{"topic":"..","source":"..","payload":".."}}
//! ```
//!
//! Plugin → kernel (`KeelHostApi.call`), one per WIT kernel import, answered `{"ok": ...}` or
//! `{"err": {"kind": "invalid|conflict|denied|unavailable|failed", "message": ".."}}`. State
//! values are JSON arrays of byte values (`[104,105]`):
//!
//! ```json
//! {"op":"log","level":"trace|debug|info|warn|error","message":".."}      → null
//! {"op":"provide","name":"..","version":"1.0.0"}                        → null
//! {"op":"call","service":"..","method":"..","payload":".."}             → "<result>"
//! {"op":"register_tool","spec":{"name":"..","description":"..","input_schema":"<JSON Schema text>",
//!   "capabilities":{"reads_files":false,"writes_files":false,"executes_code":false,"network":false},
//!   "parallel_safe":true}}                                              → null
//! {"op":"subscribe","topic":".."}                                       → null
//! {"op":"emit","topic":"..","payload":".."}                             → null
//! {"op":"add_prompt_fragment","id":"..","text":".."}                   → null
//! {"op":"state_get","key":".."}                                         → [bytes] or null
//! {"op":"state_set","key":"..","value":[bytes]}                         → null
//! {"op":"state_remove","key":".."}                                      → null
//! {"op":"state_keys"}                                                   → ["key", ...]
//! ```
//!
//! Each request ends in the matching [`HostHandle`](crate::HostHandle) method. Every kernel call
//! into the plugin runs on tokio's blocking pool, with the handle's call chain set first, so
//! re-entrant calls are refused exactly as for WebAssembly plugins.
//!
//! `docs/native-plugins.md` is the guide for plugin authors.

// This module is the one place in the kernel that may use `unsafe`: loading a shared library
// and calling across a C ABI cannot be expressed in safe Rust. Each unsafe block is small and
// says why it is sound.
#![allow(unsafe_code)]

mod abi;
mod host_calls;
mod instance;
mod library;
mod protocol;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use abi::{KeelBuf, KeelHostApi, NATIVE_ABI_VERSION};

use library::{Library, NativeSource};

use crate::instance::PluginSource;
use crate::manifest::{Manifest, PluginKind};

/// Why a native plugin library was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NativeError {
    /// The manifest is not `kind = "native"`.
    #[error(
        "plugin `{plugin}` is a {kind} plugin, not a native one ({}); load it with the WebAssembly host, or set `kind = \"native\"` if it is a shared library",
        .file.display()
    )]
    NotNative {
        /// The plugin's name.
        plugin: String,
        /// The file that was to be loaded.
        file: PathBuf,
        /// The manifest's kind.
        kind: PluginKind,
    },
    /// The user has not trusted this plugin.
    #[error(
        "native plugin `{plugin}` runs with your full user rights; to trust it add `native = [\"{plugin}\"]` under [trust] in ~/.keel/config.toml (library: {})",
        .file.display()
    )]
    Untrusted {
        /// The plugin's name.
        plugin: String,
        /// The library that was not loaded.
        file: PathBuf,
    },
    /// The manifest asks for confinement that keel cannot enforce on native code.
    #[error(
        "native plugin `{plugin}` ({}) declares {what}, which keel cannot enforce on native code (it runs with your full user rights); remove it from its keel.toml, or build the plugin as a WebAssembly component to be confined",
        .file.display()
    )]
    Unenforceable {
        /// The plugin's name.
        plugin: String,
        /// The library that was not loaded.
        file: PathBuf,
        /// What the manifest declares (`[limits]`, `capabilities.dirs`, ...).
        what: String,
    },
    /// The library could not be loaded at all.
    #[error("native plugin `{plugin}`: cannot load {}: {reason}", .file.display())]
    Load {
        /// The plugin's name.
        plugin: String,
        /// The library.
        file: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The file changed since this process loaded a library from the same path; loading it
    /// again would run the old code.
    #[error(
        "native plugin `{plugin}`: {} has changed since keel loaded it, and a shared library cannot be loaded again from the same path (the old code would run); install the new build under a new file name, or restart keel",
        .file.display()
    )]
    Changed {
        /// The plugin's name.
        plugin: String,
        /// The library.
        file: PathBuf,
    },
    /// The library does not export an entry point of the native ABI.
    #[error(
        "native plugin `{plugin}`: {} is not a keel native plugin: it does not export `{symbol}` ({reason}); see docs/native-plugins.md",
        .file.display()
    )]
    NotAPlugin {
        /// The plugin's name.
        plugin: String,
        /// The library.
        file: PathBuf,
        /// The missing symbol.
        symbol: String,
        /// The loader's message.
        reason: String,
    },
    /// The library was built for another version of the native ABI.
    #[error(
        "native plugin `{plugin}` ({}) was built for keel native ABI version {found}; this keel hosts version {supported}; rebuild it against version {supported}",
        .file.display()
    )]
    AbiMismatch {
        /// The plugin's name.
        plugin: String,
        /// The library.
        file: PathBuf,
        /// The version the library reports.
        found: u32,
        /// The version this kernel hosts ([`NATIVE_ABI_VERSION`]).
        supported: u32,
    },
}

/// Load the native plugin `manifest` describes from `library`, if the user trusts it.
///
/// Refused, before the library is touched, unless `manifest.kind` is native, `manifest.name`
/// is in `trusted` (the `native` list under `[trust]` in the user's config) and the manifest
/// asks for no confinement keel cannot enforce on native code. Then the library is loaded, its
/// ABI version checked and its entry points resolved. The returned source makes
/// [`PluginInstance`](crate::PluginInstance)s whose only door into the kernel is their [`HostHandle`](crate::HostHandle).
///
/// The dynamic loader does not read a path again once a library was loaded from it, so a
/// library file that changed since this process loaded it is refused ([`NativeError::Changed`]):
/// give each build of a plugin its own file name to reload new code.
pub fn open(
    manifest: &Manifest,
    library: &Path,
    trusted: &BTreeSet<String>,
) -> Result<Arc<dyn PluginSource>, NativeError> {
    let plugin = manifest.name.clone();
    if manifest.kind != PluginKind::Native {
        return Err(NativeError::NotNative {
            plugin,
            file: library.to_owned(),
            kind: manifest.kind,
        });
    }
    if !trusted.contains(&plugin) {
        return Err(NativeError::Untrusted {
            plugin,
            file: library.to_owned(),
        });
    }
    if let Some(what) = unenforceable(manifest) {
        return Err(NativeError::Unenforceable {
            plugin,
            file: library.to_owned(),
            what,
        });
    }
    // An absolute path, so the dynamic loader loads this file and never searches for a name.
    let file = std::fs::canonicalize(library).map_err(|e| NativeError::Load {
        plugin: plugin.clone(),
        file: library.to_owned(),
        reason: e.to_string(),
    })?;
    let library = Library::load(&plugin, &file)?;
    Ok(Arc::new(NativeSource {
        library: Arc::new(library),
    }))
}

/// What `manifest` asks for that keel cannot enforce on native code, if anything. (`exec`
/// stays allowed: running commands goes through the kernel, which can enforce it.)
fn unenforceable(manifest: &Manifest) -> Option<String> {
    let mut what = Vec::new();
    if manifest.limits.memory_mib.is_some() {
        what.push("`limits.memory-mib`");
    }
    if manifest.limits.cpu_ms.is_some() {
        what.push("`limits.cpu-ms`");
    }
    if !manifest.capabilities.dirs.is_empty() {
        what.push("`capabilities.dirs`");
    }
    if !manifest.capabilities.network.is_empty() {
        what.push("`capabilities.network`");
    }
    (!what.is_empty()).then(|| what.join(", "))
}
