//! The driver against a fake transport: retries, watchdog, interruptions, errors, recovery.

use std::collections::VecDeque;

use keel_model_wire::driver::{
    AdapterConfig, HttpHead, HttpRequest, ModelError, Transport, TransportError, complete,
};
use keel_model_wire::fragments::ConversationCache;
use keel_model_wire::recovery::DROPPED_RESULT;
use keel_protocol::{Block, Message, ModelRequest, ModelResponse, Role, StopReason, StreamDelta};

/// What the fake server does for one request.
enum Reply {
    /// `send` fails.
    SendFails(TransportError),
    /// A response: status, headers, then each body read in turn (the reads past the list
    /// return end of body).
    Response {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<Result<Vec<u8>, TransportError>>,
    },
}

fn ok_stream(body: &[u8], chunk: usize) -> Reply {
    Reply::Response {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: body.chunks(chunk).map(|c| Ok(c.to_vec())).collect(),
    }
}

fn status(code: u16, headers: &[(&str, &str)], body: &str) -> Reply {
    Reply::Response {
        status: code,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: vec![Ok(body.as_bytes().to_vec())],
    }
}

#[derive(Default)]
struct Fake {
    replies: VecDeque<Reply>,
    body: VecDeque<Result<Vec<u8>, TransportError>>,
    sent: Vec<HttpRequest>,
    sleeps: Vec<u64>,
    idle_timeouts: Vec<u64>,
}

impl Fake {
    fn new(replies: Vec<Reply>) -> Fake {
        Fake {
            replies: replies.into(),
            ..Fake::default()
        }
    }

    fn sent_bodies(&self) -> Vec<serde_json::Value> {
        self.sent
            .iter()
            .map(|r| serde_json::from_slice(&r.body).expect("json body"))
            .collect()
    }
}

impl Transport for Fake {
    fn send(&mut self, req: &mut HttpRequest) -> Result<HttpHead, TransportError> {
        self.sent.push(req.clone());
        match self
            .replies
            .pop_front()
            .expect("the test scripted enough replies")
        {
            Reply::SendFails(e) => Err(e),
            Reply::Response {
                status,
                headers,
                body,
            } => {
                self.body = body.into();
                Ok(HttpHead { status, headers })
            }
        }
    }

    fn next_chunk(&mut self, idle_timeout_ms: u64) -> Result<Option<Vec<u8>>, TransportError> {
        self.idle_timeouts.push(idle_timeout_ms);
        match self.body.pop_front() {
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    fn sleep_ms(&mut self, ms: u64) {
        self.sleeps.push(ms);
    }

    fn random_unit(&mut self) -> f64 {
        0.5
    }
}

const OPENAI_TEXT: &[u8] = include_bytes!("fixtures/openai_text.sse");
const ANTHROPIC_TOOL: &[u8] = include_bytes!("fixtures/anthropic_tool_use.sse");

/// A request as the `model` service receives it.
fn json(req: &ModelRequest) -> String {
    serde_json::to_string(req).expect("a request encodes")
}

fn request() -> ModelRequest {
    ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system: "sys".into(),
        messages: vec![Message::user_text("hi")],
        tools: vec![],
        max_tokens: 1000,
    }
}

fn run(
    fake: &mut Fake,
    config: &AdapterConfig,
) -> (Result<ModelResponse, ModelError>, Vec<StreamDelta>) {
    let mut deltas = Vec::new();
    let result = complete(
        fake,
        config,
        &mut ConversationCache::default(),
        &json(&request()),
        &mut |d| deltas.push(d),
    );
    (result, deltas)
}

fn retries(deltas: &[StreamDelta]) -> Vec<(u32, String)> {
    deltas
        .iter()
        .filter_map(|d| match d {
            StreamDelta::Retry { attempt, reason } => Some((*attempt, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The part of a stream before the first occurrence of `marker`.
fn cut_before<'a>(body: &'a [u8], marker: &str) -> &'a [u8] {
    let at = String::from_utf8_lossy(body)
        .find(marker)
        .expect("marker present");
    &body[..at]
}

#[test]
fn a_clean_stream_and_the_request_it_sent() {
    let mut fake = Fake::new(vec![ok_stream(OPENAI_TEXT, 17)]);
    let config = AdapterConfig::openai("gpt-4o");
    let (result, deltas) = run(&mut fake, &config);
    let response = result.expect("answers");
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.retries, 0);
    assert!(!deltas.is_empty());
    let sent = &fake.sent[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.url, "https://api.openai.com/v1/chat/completions");
    let secret = sent.secret.as_ref().expect("a secret reference");
    assert_eq!(
        (
            secret.name.as_str(),
            secret.header.as_str(),
            secret.prefix.as_str()
        ),
        ("OPENAI_API_KEY", "authorization", "Bearer ")
    );
    assert!(
        !sent
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("authorization")),
        "the driver never sets the key header itself"
    );
    assert_eq!(sent.timeout_ms, 120_000);
    assert_eq!(fake.sent_bodies()[0]["stream"], true);
}

#[test]
fn anthropic_endpoint_headers() {
    let mut fake = Fake::new(vec![ok_stream(ANTHROPIC_TOOL, 100)]);
    let config = AdapterConfig::anthropic("claude-sonnet-4-5");
    let (result, _) = run(&mut fake, &config);
    assert_eq!(result.expect("answers").stop_reason, StopReason::ToolUse);
    let sent = &fake.sent[0];
    assert!(
        sent.headers
            .contains(&("anthropic-version".into(), "2023-06-01".into()))
    );
    let secret = sent.secret.as_ref().expect("secret");
    assert_eq!(
        (secret.header.as_str(), secret.prefix.as_str()),
        ("x-api-key", "")
    );
}

#[test]
fn a_stall_with_nothing_received_is_retried_with_a_wider_watchdog() {
    let mut fake = Fake::new(vec![
        Reply::Response {
            status: 200,
            headers: vec![],
            body: vec![
                Ok(b": keep-alive\n\n".to_vec()),
                Err(TransportError::TimedOut),
            ],
        },
        ok_stream(OPENAI_TEXT, 50),
    ]);
    let config = AdapterConfig::openai("gpt-4o");
    let (result, deltas) = run(&mut fake, &config);
    let response = result.expect("answers after one retry");
    assert_eq!(response.retries, 1);
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(fake.sent.len(), 2);
    assert_eq!(fake.sent[0].timeout_ms, 120_000);
    assert_eq!(fake.sent[1].timeout_ms, 150_000);
    assert_eq!(fake.idle_timeouts[0], 120_000);
    assert_eq!(*fake.idle_timeouts.last().expect("reads"), 150_000);
    assert!(
        fake.sleeps.is_empty(),
        "a stall already waited: {:?}",
        fake.sleeps
    );
    let r = retries(&deltas);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 2);
    assert!(r[0].1.contains("stalled"), "{}", r[0].1);
}

#[test]
fn a_stall_after_partial_content_is_interrupted_not_retried() {
    let partial = cut_before(OPENAI_TEXT, "help you");
    let mut fake = Fake::new(vec![Reply::Response {
        status: 200,
        headers: vec![],
        body: vec![Ok(partial.to_vec()), Err(TransportError::TimedOut)],
    }]);
    let (result, deltas) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    let response = result.expect("partial content is an answer");
    assert_eq!(response.stop_reason, StopReason::Interrupted);
    assert!(
        response
            .stop_reason_raw
            .starts_with("interrupted: no data for 120 s"),
        "{}",
        response.stop_reason_raw
    );
    assert_eq!(response.message.text(), "Hello! How can I");
    assert_eq!(response.retries, 0);
    assert_eq!(fake.sent.len(), 1);
    assert!(retries(&deltas).is_empty());
}

#[test]
fn a_connection_dropped_before_the_terminal_event() {
    // Nothing received yet: transparent resend after the backoff.
    let first_event = cut_before(ANTHROPIC_TOOL, "event: content_block_start");
    let mut fake = Fake::new(vec![
        Reply::Response {
            status: 200,
            headers: vec![],
            body: vec![
                Ok(first_event.to_vec()),
                Err(TransportError::Dropped("connection reset".into())),
            ],
        },
        ok_stream(ANTHROPIC_TOOL, 9),
    ]);
    let (result, _) = run(&mut fake, &AdapterConfig::anthropic("claude"));
    let response = result.expect("answers");
    assert_eq!(response.retries, 1);
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(fake.sleeps, vec![1_000]);

    // Clean end of body without message_stop, after a tool call began: interrupted.
    let partial = cut_before(ANTHROPIC_TOOL, "event: message_delta");
    let mut fake = Fake::new(vec![ok_stream(partial, 64)]);
    let (result, _) = run(&mut fake, &AdapterConfig::anthropic("claude"));
    let response = result.expect("partial answer");
    assert_eq!(response.stop_reason, StopReason::Interrupted);
    assert_eq!(
        response.stop_reason_raw,
        "interrupted: the stream ended before its terminal event"
    );
    assert_eq!(response.message.tool_calls().count(), 1);
    assert_eq!(fake.sent.len(), 1);
}

#[test]
fn rate_limited_with_retry_after() {
    let mut fake = Fake::new(vec![
        status(
            429,
            &[("retry-after", "7"), ("content-type", "application/json")],
            r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        ok_stream(OPENAI_TEXT, 1000),
    ]);
    let (result, deltas) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    assert_eq!(result.expect("answers").retries, 1);
    assert_eq!(fake.sleeps, vec![7_000]);
    let r = retries(&deltas);
    assert!(
        r[0].1.contains("rate limited (HTTP 429)") && r[0].1.contains("7.0 s"),
        "{r:?}"
    );
}

#[test]
fn server_errors_back_off_until_the_budget_runs_out() {
    let mut fake = Fake::new(vec![
        status(
            529,
            &[],
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        status(503, &[], "upstream unavailable"),
        status(500, &[], "{}"),
        status(502, &[], "bad gateway"),
    ]);
    let (result, deltas) = run(&mut fake, &AdapterConfig::anthropic("claude"));
    let err = result.expect_err("gives up");
    assert!(
        matches!(err, ModelError::RetriesExhausted { attempts: 4, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("HTTP 502"), "{err}");
    assert_eq!(fake.sent.len(), 4);
    assert_eq!(fake.sleeps, vec![1_000, 2_000, 4_000]);
    assert_eq!(retries(&deltas).len(), 3);
}

#[test]
fn unauthorized_is_not_retried_and_names_the_key_source_without_the_key() {
    let mut fake = Fake::new(vec![status(
        401,
        &[("www-authenticate", "Bearer realm=\"OpenAI\"")],
        r#"{"error":{"message":"Incorrect API key provided: sk-proj-abc123***************************xyz9. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    )]);
    let (result, deltas) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    let err = result.expect_err("fails");
    let text = err.to_string();
    assert!(matches!(
        err,
        ModelError::Authentication { status: 401, .. }
    ));
    assert!(text.contains("OPENAI_API_KEY"), "{text}");
    assert!(!text.contains("sk-"), "{text}");
    assert!(!text.contains("Bearer"), "{text}");
    assert_eq!(fake.sent.len(), 1);
    assert!(fake.sleeps.is_empty());
    assert!(retries(&deltas).is_empty());
}

#[test]
fn other_client_errors_carry_the_api_message() {
    let mut fake = Fake::new(vec![status(
        404,
        &[],
        r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","code":"model_not_found"}}"#,
    )]);
    let (result, _) = run(&mut fake, &AdapterConfig::openai("gpt-9"));
    let err = result.expect_err("fails");
    assert_eq!(
        err.to_string(),
        "the model provider rejected the request (HTTP 404): The model `gpt-9` does not exist or you do not have access to it."
    );
    assert_eq!(fake.sent.len(), 1);
}

#[test]
fn policy_refusal_is_never_retried() {
    let mut fake = Fake::new(vec![Reply::SendFails(TransportError::Refused(
        "host api.openai.com is not allowed by the policy".into(),
    ))]);
    let (result, _) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    assert!(matches!(
        result,
        Err(ModelError::Transport(TransportError::Refused(_)))
    ));
    assert_eq!(fake.sent.len(), 1);
}

#[test]
fn context_length_error_applies_recovery_then_succeeds() {
    let mut req = request();
    for i in 0..6 {
        req.messages.push(Message {
            role: Role::Assistant,
            content: vec![Block::ToolCall {
                id: format!("c{i}"),
                name: "read_file".into(),
                arguments: "{}".into(),
            }],
        });
        req.messages.push(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                call_id: format!("c{i}"),
                content: "x".repeat(1000),
                is_error: false,
            }],
        });
    }
    let mut fake = Fake::new(vec![
        status(
            400,
            &[],
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#,
        ),
        ok_stream(ANTHROPIC_TOOL, 1000),
    ]);
    let mut deltas = Vec::new();
    let config = AdapterConfig::anthropic("claude");
    let response = complete(
        &mut fake,
        &config,
        &mut ConversationCache::default(),
        &json(&req),
        &mut |d| deltas.push(d),
    )
    .expect("recovers");
    assert_eq!(response.retries, 1);
    assert!(fake.sleeps.is_empty());
    let bodies = fake.sent_bodies();
    assert!(!bodies[0].to_string().contains(DROPPED_RESULT));
    let second = bodies[1].to_string();
    assert_eq!(
        second.matches(DROPPED_RESULT).count(),
        3,
        "all but the 3 most recent"
    );
    let r = retries(&deltas);
    assert!(r[0].1.contains("prompt was too long"), "{r:?}");
}

#[test]
fn context_length_recovery_is_bounded() {
    let too_long = || {
        status(
            400,
            &[],
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","code":"context_length_exceeded"}}"#,
        )
    };
    let mut fake = Fake::new(vec![too_long(), too_long()]);
    let (result, _) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    // One user message: nothing to elide or drop.
    let err = result.expect_err("gives up");
    assert!(matches!(err, ModelError::ContextLength(_)), "{err:?}");
    assert!(err.to_string().contains("context window"), "{err}");
    assert_eq!(fake.sent.len(), 1);
}

#[test]
fn an_overloaded_error_inside_the_stream_is_retried_when_nothing_arrived() {
    let overloaded = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let mut fake = Fake::new(vec![
        ok_stream(overloaded, 1000),
        ok_stream(ANTHROPIC_TOOL, 1000),
    ]);
    let (result, deltas) = run(&mut fake, &AdapterConfig::anthropic("claude"));
    assert_eq!(result.expect("answers").retries, 1);
    assert_eq!(fake.sleeps, vec![1_000]);
    assert!(retries(&deltas)[0].1.contains("Overloaded"));
}

#[test]
fn transparent_retries_share_the_attempt_budget() {
    let stall = || Reply::Response {
        status: 200,
        headers: vec![],
        body: vec![Err(TransportError::TimedOut)],
    };
    let mut fake = Fake::new(vec![stall(), stall(), stall(), stall()]);
    let (result, _) = run(&mut fake, &AdapterConfig::openai("gpt-4o"));
    assert!(matches!(
        result,
        Err(ModelError::RetriesExhausted { attempts: 4, .. })
    ));
    let timeouts: Vec<u64> = fake.sent.iter().map(|r| r.timeout_ms).collect();
    assert_eq!(timeouts, vec![120_000, 150_000, 180_000, 210_000]);
}

#[test]
fn a_client_error_inside_the_stream_is_reported_not_retried() {
    let body = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools.0.name: String should match pattern\"}}\n\n";
    let mut fake = Fake::new(vec![ok_stream(body, 1000)]);
    let (result, _) = run(&mut fake, &AdapterConfig::anthropic("claude"));
    let err = result.expect_err("fails");
    assert_eq!(
        err.to_string(),
        "the model provider rejected the request (in the stream): tools.0.name: String should match pattern"
    );
    assert_eq!(fake.sent.len(), 1);
}

#[test]
fn a_caller_that_compacts_hears_of_an_overflow_at_once_in_both_wordings() {
    // OpenAI's `context_length_exceeded` and Anthropic's "prompt is too long": the request is
    // not shrunk and sent again here, the caller is told, in words it recognises.
    let refusals = [
        (
            AdapterConfig::openai("gpt-4o"),
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        (
            AdapterConfig::anthropic("claude"),
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#,
        ),
    ];
    for (config, body) in refusals {
        let mut fake = Fake::new(vec![status(400, &[], body), ok_stream(OPENAI_TEXT, 1000)]);
        let req = ModelRequest {
            compacts_on_overflow: true,
            conversation: None,
            ..request()
        };
        let err = complete(
            &mut fake,
            &config,
            &mut ConversationCache::default(),
            &json(&req),
            &mut |_| {},
        )
        .expect_err("told at once");
        assert!(
            matches!(err, ModelError::ContextOverflow { status: 400, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with(keel_protocol::CONTEXT_OVERFLOW),
            "{err}"
        );
        assert_eq!(fake.sent.len(), 1, "not sent again");
    }
}
