//! One instance of a native plugin: every kernel call becomes a JSON request run through
//! `keel_native_call` on a blocking thread, one at a time.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use super::host_calls::HostDoor;
use super::library::Library;
use super::protocol::{PluginRequest, PluginResponse, RESPONSE_SHAPE};
use crate::call_chain::CallChain;
use crate::instance::{InstanceError, PluginInstance};
use crate::types::Event;

/// The opaque instance pointer `keel_native_create` returned.
pub(crate) struct InstancePtr(pub(crate) *mut c_void);

// SAFETY: the ABI requires an instance to be usable from any thread, one call at a time
// (native calls run on tokio's blocking pool, so consecutive calls land on different
// threads). `Live` keeps the pointer behind a mutex, which provides the "one at a time".
unsafe impl Send for InstancePtr {}

/// Everything a running instance needs, shared with the blocking thread of an in-flight call
/// (which may outlive a cancelled caller).
pub(crate) struct Live {
    library: Arc<Library>,
    instance: Mutex<InstancePtr>,
    door: HostDoor,
}

impl Live {
    pub(crate) fn new(library: Arc<Library>, instance: InstancePtr, door: HostDoor) -> Self {
        Live {
            library,
            instance: Mutex::new(instance),
            door,
        }
    }

    /// Run one request through `keel_native_call`; blocks. Calls are serialized by the
    /// instance mutex even if a cancelled call is still running when the next one starts.
    fn call(&self, request: &[u8], op: &str) -> Result<Vec<u8>, InstanceError> {
        let instance = self.instance.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `instance.0` came from this library's `keel_native_create` and is destroyed
        // only when `Live` is dropped, so it is live; the guard makes this the only call on it;
        // `request` is valid for the whole call.
        let buf = unsafe { (self.library.call)(instance.0, request.as_ptr(), request.len()) };
        drop(instance);
        self.library.take(buf, op)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let instance = self
            .instance
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        // SAFETY: the instance came from this library's `keel_native_create`; dropping `Live`
        // happens once and with no call in flight (every call holds an `Arc<Live>`), so it is
        // destroyed exactly once. The library and the host door are fields, dropped only after
        // this returns.
        unsafe { (self.library.destroy)(instance) };
    }
}

/// A [`PluginInstance`] backed by a native library instance.
pub(crate) struct NativeInstance {
    live: Option<Arc<Live>>,
}

impl NativeInstance {
    pub(crate) fn new(live: Live) -> Self {
        NativeInstance {
            live: Some(Arc::new(live)),
        }
    }

    /// Send `request` with `chain` as the chain of the plugin's own requests; the answer's
    /// `ok` value, or the plugin's error.
    async fn run(
        &mut self,
        chain: &CallChain,
        request: PluginRequest<'_>,
    ) -> Result<Option<String>, InstanceError> {
        let Some(live) = self.live.clone() else {
            return Err(InstanceError::Host(
                "the native instance was destroyed".into(),
            ));
        };
        let op = request.op();
        let body = serde_json::to_vec(&request).map_err(|e| {
            live.library
                .host_error(op, &format!("request could not be encoded: {e}"))
        })?;
        live.door.enter(chain);
        let library = live.library.clone();
        let bytes = tokio::task::spawn_blocking(move || live.call(&body, op))
            .await
            .map_err(|e| library.host_error(op, &format!("did not return: {e}")))??;
        match serde_json::from_slice::<PluginResponse>(&bytes) {
            Ok(PluginResponse::Ok(value)) => Ok(value),
            Ok(PluginResponse::Err(message)) => Err(InstanceError::Returned(message.into())),
            Err(e) => Err(library.host_error(
                op,
                &format!(
                    "returned an invalid answer ({e}); expected {RESPONSE_SHAPE}, got `{}`",
                    preview(&bytes)
                ),
            )),
        }
    }

    /// Like [`run`](Self::run), for operations whose answer must be a string.
    async fn run_for_text(
        &mut self,
        chain: &CallChain,
        request: PluginRequest<'_>,
    ) -> Result<String, InstanceError> {
        let op = request.op();
        match self.run(chain, request).await? {
            Some(text) => Ok(text),
            None => Err(match &self.live {
                Some(live) => live.library.host_error(
                    op,
                    r#"was answered with {"ok": null}; it must be answered with a string, e.g. {"ok": ""}"#,
                ),
                None => InstanceError::Host("the native instance was destroyed".into()),
            }),
        }
    }
}

/// The start of an invalid answer, for error messages.
fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        out.push('…');
    }
    out.escape_debug().to_string()
}

impl Drop for NativeInstance {
    fn drop(&mut self) {
        // `keel_native_destroy` is plugin code and may block: run it off the async executor
        // when there is one (the blocking task keeps the library loaded until it is done).
        if let Some(live) = self.live.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            drop(runtime.spawn_blocking(move || drop(live)));
        }
    }
}

#[async_trait]
impl PluginInstance for NativeInstance {
    async fn activate(&mut self, chain: &CallChain, config: &str) -> Result<(), InstanceError> {
        self.run(chain, PluginRequest::Activate { config })
            .await
            .map(drop)
    }

    async fn deactivate(&mut self, chain: &CallChain) -> Result<(), InstanceError> {
        self.run(chain, PluginRequest::Deactivate).await.map(drop)
    }

    async fn handle_call(
        &mut self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, InstanceError> {
        self.run_for_text(
            chain,
            PluginRequest::HandleCall {
                service,
                method,
                payload,
            },
        )
        .await
    }

    async fn invoke_tool(
        &mut self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, InstanceError> {
        self.run_for_text(chain, PluginRequest::InvokeTool { name, input })
            .await
    }

    async fn on_event(&mut self, chain: &CallChain, event: &Event) -> Result<(), InstanceError> {
        self.run(chain, PluginRequest::OnEvent { event })
            .await
            .map(drop)
    }
}
