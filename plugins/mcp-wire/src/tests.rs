use super::*;
use proptest::prelude::*;

fn frames(framer: &mut LineFramer) -> Vec<Frame> {
    std::iter::from_fn(|| framer.next_frame()).collect()
}

fn line(s: &str) -> Frame {
    Frame::Line(s.as_bytes().to_vec())
}

#[test]
fn lines_are_cut_at_lf_and_crlf_and_blank_lines_skipped() {
    let mut f = LineFramer::default();
    f.push(b"{\"a\":1}\r\n\n  \r\n{\"b\"");
    assert_eq!(frames(&mut f), vec![line("{\"a\":1}")]);
    assert_eq!(f.pending(), 4);
    f.push(b":2}\n");
    assert_eq!(frames(&mut f), vec![line("{\"b\":2}")]);
    assert_eq!(f.pending(), 0);
}

#[test]
fn a_crlf_split_between_chunks_is_one_line_end() {
    let mut f = LineFramer::default();
    f.push(b"x\r");
    assert_eq!(frames(&mut f), vec![]);
    f.push(b"\ny\n");
    assert_eq!(frames(&mut f), vec![line("x"), line("y")]);
}

#[test]
fn a_character_split_across_chunks_arrives_whole() {
    let text = "{\"t\":\"caf\u{e9} \u{1F600}\"}\n".as_bytes();
    for cut in 1..text.len() {
        let mut f = LineFramer::default();
        f.push(&text[..cut]);
        f.push(&text[cut..]);
        let got = frames(&mut f);
        assert_eq!(
            got,
            vec![Frame::Line(text[..text.len() - 1].to_vec())],
            "cut at {cut}"
        );
    }
}

#[test]
fn an_oversized_line_is_reported_once_skipped_and_memory_stays_bounded() {
    let mut f = LineFramer::new(16);
    f.push(b"ok\n");
    // 10 chunks of 10 bytes without a line end: reported as soon as it passes the bound.
    for _ in 0..10 {
        f.push(&[b'x'; 10]);
        assert!(f.pending() <= 16, "holds {}", f.pending());
    }
    f.push(b"tail of the flood\nnext\n");
    assert_eq!(
        frames(&mut f),
        vec![line("ok"), Frame::Oversized, line("next")]
    );
    // A long line inside one chunk.
    f.push(&[b'y'; 40]);
    f.push(b"\nafter\n");
    assert_eq!(frames(&mut f), vec![Frame::Oversized, line("after")]);
    // Exactly the bound is fine, one more byte is not; a CRLF end's CR counts, so the same
    // line passes or not whether the CR arrives with the newline or in a piece before it.
    f.push(&[b'z'; 15]);
    f.push(b"\r\n");
    f.push(&[b'z'; 16]);
    f.push(b"\r");
    f.push(b"\n");
    f.push(&[b'z'; 16]);
    f.push(b"\r\n");
    assert_eq!(
        frames(&mut f),
        vec![
            Frame::Line(vec![b'z'; 15]),
            Frame::Oversized,
            Frame::Oversized
        ]
    );
}

#[test]
fn clear_forgets_a_half_line_and_a_skip() {
    let mut f = LineFramer::new(4);
    f.push(b"abcdefgh");
    f.clear();
    f.push(b"ab\n");
    assert_eq!(frames(&mut f), vec![line("ab")]);
}

#[test]
fn messages_are_told_apart() {
    assert_eq!(
        parse(br#"{"jsonrpc":"2.0","id":3,"result":{"x":1}}"#),
        Ok(Message::Response {
            id: json!(3),
            outcome: Ok(json!({"x": 1}))
        })
    );
    let Ok(Message::Response {
        outcome: Err(error),
        ..
    }) = parse(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"nope"}}"#)
    else {
        panic!("an error response");
    };
    assert_eq!(error.to_string(), "nope (JSON-RPC error -32601)");
    assert_eq!(
        parse(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#),
        Ok(Message::Notification {
            method: "notifications/tools/list_changed".into(),
            params: Value::Null
        })
    );
    assert_eq!(
        parse(br#"{"jsonrpc":"2.0","id":"x","method":"roots/list","params":{"a":1}}"#),
        Ok(Message::Request {
            id: json!("x"),
            method: "roots/list".into(),
            params: json!({"a": 1})
        })
    );
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":4}"#),
        Ok(Message::Response {
            outcome: Err(_),
            ..
        })
    ));
}

#[test]
fn hostile_messages_are_invalid_with_the_right_code() {
    let code = |line: &[u8]| parse(line).map(|_| ()).map_err(|e| (e.code, e.id));
    assert_eq!(code(b"hello"), Err((codes::PARSE_ERROR, Value::Null)));
    assert_eq!(
        code(b"{\"jsonrpc\":\"2.0\""),
        Err((codes::PARSE_ERROR, Value::Null))
    );
    assert_eq!(code(b"[1,2]"), Err((codes::INVALID_REQUEST, Value::Null)));
    assert_eq!(
        code(br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#),
        Err((codes::INVALID_REQUEST, json!(7)))
    );
    assert_eq!(
        code(br#"{"id":7,"method":"ping"}"#),
        Err((codes::INVALID_REQUEST, json!(7)))
    );
    assert_eq!(
        code(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#),
        Err((codes::INVALID_REQUEST, Value::Null))
    );
    assert_eq!(
        code(br#"{"jsonrpc":"2.0","id":1,"method":5}"#),
        Err((codes::INVALID_REQUEST, json!(1)))
    );
    assert_eq!(
        code(br#"{"jsonrpc":"2.0"}"#),
        Err((codes::INVALID_REQUEST, Value::Null))
    );
    // Deep nesting is refused by serde_json's recursion limit, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        code(deep.as_bytes()).map_err(|e| e.0),
        Err(codes::PARSE_ERROR)
    );
}

#[test]
fn built_messages_are_one_line_and_parse_back() {
    let sent = request(9, "tools/call", json!({"name": "a\nb"}));
    let bytes = encode(&sent);
    assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
    assert!(bytes.ends_with(b"\n"));
    assert_eq!(
        parse(&bytes[..bytes.len() - 1]),
        Ok(Message::Request {
            id: json!(9),
            method: "tools/call".into(),
            params: json!({"name": "a\nb"})
        })
    );
    let err = error_response(json!("q"), codes::METHOD_NOT_FOUND, "no");
    assert!(matches!(
        parse(&encode(&err)),
        Ok(Message::Response { id, outcome: Err(RpcError { code: Some(-32601), .. }) }) if id == json!("q")
    ));
    assert!(matches!(
        parse(&encode(&notification("n", json!({})))),
        Ok(Message::Notification { .. })
    ));
    assert!(matches!(
        parse(&encode(&response(json!(1), json!({})))),
        Ok(Message::Response { outcome: Ok(_), .. })
    ));
}

#[test]
fn protocol_versions_are_newest_first_and_distinct() {
    let mut sorted = PROTOCOL_VERSIONS.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(sorted, PROTOCOL_VERSIONS);
}

proptest! {
    /// However the bytes are chunked, the framer yields the same frames, and never holds more
    /// than its bound of an unfinished line.
    #[test]
    fn chunking_does_not_change_the_frames(
        text in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a'), Just(0xc3u8), Just(0xa9u8)], 0..200),
        cuts in proptest::collection::vec(0usize..200, 0..10),
    ) {
        let mut whole = LineFramer::new(12);
        whole.push(&text);
        let expected = frames(&mut whole);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
        cuts.sort_unstable();
        let mut pieces = LineFramer::new(12);
        let mut got = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([text.len()]) {
            pieces.push(&text[from..cut]);
            prop_assert!(pieces.pending() <= 12);
            got.extend(frames(&mut pieces));
            from = cut;
        }
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse(&bytes);
    }
}
