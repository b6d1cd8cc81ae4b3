//! `keel plugin test DIR [--calls FILE]`: call a plugin's tools and services in a real kernel
//! — the plugins a session of this config loads, and this one — with inputs from a file, print
//! each result and check what the file expects. No model is involved, and every tool call
//! passes the same gate pipeline as a model's. The exit status says whether every expectation
//! held, so a `cargo test` or a CI step can run it.
//!
//! The calls file (default `DIR/keel-test.toml`):
//!
//! ```toml
//! [[call]]
//! tool = "word_count"
//! input = { text = "hello keel world" }
//! expect = { chars = 16, words = 3 }      # the result, as JSON, equals this
//!
//! [[call]]
//! service = "text.upper"
//! method = "upper"
//! payload = "hi"
//! expect-contains = "HI"                  # the result's text contains this
//!
//! [[call]]
//! tool = "word_count"
//! input = {}
//! expect-error = true                     # the call fails (or is refused)
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::config::Context;
use crate::runtime::Runtime;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Calls {
    #[serde(default, rename = "call")]
    calls: Vec<Call>,
}

/// One call and what it should give.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Call {
    tool: Option<String>,
    input: Option<serde_json::Value>,
    service: Option<String>,
    method: Option<String>,
    payload: Option<String>,
    expect: Option<serde_json::Value>,
    expect_contains: Option<String>,
    #[serde(default)]
    expect_error: bool,
}

/// What a call gave: its text, and whether it failed.
struct Answer {
    text: String,
    failed: bool,
}

/// `keel plugin test`.
pub async fn run(ctx: &Context, dir: &Path, calls: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let file = calls.unwrap_or_else(|| dir.join("keel-test.toml"));
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "cannot read the calls file `{}`; write one (`[[call]]` tables: `tool` and `input`, \
             or `service`, `method` and `payload`, with `expect`, `expect-contains` or \
             `expect-error`) or pass --calls FILE",
            file.display()
        )
    })?;
    let Calls { calls } = toml::from_str(&text)
        .with_context(|| format!("`{}` is not a valid calls file", file.display()))?;
    if calls.is_empty() {
        bail!("`{}` has no [[call]] tables", file.display());
    }
    let rt = Runtime::with_plugins(ctx, &[dir.to_path_buf()]).await?;
    let mut failed = 0;
    for (i, call) in calls.iter().enumerate() {
        let (what, answer) = match invoke(&rt, call).await {
            Ok(done) => done,
            Err(e) => {
                failed += 1;
                stdoutln!("✘ call {}: {e:#}", i + 1);
                continue;
            }
        };
        match judge(call, &answer) {
            Ok(()) => stdoutln!("✔ {what} → {}", answer.text),
            Err(why) => {
                failed += 1;
                stdoutln!("✘ {what} → {}\n  {why}", answer.text);
            }
        }
    }
    rt.kernel.shutdown().await?;
    let n = calls.len();
    if failed == 0 {
        stdoutln!("{n} call(s), all as expected");
        Ok(ExitCode::SUCCESS)
    } else {
        stdoutln!("{n} call(s), {failed} not as expected");
        Ok(ExitCode::from(1))
    }
}

/// Make `call`; what was called, in words, and its answer.
async fn invoke(rt: &Runtime, call: &Call) -> anyhow::Result<(String, Answer)> {
    match (&call.tool, &call.service) {
        (Some(tool), None) => {
            let input = call
                .input
                .clone()
                .unwrap_or_else(|| serde_json::json!({}))
                .to_string();
            let outcome = rt.kernel.call_tool(tool, &input).await;
            let outcome: keel_protocol::ToolOutcome =
                serde_json::from_str(&outcome).context("the kernel answered malformed data")?;
            Ok((
                format!("tool {tool} {input}"),
                Answer {
                    failed: outcome.is_error(),
                    text: outcome.content,
                },
            ))
        }
        (None, Some(service)) => {
            let method = call
                .method
                .as_deref()
                .context("a service call needs `method`")?;
            let payload = call.payload.clone().unwrap_or_default();
            let answer = match rt.kernel.call_service(service, method, &payload).await {
                Ok(text) => Answer {
                    text,
                    failed: false,
                },
                Err(e) => Answer {
                    text: e.to_string(),
                    failed: true,
                },
            };
            Ok((format!("service {service}.{method} {payload:?}"), answer))
        }
        _ => bail!("a call names either `tool` or `service`"),
    }
}

/// Whether `answer` is what `call` expects; why not, if not.
fn judge(call: &Call, answer: &Answer) -> Result<(), String> {
    if answer.failed != call.expect_error {
        return Err(if answer.failed {
            "it failed".to_owned()
        } else {
            "it was expected to fail".to_owned()
        });
    }
    if let Some(expected) = &call.expect {
        match serde_json::from_str::<serde_json::Value>(&answer.text) {
            Ok(got) if got == *expected => {}
            Ok(_) => return Err(format!("expected {expected}")),
            Err(_) => {
                return Err(format!(
                    "expected the JSON {expected}; the result is not JSON"
                ));
            }
        }
    }
    if let Some(part) = &call.expect_contains
        && !answer.text.contains(part.as_str())
    {
        return Err(format!("expected it to contain {part:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(text: &str) -> Call {
        let Calls { mut calls } = toml::from_str(text).expect("calls file");
        calls.remove(0)
    }

    #[test]
    fn expectations_are_judged() {
        let ok = |text: &str| Answer {
            text: text.into(),
            failed: false,
        };
        let exact = call("[[call]]\ntool = \"t\"\nexpect = { words = 3 }\n");
        assert_eq!(judge(&exact, &ok(r#"{"words":3}"#)), Ok(()));
        assert!(judge(&exact, &ok(r#"{"words":4}"#)).is_err());
        assert!(judge(&exact, &ok("three")).is_err());
        let part = call("[[call]]\ntool = \"t\"\nexpect-contains = \"HI\"\n");
        assert_eq!(judge(&part, &ok("say HI")), Ok(()));
        assert!(judge(&part, &ok("say hi")).is_err());
        let fails = call("[[call]]\ntool = \"t\"\nexpect-error = true\n");
        assert!(judge(&fails, &ok("fine")).is_err());
        let failed = Answer {
            text: "no".into(),
            failed: true,
        };
        assert_eq!(judge(&fails, &failed), Ok(()));
        assert!(judge(&exact, &failed).is_err());
        assert!(toml::from_str::<Calls>("[[call]]\ntol = \"t\"\n").is_err());
    }
}
