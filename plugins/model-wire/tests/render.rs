//! Request rendering for both dialects.

use keel_model_wire::RenderError;
use keel_model_wire::anthropic::{self, AnthropicOptions};
use keel_model_wire::openai::{self, MaxTokensField, OpenAiOptions};
use keel_protocol::{Block, Message, ModelRequest, Role, ToolDef};
use serde_json::json;

fn conversation() -> ModelRequest {
    ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system: "You are keel.".into(),
        messages: vec![
            Message::user_text("Read two files."),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::Thinking {
                        text: "private reasoning".into(),
                    },
                    Block::Text {
                        text: "Reading.".into(),
                    },
                    Block::ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: r#"{"path":"a.rs"}"#.into(),
                    },
                    Block::ToolCall {
                        id: "c2".into(),
                        name: "read_file".into(),
                        arguments: r#"{"path": "b.r"#.into(),
                    },
                ],
            },
            Message {
                role: Role::User,
                content: vec![
                    Block::Text {
                        text: "[notice] budget half spent".into(),
                    },
                    Block::ToolResult {
                        call_id: "c1".into(),
                        content: "fn a() {}".into(),
                        is_error: false,
                    },
                    Block::ToolResult {
                        call_id: "c2".into(),
                        content: "arguments were cut off".into(),
                        is_error: true,
                    },
                ],
            },
            Message::user_text("Also: be brief."),
        ],
        tools: vec![ToolDef {
            name: "read_file".into(),
            description: "Read a file.".into(),
            input_schema: json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}),
        }],
        max_tokens: 4096,
    }
}

#[test]
fn openai_request_body() {
    let r =
        openai::render_request(&conversation(), &OpenAiOptions::new("gpt-4o")).expect("renders");
    assert_eq!(
        r.body,
        json!({
            "model": "gpt-4o",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 4096,
            "messages": [
                {"role": "system", "content": "You are keel."},
                {"role": "user", "content": "Read two files."},
                {"role": "assistant", "content": "Reading.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "fn a() {}"},
                {"role": "tool", "tool_call_id": "c2", "content": "Error: arguments were cut off"},
                {"role": "user", "content": "[notice] budget half spent"},
                {"role": "user", "content": "Also: be brief."},
            ],
            "tools": [{"type": "function", "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type":"object","properties":{"path":{"type":"string"}},"required":["path"]},
            }}],
        })
    );
    assert!(!r.body.to_string().contains("private reasoning"));
}

#[test]
fn openai_options_and_model_choice() {
    let mut req = conversation();
    req.model = "o3-mini".into();
    let opts = OpenAiOptions {
        model: "gpt-4o".into(),
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
        include_usage: false,
    };
    let r = openai::render_request(&req, &opts).expect("renders");
    assert_eq!(r.body["model"], "o3-mini");
    assert_eq!(r.body["max_completion_tokens"], 4096);
    assert!(r.body.get("max_tokens").is_none());
    assert!(r.body.get("stream_options").is_none());
    req.model.clear();
    assert_eq!(
        openai::render_request(&req, &OpenAiOptions::new("")).expect_err("no model"),
        RenderError::NoModel
    );
}

#[test]
fn anthropic_request_body_merges_roles_and_puts_results_first() {
    let r = anthropic::render_request(&conversation(), &AnthropicOptions::new("claude-sonnet-4-5"))
        .expect("renders");
    assert_eq!(
        r.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "stream": true,
            "system": "You are keel.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Read two files."}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a.rs"}},
                    {"type": "tool_use", "id": "c2", "name": "read_file", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "fn a() {}", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "arguments were cut off", "is_error": true},
                    {"type": "text", "text": "[notice] budget half spent"},
                    {"type": "text", "text": "Also: be brief."},
                ]},
            ],
            "tools": [{
                "name": "read_file",
                "description": "Read a file.",
                "input_schema": {"type":"object","properties":{"path":{"type":"string"}},"required":["path"]},
            }],
        })
    );
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].contains("c2"), "{:?}", r.notes);
    assert!(!r.body.to_string().contains("private reasoning"));
}

#[test]
fn anthropic_drops_messages_left_empty_and_merges_around_them() {
    let req = ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: "claude-x".into(),
        system: String::new(),
        messages: vec![
            Message::user_text("a"),
            Message {
                role: Role::Assistant,
                content: vec![Block::Thinking {
                    text: "only thinking".into(),
                }],
            },
            Message::user_text("b"),
        ],
        tools: vec![],
        max_tokens: 10,
    };
    let r = anthropic::render_request(&req, &AnthropicOptions::new("")).expect("renders");
    assert_eq!(
        r.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    );
    assert!(r.body.get("system").is_none());
    assert!(r.body.get("tools").is_none());
}
