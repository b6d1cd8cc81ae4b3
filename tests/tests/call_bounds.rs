//! Every call into a guest is bounded in time: a tool that sleeps forever ends at its
//! deadline, Ctrl-C stops a spinning tool at once and the turn ends cancelled, and a plugin
//! that delegates its work to another cannot escape the CPU bound of the call it serves. In
//! each case the model (or the caller) gets an error result and the plugin stays usable.

use std::sync::Arc;
use std::time::Duration;

use keel_kernel::gates::approvals::PolicyApprover;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{Deadlines, GateConfig, Kernel, KernelConfig, KernelError, PluginState};
use keel_protocol::{
    LogLine, OutcomeStatus, SessionEvent, ToolOutcome, TurnEnd, TurnReport, TurnRequest, services,
};
use keel_tests::Harness;

type R = anyhow::Result<()>;

/// Stops a test that would otherwise hang on a broken bound.
const HANG: Duration = Duration::from_secs(60);

fn harness(
    ws: &std::path::Path,
    data: &std::path::Path,
    deadlines: Deadlines,
) -> anyhow::Result<Harness> {
    Harness::with_kernel(
        ws,
        Some(data.to_owned()),
        None,
        KernelConfig {
            deadlines,
            ..KernelConfig::default()
        },
        GateConfig {
            workspace: Some(ws.to_owned()),
            approver: Arc::new(PolicyApprover(ApprovalMode::Auto)),
            ..GateConfig::locked_down()
        },
    )
}

/// A session with the scripted model playing `script`, the `stall` fixture and the agent.
async fn session(
    ws: &std::path::Path,
    data: &std::path::Path,
    deadlines: Deadlines,
    script: &str,
) -> anyhow::Result<Harness> {
    let h = harness(ws, data, deadlines)?;
    h.load_scripted_model(script).await?;
    h.load_fixture("stall").await?;
    for name in ["tool-registry", "session-log", "agent-loop"] {
        h.load_plugin(name).await?;
    }
    Ok(h)
}

async fn turn(kernel: Kernel, input: &str) -> anyhow::Result<TurnReport> {
    let request = serde_json::to_string(&TurnRequest {
        session: "bounds".into(),
        input: input.into(),
    })?;
    let answer = tokio::time::timeout(HANG, kernel.call_service(services::AGENT, "turn", &request))
        .await??;
    Ok(serde_json::from_str(&answer)?)
}

async fn ping(h: &Harness) -> anyhow::Result<ToolOutcome> {
    Ok(serde_json::from_str(
        &h.kernel.call_tool("stall_ping", "{}").await,
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_sleeping_forever_ends_at_the_tool_deadline_and_the_turn_goes_on() -> R {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = session(
        ws.path(),
        data.path(),
        Deadlines {
            tool: Duration::from_secs(1),
            ..Deadlines::default()
        },
        r#"
[[step]]
text = "Waiting."
[[step.tool_calls]]
name = "stall_sleep"
arguments = {}

[[step]]
expect_tool_result_contains = "within 1 s, the tool-call deadline"
text = "Gave up on it."
"#,
    )
    .await?;
    let report = turn(h.kernel.clone(), "wait for it").await?;
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    assert_eq!(report.text, "Gave up on it.");
    // The stopped instance was replaced: the plugin answers its next call.
    let pong = ping(&h).await?;
    assert_eq!(
        (pong.status, pong.content.as_str()),
        (OutcomeStatus::Ok, "pong")
    );
    assert_eq!(
        h.kernel.status("stall").map(|s| s.state),
        Some(PluginState::Active)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_a_spinning_tool_and_the_turn_ends_cancelled() -> R {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    // No deadline would end the spin within the test: only Ctrl-C (and the 1 s CPU bound,
    // which must not be what ends it) can.
    let h = session(
        ws.path(),
        data.path(),
        Deadlines::default(),
        r#"
[[step]]
text = "Computing."
[[step.tool_calls]]
name = "stall_spin"
arguments = {}

[[step]]
text = "Never reached."
"#,
    )
    .await?;
    let mut bus = h.kernel.events();
    h.kernel.begin_turn();
    let running = tokio::spawn(turn(h.kernel.clone(), "compute"));
    // The tool announces itself just before it starts spinning.
    tokio::time::timeout(HANG, async {
        loop {
            match bus.recv().await {
                Ok(event) if event.topic == "fixture.stall.started" => break,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event bus closed: {e}"),
            }
        }
    })
    .await?;
    h.kernel.cancel_turn();
    let report = running.await??;
    assert_eq!(report.end, TurnEnd::Cancelled, "{report:?}");

    // The model saw the tool's call end as stopped by the person, not as a CPU overrun.
    h.kernel.settle_events().await;
    let log = std::fs::read_to_string(data.path().join("sessions").join("bounds.jsonl"))?;
    let outcome = log
        .lines()
        .filter_map(|l| serde_json::from_str::<LogLine>(l).ok())
        .find_map(|l| match l.event {
            SessionEvent::ToolOutcome { outcome, .. } => Some(outcome),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no tool result in the log:\n{log}"))?;
    assert_eq!(outcome.status, OutcomeStatus::Error, "{outcome:?}");
    assert!(
        outcome.content.contains("cancelled the turn"),
        "{outcome:?}"
    );
    assert!(!outcome.content.contains("cpu"), "{outcome:?}");

    // The next turn finds the plugin and the agent usable.
    h.kernel.begin_turn();
    let pong = ping(&h).await?;
    assert_eq!(
        (pong.status, pong.content.as_str()),
        (OutcomeStatus::Ok, "pong")
    );
    assert_eq!(
        h.kernel.status("agent-loop").map(|s| s.state),
        Some(PluginState::Active)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_relaying_calls_cannot_outrun_the_cpu_bound_of_the_call_it_serves() -> R {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    // A generous service deadline, so what ends the relay is the CPU bound.
    let h = harness(
        ws.path(),
        data.path(),
        Deadlines {
            service: Duration::from_secs(50),
            ..Deadlines::default()
        },
    )?;
    h.load_fixture("spin-loop").await?;
    h.load_fixture("stall").await?;
    let outcome =
        tokio::time::timeout(HANG, h.kernel.call_service("fixture.stall", "relay", "")).await?;
    let message = match outcome {
        Err(KernelError::Failed(m)) => m,
        other => panic!("the relay must be stopped by the CPU bound, got {other:?}"),
    };
    assert!(
        message.contains("stall") && message.contains("guest CPU together"),
        "{message}"
    );
    // Both plugins were bounded, not broken: each answers its next call.
    for service in ["fixture.stall", "fixture.spin"] {
        let answer = h.kernel.call_service(service, "ping", "").await?;
        assert_eq!(answer, "pong", "{service}");
    }
    Ok(())
}

/// Declaring `agent` buys a tool call the longer deadline of a subagent's run only if it
/// opens a child agent: a plugin that just sleeps is stopped at the tool-call deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_agent_does_not_lengthen_a_tool_call_that_opens_no_child() -> R {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = harness(
        ws.path(),
        data.path(),
        Deadlines {
            tool: Duration::from_secs(1),
            ..Deadlines::default()
        },
    )?;
    let (manifest, component) = keel_tests::fixtures::fixture("stall").expect("built");
    let manifest = manifest.replace("[capabilities]\n", "[capabilities]\nagent = true\n");
    h.kernel
        .load(
            h.loader
                .from_embedded("fixture stall", &manifest, component)?,
        )
        .await?;
    let outcome: ToolOutcome = serde_json::from_str(
        &tokio::time::timeout(HANG, h.kernel.call_tool("stall_sleep", "{}")).await?,
    )?;
    assert!(
        outcome
            .content
            .contains("within 1 s, the tool-call deadline")
            && !outcome.content.contains("(tool `"),
        "{outcome:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_spinning_inside_its_turn_is_stopped_by_its_cpu_bound() -> R {
    // A turn has no deadline, so only the CPU bound of its step can end an agent that loops
    // without ever calling out.
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = harness(ws.path(), data.path(), Deadlines::default())?;
    let (manifest, component) = keel_tests::fixtures::fixture("spin-loop").expect("built");
    let manifest = manifest
        .replace(
            "\"fixture.spin\" = \"1.0.0\"\n",
            "\"fixture.spin\" = \"1.0.0\"\nagent = \"1.0.0\"\n",
        )
        .replace("[config]", "[config]\nas-agent = true");
    let package = h
        .loader
        .from_embedded("fixture spin-loop", &manifest, component)?;
    h.kernel.load(package).await?;
    let started = std::time::Instant::now();
    let err = turn(h.kernel.clone(), "spin").await.expect_err("stopped");
    let m = err.to_string();
    assert!(m.contains("cpu"), "{m}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped by the 500 ms bound, not the test's guard: {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_deadline_set_by_the_person_ends_the_turn() -> R {
    // The model stalls (a tool that sleeps, with a tool deadline far beyond the turn's): the
    // person's 2 s turn deadline stops the tool and the agent ends the turn itself.
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = session(
        ws.path(),
        data.path(),
        Deadlines {
            turn: Some(Duration::from_secs(2)),
            ..Deadlines::default()
        },
        r#"
[[step]]
[[step.tool_calls]]
name = "stall_sleep"
arguments = {}

[[step]]
text = "Out of time."
"#,
    )
    .await?;
    let started = std::time::Instant::now();
    let report = turn(h.kernel.clone(), "wait").await?;
    // The tool's own deadline is 300 s: only the turn's 2 s deadline can have stopped it.
    assert!(started.elapsed() < Duration::from_secs(20), "{report:?}");
    // The tool was stopped at the turn's deadline and the agent, in the grace it gets to end
    // the turn itself, closed it with the model's last word.
    assert_eq!(report.tool_calls, 1, "{report:?}");
    assert!(
        matches!(report.end, TurnEnd::Completed | TurnEnd::ModelError),
        "{report:?}"
    );
    Ok(())
}
