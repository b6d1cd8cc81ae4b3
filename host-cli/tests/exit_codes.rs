//! `keel exec` for scripts: one exit code per way a run can end, the same in `run` and
//! `resume`; plain stdout holding only the answer; `--json` lines carrying a version and
//! summarising the model's context unless asked for it.

use std::process::Output;

use assert_cmd::Command;
use keel_tests::model_server::{ModelServer, Step, json_response, sse_head};
use keel_tests::wire::{oa, oa_done, oa_text};
use serde_json::json;

use crate::common::{json_lines, keel};

type R = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "sk-exit-0123456789abcdefghijklmnop";

async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("keel runs"))
        .await
        .expect("join")
}

fn dump(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A home configured for `server` and a workspace with one file.
fn setup(server: &ModelServer) -> (tempfile::TempDir, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n\
             [config.model-openai]\nretry-base-ms = 20\n",
            server.url("/v1")
        ),
    )
    .expect("config");
    std::fs::write(ws.path().join("notes.txt"), "the answer is 42\n").expect("file");
    (home, ws)
}

fn exec(home: &std::path::Path, ws: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = keel(home, ws);
    cmd.env("OPENAI_API_KEY", KEY).arg("exec").args(args);
    cmd
}

/// A tool call, then the answer.
async fn reading_server() -> ModelServer {
    ModelServer::start(|n, _| {
        if n % 2 == 1 {
            return oa_text(&["It says", " 42."], "stop");
        }
        let mut steps = vec![sse_head()];
        steps.push(oa(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "read_file",
                                 "arguments": "{\"path\": \"notes.txt\"}"}}]}),
            None,
        ));
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await
    .expect("server")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completed_turn_exits_0_with_only_the_answer_on_stdout() -> R {
    let server = reading_server().await;
    let (home, ws) = setup(&server);
    let out = run(exec(home.path(), ws.path(), &["What do the notes say?"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "It says 42.\n");
    // The transcript — the tool call and its result — is on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("read_file"), "{}", dump(&out));
    assert!(stderr.contains("the answer is 42"), "{}", dump(&out));

    // `[display] result-lines = 0`: the result's label alone.
    let config = home.path().join("config.toml");
    let text = std::fs::read_to_string(&config)? + "[display]\nresult-lines = 0\n";
    std::fs::write(&config, text)?;
    let out = run(exec(home.path(), ws.path(), &["What do the notes say?"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("⎿ ok"), "{}", dump(&out));
    assert!(stderr.contains("line(s) above"), "{}", dump(&out));
    assert!(!stderr.contains("the answer is 42"), "{}", dump(&out));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_carry_a_version_and_summarise_the_context() -> R {
    let server = reading_server().await;
    let (home, ws) = setup(&server);
    let out = run(exec(
        home.path(),
        ws.path(),
        &["--json", "What do the notes say?"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let lines = json_lines(&out.stdout);
    assert!(!lines.is_empty(), "{}", dump(&out));
    assert!(lines.iter().all(|l| l["version"] == 1), "{}", dump(&out));
    let context = lines
        .iter()
        .find(|l| l["event"]["kind"] == "context")
        .ok_or("no context line")?;
    assert!(context["event"].get("system").is_none(), "{context}");
    assert!(
        context["event"]["system_bytes"].as_u64() > Some(100),
        "{context}"
    );
    assert!(
        context["event"]["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == "read_file")),
        "{context}"
    );
    let summarised = out.stdout.len();

    // `--json-requests` shows it whole.
    let out = run(exec(
        home.path(),
        ws.path(),
        &["--json", "--json-requests", "What do the notes say?"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let lines = json_lines(&out.stdout);
    let context = lines
        .iter()
        .find(|l| l["event"]["kind"] == "context")
        .ok_or("no context line")?;
    assert!(context["event"]["system"].is_string(), "{context}");
    assert!(
        out.stdout.len() > summarised + 2000,
        "the schemas are in it"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_broke_off_exits_3_and_keeps_the_partial_answer() -> R {
    let server = ModelServer::start(|_, _| {
        vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": "The answer"}), None),
            oa(json!({"content": " is"}), None),
            Step::Sleep(20),
            Step::Drop,
        ]
    })
    .await?;
    let (home, ws) = setup(&server);
    let out = run(exec(home.path(), ws.path(), &["What is it?"])).await;
    assert_eq!(out.status.code(), Some(3), "{}", dump(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "The answer is\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{}",
        dump(&out)
    );
    let out = run(exec(home.path(), ws.path(), &["--json", "What is it?"])).await;
    assert_eq!(out.status.code(), Some(3), "{}", dump(&out));
    let report = json_lines(&out.stdout).pop().ok_or("no report line")?;
    assert_eq!(report["report"]["end"], "interrupted", "{report}");
    assert_eq!(report["report"]["text"], "The answer is", "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_key_exits_4_and_says_so_without_plumbing() -> R {
    let server = ModelServer::start(|_, _| {
        vec![json_response(
            "401 Unauthorized",
            &[],
            r#"{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}"#,
        )]
    })
    .await?;
    let (home, ws) = setup(&server);
    let out = run(exec(home.path(), ws.path(), &["hello"])).await;
    assert_eq!(out.status.code(), Some(4), "{}", dump(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OPENAI_API_KEY"), "{}", dump(&out));
    assert!(stderr.contains("rejected"), "{}", dump(&out));
    for plumbing in [
        "ModelError",
        "service",
        "method",
        "plugin `",
        "failed: plugin",
    ] {
        assert!(
            !stderr.contains(plumbing),
            "`{plumbing}` in:\n{}",
            dump(&out)
        );
    }
    assert!(out.stdout.is_empty(), "{}", dump(&out));
    Ok(())
}

#[test]
fn bad_usage_exits_2_and_an_error_exits_1() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    // No prompt; an unknown flag.
    for args in [&["exec"][..], &["exec", "--no-such-flag", "hi"][..]] {
        let out = keel(home.path(), ws.path()).args(args).output()?;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", dump(&out));
    }
    // A plugin directory that does not exist: keel cannot start the session (with a key, so
    // the missing key is not what stops it first).
    let out = keel(home.path(), ws.path())
        .env("OPENAI_API_KEY", "sk-test")
        .args(["exec", "--plugin", "/no/such/plugin", "hi"])
        .output()?;
    assert_eq!(out.status.code(), Some(1), "{}", dump(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/no/such/plugin"),
        "{}",
        dump(&out)
    );
    Ok(())
}

/// A tool that fails says what happened in the plugin's words, the way the model reads it,
/// without the kernel's routing (which plugin, which door) around them.
#[test]
fn a_failed_tool_call_says_what_happened_without_the_kernels_routing() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let out = keel(home.path(), ws.path())
        .args(["tool", "call", "read_file", r#"{"path":"nope.txt"}"#])
        .output()?;
    assert_eq!(out.status.code(), Some(1), "{}", dump(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: tool `read_file` failed: nope.txt does not exist"),
        "{stderr}"
    );
    for routing in ["plugin `fs-tools`", "(tool `read_file`)", "failed: failed"] {
        assert!(!stderr.contains(routing), "{routing}: {stderr}");
    }
    Ok(())
}
