//! The model wire formats end to end through the `keel` binary: `keel exec --json` against a
//! loopback server playing the OpenAI Chat Completions and Anthropic Messages streams step by
//! step — parallel tool calls, thinking, every stop reason, a stalled stream, dropped
//! connections and a rate limit — asserting what the person sees on stdout, what the session
//! log keeps and what the server received.
//!
//! Where things surface: every model delta and session event is one JSON line on stdout
//! (`{"topic", "source", "event"}`), the last line is `{"topic": "turn.report", ...}`; an
//! assistant message's neutral stop reason and usage are on its `session.event` of kind
//! `message` and on the same entry in `<home>/data/sessions/<id>.jsonl`. The wire's own
//! spelling of the stop reason (`stop_reason_raw`) does not leave the kernel.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::keel;
use keel_tests::model_server::{ModelServer, Received, Step, json_response, sse_head};
use keel_tests::wire::*;
use serde_json::{Value, json};

use crate::common;

type R = Result<(), Box<dyn std::error::Error>>;

const OPENAI_KEY: &str = "sk-wire-e2e-OpenAi-0123456789abcdefghij";
const ANTHROPIC_KEY: &str = "sk-ant-wire-e2e-Anthropic-0123456789abcdef";
const HELLO: &str = "hi from the workspace";
const NOTES: &str = "notes: remember the milk";

// ---- running the binary --------------------------------------------------------------------

/// A home with `config`, and a workspace with two small files.
fn setup(config: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    std::fs::write(home.path().join("config.toml"), config).expect("config");
    std::fs::write(ws.path().join("hello.txt"), format!("{HELLO}\n")).expect("file");
    std::fs::write(ws.path().join("notes.txt"), format!("{NOTES}\n")).expect("file");
    (home, ws)
}

fn config(provider: &str, model: &str, server: &ModelServer, plugin_settings: &str) -> String {
    format!(
        "[model]\nprovider = \"{provider}\"\nmodel = \"{model}\"\nbase-url = \"{}\"\n\n\
         [config.model-{provider}]\n{plugin_settings}",
        server.url("/v1")
    )
}

/// One `keel exec --json` run.
struct Run {
    out: Output,
    stdout: String,
    stderr: String,
    events: Vec<Value>,
}

impl Run {
    /// `keel exec --json PROMPT` with `key_var=key`, on a blocking thread so that the loopback
    /// server keeps serving.
    async fn exec(home: &Path, ws: &Path, key_var: &str, key: &str, prompt: &str) -> Run {
        let mut cmd = keel(home, ws);
        cmd.env(key_var, key).args(["exec", "--json", prompt]);
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("keel runs"))
            .await
            .expect("join");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let events = common::json_lines(&out.stdout);
        Run {
            out,
            stdout,
            stderr,
            events,
        }
    }

    /// Everything the run printed, for failure messages.
    fn dump(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.out.status.code(),
            self.stdout,
            self.stderr
        )
    }

    /// The `turn.report` line, which must be the last one.
    fn report(&self) -> &Value {
        let last = self.events.last().expect("at least the turn report");
        assert_eq!(last["topic"], "turn.report", "{}", self.dump());
        &last["report"]
    }

    fn session_id(&self) -> String {
        let last = self.events.last().expect("at least the turn report");
        last["session"]
            .as_str()
            .expect("the report names the session")
            .to_owned()
    }

    /// The payloads of the events on `topic`.
    fn on(&self, topic: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["topic"] == topic)
            .map(|e| &e["event"])
            .collect()
    }

    /// The `session.event` payloads of `kind`.
    fn session_events(&self, kind: &str) -> Vec<&Value> {
        self.on("session.event")
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .collect()
    }

    /// The `model.delta` payloads of `type`.
    fn deltas(&self, kind: &str) -> Vec<&Value> {
        self.on("model.delta")
            .into_iter()
            .filter(|d| d["type"] == kind)
            .collect()
    }

    /// The run completed its turn: exit 0 and `end: completed`.
    fn assert_completed(&self) {
        assert!(self.out.status.success(), "{}", self.dump());
        assert_eq!(self.report()["end"], "completed", "{}", self.dump());
    }

    /// `key` appears neither on stdout nor on stderr.
    fn assert_no_key(&self, key: &str) {
        assert!(!self.stdout.contains(key), "key on stdout: {}", self.stdout);
        assert!(!self.stderr.contains(key), "key on stderr: {}", self.stderr);
    }
}

/// The session log file of `id`, as written by the session-log plugin.
fn log_path(home: &Path, id: &str) -> std::path::PathBuf {
    home.join("data")
        .join("sessions")
        .join(format!("{id}.jsonl"))
}

/// The lines of session `id`'s log.
fn log_lines(home: &Path, id: &str) -> Vec<Value> {
    let path = log_path(home, id);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the session log {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a log line is JSON"))
        .collect()
}

/// The assistant `message` entries of a log (or of events), in order.
fn assistant_messages<'a>(entries: impl IntoIterator<Item = &'a Value>) -> Vec<&'a Value> {
    entries
        .into_iter()
        .filter(|e| e["kind"] == "message" && e["message"]["role"] == "assistant")
        .collect()
}

/// The stop reasons of the assistant messages in session `id`'s log, in order.
fn logged_stop_reasons(home: &Path, id: &str) -> Vec<String> {
    let lines = log_lines(home, id);
    assistant_messages(&lines)
        .iter()
        .map(|m| m["stop_reason"].as_str().unwrap_or("<none>").to_owned())
        .collect()
}

/// Every session log file under `home`, concatenated.
fn all_session_logs(home: &Path) -> String {
    let dir = home.join("data").join("sessions");
    let mut all = String::new();
    for entry in std::fs::read_dir(&dir).expect("the sessions folder exists") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            all.push_str(&std::fs::read_to_string(&path).expect("a readable log"));
        }
    }
    all
}

fn retry_reasons(run: &Run) -> Vec<String> {
    run.deltas("retry")
        .iter()
        .map(|d| d["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// ---- the OpenAI stream -----------------------------------------------------------------------

/// `s` in pieces of `n` bytes (ASCII).
fn pieces(s: &str, n: usize) -> Vec<String> {
    s.as_bytes()
        .chunks(n)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

fn oa_args(index: u64, piece: &str) -> Step {
    oa(
        json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
        None,
    )
}

/// The OpenAI request's messages of `role`.
fn oa_messages(request: &Received, role: &str) -> Vec<Value> {
    request.json()["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == role).cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_parallel_tool_calls_with_split_arguments_and_usage_run_in_order() -> R {
    const FIRST: &str = r#"{"path": "hello.txt"}"#;
    const SECOND: &str = r#"{"path": "notes.txt"}"#;
    let server = ModelServer::start(|n, _| {
        let mut steps = vec![sse_head()];
        if n == 0 {
            steps.push(oa(json!({"role": "assistant", "content": null}), None));
            steps.push(oa(json!({"content": "Reading both."}), None));
            steps.push(oa(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                        "function": {"name": "read_file", "arguments": ""}}]}),
                None,
            ));
            let (a, b) = (pieces(FIRST, 3), pieces(SECOND, 3));
            let half = a.len() / 2;
            for p in &a[..half] {
                steps.push(oa_args(0, p));
            }
            // The second call starts while the first one's arguments are still streaming;
            // then their pieces interleave.
            steps.push(oa(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                        "function": {"name": "read_file", "arguments": ""}}]}),
                None,
            ));
            for i in 0..a.len().max(b.len()) {
                if let Some(p) = a.get(half + i) {
                    steps.push(oa_args(0, p));
                }
                if let Some(p) = b.get(i) {
                    steps.push(oa_args(1, p));
                }
            }
            steps.push(oa(json!({}), Some("tool_calls")));
            steps.push(oa_usage(40, 12, 8));
        } else {
            steps.push(oa(json!({"role": "assistant", "content": ""}), None));
            steps.push(oa(json!({"content": "Both files"}), None));
            steps.push(oa(json!({"content": " are read."}), None));
            steps.push(oa(json!({}), Some("stop")));
            steps.push(oa_usage(90, 5, 0));
        }
        steps.extend(oa_done());
        steps
    })
    .await?;
    let (home, ws) = setup(&config("openai", "gpt-test", &server, ""));
    let run = Run::exec(
        home.path(),
        ws.path(),
        "OPENAI_API_KEY",
        OPENAI_KEY,
        "Read hello.txt and notes.txt.",
    )
    .await;
    run.assert_completed();
    run.assert_no_key(OPENAI_KEY);
    let report = run.report();
    assert_eq!(report["text"], "Both files are read.", "{report}");
    assert_eq!(report["steps"], 2, "{report}");
    assert_eq!(report["tool_calls"], 2, "{report}");
    // The turn's usage is the sum of the two final usage chunks.
    assert_eq!(
        report["usage"],
        json!({"input_tokens": 130, "output_tokens": 17, "cache_read_tokens": 8,
               "cache_write_tokens": 0}),
        "{report}"
    );

    // Both calls were announced live, in order, and both ran, in call order.
    let starts: Vec<&Value> = run
        .deltas("tool_call_start")
        .into_iter()
        .map(|d| &d["id"])
        .collect();
    assert_eq!(
        starts,
        [&json!("call_a"), &json!("call_b")],
        "{}",
        run.dump()
    );
    let outcomes = run.session_events("tool_outcome");
    let ids: Vec<&Value> = outcomes.iter().map(|o| &o["outcome"]["call_id"]).collect();
    assert_eq!(ids, [&json!("call_a"), &json!("call_b")], "{}", run.dump());
    for (outcome, expected) in outcomes.iter().zip([HELLO, NOTES]) {
        assert_eq!(outcome["outcome"]["status"], "ok", "{outcome}");
        assert_eq!(outcome["outcome"]["tool"], "read_file", "{outcome}");
        let content = outcome["outcome"]["content"].as_str().unwrap_or_default();
        assert!(content.contains(expected), "{outcome}");
    }

    // The first request asked for the usage chunk; the second carries the assistant message
    // with both calls (arguments reassembled exactly) and both results, in call order.
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    assert_eq!(
        received[0].json()["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(
        received[0].header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    let assistant = oa_messages(&received[1], "assistant");
    assert_eq!(assistant.len(), 1, "{}", received[1].body);
    let calls: Vec<(Value, Value)> = assistant[0]["tool_calls"]
        .as_array()
        .ok_or("the assistant message carries its tool calls")?
        .iter()
        .map(|c| (c["id"].clone(), c["function"]["arguments"].clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (json!("call_a"), json!(FIRST)),
            (json!("call_b"), json!(SECOND))
        ]
    );
    let results = oa_messages(&received[1], "tool");
    assert_eq!(results.len(), 2, "{}", received[1].body);
    assert_eq!(results[0]["tool_call_id"], "call_a");
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap_or_default()
            .contains(HELLO)
    );
    assert_eq!(results[1]["tool_call_id"], "call_b");
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap_or_default()
            .contains(NOTES)
    );

    // The stop reasons and per-call usage are on the assistant messages, in the events and in
    // the session log alike.
    let expected = [
        (
            "tool_use",
            json!({"input_tokens": 40, "output_tokens": 12, "cache_read_tokens": 8,
                   "cache_write_tokens": 0}),
        ),
        (
            "end_turn",
            json!({"input_tokens": 90, "output_tokens": 5, "cache_read_tokens": 0,
                   "cache_write_tokens": 0}),
        ),
    ];
    let lines = log_lines(home.path(), &run.session_id());
    let logged = assistant_messages(&lines);
    assert_eq!(logged.len(), 2, "{lines:#?}");
    for (entry, (stop, usage)) in logged.iter().zip(&expected) {
        assert_eq!(entry["stop_reason"], *stop, "{entry}");
        assert_eq!(entry["usage"], *usage, "{entry}");
    }
    let first_event = assistant_messages(run.on("session.event"))
        .into_iter()
        .next()
        .ok_or("no assistant message event")?;
    assert_eq!(first_event["stop_reason"], "tool_use", "{first_event}");
    assert_eq!(first_event["usage"], expected[0].1, "{first_event}");
    assert!(!all_session_logs(home.path()).contains(OPENAI_KEY));
    Ok(())
}

// ---- the Anthropic stream --------------------------------------------------------------------

fn an_text_block(index: u64, text: &str) -> Vec<Step> {
    vec![
        an_block_start(index, json!({"type": "text", "text": ""})),
        an_delta(index, json!({"type": "text_delta", "text": text})),
        an_block_stop(index),
    ]
}

/// Whether an Anthropic request carries a tool result.
fn an_has_tool_result(request: &Received) -> bool {
    request.json()["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .any(|b| b["type"] == "tool_result")
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_thinking_is_kept_without_its_signature_and_a_split_tool_call_runs() -> R {
    const SIGNATURE: &str = "EqQBCkYIBxgCKkBSIGNATURE-wire-e2e-do-not-store";
    let server = ModelServer::start(|n, _| {
        let mut steps = vec![sse_head()];
        if n == 0 {
            steps.push(an_start(25, 100));
            steps.push(an("ping", json!({"type": "ping"})));
            steps.push(an_block_start(
                0,
                json!({"type": "thinking", "thinking": ""}),
            ));
            steps.push(an_delta(
                0,
                json!({"type": "thinking_delta", "thinking": "The user wants"}),
            ));
            steps.push(an_delta(
                0,
                json!({"type": "thinking_delta", "thinking": " the greeting."}),
            ));
            steps.push(an_delta(
                0,
                json!({"type": "signature_delta", "signature": SIGNATURE}),
            ));
            steps.push(an_block_stop(0));
            steps.extend(an_text_block(1, "Let me read it."));
            steps.push(an_block_start(
                2,
                json!({"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {}}),
            ));
            for piece in ["", "{\"pa", "th\": \"hel", "lo.t", "xt\"}"] {
                steps.push(an_delta(
                    2,
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            steps.push(an_block_stop(2));
            steps.extend(an_end("tool_use", 89));
        } else {
            steps.push(an_start(300, 0));
            steps.extend(an_text_block(0, "It says hi."));
            steps.extend(an_end("end_turn", 6));
        }
        steps
    })
    .await?;
    let (home, ws) = setup(&config("anthropic", "claude-test", &server, ""));
    let run = Run::exec(
        home.path(),
        ws.path(),
        "ANTHROPIC_API_KEY",
        ANTHROPIC_KEY,
        "What does hello.txt say?",
    )
    .await;
    run.assert_completed();
    run.assert_no_key(ANTHROPIC_KEY);
    assert_eq!(run.report()["text"], "It says hi.", "{}", run.dump());

    // The thinking streamed live and is kept as a thinking block.
    let thinking: String = run
        .deltas("thinking")
        .into_iter()
        .filter_map(|d| d["text"].as_str())
        .collect();
    assert_eq!(thinking, "The user wants the greeting.", "{}", run.dump());
    let id = run.session_id();
    let lines = log_lines(home.path(), &id);
    let logged = assistant_messages(&lines);
    assert_eq!(logged.len(), 2, "{lines:#?}");
    assert_eq!(
        logged[0]["message"]["content"],
        json!([
            {"type": "thinking", "text": "The user wants the greeting."},
            {"type": "text", "text": "Let me read it."},
            {"type": "tool_call", "id": "toolu_01", "name": "read_file",
             "arguments": "{\"path\": \"hello.txt\"}"},
        ]),
        "{}",
        logged[0]
    );
    // Both stop reasons were handled: the call ran, then the turn ended.
    assert_eq!(logged[0]["stop_reason"], "tool_use");
    assert_eq!(logged[1]["stop_reason"], "end_turn");
    assert_eq!(
        logged[0]["usage"],
        json!({"input_tokens": 125, "output_tokens": 89, "cache_read_tokens": 100,
               "cache_write_tokens": 0})
    );
    let outcomes = run.session_events("tool_outcome");
    assert_eq!(outcomes.len(), 1, "{}", run.dump());
    assert_eq!(outcomes[0]["outcome"]["call_id"], "toolu_01");
    assert_eq!(outcomes[0]["outcome"]["status"], "ok", "{}", outcomes[0]);
    assert!(
        outcomes[0]["outcome"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains(HELLO)
    );

    // The vendor signature is nowhere: not on stdout or stderr, not in any session log, not
    // in what `keel sessions show --json` prints, not sent back.
    assert!(!run.stdout.contains(SIGNATURE), "{}", run.stdout);
    assert!(!run.stderr.contains(SIGNATURE), "{}", run.stderr);
    let logs = all_session_logs(home.path());
    assert!(logs.contains("The user wants the greeting."), "{logs}");
    assert!(!logs.contains(SIGNATURE), "{logs}");
    assert!(!logs.contains(ANTHROPIC_KEY));
    let show = keel(home.path(), ws.path())
        .args(["sessions", "show", &id, "--json"])
        .output()?;
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "{shown}");
    assert!(shown.contains("The user wants the greeting."), "{shown}");
    assert!(!shown.contains(SIGNATURE), "{shown}");

    let received = server.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    assert_eq!(received[0].header("x-api-key"), Some(ANTHROPIC_KEY));
    assert!(!received[1].body.contains(SIGNATURE));
    assert!(an_has_tool_result(&received[1]), "{}", received[1].body);
    let tool_use = received[1].json()["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .ok_or("the second request repeats the tool_use block")?;
    assert_eq!(tool_use["id"], "toolu_01");
    assert_eq!(tool_use["input"], json!({"path": "hello.txt"}));
    Ok(())
}

// ---- every stop reason -----------------------------------------------------------------------

/// The `finish:<reason>` the prompt of the run asks the fake server for.
fn requested_finish(text: &str) -> Option<String> {
    text.strip_prefix("finish:").map(str::to_owned)
}

/// Run one prompt per case (`finish:<wire stop reason>`, which the test's server answers
/// with that stop reason) and check the neutral stop reasons logged for its model calls: a
/// text answer for one, a tool call and then a text answer for two.
async fn assert_stop_reasons(
    server: &ModelServer,
    (home, ws): (&Path, &Path),
    (key_var, key): (&str, &str),
    cases: &[(&str, &[&str])],
) {
    for &(wire, expected) in cases {
        let before = server.received().len();
        let run = Run::exec(home, ws, key_var, key, &format!("finish:{wire}")).await;
        run.assert_completed();
        run.assert_no_key(key);
        assert_eq!(
            logged_stop_reasons(home, &run.session_id()),
            *expected,
            "stop reason {wire}"
        );
        assert_eq!(
            server.received().len() - before,
            expected.len(),
            "stop reason {wire}: one request per model call"
        );
        if expected.len() == 1 {
            assert_eq!(run.report()["text"], "Some text", "{wire}: {}", run.dump());
            assert!(run.session_events("tool_outcome").is_empty(), "{wire}");
        } else {
            let outcomes = run.session_events("tool_outcome");
            assert_eq!(outcomes.len(), 1, "{wire}: {}", run.dump());
            assert_eq!(outcomes[0]["outcome"]["status"], "ok", "{wire}");
            assert_eq!(run.report()["text"], "Finished.", "{wire}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_finish_reasons_map_to_the_neutral_stop_reasons() -> R {
    let server = ModelServer::start(|_, request| {
        // After a tool call the conversation ends normally.
        if !oa_messages(request, "tool").is_empty() {
            return oa_text(&["Finished."], "stop");
        }
        let finish = oa_messages(request, "user")
            .iter()
            .filter_map(|m| m["content"].as_str().and_then(requested_finish))
            .next_back()
            .unwrap_or_default();
        match finish.as_str() {
            // A call, finishing with `tool_calls` — or, as some servers report it, `stop`.
            "tool_calls" | "stop-with-calls" => {
                let mut steps = vec![
                    sse_head(),
                    oa(
                        json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                "function": {"name": "read_file",
                                             "arguments": "{\"path\": \"hello.txt\"}"}}]}),
                        None,
                    ),
                    oa(
                        json!({}),
                        Some(if finish == "tool_calls" {
                            "tool_calls"
                        } else {
                            "stop"
                        }),
                    ),
                ];
                steps.extend(oa_done());
                steps
            }
            other => oa_text(&["Some", " text"], other),
        }
    })
    .await?;
    // One home for all cases: the compiled components are cached across the runs.
    let (home, ws) = setup(&config("openai", "gpt-test", &server, ""));
    let cases: [(&str, &[&str]); 5] = [
        ("stop", &["end_turn"]),
        ("length", &["max_tokens"]),
        ("content_filter", &["refusal"]),
        ("tool_calls", &["tool_use", "end_turn"]),
        ("stop-with-calls", &["tool_use", "end_turn"]),
    ];
    assert_stop_reasons(
        &server,
        (home.path(), ws.path()),
        ("OPENAI_API_KEY", OPENAI_KEY),
        &cases,
    )
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_stop_reasons_map_to_the_neutral_stop_reasons() -> R {
    let server = ModelServer::start(|_, request| {
        let mut steps = vec![sse_head(), an_start(10, 0)];
        if an_has_tool_result(request) {
            steps.extend(an_text_block(0, "Finished."));
            steps.extend(an_end("end_turn", 2));
            return steps;
        }
        let stop = request.json()["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter_map(|b| b["text"].as_str().and_then(requested_finish))
            .next_back()
            .unwrap_or_default();
        if stop == "tool_use" {
            steps.push(an_block_start(
                0,
                json!({"type": "tool_use", "id": "toolu_x", "name": "read_file", "input": {}}),
            ));
            steps.push(an_delta(
                0,
                json!({"type": "input_json_delta", "partial_json": "{\"path\": \"hello.txt\"}"}),
            ));
            steps.push(an_block_stop(0));
        } else {
            steps.extend(an_text_block(0, "Some text"));
        }
        steps.extend(an_end(&stop, 3));
        steps
    })
    .await?;
    let (home, ws) = setup(&config("anthropic", "claude-test", &server, ""));
    let cases: [(&str, &[&str]); 5] = [
        ("end_turn", &["end_turn"]),
        ("max_tokens", &["max_tokens"]),
        ("stop_sequence", &["stop_sequence"]),
        ("refusal", &["refusal"]),
        ("tool_use", &["tool_use", "end_turn"]),
    ];
    assert_stop_reasons(
        &server,
        (home.path(), ws.path()),
        ("ANTHROPIC_API_KEY", ANTHROPIC_KEY),
        &cases,
    )
    .await;
    Ok(())
}

// ---- failures --------------------------------------------------------------------------------

/// `keel exec --json hi` against `server` as an OpenAI-compatible endpoint with the plugin
/// `settings`, after retries: it must complete with `text`, never show the key, and log one
/// answer that ended its turn.
async fn retried_openai_turn(server: &ModelServer, settings: &str, text: &str) -> Run {
    let (home, ws) = setup(&config("openai", "gpt-test", server, settings));
    let run = Run::exec(home.path(), ws.path(), "OPENAI_API_KEY", OPENAI_KEY, "hi").await;
    run.assert_completed();
    run.assert_no_key(OPENAI_KEY);
    assert_eq!(run.report()["text"], text, "{}", run.dump());
    assert_eq!(
        logged_stop_reasons(home.path(), &run.session_id()),
        ["end_turn"]
    );
    run
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stream_with_nothing_received_is_retried_transparently() -> R {
    let server = ModelServer::start(|n, _| {
        if n == 0 {
            // The head, then silence far longer than the watchdog.
            vec![sse_head(), Step::Sleep(10_000)]
        } else {
            oa_text(&["Recovered."], "stop")
        }
    })
    .await?;
    let run = retried_openai_turn(
        &server,
        "idle-timeout-ms = 300\nretry-base-ms = 20\n",
        "Recovered.",
    )
    .await;
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    // The same request was sent again.
    assert_eq!(received[0].body, received[1].body);
    let retries = retry_reasons(&run);
    assert_eq!(retries.len(), 1, "{}", run.dump());
    assert!(
        retries[0].contains("stalled") && retries[0].contains("nothing received"),
        "{retries:?}"
    );
    assert_eq!(run.deltas("retry")[0]["attempt"], 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_dropped_before_anything_arrived_is_retried_transparently() -> R {
    let server = ModelServer::start(|n, _| match n {
        // Cut before the response head.
        0 => vec![Step::Drop],
        // Cut after the head and a chunk without content, before the terminal event.
        1 => vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": ""}), None),
            Step::Sleep(50),
            Step::Drop,
        ],
        _ => oa_text(&["Third", " time lucky."], "stop"),
    })
    .await?;
    let run = retried_openai_turn(&server, "retry-base-ms = 20\n", "Third time lucky.").await;
    assert_eq!(server.received().len(), 3);
    let retries = retry_reasons(&run);
    assert_eq!(retries.len(), 2, "{}", run.dump());
    assert!(retries[0].contains("connection failed"), "{retries:?}");
    assert!(
        retries[1].contains("interrupted") && retries[1].contains("nothing received"),
        "{retries:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_dropped_after_partial_text_is_an_interruption_not_a_retry() -> R {
    let server = ModelServer::start(|_, _| {
        vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": ""}), None),
            oa(json!({"content": "The answer"}), None),
            oa(json!({"content": " is"}), None),
            Step::Sleep(50),
            Step::Drop,
        ]
    })
    .await?;
    let (home, ws) = setup(&config(
        "openai",
        "gpt-test",
        &server,
        "retry-base-ms = 20\n",
    ));
    let run = Run::exec(
        home.path(),
        ws.path(),
        "OPENAI_API_KEY",
        OPENAI_KEY,
        "What is it?",
    )
    .await;
    run.assert_no_key(OPENAI_KEY);
    // What arrived is presented as is: the agent loop ends the turn with the partial text
    // (an answer without tool calls) as `interrupted`, so keel exits 3; the report's detail
    // and the message's stop reason say it broke off.
    assert_eq!(run.report()["end"], "interrupted", "{}", run.dump());
    assert_eq!(run.out.status.code(), Some(3), "{}", run.dump());
    assert_eq!(run.report()["text"], "The answer is", "{}", run.dump());
    let detail = run.report()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("may be incomplete"), "{detail}");
    assert_eq!(run.report()["steps"], 1);
    assert_eq!(run.report()["tool_calls"], 0);
    assert_eq!(
        server.received().len(),
        1,
        "billed partial output is not resent"
    );
    assert!(retry_reasons(&run).is_empty(), "{}", run.dump());
    let lines = log_lines(home.path(), &run.session_id());
    let logged = assistant_messages(&lines);
    assert_eq!(logged.len(), 1, "{lines:#?}");
    assert_eq!(logged[0]["stop_reason"], "interrupted", "{}", logged[0]);
    assert_eq!(
        logged[0]["message"]["content"],
        json!([{"type": "text", "text": "The answer is"}])
    );
    let event = assistant_messages(run.on("session.event"))
        .into_iter()
        .next()
        .ok_or("no assistant message event")?;
    assert_eq!(event["stop_reason"], "interrupted", "{event}");
    let ended: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "turn_ended").collect();
    assert_eq!(ended.len(), 1, "{lines:#?}");
    assert_eq!(ended[0]["end"], "interrupted", "{}", ended[0]);
    assert_eq!(ended[0]["detail"], detail.as_str());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_waits_for_retry_after_then_the_turn_completes() -> R {
    let server = ModelServer::start(|n, _| {
        if n == 0 {
            vec![json_response(
                "429 Too Many Requests",
                &[("retry-after", "1")],
                r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#,
            )]
        } else {
            oa_text(&["Done."], "stop")
        }
    })
    .await?;
    // A tiny backoff base: any wait of a second comes from Retry-After.
    let run = retried_openai_turn(&server, "retry-base-ms = 20\n", "Done.").await;
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    // Causality, not performance: the resend came no earlier than the server asked.
    let waited = received[1].at.duration_since(received[0].at);
    assert!(waited >= Duration::from_secs(1), "resent after {waited:?}");
    let retries = retry_reasons(&run);
    assert_eq!(retries.len(), 1, "{}", run.dump());
    assert!(
        retries[0].contains("rate limited (HTTP 429)") && retries[0].contains("1.0 s"),
        "{retries:?}"
    );
    Ok(())
}
