//! Example keel plugin `echo-tool`: registers the tool `echo`, which returns the `text` field
//! of its input.

use keel_sdk::{Plugin, ToolCapabilities, ToolSpec, tools};

/// The input schema of the `echo` tool.
const ECHO_SCHEMA: &str =
    r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#;

/// The plugin instance; it holds nothing itself.
struct EchoTool;

impl Plugin for EchoTool {
    fn activate(_config: &str) -> Result<Self, String> {
        tools::register(
            ToolSpec::new("echo", "Returns the given text unchanged.", ECHO_SCHEMA)
                .capabilities(ToolCapabilities::empty())
                .parallel_safe(true),
        )?;
        Ok(EchoTool)
    }

    fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String, String> {
        if name != "echo" {
            return Err(format!("no such tool: {name}"));
        }
        let input: serde_json::Value =
            serde_json::from_str(input).map_err(|e| format!("input is not JSON: {e}"))?;
        input
            .get("text")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| "input needs a string field `text`".to_string())
    }
}

keel_sdk::export_plugin!(EchoTool);
