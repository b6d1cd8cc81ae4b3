//! A model plugin's configuration and the adapter it describes.
//!
//! The kernel passes the manifest's `[config]` defaults merged with the user's
//! `[config.<plugin>]` as a JSON object. Keys are kebab-case; an unknown key is refused at
//! activation (a typo must not silently leave a default in place).
//!
//! Common keys of `model-openai` and `model-anthropic`:
//!
//! | key | meaning |
//! | --- | --- |
//! | `base-url` | the API root; requests go to `{base-url}/chat/completions` (OpenAI) or `{base-url}/messages` (Anthropic) |
//! | `model` | the model used when a request names none |
//! | `api-key-secret` | the kernel-held secret sent as the key (`OPENAI_API_KEY` / `ANTHROPIC_API_KEY`); it must be listed under `[capabilities] secrets` in the manifest; `""` sends no key |
//! | `idle-timeout-ms` | the stream's idle watchdog (default 120000) |
//! | `idle-widen-ms` | how much the watchdog widens per retry (default 30000) |
//! | `max-attempts` | attempts per call, the first included (default 4) |
//! | `retry-base-ms` | the first retry backoff (default 1000) |
//!
//! OpenAI only: `max-tokens-field` (`max_tokens`, the default, or `max_completion_tokens` for
//! reasoning models) and `include-usage` (default true; some older compatible servers reject
//! `stream_options`). Anthropic only: `anthropic-version` (default `2023-06-01`).

use keel_model_wire::anthropic::{API_VERSION, AnthropicOptions};
use keel_model_wire::driver::{AdapterConfig, SecretRef, WireFormat};
use keel_model_wire::openai::{MaxTokensField, OpenAiOptions};
use serde_json::{Map, Value};

/// A plugin's configuration object, with its name for messages.
#[derive(Debug, Clone)]
pub struct Settings {
    plugin: String,
    map: Map<String, Value>,
}

impl Settings {
    /// Parse `config` (a JSON object as text; empty means `{}`) for `plugin`, refusing keys
    /// not in `known`.
    pub fn parse(plugin: &str, config: &str, known: &[&str]) -> Result<Settings, String> {
        let value: Value = if config.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(config)
                .map_err(|e| format!("{plugin}: the configuration is not JSON: {e}"))?
        };
        let Value::Object(map) = value else {
            return Err(format!(
                "{plugin}: the configuration must be a table of keys"
            ));
        };
        let mut unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|k| !known.contains(k))
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(format!(
                "{plugin}: unknown configuration key{} {} under [config.{plugin}]; the keys are {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(Settings {
            plugin: plugin.to_owned(),
            map,
        })
    }

    fn wrong(&self, key: &str, want: &str, found: &Value) -> String {
        format!(
            "{}: configuration key `{key}` must be {want}, found {found}",
            self.plugin
        )
    }

    /// The string at `key`, or `default` when absent.
    pub fn string(&self, key: &str, default: &str) -> Result<String, String> {
        match self.map.get(key) {
            None => Ok(default.to_owned()),
            Some(Value::String(s)) => Ok(s.trim().to_owned()),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    /// The whole number at `key` (a number or a string of digits), or `default` when absent.
    pub fn number(&self, key: &str, default: u64) -> Result<u64, String> {
        match self.map.get(key) {
            None => Ok(default),
            Some(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| self.wrong(key, "a whole number ≥ 0", &Value::Number(n.clone()))),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map_err(|_| self.wrong(key, "a whole number ≥ 0", &Value::String(s.clone()))),
            Some(other) => Err(self.wrong(key, "a whole number ≥ 0", other)),
        }
    }

    /// The boolean at `key`, or `default` when absent.
    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.map.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong(key, "true or false", other)),
        }
    }
}

/// The configuration keys of `model-openai`.
pub const OPENAI_KEYS: &[&str] = &[
    "base-url",
    "model",
    "api-key-secret",
    "idle-timeout-ms",
    "idle-widen-ms",
    "max-attempts",
    "retry-base-ms",
    "max-tokens-field",
    "include-usage",
];

/// The configuration keys of `model-anthropic`.
pub const ANTHROPIC_KEYS: &[&str] = &[
    "base-url",
    "model",
    "api-key-secret",
    "idle-timeout-ms",
    "idle-widen-ms",
    "max-attempts",
    "retry-base-ms",
    "anthropic-version",
];

/// `{base}/{path}` with exactly one slash between them; the base must be an http(s) URL.
fn endpoint(s: &Settings, base: &str, path: &str) -> Result<String, String> {
    let base = base.trim_end_matches('/');
    if !(base.starts_with("https://") || base.starts_with("http://")) {
        return Err(format!(
            "{}: configuration key `base-url` must be an http:// or https:// URL, found `{base}`",
            s.plugin
        ));
    }
    Ok(format!("{base}/{path}"))
}

/// The numbers shared by both vendors, applied to `config`.
fn apply_common(
    s: &Settings,
    config: &mut AdapterConfig,
    default_secret: &str,
    header: &str,
    prefix: &str,
) -> Result<(), String> {
    let secret = s.string("api-key-secret", default_secret)?;
    config.secret = (!secret.is_empty()).then(|| SecretRef {
        name: secret.clone(),
        header: header.to_owned(),
        prefix: prefix.to_owned(),
    });
    config.credential_hint = if secret.is_empty() {
        format!(
            "{} sent none because its `api-key-secret` is empty; name the secret there",
            s.plugin
        )
    } else {
        // keel refuses to send a request whose secret is not set, so a rejection means the
        // key was sent: it is wrong, not missing.
        format!(
            "keel sent the key in {secret} (the environment variable, or `[secrets]` in keel's \
             config; named by `api-key-secret` of {}) and the provider refused it: it may be \
             mistyped, revoked, or meant for another provider or base-url",
            s.plugin
        )
    };
    let retry = &mut config.retry;
    retry.idle_timeout_ms = s.number("idle-timeout-ms", retry.idle_timeout_ms)?.max(1);
    retry.idle_widen_ms = s.number("idle-widen-ms", retry.idle_widen_ms)?;
    retry.base_ms = s.number("retry-base-ms", retry.base_ms)?;
    let attempts = s.number("max-attempts", u64::from(retry.max_attempts))?;
    retry.max_attempts = u32::try_from(attempts.max(1)).unwrap_or(u32::MAX);
    Ok(())
}

/// The adapter `model-openai`'s configuration describes.
pub fn openai(config: &str) -> Result<AdapterConfig, String> {
    let s = Settings::parse("model-openai", config, OPENAI_KEYS)?;
    let mut options = OpenAiOptions::new(s.string("model", "")?);
    options.max_tokens_field = match s.string("max-tokens-field", "max_tokens")?.as_str() {
        "max_tokens" => MaxTokensField::MaxTokens,
        "max_completion_tokens" => MaxTokensField::MaxCompletionTokens,
        other => {
            return Err(format!(
                "model-openai: configuration key `max-tokens-field` must be `max_tokens` or \
                 `max_completion_tokens`, found `{other}`"
            ));
        }
    };
    options.include_usage = s.boolean("include-usage", true)?;
    let mut config = AdapterConfig::openai("");
    config.format = WireFormat::OpenAi(options);
    config.url = endpoint(
        &s,
        &s.string("base-url", "https://api.openai.com/v1")?,
        "chat/completions",
    )?;
    apply_common(
        &s,
        &mut config,
        "OPENAI_API_KEY",
        "authorization",
        "Bearer ",
    )?;
    Ok(config)
}

/// The adapter `model-anthropic`'s configuration describes.
pub fn anthropic(config: &str) -> Result<AdapterConfig, String> {
    let s = Settings::parse("model-anthropic", config, ANTHROPIC_KEYS)?;
    let mut config = AdapterConfig::anthropic("");
    config.format = WireFormat::Anthropic(AnthropicOptions::new(s.string("model", "")?));
    config.url = endpoint(
        &s,
        &s.string("base-url", "https://api.anthropic.com/v1")?,
        "messages",
    )?;
    config.headers = vec![(
        "anthropic-version".to_owned(),
        s.string("anthropic-version", API_VERSION)?,
    )];
    apply_common(&s, &mut config, "ANTHROPIC_API_KEY", "x-api-key", "")?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_defaults_and_overrides() {
        let c = openai("{}").expect("defaults");
        assert_eq!(c.url, "https://api.openai.com/v1/chat/completions");
        let secret = c.secret.clone().expect("a key by default");
        assert_eq!(
            (
                secret.name.as_str(),
                secret.header.as_str(),
                secret.prefix.as_str()
            ),
            ("OPENAI_API_KEY", "authorization", "Bearer ")
        );
        assert!(c.credential_hint.contains("OPENAI_API_KEY"));
        assert_eq!(c.retry.idle_timeout_ms, 120_000);

        let c = openai(
            r#"{"base-url":"http://127.0.0.1:11434/v1/","model":"llama3","api-key-secret":"",
                "max-tokens-field":"max_completion_tokens","idle-timeout-ms":300,
                "max-attempts":"2","include-usage":false}"#,
        )
        .expect("overrides");
        assert_eq!(c.url, "http://127.0.0.1:11434/v1/chat/completions");
        assert!(c.secret.is_none());
        assert_eq!(c.retry.idle_timeout_ms, 300);
        assert_eq!(c.retry.max_attempts, 2);
        match c.format {
            WireFormat::OpenAi(o) => {
                assert_eq!(o.model, "llama3");
                assert_eq!(o.max_tokens_field, MaxTokensField::MaxCompletionTokens);
                assert!(!o.include_usage);
            }
            WireFormat::Anthropic(_) => panic!("wrong format"),
        }
    }

    #[test]
    fn anthropic_defaults() {
        let c = anthropic(r#"{"model":"claude"}"#).expect("defaults");
        assert_eq!(c.url, "https://api.anthropic.com/v1/messages");
        assert_eq!(
            c.headers,
            [("anthropic-version".to_owned(), API_VERSION.to_owned())]
        );
        let secret = c.secret.expect("a key");
        assert_eq!(
            (secret.name.as_str(), secret.header.as_str()),
            ("ANTHROPIC_API_KEY", "x-api-key")
        );
    }

    #[test]
    fn mistakes_are_refused_clearly() {
        let e = openai(r#"{"base_url":"x"}"#).expect_err("unknown key");
        assert!(e.contains("`base_url`") && e.contains("`base-url`"), "{e}");
        let e = openai(r#"{"idle-timeout-ms":"soon"}"#).expect_err("not a number");
        assert!(e.contains("idle-timeout-ms"), "{e}");
        let e = openai(r#"{"base-url":"ftp://x"}"#).expect_err("scheme");
        assert!(e.contains("http://"), "{e}");
        let e = openai(r#"{"max-tokens-field":"tokens"}"#).expect_err("field");
        assert!(e.contains("max_completion_tokens"), "{e}");
        let e = anthropic("[1]").expect_err("not a table");
        assert!(e.contains("table"), "{e}");
    }
}
