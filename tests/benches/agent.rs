//! The agent path, everything but model latency:
//!
//! 1. **Turn overhead**: one turn of the bundled agent loop with the scripted model, three
//!    parallel-safe tool calls (`read_file`, `list_dir`, `grep`) dispatched through the gate
//!    pipeline, then a final answer; the session log writes every event. The median of the
//!    turns is kernel + plugin overhead.
//! 2. **Session-log append throughput**: 100,000 `session.event`s emitted through the kernel
//!    to the session-log plugin until all are in its JSONL file.
//! 3. **Resume**: reading a 100,000-event session log and rebuilding its conversation, as
//!    `keel resume` does; writing that log natively (no kernel, no guest) and reopening it
//!    are timed on the way.
//!
//! Run with `cargo bench -p keel-tests --bench agent` (add `-- turn`, `-- append` or
//! `-- resume` for one part; `KEEL_BENCH_TURNS=N` sets the number of turns); under
//! `cargo test --benches` it runs a few iterations as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use keel_kernel::gates::approvals::PolicyApprover;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{GateConfig, PluginState};
use keel_protocol::{Message, SessionEvent, TurnEnd, TurnReport, TurnRequest, services, topics};
use keel_tests::Harness;

const SCRIPT: &str = r#"
[[step]]
text = "Looking around."
[[step.tool_calls]]
name = "read_file"
arguments = { path = "src/lib.rs" }
[[step.tool_calls]]
name = "list_dir"
arguments = { path = "." }
[[step.tool_calls]]
name = "grep"
arguments = { pattern = "fn", path = "." }

[[step]]
text = "Done."
"#;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn turn_overhead(turns: usize) -> anyhow::Result<()> {
    let ws = tempfile::tempdir()?;
    let ws_path = ws.path().canonicalize()?;
    std::fs::create_dir_all(ws_path.join("src"))?;
    std::fs::write(
        ws_path.join("src/lib.rs"),
        "pub fn add(a: i64, b: i64) -> i64 {\n    a + b\n}\n".repeat(20),
    )?;
    let data = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let h = Harness::with_gates(
        &ws_path,
        Some(data.path().to_owned()),
        Some(cache.path().to_owned()),
        GateConfig {
            workspace: Some(ws_path.clone()),
            approver: Arc::new(PolicyApprover(ApprovalMode::Auto)),
            ..GateConfig::locked_down()
        },
    )?;
    h.load_scripted_model(SCRIPT).await?;
    for name in ["tool-registry", "fs-tools", "session-log", "agent-loop"] {
        let status = h.load_plugin(name).await?;
        if status.state != PluginState::Active {
            bail!("{name} is not active: {status:?}");
        }
    }
    let mut times = Vec::with_capacity(turns);
    for i in 0..turns + 5 {
        h.kernel.begin_turn();
        let request = serde_json::to_string(&TurnRequest {
            session: format!("bench-{i}"),
            input: "look".into(),
        })?;
        let start = Instant::now();
        let answer = h
            .kernel
            .call_service(services::AGENT, "turn", &request)
            .await?;
        let elapsed = start.elapsed();
        let report: TurnReport = serde_json::from_str(&answer)?;
        if report.end != TurnEnd::Completed || report.tool_calls != 3 {
            bail!("unexpected turn: {report:?}");
        }
        if i >= 5 {
            times.push(elapsed);
        }
    }
    println!(
        "turn with 3 tool calls (scripted model): median {:.3} ms over {turns} turns (aim ≤ 2 ms)",
        median(times).as_secs_f64() * 1e3
    );
    Ok(())
}

fn message_event(i: usize) -> SessionEvent {
    SessionEvent::Message {
        session: "throughput".into(),
        message: Message::user_text(format!(
            "event {i}: the quick brown fox jumps over the lazy dog"
        )),
        stop_reason: None,
        usage: None,
    }
}

async fn append_throughput(events: usize) -> anyhow::Result<()> {
    let ws = tempfile::tempdir()?;
    let data = tempfile::tempdir()?;
    let h = Harness::with_data_dir(ws.path(), data.path())?;
    h.load_plugin("session-log").await?;
    let payloads: Vec<String> = (0..events)
        .map(|i| serde_json::to_string(&message_event(i)))
        .collect::<Result<_, _>>()?;
    let log = data.path().join("sessions").join("throughput.jsonl");
    let start = Instant::now();
    for payload in &payloads {
        // A full queue is reported, not dropped: wait and send again.
        while h.kernel.emit(topics::SESSION_EVENT, payload).is_err() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    // Count lines as they arrive, reading only what was appended since the last look, so
    // the measuring does not compete with the writer for the two cores.
    let mut lines = 0;
    let mut seen = 0u64;
    loop {
        if let Ok(mut file) = std::fs::File::open(&log) {
            use std::io::{Read as _, Seek as _};
            let mut fresh = Vec::new();
            file.seek(std::io::SeekFrom::Start(seen))?;
            file.read_to_end(&mut fresh)?;
            seen += fresh.len() as u64;
            lines += fresh.iter().filter(|&&c| c == b'\n').count();
        }
        if lines >= events {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("only {lines} of {events} events reached the log");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    let read = keel_agent_kit::session_log::read_log(&data.path().join("sessions"), "throughput")?;
    let in_order = read
        .lines
        .iter()
        .enumerate()
        .all(|(i, l)| l.seq == i as u64);
    if read.lines.len() != events || !read.warnings.is_empty() || !in_order {
        bail!(
            "the log holds {} entries ({} warnings, in order: {in_order}), not {events}",
            read.lines.len(),
            read.warnings.len()
        );
    }
    println!(
        "session-log append through the kernel and the plugin: {events} events in {:.1} ms = {:.0} events/s (aim ≥ 100,000/s)",
        elapsed.as_secs_f64() * 1e3,
        events as f64 / elapsed.as_secs_f64()
    );
    // The same events appended one synchronous service call at a time: the cost of one
    // append through kernel and guest, without the event queue's batching of wake-ups.
    let start = Instant::now();
    for payload in &payloads {
        h.kernel
            .call_service(services::SESSION_LOG, "append", payload)
            .await?;
    }
    println!(
        "session-log append as a synchronous call: {:.1} µs each over {events}",
        start.elapsed().as_secs_f64() * 1e6 / events as f64
    );
    Ok(())
}

fn resume(events: usize) -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let mut writer =
        keel_agent_kit::session_log::LogWriter::open(data.path(), "big").context("open log")?;
    let start = Instant::now();
    for i in 0..events {
        writer.append(1_700_000_000_000 + i as u64, &message_event(i))?;
    }
    let append = start.elapsed();
    drop(writer);
    // Reopening finds the next seq by scanning the tail, not by reading the whole log.
    let start = Instant::now();
    let reopened = keel_agent_kit::session_log::LogWriter::open(data.path(), "big")?;
    let reopen = start.elapsed();
    if reopened.next_seq() != events as u64 {
        bail!("reopened at seq {}, not {events}", reopened.next_seq());
    }
    println!(
        "native log writer (no kernel, no guest): {events} appends at {:.2} µs each; reopen {:.0} µs",
        append.as_secs_f64() * 1e6 / events as f64,
        reopen.as_secs_f64() * 1e6
    );
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let read = keel_agent_kit::session_log::read_log(data.path(), "big")?;
        let conversation = keel_agent_kit::session_log::conversation(&read.lines);
        let elapsed = start.elapsed();
        if conversation.messages.len() != events {
            bail!(
                "rebuilt {} of {events} messages",
                conversation.messages.len()
            );
        }
        times.push(elapsed);
    }
    println!(
        "resume: read and rebuild a {events}-event session: median {:.1} ms of 5 (aim ≤ 500 ms)",
        median(times).as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    // Words that are not flags pick the parts to run, as criterion's filter does:
    // `cargo bench -p keel-tests --bench agent -- turn` runs only the turn overhead.
    let filters: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    const PARTS: [&str; 3] = ["turn", "append", "resume"];
    let selected = |part: &str| filters.is_empty() || filters.iter().any(|f| part.contains(f));
    if !PARTS.iter().any(|p| selected(p)) {
        bail!("no part matches {filters:?}; the parts are {PARTS:?}");
    }
    let turns = match std::env::var("KEEL_BENCH_TURNS") {
        Ok(n) => match n.parse::<usize>() {
            Ok(turns) if turns > 0 => turns,
            _ => bail!("KEEL_BENCH_TURNS=`{n}` is not a number of turns (1 or more)"),
        },
        Err(_) => {
            if bench {
                200
            } else {
                3
            }
        }
    };
    let events = if bench { 100_000 } else { 1_000 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if selected("turn") {
        rt.block_on(turn_overhead(turns))?;
    }
    if selected("append") {
        rt.block_on(append_throughput(events))?;
    }
    if selected("resume") {
        resume(events)?;
    }
    Ok(())
}
