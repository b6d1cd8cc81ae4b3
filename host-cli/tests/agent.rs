//! Agent sessions through the `keel` binary: the offline demo, and `keel exec --json`
//! against a loopback server streaming the real OpenAI and Anthropic wire formats.

use std::path::Path;
use std::process::Output;

use assert_cmd::Command;
use common::{json_lines, keel};
use keel_tests::model_server::{ModelServer, json_response, last_chunk, sse, sse_head};
use keel_tests::wire::{oa, oa_done, oa_text};
use serde_json::{Value, json};

use crate::common;

type R = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "sk-e2e-0123456789abcdefghijklmnop";

/// Run a command on a blocking thread so the loopback server keeps serving.
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("keel runs"))
        .await
        .expect("join")
}

fn setup(config: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    std::fs::write(home.path().join("config.toml"), config).expect("config");
    std::fs::write(ws.path().join("hello.txt"), "hi from the workspace\n").expect("file");
    (home, ws)
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_json_runs_a_turn_against_an_openai_compatible_server() -> R {
    let server = ModelServer::start(|n, _| {
        let mut steps = vec![sse_head()];
        if n == 0 {
            steps.push(oa(
                json!({"role": "assistant", "content": "Reading it."}),
                None,
            ));
            steps.push(oa(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "read_file", "arguments": ""}}]}),
                None,
            ));
            for piece in ["{\"pa", "th\": \"hel", "lo.txt\"", "}"] {
                steps.push(oa(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
            steps.push(oa(json!({}), Some("tool_calls")));
        } else {
            steps.push(oa(json!({"content": "The file says hi."}), None));
            steps.push(oa(json!({}), Some("stop")));
        }
        steps.extend(oa_done());
        steps
    })
    .await?;
    let config = format!(
        "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n",
        server.url("/v1")
    );
    let (home, ws) = setup(&config);
    let mut cmd = keel(home.path(), ws.path());
    cmd.env("OPENAI_API_KEY", KEY)
        .args(["exec", "--json", "What does hello.txt say?"]);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let events = json_lines(&out.stdout);
    let outcome = events
        .iter()
        .find(|e| e["event"]["kind"] == "tool_outcome")
        .ok_or("no tool outcome event")?;
    assert_eq!(outcome["event"]["outcome"]["status"], "ok", "{outcome}");
    assert!(
        outcome["event"]["outcome"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("hi from the workspace")
    );
    let report = events.last().ok_or("no events")?;
    assert_eq!(report["topic"], "turn.report");
    assert_eq!(report["report"]["end"], "completed");
    assert_eq!(report["report"]["text"], "The file says hi.");
    let received = server.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(
        received[1]
            .json()
            .to_string()
            .contains("hi from the workspace")
    );
    assert!(!stdout.contains(KEY) && !stderr.contains(KEY));
    // The session log holds the turn; `keel sessions show` reads it without a model.
    let list = keel(home.path(), ws.path())
        .args(["sessions", "list", "--json"])
        .output()?;
    let sessions = json_lines(&list.stdout);
    assert_eq!(
        sessions.len(),
        1,
        "{}",
        String::from_utf8_lossy(&list.stdout)
    );
    let id = sessions[0]["id"].as_str().ok_or("id")?.to_owned();
    let show = keel(home.path(), ws.path())
        .args(["sessions", "show", &id])
        .output()?;
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        shown.contains("read_file") && shown.contains("The file says hi."),
        "{shown}"
    );
    assert!(!shown.contains(KEY));
    Ok(())
}

/// `keel exec` (and so `keel run`, which starts its session the same way) loads the plugin
/// directories of `[plugins] paths`: the model is offered their tools and a call reaches them.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_loads_the_plugins_named_in_plugins_paths() -> R {
    let server = ModelServer::start(|n, _| {
        let mut steps = vec![sse_head()];
        if n == 0 {
            steps.push(oa(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "echo", "arguments": "{\"text\": \"from paths\"}"}}]}),
                None,
            ));
            steps.push(oa(json!({}), Some("tool_calls")));
        } else {
            steps.push(oa(json!({"content": "Echoed."}), None));
            steps.push(oa(json!({}), Some("stop")));
        }
        steps.extend(oa_done());
        steps
    })
    .await?;
    let plugins = tempfile::tempdir()?;
    let extra = plugins.path().join("echo-extra");
    std::fs::create_dir(&extra)?;
    let bundled = keel_bundled_plugins::get("echo-tool").ok_or("echo-tool is bundled")?;
    std::fs::write(
        extra.join("keel.toml"),
        bundled
            .manifest
            .replace("name = \"echo-tool\"", "name = \"echo-extra\""),
    )?;
    std::fs::write(extra.join("echo-tool.wasm"), bundled.component())?;
    let config = format!(
        "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n\
         [plugins]\npaths = [{:?}]\n",
        server.url("/v1"),
        extra.display().to_string()
    );
    let (home, ws) = setup(&config);
    let mut cmd = keel(home.path(), ws.path());
    cmd.env("OPENAI_API_KEY", KEY)
        .args(["exec", "--json", "Echo something."]);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let offered = server.received()[0].json().to_string();
    assert!(
        offered.contains("\"echo\""),
        "echo was not offered: {offered}"
    );
    let outcome = json_lines(&out.stdout)
        .into_iter()
        .find(|e| e["event"]["kind"] == "tool_outcome")
        .ok_or("no tool outcome event")?;
    assert_eq!(outcome["event"]["outcome"]["status"], "ok", "{outcome}");
    assert_eq!(
        outcome["event"]["outcome"]["content"], "from paths",
        "{outcome}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_cut_at_max_tokens_is_not_executed_and_the_notice_goes_back() -> R {
    let server = ModelServer::start(|n, _| {
        let mut steps = vec![sse_head()];
        let ev = |name: &str, data: Value| sse(Some(name), &data);
        steps.push(ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
                   "role": "assistant", "model": "claude-test", "content": [],
                   "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ));
        if n == 0 {
            steps.push(ev("content_block_start", json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}})));
            steps.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"out.txt\", \"content\": \"a very long"}})));
            steps.push(ev("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 64}})));
        } else {
            steps.push(ev("content_block_start", json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}})));
            steps.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "I will split it."}})));
            steps.push(ev("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}})));
        }
        steps.push(ev("message_stop", json!({"type": "message_stop"})));
        steps.push(last_chunk());
        steps
    })
    .await?;
    let config = format!(
        "[model]\nprovider = \"anthropic\"\nmodel = \"claude-test\"\nbase-url = \"{}\"\n",
        server.url("/v1")
    );
    let (home, ws) = setup(&config);
    let mut cmd = keel(home.path(), ws.path());
    cmd.env("ANTHROPIC_API_KEY", KEY).args([
        "exec",
        "--json",
        "--approval",
        "auto",
        "Write a long file.",
    ]);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out.stdout);
    let outcome = events
        .iter()
        .find(|e| e["event"]["kind"] == "tool_outcome")
        .ok_or("no tool outcome")?;
    assert_eq!(
        outcome["event"]["outcome"]["status"], "not_executed",
        "{outcome}"
    );
    assert!(
        !ws.path().join("out.txt").exists(),
        "the cut-off call must not run"
    );
    let second = server.received()[1].json().to_string();
    assert!(second.contains("NOT executed"), "{second}");
    assert_eq!(server.received()[0].header("x-api-key"), Some(KEY));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_authentication_failure_is_not_retried_and_names_the_key_without_showing_it() -> R {
    let server = ModelServer::start(|_, _| {
        vec![json_response(
            "401 Unauthorized",
            &[],
            &format!(r#"{{"error": {{"message": "Incorrect API key provided: {KEY}", "type": "invalid_request_error"}}}}"#),
        )]
    })
    .await?;
    let config = format!(
        "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n",
        server.url("/v1")
    );
    let (home, ws) = setup(&config);
    let mut cmd = keel(home.path(), ws.path());
    cmd.env("OPENAI_API_KEY", KEY)
        .args(["exec", "--json", "hello"]);
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(4), "the model failed");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("OPENAI_API_KEY"), "{all}");
    assert!(!all.contains(KEY), "{all}");
    assert_eq!(server.received().len(), 1, "401 is not retried");
    let audit = std::fs::read_to_string(home.path().join("audit.log"))?;
    assert!(!audit.contains(KEY));
    Ok(())
}

#[test]
fn the_demo_fixes_the_bug_refuses_the_dangerous_command_and_verifies_the_claim() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let out = keel(home.path(), ws.path()).arg("demo").output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("⎿ refused\n") && stdout.contains("is refused: forbid:"),
        "{stdout}"
    );
    assert!(stdout.contains("VerifiedPass"), "{stdout}");
    // The failing test run is labelled with its exit code and shows its last lines.
    assert!(
        stdout.contains("⎿ exit code 101\n    … ") && stdout.contains("test result: FAILED"),
        "{stdout}"
    );
    let stats = keel(home.path(), ws.path())
        .args(["verify", "stats", "--json"])
        .output()?;
    let stats: Value = serde_json::from_slice(&stats.stdout)?;
    assert_eq!(stats["verified_pass"], 1, "{stats}");
    assert_eq!(stats["claim_match_rate"], 1.0, "{stats}");
    Ok(())
}

/// Start `keel exec --json` with `args`, wait until `ready` says the turn is where the test
/// wants it, press Ctrl-C (SIGINT, as a terminal does), and collect the output.
async fn interrupt_exec(
    home: &Path,
    ws: &Path,
    env: (&str, &str),
    args: &[&str],
    ready: impl Fn() -> bool,
) -> Result<Output, Box<dyn std::error::Error>> {
    let mut cmd = common::keel_process(home, ws);
    cmd.env(env.0, env.1)
        .arg("exec")
        .arg("--json")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn()?;
    let pid = child.id().to_string();
    // Bounded: the turn under test gets 60 s to reach the point of interest.
    let mut waited = 0;
    while !ready() {
        if waited > 600 {
            return Err("the turn never reached the point where it is interrupted".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    // Let the partial stream reach the agent before the signal.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()?;
    assert!(status.success(), "kill -INT {pid}");
    Ok(tokio::task::spawn_blocking(move || child.wait_with_output()).await??)
}

/// The `turn_ended` entry of the only session log in `home`.
fn logged_turn_end(home: &Path) -> Result<Value, Box<dyn std::error::Error>> {
    let dir = home.join("data").join("sessions");
    let mut logs = std::fs::read_dir(&dir)?.collect::<Result<Vec<_>, _>>()?;
    assert_eq!(logs.len(), 1, "one session log in {}", dir.display());
    let text = std::fs::read_to_string(logs.remove(0).path())?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["kind"] == "turn_ended")
        .ok_or_else(|| format!("no turn_ended entry in the log:\n{text}").into())
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_ends_a_waiting_model_stream_at_once_and_the_log_records_it() -> R {
    // The model starts answering, then goes quiet for far longer than the test waits.
    let server = ModelServer::start(|_, _| {
        vec![
            sse_head(),
            oa(
                json!({"role": "assistant", "content": "Let me think about th"}),
                None,
            ),
            keel_tests::model_server::Step::Sleep(120_000),
        ]
    })
    .await?;
    let config = format!(
        "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n",
        server.url("/v1")
    );
    let (home, ws) = setup(&config);
    let out = interrupt_exec(
        home.path(),
        ws.path(),
        ("OPENAI_API_KEY", KEY),
        &["Think hard."],
        || !server.received().is_empty(),
    )
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let events = json_lines(&out.stdout);
    let report = events.last().ok_or("no events")?;
    assert_eq!(report["topic"], "turn.report", "{stdout}");
    assert_eq!(report["report"]["end"], "cancelled", "{report}");
    assert_eq!(
        report["report"]["text"], "Let me think about th",
        "{report}"
    );
    assert_eq!(
        server.received().len(),
        1,
        "a cancelled stream is not retried"
    );
    let ended = logged_turn_end(home.path())?;
    assert_eq!(ended["end"], "cancelled", "{ended}");
    assert!(
        ended["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("Ctrl-C"),
        "{ended}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_kills_a_running_command_with_its_children() -> R {
    // The markers are in the workspace: the command's /tmp is the sandbox's own.
    let line = "touch started; (sleep 3; touch survivor) & sleep 60".to_owned();
    let server = ModelServer::start(move |n, _| {
        if n > 0 {
            return oa_text(&["Done."], "stop");
        }
        let args = serde_json::to_string(&json!({ "command": line })).unwrap_or_default();
        let mut steps = vec![
            sse_head(),
            oa(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1",
                       "type": "function", "function": {"name": "exec_shell", "arguments": args}}]}),
                None,
            ),
            oa(json!({}), Some("tool_calls")),
        ];
        steps.extend(oa_done());
        steps
    })
    .await?;
    let config = format!(
        "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n",
        server.url("/v1")
    );
    let (home, ws) = setup(&config);
    let started = ws.path().join("started");
    let survivor = ws.path().join("survivor");
    let out = interrupt_exec(
        home.path(),
        ws.path(),
        ("OPENAI_API_KEY", KEY),
        &["--approval", "auto", "Wait a minute."],
        || started.exists(),
    )
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out.stdout);
    let outcome = events
        .iter()
        .find(|e| e["event"]["kind"] == "tool_outcome")
        .ok_or("no tool outcome")?;
    assert!(
        outcome["event"]["outcome"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("cancelled"),
        "{outcome}"
    );
    let report = events.last().ok_or("no events")?;
    assert_eq!(report["report"]["end"], "cancelled", "{report}");
    assert_eq!(
        server.received().len(),
        1,
        "the turn stops after the command"
    );
    assert_eq!(logged_turn_end(home.path())?["end"], "cancelled");
    // The command's background child belonged to its process group and died with it.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    assert!(
        !survivor.exists(),
        "a child of the cancelled command outlived it"
    );
    Ok(())
}
