//! keel's own plugins speak `keel-protocol`'s types inside and the WIT's records at their
//! doors (ABI 0.5.0's `conversation` messages, carried by 0.6.0's typed services, 0.6.0's
//! `verifier` records, 0.7.0's model requests, responses and tool outcomes, and 0.8.0's
//! session-log entries and answers): the
//! conversions between the two, for every plugin that needs them (the agent loop hands
//! messages to `compaction`, receives them in `load`, asks the model and the dispatcher and
//! the verifier; `compaction` reads messages and asks the model; the verifier reads a turn and
//! answers a verdict; a model adapter reads a request and answers a response; the session log
//! reads entries and answers what a log holds).
//!
//! They are `keel_protocol::wit_conversions!` (and `wit_session_log_conversions!`) expanded
//! over keel-sdk's bindings: the kernel
//! expands the same macro over its own, so both sides of a door convert alike. Each function
//! takes its value. Pure code over generated records: it builds natively, so it is tested
//! with plain `cargo test`.

use keel_sdk::bindings::keel::plugin0_5_0::conversation;
use keel_sdk::bindings::keel::plugin0_6_0::{tool_registry, turns, verifier_types};
use keel_sdk::bindings::keel::plugin0_7_0::model_types;
use keel_sdk::bindings::keel::plugin0_8_0::session_log_types;

keel_protocol::wit_conversions!();
keel_protocol::wit_session_log_conversions!();

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

    #[test]
    fn every_log_entry_survives_the_round_trip_and_a_grandchilds_nests_as_it_did() {
        use keel_protocol::{
            LogHealth, LogLine, LogRead, LogWarning, LoggedContext, LoggedConversation,
            SessionEvent, SessionSummary, TurnEnd,
        };
        let tool = ToolDef {
            name: "read_file".into(),
            description: "Reads a file.".into(),
            input_schema: serde_json::json!({"type": "object"}),
        };
        let outcome = ToolOutcome {
            call_id: "c1".into(),
            tool: "read_file".into(),
            status: OutcomeStatus::Ok,
            content: "text".into(),
            exec: Vec::new(),
            spill: None,
        };
        let own = |session: &str| {
            vec![
                SessionEvent::SessionStarted {
                    session: session.into(),
                    workspace: "/w".into(),
                    model: "m".into(),
                },
                SessionEvent::Context {
                    session: session.into(),
                    system: "be brief".into(),
                    tools: vec![tool.clone()],
                },
                SessionEvent::Message {
                    session: session.into(),
                    message: Message::user_text("hi"),
                    stop_reason: Some(StopReason::ToolUse),
                    usage: Some(Usage {
                        input_tokens: 1,
                        output_tokens: 2,
                        cache_read_tokens: 3,
                        cache_write_tokens: 4,
                    }),
                },
                SessionEvent::Message {
                    session: session.into(),
                    message: Message::user_text("again"),
                    stop_reason: None,
                    usage: None,
                },
                SessionEvent::ToolOutcome {
                    session: session.into(),
                    outcome: outcome.clone(),
                },
                SessionEvent::ToolStarted {
                    session: session.into(),
                    calls: vec!["c1".into(), "c2".into()],
                },
                SessionEvent::Verdict {
                    session: session.into(),
                    verdict: Verdict {
                        status: VerdictStatus::Unsubstantiated,
                        dimension: "tests".into(),
                        claim: "all pass".into(),
                        command: None,
                        call_id: None,
                        exit_code: None,
                        evidence: String::new(),
                        failure_type: None,
                    },
                },
                SessionEvent::Compacted {
                    session: session.into(),
                    replaced: 40,
                    summary: "the task: read".into(),
                    reason: "threshold".into(),
                    tokens_before: 190_000,
                    tokens_after: 30_000,
                    context_window: Some(200_000),
                },
                SessionEvent::Rewound {
                    session: session.into(),
                    keep: 3,
                    turn: 2,
                    checkpoint: Some("c4".into()),
                },
                SessionEvent::TurnEnded {
                    session: session.into(),
                    end: TurnEnd::StepLimit,
                    detail: "500 steps".into(),
                },
            ]
        };
        let mut events = own("s1");
        // A grandchild's entry: filed under the child's call, which is filed under the
        // parent's.
        for inner in own("grandchild") {
            events.push(SessionEvent::Subagent {
                session: "s1".into(),
                parent_call: "c1".into(),
                child: 1,
                label: "explore".into(),
                event: Box::new(SessionEvent::Subagent {
                    session: "child".into(),
                    parent_call: "c9".into(),
                    child: 2,
                    label: "deeper".into(),
                    event: Box::new(inner),
                }),
            });
        }
        for event in &events {
            assert_eq!(
                session_event_from_wit(session_event_to_wit(event.clone())).as_ref(),
                Ok(event)
            );
        }
        let nested = session_event_to_wit(events.last().cloned().expect("events"));
        assert_eq!(nested.through.len(), 2);
        assert_eq!(
            (nested.through[0].session.as_str(), nested.session.as_str()),
            ("s1", "grandchild")
        );
        // What reading answers.
        let read = LogRead {
            lines: events
                .iter()
                .enumerate()
                .map(|(seq, event)| LogLine {
                    seq: seq as u64,
                    time_ms: 1_700_000_000_000 + seq as u64,
                    event: event.clone(),
                })
                .collect(),
            warnings: vec![LogWarning {
                line: 7,
                message: "torn".into(),
            }],
        };
        assert_eq!(log_read_from_wit(log_read_to_wit(read.clone())), Ok(read));
        let conversation = LoggedConversation {
            messages: vec![Message::user_text("hi")],
            context: Some(LoggedContext {
                system: "be brief".into(),
                tools: vec![tool],
            }),
            context_window: Some(100_000),
            warnings: Vec::new(),
            repairs: vec!["a call was answered as interrupted".into()],
        };
        assert_eq!(
            logged_conversation_from_wit(logged_conversation_to_wit(conversation.clone())),
            Ok(conversation)
        );
        let summary = SessionSummary {
            id: "s1".into(),
            first_time_ms: Some(1),
            last_time_ms: None,
            entries: 12,
            preview: Some("hi".into()),
            workspace: None,
            warnings: 1,
            error: Some("unreadable".into()),
        };
        assert_eq!(
            session_summary_from_wit(session_summary_to_wit(summary.clone())),
            summary
        );
        let health = LogHealth {
            failed: 2,
            error: Some("no space left".into()),
        };
        assert_eq!(
            log_health_from_wit(log_health_to_wit(health.clone())),
            health
        );
        // A logged tool whose schema is not JSON is refused, naming it.
        let mut context = session_event_to_wit(events[1].clone());
        if let session_log_types::Entry::Context(c) = &mut context.entry {
            c.tools[0].input_schema = "{".into();
        }
        let e = session_event_from_wit(context).expect_err("not JSON");
        assert!(e.contains("`read_file`"), "{e}");
    }
}
