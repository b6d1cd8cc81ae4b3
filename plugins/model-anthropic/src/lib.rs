//! keel plugin `model-anthropic`: the `model` service over the Anthropic Messages API.
//!
//! `complete` takes a `ModelRequest` JSON and answers a `ModelResponse` JSON; while the
//! response streams, every `StreamDelta` is emitted on `model.delta`. Requests go to
//! `{base-url}/messages` with the `anthropic-version` header through the kernel's network
//! gate; the key is the kernel-held secret named by `api-key-secret` (default
//! `ANTHROPIC_API_KEY`), sent in `x-api-key` without the plugin ever seeing it. Thinking is
//! stored as text without its signature. Configuration: see [`keel_model_http::settings`].

use keel_model_http::settings;
use keel_model_http::transport::SdkTransport;
use keel_model_wire::driver::{self, AdapterConfig};
use keel_model_wire::fragments::ConversationCache;
use keel_protocol::services;
use keel_sdk::Plugin;

/// The active adapter.
struct AnthropicModel {
    adapter: AdapterConfig,
    /// The rendering of the conversation the kernel holds, kept between calls.
    conversation: ConversationCache,
}

impl Plugin for AnthropicModel {
    fn activate(config: &str) -> Result<Self, String> {
        let adapter = settings::anthropic(config)?;
        keel_sdk::services::provide(services::MODEL, keel_model_http::HTTP_MODEL_SERVICE_VERSION)?;
        Ok(AnthropicModel {
            adapter,
            conversation: ConversationCache::default(),
        })
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        keel_model_http::serve(service, method, payload, |request, on_delta| {
            let mut transport = SdkTransport::new();
            driver::complete(
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

keel_sdk::export_plugin!(AnthropicModel);
