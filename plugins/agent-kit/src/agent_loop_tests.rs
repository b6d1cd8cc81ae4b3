//! The agent loop against a fake kernel: scripted model responses, recorded dispatches, events
//! and kept state.

use std::collections::{BTreeMap, VecDeque};

use keel_protocol::{
    Block, Message, ModelRequest, ModelResponse, OutcomeStatus, Role, SessionEvent, StopReason,
    ToolOutcome, TurnEnd, TurnReport, TurnRequest, Usage, services, topics,
};

use super::{AgentDoors, AgentLoop, DoorError, LoadRequest};
use keel_protocol::ToolSpec;

/// A kernel that answers from a script and records what the loop did.
#[derive(Default)]
struct FakeKernel {
    /// Model answers, in order; an empty script is a model error.
    responses: VecDeque<Result<ModelResponse, DoorError>>,
    /// Requests the loop sent, decoded.
    requests: Vec<ModelRequest>,
    tools: Vec<ToolSpec>,
    /// Each dispatch's call ids.
    dispatched: Vec<Vec<String>>,
    /// Status of every dispatched call (default `Ok`), by call id.
    statuses: BTreeMap<String, OutcomeStatus>,
    /// Dispatch answers this instead of an outcome (malformed kernel data).
    dispatch_garbage: bool,
    /// `cancelled()` turns true once this many model calls were made.
    cancel_after_requests: Option<usize>,
    /// The model call fails once the person cancelled (a stream cut by Ctrl-C).
    fail_when_cancelled: bool,
    services: BTreeMap<(String, String), Result<String, DoorError>>,
    /// Every service call, (service, method).
    service_calls: Vec<(String, String)>,
    events: Vec<SessionEvent>,
    /// `compaction.status` payloads.
    statuses_shown: Vec<String>,
    /// Characters each tool result is padded with.
    result_pad: usize,
    state: BTreeMap<String, Vec<u8>>,
    warnings: Vec<String>,
    /// The kernel keeps nothing (a child agent's doors): requests must carry their messages.
    keeps_nothing: bool,
    /// `state_set` of a message key fails from this index on (a full state quota).
    state_full_from: Option<usize>,
    /// Requests that named their conversation rather than carried it.
    by_reference: usize,
}

impl FakeKernel {
    /// What the kernel does with a request that names its conversation: the named messages
    /// from the agent's kept state, in order, put into `messages`; a missing one is refused.
    fn resolve(&mut self, mut request: ModelRequest) -> Result<ModelRequest, DoorError> {
        let Some(named) = request.conversation.take() else {
            return Ok(request);
        };
        assert!(
            request.messages.is_empty(),
            "a named conversation is carried too"
        );
        self.by_reference += 1;
        for index in 0..named.messages {
            let key = keel_protocol::conversation_key(&named.session, index);
            let bytes = self.state.get(&key).ok_or_else(|| DoorError {
                kind: "invalid",
                message: format!("the kernel holds no `{key}`"),
            })?;
            request
                .messages
                .push(serde_json::from_slice(bytes).expect("a kept message"));
        }
        Ok(request)
    }
}

impl AgentDoors for FakeKernel {
    fn complete_request(&mut self, request: &ModelRequest) -> Result<ModelResponse, DoorError> {
        let request = self.resolve(request.clone())?;
        self.requests.push(request);
        if self.fail_when_cancelled && self.cancelled() {
            return Err(DoorError {
                kind: "failed",
                message: "stream closed".into(),
            });
        }
        let answer = self.responses.pop_front().unwrap_or(Err(DoorError {
            kind: "failed",
            message: "no more scripted answers".into(),
        }))?;
        Ok(answer)
    }

    fn dispatch_outcomes(&mut self, call_ids: &[String]) -> Vec<ToolOutcome> {
        self.dispatched.push(call_ids.to_vec());
        if self.dispatch_garbage {
            // A JSON door's answer that does not read, as a child's doors would get it.
            let garbage = call_ids.iter().map(|_| String::from("{not json")).collect();
            return crate::agent_loop::outcomes_from_json(call_ids, garbage);
        }
        call_ids
            .iter()
            .map(|id| ToolOutcome {
                call_id: id.clone(),
                tool: String::from("tool"),
                status: self.statuses.get(id).copied().unwrap_or(OutcomeStatus::Ok),
                content: format!("result of {id}{}", "r".repeat(self.result_pad)),
                exec: Vec::new(),
                spill: None,
            })
            .collect()
    }

    fn cancelled(&mut self) -> bool {
        self.cancel_after_requests
            .is_some_and(|n| self.requests.len() >= n)
    }

    fn call(&mut self, service: &str, method: &str, _payload: &str) -> Result<String, DoorError> {
        self.service_calls
            .push((service.to_owned(), method.to_owned()));
        self.services
            .get(&(service.to_owned(), method.to_owned()))
            .cloned()
            .unwrap_or(Err(DoorError {
                kind: "unavailable",
                message: format!("no {service}"),
            }))
    }

    fn registered_tools(&mut self) -> Vec<ToolSpec> {
        self.tools.clone()
    }

    fn emit(&mut self, topic: &str, payload: &str) -> Result<(), DoorError> {
        if topic == topics::COMPACTION_STATUS {
            self.statuses_shown.push(payload.to_owned());
            return Ok(());
        }
        assert_eq!(topic, topics::SESSION_EVENT);
        self.events
            .push(serde_json::from_str(payload).expect("a session event"));
        Ok(())
    }

    fn state_get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.state.get(key).cloned()
    }

    fn keeps_conversation(&self) -> bool {
        !self.keeps_nothing
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), DoorError> {
        let index = key
            .rsplit_once('/')
            .and_then(|(_, i)| i.parse::<usize>().ok());
        if let (Some(full), Some(index)) = (self.state_full_from, index)
            && index >= full
        {
            return Err(DoorError {
                kind: "invalid",
                message: "more than 16777216 bytes of state".into(),
            });
        }
        self.state.insert(key.to_owned(), value.to_vec());
        Ok(())
    }

    fn state_keys(&mut self) -> Vec<String> {
        // Reverse order: the loop must not rely on the kernel's key order.
        self.state.keys().rev().cloned().collect()
    }

    fn state_remove(&mut self, key: &str) {
        self.state.remove(key);
    }

    fn warn(&mut self, message: &str) {
        self.warnings.push(message.to_owned());
    }
}

fn tool(name: &str, parallel_safe: bool) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("the {name} tool"),
        input_schema: String::from(r#"{"type":"object"}"#),
        capabilities: keel_protocol::ToolCapabilities::empty(),
        parallel_safe,
    }
}

fn answer(text: &str) -> Result<ModelResponse, DoorError> {
    Ok(ModelResponse {
        message: Message {
            role: Role::Assistant,
            content: vec![Block::Text { text: text.into() }],
        },
        stop_reason: StopReason::EndTurn,
        stop_reason_raw: String::from("stop"),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        },
        model: String::from("fake"),
        retries: 0,
    })
}

/// A response calling `(id, tool, arguments)` for each entry.
fn calls(list: &[(&str, &str, &str)]) -> Result<ModelResponse, DoorError> {
    Ok(ModelResponse {
        message: Message {
            role: Role::Assistant,
            content: list
                .iter()
                .map(|(id, name, args)| Block::ToolCall {
                    id: (*id).into(),
                    name: (*name).into(),
                    arguments: (*args).into(),
                })
                .collect(),
        },
        stop_reason: StopReason::ToolUse,
        stop_reason_raw: String::from("tool_calls"),
        usage: Usage::default(),
        model: String::from("fake"),
        retries: 0,
    })
}

fn agent(kernel: FakeKernel, config: &str) -> AgentLoop<FakeKernel> {
    AgentLoop::new(config, kernel).expect("valid config")
}

fn turn(agent: &mut AgentLoop<FakeKernel>, input: &str) -> TurnReport {
    agent.turn(TurnRequest {
        session: String::from("s1"),
        input: input.into(),
    })
}

fn results_of(message: &Message) -> Vec<(String, String, bool)> {
    message
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult {
                call_id,
                content,
                is_error,
            } => Some((call_id.clone(), content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_plain_answer_completes_the_turn_and_is_logged() {
    let mut k = FakeKernel::default();
    k.responses.push_back(answer("hello"));
    let mut a = agent(k, r#"{"system":"be brief"}"#);
    let r = turn(&mut a, "hi");
    assert_eq!(r.end, TurnEnd::Completed);
    assert_eq!((r.text.as_str(), r.steps, r.tool_calls), ("hello", 1, 0));
    assert_eq!(r.usage.input_tokens, 10);
    assert_eq!(a.conversation("s1").expect("held").len(), 2);
    let k = a.doors_mut();
    assert_eq!(k.requests[0].system, "be brief");
    assert_eq!(k.requests[0].max_tokens, 8192);
    let kinds: Vec<&str> = k
        .events
        .iter()
        .map(|e| match e {
            SessionEvent::Context { .. } => "context",
            SessionEvent::Message { .. } => "message",
            SessionEvent::TurnEnded { .. } => "ended",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["message", "context", "message", "ended"]);
}

#[test]
fn tool_results_come_back_in_call_order_and_reach_the_next_request() {
    let mut k = FakeKernel {
        tools: vec![tool("read", true), tool("write", false)],
        ..FakeKernel::default()
    };
    k.responses.push_back(calls(&[
        ("c1", "read", "{}"),
        ("c2", "read", r#"{"p":1}"#),
        ("c3", "write", "{}"),
    ]));
    k.responses.push_back(answer("done"));
    k.statuses.insert("c3".into(), OutcomeStatus::Error);
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!((r.end, r.steps, r.tool_calls), (TurnEnd::Completed, 2, 3));
    let k = a.doors_mut();
    // The two parallel-safe reads as one batch, the write alone.
    assert_eq!(k.dispatched, [vec!["c1", "c2"], vec!["c3"]]);
    let second = &k.requests[1].messages;
    let results = results_of(second.last().expect("results"));
    assert_eq!(
        results,
        [
            ("c1".into(), "result of c1".into(), false),
            ("c2".into(), "result of c2".into(), false),
            ("c3".into(), "result of c3".into(), true),
        ]
    );
}

#[test]
fn the_third_identical_call_is_blocked_without_reaching_the_kernel() {
    let mut k = FakeKernel {
        tools: vec![tool("read", false)],
        ..FakeKernel::default()
    };
    for id in ["c1", "c2", "c3"] {
        k.responses
            .push_back(calls(&[(id, "read", r#"{"path": "a", "n": 1}"#)]));
    }
    k.responses.push_back(answer("ok"));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::Completed);
    let k = a.doors_mut();
    assert_eq!(k.dispatched, [vec!["c1"], vec!["c2"]]);
    let last = k.requests[3].messages.last().expect("results");
    let results = results_of(last);
    assert!(
        results[0].1.contains("blocked by the loop guard"),
        "{results:?}"
    );
    assert!(results[0].2, "a blocked call is an error for the model");
}

#[test]
fn consecutive_failures_warn_then_stop_the_turn() {
    let mut k = FakeKernel::default();
    for i in 0..10 {
        let id = format!("c{i}");
        k.statuses.insert(id.clone(), OutcomeStatus::Error);
        let args = format!(r#"{{"i":{i}}}"#);
        k.responses
            .push_back(calls(&[(id.as_str(), "run", args.as_str())]));
    }
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::LoopGuard);
    assert!(r.detail.contains("8 consecutive failing"), "{}", r.detail);
    assert_eq!(r.steps, 8);
    let k = a.doors_mut();
    let warned = k.requests[3].messages.last().expect("results");
    assert!(
        warned
            .content
            .iter()
            .any(|b| matches!(b, Block::Text { text } if text.contains("3 tool calls in a row"))),
        "no warning after three failures"
    );
}

#[test]
fn the_step_limit_ends_the_turn_and_says_how_to_raise_it() {
    let mut k = FakeKernel::default();
    for i in 0..5 {
        let id = format!("c{i}");
        let args = format!(r#"{{"i":{i}}}"#);
        k.responses
            .push_back(calls(&[(id.as_str(), "read", args.as_str())]));
    }
    let mut a = agent(k, r#"{"max-steps": 2, "max-tokens": 100}"#);
    let r = turn(&mut a, "go");
    assert_eq!((r.end, r.steps), (TurnEnd::StepLimit, 2));
    assert!(r.detail.contains("limit of 2 model calls"));
    assert!(r.detail.contains("max-steps"));
    assert_eq!(a.doors_mut().requests[0].max_tokens, 100);
}

#[test]
fn a_cancel_before_the_model_call_sends_nothing() {
    let k = FakeKernel {
        cancel_after_requests: Some(0),
        ..FakeKernel::default()
    };
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!((r.end, r.steps), (TurnEnd::Cancelled, 0));
    assert!(a.doors_mut().requests.is_empty());
}

#[test]
fn a_stream_cut_by_ctrl_c_is_a_cancel_not_a_model_error() {
    let mut k = FakeKernel {
        cancel_after_requests: Some(1),
        fail_when_cancelled: true,
        ..FakeKernel::default()
    };
    k.responses.push_back(answer("never"));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::Cancelled);
    assert!(r.detail.contains("Ctrl-C"));
}

#[test]
fn calls_of_a_cancelled_response_do_not_run_but_each_gets_a_result() {
    let mut k = FakeKernel {
        cancel_after_requests: Some(1),
        ..FakeKernel::default()
    };
    k.responses
        .push_back(calls(&[("c1", "write", "{}"), ("c2", "write", "{}")]));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::Cancelled);
    let conversation = a.conversation("s1").expect("held");
    let k = a.doors_mut();
    assert!(k.dispatched.is_empty(), "a cancelled call ran");
    let results = results_of(conversation.last().expect("results"));
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|(_, text, err)| *err && text.contains("not executed"))
    );
}

#[test]
fn a_model_error_ends_the_turn_with_its_message() {
    let mut a = agent(FakeKernel::default(), "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::ModelError);
    assert!(
        r.detail.contains("no more scripted answers"),
        "{}",
        r.detail
    );
}

#[test]
fn a_model_error_reads_as_the_model_plugin_said_it() {
    let mut k = FakeKernel::default();
    k.responses.push_back(Err(DoorError {
        kind: "failed",
        message: "the model provider rejected the API key (HTTP 401): check it".into(),
    }));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::ModelError);
    assert_eq!(
        r.detail,
        "the model provider rejected the API key (HTTP 401): check it"
    );
}

#[test]
fn malformed_kernel_data_becomes_an_error_result_not_a_crash() {
    let mut k = FakeKernel {
        dispatch_garbage: true,
        ..FakeKernel::default()
    };
    k.responses.push_back(calls(&[("c1", "read", "{}")]));
    k.responses.push_back(answer("ok"));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::Completed);
    let k = a.doors_mut();
    let results = results_of(k.requests[1].messages.last().expect("results"));
    assert!(results[0].1.contains("malformed data"), "{results:?}");
    assert!(results[0].2);
}

#[test]
fn a_reloaded_loop_continues_the_kept_conversation_in_order() {
    let mut k = FakeKernel::default();
    for i in 0..12 {
        k.responses.push_back(answer(&format!("answer {i}")));
    }
    let mut a = agent(k, "{}");
    for i in 0..6 {
        turn(&mut a, &format!("question {i}"));
    }
    let before = a.conversation("s1").expect("held");
    assert_eq!(before.len(), 12);
    // A reload: a new loop over the same kernel-held state.
    let mut kernel = std::mem::take(a.doors_mut());
    kernel.responses.push_back(answer("after reload"));
    let mut b = agent(kernel, "{}");
    assert_eq!(b.conversation("s1"), Ok(before.clone()));
    turn(&mut b, "again");
    let sent = &b.doors_mut().requests.last().expect("a request").messages;
    assert_eq!(&sent[..12], before.as_slice());
}

#[test]
fn a_resumed_session_is_seeded_and_kept() {
    let mut a = agent(FakeKernel::default(), "{}");
    let n = a.load(LoadRequest {
        session: String::from("old"),
        messages: vec![Message::user_text("earlier")],
        context_window: None,
    });
    assert_eq!(n, 1);
    assert_eq!(a.conversation("old").expect("held").len(), 1);
    assert!(a.doors_mut().state.contains_key("m/old/00000000"));
}

#[test]
fn fragments_follow_the_system_prompt_and_a_verdict_is_appended() {
    let mut k = FakeKernel::default();
    k.services.insert(
        (services::PROMPT.into(), "fragments".into()),
        Ok(r#"[{"plugin":"p","id":"a","text":"fragment one\n"}]"#.into()),
    );
    k.services.insert(
        (services::VERIFIER.into(), "verify".into()),
        Ok(r#"{"status":"verified-pass","dimension":"tests","claim":"tests pass"}"#.into()),
    );
    k.responses.push_back(answer("tests pass"));
    let mut a = agent(k, r#"{"system":"base"}"#);
    turn(&mut a, "go");
    let last = a
        .conversation("s1")
        .expect("held")
        .last()
        .expect("a notice")
        .clone();
    let k = a.doors_mut();
    assert_eq!(k.requests[0].system, "base\n\nfragment one");
    assert!(
        k.events
            .iter()
            .any(|e| matches!(e, SessionEvent::Verdict { .. }))
    );
    assert_eq!(last.role, Role::User);
    assert!(k.warnings.is_empty(), "{:?}", k.warnings);
}

#[test]
fn a_cut_short_answer_ends_the_turn_interrupted_and_says_so_in_one_readable_line() {
    let mut k = FakeKernel::default();
    let mut cut = answer("partial").expect("a response");
    cut.stop_reason = StopReason::Interrupted;
    cut.stop_reason_raw = String::from("interrupted: connection reset");
    k.responses.push_back(Ok(cut));
    let mut a = agent(k, "{}");
    let r = turn(&mut a, "go");
    assert_eq!(r.end, TurnEnd::Interrupted);
    assert_eq!(r.text, "partial", "what arrived is kept");
    assert!(r.detail.contains("connection reset"), "{}", r.detail);
    assert!(!r.detail.contains("  "), "stray spaces in {:?}", r.detail);
}

/// The fake kernel with a `compaction` provider answering `summary`.
fn with_compaction(summary: &str) -> FakeKernel {
    let mut kernel = FakeKernel::default();
    kernel.services.insert(
        ("keel.caller".into(), "provider".into()),
        Ok("compaction".into()),
    );
    kernel.services.insert(
        (services::COMPACTION.into(), "summarize".into()),
        Ok(serde_json::to_string(summary).expect("encodable")),
    );
    kernel.tools = vec![tool("read", false)];
    kernel.result_pad = 4000;
    kernel
}

/// Every tool result answers a call made before it, and every call is answered right after.
fn paired(messages: &[Message]) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        if m.role == Role::Assistant && !open.is_empty() {
            return Err(format!("calls left unanswered: {open:?}"));
        }
        for b in &m.content {
            match b {
                Block::ToolCall { id, .. } => open.push(id.clone()),
                Block::ToolResult { call_id, .. } => {
                    let Some(at) = open.iter().position(|c| c == call_id) else {
                        return Err(format!("a result without its call: {call_id}"));
                    };
                    open.remove(at);
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The conversation the session log's rebuild would give from these events.
fn replayed(events: &[SessionEvent]) -> Vec<Message> {
    let mut messages = Vec::new();
    for e in events {
        match e {
            SessionEvent::Message { message, .. } => messages.push(message.clone()),
            SessionEvent::Compacted {
                replaced, summary, ..
            } => messages = crate::compaction::apply(&messages, *replaced, summary),
            _ => {}
        }
    }
    messages
}

#[test]
fn a_provider_overflow_mid_turn_compacts_the_turn_for_good_and_asks_once_more() -> Result<(), String>
{
    let mut kernel = with_compaction("the task: read five files; three read so far");
    kernel.responses = VecDeque::from([
        calls(&[("c1", "read", r#"{"n":1}"#)]),
        calls(&[("c2", "read", r#"{"n":2}"#)]),
        calls(&[("c3", "read", r#"{"n":3}"#)]),
        Err(DoorError {
            kind: "failed",
            message: format!(
                "{} (the provider said, HTTP 400: This model's maximum context length is \
                 128000 tokens.)",
                keel_protocol::CONTEXT_OVERFLOW
            ),
        }),
        calls(&[("c4", "read", r#"{"n":4}"#)]),
        calls(&[("c5", "read", r#"{"n":5}"#)]),
        answer("all read"),
    ]);
    // No window configured: only the provider's refusal says how big is too big.
    let mut agent = agent(kernel, r#"{"max-steps": 20}"#);
    let report = turn(&mut agent, "read the five files");
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    assert_eq!(report.tool_calls, 5);
    let k = agent.doors_mut();
    assert!(
        k.requests
            .iter()
            .all(|r| r.compacts_on_overflow || r == &k.requests[4]),
        "every request asks to hear of an overflow but the one sent again after it"
    );
    let refused = &k.requests[3];
    let after = &k.requests[4];
    assert!(!after.compacts_on_overflow);
    // The request sent again is the compacted conversation: the person's request verbatim,
    // then the summary, then the latest steps as they were.
    assert!(after.messages.len() < refused.messages.len(), "{after:?}");
    let first = &after.messages[0];
    assert_eq!(first.role, Role::User);
    assert_eq!(first.text().lines().next(), Some("read the five files"));
    assert!(first.text().contains("three read so far"), "{first:?}");
    assert!(
        first.text().contains(crate::compaction::SUMMARY_HEADER),
        "{first:?}"
    );
    assert_eq!(after.messages[1].role, Role::Assistant);
    for r in &k.requests {
        paired(&r.messages)?;
    }
    // Kept: the next step starts from the compacted conversation, which only grew since, and
    // was never refused again.
    let next = &k.requests[5];
    assert!(next.compacts_on_overflow);
    assert_eq!(&next.messages[..after.messages.len()], &after.messages[..]);
    let compacted: Vec<&SessionEvent> = k
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::Compacted { reason, .. } if reason == "overflow"))
        .collect();
    assert_eq!(compacted.len(), 1, "{:?}", k.events);
    // The compaction records the window the refusal showed, for a resume to hold to.
    let learned = match compacted[0] {
        SessionEvent::Compacted { context_window, .. } => *context_window,
        _ => None,
    };
    let refused_tokens =
        crate::compaction::estimate_tokens(&refused.system, &refused.messages, &refused.tools);
    assert_eq!(learned, Some(refused_tokens));
    assert!(k.statuses_shown.iter().any(|s| s.contains("\"overflow\"")));
    // The log's rebuild (what `keel resume` continues from) is the loop's conversation.
    let events = k.events.clone();
    assert_eq!(Ok(replayed(&events)), agent.conversation("s1"));
    Ok(())
}

/// A resumed session holds its requests to the window an earlier refusal showed: the loaded
/// conversation, already past it, is compacted before the first request, which is never
/// refused; a reloaded loop keeps the window too.
#[test]
fn a_resumed_session_holds_to_the_window_a_refusal_showed() {
    let mut kernel = with_compaction("the task so far");
    kernel.responses = VecDeque::from([answer("done")]);
    let mut agent = agent(kernel, r#"{"max-steps": 5, "keep-turns": 1}"#);
    let big = "x".repeat(8_000);
    let mut messages = Vec::new();
    for i in 0..6 {
        messages.push(Message::user_text(format!("request {i}: {big}")));
        messages.push(Message {
            role: Role::Assistant,
            content: vec![Block::Text {
                text: format!("answer {i}"),
            }],
        });
    }
    let load = |window: Option<u64>| LoadRequest {
        session: "s1".into(),
        messages: messages.clone(),
        context_window: window,
    };
    agent.load(load(Some(5_000)));
    let report = turn(&mut agent, "go on");
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    let k = agent.doors_mut();
    let sent = k.requests.last().expect("a request");
    let tokens = crate::compaction::estimate_tokens(&sent.system, &sent.messages, &sent.tools);
    assert!(
        tokens <= 5_000,
        "the request was held to the window: {tokens} tokens"
    );
    assert!(
        k.events.iter().any(|e| matches!(
            e,
            SessionEvent::Compacted {
                context_window: Some(5_000),
                ..
            }
        )),
        "{:?}",
        k.events
    );
    // A reload (a new loop over the same kernel-held state) keeps the window.
    let kept = k.state.clone();
    assert!(kept.contains_key("window/s1"), "{:?}", kept.keys());
}

#[test]
fn a_turn_that_outgrows_the_window_is_compacted_between_its_steps() {
    let mut kernel = with_compaction("the task: read files; read some so far");
    let mut script: VecDeque<_> = (0..12)
        .map(|i| calls(&[(&*format!("c{i}"), "read", &*format!(r#"{{"n":{i}}}"#))]))
        .collect();
    script.push_back(answer("finished"));
    kernel.responses = script;
    // About 1,000 tokens a step against a 6,000-token window: compacted inside the turn, never
    // refused (the fake provider has no limit, the loop keeps under its own).
    let mut agent = agent(
        kernel,
        r#"{"max-steps": 40, "context-window": 6000, "keep-turns": 2}"#,
    );
    let report = turn(&mut agent, "read them all");
    assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
    let k = agent.doors_mut();
    let compactions = k
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::Compacted { reason, .. } if reason == "threshold"))
        .count();
    assert!(compactions >= 1, "{:?}", k.statuses_shown);
    for r in &k.requests {
        paired(&r.messages).expect("well-formed");
        let tokens = crate::compaction::estimate_tokens(&r.system, &r.messages, &r.tools);
        assert!(tokens <= 6000, "a request of {tokens} tokens");
        assert_eq!(
            r.messages[0].text().lines().next(),
            Some("read them all"),
            "the person's request leads every request"
        );
    }
    let events = k.events.clone();
    assert_eq!(Ok(replayed(&events)), agent.conversation("s1"));
}

#[test]
fn the_tools_and_prompt_are_fetched_again_only_when_the_environment_changes() {
    let mut kernel = FakeKernel {
        tools: vec![tool("read", false)],
        ..FakeKernel::default()
    };
    kernel.services.insert(
        (services::PROMPT.into(), "generation".into()),
        Ok("7".into()),
    );
    kernel.services.insert(
        (services::PROMPT.into(), "fragments".into()),
        Ok(r#"[{"plugin":"p","id":"f","text":"FRAGMENT"}]"#.into()),
    );
    kernel.responses = VecDeque::from([
        calls(&[("c1", "read", r#"{"n":1}"#)]),
        calls(&[("c2", "read", r#"{"n":2}"#)]),
        answer("done"),
    ]);
    let mut agent = agent(kernel, "{}");
    turn(&mut agent, "go");
    let fetched = |k: &FakeKernel, method: &str| {
        k.service_calls
            .iter()
            .filter(|(s, m)| s == services::PROMPT && m == method)
            .count()
    };
    let k = agent.doors_mut();
    assert_eq!(k.requests.len(), 3);
    assert_eq!(fetched(k, "generation"), 3, "asked every step");
    assert_eq!(fetched(k, "fragments"), 1, "fetched once");
    assert!(k.requests.iter().all(|r| r.system.contains("FRAGMENT")));
    assert!(k.requests.iter().all(|r| r.tools.len() == 1));
    // A plugin loaded: the generation moves, and the next step fetches again.
    k.services.insert(
        (services::PROMPT.into(), "generation".into()),
        Ok("8".into()),
    );
    k.services.insert(
        (services::PROMPT.into(), "fragments".into()),
        Ok(r#"[{"plugin":"p","id":"f","text":"CHANGED"}]"#.into()),
    );
    k.responses.push_back(answer("again"));
    turn(&mut agent, "more");
    let k = agent.doors_mut();
    assert_eq!(fetched(k, "fragments"), 2);
    assert!(
        k.requests
            .last()
            .is_some_and(|r| r.system.contains("CHANGED"))
    );
}

/// Every request names its conversation (the history does not cross the agent's door) while
/// the kernel holds it all; the model still sees the whole conversation. A kernel that keeps
/// nothing, or a message it could not keep, and the requests carry their messages again.
#[test]
fn requests_name_the_kept_conversation_and_carry_it_only_when_it_is_not_kept() {
    let script = |kernel: &mut FakeKernel| {
        kernel.tools = vec![tool("read", false)];
        kernel.responses.extend([
            calls(&[("c1", "read", "{}")]),
            calls(&[("c2", "read", r#"{"p":1}"#)]),
            answer("done"),
        ]);
    };
    for (keeps_nothing, full_from, named) in
        [(false, None, 3), (true, None, 0), (false, Some(2), 1)]
    {
        let mut kernel = FakeKernel {
            keeps_nothing,
            state_full_from: full_from,
            ..FakeKernel::default()
        };
        script(&mut kernel);
        let mut a = agent(kernel, "{}");
        let report = turn(&mut a, "read two files");
        assert_eq!(report.end, TurnEnd::Completed, "{report:?}");
        let kernel = a.doors_mut();
        assert_eq!(
            kernel.by_reference, named,
            "keeps_nothing={keeps_nothing} full={full_from:?}"
        );
        // What the model saw grows by call and result each step, whichever way it came.
        let seen: Vec<usize> = kernel.requests.iter().map(|r| r.messages.len()).collect();
        assert_eq!(seen, [1, 3, 5]);
        assert!(kernel.requests.iter().all(|r| r.conversation.is_none()));
    }
}

/// The kernel holds the conversation, and the loop reads it there: it keeps no copy of its
/// own (a message changed in kernel-held state is what the loop reads back).
#[test]
fn the_loop_reads_its_conversation_from_the_kernel() {
    let mut k = FakeKernel::default();
    k.responses.push_back(answer("first"));
    let mut a = agent(k, "{}");
    turn(&mut a, "hello");
    let key = keel_protocol::conversation_key("s1", 0);
    let changed = serde_json::to_vec(&Message::user_text("changed in the kernel")).expect("json");
    a.doors_mut().state.insert(key.clone(), changed);
    let held = a.conversation("s1").expect("held");
    assert_eq!(held.len(), 2);
    assert_eq!(held[0], Message::user_text("changed in the kernel"));
    // A message the kernel lost is an error, not a conversation with a gap.
    a.doors_mut().state.remove(&key);
    let lost = a.conversation("s1").expect_err("message 0 is gone");
    assert!(lost.contains("message 0"), "{lost}");
}

/// After a reload the loop goes on from the messages the kernel kept from the first, up to
/// the first missing one: never from a conversation with a gap (which no provider accepts),
/// and a session whose state filled up keeps nothing after the first message it could not
/// keep, so its kept part stays a prefix.
#[test]
fn a_reload_goes_on_from_the_kept_prefix() {
    let mut k = FakeKernel {
        state_full_from: Some(3),
        ..FakeKernel::default()
    };
    for i in 0..3 {
        k.responses.push_back(answer(&format!("answer {i}")));
    }
    let mut a = agent(k, "{}");
    for i in 0..3 {
        turn(&mut a, &format!("question {i}"));
    }
    // Six messages, the last three carried by the requests.
    assert_eq!(a.conversation("s1").expect("carried").len(), 6);
    let mut kernel = std::mem::take(a.doors_mut());
    let kept: Vec<&String> = kernel
        .state
        .keys()
        .filter(|k| k.starts_with("m/"))
        .collect();
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(
        kernel
            .warnings
            .iter()
            .any(|w| w.contains("not kept in the kernel from message 3")),
        "{:?}",
        kernel.warnings
    );
    kernel.state_full_from = None;
    let mut b = agent(kernel, "{}");
    assert_eq!(b.conversation("s1").expect("held").len(), 3);
    // A gap: message 1 gone, so only message 0 is the kernel's conversation.
    let mut kernel = std::mem::take(b.doors_mut());
    kernel
        .state
        .remove(&keel_protocol::conversation_key("s1", 1));
    let mut c = agent(kernel, "{}");
    assert_eq!(c.conversation("s1").expect("held").len(), 1);
}
