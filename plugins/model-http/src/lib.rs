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

pub mod settings;
pub mod transport;

use keel_protocol::{ModelResponse, StreamDelta, services, topics};

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
