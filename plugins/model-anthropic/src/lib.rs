//! keel plugin `model-anthropic`: the `model` service over the Anthropic Messages API.
//!
//! `complete` takes a `ModelRequest` JSON and answers a `ModelResponse` JSON; while the
//! response streams, every `StreamDelta` is emitted on `model.delta`. Requests go to
//! `{base-url}/messages` with the `anthropic-version` header through the kernel's network
//! gate; the key is the kernel-held secret named by `api-key-secret` (default
//! `ANTHROPIC_API_KEY`), sent in `x-api-key` without the plugin ever seeing it. Thinking is
//! stored as text without its signature. Configuration: see [`keel_model_http::settings`].

use keel_model_http::{HttpModel, settings};
use keel_sdk::Plugin;

/// The active adapter.
struct AnthropicModel(HttpModel);

impl Plugin for AnthropicModel {
    fn activate(config: &str) -> Result<Self, String> {
        HttpModel::activate(settings::anthropic(config)?).map(AnthropicModel)
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        self.0.handle_call(service, method, payload)
    }
}

keel_sdk::export_plugin!(AnthropicModel);

// `model` served typed (ABI 0.7.0): the kernel's requests cross as records.
keel_model_http::export_typed_model!(AnthropicModel, 0);
