//! keel plugin `model-scripted`: the `model` service answered from a script, deterministically
//! and without network — for demos, tutorials and tests.
//!
//! Configuration: `script`, the script text itself (TOML, or JSON when it starts with `{`;
//! the format is documented in `keel_model_wire::scripted`). The content rather than a path
//! is configured so the plugin needs no preopened directory; the CLI reads a script file and
//! passes its text. The response played for a request is the one at the index of the
//! number of assistant messages in the request, so a resumed session continues where it
//! left off; past the end the model says its script is exhausted. Every fragment is emitted
//! on `model.delta` like a real model's.

use keel_model_http::settings::Settings;
use keel_model_wire::scripted::Script;
use keel_protocol::services;
use keel_sdk::Plugin;

/// The loaded script.
struct ScriptedModel {
    script: Script,
}

/// The script `config` carries.
fn script_from(config: &str) -> Result<Script, String> {
    let settings = Settings::parse("model-scripted", config, &["script"])?;
    let text = settings.string("script", "")?;
    if text.is_empty() {
        return Err(
            "model-scripted: no script is configured; set `script` under [config.model-scripted] \
             to the script's text (TOML with [[step]] tables, or JSON)"
                .to_owned(),
        );
    }
    Script::parse(&text).map_err(|e| format!("model-scripted: the script is not valid: {e}"))
}

impl Plugin for ScriptedModel {
    fn activate(config: &str) -> Result<Self, String> {
        let script = script_from(config)?;
        keel_sdk::services::provide(services::MODEL, keel_model_http::MODEL_SERVICE_VERSION)?;
        Ok(ScriptedModel { script })
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        keel_model_http::serve(service, method, payload, |request, on_delta| {
            let request: keel_protocol::ModelRequest = serde_json::from_str(request)
                .map_err(|e| format!("the payload of `complete` is not a ModelRequest: {e}"))?;
            self.script
                .respond(&request, on_delta)
                .map_err(|e| format!("model-scripted: {e}"))
        })
    }
}

keel_sdk::export_plugin!(ScriptedModel);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_comes_from_config() {
        let script = script_from(r#"{"script":"[[step]]\ntext = \"hi\"\n"}"#).expect("toml");
        assert_eq!(script.steps.len(), 1);
        let script = script_from(r#"{"script":"{\"step\":[{\"text\":\"hi\"}]}"}"#).expect("json");
        assert_eq!(script.steps.len(), 1);
        let e = script_from(r#"{"script":""}"#).expect_err("empty");
        assert!(e.contains("[config.model-scripted]"), "{e}");
        let e = script_from(r#"{"script":"[[step]]\nbogus = 1\n"}"#).expect_err("invalid");
        assert!(e.contains("not valid"), "{e}");
        let e = script_from(r#"{"script-path":"x"}"#).expect_err("unknown key");
        assert!(e.contains("`script-path`"), "{e}");
    }
}
