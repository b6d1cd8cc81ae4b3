//! Example keel plugin `echo-tool`: registers the tool `echo`, which returns the `text` field
//! of its input (after an optional prefix from its configuration).
//!
//! Written on keel-sdk's typed API: the tool is declared once by its input type (the doc
//! comments are what the model reads, the JSON Schema is derived), the configuration is a
//! serde type, and errors say their kind. Its logic is tested natively against the SDK's mock
//! host: `cargo test --workspace -- echo`.

use keel_sdk::{ActivateError, Plugin, Tool, ToolError, parse_config, tools};
use schemars::JsonSchema;
use serde::Deserialize;

/// Returns the given text unchanged.
#[derive(Debug, Deserialize, JsonSchema)]
struct Echo {
    /// The text to return.
    text: String,
}

impl Tool for Echo {
    const NAME: &'static str = "echo";
    const PARALLEL_SAFE: bool = true;
}

/// The plugin's settings (`[config.echo-tool]` in keel's config).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct EchoConfig {
    /// Text put before every echo.
    prefix: String,
}

/// The plugin instance: its settings.
struct EchoTool {
    config: EchoConfig,
}

impl EchoTool {
    fn echo(&self, input: Echo) -> String {
        format!("{}{}", self.config.prefix, input.text)
    }
}

impl Plugin for EchoTool {
    fn activate_typed(config: &str) -> Result<Self, ActivateError> {
        let config = parse_config(config)?;
        tools::register_tool::<Echo>()?;
        Ok(EchoTool { config })
    }

    fn invoke_tool_typed(&mut self, name: &str, input: &str) -> Result<String, ToolError> {
        match name {
            Echo::NAME => Ok(self.echo(Echo::parse(input)?)),
            other => Err(ToolError::unknown(other)),
        }
    }
}

keel_sdk::export_plugin!(EchoTool);

#[cfg(test)]
mod tests {
    use super::*;
    use keel_sdk::mock;

    #[test]
    fn echo_returns_its_text_and_says_what_is_wrong_with_bad_input() {
        let plugin = mock::activate::<EchoTool>("{}").expect("activates");
        let spec = mock::with_host(|h| h.tool("echo").cloned()).expect("echo is registered");
        assert_eq!(spec.description, "Returns the given text unchanged.");
        assert!(spec.parallel_safe);
        let schema: serde_json::Value =
            serde_json::from_str(&spec.input_schema).expect("the schema is JSON");
        assert_eq!(schema["required"], serde_json::json!(["text"]));
        assert_eq!(schema["properties"]["text"]["type"], "string");

        assert_eq!(
            plugin.invoke_tool("echo", r#"{"text":"hi ✓"}"#),
            Ok("hi ✓".into())
        );
        let err = plugin
            .invoke_tool("echo", r#"{"text":3}"#)
            .expect_err("a number is not text");
        assert!(
            matches!(&err, ToolError::InvalidInput(m) if m.contains("invalid type: integer")),
            "{err:?}"
        );
        assert!(matches!(
            plugin.invoke_tool("echo", "not json"),
            Err(ToolError::InvalidInput(_))
        ));
        assert_eq!(
            plugin.invoke_tool("shout", "{}"),
            Err(ToolError::UnknownTool("no such tool: shout".into()))
        );
    }

    #[test]
    fn echo_reads_its_prefix_from_the_config_and_refuses_unknown_settings() {
        let plugin = mock::activate::<EchoTool>(r#"{"prefix":"> "}"#).expect("activates");
        assert_eq!(
            plugin.invoke_tool("echo", r#"{"text":"hi"}"#),
            Ok("> hi".into())
        );
        drop(plugin);

        let err = mock::activate::<EchoTool>(r#"{"prefx":"> "}"#).err();
        assert!(
            matches!(&err, Some(ActivateError::InvalidConfig(m)) if m.contains("unknown field `prefx`")),
            "{err:?}"
        );
        // What a failed activation registered is undone, as the kernel undoes it.
        assert!(mock::with_host(|h| h.tools.is_empty()));
    }
}
