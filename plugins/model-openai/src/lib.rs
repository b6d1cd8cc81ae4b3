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

/// `model` served typed (ABI 0.7.0's world `model-service`): a request from the kernel
/// crosses as a record; callers of earlier versions still reach `handle-call` with JSON.
#[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
mod typed {
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

impl typed::exports::keel::plugin0_7_0::model::Guest for TypedModel {
    fn complete(
        request: keel_sdk::model::ModelRequest,
    ) -> Result<
        keel_sdk::model::ModelResponse,
        keel_sdk::bindings::keel::plugin0_2_0::types::KernelError,
    > {
        keel_sdk::with_plugin(|model: &mut OpenAiModel| model.0.complete_typed(&request))
            .and_then(|answer| answer)
            .map_err(Into::into)
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedModel with_types_in typed);
};
