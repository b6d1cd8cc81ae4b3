//! A long turn through the binary, for both wire formats: one prompt, 1,000 tool calls whose
//! results are 10 KB each, against a loopback provider that refuses any request over 800 KB
//! with its own overflow error (OpenAI's `context_length_exceeded`, Anthropic's "prompt is too
//! long"). The turn completes; at most one request is refused for length (the loop learns the
//! window from it and compacts inside the turn from then on); every request keeps calls and
//! results paired; the session log records the compactions; `keel resume` continues from the
//! compacted conversation, and a later resume that outgrows the window again is not refused
//! (the window the refusal showed is in the log). Across the turn, the bytes the kernel counts
//! crossing the plugin boundary stay near the bytes of the requests sent: the history crosses
//! once a step, as the request body, not once per door it passes.
//!
//! The OpenAI run has no window configured (the model's name is unknown to keel), the
//! Anthropic one a window larger than the provider's real limit: both learn the real limit from
//! the one refusal.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use keel_tests::model_server::{ModelServer, Step, json_response};
use keel_tests::wire::{an_answer, an_tool_call, oa_answer, oa_tool_call};
use serde_json::Value;

use crate::common::keel;

type R = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "sk-long-turn-0123456789abcdefghijklmn";
/// How a compaction's request is recognised (the plugin's instructions begin so).
const COMPACTION_MARK: &str = "You are keel's compaction step";
/// Tool calls in the turn.
const CALLS: usize = 1000;
/// The provider refuses bodies larger than this.
const LIMIT: usize = 800_000;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Wire {
    OpenAi,
    Anthropic,
}

/// What the provider saw.
#[derive(Default)]
struct Seen {
    /// Tool calls handed out.
    issued: usize,
    /// Hand out calls until this many were (0: [`CALLS`]).
    until: usize,
    /// Requests refused for length.
    refused: usize,
    /// Compactions' requests.
    compactions: usize,
    /// The calls the latest summary says were made.
    summarized: usize,
    /// The largest request body answered.
    largest: usize,
    /// The bytes of every request body received.
    bodies: usize,
    /// The first request that broke the pairing of calls and results.
    malformed: Option<String>,
    /// The first request that was not the conversation as it stands: one without the latest
    /// summary after a compaction, or whose last result is not the last call's.
    stale: Option<String>,
    /// The last request (not a compaction's) after the turn, parsed.
    last: Option<Value>,
}

fn overflow(wire: Wire) -> Vec<Step> {
    let body = match wire {
        Wire::OpenAi => {
            r#"{"error":{"message":"This model's maximum context length is 200000 tokens. However, your messages resulted in 201234 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#
        }
        Wire::Anthropic => {
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 201234 tokens > 200000 maximum"}}"#
        }
    };
    vec![json_response("400 Bad Request", &[], body)]
}

/// Every tool result answers a call made before it in the same request.
fn paired(wire: Wire, body: &Value) -> Result<(), String> {
    let mut calls = std::collections::HashSet::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        match wire {
            Wire::OpenAi => {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    calls.insert(c["id"].as_str().unwrap_or_default().to_owned());
                }
                if m["role"] == "tool" {
                    let id = m["tool_call_id"].as_str().unwrap_or_default();
                    if !calls.remove(id) {
                        return Err(format!("a tool result without its call: {id}"));
                    }
                }
            }
            Wire::Anthropic => {
                for b in m["content"].as_array().into_iter().flatten() {
                    if b["type"] == "tool_use" {
                        calls.insert(b["id"].as_str().unwrap_or_default().to_owned());
                    }
                    if b["type"] == "tool_result" {
                        let id = b["tool_use_id"].as_str().unwrap_or_default();
                        if !calls.remove(id) {
                            return Err(format!("a tool result without its call: {id}"));
                        }
                    }
                }
            }
        }
    }
    if calls.is_empty() {
        Ok(())
    } else {
        Err(format!("calls without a result: {calls:?}"))
    }
}

/// The id of the last tool result in `body`.
fn last_result(wire: Wire, body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let ids = messages.iter().flat_map(|m| match wire {
        Wire::OpenAi => (m["role"] == "tool")
            .then(|| m["tool_call_id"].as_str().map(str::to_owned))
            .flatten()
            .into_iter()
            .collect::<Vec<_>>(),
        Wire::Anthropic => m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .filter_map(|b| b["tool_use_id"].as_str().map(str::to_owned))
            .collect(),
    });
    ids.last()
}

/// The provider: a summary to a compaction, a refusal over [`LIMIT`], else the next
/// `read_file` call until [`CALLS`] were made, then "ALL-READ".
async fn provider(wire: Wire, seen: Arc<Mutex<Seen>>) -> std::io::Result<ModelServer> {
    ModelServer::start_forgetting_bodies(move |_, r| {
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.bodies += r.body.len();
        if r.body.len() > LIMIT {
            seen.refused += 1;
            return overflow(wire);
        }
        seen.largest = seen.largest.max(r.body.len());
        if r.body.contains(COMPACTION_MARK) {
            seen.compactions += 1;
            seen.summarized = seen.issued;
            let summary = format!(
                "SUMMARY-OF-THE-TASK: the person asked to read f0000.txt … f0999.txt in order; \
                 {} read so far, each 10 KB of digits",
                seen.issued
            );
            return match wire {
                Wire::OpenAi => oa_answer(&summary),
                Wire::Anthropic => an_answer(&summary),
            };
        }
        let body: Value = serde_json::from_str(&r.body).unwrap_or_default();
        if let Err(e) = paired(wire, &body)
            && seen.malformed.is_none()
        {
            seen.malformed = Some(e);
        }
        // Each request is the conversation as it stands now: the model adapter renders what
        // it sent before again only while the kernel says the messages are unchanged.
        let summaries = format!("{} read so far", seen.summarized);
        let stale = if seen.compactions > 0 && !r.body.contains(&summaries) {
            Some(format!(
                "request {}: not the latest summary (`{summaries}`)",
                seen.issued
            ))
        } else if seen.issued > 0
            && last_result(wire, &body) != Some(format!("call_{}", seen.issued - 1))
        {
            Some(format!(
                "request {}: the last result is {:?}",
                seen.issued,
                last_result(wire, &body)
            ))
        } else {
            None
        };
        if seen.stale.is_none() {
            seen.stale = stale;
        }
        let until = if seen.until == 0 { CALLS } else { seen.until };
        if seen.issued < until {
            let n = seen.issued;
            seen.issued += 1;
            let args = format!(r#"{{"path": "f{n:04}.txt"}}"#);
            let id = format!("call_{n}");
            return match wire {
                Wire::OpenAi => oa_tool_call(&id, "read_file", &args),
                Wire::Anthropic => an_tool_call(&id, "read_file", &args),
            };
        }
        seen.last = Some(body);
        match wire {
            Wire::OpenAi => oa_answer("ALL-READ"),
            Wire::Anthropic => an_answer("ALL-READ"),
        }
    })
    .await
}

fn key_var(wire: Wire) -> &'static str {
    match wire {
        Wire::OpenAi => "OPENAI_API_KEY",
        Wire::Anthropic => "ANTHROPIC_API_KEY",
    }
}

/// `keel ARGS` with the provider's key; (exit code, stdout, stderr).
async fn keel_with(
    home: &Path,
    ws: &Path,
    wire: Wire,
    args: &[&str],
) -> Result<(Option<i32>, String, String), Box<dyn std::error::Error>> {
    let mut cmd = keel(home, ws);
    cmd.env(key_var(wire), KEY)
        .env("KEEL_LOG", "warn,keel::boundary=debug")
        .env("NO_COLOR", "1")
        .args(args)
        .timeout(std::time::Duration::from_secs(600));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

async fn a_thousand_tool_calls_in_one_turn(wire: Wire) -> R {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = provider(wire, seen.clone()).await?;
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let (provider, model, base, window) = match wire {
        Wire::OpenAi => ("openai", "test-model", server.url("/v1"), String::new()),
        Wire::Anthropic => (
            "anthropic",
            "claude-test",
            server.url(""),
            "context-window = 250000\n".to_owned(),
        ),
    };
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"{provider}\"\nmodel = \"{model}\"\nbase-url = \"{base}\"\n\
             {window}\n[config.agent-loop]\nmax-steps = 2000\n"
        ),
    )?;
    // 1,000 files of 100 lines of 100 characters: about 10 KB each as `read_file` shows them.
    let line = format!("{}\n", "0123456789".repeat(10));
    for n in 0..CALLS {
        std::fs::write(ws.path().join(format!("f{n:04}.txt")), line.repeat(100))?;
    }
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = keel_with(
        home.path(),
        ws.path(),
        wire,
        &[
            "exec",
            "read every file f0000.txt to f0999.txt, one at a time",
        ],
    )
    .await?;
    let took = started.elapsed();
    let tail = |s: &str| {
        s.chars()
            .rev()
            .take(3000)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    };
    {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        eprintln!(
            "{wire:?}: {CALLS} calls in {:.1} s; {} refused, {} compactions, largest request {} \
             bytes",
            took.as_secs_f64(),
            seen.refused,
            seen.compactions,
            seen.largest
        );
        assert_eq!(
            code,
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            tail(&stdout),
            tail(&stderr)
        );
        assert!(
            stdout.contains("ALL-READ"),
            "{}\n{}",
            tail(&stdout),
            tail(&stderr)
        );
        assert_eq!(seen.issued, CALLS);
        assert!(
            seen.refused <= 1,
            "{} requests were refused for length",
            seen.refused
        );
        assert!(seen.compactions >= 1);
        assert!(seen.malformed.is_none(), "{:?}", seen.malformed);
        assert!(seen.stale.is_none(), "{:?}", seen.stale);
        // The history crosses the plugin boundary once a step, as the request body: the
        // kernel's count of bytes across it, every door together, stays near the bytes sent.
        // Were the conversation carried through the loop's model request and on to the
        // adapter, it would be at least twice.
        let crossed: u64 = stderr
            .lines()
            .filter(|l| l.contains("across the plugin boundary"))
            .filter_map(|l| {
                let at = l.find("bytes=")? + "bytes=".len();
                let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .sum();
        let copies = crossed as f64 / seen.bodies as f64;
        eprintln!(
            "{wire:?}: {crossed} bytes across the plugin boundary for {} bytes of requests ({copies:.2}×)",
            seen.bodies
        );
        assert!(
            (0.9..1.5).contains(&copies),
            "{crossed} bytes crossed the plugin boundary for {} bytes of requests",
            seen.bodies
        );
    }
    // The log: every tool outcome, the compactions, a completed turn.
    let entries = crate::common::only_session_log(home.path())?;
    let id = entries
        .first()
        .and_then(|e| e["session"].as_str())
        .ok_or("no session id")?
        .to_owned();
    let outcomes = entries
        .iter()
        .filter(|e| e["kind"] == "tool_outcome")
        .count();
    assert_eq!(outcomes, CALLS);
    let compacted: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "compacted")
        .collect();
    assert!(!compacted.is_empty(), "no compaction in the log");
    let end = entries
        .iter()
        .rev()
        .find(|e| e["kind"] == "turn_ended")
        .ok_or("no turn end")?;
    assert_eq!(end["end"], "completed", "{end}");
    // Resume continues from the compacted conversation: the latest summary, the person's
    // request, not the early results; the request fits and is well-formed.
    let (code, stdout, stderr) =
        keel_with(home.path(), ws.path(), wire, &["resume", &id, "and now?"]).await?;
    assert_eq!(code, Some(0), "{}\n{}", tail(&stdout), tail(&stderr));
    assert!(stdout.contains("ALL-READ"), "{stdout}");
    let last = {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(seen.refused <= 1, "resume was refused for length");
        seen.last
            .as_ref()
            .ok_or("no request after the turn")?
            .to_string()
    };
    assert!(
        last.contains("SUMMARY-OF-THE-TASK"),
        "the summary is carried on"
    );
    assert!(
        last.contains("read every file f0000.txt"),
        "the request is kept"
    );
    assert!(last.contains("and now?"));
    assert!(!last.contains("call_5\""), "early steps are compacted away");
    assert!(last.len() <= LIMIT);

    // A later resume whose conversation outgrows the window again: the window the refusal
    // showed was recorded, so the resumed loop compacts before the provider has to refuse
    // (without it, the OpenAI run, which has no window configured, is refused again).
    const MORE: usize = 150;
    for n in CALLS..CALLS + MORE {
        std::fs::write(ws.path().join(format!("f{n:04}.txt")), line.repeat(100))?;
    }
    seen.lock().unwrap_or_else(PoisonError::into_inner).until = CALLS + MORE;
    let (code, stdout, stderr) = keel_with(
        home.path(),
        ws.path(),
        wire,
        &["resume", &id, "read f1000.txt to f1149.txt too"],
    )
    .await?;
    assert_eq!(code, Some(0), "{}\n{}", tail(&stdout), tail(&stderr));
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(seen.issued, CALLS + MORE);
    assert!(
        seen.refused <= 1,
        "{} requests were refused for length across the resumes",
        seen.refused
    );
    assert!(seen.malformed.is_none(), "{:?}", seen.malformed);
    assert!(seen.stale.is_none(), "{:?}", seen.stale);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_turn_of_a_thousand_tool_calls_completes_with_at_most_one_refusal() -> R {
    a_thousand_tool_calls_in_one_turn(Wire::OpenAi).await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_turn_of_a_thousand_tool_calls_completes_with_at_most_one_refusal() -> R {
    a_thousand_tool_calls_in_one_turn(Wire::Anthropic).await
}
