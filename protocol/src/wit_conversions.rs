//! The conversions between this crate's types and the records keel's WIT defines for them
//! (ABI 0.5.0's `conversation`, 0.6.0's `verifier-types`, `tool-registry` and `turns`, 0.7.0's
//! `model-types`), written once for both sides of a door: the kernel's wasmtime bindings and a
//! guest's wit-bindgen bindings generate records of the same names and fields in types of
//! their own, so [`wit_conversions!`](crate::wit_conversions) expands the same functions over
//! whichever the invoking module names.

/// Expands, in the invoking module, free functions between `keel_protocol`'s types and a WIT
/// binding's records: `message_to_wit`/`message_from_wit`, `outcome_to_wit`/`outcome_from_wit`,
/// `verify_request_to_wit`/`verify_request_from_wit`, `verdict_to_wit`/`verdict_from_wit`,
/// `tool_def_to_wit`/`tool_def_from_wit`, `model_request_to_wit`/`model_request_from_wit`,
/// `model_response_to_wit`/`model_response_from_wit`, `stop_reason_to_wit`/
/// `stop_reason_from_wit`, `turn_end_to_wit`/`turn_end_from_wit` and `usage_to_wit`/
/// `usage_from_wit`. Each takes its value and answers the other side's; a tool's input schema
/// crosses as JSON text, and one that does not parse is refused naming the tool
/// (`tool_def_from_wit` and `model_request_from_wit` answer a `Result`), a tool call's
/// arguments that do not parse are `null` input (as the agent loop records them).
///
/// The invoking module names the binding's modules in scope as `conversation`,
/// `verifier_types`, `tool_registry`, `turns` and `model_types` (with `use … as …`): the
/// functions' bodies resolve the records' names there.
#[macro_export]
macro_rules! wit_conversions {
    () => {
        /// `message` as the typed doors carry it.
        pub fn message_to_wit(message: $crate::Message) -> conversation::Message {
            conversation::Message {
                role: match message.role {
                    $crate::Role::User => conversation::Role::User,
                    $crate::Role::Assistant => conversation::Role::Assistant,
                },
                content: message
                    .content
                    .into_iter()
                    .map(|block| match block {
                        $crate::Block::Text { text } => conversation::Block::Text(text),
                        $crate::Block::Thinking { text } => conversation::Block::Thinking(text),
                        $crate::Block::ToolCall {
                            id,
                            name,
                            arguments,
                        } => conversation::Block::ToolCall(conversation::ToolCall {
                            id,
                            name,
                            arguments,
                        }),
                        $crate::Block::ToolResult {
                            call_id,
                            content,
                            is_error,
                        } => conversation::Block::ToolResult(conversation::ToolResult {
                            call_id,
                            content,
                            is_error,
                        }),
                    })
                    .collect(),
            }
        }

        /// A message a typed door carried.
        pub fn message_from_wit(message: conversation::Message) -> $crate::Message {
            $crate::Message {
                role: match message.role {
                    conversation::Role::User => $crate::Role::User,
                    conversation::Role::Assistant => $crate::Role::Assistant,
                },
                content: message
                    .content
                    .into_iter()
                    .map(|block| match block {
                        conversation::Block::Text(text) => $crate::Block::Text { text },
                        conversation::Block::Thinking(text) => $crate::Block::Thinking { text },
                        conversation::Block::ToolCall(call) => $crate::Block::ToolCall {
                            id: call.id,
                            name: call.name,
                            arguments: call.arguments,
                        },
                        conversation::Block::ToolResult(result) => $crate::Block::ToolResult {
                            call_id: result.call_id,
                            content: result.content,
                            is_error: result.is_error,
                        },
                    })
                    .collect(),
            }
        }

        /// A tool call's outcome as the typed doors carry it (`agent.dispatch`, a verifier's
        /// turn).
        pub fn outcome_to_wit(outcome: $crate::ToolOutcome) -> verifier_types::ToolOutcome {
            verifier_types::ToolOutcome {
                call_id: outcome.call_id,
                tool: outcome.tool,
                status: match outcome.status {
                    $crate::OutcomeStatus::Ok => verifier_types::OutcomeStatus::Ok,
                    $crate::OutcomeStatus::Error => verifier_types::OutcomeStatus::Error,
                    $crate::OutcomeStatus::Refused => verifier_types::OutcomeStatus::Refused,
                    $crate::OutcomeStatus::NotExecuted => {
                        verifier_types::OutcomeStatus::NotExecuted
                    }
                },
                content: outcome.content,
                exec: outcome
                    .exec
                    .into_iter()
                    .map(|e| verifier_types::ExecRecord {
                        command: e.command,
                        exit_code: e.exit_code,
                        timed_out: e.timed_out,
                        sandbox: e.sandbox,
                    })
                    .collect(),
                spill: outcome.spill,
            }
        }

        /// A tool call's outcome a typed door carried.
        pub fn outcome_from_wit(outcome: verifier_types::ToolOutcome) -> $crate::ToolOutcome {
            $crate::ToolOutcome {
                call_id: outcome.call_id,
                tool: outcome.tool,
                status: match outcome.status {
                    verifier_types::OutcomeStatus::Ok => $crate::OutcomeStatus::Ok,
                    verifier_types::OutcomeStatus::Error => $crate::OutcomeStatus::Error,
                    verifier_types::OutcomeStatus::Refused => $crate::OutcomeStatus::Refused,
                    verifier_types::OutcomeStatus::NotExecuted => {
                        $crate::OutcomeStatus::NotExecuted
                    }
                },
                content: outcome.content,
                exec: outcome
                    .exec
                    .into_iter()
                    .map(|e| $crate::ExecRecord {
                        command: e.command,
                        exit_code: e.exit_code,
                        timed_out: e.timed_out,
                        sandbox: e.sandbox,
                    })
                    .collect(),
                spill: outcome.spill,
            }
        }

        /// A finished turn as the verifier's typed door carries it; the arguments as JSON
        /// text.
        pub fn verify_request_to_wit(
            request: $crate::VerifyRequest,
        ) -> verifier_types::VerifyRequest {
            verifier_types::VerifyRequest {
                session: request.session,
                final_text: request.final_text,
                calls: request
                    .calls
                    .into_iter()
                    .map(|call| verifier_types::TurnCall {
                        call_id: call.call_id,
                        tool: call.tool,
                        input: call.input.to_string(),
                        outcome: outcome_to_wit(call.outcome),
                    })
                    .collect(),
            }
        }

        /// A finished turn the verifier's typed door carried; arguments that are not JSON are
        /// no input (`null`), as the agent loop records them.
        pub fn verify_request_from_wit(
            request: verifier_types::VerifyRequest,
        ) -> $crate::VerifyRequest {
            $crate::VerifyRequest {
                session: request.session,
                final_text: request.final_text,
                calls: request
                    .calls
                    .into_iter()
                    .map(|call| $crate::TurnCall {
                        call_id: call.call_id,
                        tool: call.tool,
                        input: $crate::__serde_json::from_str(&call.input)
                            .unwrap_or($crate::__serde_json::Value::Null),
                        outcome: outcome_from_wit(call.outcome),
                    })
                    .collect(),
            }
        }

        /// A verdict as the verifier's typed door carries it.
        pub fn verdict_to_wit(verdict: $crate::Verdict) -> verifier_types::Verdict {
            verifier_types::Verdict {
                status: match verdict.status {
                    $crate::VerdictStatus::VerifiedPass => {
                        verifier_types::VerdictStatus::VerifiedPass
                    }
                    $crate::VerdictStatus::VerifiedFail => {
                        verifier_types::VerdictStatus::VerifiedFail
                    }
                    $crate::VerdictStatus::VerifyError => {
                        verifier_types::VerdictStatus::VerifyError
                    }
                    $crate::VerdictStatus::Unsubstantiated => {
                        verifier_types::VerdictStatus::Unsubstantiated
                    }
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
        pub fn verdict_from_wit(verdict: verifier_types::Verdict) -> $crate::Verdict {
            $crate::Verdict {
                status: match verdict.status {
                    verifier_types::VerdictStatus::VerifiedPass => {
                        $crate::VerdictStatus::VerifiedPass
                    }
                    verifier_types::VerdictStatus::VerifiedFail => {
                        $crate::VerdictStatus::VerifiedFail
                    }
                    verifier_types::VerdictStatus::VerifyError => {
                        $crate::VerdictStatus::VerifyError
                    }
                    verifier_types::VerdictStatus::Unsubstantiated => {
                        $crate::VerdictStatus::Unsubstantiated
                    }
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

        /// A tool as the typed doors offer it to the model; its input schema as JSON text.
        pub fn tool_def_to_wit(tool: $crate::ToolDef) -> tool_registry::ToolDef {
            tool_registry::ToolDef {
                input_schema: tool.input_schema.to_string(),
                name: tool.name,
                description: tool.description,
            }
        }

        /// A tool a typed door offered; an input schema that is not JSON is refused, naming
        /// the tool.
        pub fn tool_def_from_wit(tool: tool_registry::ToolDef) -> Result<$crate::ToolDef, String> {
            let input_schema = $crate::__serde_json::from_str(&tool.input_schema).map_err(|e| {
                format!("the input schema of tool `{}` is not JSON: {e}", tool.name)
            })?;
            Ok($crate::ToolDef {
                name: tool.name,
                description: tool.description,
                input_schema,
            })
        }

        /// A model request as the typed doors carry it (`agent.complete`, `model.complete`).
        pub fn model_request_to_wit(request: $crate::ModelRequest) -> model_types::ModelRequest {
            model_types::ModelRequest {
                model: request.model,
                system: request.system,
                messages: request.messages.into_iter().map(message_to_wit).collect(),
                tools: request.tools.into_iter().map(tool_def_to_wit).collect(),
                max_tokens: request.max_tokens,
                compacts_on_overflow: request.compacts_on_overflow,
                conversation: request.conversation.map(|c| model_types::ConversationRef {
                    session: c.session,
                    messages: u32::try_from(c.messages).unwrap_or(u32::MAX),
                    held: c.held.map(|h| model_types::HeldConversation {
                        keeper: h.keeper,
                        revision: h.revision,
                    }),
                }),
            }
        }

        /// A model request a typed door carried; a tool's input schema that is not JSON is
        /// refused, naming the tool.
        pub fn model_request_from_wit(
            request: model_types::ModelRequest,
        ) -> Result<$crate::ModelRequest, String> {
            Ok($crate::ModelRequest {
                model: request.model,
                system: request.system,
                messages: request.messages.into_iter().map(message_from_wit).collect(),
                tools: request
                    .tools
                    .into_iter()
                    .map(tool_def_from_wit)
                    .collect::<Result<_, _>>()?,
                max_tokens: request.max_tokens,
                compacts_on_overflow: request.compacts_on_overflow,
                conversation: request.conversation.map(|c| $crate::ConversationRef {
                    session: c.session,
                    messages: c.messages as usize,
                    held: c.held.map(|h| $crate::HeldConversation {
                        keeper: h.keeper,
                        revision: h.revision,
                    }),
                }),
            })
        }

        /// How a turn ended, as the typed doors carry it.
        pub fn turn_end_to_wit(end: $crate::TurnEnd) -> turns::TurnEnd {
            match end {
                $crate::TurnEnd::Completed => turns::TurnEnd::Completed,
                $crate::TurnEnd::Interrupted => turns::TurnEnd::Interrupted,
                $crate::TurnEnd::StepLimit => turns::TurnEnd::StepLimit,
                $crate::TurnEnd::LoopGuard => turns::TurnEnd::LoopGuard,
                $crate::TurnEnd::Cancelled => turns::TurnEnd::Cancelled,
                $crate::TurnEnd::ModelError => turns::TurnEnd::ModelError,
            }
        }

        /// How a turn ended, as a typed door carried it.
        pub fn turn_end_from_wit(end: turns::TurnEnd) -> $crate::TurnEnd {
            match end {
                turns::TurnEnd::Completed => $crate::TurnEnd::Completed,
                turns::TurnEnd::Interrupted => $crate::TurnEnd::Interrupted,
                turns::TurnEnd::StepLimit => $crate::TurnEnd::StepLimit,
                turns::TurnEnd::LoopGuard => $crate::TurnEnd::LoopGuard,
                turns::TurnEnd::Cancelled => $crate::TurnEnd::Cancelled,
                turns::TurnEnd::ModelError => $crate::TurnEnd::ModelError,
            }
        }

        /// Token counts, as the typed doors carry them.
        pub fn usage_to_wit(usage: $crate::Usage) -> turns::Usage {
            turns::Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_write_tokens: usage.cache_write_tokens,
            }
        }

        /// Token counts, as a typed door carried them.
        pub fn usage_from_wit(usage: turns::Usage) -> $crate::Usage {
            $crate::Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_write_tokens: usage.cache_write_tokens,
            }
        }

        /// Why the model stopped, as the typed doors carry it.
        pub fn stop_reason_to_wit(reason: $crate::StopReason) -> model_types::StopReason {
            match reason {
                $crate::StopReason::EndTurn => model_types::StopReason::EndTurn,
                $crate::StopReason::ToolUse => model_types::StopReason::ToolUse,
                $crate::StopReason::MaxTokens => model_types::StopReason::MaxTokens,
                $crate::StopReason::StopSequence => model_types::StopReason::StopSequence,
                $crate::StopReason::Refusal => model_types::StopReason::Refusal,
                $crate::StopReason::Interrupted => model_types::StopReason::Interrupted,
            }
        }

        /// Why the model stopped, as a typed door carried it.
        pub fn stop_reason_from_wit(reason: model_types::StopReason) -> $crate::StopReason {
            match reason {
                model_types::StopReason::EndTurn => $crate::StopReason::EndTurn,
                model_types::StopReason::ToolUse => $crate::StopReason::ToolUse,
                model_types::StopReason::MaxTokens => $crate::StopReason::MaxTokens,
                model_types::StopReason::StopSequence => $crate::StopReason::StopSequence,
                model_types::StopReason::Refusal => $crate::StopReason::Refusal,
                model_types::StopReason::Interrupted => $crate::StopReason::Interrupted,
            }
        }

        /// A model response as the typed doors carry it.
        pub fn model_response_to_wit(
            response: $crate::ModelResponse,
        ) -> model_types::ModelResponse {
            model_types::ModelResponse {
                message: message_to_wit(response.message),
                stop_reason: stop_reason_to_wit(response.stop_reason),
                stop_reason_raw: response.stop_reason_raw,
                usage: usage_to_wit(response.usage),
                model: response.model,
                retries: response.retries,
            }
        }

        /// A model response a typed door carried.
        pub fn model_response_from_wit(
            response: model_types::ModelResponse,
        ) -> $crate::ModelResponse {
            $crate::ModelResponse {
                message: message_from_wit(response.message),
                stop_reason: stop_reason_from_wit(response.stop_reason),
                stop_reason_raw: response.stop_reason_raw,
                usage: usage_from_wit(response.usage),
                model: response.model,
                retries: response.retries,
            }
        }
    };
}

/// Expands, in the invoking module, the conversions between the person's hooks' types
/// ([`HookSessionStart`](crate::HookSessionStart) and the rest) and ABI 0.7.0's `hooks` records,
/// both ways: the kernel sends requests and reads verdicts, the hooks plugin the other way
/// round, so each side uses half (the other half is allowed to go unused). The invoking module
/// names the binding's `hooks` interface in scope as `hooks`.
#[macro_export]
macro_rules! wit_hook_conversions {
    () => {
        /// A session-start request as the typed door carries it.
        #[allow(dead_code)]
        pub fn session_start_to_wit(r: $crate::HookSessionStart) -> hooks::SessionStartRequest {
            hooks::SessionStartRequest {
                session: r.session,
                source: r.source,
            }
        }

        /// A session-start request the typed door carried.
        #[allow(dead_code)]
        pub fn session_start_from_wit(r: hooks::SessionStartRequest) -> $crate::HookSessionStart {
            $crate::HookSessionStart {
                session: r.session,
                source: r.source,
            }
        }

        /// What the session-start hooks said, as the typed door carries it.
        #[allow(dead_code)]
        pub fn hook_context_to_wit(c: $crate::HookContext) -> hooks::HookContext {
            hooks::HookContext {
                context: c.context,
                errors: c.errors,
            }
        }

        /// What the session-start hooks said, as the typed door carried it.
        #[allow(dead_code)]
        pub fn hook_context_from_wit(c: hooks::HookContext) -> $crate::HookContext {
            $crate::HookContext {
                context: c.context,
                errors: c.errors,
            }
        }

        /// A tool call as the typed door carries it; its input as JSON text.
        #[allow(dead_code)]
        pub fn tool_use_to_wit(call: $crate::HookToolUse) -> hooks::ToolUse {
            hooks::ToolUse {
                tool: call.tool,
                arguments: call.arguments.to_string(),
                output: call.result,
                status: match call.status {
                    $crate::HookToolStatus::Ok => hooks::ToolStatus::Ok,
                    $crate::HookToolStatus::Error => hooks::ToolStatus::Error,
                },
            }
        }

        /// A tool call the typed door carried; input that is not JSON is none (`null`), as the
        /// agent loop records it.
        #[allow(dead_code)]
        pub fn tool_use_from_wit(call: hooks::ToolUse) -> $crate::HookToolUse {
            $crate::HookToolUse {
                tool: call.tool,
                arguments: $crate::__serde_json::from_str(&call.arguments)
                    .unwrap_or($crate::__serde_json::Value::Null),
                result: call.output,
                status: match call.status {
                    hooks::ToolStatus::Ok => $crate::HookToolStatus::Ok,
                    hooks::ToolStatus::Error => $crate::HookToolStatus::Error,
                },
            }
        }

        /// A prompt as the typed door carries it.
        #[allow(dead_code)]
        pub fn prompt_to_wit(r: $crate::HookPrompt) -> hooks::PromptRequest {
            hooks::PromptRequest {
                session: r.session,
                prompt: r.prompt,
            }
        }

        /// A prompt the typed door carried.
        #[allow(dead_code)]
        pub fn prompt_from_wit(r: hooks::PromptRequest) -> $crate::HookPrompt {
            $crate::HookPrompt {
                session: r.session,
                prompt: r.prompt,
            }
        }

        /// What the user-prompt-submit hooks decided, as the typed door carries it.
        #[allow(dead_code)]
        pub fn prompt_verdict_to_wit(v: $crate::PromptVerdict) -> hooks::PromptVerdict {
            hooks::PromptVerdict {
                blocked: v.blocked,
                reason: v.reason,
                context: v.context,
            }
        }

        /// What the user-prompt-submit hooks decided, as the typed door carried it.
        #[allow(dead_code)]
        pub fn prompt_verdict_from_wit(v: hooks::PromptVerdict) -> $crate::PromptVerdict {
            $crate::PromptVerdict {
                blocked: v.blocked,
                reason: v.reason,
                context: v.context,
            }
        }

        /// A turn's end as the typed door carries it.
        #[allow(dead_code)]
        pub fn stop_to_wit(r: $crate::HookStop) -> hooks::StopRequest {
            hooks::StopRequest {
                session: r.session,
                stop_hook_active: r.stop_hook_active,
            }
        }

        /// A turn's end the typed door carried.
        #[allow(dead_code)]
        pub fn stop_from_wit(r: hooks::StopRequest) -> $crate::HookStop {
            $crate::HookStop {
                session: r.session,
                stop_hook_active: r.stop_hook_active,
            }
        }

        /// What the stop hooks decided, as the typed door carries it.
        #[allow(dead_code)]
        pub fn stop_verdict_to_wit(v: $crate::StopVerdict) -> hooks::StopVerdict {
            hooks::StopVerdict {
                errors: v.errors,
                go_on: v.go_on,
                reason: v.reason,
            }
        }

        /// What the stop hooks decided, as the typed door carried it.
        #[allow(dead_code)]
        pub fn stop_verdict_from_wit(v: hooks::StopVerdict) -> $crate::StopVerdict {
            $crate::StopVerdict {
                errors: v.errors,
                go_on: v.go_on,
                reason: v.reason,
            }
        }
    };
}

/// Expands, in the invoking module, the conversions between the session log's types
/// ([`SessionEvent`](crate::SessionEvent), [`LogRead`](crate::LogRead),
/// [`SessionSummary`](crate::SessionSummary), [`LoggedConversation`](crate::LoggedConversation),
/// [`LogHealth`](crate::LogHealth)) and ABI 0.8.0's `session-log-types` records, both ways
/// (the kernel and the log's callers use one half, the log the other; the rest may go
/// unused). The invoking module names that interface in scope as `session_log_types`, besides
/// what [`wit_conversions!`](crate::wit_conversions) needs, and has `wit_conversions!`'s
/// functions in scope (expand both in the same module).
///
/// A child agent's entry ([`SessionEvent::Subagent`](crate::SessionEvent::Subagent), which
/// nests the child's entry) crosses flat: the chain of children it came through, outermost
/// first, and the innermost entry.
#[macro_export]
macro_rules! wit_session_log_conversions {
    () => {
        fn count_from_wit(n: u64) -> usize {
            usize::try_from(n).unwrap_or(usize::MAX)
        }

        fn context_to_wit(
            system: String,
            tools: Vec<$crate::ToolDef>,
        ) -> session_log_types::Context {
            session_log_types::Context {
                system,
                tools: tools.into_iter().map(tool_def_to_wit).collect(),
            }
        }

        fn tools_from_wit(
            tools: Vec<tool_registry::ToolDef>,
        ) -> Result<Vec<$crate::ToolDef>, String> {
            tools.into_iter().map(tool_def_from_wit).collect()
        }

        /// A log entry as the typed door carries it: a child's entry flat, the chain of
        /// children it came through first.
        #[allow(dead_code)]
        pub fn session_event_to_wit(
            event: $crate::SessionEvent,
        ) -> session_log_types::SessionEvent {
            use session_log_types::Entry;
            let mut through = Vec::new();
            let mut event = event;
            let (session, entry) = loop {
                break match event {
                    $crate::SessionEvent::Subagent {
                        session,
                        parent_call,
                        child,
                        label,
                        event: inner,
                    } => {
                        through.push(session_log_types::SubagentFrame {
                            session,
                            parent_call,
                            child,
                            label,
                        });
                        event = *inner;
                        continue;
                    }
                    $crate::SessionEvent::SessionStarted {
                        session,
                        workspace,
                        model,
                    } => (
                        session,
                        Entry::SessionStarted(session_log_types::SessionStarted {
                            workspace,
                            model,
                        }),
                    ),
                    $crate::SessionEvent::Context {
                        session,
                        system,
                        tools,
                    } => (session, Entry::Context(context_to_wit(system, tools))),
                    $crate::SessionEvent::Message {
                        session,
                        message,
                        stop_reason,
                        usage,
                    } => (
                        session,
                        Entry::Message(session_log_types::LoggedMessage {
                            message: message_to_wit(message),
                            stop_reason: stop_reason.map(stop_reason_to_wit),
                            usage: usage.map(usage_to_wit),
                        }),
                    ),
                    $crate::SessionEvent::ToolOutcome { session, outcome } => {
                        (session, Entry::ToolOutcome(outcome_to_wit(outcome)))
                    }
                    $crate::SessionEvent::ToolStarted { session, calls } => {
                        (session, Entry::ToolStarted(calls))
                    }
                    $crate::SessionEvent::Verdict { session, verdict } => {
                        (session, Entry::Verdict(verdict_to_wit(verdict)))
                    }
                    $crate::SessionEvent::Compacted {
                        session,
                        replaced,
                        summary,
                        reason,
                        tokens_before,
                        tokens_after,
                        context_window,
                    } => (
                        session,
                        Entry::Compacted(session_log_types::Compacted {
                            replaced: replaced as u64,
                            summary,
                            reason,
                            tokens_before,
                            tokens_after,
                            context_window,
                        }),
                    ),
                    $crate::SessionEvent::Rewound {
                        session,
                        keep,
                        turn,
                        checkpoint,
                    } => (
                        session,
                        Entry::Rewound(session_log_types::Rewound {
                            keep: keep as u64,
                            turn,
                            checkpoint,
                        }),
                    ),
                    $crate::SessionEvent::TurnEnded {
                        session,
                        end,
                        detail,
                    } => (
                        session,
                        Entry::TurnEnded(session_log_types::TurnEnded {
                            end: turn_end_to_wit(end),
                            detail,
                        }),
                    ),
                };
            };
            session_log_types::SessionEvent {
                through,
                session,
                entry,
            }
        }

        /// A log entry the typed door carried; a tool whose input schema is not JSON is
        /// refused, naming it.
        #[allow(dead_code)]
        pub fn session_event_from_wit(
            event: session_log_types::SessionEvent,
        ) -> Result<$crate::SessionEvent, String> {
            use session_log_types::Entry;
            let session = event.session;
            let mut built = match event.entry {
                Entry::SessionStarted(s) => $crate::SessionEvent::SessionStarted {
                    session,
                    workspace: s.workspace,
                    model: s.model,
                },
                Entry::Context(c) => $crate::SessionEvent::Context {
                    session,
                    system: c.system,
                    tools: tools_from_wit(c.tools)?,
                },
                Entry::Message(m) => $crate::SessionEvent::Message {
                    session,
                    message: message_from_wit(m.message),
                    stop_reason: m.stop_reason.map(stop_reason_from_wit),
                    usage: m.usage.map(usage_from_wit),
                },
                Entry::ToolOutcome(outcome) => $crate::SessionEvent::ToolOutcome {
                    session,
                    outcome: outcome_from_wit(outcome),
                },
                Entry::ToolStarted(calls) => $crate::SessionEvent::ToolStarted { session, calls },
                Entry::Verdict(verdict) => $crate::SessionEvent::Verdict {
                    session,
                    verdict: verdict_from_wit(verdict),
                },
                Entry::Compacted(c) => $crate::SessionEvent::Compacted {
                    session,
                    replaced: count_from_wit(c.replaced),
                    summary: c.summary,
                    reason: c.reason,
                    tokens_before: c.tokens_before,
                    tokens_after: c.tokens_after,
                    context_window: c.context_window,
                },
                Entry::Rewound(r) => $crate::SessionEvent::Rewound {
                    session,
                    keep: count_from_wit(r.keep),
                    turn: r.turn,
                    checkpoint: r.checkpoint,
                },
                Entry::TurnEnded(t) => $crate::SessionEvent::TurnEnded {
                    session,
                    end: turn_end_from_wit(t.end),
                    detail: t.detail,
                },
            };
            // The innermost child first: each frame wraps what is inside it.
            for frame in event.through.into_iter().rev() {
                built = $crate::SessionEvent::Subagent {
                    session: frame.session,
                    parent_call: frame.parent_call,
                    child: frame.child,
                    label: frame.label,
                    event: Box::new(built),
                };
            }
            Ok(built)
        }

        fn log_warning_to_wit(w: $crate::LogWarning) -> session_log_types::LogWarning {
            session_log_types::LogWarning {
                line: w.line as u64,
                message: w.message,
            }
        }

        fn log_warning_from_wit(w: session_log_types::LogWarning) -> $crate::LogWarning {
            $crate::LogWarning {
                line: count_from_wit(w.line),
                message: w.message,
            }
        }

        /// A log's entries as the typed door carries them.
        #[allow(dead_code)]
        pub fn log_read_to_wit(read: $crate::LogRead) -> session_log_types::LogRead {
            session_log_types::LogRead {
                lines: read
                    .lines
                    .into_iter()
                    .map(|line| session_log_types::LogLine {
                        seq: line.seq,
                        time_ms: line.time_ms,
                        event: session_event_to_wit(line.event),
                    })
                    .collect(),
                warnings: read.warnings.into_iter().map(log_warning_to_wit).collect(),
            }
        }

        /// A log's entries the typed door carried.
        #[allow(dead_code)]
        pub fn log_read_from_wit(
            read: session_log_types::LogRead,
        ) -> Result<$crate::LogRead, String> {
            Ok($crate::LogRead {
                lines: read
                    .lines
                    .into_iter()
                    .map(|line| {
                        Ok($crate::LogLine {
                            seq: line.seq,
                            time_ms: line.time_ms,
                            event: session_event_from_wit(line.event)?,
                        })
                    })
                    .collect::<Result<_, String>>()?,
                warnings: read
                    .warnings
                    .into_iter()
                    .map(log_warning_from_wit)
                    .collect(),
            })
        }

        /// A listed session as the typed door carries it.
        #[allow(dead_code)]
        pub fn session_summary_to_wit(
            s: $crate::SessionSummary,
        ) -> session_log_types::SessionSummary {
            session_log_types::SessionSummary {
                id: s.id,
                first_time_ms: s.first_time_ms,
                last_time_ms: s.last_time_ms,
                entries: s.entries as u64,
                preview: s.preview,
                workspace: s.workspace,
                warnings: s.warnings as u64,
                error: s.error,
            }
        }

        /// A listed session the typed door carried.
        #[allow(dead_code)]
        pub fn session_summary_from_wit(
            s: session_log_types::SessionSummary,
        ) -> $crate::SessionSummary {
            $crate::SessionSummary {
                id: s.id,
                first_time_ms: s.first_time_ms,
                last_time_ms: s.last_time_ms,
                entries: count_from_wit(s.entries),
                preview: s.preview,
                workspace: s.workspace,
                warnings: count_from_wit(s.warnings),
                error: s.error,
            }
        }

        /// A logged conversation as the typed door carries it.
        #[allow(dead_code)]
        pub fn logged_conversation_to_wit(
            c: $crate::LoggedConversation,
        ) -> session_log_types::LoggedConversation {
            session_log_types::LoggedConversation {
                messages: c.messages.into_iter().map(message_to_wit).collect(),
                context: c.context.map(|c| context_to_wit(c.system, c.tools)),
                context_window: c.context_window,
                warnings: c.warnings.into_iter().map(log_warning_to_wit).collect(),
                repairs: c.repairs,
            }
        }

        /// A logged conversation the typed door carried.
        #[allow(dead_code)]
        pub fn logged_conversation_from_wit(
            c: session_log_types::LoggedConversation,
        ) -> Result<$crate::LoggedConversation, String> {
            Ok($crate::LoggedConversation {
                messages: c.messages.into_iter().map(message_from_wit).collect(),
                context: match c.context {
                    Some(c) => Some($crate::LoggedContext {
                        system: c.system,
                        tools: tools_from_wit(c.tools)?,
                    }),
                    None => None,
                },
                context_window: c.context_window,
                warnings: c.warnings.into_iter().map(log_warning_from_wit).collect(),
                repairs: c.repairs,
            })
        }

        /// A log's health as the typed door carries it.
        #[allow(dead_code)]
        pub fn log_health_to_wit(h: $crate::LogHealth) -> session_log_types::LogHealth {
            session_log_types::LogHealth {
                failed: h.failed,
                error: h.error,
            }
        }

        /// A log's health the typed door carried.
        #[allow(dead_code)]
        pub fn log_health_from_wit(h: session_log_types::LogHealth) -> $crate::LogHealth {
            $crate::LogHealth {
                failed: h.failed,
                error: h.error,
            }
        }
    };
}
