//! The C ABI a native plugin library implements, version [`NATIVE_ABI_VERSION`]: the
//! `#[repr(C)]` types that cross the boundary, the exported symbols' signatures, and the
//! version check. The JSON carried by the buffers is described in [`super::protocol`].

use std::ffi::c_void;
use std::path::Path;

use super::NativeError;

/// The native ABI version this kernel hosts. A library whose `keel_native_abi_version()`
/// returns anything else is refused, naming both versions.
pub const NATIVE_ABI_VERSION: u32 = 1;

/// A byte buffer handed across the boundary: `len` bytes at `ptr`. Whoever allocated it frees
/// it: buffers the plugin returns go back through the library's `keel_native_free`, buffers
/// the kernel returns go back through [`KeelHostApi::free`]. A null `ptr` means "no buffer".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KeelBuf {
    /// First byte, or null.
    pub ptr: *mut u8,
    /// Number of bytes.
    pub len: usize,
}

impl KeelBuf {
    /// A buffer owned by the kernel's allocator, released by [`host_free`].
    pub(crate) fn from_host(bytes: Vec<u8>) -> KeelBuf {
        let boxed = bytes.into_boxed_slice();
        let len = boxed.len();
        KeelBuf {
            ptr: Box::into_raw(boxed).cast::<u8>(),
            len,
        }
    }
}

/// The table the kernel hands to `keel_native_create`: the plugin's only door into the
/// kernel. It stays valid (pointer and `ctx`) until `keel_native_destroy` returns for the
/// instance it was given to; calls through it must not be made after that.
#[repr(C)]
#[derive(Debug)]
pub struct KeelHostApi {
    /// Opaque kernel context; pass it back as the first argument of `call`.
    pub ctx: *mut c_void,
    /// Send one JSON request (`req_len` bytes at `req_ptr`); returns the JSON answer, which
    /// the plugin must release with `free`. Never returns a null buffer and never unwinds.
    pub call: unsafe extern "C" fn(ctx: *mut c_void, req_ptr: *const u8, req_len: usize) -> KeelBuf,
    /// Release a buffer returned by `call`, exactly once.
    pub free: unsafe extern "C" fn(buf: KeelBuf),
}

/// `uint32_t keel_native_abi_version(void)`.
pub(crate) type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// `void *keel_native_create(const KeelHostApi *host)`; null means "could not create".
pub(crate) type CreateFn = unsafe extern "C" fn(host: *const KeelHostApi) -> *mut c_void;
/// `void keel_native_destroy(void *instance)`.
pub(crate) type DestroyFn = unsafe extern "C" fn(instance: *mut c_void);
/// `KeelBuf keel_native_call(void *instance, const uint8_t *req_ptr, size_t req_len)`.
pub(crate) type CallFn =
    unsafe extern "C" fn(instance: *mut c_void, req_ptr: *const u8, req_len: usize) -> KeelBuf;
/// `void keel_native_free(KeelBuf buf)`.
pub(crate) type FreeFn = unsafe extern "C" fn(buf: KeelBuf);

/// Exported symbol names, in the order they are looked up.
pub(crate) const SYM_ABI_VERSION: &str = "keel_native_abi_version";
pub(crate) const SYM_CREATE: &str = "keel_native_create";
pub(crate) const SYM_DESTROY: &str = "keel_native_destroy";
pub(crate) const SYM_CALL: &str = "keel_native_call";
pub(crate) const SYM_FREE: &str = "keel_native_free";

/// Refuse a library built for another ABI version, naming the plugin, the file and both
/// versions.
pub(crate) fn check_abi_version(plugin: &str, file: &Path, found: u32) -> Result<(), NativeError> {
    if found == NATIVE_ABI_VERSION {
        Ok(())
    } else {
        Err(NativeError::AbiMismatch {
            plugin: plugin.to_owned(),
            file: file.to_owned(),
            found,
            supported: NATIVE_ABI_VERSION,
        })
    }
}

/// `KeelHostApi::free`: release a buffer the kernel's `call` returned.
///
/// # Safety
///
/// `buf` must be a buffer returned by [`KeelHostApi::call`] (made by [`KeelBuf::from_host`])
/// and not released before; a null `ptr` is ignored.
pub(crate) unsafe extern "C" fn host_free(buf: KeelBuf) {
    if buf.ptr.is_null() {
        return;
    }
    let slice = std::ptr::slice_from_raw_parts_mut(buf.ptr, buf.len);
    // SAFETY: per this function's contract `buf` is exactly the `Box<[u8]>` of `len` bytes
    // that `KeelBuf::from_host` leaked, handed back once; rebuilding and dropping it frees it
    // with the allocator that made it.
    drop(unsafe { Box::from_raw(slice) });
}
