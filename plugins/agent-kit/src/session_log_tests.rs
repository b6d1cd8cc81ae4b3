//! Unit tests of `plugins/agent-kit/src/session_log.rs`.

use super::*;
use keel_protocol::{Block, StopReason, TurnEnd, Usage};
use std::fs::OpenOptions;
use std::io::Write;

fn user(session: &str, text: &str) -> SessionEvent {
    SessionEvent::Message {
        session: session.into(),
        message: Message::user_text(text),
        stop_reason: None,
        usage: None,
    }
}

fn assistant(session: &str, text: &str) -> SessionEvent {
    SessionEvent::Message {
        session: session.into(),
        message: Message {
            role: Role::Assistant,
            content: vec![
                Block::Text { text: text.into() },
                Block::ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: "{\"path\":\"a\"}".into(),
                },
            ],
        },
        stop_reason: Some(StopReason::ToolUse),
        usage: Some(Usage::default()),
    }
}

fn ended(session: &str) -> SessionEvent {
    SessionEvent::TurnEnded {
        session: session.into(),
        end: TurnEnd::Completed,
        detail: String::new(),
    }
}

#[test]
fn session_ids_are_validated_and_generated() {
    for ok in ["a", "20261202-120501-3f9a", "A_b-9", &"x".repeat(64)] {
        assert!(validate_session_id(ok).is_ok(), "{ok}");
    }
    for bad in ["", "../x", "a/b", "a.b", "a b", "é", &"x".repeat(65)] {
        let err = validate_session_id(bad).expect_err(bad);
        assert!(err.to_string().contains("A-Z a-z 0-9 _ -"), "{err}");
    }
    // 2026-12-02T12:05:01.500Z
    assert_eq!(
        new_session_id(1_796_213_101_500, 0x1_3f9a),
        "20261202-120501-3f9a"
    );
    assert_eq!(new_session_id(0, 0), "19700101-000000-0000");
    assert_eq!(new_session_id(951_782_400_000, 7), "20000229-000000-0007");
    assert!(validate_session_id(&new_session_id(u64::MAX / 4, u32::MAX)).is_ok());
    assert!(log_path(Path::new("/logs"), "../etc").is_err());
}

#[test]
fn appends_lines_that_read_back_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = LogWriter::open(dir.path(), "s1").expect("opens");
    assert_eq!(w.append(10, &user("s1", "hello")).expect("appends"), 0);
    assert_eq!(w.append(11, &assistant("s1", "hi")).expect("appends"), 1);
    assert_eq!(
        w.append_all(12, [&ended("s1"), &user("s1", "again")])
            .expect("appends"),
        2
    );
    assert_eq!(w.next_seq(), 4);
    let text = fs::read_to_string(w.path()).expect("reads");
    assert_eq!(text.lines().count(), 4);
    assert!(text.ends_with('\n'));
    let read = read_log(dir.path(), "s1").expect("reads");
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
    assert_eq!(
        read.lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(read.lines[1].event, assistant("s1", "hi"));
    assert_eq!(read.lines[1].time_ms, 11);
}

#[test]
fn sequence_numbers_continue_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut w = LogWriter::open(dir.path(), "s").expect("opens");
        for i in 0..5 {
            w.append(i, &user("s", "x")).expect("appends");
        }
    }
    let mut w = LogWriter::open(dir.path(), "s").expect("reopens");
    assert_eq!(w.next_seq(), 5);
    assert_eq!(w.append(9, &ended("s")).expect("appends"), 5);
    let read = read_log(dir.path(), "s").expect("reads");
    assert_eq!(read.lines.len(), 6);
    assert_eq!(read.lines[5].seq, 5);
}

#[test]
fn continues_after_a_file_larger_than_the_tail_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = "y".repeat(1000);
    {
        let mut w = LogWriter::open(dir.path(), "big").expect("opens");
        for i in 0..400 {
            w.append(i, &user("big", &big)).expect("appends");
        }
    }
    let w = LogWriter::open(dir.path(), "big").expect("reopens");
    assert_eq!(w.next_seq(), 400);
}

#[test]
fn a_torn_last_line_is_skipped_with_a_warning_and_repaired_on_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut w = LogWriter::open(dir.path(), "t").expect("opens");
        w.append(1, &user("t", "one")).expect("appends");
        w.append(2, &user("t", "two")).expect("appends");
    }
    let path = log_path(dir.path(), "t").expect("path");
    let mut f = OpenOptions::new().append(true).open(&path).expect("opens");
    f.write_all(br#"{"seq":2,"time_ms":3,"kind":"mess"#)
        .expect("tears");
    drop(f);

    let read = read_log(dir.path(), "t").expect("reads");
    assert_eq!(read.lines.len(), 2);
    assert_eq!(read.warnings.len(), 1);
    assert_eq!(read.warnings[0].line, 3);
    assert!(
        read.warnings[0].message.contains("torn last line"),
        "{:?}",
        read.warnings
    );

    let mut w = LogWriter::open(dir.path(), "t").expect("reopens");
    assert_eq!(w.next_seq(), 2);
    w.append(4, &user("t", "three")).expect("appends");
    let read = read_log(dir.path(), "t").expect("reads");
    assert_eq!(
        read.lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(read.warnings.len(), 1);
    assert!(
        read.warnings[0].message.contains("malformed line"),
        "{:?}",
        read.warnings
    );
}

#[test]
fn an_unterminated_but_complete_last_line_is_kept_once_the_writer_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = log_path(dir.path(), "c").expect("path");
    let line = LogLine {
        seq: 0,
        time_ms: 5,
        event: ended("c"),
    };
    fs::write(&path, serde_json::to_string(&line).expect("serializes")).expect("writes");
    let read = read_log_file(&path).expect("reads");
    assert_eq!(read.lines.len(), 0);
    assert_eq!(read.warnings.len(), 1);
    let mut w = LogWriter::open(dir.path(), "c").expect("opens");
    assert_eq!(w.append(6, &ended("c")).expect("appends"), 1);
    let read = read_log_file(&path).expect("reads");
    assert_eq!(read.lines.len(), 2);
    assert!(read.warnings.is_empty());
}

#[test]
fn malformed_middle_lines_are_warnings_not_errors() {
    let good = |seq: u64| {
        serde_json::to_string(&LogLine {
            seq,
            time_ms: seq,
            event: ended("m"),
        })
        .expect("serializes")
    };
    let text = format!("{}\nnot json\n\n{{\"seq\":1}}\n{}\n", good(0), good(2));
    let read = parse_log(text.as_bytes());
    assert_eq!(read.lines.len(), 2);
    assert_eq!(
        read.warnings.iter().map(|w| w.line).collect::<Vec<_>>(),
        [2, 4]
    );
    assert!(
        read.warnings
            .iter()
            .all(|w| w.message.starts_with("malformed line"))
    );
    assert_eq!(parse_log(b"\xff\xfe\n").warnings.len(), 1);
}

#[test]
fn list_summarises_sessions_by_last_activity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = LogWriter::open(dir.path(), "a").expect("opens");
    a.append(
        100,
        &SessionEvent::SessionStarted {
            session: "a".into(),
            workspace: "/w".into(),
            model: "m".into(),
        },
    )
    .expect("appends");
    a.append(101, &user("a", "  fix the\nparser please "))
        .expect("appends");
    a.append(300, &ended("a")).expect("appends");
    let mut b = LogWriter::open(dir.path(), "b").expect("opens");
    b.append(200, &user("b", &"long ".repeat(40)))
        .expect("appends");
    fs::write(dir.path().join("not an id.jsonl"), "").expect("writes");
    fs::write(dir.path().join("notes.txt"), "").expect("writes");

    let sessions = list(dir.path()).expect("lists");
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[0].id, "a");
    assert_eq!(sessions[0].first_time_ms, Some(100));
    assert_eq!(sessions[0].last_time_ms, Some(300));
    assert_eq!(sessions[0].entries, 3);
    assert_eq!(
        sessions[0].preview.as_deref(),
        Some("fix the parser please")
    );
    assert_eq!(sessions[1].id, "b");
    let preview = sessions[1].preview.as_deref().expect("preview");
    assert_eq!(preview.chars().count(), PREVIEW_CHARS + 1);
    assert!(preview.ends_with('…'));
    assert!(list(&dir.path().join("missing")).expect("lists").is_empty());
}

#[test]
fn conversation_is_rebuilt_from_messages_with_the_latest_context() {
    let context = |system: &str| SessionEvent::Context {
        session: "s".into(),
        system: system.into(),
        tools: vec![],
    };
    let events = [
        context("old"),
        user("s", "q"),
        assistant("s", "a"),
        SessionEvent::ToolOutcome {
            session: "s".into(),
            outcome: keel_protocol::ToolOutcome {
                call_id: "c1".into(),
                tool: "read_file".into(),
                status: keel_protocol::OutcomeStatus::Ok,
                content: "x".into(),
                exec: vec![],
                spill: None,
            },
        },
        context("new"),
        user("s", "[keel verifier] …"),
        ended("s"),
    ];
    let lines: Vec<LogLine> = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| LogLine {
            seq: i as u64,
            time_ms: 0,
            event,
        })
        .collect();
    let c = conversation(&lines);
    assert_eq!(c.messages.len(), 3);
    assert_eq!(c.messages[0], Message::user_text("q"));
    assert_eq!(c.messages[2].text(), "[keel verifier] …");
    assert_eq!(c.context.expect("context").system, "new");
}
