//! keel's own plugins speak `keel-protocol`'s types inside and the WIT's records at their
//! doors (ABI 0.5.0's `conversation` messages, carried by 0.6.0's typed services, and 0.6.0's
//! `verifier` records): the conversions between the two, written once for every plugin that
//! needs them (the agent loop hands messages to `compaction` and receives them in `load`,
//! and asks the verifier; `compaction` reads messages; the verifier reads a turn and answers
//! a verdict).
//!
//! Pure code over `keel-sdk`'s generated records: it builds natively, so it is tested with
//! plain `cargo test`.

use keel_protocol::{
    Block, ExecRecord, Message, OutcomeStatus, Role, ToolOutcome, TurnCall, Verdict, VerdictStatus,
    VerifyRequest,
};
use keel_sdk::conversation as wit;
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
                outcome: checks::ToolOutcome {
                    call_id: call.outcome.call_id.clone(),
                    tool: call.outcome.tool.clone(),
                    status: match call.outcome.status {
                        OutcomeStatus::Ok => checks::OutcomeStatus::Ok,
                        OutcomeStatus::Error => checks::OutcomeStatus::Error,
                        OutcomeStatus::Refused => checks::OutcomeStatus::Refused,
                        OutcomeStatus::NotExecuted => checks::OutcomeStatus::NotExecuted,
                    },
                    content: call.outcome.content.clone(),
                    exec: call
                        .outcome
                        .exec
                        .iter()
                        .map(|e| checks::ExecRecord {
                            command: e.command.clone(),
                            exit_code: e.exit_code,
                            timed_out: e.timed_out,
                            sandbox: e.sandbox.clone(),
                        })
                        .collect(),
                    spill: call.outcome.spill.clone(),
                },
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
                outcome: ToolOutcome {
                    call_id: call.outcome.call_id,
                    tool: call.outcome.tool,
                    status: match call.outcome.status {
                        checks::OutcomeStatus::Ok => OutcomeStatus::Ok,
                        checks::OutcomeStatus::Error => OutcomeStatus::Error,
                        checks::OutcomeStatus::Refused => OutcomeStatus::Refused,
                        checks::OutcomeStatus::NotExecuted => OutcomeStatus::NotExecuted,
                    },
                    content: call.outcome.content,
                    exec: call
                        .outcome
                        .exec
                        .into_iter()
                        .map(|e| ExecRecord {
                            command: e.command,
                            exit_code: e.exit_code,
                            timed_out: e.timed_out,
                            sandbox: e.sandbox,
                        })
                        .collect(),
                    spill: call.outcome.spill,
                },
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
}
