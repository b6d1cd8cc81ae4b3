//! The JSON carried across the native ABI: what the kernel asks of a plugin
//! ([`PluginRequest`], answered by [`PluginResponse`]) and what a plugin asks of the kernel
//! ([`HostRequest`], answered by [`host_reply`]). Field names are snake_case.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::{Event, KernelError, Level, ToolSpec};

/// A call into the plugin: the body of `keel_native_call`.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum PluginRequest<'a> {
    /// `{"op":"activate","config":"<JSON object text>"}`
    Activate { config: &'a str },
    /// `{"op":"deactivate"}`
    Deactivate,
    /// `{"op":"handle_call","service":..,"method":..,"payload":..}`
    HandleCall {
        service: &'a str,
        method: &'a str,
        payload: &'a str,
    },
    /// `{"op":"invoke_tool","name":..,"input":..}`
    InvokeTool { name: &'a str, input: &'a str },
    /// `{"op":"on_event","event":{"topic":..,"source":..,"payload":..}}`
    OnEvent { event: &'a Event },
}

impl PluginRequest<'_> {
    /// The `op` field, for messages.
    pub(crate) fn op(&self) -> &'static str {
        match self {
            PluginRequest::Activate { .. } => "activate",
            PluginRequest::Deactivate => "deactivate",
            PluginRequest::HandleCall { .. } => "handle_call",
            PluginRequest::InvokeTool { .. } => "invoke_tool",
            PluginRequest::OnEvent { .. } => "on_event",
        }
    }
}

/// A plugin's answer to a [`PluginRequest`]: `{"ok": <string or null>}` or
/// `{"err": "<message>"}`, nothing else.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) enum PluginResponse {
    /// Success, with the result text of `handle_call` / `invoke_tool` (null for the others).
    #[serde(rename = "ok")]
    Ok(Option<String>),
    /// The plugin's own error message.
    #[serde(rename = "err")]
    Err(String),
}

/// The shape of a valid answer, for messages about invalid ones.
pub(crate) const RESPONSE_SHAPE: &str = r#"{"ok": <string or null>} or {"err": "<message>"}"#;

/// A request from the plugin to the kernel, sent through `KeelHostApi::call`. One per WIT
/// kernel import; each ends in the matching [`HostHandle`](crate::HostHandle) method.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum HostRequest {
    /// `{"op":"log","level":"info","message":..}` → `{"ok":null}`
    Log { level: Level, message: String },
    /// `{"op":"provide","name":..,"version":..}` → `{"ok":null}`
    Provide { name: String, version: String },
    /// `{"op":"call","service":..,"method":..,"payload":..}` → `{"ok":"<result>"}`
    Call {
        #[serde(alias = "name")]
        service: String,
        method: String,
        payload: String,
    },
    /// `{"op":"register_tool","spec":{name,description,input_schema,capabilities,parallel_safe}}`
    /// → `{"ok":null}`
    RegisterTool { spec: ToolSpec },
    /// `{"op":"subscribe","topic":..}` → `{"ok":null}`
    Subscribe { topic: String },
    /// `{"op":"emit","topic":..,"payload":..}` → `{"ok":null}`
    Emit { topic: String, payload: String },
    /// `{"op":"add_prompt_fragment","id":..,"text":..}` → `{"ok":null}`
    AddPromptFragment { id: String, text: String },
    /// `{"op":"state_get","key":..}` → `{"ok":[bytes]}` or `{"ok":null}`
    StateGet { key: String },
    /// `{"op":"state_set","key":..,"value":[bytes]}` → `{"ok":null}`
    StateSet { key: String, value: Vec<u8> },
    /// `{"op":"state_remove","key":..}` → `{"ok":null}`
    StateRemove { key: String },
    /// `{"op":"state_keys"}` → `{"ok":["key", ...]}`
    StateKeys,
}

/// The JSON answer to a host request: `{"ok": value}` or `{"err": {"kind":..,"message":..}}`.
pub(crate) fn host_reply(result: Result<Value, KernelError>) -> Vec<u8> {
    let body = match result {
        Ok(value) => serde_json::json!({ "ok": value }),
        Err(e) => serde_json::json!({ "err": e }),
    };
    // Serializing a `Value` cannot fail; keep a hand-written answer for the impossible case
    // rather than panic inside an FFI callback.
    serde_json::to_vec(&body).unwrap_or_else(|_| {
        br#"{"err":{"kind":"failed","message":"the kernel could not encode its answer"}}"#.to_vec()
    })
}
