//! A live session whose plugins are unloaded and reloaded mid-turn: the turn completes, no
//! session event is lost, and unloaded tools vanish from the next model request.

use std::sync::Arc;
use std::time::Duration;

use keel_kernel::gates::approvals::PolicyApprover;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{GateConfig, PluginState};
use keel_protocol::{LogLine, SessionEvent, TurnEnd, TurnReport, TurnRequest, services, topics};
use keel_tests::Harness;

type R = Result<(), Box<dyn std::error::Error>>;

const SCRIPT: &str = r#"
[[step]]
text = "Waiting for a slow command."
[[step.tool_calls]]
name = "exec_shell"
arguments = { command = "sleep 1" }

[[step]]
text = "Now reading."
[[step.tool_calls]]
name = "exec_shell"
arguments = { command = "cat notes.txt" }

[[step]]
expect_tool_result_contains = "remember me"
text = "Turn one is done."

[[step]]
text = "Turn two is done."
"#;

fn log_lines(path: &std::path::Path) -> Vec<LogLine> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn tools_of_contexts(lines: &[LogLine]) -> Vec<Vec<String>> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            SessionEvent::Context { tools, .. } => {
                Some(tools.iter().map(|t| t.name.clone()).collect())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn unloading_and_reloading_mid_turn_loses_nothing_and_tools_vanish_from_the_next_request() -> R
{
    let ws = tempfile::tempdir()?;
    let ws_path = ws.path().canonicalize()?;
    std::fs::write(ws_path.join("notes.txt"), "remember me\n")?;
    let data = tempfile::tempdir()?;
    let h = Harness::with_gates(
        &ws_path,
        Some(data.path().to_owned()),
        None,
        GateConfig {
            workspace: Some(ws_path.clone()),
            approver: Arc::new(PolicyApprover(ApprovalMode::Auto)),
            ..GateConfig::locked_down()
        },
    )?;
    h.load_scripted_model(SCRIPT).await?;
    for name in [
        "tool-registry",
        "fs-tools",
        "shell",
        "session-log",
        "agent-loop",
    ] {
        let status = h.load_plugin(name).await?;
        assert_eq!(status.state, PluginState::Active, "{name}: {status:?}");
    }
    // Compile the replacement before the turn, so the reload itself is quick.
    let new_session_log = h.plugin("session-log")?;
    let mut bus = h.kernel.events();
    let kernel = h.kernel.clone();
    let turn = tokio::spawn(async move {
        let request = serde_json::to_string(&TurnRequest {
            session: "live".into(),
            input: "do the thing".into(),
        })?;
        let answer = kernel
            .call_service(services::AGENT, "turn", &request)
            .await?;
        Ok::<TurnReport, Box<dyn std::error::Error + Send + Sync>>(serde_json::from_str(&answer)?)
    });
    // While `sleep 1` runs: reload the session log, unload the file tools.
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.kernel.reload(new_session_log).await?;
    h.kernel.unload("fs-tools").await?;
    let report = turn.await?.map_err(|e| e.to_string())?;
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    assert_eq!(report.text, "Turn one is done.");

    // Every session event emitted reaches the log, in order, despite the reload.
    let mut emitted = 0;
    while let Ok(event) = bus.try_recv() {
        if event.topic == topics::SESSION_EVENT {
            emitted += 1;
        }
    }
    let log = data.path().join("sessions").join("live.jsonl");
    // The starts of tool calls are written by a service call, not emitted.
    let started = |lines: &[LogLine]| {
        lines
            .iter()
            .filter(|l| matches!(l.event, SessionEvent::ToolStarted { .. }))
            .count()
    };
    let mut lines = log_lines(&log);
    for _ in 0..100 {
        if lines.len() - started(&lines) >= emitted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        lines = log_lines(&log);
    }
    let started = started(&lines);
    assert!(emitted > 0);
    assert_eq!(
        lines.len() - started,
        emitted,
        "every emitted event is in the log"
    );
    let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, (0..lines.len() as u64).collect::<Vec<_>>());

    // The first request offered read_file; the one after the unload did not.
    let contexts = tools_of_contexts(&lines);
    assert!(contexts.len() >= 2, "{contexts:?}");
    assert!(
        contexts[0].contains(&"read_file".to_owned()),
        "{contexts:?}"
    );
    let last = contexts.last().ok_or("no context")?;
    assert!(!last.contains(&"read_file".to_owned()), "{contexts:?}");
    assert!(last.contains(&"exec_shell".to_owned()), "{contexts:?}");

    // Loading the tools again brings them back for the next turn.
    h.load_plugin("fs-tools").await?;
    let request = serde_json::to_string(&TurnRequest {
        session: "live".into(),
        input: "again".into(),
    })?;
    let answer = h
        .kernel
        .call_service(services::AGENT, "turn", &request)
        .await?;
    let report: TurnReport = serde_json::from_str(&answer)?;
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    assert_eq!(report.text, "Turn two is done.");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let contexts = tools_of_contexts(&log_lines(&log));
    assert!(
        contexts
            .last()
            .is_some_and(|t| t.contains(&"read_file".to_owned())),
        "{contexts:?}"
    );
    Ok(())
}

fn systems_of_contexts(lines: &[LogLine]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            SessionEvent::Context { system, .. } => Some(system.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn plugins_prompt_fragments_reach_the_system_prompt_and_leave_with_their_plugin() -> R {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = Harness::with_data_dir(ws.path(), data.path())?;
    let script = "[[step]]\ntext = \"One.\"\n\n[[step]]\ntext = \"Two.\"\n";
    h.load_scripted_model(script).await?;
    for name in ["tool-registry", "session-log", "agent-loop", "greeter"] {
        let status = h.load_plugin(name).await?;
        assert_eq!(status.state, PluginState::Active, "{name}: {status:?}");
    }
    let turn = |input: &str| {
        let request = serde_json::to_string(&TurnRequest {
            session: "prompt".into(),
            input: input.into(),
        });
        let kernel = h.kernel.clone();
        async move {
            let answer = kernel
                .call_service(services::AGENT, "turn", &request?)
                .await?;
            let report: TurnReport = serde_json::from_str(&answer)?;
            Ok::<_, Box<dyn std::error::Error>>(report)
        }
    };
    assert_eq!(turn("hello").await?.end, TurnEnd::Completed);
    h.kernel.unload("greeter").await?;
    assert_eq!(turn("again").await?.end, TurnEnd::Completed);

    let log = data.path().join("sessions").join("prompt.jsonl");
    let mut systems = Vec::new();
    for _ in 0..100 {
        systems = systems_of_contexts(&log_lines(&log));
        if systems.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        systems.len(),
        2,
        "one context per distinct prompt: {systems:?}"
    );
    assert!(
        systems[0].ends_with("\n\nYou can greet people."),
        "the configured prompt, then the fragment: {:?}",
        systems[0]
    );
    assert!(
        !systems[1].contains("You can greet people."),
        "the fragment left with its plugin: {:?}",
        systems[1]
    );
    assert!(systems[0].starts_with(&systems[1]));
    // The kernel's own service refuses what it does not serve.
    let err = h
        .kernel
        .call_service("keel.gates", "open", "{}")
        .await
        .expect_err("no such kernel service");
    assert!(err.to_string().contains("belongs to the kernel"), "{err}");
    Ok(())
}

/// A session log with `events` turn-ended events of session `name` just emitted to it.
async fn emit_to_session_log(
    name: &str,
    events: usize,
) -> Result<(Harness, tempfile::TempDir, tempfile::TempDir), Box<dyn std::error::Error>> {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = Harness::with_data_dir(ws.path(), data.path())?;
    h.load_plugin("session-log").await?;
    for i in 0..events {
        let event = SessionEvent::TurnEnded {
            session: name.into(),
            end: TurnEnd::Completed,
            detail: format!("turn {i}"),
        };
        h.kernel
            .emit(topics::SESSION_EVENT, &serde_json::to_string(&event)?)?;
    }
    Ok((h, ws, data))
}

#[tokio::test(flavor = "multi_thread")]
async fn unloading_the_session_log_first_writes_every_event_already_queued_for_it() -> R {
    let events = 2_000;
    let (h, _ws, data) = emit_to_session_log("exit", events).await?;
    // At once, as `keel exec` shuts down after its turn: nothing queued may be dropped.
    h.kernel.unload("session-log").await?;
    let lines = log_lines(&data.path().join("sessions").join("exit.jsonl"));
    assert_eq!(lines.len(), events, "every queued event reached the log");
    assert_eq!(lines.last().map(|l| l.seq), Some(events as u64 - 1));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn settling_events_lets_the_host_read_back_everything_emitted() -> R {
    let events = 2_000;
    let (h, _ws, data) = emit_to_session_log("settle", events).await?;
    // As the CLI does before handing a new agent loop the conversation from the log.
    h.kernel.settle_events().await;
    let lines = log_lines(&data.path().join("sessions").join("settle.jsonl"));
    assert_eq!(lines.len(), events, "every emitted event is in the log");
    assert_eq!(
        h.kernel.status("session-log").map(|s| s.state),
        Some(PluginState::Active)
    );
    Ok(())
}
