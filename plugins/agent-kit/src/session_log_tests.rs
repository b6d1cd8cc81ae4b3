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

    // Reopening cuts the torn line off before anything is appended: no corrupt line is left
    // in the middle of the log.
    let mut w = LogWriter::open(dir.path(), "t").expect("reopens");
    assert_eq!(w.next_seq(), 2);
    w.append(4, &user("t", "three")).expect("appends");
    let read = read_log(dir.path(), "t").expect("reads");
    assert_eq!(
        read.lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
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
    // Read as the writer will keep it: an entry.
    let read = read_log_file(&path).expect("reads");
    assert_eq!(read.lines.len(), 1);
    assert!(read.warnings.is_empty());
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

/// A `rewound` entry cuts the conversation back to the messages it keeps, where it stands:
/// what comes after it builds on the rewound conversation, and the log keeps every entry.
#[test]
fn a_rewound_entry_cuts_the_conversation_where_it_stands() {
    let events = [
        user("s", "first"),
        SessionEvent::Message {
            session: "s".into(),
            message: Message {
                role: Role::Assistant,
                content: vec![Block::Text { text: "one".into() }],
            },
            stop_reason: Some(StopReason::EndTurn),
            usage: None,
        },
        ended("s"),
        user("s", "second"),
        // Cut mid-turn: the call has no result yet, which the rewind drops with its message.
        assistant("s", "two"),
        SessionEvent::Rewound {
            session: "s".into(),
            keep: 2,
            turn: 2,
            checkpoint: Some("c5".into()),
        },
        user("s", "second, again"),
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
    let texts: Vec<String> = c.messages.iter().map(Message::text).collect();
    assert_eq!(texts, ["first", "one", "second, again"]);
    well_formed(&c.messages).expect("well formed");
    assert!(c.tail_repair.is_none());
}

/// Whether `messages` is a request both wire formats accept as far as tools go: every call is
/// answered, at the start of the very next message (the person's side), and every result
/// answers a call of the message just before it, once.
fn well_formed(messages: &[Message]) -> Result<(), String> {
    let mut pending: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let results: Vec<&str> = m
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolResult { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let leading = m
            .content
            .iter()
            .take_while(|b| matches!(b, Block::ToolResult { .. }))
            .count();
        if leading != results.len() {
            return Err(format!("message {i}: a tool result after other content"));
        }
        if !results.is_empty() && m.role != Role::User {
            return Err(format!("message {i}: tool results from the model"));
        }
        let mut answered = results.clone();
        answered.sort_unstable();
        answered.dedup();
        if answered.len() != results.len() {
            return Err(format!("message {i}: a call answered twice"));
        }
        let mut expected: Vec<&str> = pending.iter().map(String::as_str).collect();
        expected.sort_unstable();
        if answered != expected {
            return Err(format!(
                "message {i}: results {answered:?} do not answer the calls {expected:?} before it"
            ));
        }
        pending = m.tool_calls().map(|(id, _, _)| id.to_owned()).collect();
        if !pending.is_empty() && m.role != Role::Assistant {
            return Err(format!("message {i}: tool calls from the person"));
        }
    }
    // The next request adds the person's words: calls left open now would never be answered.
    if !pending.is_empty() {
        return Err(format!(
            "the conversation ends with calls not answered: {pending:?}"
        ));
    }
    Ok(())
}

#[test]
fn calls_left_without_results_are_answered_where_they_stand() {
    let call = |id: &str| Block::ToolCall {
        id: id.into(),
        name: "exec_shell".into(),
        arguments: "{}".into(),
    };
    let result = |id: &str| Block::ToolResult {
        call_id: id.into(),
        content: format!("ran {id}"),
        is_error: false,
    };
    let msg = |role: Role, content: Vec<Block>| SessionEvent::Message {
        session: "s".into(),
        message: Message { role, content },
        stop_reason: None,
        usage: None,
    };
    let outcome = |id: &str| SessionEvent::ToolOutcome {
        session: "s".into(),
        outcome: keel_protocol::ToolOutcome {
            call_id: id.into(),
            tool: "exec_shell".into(),
            status: keel_protocol::OutcomeStatus::Error,
            content: format!("recorded {id}"),
            exec: vec![],
            spill: None,
        },
    };
    let lines = |events: Vec<SessionEvent>| -> Vec<LogLine> {
        events
            .into_iter()
            .enumerate()
            .map(|(i, event)| LogLine {
                seq: i as u64,
                time_ms: 0,
                event,
            })
            .collect()
    };
    // Killed after the model's answer, one call's outcome recorded: that call gets its
    // recorded outcome, the other is marked interrupted; the repair is at the end, to record.
    let c = conversation(&lines(vec![
        user("s", "go"),
        msg(Role::Assistant, vec![call("a"), call("b")]),
        outcome("a"),
    ]));
    well_formed(&c.messages).expect("valid");
    let tail = c.tail_repair.expect("a repair to record");
    assert_eq!(c.messages.last(), Some(&tail));
    assert_eq!(
        tail.content,
        vec![
            Block::ToolResult {
                call_id: "a".into(),
                content: "recorded a".into(),
                is_error: true
            },
            Block::ToolResult {
                call_id: "b".into(),
                content: INTERRUPTED_CALL.into(),
                is_error: true
            },
        ]
    );
    assert_eq!(c.repairs.len(), 1, "{:?}", c.repairs);
    // A log that records starts: a call recorded as started and without an outcome may have
    // run; one never recorded as started did not; one with an outcome has it. The start may
    // be written before the message asking for the calls (that one waits in a queue).
    let started = |ids: &[&str]| SessionEvent::ToolStarted {
        session: "s".into(),
        calls: ids.iter().map(|&id| id.to_owned()).collect(),
    };
    let result_of = |c: &Conversation, id: &str| {
        c.messages
            .last()
            .and_then(|m| {
                m.content.iter().find_map(|b| match b {
                    Block::ToolResult {
                        call_id, content, ..
                    } if call_id == id => Some(content.clone()),
                    _ => None,
                })
            })
            .unwrap_or_default()
    };
    for start_first in [false, true] {
        let ask = msg(Role::Assistant, vec![call("a"), call("b"), call("c")]);
        let mut events = vec![user("s", "go")];
        if start_first {
            events.extend([started(&["a", "b"]), ask]);
        } else {
            events.extend([ask, started(&["a", "b"])]);
        }
        events.push(outcome("a"));
        let c = conversation(&lines(events));
        well_formed(&c.messages).expect("valid");
        assert_eq!(result_of(&c, "a"), "recorded a");
        assert_eq!(
            result_of(&c, "b"),
            INTERRUPTED_CALL,
            "start first: {start_first}"
        );
        assert_eq!(
            result_of(&c, "c"),
            NOT_STARTED_CALL,
            "start first: {start_first}"
        );
    }
    // A start recorded in an earlier turn is not this turn's.
    let c = conversation(&lines(vec![
        msg(Role::Assistant, vec![call("a")]),
        started(&["a"]),
        msg(Role::User, vec![result("a")]),
        msg(Role::Assistant, vec![call("a")]),
    ]));
    assert_eq!(result_of(&c, "a"), NOT_STARTED_CALL);
    // The results' line was lost in the middle and the person spoke next: the results go
    // first in that message; a result whose call was lost becomes text.
    let c = conversation(&lines(vec![
        msg(Role::Assistant, vec![call("a")]),
        msg(
            Role::User,
            vec![
                Block::Text {
                    text: "next".into(),
                },
                result("zz"),
            ],
        ),
        msg(Role::Assistant, vec![call("b")]),
        msg(Role::Assistant, vec![Block::Text { text: "x".into() }]),
    ]));
    well_formed(&c.messages).expect("valid");
    assert_eq!(c.messages.len(), 5, "{:#?}", c.messages);
    assert!(
        matches!(&c.messages[1].content[0], Block::ToolResult { call_id, .. } if call_id == "a")
    );
    assert!(c.messages[1].text().contains("ran zz"));
    assert!(c.tail_repair.is_none());
    // A whole log is left as it is.
    let whole = lines(vec![
        user("s", "go"),
        msg(Role::Assistant, vec![call("a")]),
        outcome("a"),
        msg(Role::User, vec![result("a")]),
    ]);
    let c = conversation(&whole);
    assert!(c.repairs.is_empty() && c.tail_repair.is_none());
    assert_eq!(c.messages.len(), 3);
    // A call from an answer cut at the output limit never ran.
    let c = conversation(&lines(vec![SessionEvent::Message {
        session: "s".into(),
        message: Message {
            role: Role::Assistant,
            content: vec![call("a")],
        },
        stop_reason: Some(StopReason::MaxTokens),
        usage: None,
    }]));
    assert!(
        matches!(&c.messages[1].content[0], Block::ToolResult { content, .. } if content == CUT_OFF_CALL)
    );
}

#[test]
fn an_over_long_line_is_skipped_without_being_held() {
    let good = |seq: u64| {
        serde_json::to_string(&LogLine {
            seq,
            time_ms: seq,
            event: ended("m"),
        })
        .expect("serializes")
    };
    let text = format!(
        "{}\n{}\n{}\n{}",
        good(0),
        "x".repeat(100),
        good(1),
        "y".repeat(300)
    );
    let mut read = LogRead::default();
    scan_entries_bounded(text.as_bytes(), 90, |item| add(&mut read, item)).expect("reads");
    assert_eq!(read.lines.len(), 2, "{:?}", read.warnings);
    assert_eq!(read.warnings.len(), 2);
    assert!(
        read.warnings[0].message.contains("100 bytes"),
        "{:?}",
        read.warnings
    );
    assert_eq!(read.warnings[0].line, 2);
    assert!(
        read.warnings[1]
            .message
            .contains("torn last line (300 bytes"),
        "{:?}",
        read.warnings
    );
}

#[test]
fn one_unreadable_log_does_not_hide_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = LogWriter::open(dir.path(), "a").expect("opens");
    a.append(1, &user("a", "hello")).expect("appends");
    // A directory where a log should be: reading it fails.
    fs::create_dir(dir.path().join("b.jsonl")).expect("mkdir");
    let sessions = list(dir.path()).expect("lists");
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let a = sessions.iter().find(|s| s.id == "a").expect("a");
    assert_eq!((a.entries, a.error.is_none()), (1, true));
    let b = sessions.iter().find(|s| s.id == "b").expect("b");
    assert!(
        b.error.as_deref().is_some_and(|e| e.contains("b.jsonl")),
        "{b:?}"
    );
}

#[test]
fn a_huge_log_is_listed_from_its_head_and_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = LogWriter::open(dir.path(), "h").expect("opens");
    w.append(100, &user("h", "first words")).expect("appends");
    drop(w);
    // One line far longer than the listing reads, then a last entry.
    let path = log_path(dir.path(), "h").expect("path");
    let mut f = OpenOptions::new().append(true).open(&path).expect("opens");
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..(LIST_SCAN_BYTES >> 20) + 2 {
        f.write_all(&chunk).expect("writes");
    }
    f.write_all(b"\n").expect("writes");
    drop(f);
    let mut w = LogWriter::open(dir.path(), "h").expect("reopens");
    w.append(900, &ended("h")).expect("appends");
    let sessions = list(dir.path()).expect("lists");
    let h = &sessions[0];
    assert_eq!(h.first_time_ms, Some(100));
    assert_eq!(h.last_time_ms, Some(900), "{h:?}");
    assert_eq!(h.preview.as_deref(), Some("first words"));
    assert!(
        h.error
            .as_deref()
            .is_some_and(|e| e.contains("only the first")),
        "{h:?}"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// What happens to a session's log, step by step.
    #[derive(Debug, Clone)]
    enum Step {
        /// The agent loop runs a turn: the person's message, `rounds` model answers with
        /// `calls` tool calls each (outcomes, then results), a final answer, the turn's end.
        /// The process is killed after `cut` of its entries (all of them when larger),
        /// leaving `torn` bytes of the next one.
        Turn {
            rounds: Vec<u8>,
            cut: usize,
            torn: usize,
        },
        /// Garbage lands in the log (an old writer that did not repair its tail).
        Garbage(Vec<u8>),
        /// The session is resumed: the log is reopened and the repair recorded.
        Resume,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => (prop::collection::vec(0u8..4, 0..4), 0usize..24, 0usize..200)
                .prop_map(|(rounds, cut, torn)| Step::Turn { rounds, cut, torn }),
            1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Step::Garbage),
            3 => Just(Step::Resume),
        ]
    }

    fn turn_events(n: &mut u32, rounds: &[u8]) -> Vec<SessionEvent> {
        let mut events = vec![user("p", "do it")];
        for &calls in rounds {
            let ids: Vec<String> = (0..calls)
                .map(|_| {
                    *n += 1;
                    format!("call_{n}")
                })
                .collect();
            events.push(SessionEvent::Message {
                session: "p".into(),
                message: Message {
                    role: Role::Assistant,
                    content: ids
                        .iter()
                        .map(|id| Block::ToolCall {
                            id: id.clone(),
                            name: "exec_shell".into(),
                            arguments: "{\"command\":\"true\"}".into(),
                        })
                        .collect(),
                },
                stop_reason: Some(StopReason::ToolUse),
                usage: None,
            });
            for id in &ids {
                events.push(SessionEvent::ToolOutcome {
                    session: "p".into(),
                    outcome: keel_protocol::ToolOutcome {
                        call_id: id.clone(),
                        tool: "exec_shell".into(),
                        status: keel_protocol::OutcomeStatus::Ok,
                        content: "ok".into(),
                        exec: vec![],
                        spill: None,
                    },
                });
            }
            if !ids.is_empty() {
                events.push(SessionEvent::Message {
                    session: "p".into(),
                    message: Message {
                        role: Role::User,
                        content: ids
                            .iter()
                            .map(|id| Block::ToolResult {
                                call_id: id.clone(),
                                content: "ok".into(),
                                is_error: false,
                            })
                            .collect(),
                    },
                    stop_reason: None,
                    usage: None,
                });
            }
        }
        events.push(SessionEvent::Message {
            session: "p".into(),
            message: Message {
                role: Role::Assistant,
                content: vec![Block::Text {
                    text: "done".into(),
                }],
            },
            stop_reason: Some(StopReason::EndTurn),
            usage: None,
        });
        events.push(ended("p"));
        events
    }

    /// What the session-log plugin's `resume` does: read, and record the repair of the end.
    fn resume(dir: &Path) -> Conversation {
        let (c, _) = read_conversation(dir, "p").expect("reads");
        if let Some(results) = &c.tail_repair {
            let mut w = LogWriter::open(dir, "p").expect("reopens");
            w.append(
                0,
                &SessionEvent::Message {
                    session: "p".into(),
                    message: results.clone(),
                    stop_reason: None,
                    usage: None,
                },
            )
            .expect("records the repair");
        }
        c
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever crashes tore the log, reading it always gives a conversation the providers
        /// accept; once resumed (the repair recorded) the log needs no repair at its end;
        /// and an append never leaves a corrupt line before a whole one.
        #[test]
        fn every_log_rebuilds_into_a_valid_conversation(steps in prop::collection::vec(step(), 1..12)) {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = log_path(dir.path(), "p").expect("path");
            let mut n = 0;
            let mut garbage = false;
            for step in steps {
                match step {
                    Step::Turn { rounds, cut, torn } => {
                        let mut w = LogWriter::open(dir.path(), "p").expect("opens");
                        let events = turn_events(&mut n, &rounds);
                        let cut = cut.min(events.len());
                        for event in &events[..cut] {
                            w.append(1, event).expect("appends");
                        }
                        if let Some(next) = events.get(cut) {
                            // Killed in the middle of a write.
                            let line = serde_json::to_vec(&LogLine { seq: 0, time_ms: 1, event: next.clone() })
                                .expect("serializes");
                            let torn = torn.min(line.len());
                            let mut f = OpenOptions::new().append(true).open(&path).expect("opens");
                            f.write_all(&line[..torn]).expect("tears");
                        }
                        if !garbage {
                            // Only the last line may be torn: the writer repaired the rest.
                            let read = read_log_file(&path).expect("reads");
                            let lines = fs::read(&path).expect("reads").split(|&b| b == b'\n').count();
                            for w in &read.warnings {
                                prop_assert!(w.line >= lines - 1, "a bad line in the middle: {w:?} of {lines}");
                            }
                        }
                    }
                    Step::Garbage(bytes) => {
                        garbage = true;
                        let mut f = OpenOptions::new().create(true).append(true).open(&path).expect("opens");
                        f.write_all(&bytes).expect("writes");
                        f.write_all(b"\n").expect("writes");
                    }
                    Step::Resume if !path.exists() => {}
                    Step::Resume => {
                        let c = resume(dir.path());
                        prop_assert!(well_formed(&c.messages).is_ok(), "{:?}\n{:#?}", well_formed(&c.messages), c.messages);
                        let (again, _) = read_conversation(dir.path(), "p").expect("reads");
                        prop_assert!(again.tail_repair.is_none(), "the recorded repair holds");
                        prop_assert_eq!(&again.messages, &c.messages);
                    }
                }
                if path.exists() {
                    let (c, _) = read_conversation(dir.path(), "p").expect("reads");
                    prop_assert!(well_formed(&c.messages).is_ok(), "{:?}\n{:#?}", well_formed(&c.messages), c.messages);
                }
            }
        }
    }
}
