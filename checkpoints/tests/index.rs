//! A session's index: its last checkpoint is found from the end, whatever the index's length,
//! past a line torn by a writer killed mid-append.

use std::io::Write;

use keel_checkpoints::{Checkpoint, Kind, Settings};

use crate::common::Fixture;

fn checkpoint(seq: u64, changed: usize) -> Checkpoint {
    Checkpoint {
        id: format!("c{seq}"),
        seq,
        session: "long".into(),
        turn: seq / 10,
        kind: Kind::BeforeCall,
        call: Some(format!("call-{seq}")),
        tool: Some("exec_shell".into()),
        time_ms: 1_700_000_000_000 + seq,
        manifest: format!("{seq:064x}"),
        files: seq,
        bytes: seq * 100,
        skipped: Vec::new(),
        changed: (0..changed)
            .map(|i| format!("src/dir/file-{i}.rs"))
            .collect(),
        changed_count: changed as u64,
        outside: false,
        note: None,
        not_covered: Vec::new(),
        walk: None,
    }
}

/// Write `lines` checkpoints straight into the index of session `long`, then `tail` as it is.
fn write_index(fx: &Fixture, lines: impl Iterator<Item = Checkpoint>, tail: &[u8]) {
    let path = fx.recorder.store().root().join("sessions/long.jsonl");
    let mut file = std::fs::File::create(path).expect("index");
    for c in lines {
        serde_json::to_writer(&mut file, &c).expect("line");
        file.write_all(b"\n").expect("newline");
    }
    file.write_all(tail).expect("tail");
}

/// Thousands of lines and a torn tail: `last` is the last whole line, and the next append
/// numbers after it and ends the torn line first, so every whole line still reads back.
#[test]
fn a_long_index_with_a_torn_tail_answers_its_last_checkpoint() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    let whole = serde_json::to_vec(&checkpoint(5001, 3)).expect("json");
    // Cut inside the line, and at its very end but for the closing brace.
    for cut in [whole.len() / 2, whole.len() - 1] {
        write_index(&fx, (1..=5000).map(|s| checkpoint(s, 3)), &whole[..cut]);
        assert_eq!(store.last("long").expect("last"), Some(checkpoint(5000, 3)));
        let next = store
            .append("long", |seq, last| {
                assert_eq!(seq, 5001);
                assert_eq!(last, Some(&checkpoint(5000, 3)));
                checkpoint(0, 3)
            })
            .expect("append");
        assert_eq!(next.seq, 5001);
        assert_eq!(store.last("long").expect("last"), Some(next));
        let index = store.index("long").expect("index");
        assert_eq!(index.len(), 5001);
        assert!(index.iter().zip(1..).all(|(c, seq)| c.seq == seq));
    }
}

/// Lines longer than the first chunk read from the end (a checkpoint listing a thousand changed
/// paths), with a torn line of the same length after them: the chunk grows until it holds the
/// last whole line, and a piece of a line cut at the chunk's start is never taken for one.
#[test]
fn long_lines_and_a_torn_tail_longer_than_a_chunk() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    let torn = serde_json::to_vec(&checkpoint(41, 1000)).expect("json");
    assert!(torn.len() > 20_000, "{}", torn.len());
    write_index(
        &fx,
        (1..=40).map(|s| checkpoint(s, 1000)),
        &torn[..torn.len() - 10],
    );
    assert_eq!(
        store.last("long").expect("last"),
        Some(checkpoint(40, 1000))
    );
    // Nothing whole at all: none, after reading the file to its start.
    write_index(&fx, std::iter::empty(), &torn[..torn.len() - 10]);
    assert_eq!(store.last("long").expect("last"), None);
    // An index that is only empty lines and one checkpoint at the start.
    let mut tail = serde_json::to_vec(&checkpoint(1, 1000)).expect("json");
    tail.extend(std::iter::repeat_n(b'\n', 50_000));
    write_index(&fx, std::iter::empty(), &tail);
    assert_eq!(store.last("long").expect("last"), Some(checkpoint(1, 1000)));
}
