//! Example keel plugin `greeter`: provides the service `example.greeting` 1.0.0.
//!
//! Methods of `example.greeting`:
//! - `greet` (payload: a name) returns `"<greeting>, <name>!"`, where the greeting comes from
//!   the configuration key `greeting` (manifest default `"Hello"`), and counts the call in the
//!   kernel-held state key `calls` (a `u64`, little-endian), which survives a reload.
//! - `calls` returns the number of `greet` calls so far, as decimal text.
//!
//! It also adds the prompt fragment `greeter`.

use keel_sdk::{Plugin, prompt, services, state};

/// The service this plugin provides.
const SERVICE: &str = "example.greeting";
/// The state key holding the number of `greet` calls.
const CALLS_KEY: &str = "calls";

/// The plugin instance.
struct Greeter {
    /// The word used to greet.
    greeting: String,
}

/// The number of `greet` calls stored in the kernel-held state (0 when absent or malformed).
fn calls() -> u64 {
    state::get(CALLS_KEY)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
        .map_or(0, u64::from_le_bytes)
}

impl Plugin for Greeter {
    fn activate(config: &str) -> Result<Self, String> {
        let config: serde_json::Value =
            serde_json::from_str(config).map_err(|e| format!("invalid configuration: {e}"))?;
        let greeting = match config.get("greeting") {
            None => "Hello".to_string(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("`greeting` must be a string, not {other}")),
        };
        services::provide(SERVICE, "1.0.0")?;
        prompt::add_fragment("greeter", "You can greet people.")?;
        Ok(Greeter { greeting })
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != SERVICE {
            return Err(format!("no such service: {service}"));
        }
        match method {
            "greet" => {
                let count = calls().wrapping_add(1);
                state::set(CALLS_KEY, &count.to_le_bytes())?;
                Ok(format!("{}, {payload}!", self.greeting))
            }
            "calls" => Ok(calls().to_string()),
            other => Err(format!("no such method: {SERVICE}.{other}")),
        }
    }
}

keel_sdk::export_plugin!(Greeter);
