//! A loaded native plugin library: its five entry points, resolved once after the ABI version
//! check, and the [`PluginSource`] that makes instances of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;

use super::NativeError;
use super::abi::{
    AbiVersionFn, CallFn, CreateFn, DestroyFn, FreeFn, KeelBuf, SYM_ABI_VERSION, SYM_CALL,
    SYM_CREATE, SYM_DESTROY, SYM_FREE, check_abi_version,
};
use super::host_calls::HostDoor;
use super::instance::{InstancePtr, Live, NativeInstance};
use crate::host_api::HostHandle;
use crate::instance::{InstanceError, PluginInstance, PluginSource};

/// An opened library and its entry points. The function pointers are valid while `_library`
/// is loaded, which is as long as this value lives (it is dropped last).
pub(crate) struct Library {
    pub(crate) plugin: String,
    pub(crate) file: PathBuf,
    pub(crate) create: CreateFn,
    pub(crate) destroy: DestroyFn,
    pub(crate) call: CallFn,
    pub(crate) free: FreeFn,
    _library: libloading::Library,
}

impl Library {
    /// Load `file` (already canonical) for `plugin`, check its ABI version, resolve its
    /// entry points. The caller has checked that the user trusts the plugin.
    pub(crate) fn load(plugin: &str, file: &Path) -> Result<Library, NativeError> {
        let id = FileId::of(file).map_err(|e| NativeError::Load {
            plugin: plugin.to_owned(),
            file: file.to_owned(),
            reason: e.to_string(),
        })?;
        if !unchanged_since_loaded(file, &id) {
            return Err(NativeError::Changed {
                plugin: plugin.to_owned(),
                file: file.to_owned(),
            });
        }
        // SAFETY: loading a library runs its initializers with the user's full rights. That is
        // what the user consented to by trusting this plugin by name (checked by `open` before
        // this runs); the path is absolute, so the dynamic loader's search path cannot
        // substitute another library.
        let library = unsafe { libloading::Library::new(file) }.map_err(|e| NativeError::Load {
            plugin: plugin.to_owned(),
            file: file.to_owned(),
            reason: e.to_string(),
        })?;
        remember_loaded(file, id);
        let abi_version: AbiVersionFn = symbol(&library, plugin, file, SYM_ABI_VERSION)?;
        // SAFETY: ABI version 1 and every later version declare this symbol as
        // `uint32_t keel_native_abi_version(void)` with no preconditions; it is the one symbol
        // whose signature does not depend on the version.
        let found = unsafe { abi_version() };
        check_abi_version(plugin, file, found)?;
        Ok(Library {
            plugin: plugin.to_owned(),
            file: file.to_owned(),
            create: symbol(&library, plugin, file, SYM_CREATE)?,
            destroy: symbol(&library, plugin, file, SYM_DESTROY)?,
            call: symbol(&library, plugin, file, SYM_CALL)?,
            free: symbol(&library, plugin, file, SYM_FREE)?,
            _library: library,
        })
    }

    /// Copy a buffer the library returned and release it with the library's own `free`.
    pub(crate) fn take(&self, buf: KeelBuf, op: &str) -> Result<Vec<u8>, InstanceError> {
        if buf.ptr.is_null() {
            return Err(self.host_error(
                op,
                "returned a null buffer; every call must be answered with JSON",
            ));
        }
        let bytes = if buf.len > isize::MAX as usize {
            Err(self.host_error(
                op,
                &format!("returned a buffer of impossible length {}", buf.len),
            ))
        } else {
            // SAFETY: non-null, length within `isize::MAX`; the ABI says a buffer returned by
            // `keel_native_call` holds `len` initialized bytes owned by the library until it is
            // passed to `keel_native_free`, which happens only below, after the copy.
            Ok(unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }.to_vec())
        };
        // SAFETY: `buf` came from this library's `keel_native_call` and is released exactly
        // once, here, by the allocator that made it.
        unsafe { (self.free)(buf) };
        bytes
    }

    /// `InstanceError::Host` naming the plugin, the file and the operation.
    pub(crate) fn host_error(&self, op: &str, what: &str) -> InstanceError {
        InstanceError::Host(format!(
            "native plugin `{}` ({}): `{op}` {what}",
            self.plugin,
            self.file.display()
        ))
    }
}

/// What a library file was when this process first loaded it from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileId {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode, where the platform has them.
    node: Option<(u64, u64)>,
}

impl FileId {
    pub(crate) fn of(file: &Path) -> std::io::Result<FileId> {
        let meta = std::fs::metadata(file)?;
        #[cfg(unix)]
        let node = {
            use std::os::unix::fs::MetadataExt;
            Some((meta.dev(), meta.ino()))
        };
        #[cfg(not(unix))]
        let node = None;
        Ok(FileId {
            len: meta.len(),
            modified: meta.modified().ok(),
            node,
        })
    }
}

/// Every library path this process has loaded, with the file as it was then. The dynamic
/// loader hands back an already-loaded library when asked for the same path again (and may
/// never really unload one), so a rebuilt file at a known path would silently run the old
/// code; such a load is refused instead.
static LOADED: Mutex<BTreeMap<PathBuf, FileId>> = Mutex::new(BTreeMap::new());

/// Whether `file` is new to this process or still the file it loaded from that path.
pub(crate) fn unchanged_since_loaded(file: &Path, id: &FileId) -> bool {
    let loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    loaded.get(file).is_none_or(|first| first == id)
}

/// Record that `file` (as `id`) is loaded into this process; the first record stays.
pub(crate) fn remember_loaded(file: &Path, id: FileId) {
    LOADED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(file.to_owned())
        .or_insert(id);
}

/// Look up `name` as a `T` (one of the ABI's function pointer types).
fn symbol<T: Copy>(
    library: &libloading::Library,
    plugin: &str,
    file: &Path,
    name: &str,
) -> Result<T, NativeError> {
    // SAFETY: `T` is the function pointer type ABI version 1 declares for `name`, and the
    // library has just declared (through `keel_native_abi_version`) that it implements that
    // version. The pointer is copied out of the `Symbol` and used only while `library` stays
    // loaded: `Library` keeps them together.
    let found = unsafe { library.get::<T>(name.as_bytes()) };
    found.map(|s| *s).map_err(|e| NativeError::NotAPlugin {
        plugin: plugin.to_owned(),
        file: file.to_owned(),
        symbol: name.to_owned(),
        reason: e.to_string(),
    })
}

/// Makes instances of a loaded native library.
pub(crate) struct NativeSource {
    pub(crate) library: Arc<Library>,
}

#[async_trait]
impl PluginSource for NativeSource {
    async fn instantiate(
        &self,
        host: HostHandle,
    ) -> Result<Box<dyn PluginInstance>, InstanceError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            self.library
                .host_error("create", &format!("needs a tokio runtime: {e}"))
        })?;
        let door = HostDoor::new(host, runtime);
        let library = self.library.clone();
        let live = tokio::task::spawn_blocking(move || {
            // SAFETY: `door.api()` points at a table that lives as long as `door`, which the
            // returned `Live` owns and drops only after `keel_native_destroy` has returned.
            let instance = unsafe { (library.create)(door.api()) };
            if instance.is_null() {
                return Err(library.host_error(
                    "create",
                    "returned null; the library could not make an instance",
                ));
            }
            Ok(Live::new(library, InstancePtr(instance), door))
        })
        .await
        .map_err(|e| {
            self.library
                .host_error("create", &format!("did not return: {e}"))
        })??;
        Ok(Box::new(NativeInstance::new(live)))
    }
}
