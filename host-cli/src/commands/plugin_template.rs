//! The exemplar crates `keel plugin new` writes: one per kind, each a working plugin with its
//! manifest, SDK usage and a native unit test of its logic.

use clap::ValueEnum;

/// What kind of plugin to start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// Registers a tool the agent can call.
    Tool,
    /// Provides a model service (`model.NAME`) answering completion requests.
    Model,
    /// Provides a service other plugins call through the kernel.
    Service,
    /// Provides a guard service (`guard.NAME`) that judges tool calls; guards only tighten.
    Guard,
}

/// `(path relative to the crate, contents)` of the new crate's own files; `sdk` is the path
/// its keel-sdk dependency points at.
pub fn render(name: &str, kind: Kind, sdk: &str) -> Vec<(String, String)> {
    let ident = name.replace('-', "_");
    vec![
        ("Cargo.toml".to_owned(), cargo_toml(name, kind, sdk)),
        ("keel.toml".to_owned(), keel_toml(name, kind)),
        ("src/lib.rs".to_owned(), lib_rs(name, &ident, kind)),
        (".gitignore".to_owned(), "/target\n/*.wasm\n".to_owned()),
        ("README.md".to_owned(), readme(name, kind)),
    ]
}

fn cargo_toml(name: &str, kind: Kind, sdk: &str) -> String {
    // A tool is declared by its input type: serde reads it, schemars derives its schema.
    let typed = if kind == Kind::Tool {
        "serde = { version = \"1\", features = [\"derive\"] }\nschemars = \"1\"\n"
    } else {
        ""
    };
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
keel-sdk = {{ path = {sdk:?} }}
serde_json = "1"
{typed}
# A workspace of its own, so an enclosing workspace does not capture this crate.
[workspace]

# Small components: `keel plugin build` compiles with this profile.
[profile.release]
debug = false
strip = "debuginfo"
lto = true
codegen-units = 1
"#
    )
}

fn keel_toml(name: &str, kind: Kind) -> String {
    let (description, provides) = match kind {
        Kind::Tool => (
            format!(
                "The `{}` tool: counts the words and characters of a text",
                name.replace('-', "_")
            ),
            String::new(),
        ),
        Kind::Service => (
            format!("Provides the service `{name}.text`"),
            format!("\"{name}.text\" = \"1.0.0\"\n"),
        ),
        Kind::Model => (
            format!("A model adapter providing `model.{name}`"),
            format!("\"model.{name}\" = \"1.0.0\"\n"),
        ),
        Kind::Guard => (
            "A guard in front of every tool call: it can only tighten".to_string(),
            String::new(),
        ),
    };
    let network_hint = if kind == Kind::Model {
        "# A real adapter reaches its provider through the kernel's network gate:\n# network = [\"api.example.com\"]\n"
    } else {
        "# network = [\"api.example.com\"]\n"
    };
    format!(
        r#"name = "{name}"
version = "0.1.0"                 # keep equal to Cargo.toml's version: publish checks it
kind = "wasm"
description = "{description}"
component = "{name}.wasm"        # `keel plugin build` puts the built component here

[provides]
{provides}
[requires]                        # service → semver range
# "example.greeting" = "^1.0"

[capabilities]                    # nothing is granted that is not listed
# dirs = [{{ path = ".", guest = "/workspace", access = "read" }}]
{network_hint}
[limits]                          # defaults: 64 MiB, 1000 ms of guest CPU per call
# memory-mib = 64
# cpu-ms = 1000

[config]
"#
    )
}

fn readme(name: &str, kind: Kind) -> String {
    format!(
        r#"# {name}

A keel {kind} plugin.

```sh
cargo test                        # the plugin's logic, natively
keel plugin build                 # component → {name}.wasm, then the checks of `keel plugin check`
keel publish --namespace NS       # sign and publish (`keel key new --namespace NS` first)
```

`src/lib.rs` implements `keel_sdk::Plugin`; `keel.toml` declares what the plugin provides,
requires and asks to be allowed to do. The plugin ABI is the WIT package `keel:plugin` in
`wit/`, which the SDK in `vendor/keel-sdk/` binds; both came with keel, and `Cargo.lock`
pins the versions keel was built and tested with, so the crate builds offline and the same
later.
"#,
        kind = format!("{kind:?}").to_lowercase()
    )
}

fn lib_rs(name: &str, ident: &str, kind: Kind) -> String {
    match kind {
        Kind::Tool => format!(
            r##"//! keel plugin `{name}`: registers the tool `{ident}`, which counts the words and
//! characters of its input's `text`.
//!
//! The tool is declared once, by its input type: its doc comments are what the model reads
//! and its JSON Schema is derived. `cargo test` runs the plugin natively against keel-sdk's
//! mock host.

use keel_sdk::{{ActivateError, Plugin, Tool, ToolError, tools}};
use schemars::JsonSchema;
use serde::Deserialize;

/// Counts the words and characters of `text`.
#[derive(Deserialize, JsonSchema)]
struct Count {{
    /// The text to count.
    text: String,
}}

impl Tool for Count {{
    const NAME: &'static str = "{ident}";
    const PARALLEL_SAFE: bool = true;
}}

/// The plugin instance; it holds nothing itself.
struct Counter;

impl Plugin for Counter {{
    fn activate_typed(_config: &str) -> Result<Self, ActivateError> {{
        tools::register_tool::<Count>()?;
        Ok(Counter)
    }}

    fn invoke_tool_typed(&mut self, name: &str, input: &str) -> Result<String, ToolError> {{
        match name {{
            // Input that does not fit `Count` is `invalid input`, which the model corrects.
            Count::NAME => Ok(count(&Count::parse(input)?)),
            other => Err(ToolError::unknown(other)),
        }}
    }}
}}

/// The tool's logic.
fn count(input: &Count) -> String {{
    serde_json::json!({{
        "words": input.text.split_whitespace().count(),
        "chars": input.text.chars().count(),
    }})
    .to_string()
}}

keel_sdk::export_plugin!(Counter);

#[cfg(test)]
mod tests {{
    use super::*;
    use keel_sdk::mock;

    #[test]
    fn counts_words_and_characters() {{
        let plugin = mock::activate::<Counter>("{{}}").expect("activates");
        assert!(mock::with_host(|host| host.tool(Count::NAME).is_some()));
        assert_eq!(
            plugin.invoke_tool(Count::NAME, r#"{{"text":"hello keel world"}}"#),
            Ok(r#"{{"chars":16,"words":3}}"#.to_string())
        );
        assert!(matches!(
            plugin.invoke_tool(Count::NAME, "{{}}"),
            Err(ToolError::InvalidInput(_))
        ));
        assert!(matches!(
            plugin.invoke_tool(Count::NAME, "not json"),
            Err(ToolError::InvalidInput(_))
        ));
    }}
}}
"##
        ),
        Kind::Service => format!(
            r##"//! keel plugin `{name}`: provides the service `{name}.text` with the methods `upper` and
//! `reverse`. Other plugins call it with `keel_sdk::services::call("{name}.text", "upper", "hi")`.

use keel_sdk::{{Plugin, services}};

/// The service this plugin provides (declared under `[provides]` in keel.toml).
const SERVICE: &str = "{name}.text";

/// The plugin instance.
struct Text;

impl Plugin for Text {{
    fn activate(_config: &str) -> Result<Self, String> {{
        services::provide(SERVICE, "1.0.0")?;
        Ok(Text)
    }}

    fn handle_call(&mut self, service: &str, method: &str, payload: &str) -> Result<String, String> {{
        if service != SERVICE {{
            return Err(format!("no such service: {{service}}"));
        }}
        handle(method, payload)
    }}
}}

/// The service's logic, free of kernel calls so that `cargo test` runs it natively.
fn handle(method: &str, payload: &str) -> Result<String, String> {{
    match method {{
        "upper" => Ok(payload.to_uppercase()),
        "reverse" => Ok(payload.chars().rev().collect()),
        other => Err(format!("no such method: {{other}}; use `upper` or `reverse`")),
    }}
}}

keel_sdk::export_plugin!(Text);

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn methods_transform_the_payload() {{
        assert_eq!(handle("upper", "keel"), Ok("KEEL".to_string()));
        assert_eq!(handle("reverse", "keel"), Ok("leek".to_string()));
        assert!(handle("delete", "keel").is_err());
    }}
}}
"##
        ),
        Kind::Model => format!(
            r##"//! keel plugin `{name}`: a model adapter skeleton. It provides `model.{name}` with the
//! method `complete`, taking `{{"prompt": "..."}}` and answering `{{"text": "..."}}`. This one
//! echoes the prompt; a real adapter would send it to its provider through the kernel (add the
//! provider's host under `[capabilities] network`).

use keel_sdk::{{Plugin, services}};

/// The service this plugin provides.
const SERVICE: &str = "model.{name}";

/// The plugin instance.
struct Model;

impl Plugin for Model {{
    fn activate(_config: &str) -> Result<Self, String> {{
        services::provide(SERVICE, "1.0.0")?;
        Ok(Model)
    }}

    fn handle_call(&mut self, service: &str, method: &str, payload: &str) -> Result<String, String> {{
        match (service, method) {{
            (SERVICE, "complete") => complete(payload),
            _ => Err(format!("no such method: {{service}}.{{method}}")),
        }}
    }}
}}

/// The adapter's logic, free of kernel calls so that `cargo test` runs it natively.
fn complete(payload: &str) -> Result<String, String> {{
    let request: serde_json::Value =
        serde_json::from_str(payload).map_err(|e| format!("request is not JSON: {{e}}"))?;
    let prompt = request
        .get("prompt")
        .and_then(serde_json::Value::as_str)
        .ok_or("request needs a string field `prompt`")?;
    Ok(serde_json::json!({{ "text": format!("echo: {{prompt}}") }}).to_string())
}}

keel_sdk::export_plugin!(Model);

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn completes_by_echoing() {{
        assert_eq!(
            complete(r#"{{"prompt":"hi"}}"#),
            Ok(r#"{{"text":"echo: hi"}}"#.to_string())
        );
        assert!(complete("{{}}").is_err());
    }}
}}
"##
        ),
        Kind::Guard => format!(
            r##"//! keel plugin `{name}`: a guard. It registers the guard `{name}.check`; the kernel asks it
//! about every tool call before the call runs and combines its answer with its own by
//! maximum (allow < prompt < forbid), so a guard can only tighten. A guard that fails or
//! takes too long counts as forbid.

use keel_sdk::{{GuardDecision, GuardVerdict, Plugin, guards}};

/// The plugin instance.
struct Guard;

impl Plugin for Guard {{
    fn activate(_config: &str) -> Result<Self, String> {{
        guards::register("{name}.check")?;
        Ok(Guard)
    }}

    fn check_tool_call(&mut self, _guard: &str, tool: &str, input: &str) -> GuardVerdict {{
        let (decision, reason) = check(tool, input);
        GuardVerdict {{
            decision,
            reason: reason.to_string(),
        }}
    }}
}}

/// The guard's logic, free of kernel calls so that `cargo test` runs it natively: anything
/// mentioning a `.env` file needs the user's approval.
fn check(_tool: &str, input: &str) -> (GuardDecision, &'static str) {{
    if input.contains(".env") {{
        (
            GuardDecision::Prompt,
            "the call mentions a .env file, which may hold secrets",
        )
    }} else {{
        (GuardDecision::Allow, "nothing this guard looks for")
    }}
}}

keel_sdk::export_plugin!(Guard);

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn secrets_need_approval() {{
        assert_eq!(check("read_file", r#"{{"path":".env"}}"#).0, GuardDecision::Prompt);
        assert_eq!(check("read_file", r#"{{"path":"src/main.rs"}}"#).0, GuardDecision::Allow);
    }}
}}
"##
        ),
    }
}
