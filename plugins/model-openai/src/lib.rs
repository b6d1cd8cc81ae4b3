//! keel plugin `model-openai`: the `model` service over the OpenAI Chat Completions API and
//! the many servers that speak it (Ollama, vLLM, llama.cpp, OpenRouter, ...).
//!
//! `complete` takes a `ModelRequest` JSON and answers a `ModelResponse` JSON; while the
//! response streams, every `StreamDelta` is emitted on `model.delta`. Requests go to
//! `{base-url}/chat/completions` through the kernel's network gate; the key is the
//! kernel-held secret named by `api-key-secret` (default `OPENAI_API_KEY`), sent as
//! `authorization: Bearer …` without the plugin ever seeing it. When the secret is not set,
//! requests go out without it (local servers need none). Configuration: see
//! [`keel_model_http::settings`].

use keel_model_http::{HttpModel, settings};
use keel_sdk::Plugin;

/// The active adapter.
struct OpenAiModel(HttpModel);

impl Plugin for OpenAiModel {
    fn activate(config: &str) -> Result<Self, String> {
        HttpModel::activate(settings::openai(config)?).map(OpenAiModel)
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

keel_sdk::export_plugin!(OpenAiModel);

// `model` served typed (ABI 0.7.0): the kernel's requests cross as records.
keel_model_http::export_typed_model!(OpenAiModel, 0);
