//! The stream decoders against hand-written wire fixtures, under several chunkings.

use keel_model_wire::anthropic;
use keel_model_wire::decode::{DecodeError, StreamDecoder};
use keel_model_wire::openai;
use keel_model_wire::sse::SseParser;
use keel_protocol::{Block, ModelResponse, StopReason, StreamDelta, Usage};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug)]
enum Fmt {
    OpenAi,
    Anthropic,
}

struct Decoded {
    deltas: Vec<StreamDelta>,
    response: ModelResponse,
    done: bool,
    received: bool,
}

fn decoder(fmt: Fmt, max_tokens: u32) -> Box<dyn StreamDecoder> {
    match fmt {
        Fmt::OpenAi => Box::new(openai::Decoder::new(max_tokens)),
        Fmt::Anthropic => Box::new(anthropic::Decoder::new(max_tokens)),
    }
}

fn try_decode(
    fmt: Fmt,
    body: &[u8],
    chunk: usize,
    max_tokens: u32,
) -> Result<Decoded, DecodeError> {
    let mut parser = SseParser::new();
    let mut dec = decoder(fmt, max_tokens);
    let mut deltas = Vec::new();
    for piece in body.chunks(chunk.max(1)) {
        for event in parser.feed(piece).expect("sse parses") {
            deltas.extend(dec.feed(&event)?);
        }
    }
    if let Some(event) = parser.finish() {
        deltas.extend(dec.feed(&event)?);
    }
    Ok(Decoded {
        deltas,
        done: dec.is_done(),
        received: dec.received_content(),
        response: dec.finish(),
    })
}

/// Decode under several chunkings (whole, byte by byte, odd sizes) and check they agree.
fn decode(fmt: Fmt, body: &[u8], max_tokens: u32) -> Decoded {
    let whole = try_decode(fmt, body, body.len(), max_tokens).expect("decodes");
    for chunk in [1, 2, 3, 7, 64] {
        let other = try_decode(fmt, body, chunk, max_tokens).expect("decodes");
        assert_eq!(other.response, whole.response, "chunk size {chunk}");
        assert_eq!(other.deltas, whole.deltas, "chunk size {chunk}");
        assert_eq!(other.done, whole.done);
    }
    whole
}

fn sse_data(values: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for v in values {
        out.push_str(&format!("data: {v}\n\n"));
    }
    out.into_bytes()
}

fn sse_done(values: &[Value]) -> Vec<u8> {
    let mut out = sse_data(values);
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn text_of(deltas: &[StreamDelta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            StreamDelta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn calls(r: &ModelResponse) -> Vec<(String, String, String)> {
    r.message
        .tool_calls()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

// ---------------------------------------------------------------- OpenAI

#[test]
fn openai_text_and_usage() {
    let d = decode(
        Fmt::OpenAi,
        include_bytes!("fixtures/openai_text.sse"),
        1000,
    );
    let text = "Hello! How can I help you today? \u{e9}\u{2014}\u{1F600}";
    assert_eq!(
        d.response.message.content,
        vec![Block::Text { text: text.into() }]
    );
    assert_eq!(text_of(&d.deltas), text);
    assert_eq!(d.response.stop_reason, StopReason::EndTurn);
    assert_eq!(d.response.stop_reason_raw, "stop");
    assert_eq!(d.response.model, "gpt-4o-2024-08-06");
    assert_eq!(
        d.response.usage,
        Usage {
            input_tokens: 1524,
            output_tokens: 12,
            cache_read_tokens: 1280,
            cache_write_tokens: 0
        }
    );
    assert!(d.done && d.received);
}

#[test]
fn openai_tool_arguments_over_many_deltas() {
    let d = decode(
        Fmt::OpenAi,
        include_bytes!("fixtures/openai_tool_split.sse"),
        1000,
    );
    assert_eq!(
        calls(&d.response),
        vec![(
            "call_DdmO9pD3xa9XTPNJ32zg2hcA".into(),
            "read_file".into(),
            r#"{"path":"src/main.rs","max_lines":200}"#.into()
        )]
    );
    assert_eq!(d.response.message.content.len(), 1, "no empty text block");
    assert_eq!(d.response.stop_reason, StopReason::ToolUse);
    assert_eq!(d.response.stop_reason_raw, "tool_calls");
    assert_eq!(
        d.deltas,
        vec![StreamDelta::ToolCallStart {
            id: "call_DdmO9pD3xa9XTPNJ32zg2hcA".into(),
            name: "read_file".into()
        }]
    );
    assert_eq!(d.response.usage.input_tokens, 310);
}

#[test]
fn openai_two_parallel_tool_calls() {
    let d = decode(
        Fmt::OpenAi,
        include_bytes!("fixtures/openai_parallel_tools.sse"),
        1000,
    );
    assert_eq!(d.response.message.text(), "Checking both.");
    assert_eq!(
        calls(&d.response),
        vec![
            (
                "call_weather_paris".into(),
                "get_weather".into(),
                r#"{"city": "Paris"}"#.into()
            ),
            (
                "call_weather_tokyo".into(),
                "get_weather".into(),
                r#"{"city": "Tokyo"}"#.into()
            ),
        ]
    );
    let starts = d
        .deltas
        .iter()
        .filter(|x| matches!(x, StreamDelta::ToolCallStart { .. }))
        .count();
    assert_eq!(starts, 2);
    assert_eq!(d.response.stop_reason, StopReason::ToolUse);
}

#[test]
fn openai_reasoning_content_is_thinking() {
    let d = decode(
        Fmt::OpenAi,
        include_bytes!("fixtures/openai_reasoning.sse"),
        1000,
    );
    assert_eq!(
        d.response.message.content,
        vec![
            Block::Thinking {
                text: "The user asks 2+2. That is 4.".into()
            },
            Block::Text { text: "4".into() },
        ]
    );
    assert!(
        d.deltas
            .iter()
            .any(|x| matches!(x, StreamDelta::Thinking { text } if text == " That is 4."))
    );
    assert_eq!(d.response.usage.output_tokens, 20);
    // `reasoning` (OpenRouter, vLLM) is thinking too.
    let body = sse_done(&[
        json!({"choices":[{"index":0,"delta":{"reasoning":"hmm"},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}),
    ]);
    let d = decode(Fmt::OpenAi, &body, 1000);
    assert_eq!(
        d.response.message.content,
        vec![
            Block::Thinking { text: "hmm".into() },
            Block::Text { text: "ok".into() }
        ]
    );
}

#[test]
fn openai_cut_at_max_tokens_inside_tool_arguments() {
    let d = decode(
        Fmt::OpenAi,
        include_bytes!("fixtures/openai_length_mid_tool.sse"),
        32,
    );
    assert_eq!(d.response.stop_reason, StopReason::MaxTokens);
    assert_eq!(d.response.stop_reason_raw, "length");
    let (_, name, args) = calls(&d.response).remove(0);
    assert_eq!(name, "write_file");
    assert_eq!(args, r#"{"path": "notes.md", "content": "rm -rf /tmp/leg"#);
    assert!(
        serde_json::from_str::<Value>(&args).is_err(),
        "kept broken, not repaired"
    );
}

#[test]
fn openai_finish_reasons_map_and_keep_the_raw_string() {
    for (raw, reason) in [
        ("stop", StopReason::EndTurn),
        ("length", StopReason::MaxTokens),
        ("content_filter", StopReason::Refusal),
        ("tool_calls", StopReason::ToolUse),
        ("function_call", StopReason::ToolUse),
    ] {
        let body = sse_done(&[
            json!({"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":raw}]}),
        ]);
        let d = decode(Fmt::OpenAi, &body, 1000);
        assert_eq!(d.response.stop_reason, reason, "{raw}");
        assert_eq!(d.response.stop_reason_raw, raw);
    }
}

#[test]
fn openai_missing_finish_reason_is_derived() {
    let text = json!({"choices":[{"index":0,"delta":{"content":"x"}}]});
    let d = decode(Fmt::OpenAi, &sse_done(std::slice::from_ref(&text)), 1000);
    assert_eq!(
        (d.response.stop_reason, d.response.stop_reason_raw.as_str()),
        (StopReason::EndTurn, "derived:end_turn")
    );
    let call = json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"t","arguments":"{}"}}]}}]});
    let d = decode(Fmt::OpenAi, &sse_done(&[call]), 1000);
    assert_eq!(d.response.stop_reason_raw, "derived:tool_use");
    let usage = json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":64}});
    let d = decode(Fmt::OpenAi, &sse_done(&[text, usage]), 64);
    assert_eq!(
        (d.response.stop_reason, d.response.stop_reason_raw.as_str()),
        (StopReason::MaxTokens, "derived:max_tokens")
    );
}

#[test]
fn openai_error_object_in_the_stream_is_an_error() {
    let body = sse_data(&[
        json!({"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}),
    ]);
    let err = try_decode(Fmt::OpenAi, &body, 5, 100)
        .err()
        .expect("an error");
    assert_eq!(
        err,
        DecodeError::Provider {
            kind: "server_error".into(),
            message: "The server had an error while processing your request.".into()
        }
    );
}

#[test]
fn openai_stream_without_done_is_interrupted() {
    let full = include_bytes!("fixtures/openai_text.sse");
    let text = String::from_utf8_lossy(full);
    let cut = text.find("data: [DONE]").expect("has DONE");
    let d = decode(Fmt::OpenAi, &full[..cut], 1000);
    assert!(!d.done);
    assert!(d.received);
    assert_eq!(d.response.stop_reason, StopReason::Interrupted);
    assert_eq!(
        d.response.message.text(),
        "Hello! How can I help you today? \u{e9}\u{2014}\u{1F600}"
    );
    // Only the role chunk arrived: nothing received.
    let first = text.find("\n\n").expect("an event") + 2;
    let d = decode(Fmt::OpenAi, &full[..first], 1000);
    assert!(!d.done && !d.received);
    assert_eq!(d.response.stop_reason, StopReason::Interrupted);
}

#[test]
fn openai_malformed_json_is_reported() {
    let err = try_decode(Fmt::OpenAi, b"data: {\"choices\": [\n\n", 100, 10)
        .err()
        .expect("malformed");
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                format: "openai",
                ..
            }
        ),
        "{err:?}"
    );
}

// ---------------------------------------------------------------- Anthropic

#[test]
fn anthropic_text_usage_and_ping() {
    let d = decode(
        Fmt::Anthropic,
        include_bytes!("fixtures/anthropic_text.sse"),
        1000,
    );
    assert_eq!(
        d.response.message.content,
        vec![Block::Text {
            text: "Hello! Caf\u{e9} \u{2615} time.".into()
        }]
    );
    assert_eq!(d.response.stop_reason, StopReason::EndTurn);
    assert_eq!(d.response.stop_reason_raw, "end_turn");
    assert_eq!(d.response.model, "claude-sonnet-4-5-20250929");
    assert_eq!(
        d.response.usage,
        Usage {
            input_tokens: 2125,
            output_tokens: 15,
            cache_read_tokens: 2000,
            cache_write_tokens: 100
        }
    );
}

#[test]
fn anthropic_tool_use_with_partial_json() {
    let d = decode(
        Fmt::Anthropic,
        include_bytes!("fixtures/anthropic_tool_use.sse"),
        1000,
    );
    assert_eq!(
        d.response.message.text(),
        "Okay, let's check the weather for San Francisco, CA:"
    );
    let (id, name, args) = calls(&d.response).remove(0);
    assert_eq!(
        (id.as_str(), name.as_str()),
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather")
    );
    assert_eq!(
        args,
        r#"{"location": "San Francisco, CA", "unit": "fahrenheit"}"#
    );
    assert_eq!(d.response.stop_reason, StopReason::ToolUse);
    assert_eq!(d.response.usage.output_tokens, 89);
    assert_eq!(d.response.usage.input_tokens, 472);
}

#[test]
fn anthropic_two_parallel_tool_calls_and_a_call_without_input_deltas() {
    let d = decode(
        Fmt::Anthropic,
        include_bytes!("fixtures/anthropic_parallel_tools.sse"),
        1000,
    );
    assert_eq!(
        calls(&d.response),
        vec![
            (
                "toolu_01A".into(),
                "read_file".into(),
                r#"{"path": "Cargo.toml"}"#.into()
            ),
            ("toolu_01B".into(), "list_dir".into(), "{}".into()),
        ]
    );
    assert_eq!(d.response.stop_reason, StopReason::ToolUse);
}

#[test]
fn anthropic_thinking_is_kept_and_the_signature_dropped() {
    let d = decode(
        Fmt::Anthropic,
        include_bytes!("fixtures/anthropic_thinking.sse"),
        1000,
    );
    assert_eq!(
        d.response.message.content,
        vec![
            Block::Thinking {
                text: "I need to find the GCD of 1071 and 462.\n1071 = 2*462 + 147 ... so 21."
                    .into()
            },
            Block::Text {
                text: "The GCD is 21.".into()
            },
        ]
    );
    let json = serde_json::to_string(&d.response).expect("serializes");
    assert!(
        !json.contains("EqQBCgIYAhIM"),
        "no signature stored: {json}"
    );
}

#[test]
fn anthropic_cut_at_max_tokens_inside_tool_arguments() {
    let d = decode(
        Fmt::Anthropic,
        include_bytes!("fixtures/anthropic_max_tokens_mid_tool.sse"),
        32,
    );
    assert_eq!(d.response.stop_reason, StopReason::MaxTokens);
    assert_eq!(d.response.stop_reason_raw, "max_tokens");
    let (_, name, args) = calls(&d.response).remove(0);
    assert_eq!(name, "shell");
    assert_eq!(args, r#"{"command": "rm -rf /tmp/leg"#);
}

fn anthropic_stream(stop: Option<&str>, output_tokens: u64, tool: bool) -> Vec<u8> {
    let mut events = vec![
        json!({"type":"message_start","message":{"model":"claude","usage":{"input_tokens":10,"output_tokens":1}}}),
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}),
        json!({"type":"content_block_stop","index":0}),
    ];
    if tool {
        events.push(json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"x","input":{}}}));
        events.push(json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{}"}}));
        events.push(json!({"type":"content_block_stop","index":1}));
    }
    events.push(json!({"type":"message_delta","delta":{"stop_reason":stop},"usage":{"output_tokens":output_tokens}}));
    events.push(json!({"type":"message_stop"}));
    let mut out = String::new();
    for e in events {
        out.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            e["type"].as_str().expect("type")
        ));
    }
    out.into_bytes()
}

#[test]
fn anthropic_stop_reasons_map_and_keep_the_raw_string() {
    for (raw, reason) in [
        ("end_turn", StopReason::EndTurn),
        ("tool_use", StopReason::ToolUse),
        ("max_tokens", StopReason::MaxTokens),
        ("stop_sequence", StopReason::StopSequence),
        ("refusal", StopReason::Refusal),
        ("pause_turn", StopReason::EndTurn),
    ] {
        let d = decode(Fmt::Anthropic, &anthropic_stream(Some(raw), 5, false), 100);
        assert_eq!(d.response.stop_reason, reason, "{raw}");
        assert_eq!(d.response.stop_reason_raw, raw);
    }
    // An unknown value is derived, with the raw string kept.
    let d = decode(
        Fmt::Anthropic,
        &anthropic_stream(Some("brand_new"), 5, true),
        100,
    );
    assert_eq!(
        (d.response.stop_reason, d.response.stop_reason_raw.as_str()),
        (StopReason::ToolUse, "brand_new")
    );
}

#[test]
fn anthropic_missing_stop_reason_is_derived() {
    let d = decode(Fmt::Anthropic, &anthropic_stream(None, 5, false), 100);
    assert_eq!(d.response.stop_reason_raw, "derived:end_turn");
    let d = decode(Fmt::Anthropic, &anthropic_stream(None, 5, true), 100);
    assert_eq!(d.response.stop_reason_raw, "derived:tool_use");
    let d = decode(Fmt::Anthropic, &anthropic_stream(None, 100, true), 100);
    assert_eq!(
        (d.response.stop_reason, d.response.stop_reason_raw.as_str()),
        (StopReason::MaxTokens, "derived:max_tokens")
    );
}

#[test]
fn anthropic_error_event_is_an_error() {
    let body = b"event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
    let err = try_decode(Fmt::Anthropic, body, 3, 100)
        .err()
        .expect("error");
    assert_eq!(
        err,
        DecodeError::Provider {
            kind: "overloaded_error".into(),
            message: "Overloaded".into()
        }
    );
}

#[test]
fn anthropic_stream_without_message_stop_is_interrupted() {
    let full = anthropic_stream(Some("end_turn"), 5, false);
    let text = String::from_utf8_lossy(&full);
    let cut = text.find("event: message_stop").expect("has stop");
    let d = decode(Fmt::Anthropic, &full[..cut], 100);
    assert!(!d.done && d.received);
    assert_eq!(d.response.stop_reason, StopReason::Interrupted);
    assert_eq!(d.response.message.text(), "hi");
    let cut = text.find("event: content_block_delta").expect("has delta");
    let d = decode(Fmt::Anthropic, &full[..cut], 100);
    assert!(
        !d.received,
        "a started but empty text block is nothing received"
    );
}
