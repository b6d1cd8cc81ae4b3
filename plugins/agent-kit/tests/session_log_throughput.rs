//! Session-log throughput, measured rather than asserted (timings depend on the machine).
//! Run: `cargo test --release -p keel-agent-kit --test session_log_throughput -- --ignored --nocapture`

use std::time::Instant;

use keel_agent_kit::session_log::{LogWriter, read_log};
use keel_protocol::{
    Block, Message, OutcomeStatus, Role, SessionEvent, StopReason, ToolOutcome, Usage,
};

const N: u64 = 100_000;

fn event(i: u64) -> SessionEvent {
    match i % 3 {
        0 => SessionEvent::Message {
            session: "bench".into(),
            message: Message::user_text(format!(
                "please look at src/module_{i}.rs and fix the failing test"
            )),
            stop_reason: None,
            usage: None,
        },
        1 => SessionEvent::Message {
            session: "bench".into(),
            message: Message {
                role: Role::Assistant,
                content: vec![
                    Block::Text {
                        text: "Let me read the file first.".into(),
                    },
                    Block::ToolCall {
                        id: format!("c{i}"),
                        name: "read_file".into(),
                        arguments: format!("{{\"path\":\"src/module_{i}.rs\",\"offset\":1}}"),
                    },
                ],
            },
            stop_reason: Some(StopReason::ToolUse),
            usage: Some(Usage {
                input_tokens: 1200,
                output_tokens: 40,
                ..Usage::default()
            }),
        },
        _ => SessionEvent::ToolOutcome {
            session: "bench".into(),
            outcome: ToolOutcome {
                call_id: format!("c{i}"),
                tool: "read_file".into(),
                status: OutcomeStatus::Ok,
                content: "     1\tuse std::fmt;\n     2\t\n     3\tpub fn f() -> u32 { 42 }".into(),
                exec: vec![],
                spill: None,
            },
        },
    }
}

#[test]
#[ignore = "measurement; run with --release --ignored --nocapture"]
fn session_log_throughput() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events: Vec<SessionEvent> = (0..N).map(event).collect();

    let mut w = LogWriter::open(dir.path(), "bench").expect("opens");
    let start = Instant::now();
    for (i, e) in events.iter().enumerate() {
        w.append(i as u64, e).expect("appends");
    }
    let append = start.elapsed();
    let bytes = std::fs::metadata(w.path()).expect("stat").len();

    let mut w2 = LogWriter::open(dir.path(), "bench2").expect("opens");
    let start = Instant::now();
    for chunk in events.chunks(64) {
        w2.append_all(0, chunk).expect("appends");
    }
    let batched = start.elapsed();

    let start = Instant::now();
    let reopened = LogWriter::open(dir.path(), "bench").expect("reopens");
    let reopen = start.elapsed();
    assert_eq!(reopened.next_seq(), N);

    let start = Instant::now();
    let read = read_log(dir.path(), "bench").expect("reads");
    let read_time = start.elapsed();
    assert_eq!(read.lines.len() as u64, N);

    println!(
        "append (write+flush per event): {N} events, {:.1} MB in {:?} = {:.0} events/s",
        bytes as f64 / 1e6,
        append,
        N as f64 / append.as_secs_f64()
    );
    println!(
        "append_all (64 per write): {N} events in {:?} = {:.0} events/s",
        batched,
        N as f64 / batched.as_secs_f64()
    );
    println!("reopen (tail scan for next seq): {reopen:?}");
    println!("read + parse {N} lines: {read_time:?}");
}
