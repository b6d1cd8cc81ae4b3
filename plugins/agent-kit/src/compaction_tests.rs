use keel_protocol::{Block, Message, Role};

use super::*;

fn call(id: &str) -> Message {
    Message {
        role: Role::Assistant,
        content: vec![Block::ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        }],
    }
}

fn result(id: &str) -> Message {
    Message {
        role: Role::User,
        content: vec![Block::ToolResult {
            call_id: id.into(),
            content: "x".repeat(400),
            is_error: false,
        }],
    }
}

/// Three turns, each: the person, a call, its result, an answer.
fn conversation() -> Vec<Message> {
    let mut m = Vec::new();
    for t in 0..3 {
        m.push(Message::user_text(format!("turn {t}")));
        m.push(call(&format!("c{t}")));
        m.push(result(&format!("c{t}")));
        m.push(Message {
            role: Role::Assistant,
            content: vec![Block::Text {
                text: format!("done {t}"),
            }],
        });
    }
    m
}

/// Every tool result's call comes before it.
fn well_formed(messages: &[Message]) -> bool {
    let mut calls = std::collections::HashSet::new();
    for m in messages {
        for b in &m.content {
            match b {
                Block::ToolCall { id, .. } => {
                    calls.insert(id.clone());
                }
                Block::ToolResult { call_id, .. } if !calls.contains(call_id) => return false,
                _ => {}
            }
        }
    }
    true
}

#[test]
fn a_cut_keeps_the_last_turns_whole_and_leaves_no_result_without_its_call() {
    let m = conversation();
    assert_eq!(cut_point(&m, 2), Some(4));
    assert_eq!(cut_point(&m, 1), Some(8));
    assert_eq!(cut_point(&m, 3), None, "nothing before the first turn");
    assert_eq!(cut_point(&m, 0), Some(8), "the current turn is always kept");
    let after = apply(&m, 4, "SUMMARY");
    assert_eq!(after.len(), 8);
    assert!(well_formed(&after));
    assert_eq!(
        after[0].content[0],
        Block::Text {
            text: "SUMMARY".into()
        }
    );
    assert_eq!(
        after[0].content[1],
        Block::Text {
            text: "turn 1".into()
        }
    );
    assert!(
        estimate_tokens("sys", &after, &[]) < estimate_tokens("sys", &m, &[]),
        "smaller"
    );
}

#[test]
fn trimming_drops_the_fewest_oldest_turns_to_fit() {
    let m = conversation();
    let all = estimate_tokens("", &m, &[]);
    let cut = trim_point("", &m, &[], all - 50).expect("a cut");
    assert_eq!(cut, 4, "one turn is enough");
    assert!(well_formed(&apply(&m, cut, TRIM_HEADER)));
    assert_eq!(
        trim_point("", &m, &[], 1),
        Some(11),
        "all but the last turn, and its steps but the last"
    );
    assert!(well_formed(&apply(&m, 11, TRIM_HEADER)));
}

#[test]
fn the_transcript_keeps_the_newest_part_within_its_budget() {
    let m = conversation();
    let full = transcript(&m, 100_000);
    assert!(full.starts_with("person: turn 0\nassistant called read_file {}\ntool result: "));
    let short = transcript(&m, 200);
    assert!(
        short.starts_with("[") && short.ends_with("assistant: done 2\n"),
        "{short}"
    );
    assert!(short.len() < 260);
}

#[test]
fn known_models_have_a_window() {
    assert_eq!(known_context_window("claude-sonnet-4-5"), Some(200_000));
    assert_eq!(known_context_window("gpt-4o-mini"), Some(128_000));
    assert_eq!(known_context_window("my-local-model"), None);
}

/// One turn of `steps` steps: the person, then a call and its result per step.
fn one_long_turn(steps: usize) -> Vec<Message> {
    let mut m = vec![Message::user_text("read everything")];
    for s in 0..steps {
        m.push(call(&format!("s{s}")));
        m.push(result(&format!("s{s}")));
    }
    m
}

#[test]
fn a_turn_too_big_alone_is_cut_between_a_result_and_the_next_call() {
    let m = one_long_turn(10);
    assert_eq!(cut_point(&m, 1), None, "no earlier turn to cut before");
    // Each step is about 100 tokens: a target of 350 keeps the last three steps.
    let fixed = estimate_tokens("", &m[..1], &[]);
    let cut = step_cut_point("", &m, &[], fixed + 350).expect("a cut");
    assert_eq!(cut, m.len() - 6, "the last three steps kept");
    assert_eq!(m[cut].role, Role::Assistant);
    // Nothing fits: the last step is still kept.
    assert_eq!(step_cut_point("", &m, &[], 1), Some(m.len() - 2));
    // Everything fits: the earliest cut, after the first step.
    assert_eq!(step_cut_point("", &m, &[], 1_000_000), Some(3));
    let after = apply(&m, cut, "SUMMARY");
    assert!(well_formed(&after));
    assert_eq!(after.len(), 7);
    // The person's request leads, verbatim, then the summary; then the steps as they were.
    assert_eq!(
        after[0].content,
        vec![
            Block::Text {
                text: "read everything".into()
            },
            Block::Text {
                text: "SUMMARY".into()
            }
        ]
    );
    assert_eq!(&after[1..], &m[cut..]);
    // A second compaction of the same turn replaces the first summary instead of stacking it.
    let mut longer = apply(&m, cut, &format!("{SUMMARY_HEADER}\nFIRST"));
    longer.extend(one_long_turn(10).into_iter().skip(1));
    let second = step_cut_point("", &longer, &[], fixed + 350).expect("a cut");
    let again = apply(&longer, second, &format!("{SUMMARY_HEADER}\nSECOND"));
    assert_eq!(again[0].content.len(), 2, "{:?}", again[0]);
    assert_eq!(
        again[0].text(),
        format!("read everything\n{SUMMARY_HEADER}\nSECOND")
    );
    assert!(well_formed(&again));
}

#[test]
fn trimming_reaches_into_the_current_turn_when_dropping_turns_is_not_enough() {
    let mut m = conversation();
    m.extend(one_long_turn(8));
    let target = estimate_tokens("", &m[m.len() - 5..], &[]);
    let cut = trim_point("", &m, &[], target).expect("a cut");
    assert!(cut > 12, "inside the last turn: {cut}");
    let after = apply(&m, cut, TRIM_HEADER);
    assert!(well_formed(&after));
    assert_eq!(after[0].text().lines().next(), Some("read everything"));
}
