//! Long sessions: a conversation that outgrows a small configured context window is compacted
//! by the `compaction` plugin through the model, for both wire formats, and goes on; `/compact`
//! on demand; `keel resume` after a compaction; three failed compactions trip the breaker and
//! the loop trims instead; without the plugin the session goes on uncompacted.
//!
//! The model is a loopback server speaking the provider's streaming format: to a person's
//! message it answers with a `read_file` of a 4 KB file, to a tool result with "done", and to
//! a compaction's request (recognised by its instructions) with a summary, or as the test says.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_tests::model_server::{ModelServer, Received, Step, sse_head};
use keel_tests::wire::{an_answer, an_tool_call, oa_answer, oa_tool_call};
use serde_json::Value;

use crate::common::keel;

type R = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "sk-long-0123456789abcdefghijklmnop";
/// How a compaction's request is recognised (the plugin's instructions begin so).
const COMPACTION_MARK: &str = "You are keel's compaction step";

#[derive(Clone, Copy, PartialEq)]
enum Wire {
    OpenAi,
    Anthropic,
}

fn text(wire: Wire, text: &str) -> Vec<Step> {
    match wire {
        Wire::OpenAi => oa_answer(text),
        Wire::Anthropic => an_answer(text),
    }
}

fn read_call(wire: Wire, id: &str) -> Vec<Step> {
    let args = r#"{"path": "big.txt"}"#;
    match wire {
        Wire::OpenAi => oa_tool_call(id, "read_file", args),
        Wire::Anthropic => an_tool_call(id, "read_file", args),
    }
}

fn is_compaction(r: &Received) -> bool {
    r.body.contains(COMPACTION_MARK)
}

/// Whether the request's last message is a tool result (then the answer is "done").
fn ends_with_result(wire: Wire, body: &Value) -> bool {
    let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
    let last = last.unwrap_or_default();
    match wire {
        Wire::OpenAi => last["role"] == "tool",
        Wire::Anthropic => last["content"]
            .as_array()
            .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result")),
    }
}

/// Every tool result in the request answers a call made before it in the same request.
fn well_formed(wire: Wire, body: &Value) -> Result<(), String> {
    let mut calls = std::collections::HashSet::new();
    for m in body["messages"].as_array().cloned().unwrap_or_default() {
        match wire {
            Wire::OpenAi => {
                for c in m["tool_calls"].as_array().cloned().unwrap_or_default() {
                    calls.insert(c["id"].as_str().unwrap_or_default().to_owned());
                }
                if m["role"] == "tool" {
                    let id = m["tool_call_id"].as_str().unwrap_or_default();
                    if !calls.contains(id) {
                        return Err(format!("a tool result without its call: {id}"));
                    }
                }
            }
            Wire::Anthropic => {
                for b in m["content"].as_array().cloned().unwrap_or_default() {
                    if b["type"] == "tool_use" {
                        calls.insert(b["id"].as_str().unwrap_or_default().to_owned());
                    }
                    if b["type"] == "tool_result" {
                        let id = b["tool_use_id"].as_str().unwrap_or_default();
                        if !calls.contains(id) {
                            return Err(format!("a tool result without its call: {id}"));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The model: answers as the module says; `summary(n)` answers the n-th compaction (from 0).
async fn model(
    wire: Wire,
    summary: impl Fn(usize) -> Vec<Step> + Send + Sync + 'static,
) -> std::io::Result<ModelServer> {
    let compactions = Arc::new(AtomicUsize::new(0));
    ModelServer::start(move |n, r| {
        if is_compaction(r) {
            return summary(compactions.fetch_add(1, Ordering::SeqCst));
        }
        if ends_with_result(wire, &r.json()) {
            text(wire, "done")
        } else {
            read_call(wire, &format!("call_{n}"))
        }
    })
    .await
}

fn setup(
    server: &ModelServer,
    wire: Wire,
    window: u64,
) -> std::io::Result<(tempfile::TempDir, tempfile::TempDir)> {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let (provider, model, base) = match wire {
        Wire::OpenAi => ("openai", "gpt-test", server.url("/v1")),
        Wire::Anthropic => ("anthropic", "claude-test", server.url("")),
    };
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"{provider}\"\nmodel = \"{model}\"\nbase-url = \"{base}\"\n\
             context-window = {window}\n"
        ),
    )?;
    std::fs::write(ws.path().join("big.txt"), "0123456789abcdef\n".repeat(240))?;
    Ok((home, ws))
}

fn key_var(wire: Wire) -> &'static str {
    match wire {
        Wire::OpenAi => "OPENAI_API_KEY",
        Wire::Anthropic => "ANTHROPIC_API_KEY",
    }
}

/// `keel run` with `input` on stdin; (stdout, stderr).
async fn run(
    home: &Path,
    ws: &Path,
    wire: Wire,
    args: &[&str],
    input: &str,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let (h, w, input) = (home.to_path_buf(), ws.to_path_buf(), input.to_owned());
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        keel(&h, &w)
            .env(key_var(wire), KEY)
            .args(&args)
            .write_stdin(input)
            .timeout(std::time::Duration::from_secs(120))
            .output()
    })
    .await??;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Five turns of one `read_file` each against a window of 6,000 tokens: the base prompt is
/// about 1,700 tokens and each turn adds about 1,000, so the fourth passes 80% of it.
const FIVE_TURNS: &str = "read 1\nread 2\nread 3\nread 4\nread 5\n";

async fn compacts_and_stays_well_formed(wire: Wire) -> R {
    let server = model(wire, move |_| {
        text(wire, "SUMMARY-OF-EARLIER: big.txt was read three times")
    })
    .await?;
    let (home, ws) = setup(&server, wire, 6000)?;
    let (stdout, stderr) = run(
        home.path(),
        ws.path(),
        wire,
        &["run"],
        &format!("{FIVE_TURNS}/exit\n"),
    )
    .await?;
    assert!(
        stdout.contains("⏺ compacting the conversation"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("⎿ compacted: "), "{stdout}");
    assert_eq!(
        stdout.matches("done").count(),
        5,
        "every turn answered: {stdout}"
    );
    let received = server.received();
    let first = received
        .iter()
        .position(is_compaction)
        .ok_or("no compaction request")?;
    let before = received[..first]
        .iter()
        .rev()
        .find(|r| !is_compaction(r))
        .ok_or("no request before")?;
    let after = received[first..]
        .iter()
        .find(|r| !is_compaction(r))
        .ok_or("no request after")?;
    let sizes: Vec<(bool, usize)> = received
        .iter()
        .map(|r| (is_compaction(r), r.body.len()))
        .collect();
    eprintln!("requests (compaction?, bytes): {sizes:?}");
    assert!(
        after.body.len() < before.body.len(),
        "the request after the compaction ({} bytes) is smaller than the one before ({} bytes)",
        after.body.len(),
        before.body.len()
    );
    assert!(after.body.contains("SUMMARY-OF-EARLIER"), "{}", after.body);
    assert!(
        !after.body.contains("\"read 1\""),
        "the first turn is gone: {}",
        after.body
    );
    for r in received.iter().filter(|r| !is_compaction(r)) {
        well_formed(wire, &r.json())
            .map_err(|e| format!("{e}: {}", r.body.chars().take(300).collect::<String>()))?;
    }
    // The log keeps every original message and records the compaction.
    let entries = crate::common::only_session_log(home.path())?;
    let compacted: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "compacted")
        .collect();
    assert!(!compacted.is_empty(), "no compacted entry");
    assert_eq!(compacted[0]["reason"], "threshold");
    let users = entries
        .iter()
        .filter(|e| e["kind"] == "message" && e["message"]["role"] == "user")
        .map(|e| e["message"].to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        users.contains("read 1"),
        "the original messages stay in the log"
    );
    eprintln!(
        "{wire}: request before {} bytes, after {} bytes",
        before.body.len(),
        after.body.len(),
        wire = if wire == Wire::OpenAi {
            "openai"
        } else {
            "anthropic"
        }
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_openai_session_is_compacted_and_its_requests_stay_well_formed() -> R {
    compacts_and_stays_well_formed(Wire::OpenAi).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_anthropic_session_is_compacted_and_its_requests_stay_well_formed() -> R {
    compacts_and_stays_well_formed(Wire::Anthropic).await
}

#[tokio::test(flavor = "multi_thread")]
async fn compact_on_demand_and_resume_after_a_compaction() -> R {
    let wire = Wire::OpenAi;
    let server = model(wire, move |_| text(wire, "SUMMARY-ON-DEMAND kept big.txt")).await?;
    // A window far larger than the session: only `/compact` compacts.
    let (home, ws) = setup(&server, wire, 1_000_000)?;
    // A pre-compact hook hears of it.
    let config = home.path().join("config.toml");
    let mut settings = std::fs::read_to_string(&config)?;
    settings.push_str("[[hooks.pre-compact]]\ncommand = \"cat > compacting.json\"\n");
    std::fs::write(&config, settings)?;
    let (stdout, stderr) = run(
        home.path(),
        ws.path(),
        wire,
        &["run"],
        "read 1\nread 2\nread 3\n/compact keep the file names\nread 4\n/exit\n",
    )
    .await?;
    assert!(
        stderr.contains("compacted: 4 messages replaced by a summary"),
        "{stdout}\n{stderr}"
    );
    let received = server.received();
    let compactions: Vec<&Received> = received.iter().filter(|r| is_compaction(r)).collect();
    assert_eq!(compactions.len(), 1);
    assert!(compactions[0].body.contains("keep the file names"));
    let last = received.last().ok_or("no request")?;
    assert!(last.body.contains("SUMMARY-ON-DEMAND") && !last.body.contains("\"read 1\""));
    // Resume continues from the compacted conversation.
    let id = crate::common::only_session_log(home.path())?
        .first()
        .and_then(|e| e["session"].as_str().map(str::to_owned))
        .ok_or("no session id")?;
    let heard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join("compacting.json"))?)?;
    assert_eq!(heard["event"], "pre-compact", "{heard}");
    assert_eq!(heard["trigger"], "manual", "{heard}");
    assert_eq!(heard["session"], id.as_str(), "{heard}");
    let before = server.received().len();
    let (stdout, stderr) =
        run(home.path(), ws.path(), wire, &["resume", &id, "read 5"], "").await?;
    assert!(stdout.contains("done"), "{stdout}\n{stderr}");
    let resumed = &server.received()[before];
    assert!(
        resumed.body.contains("SUMMARY-ON-DEMAND") && !resumed.body.contains("\"read 1\""),
        "{}",
        resumed.body
    );
    assert!(resumed.body.contains("read 4"), "{}", resumed.body);
    well_formed(wire, &resumed.json())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn three_failed_compactions_trip_the_breaker_and_the_loop_trims() -> R {
    let wire = Wire::OpenAi;
    // Every summary comes back empty.
    let server = model(wire, move |_| text(wire, "")).await?;
    let (home, ws) = setup(&server, wire, 6000)?;
    let (stdout, stderr) = run(
        home.path(),
        ws.path(),
        wire,
        &["run"],
        &format!("{FIVE_TURNS}read 6\nread 7\nread 8\n/exit\n"),
    )
    .await?;
    let received = server.received();
    assert_eq!(
        received.iter().filter(|r| is_compaction(r)).count(),
        3,
        "no compaction after the third failure"
    );
    assert!(
        stdout.contains("compaction failed (3 of 3)"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("compaction failed 3 times in this session and is off"),
        "{stdout}"
    );
    assert!(stdout.contains("dropped the "), "{stdout}");
    assert_eq!(stdout.matches("done").count(), 8, "{stdout}");
    let entries = crate::common::only_session_log(home.path())?;
    assert!(
        entries
            .iter()
            .any(|e| e["kind"] == "compacted" && e["reason"] == "trimmed")
    );
    for r in received.iter().filter(|r| !is_compaction(r)) {
        well_formed(wire, &r.json())?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_compaction_plugin_the_session_goes_on_uncompacted() -> R {
    let wire = Wire::OpenAi;
    let server = model(wire, move |_| text(wire, "SUMMARY")).await?;
    let (home, ws) = setup(&server, wire, 6000)?;
    let (stdout, stderr) = run(
        home.path(),
        ws.path(),
        wire,
        &["run"],
        &format!("/unload compaction\n{FIVE_TURNS}/exit\n"),
    )
    .await?;
    assert!(stderr.contains("unloaded compaction"), "{stderr}");
    assert_eq!(stdout.matches("done").count(), 5, "{stdout}\n{stderr}");
    assert!(!server.received().iter().any(is_compaction));
    assert!(!stdout.contains("compact"), "{stdout}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_cancels_a_compaction_like_any_model_call() -> R {
    let wire = Wire::OpenAi;
    // The compaction's model call never answers.
    let server = model(wire, |_| vec![sse_head(), Step::Sleep(120_000)]).await?;
    // Three turns under a window far larger than them…
    let (home, ws) = setup(&server, wire, 1_000_000)?;
    run(
        home.path(),
        ws.path(),
        wire,
        &["run"],
        "read 1\nread 2\nread 3\n/exit\n",
    )
    .await?;
    let id = crate::common::only_session_log(home.path())?
        .first()
        .and_then(|e| e["session"].as_str().map(str::to_owned))
        .ok_or("no session id")?;
    // …then resumed under one they overflow: the first request of the turn compacts.
    let config = home.path().join("config.toml");
    let text = std::fs::read_to_string(&config)?.replace("1000000", "5000");
    std::fs::write(&config, text)?;
    let child = crate::common::keel_process(home.path(), ws.path())
        .env(key_var(wire), KEY)
        .args(["resume", &id, "read 4"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let out = crate::common::interrupt_when(child, || server.received().iter().any(is_compaction))
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cancelling the turn"), "{stderr}");
    let entries = crate::common::only_session_log(home.path())?;
    let end = entries
        .iter()
        .rev()
        .find(|e| e["kind"] == "turn_ended")
        .ok_or("no turn end")?;
    assert_eq!(end["end"], "cancelled", "{end}");
    assert!(
        !entries.iter().any(|e| e["kind"] == "compacted"),
        "a cancelled compaction changes nothing"
    );
    Ok(())
}
