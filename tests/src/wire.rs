//! Builders of the OpenAI Chat Completions and Anthropic Messages streams, as the vendors send
//! them, step by step for a [`ModelServer`](crate::model_server::ModelServer) to play.

use serde_json::{Value, json};

use crate::model_server::{Step, chunk, last_chunk, sse, sse_head};

// ---- OpenAI Chat Completions -------------------------------------------------------------

/// One `chat.completion.chunk` event.
pub fn oa(delta: Value, finish: Option<&str>) -> Step {
    sse(
        None,
        &json!({
            "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "gpt-test-2025", "system_fingerprint": "fp_test",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        }),
    )
}

/// The `stream_options.include_usage` chunk: no choices, the usage.
pub fn oa_usage(prompt: u64, completion: u64, cached: u64) -> Step {
    sse(
        None,
        &json!({
            "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "gpt-test-2025", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        }),
    )
}

/// `data: [DONE]` and the end of the body.
pub fn oa_done() -> Vec<Step> {
    vec![chunk("data: [DONE]\n\n"), last_chunk()]
}

/// A complete streamed text answer ending with `finish`, usage included.
pub fn oa_text(words: &[&str], finish: &str) -> Vec<Step> {
    let mut steps = vec![
        sse_head(),
        oa(json!({"role": "assistant", "content": ""}), None),
    ];
    for w in words {
        steps.push(oa(json!({"content": w}), None));
    }
    steps.push(oa(json!({}), Some(finish)));
    steps.push(oa_usage(12, words.len() as u64, 0));
    steps.extend(oa_done());
    steps
}

/// A whole answer of `text` in one chunk, ending with `stop`.
pub fn oa_answer(text: &str) -> Vec<Step> {
    let mut s = vec![
        sse_head(),
        oa(json!({"role": "assistant", "content": text}), None),
        oa(json!({}), Some("stop")),
        oa_usage(10, 2, 0),
    ];
    s.extend(oa_done());
    s
}

/// A whole answer calling tool `name` with `arguments` (JSON text) under `id`.
pub fn oa_tool_call(id: &str, name: &str, arguments: &str) -> Vec<Step> {
    oa_tool_calls(&[(id, name, arguments)])
}

/// A whole answer making several tool calls, each `(id, name, arguments)`.
pub fn oa_tool_calls(calls: &[(&str, &str, &str)]) -> Vec<Step> {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (id, name, arguments))| {
            json!({"index": index, "id": id, "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    let mut s = vec![
        sse_head(),
        oa(
            json!({"role": "assistant", "content": null, "tool_calls": calls}),
            None,
        ),
        oa(json!({}), Some("tool_calls")),
        oa_usage(10, 2, 0),
    ];
    s.extend(oa_done());
    s
}

// ---- Anthropic Messages ------------------------------------------------------------------

/// One named server-sent event.
pub fn an(event: &str, data: Value) -> Step {
    sse(Some(event), &data)
}

/// `message_start` with its input usage.
pub fn an_start(input: u64, cache_read: u64) -> Step {
    an(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test-2025",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "cache_read_input_tokens": cache_read,
                      "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    )
}

/// `content_block_start` of `block` at `index`.
pub fn an_block_start(index: u64, block: Value) -> Step {
    an(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

/// `content_block_delta` at `index`.
pub fn an_delta(index: u64, delta: Value) -> Step {
    an(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

/// `content_block_stop` at `index`.
pub fn an_block_stop(index: u64) -> Step {
    an(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

/// `message_delta` with the stop reason and output usage, `message_stop`, end of body.
pub fn an_end(stop: &str, output: u64) -> Vec<Step> {
    vec![
        an(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": output}}),
        ),
        an("message_stop", json!({"type": "message_stop"})),
        last_chunk(),
    ]
}

/// A whole answer of `text` in one block, ending with `end_turn`.
pub fn an_answer(text: &str) -> Vec<Step> {
    let mut s = vec![
        sse_head(),
        an_start(10, 0),
        an_block_start(0, json!({"type": "text", "text": ""})),
        an_delta(0, json!({"type": "text_delta", "text": text})),
        an_block_stop(0),
    ];
    s.extend(an_end("end_turn", 2));
    s
}

/// A whole answer calling tool `name` with `arguments` (JSON text) under `id`.
pub fn an_tool_call(id: &str, name: &str, arguments: &str) -> Vec<Step> {
    let mut s = vec![
        sse_head(),
        an_start(10, 0),
        an_block_start(
            0,
            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        ),
        an_delta(
            0,
            json!({"type": "input_json_delta", "partial_json": arguments}),
        ),
        an_block_stop(0),
    ];
    s.extend(an_end("tool_use", 2));
    s
}
