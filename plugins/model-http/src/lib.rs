//! Guest-side glue shared by keel's model adapter plugins (`model-openai`, `model-anthropic`,
//! `model-scripted`): everything between the pure [`keel_model_wire`] core and the SDK.
//!
//! - [`transport::SdkTransport`]: [`keel_model_wire::driver::Transport`] over the SDK's
//!   kernel-mediated [`keel_sdk::http`] client.
//! - [`settings`]: reading a plugin's configuration (the manifest's `[config]` defaults merged
//!   with the user's `[config.<plugin>]`), refusing unknown keys, and building the
//!   [`keel_model_wire::driver::AdapterConfig`] of each vendor.
//! - [`serve`]: the `model` service's `complete` method: a `ModelRequest` JSON in (handed on
//!   as text, which the HTTP adapters render in place), a `ModelResponse` JSON out, every
//!   [`StreamDelta`] emitted on `model.delta` on the way.
//! - [`HttpModel::complete_typed`]: the same through the typed `model` export (ABI 0.7.0),
//!   whose record becomes that text once ([`request_text`]).

pub mod settings;
pub mod transport;

use keel_protocol::{ModelResponse, StreamDelta, services, topics};
use keel_sdk::KernelError;

/// The version of the `model` service the scripted model provides: it takes the messages in
/// the request.
pub const MODEL_SERVICE_VERSION: &str = "1.0.0";

/// The version of the `model` service the HTTP adapters provide: they read a conversation
/// the kernel holds themselves, rendering each message once
/// ([`keel_model_wire::fragments::ConversationCache`]).
pub const HTTP_MODEL_SERVICE_VERSION: &str = keel_protocol::services::MODEL_READS_CONVERSATIONS;

/// An HTTP model adapter as a plugin holds it: the endpoint's configuration and the rendering
/// of the conversation the kernel holds, kept between calls.
pub struct HttpModel {
    adapter: keel_model_wire::driver::AdapterConfig,
    conversation: keel_model_wire::fragments::ConversationCache,
}

impl HttpModel {
    /// Provide the `model` service ([`HTTP_MODEL_SERVICE_VERSION`]) through `adapter`.
    pub fn activate(adapter: keel_model_wire::driver::AdapterConfig) -> Result<Self, String> {
        keel_sdk::services::provide(services::MODEL, HTTP_MODEL_SERVICE_VERSION)?;
        Ok(HttpModel {
            adapter,
            conversation: keel_model_wire::fragments::ConversationCache::default(),
        })
    }

    /// Serve one call to the `model` service over the kernel-mediated HTTP client.
    pub fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        serve(service, method, payload, |request, on_delta| {
            let mut transport = transport::SdkTransport::new();
            keel_model_wire::driver::complete(
                &mut transport,
                &self.adapter,
                &mut self.conversation,
                request,
                on_delta,
            )
            .map_err(|e| e.to_string())
        })
    }
}

impl HttpModel {
    /// Serve one call to the typed `model` export (ABI 0.7.0): the record becomes the request
    /// text the driver renders in place ([`request_text`]), the response a record.
    pub fn complete_typed(
        &mut self,
        request: &keel_sdk::model::ModelRequest,
    ) -> Result<keel_sdk::model::ModelResponse, KernelError> {
        let text = request_text(request).map_err(KernelError::Invalid)?;
        let mut transport = transport::SdkTransport::new();
        keel_model_wire::driver::complete(
            &mut transport,
            &self.adapter,
            &mut self.conversation,
            &text,
            &mut |d| emit_delta(&d),
        )
        .map(keel_sdk_protocol::model_response_to_wit)
        .map_err(|e| KernelError::Failed(e.to_string()))
    }
}

/// Export the typed `model` door (ABI 0.7.0's world `model-service`) of the adapter plugin
/// `$plugin`, whose [`HttpModel`] is `$plugin.$field`: a request from the kernel crosses as a
/// record to [`HttpModel::complete_typed`]; callers of earlier versions still reach
/// `handle-call` with JSON. Expanded in the adapter's crate (which depends on `wit-bindgen`),
/// beside `keel_sdk::export_plugin!`.
#[macro_export]
macro_rules! export_typed_model {
    ($plugin:ty, $field:tt) => {
        #[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
        mod typed_model {
            wit_bindgen::generate!({
                path: [
                    "../../wit/keel-plugin-0.2.0",
                    "../../wit/keel-plugin-0.3.0",
                    "../../wit/keel-plugin-0.4.0",
                    "../../wit/keel-plugin-0.5.0",
                    "../../wit/keel-plugin-0.6.0",
                    "../../wit/keel-plugin-0.7.0",
                ],
                world: "keel:plugin/model-service@0.7.0",
                with: {
                    "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
                    "keel:plugin/conversation@0.5.0": keel_sdk::bindings::keel::plugin0_5_0::conversation,
                    "keel:plugin/tool-registry@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::tool_registry,
                    "keel:plugin/turns@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::turns,
                    "keel:plugin/model-types@0.7.0": keel_sdk::bindings::keel::plugin0_7_0::model_types,
                },
            });
        }

        struct TypedModel;

        impl typed_model::exports::keel::plugin0_7_0::model::Guest for TypedModel {
            fn complete(
                request: keel_sdk::model::ModelRequest,
            ) -> Result<
                keel_sdk::model::ModelResponse,
                keel_sdk::bindings::keel::plugin0_2_0::types::KernelError,
            > {
                keel_sdk::with_plugin(|model: &mut $plugin| model.$field.complete_typed(&request))
                    .and_then(|answer| answer)
                    .map_err(Into::into)
            }
        }

        #[allow(unsafe_code)]
        const _: () = {
            typed_model::export!(TypedModel with_types_in typed_model);
        };
    };
}

/// A [`keel_protocol::ModelRequest`]'s JSON text made from the typed door's record. A tool's
/// input schema is JSON text already: it is checked and copied, not decoded into a value and
/// encoded again, so a step does not rebuild every schema.
pub fn request_text(request: &keel_sdk::model::ModelRequest) -> Result<String, String> {
    use serde_json::value::RawValue;

    /// [`keel_protocol::ToolDef`]'s JSON, its schema as it arrived.
    #[derive(serde::Serialize)]
    struct Tool<'a> {
        name: &'a str,
        description: &'a str,
        input_schema: &'a RawValue,
    }

    /// [`keel_protocol::ModelRequest`]'s JSON.
    #[derive(serde::Serialize)]
    struct Request<'a> {
        model: &'a str,
        system: &'a str,
        messages: Vec<keel_protocol::Message>,
        tools: Vec<Tool<'a>>,
        max_tokens: u32,
        compacts_on_overflow: bool,
        conversation: Option<keel_protocol::ConversationRef>,
    }

    let mut tools = Vec::with_capacity(request.tools.len());
    for tool in &request.tools {
        let input_schema = serde_json::from_str::<&RawValue>(&tool.input_schema)
            .map_err(|e| format!("the input schema of tool `{}` is not JSON: {e}", tool.name))?;
        tools.push(Tool {
            name: &tool.name,
            description: &tool.description,
            input_schema,
        });
    }
    let conversation = request
        .conversation
        .as_ref()
        .map(|c| keel_protocol::ConversationRef {
            session: c.session.clone(),
            messages: c.messages as usize,
            held: c.held.as_ref().map(|h| keel_protocol::HeldConversation {
                keeper: h.keeper.clone(),
                revision: h.revision,
            }),
        });
    serde_json::to_string(&Request {
        model: &request.model,
        system: &request.system,
        messages: request
            .messages
            .iter()
            .cloned()
            .map(keel_sdk_protocol::message_from_wit)
            .collect(),
        tools,
        max_tokens: request.max_tokens,
        compacts_on_overflow: request.compacts_on_overflow,
        conversation,
    })
    .map_err(|e| format!("cannot encode the request: {e}"))
}

/// Emit `delta` on [`topics::MODEL_DELTA`] for live display. A full subscriber queue is not
/// worth failing the model call for, so emit errors are dropped.
pub fn emit_delta(delta: &StreamDelta) {
    if let Ok(payload) = serde_json::to_string(delta) {
        let _ = keel_sdk::events::emit(topics::MODEL_DELTA, &payload);
    }
}

/// Serve one call to the `model` service: `complete` runs `respond` on the payload, a
/// [`keel_protocol::ModelRequest`]'s JSON text (it reports each fragment to its callback), and
/// answers the [`ModelResponse`] as JSON. Every fragment is also emitted with
/// [`emit_delta`].
pub fn serve(
    service: &str,
    method: &str,
    payload: &str,
    respond: impl FnOnce(&str, &mut dyn FnMut(StreamDelta)) -> Result<ModelResponse, String>,
) -> Result<String, String> {
    serve_with(service, method, payload, respond, &mut |d| emit_delta(&d))
}

/// [`serve`] with the fragments going to `sink` instead of the event bus.
pub fn serve_with(
    service: &str,
    method: &str,
    payload: &str,
    respond: impl FnOnce(&str, &mut dyn FnMut(StreamDelta)) -> Result<ModelResponse, String>,
    sink: &mut dyn FnMut(StreamDelta),
) -> Result<String, String> {
    if service != services::MODEL {
        return Err(format!(
            "no such service: `{service}`; this plugin provides `{}`",
            services::MODEL
        ));
    }
    if method != "complete" {
        return Err(format!(
            "the `{}` service has no method `{method}`; call `complete` with a ModelRequest",
            services::MODEL
        ));
    }
    let response = respond(payload, sink)?;
    serde_json::to_string(&response).map_err(|e| format!("cannot encode the response: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{Block, Message, Role, StopReason, Usage};

    fn answer(req: &str, sink: &mut dyn FnMut(StreamDelta)) -> Result<ModelResponse, String> {
        let req: keel_protocol::ModelRequest =
            serde_json::from_str(req).map_err(|e| format!("not a ModelRequest: {e}"))?;
        sink(StreamDelta::Text { text: "hi".into() });
        Ok(ModelResponse {
            message: Message {
                role: Role::Assistant,
                content: vec![Block::Text {
                    text: format!("{} messages", req.messages.len()),
                }],
            },
            stop_reason: StopReason::EndTurn,
            stop_reason_raw: "stop".into(),
            usage: Usage::default(),
            model: "m".into(),
            retries: 0,
        })
    }

    #[test]
    fn a_typed_request_becomes_the_json_of_the_same_request() {
        let request = keel_protocol::ModelRequest {
            model: String::new(),
            system: "sys".into(),
            messages: vec![Message::user_text("hi")],
            tools: vec![keel_protocol::ToolDef {
                name: "read_file".into(),
                description: "reads \"quoted\"".into(),
                input_schema: serde_json::json!({"type": "object", "required": ["path"]}),
            }],
            max_tokens: 100,
            compacts_on_overflow: true,
            conversation: Some(keel_protocol::ConversationRef {
                session: "s1".into(),
                messages: 4,
                held: None,
            }),
        };
        let record = keel_sdk_protocol::model_request_to_wit(request.clone());
        let text = request_text(&record).expect("encodes");
        let parsed: keel_protocol::ModelRequest = serde_json::from_str(&text).expect("parses");
        assert_eq!(parsed, request);
        let mut broken = record;
        broken.tools[0].input_schema = "{\"type\":".into();
        let e = request_text(&broken).expect_err("not JSON");
        assert!(e.contains("`read_file`"), "{e}");
    }

    #[test]
    fn serve_parses_answers_and_reports_fragments() {
        let request = r#"{"system":"","messages":[],"tools":[],"max_tokens":10}"#;
        let mut seen = Vec::new();
        let out = serve_with("model", "complete", request, answer, &mut |d| seen.push(d))
            .expect("served");
        let response: ModelResponse = serde_json::from_str(&out).expect("a ModelResponse");
        assert_eq!(response.message.text(), "0 messages");
        assert_eq!(seen, [StreamDelta::Text { text: "hi".into() }]);

        let e = serve_with("other", "complete", request, answer, &mut |_| {}).expect_err("svc");
        assert!(e.contains("provides `model`"), "{e}");
        let e = serve_with("model", "stream", request, answer, &mut |_| {}).expect_err("method");
        assert!(e.contains("`complete`"), "{e}");
        let e = serve_with("model", "complete", "{", answer, &mut |_| {}).expect_err("payload");
        assert!(e.contains("not a ModelRequest"), "{e}");
    }
}
