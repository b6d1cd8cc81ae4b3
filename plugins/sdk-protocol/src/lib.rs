//! keel's own plugins speak `keel-protocol`'s types inside and the WIT's records at their
//! doors (ABI 0.5.0's `conversation` messages, carried by 0.6.0's typed services, 0.6.0's
//! `verifier` records and 0.7.0's model requests, responses and tool outcomes): the
//! conversions between the two, for every plugin that needs them (the agent loop hands
//! messages to `compaction`, receives them in `load`, asks the model and the dispatcher and
//! the verifier; `compaction` reads messages and asks the model; the verifier reads a turn and
//! answers a verdict; a model adapter reads a request and answers a response).
//!
//! They are `keel_protocol::wit_conversions!` expanded over keel-sdk's bindings: the kernel
//! expands the same macro over its own, so both sides of a door convert alike. Each function
//! takes its value. Pure code over generated records: it builds natively, so it is tested
//! with plain `cargo test`.

use keel_sdk::bindings::keel::plugin0_5_0::conversation;
use keel_sdk::bindings::keel::plugin0_6_0::{tool_registry, turns, verifier_types};
use keel_sdk::bindings::keel::plugin0_7_0::model_types;

keel_protocol::wit_conversions!();

#[cfg(test)]
mod tests {
    use keel_protocol::{
        Block, ConversationRef, ExecRecord, HeldConversation, Message, ModelRequest, ModelResponse,
        OutcomeStatus, Role, StopReason, ToolDef, ToolOutcome, TurnCall, Usage, Verdict,
        VerdictStatus, VerifyRequest,
    };

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
        assert_eq!(message_from_wit(message_to_wit(message.clone())), message);
        let user = Message::user_text("hi");
        assert_eq!(message_from_wit(message_to_wit(user.clone())), user);
    }

    #[test]
    fn a_turn_and_its_verdict_survive_the_round_trip() {
        let request = VerifyRequest {
            session: "s1".into(),
            final_text: "all tests pass".into(),
            calls: vec![TurnCall {
                call_id: "c1".into(),
                tool: "exec_shell".into(),
                input: serde_json::json!({"command": "cargo test"}),
                outcome: ToolOutcome {
                    call_id: "c1".into(),
                    tool: "exec_shell".into(),
                    status: OutcomeStatus::Error,
                    content: "1 failed".into(),
                    exec: vec![ExecRecord {
                        command: "cargo test".into(),
                        exit_code: Some(101),
                        timed_out: false,
                        sandbox: Some("bubblewrap workspace-write".into()),
                    }],
                    spill: None,
                },
            }],
        };
        assert_eq!(
            verify_request_from_wit(verify_request_to_wit(request.clone())),
            request
        );
        let verdict = Verdict {
            status: VerdictStatus::VerifiedFail,
            dimension: "tests".into(),
            claim: "all tests pass".into(),
            command: Some("cargo test".into()),
            call_id: Some("c1".into()),
            exit_code: Some(101),
            evidence: "1 failed".into(),
            failure_type: Some("test-failure".into()),
        };
        assert_eq!(verdict_from_wit(verdict_to_wit(verdict.clone())), verdict);
    }

    #[test]
    fn a_model_request_and_its_response_survive_the_round_trip() {
        let request = ModelRequest {
            model: "m".into(),
            system: "be brief".into(),
            messages: vec![Message::user_text("read a.rs")],
            tools: vec![ToolDef {
                name: "read_file".into(),
                description: "reads".into(),
                input_schema: serde_json::json!({"type": "object", "properties": {}}),
            }],
            max_tokens: 512,
            compacts_on_overflow: true,
            conversation: Some(ConversationRef {
                session: "s1".into(),
                messages: 3,
                held: Some(HeldConversation {
                    keeper: "agent-loop".into(),
                    revision: 2,
                }),
            }),
        };
        assert_eq!(
            model_request_from_wit(model_request_to_wit(request.clone())),
            Ok(request.clone())
        );
        let mut broken = model_request_to_wit(request.clone());
        broken.tools[0].input_schema = "{".into();
        let e = model_request_from_wit(broken).expect_err("not JSON");
        assert!(e.contains("`read_file`"), "{e}");
        let response = ModelResponse {
            message: Message {
                role: Role::Assistant,
                content: vec![Block::Text {
                    text: "done".into(),
                }],
            },
            stop_reason: StopReason::MaxTokens,
            stop_reason_raw: "length".into(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                cache_read_tokens: 3,
                cache_write_tokens: 4,
            },
            model: "m-1".into(),
            retries: 1,
        };
        assert_eq!(
            model_response_from_wit(model_response_to_wit(response.clone())),
            response
        );
    }
}
