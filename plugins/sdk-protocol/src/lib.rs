//! keel's own plugins speak `keel-protocol`'s types inside and the WIT's records at their
//! doors (ABI 0.5.0's `conversation` messages, carried by 0.6.0's typed services): the
//! conversions between the two, written once for every plugin that needs them (the agent
//! loop hands messages to `compaction` and receives them in `load`; `compaction` reads them).
//!
//! Pure code over `keel-sdk`'s generated records: it builds natively, so it is tested with
//! plain `cargo test`.

use keel_protocol::{Block, Message, Role};
use keel_sdk::conversation as wit;

/// `message` as the typed doors carry it.
pub fn message_to_wit(message: &Message) -> wit::Message {
    wit::Message {
        role: match message.role {
            Role::User => wit::Role::User,
            Role::Assistant => wit::Role::Assistant,
        },
        content: message
            .content
            .iter()
            .map(|block| match block {
                Block::Text { text } => wit::Block::Text(text.clone()),
                Block::Thinking { text } => wit::Block::Thinking(text.clone()),
                Block::ToolCall {
                    id,
                    name,
                    arguments,
                } => wit::Block::ToolCall(wit::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                Block::ToolResult {
                    call_id,
                    content,
                    is_error,
                } => wit::Block::ToolResult(wit::ToolResult {
                    call_id: call_id.clone(),
                    content: content.clone(),
                    is_error: *is_error,
                }),
            })
            .collect(),
    }
}

/// A message a typed door carried, as keel's plugins hold it.
pub fn message_from_wit(message: wit::Message) -> Message {
    Message {
        role: match message.role {
            wit::Role::User => Role::User,
            wit::Role::Assistant => Role::Assistant,
        },
        content: message
            .content
            .into_iter()
            .map(|block| match block {
                wit::Block::Text(text) => Block::Text { text },
                wit::Block::Thinking(text) => Block::Thinking { text },
                wit::Block::ToolCall(call) => Block::ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments: call.arguments,
                },
                wit::Block::ToolResult(result) => Block::ToolResult {
                    call_id: result.call_id,
                    content: result.content,
                    is_error: result.is_error,
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_survives_the_round_trip() {
        let message = Message {
            role: Role::Assistant,
            content: vec![
                Block::Thinking {
                    text: "look first".into(),
                },
                Block::Text {
                    text: "reading".into(),
                },
                Block::ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.rs"#.into(),
                },
                Block::ToolResult {
                    call_id: "c1".into(),
                    content: "denied".into(),
                    is_error: true,
                },
            ],
        };
        assert_eq!(message_from_wit(message_to_wit(&message)), message);
        let user = Message::user_text("hi");
        assert_eq!(message_from_wit(message_to_wit(&user)), user);
    }
}
