//! The scripted model.

use keel_model_wire::scripted::{EXHAUSTED_TEXT, Script, ScriptError};
use keel_protocol::{Block, Message, ModelRequest, Role, StopReason, StreamDelta, Usage};

const SCRIPT: &str = r#"
model = "demo-model"

[[step]]
thinking = "The user wants the file."
text = "Let me read it."
[[step.tool_calls]]
name = "read_file"
arguments = { path = "src/main.rs" }

[[step]]
expect_tool_result_contains = "fn main"
text = "Now a call cut off by the output limit."
stop_reason = "max_tokens"
usage = { input_tokens = 1200, output_tokens = 64 }
[[step.tool_calls]]
name = "write_file"
raw_arguments = '{"path": "notes.md", "content": "unfini'

[[step]]
text = "Done."
"#;

fn request(assistants: usize, last_result: Option<&str>) -> ModelRequest {
    let mut messages = vec![Message::user_text("go")];
    for i in 0..assistants {
        messages.push(Message {
            role: Role::Assistant,
            content: vec![Block::Text {
                text: format!("turn {i}"),
            }],
        });
        messages.push(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                call_id: format!("c{i}"),
                content: last_result.unwrap_or("ok").into(),
                is_error: false,
            }],
        });
    }
    ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system: String::new(),
        messages,
        tools: vec![],
        max_tokens: 64,
    }
}

#[test]
fn plays_steps_by_the_number_of_assistant_messages() {
    let script = Script::parse(SCRIPT).expect("parses");
    let mut deltas = Vec::new();
    let first = script
        .respond(&request(0, None), &mut |d| deltas.push(d))
        .expect("step 1");
    assert_eq!(first.model, "demo-model");
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    assert_eq!(first.stop_reason_raw, "derived:tool_use");
    assert_eq!(
        first.message.content,
        vec![
            Block::Thinking {
                text: "The user wants the file.".into()
            },
            Block::Text {
                text: "Let me read it.".into()
            },
            Block::ToolCall {
                id: "call_1_1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"src/main.rs"}"#.into()
            },
        ]
    );
    let words: Vec<&StreamDelta> = deltas
        .iter()
        .filter(|d| matches!(d, StreamDelta::Text { .. }))
        .collect();
    assert_eq!(words.len(), 4, "word chunks: {deltas:?}");
    assert!(deltas.contains(&StreamDelta::ToolCallStart {
        id: "call_1_1".into(),
        name: "read_file".into()
    }));

    let second = script
        .respond(&request(1, Some("fn main() {}")), &mut |_| {})
        .expect("step 2");
    assert_eq!(second.stop_reason, StopReason::MaxTokens);
    assert_eq!(
        second.usage,
        Usage {
            input_tokens: 1200,
            output_tokens: 64,
            ..Usage::default()
        }
    );
    let (_, _, args) = second.message.tool_calls().next().expect("a call");
    assert_eq!(args, r#"{"path": "notes.md", "content": "unfini"#);

    let third = script
        .respond(&request(2, None), &mut |_| {})
        .expect("step 3");
    assert_eq!(third.message.text(), "Done.");
    assert_eq!(third.stop_reason, StopReason::EndTurn);

    let past = script
        .respond(&request(3, None), &mut |_| {})
        .expect("exhausted answer");
    assert_eq!(past.message.text(), EXHAUSTED_TEXT);
    assert_eq!(past.stop_reason, StopReason::EndTurn);
}

#[test]
fn a_failed_expectation_is_a_clear_error() {
    let script = Script::from_toml(SCRIPT).expect("parses");
    let err = script
        .respond(&request(1, Some("permission denied")), &mut |_| {})
        .expect_err("expectation fails");
    assert_eq!(
        err,
        ScriptError::Expectation {
            step: 2,
            expected: "fn main".into(),
            found: "permission denied".into()
        }
    );
    assert!(err.to_string().contains("step 2"), "{err}");
}

#[test]
fn json_scripts_and_bad_scripts() {
    let script = Script::parse(
        r#"{"step": [{"text": "hi", "stop_reason": "refusal", "tool_calls": [{"name": "x", "id": "k"}]}]}"#,
    )
    .expect("json parses");
    let r = script
        .respond(&request(0, None), &mut |_| {})
        .expect("plays");
    assert_eq!(r.stop_reason, StopReason::Refusal);
    assert_eq!(r.model, "scripted");
    assert_eq!(r.message.tool_calls().next(), Some(("k", "x", "{}")));
    let err = Script::parse("[[step]]\ntxt = \"typo\"\n").expect_err("unknown key");
    assert!(matches!(err, ScriptError::Parse(_)), "{err:?}");
}
