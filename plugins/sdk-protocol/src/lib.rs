//! keel's own plugins speak `keel-protocol`'s types inside and the WIT's records at their
//! doors (ABI 0.5.0's `conversation` messages, carried by 0.6.0's typed services, 0.6.0's
//! `verifier` records and 0.7.0's model requests, responses and tool outcomes): the
//! conversions between the two, written once for every plugin that needs them (the agent loop
//! hands messages to `compaction`, receives them in `load`, asks the model and the dispatcher
//! and the verifier; `compaction` reads messages and asks the model; the verifier reads a turn
//! and answers a verdict; a model adapter reads a request and answers a response).
//!
//! Pure code over `keel-sdk`'s generated records: it builds natively, so it is tested with
//! plain `cargo test`.

use keel_protocol::{
    Block, ConversationRef, ExecRecord, HeldConversation, Message, ModelRequest, ModelResponse,
    OutcomeStatus, Role, StopReason, ToolDef, ToolOutcome, TurnCall, Usage, Verdict, VerdictStatus,
    VerifyRequest,
};
use keel_sdk::conversation as wit;
use keel_sdk::model as models;
use keel_sdk::verifier as checks;

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

/// A finished turn as the verifier's typed door carries it; the arguments as JSON text.
pub fn verify_request_to_wit(request: &VerifyRequest) -> checks::VerifyRequest {
    checks::VerifyRequest {
        session: request.session.clone(),
        final_text: request.final_text.clone(),
        calls: request
            .calls
            .iter()
            .map(|call| checks::TurnCall {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                input: call.input.to_string(),
                outcome: outcome_to_wit(&call.outcome),
            })
            .collect(),
    }
}

/// A finished turn the verifier's typed door carried; arguments that are not JSON are no
/// input (`null`), as the agent loop records them.
pub fn verify_request_from_wit(request: checks::VerifyRequest) -> VerifyRequest {
    VerifyRequest {
        session: request.session,
        final_text: request.final_text,
        calls: request
            .calls
            .into_iter()
            .map(|call| TurnCall {
                call_id: call.call_id,
                tool: call.tool,
                input: serde_json::from_str(&call.input).unwrap_or(serde_json::Value::Null),
                outcome: outcome_from_wit(call.outcome),
            })
            .collect(),
    }
}

/// A verdict as the verifier's typed door carries it.
pub fn verdict_to_wit(verdict: Verdict) -> checks::Verdict {
    checks::Verdict {
        status: match verdict.status {
            VerdictStatus::VerifiedPass => checks::VerdictStatus::VerifiedPass,
            VerdictStatus::VerifiedFail => checks::VerdictStatus::VerifiedFail,
            VerdictStatus::VerifyError => checks::VerdictStatus::VerifyError,
            VerdictStatus::Unsubstantiated => checks::VerdictStatus::Unsubstantiated,
        },
        dimension: verdict.dimension,
        claim: verdict.claim,
        command: verdict.command,
        call_id: verdict.call_id,
        exit_code: verdict.exit_code,
        evidence: verdict.evidence,
        failure_type: verdict.failure_type,
    }
}

/// A verdict the verifier's typed door carried.
pub fn verdict_from_wit(verdict: checks::Verdict) -> Verdict {
    Verdict {
        status: match verdict.status {
            checks::VerdictStatus::VerifiedPass => VerdictStatus::VerifiedPass,
            checks::VerdictStatus::VerifiedFail => VerdictStatus::VerifiedFail,
            checks::VerdictStatus::VerifyError => VerdictStatus::VerifyError,
            checks::VerdictStatus::Unsubstantiated => VerdictStatus::Unsubstantiated,
        },
        dimension: verdict.dimension,
        claim: verdict.claim,
        command: verdict.command,
        call_id: verdict.call_id,
        exit_code: verdict.exit_code,
        evidence: verdict.evidence,
        failure_type: verdict.failure_type,
    }
}

/// A tool call's outcome as the typed doors carry it (`agent.dispatch`, the verifier's turn).
pub fn outcome_to_wit(outcome: &ToolOutcome) -> checks::ToolOutcome {
    checks::ToolOutcome {
        call_id: outcome.call_id.clone(),
        tool: outcome.tool.clone(),
        status: match outcome.status {
            OutcomeStatus::Ok => checks::OutcomeStatus::Ok,
            OutcomeStatus::Error => checks::OutcomeStatus::Error,
            OutcomeStatus::Refused => checks::OutcomeStatus::Refused,
            OutcomeStatus::NotExecuted => checks::OutcomeStatus::NotExecuted,
        },
        content: outcome.content.clone(),
        exec: outcome
            .exec
            .iter()
            .map(|e| checks::ExecRecord {
                command: e.command.clone(),
                exit_code: e.exit_code,
                timed_out: e.timed_out,
                sandbox: e.sandbox.clone(),
            })
            .collect(),
        spill: outcome.spill.clone(),
    }
}

/// A tool call's outcome a typed door carried.
pub fn outcome_from_wit(outcome: checks::ToolOutcome) -> ToolOutcome {
    ToolOutcome {
        call_id: outcome.call_id,
        tool: outcome.tool,
        status: match outcome.status {
            checks::OutcomeStatus::Ok => OutcomeStatus::Ok,
            checks::OutcomeStatus::Error => OutcomeStatus::Error,
            checks::OutcomeStatus::Refused => OutcomeStatus::Refused,
            checks::OutcomeStatus::NotExecuted => OutcomeStatus::NotExecuted,
        },
        content: outcome.content,
        exec: outcome
            .exec
            .into_iter()
            .map(|e| ExecRecord {
                command: e.command,
                exit_code: e.exit_code,
                timed_out: e.timed_out,
                sandbox: e.sandbox,
            })
            .collect(),
        spill: outcome.spill,
    }
}

/// A model request as the typed doors carry it (`agent.complete`, `model.complete`); each
/// tool's input schema as JSON text.
pub fn model_request_to_wit(request: &ModelRequest) -> models::ModelRequest {
    models::ModelRequest {
        model: request.model.clone(),
        system: request.system.clone(),
        messages: request.messages.iter().map(message_to_wit).collect(),
        tools: request.tools.iter().map(tool_def_to_wit).collect(),
        max_tokens: request.max_tokens,
        compacts_on_overflow: request.compacts_on_overflow,
        conversation: request
            .conversation
            .as_ref()
            .map(|c| models::ConversationRef {
                session: c.session.clone(),
                messages: u32::try_from(c.messages).unwrap_or(u32::MAX),
                held: c.held.as_ref().map(|h| models::HeldConversation {
                    keeper: h.keeper.clone(),
                    revision: h.revision,
                }),
            }),
    }
}

/// A tool as the typed doors offer it to the model; its input schema as JSON text.
pub fn tool_def_to_wit(tool: &ToolDef) -> keel_sdk::tool_registry::ToolDef {
    keel_sdk::tool_registry::ToolDef {
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema: tool.input_schema.to_string(),
    }
}

/// A model request a typed door carried. A tool's input schema that is not JSON is refused,
/// naming the tool.
pub fn model_request_from_wit(request: models::ModelRequest) -> Result<ModelRequest, String> {
    let mut tools = Vec::with_capacity(request.tools.len());
    for tool in request.tools {
        let input_schema = serde_json::from_str(&tool.input_schema)
            .map_err(|e| format!("the input schema of tool `{}` is not JSON: {e}", tool.name))?;
        tools.push(ToolDef {
            name: tool.name,
            description: tool.description,
            input_schema,
        });
    }
    Ok(ModelRequest {
        model: request.model,
        system: request.system,
        messages: request.messages.into_iter().map(message_from_wit).collect(),
        tools,
        max_tokens: request.max_tokens,
        compacts_on_overflow: request.compacts_on_overflow,
        conversation: request.conversation.map(|c| ConversationRef {
            session: c.session,
            messages: c.messages as usize,
            held: c.held.map(|h| HeldConversation {
                keeper: h.keeper,
                revision: h.revision,
            }),
        }),
    })
}

/// A model response as the typed doors carry it.
pub fn model_response_to_wit(response: ModelResponse) -> models::ModelResponse {
    models::ModelResponse {
        message: message_to_wit(&response.message),
        stop_reason: match response.stop_reason {
            StopReason::EndTurn => models::StopReason::EndTurn,
            StopReason::ToolUse => models::StopReason::ToolUse,
            StopReason::MaxTokens => models::StopReason::MaxTokens,
            StopReason::StopSequence => models::StopReason::StopSequence,
            StopReason::Refusal => models::StopReason::Refusal,
            StopReason::Interrupted => models::StopReason::Interrupted,
        },
        stop_reason_raw: response.stop_reason_raw,
        usage: keel_sdk::turns::Usage {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
            cache_read_tokens: response.usage.cache_read_tokens,
            cache_write_tokens: response.usage.cache_write_tokens,
        },
        model: response.model,
        retries: response.retries,
    }
}

/// A model response a typed door carried.
pub fn model_response_from_wit(response: models::ModelResponse) -> ModelResponse {
    ModelResponse {
        message: message_from_wit(response.message),
        stop_reason: match response.stop_reason {
            models::StopReason::EndTurn => StopReason::EndTurn,
            models::StopReason::ToolUse => StopReason::ToolUse,
            models::StopReason::MaxTokens => StopReason::MaxTokens,
            models::StopReason::StopSequence => StopReason::StopSequence,
            models::StopReason::Refusal => StopReason::Refusal,
            models::StopReason::Interrupted => StopReason::Interrupted,
        },
        stop_reason_raw: response.stop_reason_raw,
        usage: Usage {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
            cache_read_tokens: response.usage.cache_read_tokens,
            cache_write_tokens: response.usage.cache_write_tokens,
        },
        model: response.model,
        retries: response.retries,
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
            verify_request_from_wit(verify_request_to_wit(&request)),
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
            model_request_from_wit(model_request_to_wit(&request)),
            Ok(request.clone())
        );
        let mut broken = model_request_to_wit(&request);
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
