//! Long-lived processes (ABI 0.3.0): the `mcp` plugin starts the servers of its entries, their
//! tools serve calls, and unloading the plugin kills them — the start is an effect in its undo
//! log like every other, so an unloaded plugin leaves no process behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_kernel::{GateConfig, PluginState, ProcessEntry};
use keel_tests::Harness;

type R = anyhow::Result<()>;

/// The hostile MCP server fixture (the official Python SDK), with `marker` as an argument so
/// the test can find its processes. Its folder is granted for reading: a checkout under `/tmp`
/// would otherwise be hidden by the sandbox's private `/tmp`.
fn server_entry(marker: &str) -> ProcessEntry {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    ProcessEntry {
        command: "python3".into(),
        args: vec![
            fixtures.join("mcp_misbehaving.py").display().to_string(),
            marker.to_owned(),
        ],
        read: vec![fixtures],
        ..ProcessEntry::default()
    }
}

/// The processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // A zombie is dead; only its parent's wait is missing.
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            !zombie
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

/// Wait (bounded) until no process holds `marker`.
async fn gone(marker: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if processes_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

fn harness(dir: &Path, marker: &str) -> anyhow::Result<Harness> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws)?;
    let ws = ws.canonicalize()?;
    let gates = GateConfig {
        workspace: Some(ws.clone()),
        processes: BTreeMap::from([(
            "mcp".to_owned(),
            BTreeMap::from([("bad".to_owned(), server_entry(marker))]),
        )]),
        ..GateConfig::locked_down()
    };
    let cache: PathBuf = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("processes-cache");
    Harness::with_gates(&ws, None, Some(cache), gates)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_the_plugin_kills_its_servers_and_leaves_nothing_behind() -> R {
    let dir = tempfile::tempdir()?;
    let marker = format!("keel-test-marker-{}", std::process::id());
    let h = harness(dir.path(), &marker)?;
    let before = h.kernel.fingerprint();
    let status = h.load_bundled("mcp").await?;
    assert_eq!(status.state, PluginState::Active, "{status:?}");
    let env = h.kernel.env();
    let records: Vec<_> = env.processes().values().collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (records[0].owner.as_str(), records[0].entry.as_str()),
        ("mcp", "bad")
    );
    assert!(
        !processes_with(&marker).is_empty(),
        "the server runs while the plugin is loaded"
    );
    // Its tools serve calls through the process.
    let answer = h
        .kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"hello"}"#)
        .await?;
    assert!(answer.contains("echo: hello"), "{answer}");

    h.kernel.unload("mcp").await?;
    assert!(h.kernel.env().processes().is_empty());
    assert_eq!(
        h.kernel.fingerprint(),
        before,
        "the unload left something behind"
    );
    assert!(
        gone(&marker).await,
        "a server outlived its plugin: {:?}",
        processes_with(&marker)
    );
    Ok(())
}

/// Another plugin — even one declaring `processes` — cannot read, inspect or kill a process it
/// did not start: handles are checked against their owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_plugin_cannot_reach_a_plugins_process() -> R {
    let dir = tempfile::tempdir()?;
    let marker = format!("keel-test-foreign-{}", std::process::id());
    let h = harness(dir.path(), &marker)?;
    h.load_bundled("mcp").await?;
    let held: Vec<u32> = h.kernel.env().processes().keys().copied().collect();
    assert_eq!(held, vec![1], "the server holds handle 1");
    h.kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"first"}"#)
        .await?;
    let (manifest, component) = keel_tests::fixtures::fixture("snooper").expect("built");
    let manifest = manifest.replace("[capabilities]\n", "[capabilities]\nprocesses = true\n");
    let package = h
        .loader
        .from_embedded("fixture snooper", &manifest, component)?;
    h.kernel.load(package).await?;
    let answer = h.kernel.call_service("fixture.snoop", "try", "").await?;
    for what in ["process-read", "process-status"] {
        let line = answer
            .lines()
            .find(|l| l.starts_with(&format!("{what}: ")))
            .unwrap_or_default();
        assert!(line.contains("has no process 1"), "{line}\n{answer}");
    }
    // Its kill of handle 1 did nothing: the record stands, and the same server answers (a
    // restarted one counts from 1).
    let held: Vec<u32> = h.kernel.env().processes().keys().copied().collect();
    assert_eq!(held, vec![1], "the record of the server stands");
    let echo = h
        .kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"still here"}"#)
        .await?;
    assert!(
        echo.contains("echo: still here (echo 2 of this process)"),
        "{echo}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_costs_one_error_and_is_restarted() -> R {
    let dir = tempfile::tempdir()?;
    let marker = format!("keel-test-crash-{}", std::process::id());
    let h = harness(dir.path(), &marker)?;
    h.load_bundled("mcp").await?;
    let err = h
        .kernel
        .invoke_tool("mcp__bad__crash", "{}")
        .await
        .expect_err("the call fails");
    assert!(err.to_string().contains("exited (exit code 3)"), "{err}");
    let answer = h
        .kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"again"}"#)
        .await?;
    assert!(answer.contains("echo: again"), "{answer}");
    assert_eq!(h.kernel.env().processes().len(), 1, "one server, restarted");
    h.kernel.shutdown().await?;
    assert!(gone(&marker).await, "{:?}", processes_with(&marker));
    Ok(())
}

/// Ctrl-C during a call the server never answers: the turn ends cancelled at once, the server
/// is told (`notifications/cancelled`) rather than killed, and its next call is answered by the
/// same process (its echo count goes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_server_call_cancels_it_and_keeps_the_server() -> R {
    use keel_protocol::{TurnEnd, TurnReport, TurnRequest, services};
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let marker = format!("keel-test-cancel-{}", std::process::id());
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let ws = ws.canonicalize()?;
    let gates = GateConfig {
        workspace: Some(ws.clone()),
        approver: std::sync::Arc::new(keel_kernel::gates::approvals::PolicyApprover(
            keel_kernel::gates::exec_policy::ApprovalMode::Auto,
        )),
        processes: BTreeMap::from([(
            "mcp".to_owned(),
            BTreeMap::from([("bad".to_owned(), server_entry(&marker))]),
        )]),
        ..GateConfig::locked_down()
    };
    let cache: PathBuf = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("processes-cache");
    let h = Harness::with_gates(&ws, Some(data), Some(cache), gates)?;
    h.load_scripted_model(
        r#"
[[step]]
[[step.tool_calls]]
name = "mcp__bad__hang"
arguments = {}

[[step]]
text = "Never reached."
"#,
    )
    .await?;
    h.load_bundled("mcp").await?;
    for name in ["tool-registry", "session-log", "agent-loop"] {
        h.load_plugin(name).await?;
    }
    let before = h
        .kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"before"}"#)
        .await?;
    let mut bus = h.kernel.events();
    h.kernel.begin_turn();
    let kernel = h.kernel.clone();
    let request = serde_json::to_string(&TurnRequest {
        session: "cancel".into(),
        input: "wait".into(),
    })?;
    let running =
        tokio::spawn(async move { kernel.call_service(services::AGENT, "turn", &request).await });
    // The call is under way once the assistant's tool call is logged.
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            match bus.recv().await {
                Ok(e) if e.topic == "session.event" && e.payload.contains("mcp__bad__hang") => {
                    break;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event bus closed: {e}"),
            }
        }
    })
    .await?;
    let pressed = std::time::Instant::now();
    h.kernel.cancel_turn();
    let report: TurnReport = serde_json::from_str(
        &tokio::time::timeout(std::time::Duration::from_secs(30), running).await???,
    )?;
    assert_eq!(report.end, TurnEnd::Cancelled, "{report:?}");
    assert!(
        pressed.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        pressed.elapsed()
    );
    h.kernel.begin_turn();
    let after = h
        .kernel
        .invoke_tool("mcp__bad__echo", r#"{"text":"after"}"#)
        .await?;
    assert!(before.contains("(echo 1 of this process)"), "{before}");
    assert!(
        after.contains("(echo 2 of this process)"),
        "the same server answers: {after}"
    );
    Ok(())
}
