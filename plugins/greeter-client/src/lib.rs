//! Example keel plugin `greeter-client`: registers the tool `greet`, which greets a person by
//! calling the service `example.greeting` (required, `^1.0`) through the kernel.
//!
//! It also subscribes to the topic `example.ping` and keeps the payload of the last such event
//! in the kernel-held state key `last-ping`.

use keel_sdk::{Event, Plugin, ToolCapabilities, ToolSpec, events, log, services, state, tools};

/// The input schema of the `greet` tool.
const GREET_SCHEMA: &str =
    r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#;

/// The plugin instance; it holds nothing itself.
struct GreeterClient;

impl Plugin for GreeterClient {
    fn activate(_config: &str) -> Result<Self, String> {
        tools::register(
            ToolSpec::new("greet", "Greets a person by name.", GREET_SCHEMA)
                .capabilities(ToolCapabilities::empty())
                .parallel_safe(true),
        )?;
        events::subscribe("example.ping")?;
        Ok(GreeterClient)
    }

    fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String, String> {
        if name != "greet" {
            return Err(format!("no such tool: {name}"));
        }
        let input: serde_json::Value =
            serde_json::from_str(input).map_err(|e| format!("input is not JSON: {e}"))?;
        let person = input
            .get("name")
            .and_then(serde_json::Value::as_str)
            .ok_or("input needs a string field `name`")?;
        Ok(services::call("example.greeting", "greet", person)?)
    }

    fn on_event(&mut self, event: Event) {
        if event.topic == "example.ping"
            && let Err(e) = state::set("last-ping", event.payload.as_bytes())
        {
            log::warn(&format!("could not store the last ping: {e}"));
        }
    }
}

keel_sdk::export_plugin!(GreeterClient);
