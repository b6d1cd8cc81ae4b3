//! Property: however the transport chunks a stream, the SSE parser yields the same events.

use keel_model_wire::sse::{SseEvent, SseParser};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Ev {
    name: String,
    data: Vec<String>,
    comment: bool,
    id: bool,
}

fn event() -> impl Strategy<Value = Ev> {
    (
        "[a-z_]{0,8}",
        proptest::collection::vec("[^\r\n]{0,12}", 0..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(name, data, comment, id)| Ev {
            name,
            data,
            comment,
            id,
        })
}

/// Render the events with the given line endings (cycled); returns the bytes and the events
/// a correct parser must produce.
fn render(events: &[Ev], endings: &[u8], bom: bool) -> (Vec<u8>, Vec<SseEvent>) {
    let mut lines: Vec<String> = Vec::new();
    let mut expected = Vec::new();
    for e in events {
        if e.comment {
            lines.push(": a comment: with colons".into());
        }
        if !e.name.is_empty() {
            lines.push(format!("event: {}", e.name));
        }
        if e.id {
            lines.push("id: 42".into());
            lines.push("retry: 3000".into());
        }
        for d in &e.data {
            lines.push(format!("data: {d}"));
        }
        lines.push(String::new());
        if !e.data.is_empty() {
            expected.push(SseEvent {
                event: if e.name.is_empty() {
                    "message".into()
                } else {
                    e.name.clone()
                },
                data: e.data.join("\n"),
            });
        }
    }
    let mut out = Vec::new();
    if bom {
        out.extend_from_slice(&[0xEF, 0xBB, 0xBF]);
    }
    let mut prev_cr = false;
    for (i, line) in lines.iter().enumerate() {
        out.extend_from_slice(line.as_bytes());
        let mut ending: &[u8] = match endings[i % endings.len()] % 3 {
            0 => b"\n",
            1 => b"\r\n",
            _ => b"\r",
        };
        // A `\r` then an empty line ended by `\n` would read as one `\r\n`.
        if prev_cr && line.is_empty() && ending == b"\n" {
            ending = b"\r";
        }
        prev_cr = ending == b"\r";
        out.extend_from_slice(ending);
    }
    (out, expected)
}

fn parse(body: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in cuts.into_iter().chain([body.len()]) {
        out.extend(parser.feed(&body[start..cut]).expect("parses"));
        start = cut;
    }
    out.extend(parser.finish());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_chunking_yields_the_same_events(
        events in proptest::collection::vec(event(), 0..6),
        endings in proptest::collection::vec(any::<u8>(), 1..5),
        bom in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let (body, expected) = render(&events, &endings, bom);
        prop_assert_eq!(parse(&body, &[]), expected.clone());
        prop_assert_eq!(parse(&body, &cuts), expected);
    }

    #[test]
    fn byte_by_byte_equals_whole(
        events in proptest::collection::vec(event(), 0..4),
        endings in proptest::collection::vec(any::<u8>(), 1..4),
    ) {
        let (body, expected) = render(&events, &endings, false);
        let every: Vec<usize> = (0..body.len()).collect();
        prop_assert_eq!(parse(&body, &every), expected);
    }
}
