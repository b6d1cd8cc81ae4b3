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
        r.json(),
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
    assert!(!r.json().to_string().contains("private reasoning"));
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
    assert_eq!(r.json()["model"], "o3-mini");
    assert_eq!(r.json()["max_completion_tokens"], 4096);
    assert!(r.json().get("max_tokens").is_none());
    assert!(r.json().get("stream_options").is_none());
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
        r.json(),
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
    assert!(!r.json().to_string().contains("private reasoning"));
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
        r.json()["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    );
    assert!(r.json().get("system").is_none());
    assert!(r.json().get("tools").is_none());
}

/// The request's strings are copied into the body as the JSON text they arrived as: whatever
/// they hold (quotes, backslashes, control characters, any Unicode), the body is JSON and
/// each string reads back exactly, joined and prefixed where the format says so.
mod in_place {
    use super::*;
    use keel_model_wire::request::RequestView;
    use proptest::prelude::*;

    fn request(user: &str, result: &str, is_error: bool, arguments: &str) -> ModelRequest {
        ModelRequest {
            compacts_on_overflow: true,
            conversation: None,
            model: String::new(),
            system: format!("s{user}"),
            messages: vec![
                Message {
                    role: Role::User,
                    content: vec![
                        Block::Text { text: user.into() },
                        Block::Text {
                            text: result.into(),
                        },
                    ],
                },
                Message {
                    role: Role::Assistant,
                    content: vec![
                        Block::Text { text: user.into() },
                        Block::ToolCall {
                            id: result.into(),
                            name: "t".into(),
                            arguments: arguments.into(),
                        },
                    ],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        call_id: result.into(),
                        content: result.into(),
                        is_error,
                    }],
                },
            ],
            tools: vec![ToolDef {
                name: user.into(),
                description: result.into(),
                input_schema: json!({"type": "object", "description": user}),
            }],
            max_tokens: 7,
        }
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[\"\\\\\\n\\t\\u{0}-\\u{1f}\\u{7f}\\u{2028}\\u{fffd}a/ ]{0,24}",
        ]
    }

    proptest! {
        #[test]
        fn strings_read_back_exactly(
            user in text(),
            result in text(),
            is_error: bool,
            arguments in prop_oneof![text(), Just(r#"{"path": "a\"b"}"#.to_string())],
        ) {
            let req = request(&user, &result, is_error, &arguments);
            let args_json = serde_json::from_str::<serde_json::Value>(&arguments).is_ok();

            let o = openai::render_request(&req, &OpenAiOptions::new("m")).expect("renders");
            let body: serde_json::Value = serde_json::from_slice(&o.body).expect("JSON");
            let m = &body["messages"];
            prop_assert_eq!(&m[0]["content"], &json!(format!("s{user}")));
            prop_assert_eq!(&m[1]["content"], &json!(format!("{user}\n{result}")));
            prop_assert_eq!(&m[2]["content"], &json!(user));
            prop_assert_eq!(&m[2]["tool_calls"][0]["id"], &json!(result));
            let sent = if args_json { arguments.as_str() } else { "{}" };
            prop_assert_eq!(&m[2]["tool_calls"][0]["function"]["arguments"], &json!(sent));
            let content = if is_error { format!("Error: {result}") } else { result.clone() };
            prop_assert_eq!(&m[3]["content"], &json!(content));
            prop_assert_eq!(&body["tools"][0]["function"]["description"], &json!(result));
            prop_assert_eq!(&body["tools"][0]["function"]["parameters"]["description"], &json!(user));

            let a = anthropic::render_request(&req, &AnthropicOptions::new("m")).expect("renders");
            let body: serde_json::Value = serde_json::from_slice(&a.body).expect("JSON");
            prop_assert_eq!(&body["system"], &json!(format!("s{user}")));
            let m = &body["messages"];
            let texts: Vec<&str> = [user.as_str(), result.as_str()]
                .into_iter()
                .filter(|t| !t.is_empty())
                .collect();
            for (i, t) in texts.iter().enumerate() {
                prop_assert_eq!(&m[0]["content"][i]["text"], &json!(t));
            }
            // A message left without blocks is dropped.
            let m = &m.as_array().expect("messages")[usize::from(!texts.is_empty())..];
            let input = match serde_json::from_str::<serde_json::Value>(&arguments) {
                Ok(v) if v.is_object() => v,
                _ => json!({}),
            };
            let call = m[0]["content"].as_array().expect("blocks").last().expect("a call");
            prop_assert_eq!(&call["input"], &input);
            prop_assert_eq!(&call["id"], &json!(result));
            prop_assert_eq!(&m[1]["content"][0]["content"], &json!(result));
            prop_assert_eq!(&m[1]["content"][0]["is_error"], &json!(is_error));
        }
    }

    #[test]
    fn a_request_that_is_not_one_is_refused_with_what_is_wrong() {
        for (json, says) in [
            (
                r#"{"system":1,"messages":[],"tools":[],"max_tokens":1}"#,
                "expected a string",
            ),
            (
                r#"{"system":"","messages":[{"role":"user","content":[{"type":"picture"}]}],"tools":[],"max_tokens":1}"#,
                "unknown block type `picture`",
            ),
            (
                r#"{"system":"","messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}],"tools":[],"max_tokens":1}"#,
                "needs `call_id`",
            ),
            (
                "{\"system\":\"a\u{1}\",\"messages\":[],\"tools\":[],\"max_tokens\":1}",
                "control character",
            ),
            (r#"{"system":"a"}"#, "not a ModelRequest"),
        ] {
            let e = RequestView::parse(json).expect_err(json).to_string();
            assert!(e.contains(says), "{json}: {e}");
        }
    }
}
