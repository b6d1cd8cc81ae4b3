//! The kernel's side of [`KeelHostApi`]: the callback a native plugin calls, which decodes a
//! JSON [`HostRequest`] and ends in the matching [`HostHandle`] method, so a native plugin
//! changes the environment only through the same API (and undo log) as a WebAssembly one.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use super::abi::{KeelBuf, KeelHostApi, host_free};
use super::protocol::{HostRequest, host_reply};
use crate::call_chain::CallChain;
use crate::host_api::HostHandle;
use crate::types::KernelError;

/// What `KeelHostApi::ctx` points at: the instance's handle on the kernel and the runtime
/// that drives its async calls.
pub(crate) struct HostCtx {
    handle: Mutex<HostHandle>,
    runtime: tokio::runtime::Handle,
}

/// The callback table as handed to the plugin.
struct ApiTable(KeelHostApi);

// SAFETY: the table holds two function pointers and `ctx`, a pointer to a `HostCtx` (which is
// `Send + Sync`: a mutex and a runtime handle) that the owning `HostDoor` keeps alive. The
// kernel never writes through any of them, so sharing the table between threads is sound.
unsafe impl Send for ApiTable {}
// SAFETY: as above; the table is immutable after construction.
unsafe impl Sync for ApiTable {}

/// A plugin instance's door into the kernel: the context and the table that points at it.
/// Both live (behind `Arc`s, which never move their contents) as long as the door.
pub(crate) struct HostDoor {
    ctx: Arc<HostCtx>,
    api: Arc<ApiTable>,
}

impl HostDoor {
    /// A door for `handle`, whose async calls run on `runtime`.
    pub(crate) fn new(handle: HostHandle, runtime: tokio::runtime::Handle) -> Self {
        let ctx = Arc::new(HostCtx {
            handle: Mutex::new(handle),
            runtime,
        });
        let api = Arc::new(ApiTable(KeelHostApi {
            ctx: Arc::as_ptr(&ctx).cast_mut().cast::<c_void>(),
            call: host_call,
            free: host_free,
        }));
        HostDoor { ctx, api }
    }

    /// The table to hand to `keel_native_create`; valid while this door lives.
    pub(crate) fn api(&self) -> *const KeelHostApi {
        &self.api.0
    }

    /// Set the call chain the plugin's requests carry from now on.
    pub(crate) fn enter(&self, chain: &CallChain) {
        self.ctx
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .enter(chain);
    }
}

impl HostCtx {
    /// Answer one request (JSON bytes) with a JSON reply.
    pub(crate) fn serve(&self, request: &[u8]) -> Vec<u8> {
        let request: HostRequest = match serde_json::from_slice(request) {
            Ok(r) => r,
            Err(e) => {
                return host_reply(Err(KernelError::Invalid(format!(
                    "the native host request is not valid: {e}; send a JSON object such as \
                     {{\"op\":\"log\",\"level\":\"info\",\"message\":\"hi\"}} with one of the ops \
                     log, provide, call, register_tool, subscribe, emit, add_prompt_fragment, \
                     state_get, state_set, state_remove, state_keys (see docs/native-plugins.md)"
                ))));
            }
        };
        // A clone, so the lock is not held while a `call` waits on another plugin.
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        host_reply(self.dispatch(&handle, request))
    }

    fn dispatch(&self, host: &HostHandle, request: HostRequest) -> Result<Value, KernelError> {
        match request {
            HostRequest::Log { level, message } => {
                host.log(level, &message);
                Ok(Value::Null)
            }
            HostRequest::Provide { name, version } => {
                host.provide(&name, &version).map(|()| Value::Null)
            }
            HostRequest::Call {
                service,
                method,
                payload,
            } => self
                .runtime
                .block_on(host.call(&service, &method, &payload))
                .map(Value::String),
            HostRequest::RegisterTool { spec } => host.register_tool(spec).map(|()| Value::Null),
            HostRequest::Subscribe { topic } => host.subscribe(&topic).map(|()| Value::Null),
            HostRequest::Emit { topic, payload } => {
                host.emit(&topic, &payload).map(|()| Value::Null)
            }
            HostRequest::AddPromptFragment { id, text } => {
                host.add_prompt_fragment(&id, &text).map(|()| Value::Null)
            }
            HostRequest::StateGet { key } => {
                Ok(host.state_get(&key).map_or(Value::Null, Value::from))
            }
            HostRequest::StateSet { key, value } => {
                host.state_set(&key, value).map(|()| Value::Null)
            }
            HostRequest::StateRemove { key } => {
                host.state_remove(&key);
                Ok(Value::Null)
            }
            HostRequest::StateKeys => Ok(Value::from(host.state_keys())),
        }
    }
}

/// `KeelHostApi::call`. Never unwinds into the plugin: a panic while serving becomes an
/// `{"err":{"kind":"failed",..}}` answer.
///
/// # Safety
///
/// `ctx` must be the `ctx` of a table this kernel handed out, used before the instance it was
/// handed to is destroyed; `req_ptr` must point at `req_len` readable bytes (or be null with
/// `req_len` 0) for the duration of the call.
pub(crate) unsafe extern "C" fn host_call(
    ctx: *mut c_void,
    req_ptr: *const u8,
    req_len: usize,
) -> KeelBuf {
    let answer = catch_unwind(AssertUnwindSafe(|| {
        if ctx.is_null() {
            return host_reply(Err(KernelError::Invalid(
                "null ctx; pass the `ctx` field of the KeelHostApi the kernel gave you".into(),
            )));
        }
        let request: &[u8] = if req_len == 0 {
            &[]
        } else if req_ptr.is_null() || req_len > isize::MAX as usize {
            return host_reply(Err(KernelError::Invalid(format!(
                "request buffer is null or too large ({req_len} bytes); pass a pointer to the JSON request and its length"
            ))));
        } else {
            // SAFETY: non-null and within `isize::MAX`; the caller guarantees `req_len`
            // readable bytes at `req_ptr` for the duration of this call, and we copy out of
            // them (in `serve`) before returning.
            unsafe { std::slice::from_raw_parts(req_ptr, req_len) }
        };
        // SAFETY: `ctx` is `Arc::as_ptr` of the `HostCtx` of a live `HostDoor` (the caller
        // guarantees the instance has not been destroyed, and the door outlives `destroy`).
        // Only a shared reference is made; `HostCtx` is `Sync`.
        let ctx = unsafe { &*ctx.cast_const().cast::<HostCtx>() };
        ctx.serve(request)
    }));
    let bytes = answer.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        host_reply(Err(KernelError::Failed(format!(
            "the kernel panicked while serving this request: {what}"
        ))))
    });
    KeelBuf::from_host(bytes)
}
