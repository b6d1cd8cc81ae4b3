//! The model adapter plugins end to end: a real kernel with its network gate, the real
//! `model-openai` / `model-anthropic` / `model-scripted` components, and a loopback server
//! streaming the OpenAI Chat Completions and Anthropic Messages SSE formats — truncations,
//! stalls, drops, rate limits and a rejected key included.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
use keel_kernel::{
    GateConfig, Kernel, KernelConfig, LoaderConfig, NetConfig, PluginLoader, PluginState, Secrets,
    WasmHost, WasmHostConfig,
};
use keel_protocol::{
    Block, Message, ModelRequest, ModelResponse, StopReason, StreamDelta, ToolDef, ToolOutcome,
};
use keel_tests::model_server::{ModelServer, Received, Step, json_response, sse_head};
use keel_tests::models;
use keel_tests::wire::*;
use serde_json::{Value, json};

type R = anyhow::Result<()>;

const OPENAI_KEY: &str = "sk-test-e2eOpenAiKey0123456789abcdef";
const ANTHROPIC_KEY: &str = "sk-ant-test-e2eAnthropicKey0123456789";

/// Compiled components are cached across the tests of this binary.
fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("cache dir"))
        .path()
        .to_owned()
}

/// The package of a model plugin. Compiles are serialized so that the tests running in
/// parallel compile each component once and then hit the shared cache instead of compiling
/// it a dozen times at once.
fn package(
    loader: &PluginLoader,
    plugin: &str,
    config: Value,
) -> anyhow::Result<keel_kernel::PluginPackage> {
    static COMPILING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = COMPILING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    models::package(loader, plugin, config)
}

/// A kernel whose network policy denies everything but the loopback server, with the model
/// plugin loaded.
struct Session {
    kernel: Kernel,
    audit: PathBuf,
    _loader: PluginLoader,
    _dir: tempfile::TempDir,
}

impl Session {
    async fn start(
        plugin: &str,
        server: &ModelServer,
        config: Value,
        secrets: &[(&str, &str)],
    ) -> anyhow::Result<Session> {
        let dir = tempfile::tempdir()?;
        let audit = dir.path().join("net-audit.jsonl");
        let policy = NetPolicy::new(NetDecision::Forbid)
            .with_rule("127.0.0.1", NetDecision::Allow)?
            .with_allow_private(&server.endpoint())?;
        let mut held = Secrets::new();
        for (name, value) in secrets {
            held.insert(name, value, &[server.endpoint()]);
        }
        let kernel = Kernel::with_gates(
            KernelConfig::default(),
            GateConfig {
                network: NetConfig {
                    policy,
                    secrets: held,
                    audit_log: Some(audit.clone()),
                },
                ..GateConfig::locked_down()
            },
        );
        let loader = PluginLoader::new(
            WasmHost::new(WasmHostConfig {
                cache_dir: Some(cache_dir()),
                ..WasmHostConfig::default()
            })?,
            LoaderConfig {
                workspace: dir.path().to_owned(),
                ..LoaderConfig::default()
            },
        );
        let status = kernel.load(package(&loader, plugin, config)?).await?;
        anyhow::ensure!(status.state == PluginState::Active, "{status:?}");
        Ok(Session {
            kernel,
            audit,
            _loader: loader,
            _dir: dir,
        })
    }

    async fn complete(&self, request: &ModelRequest) -> anyhow::Result<ModelResponse> {
        let answer = self
            .kernel
            .complete(&serde_json::to_string(request)?)
            .await?;
        Ok(serde_json::from_str(&answer)?)
    }

    fn audit_log(&self) -> String {
        std::fs::read_to_string(&self.audit).unwrap_or_default()
    }
}

fn openai_config(server: &ModelServer) -> Value {
    json!({ "base-url": server.url("/v1"), "model": "gpt-test" })
}

fn anthropic_config(server: &ModelServer) -> Value {
    json!({ "base-url": server.url("/v1"), "model": "claude-test" })
}

fn request(text: &str) -> ModelRequest {
    ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system: "Be brief.".into(),
        messages: vec![Message::user_text(text)],
        tools: vec![ToolDef {
            name: "read_file".into(),
            description: "Read a file.".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_tokens: 1024,
    }
}

/// The `model.delta` events received so far.
fn deltas(rx: &mut tokio::sync::broadcast::Receiver<keel_kernel::Event>) -> Vec<StreamDelta> {
    let mut out = Vec::new();
    while let Ok(event) = rx.try_recv() {
        if event.topic == "model.delta" {
            out.push(serde_json::from_str(&event.payload).expect("a StreamDelta"));
        }
    }
    out
}

fn tool_calls(response: &ModelResponse) -> Vec<(String, String, String)> {
    response
        .message
        .tool_calls()
        .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.to_owned()))
        .collect()
}

fn only_request(server: &ModelServer) -> Received {
    let received = server.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    received.into_iter().next().expect("one request")
}

// ---- OpenAI Chat Completions -------------------------------------------------------------

/// The adapter reads each answer through a body resource (ABI 0.7.0) and lets it drop: the
/// kernel releases the body then, so more requests than the 16 bodies a plugin may hold open
/// at once all go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_released_when_the_adapter_drops_them() -> R {
    let server = ModelServer::start(|_, _| {
        let mut steps = vec![sse_head(), oa(json!({"content": "ok"}), None)];
        steps.push(oa(json!({}), Some("stop")));
        steps.extend(oa_done());
        steps
    })
    .await?;
    let s = Session::start("model-openai", &server, openai_config(&server), &[]).await?;
    for n in 0..20 {
        let response = s
            .complete(&request("hi"))
            .await
            .map_err(|e| anyhow::anyhow!("request {n}: {e}"))?;
        assert_eq!(response.message.text(), "ok", "request {n}");
    }
    assert_eq!(server.received().len(), 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_text_usage_and_deltas_with_the_key_in_the_header() -> R {
    let server = ModelServer::start(|_, _| {
        let mut steps = vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": ""}), None),
        ];
        for w in ["Hello", ",", " world", "!"] {
            steps.push(oa(json!({"content": w}), None));
        }
        steps.push(oa(json!({}), Some("stop")));
        steps.push(oa_usage(42, 7, 30));
        steps.extend(oa_done());
        steps
    })
    .await?;
    let s = Session::start(
        "model-openai",
        &server,
        openai_config(&server),
        &[("OPENAI_API_KEY", OPENAI_KEY)],
    )
    .await?;
    let mut events = s.kernel.events();
    let response = s.complete(&request("Say hello")).await?;

    assert_eq!(response.message.text(), "Hello, world!");
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.stop_reason_raw, "stop");
    assert_eq!(response.model, "gpt-test-2025");
    assert_eq!(response.retries, 0);
    assert_eq!(
        (
            response.usage.input_tokens,
            response.usage.output_tokens,
            response.usage.cache_read_tokens
        ),
        (42, 7, 30)
    );
    assert!(!serde_json::to_string(&response)?.contains(OPENAI_KEY));

    // The request: the endpoint, the rendered body, and the kernel-held key as a bearer token.
    let sent = only_request(&server);
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    let body = sent.json();
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["stream"], true);
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["tools"][0]["function"]["name"], "read_file");

    // The fragments arrived live on `model.delta`.
    let texts: Vec<String> = deltas(&mut events)
        .into_iter()
        .filter_map(|d| match d {
            StreamDelta::Text { text } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(texts.concat(), "Hello, world!");
    assert!(texts.len() >= 2, "{texts:?}");

    // One audit line, allowed, without the key.
    let log = s.audit_log();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(
        log.contains("\"plugin\":\"model-openai\"") && log.contains("\"allow\""),
        "{log}"
    );
    assert!(!log.contains(OPENAI_KEY), "{log}");
    Ok(())
}

/// A request naming the agent's held conversation that did not come through the kernel's
/// agent door (here the host calling the model service itself, as a plugin that requires
/// `model` could): the adapter's reading is refused, so nothing of the conversation is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_conversation_named_by_someone_the_kernel_did_not_hand_it_to_is_not_read() -> R {
    let server = ModelServer::start(|_, _| oa_answer("never")).await?;
    for (plugin, config) in [
        ("model-openai", openai_config(&server)),
        ("model-anthropic", anthropic_config(&server)),
    ] {
        let s = Session::start(plugin, &server, config, &[]).await?;
        let mut forged = request("");
        forged.messages.clear();
        forged.conversation = Some(keel_protocol::ConversationRef {
            session: "victim".into(),
            messages: 1,
            held: Some(keel_protocol::HeldConversation {
                keeper: "agent-loop".into(),
                revision: 0,
            }),
        });
        let err = s
            .kernel
            .call_service("model", "complete", &serde_json::to_string(&forged)?)
            .await
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains("answers only the model adapter serving"),
            "{plugin}: {err}"
        );
    }
    assert!(server.received().is_empty(), "{:#?}", server.received());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_call_arguments_split_across_deltas_and_two_parallel_calls() -> R {
    let server = ModelServer::start(|_, _| {
        let mut steps = vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": null}), None),
            oa(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                        "function": {"name": "read_file", "arguments": ""}}]}),
                None,
            ),
        ];
        let first = r#"{"path": "src/main.rs"}"#;
        let second = r#"{"path": "Cargo.toml", "lines": [1, 20]}"#;
        // The first call's arguments in 3-byte pieces, then the second call's interleaved with
        // the first's tail.
        let pieces = |s: &'static str| -> Vec<&'static str> {
            s.as_bytes()
                .chunks(3)
                .map(|c| std::str::from_utf8(c).expect("ASCII"))
                .collect()
        };
        let (a, b) = (pieces(first), pieces(second));
        let half = a.len() / 2;
        for p in &a[..half] {
            steps.push(oa(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}),
                None,
            ));
        }
        steps.push(oa(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                    "function": {"name": "read_file", "arguments": ""}}]}),
            None,
        ));
        for i in 0..a.len().max(b.len()) {
            if let Some(p) = a.get(half + i) {
                steps.push(oa(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}),
                    None,
                ));
            }
            if let Some(p) = b.get(i) {
                steps.push(oa(
                    json!({"tool_calls": [{"index": 1, "function": {"arguments": p}}]}),
                    None,
                ));
            }
        }
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await?;
    let s = Session::start(
        "model-openai",
        &server,
        openai_config(&server),
        &[("OPENAI_API_KEY", OPENAI_KEY)],
    )
    .await?;
    let mut events = s.kernel.events();
    let response = s.complete(&request("Read two files")).await?;
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.stop_reason_raw, "tool_calls");
    assert_eq!(
        tool_calls(&response),
        [
            (
                "call_a".into(),
                "read_file".into(),
                r#"{"path": "src/main.rs"}"#.into()
            ),
            (
                "call_b".into(),
                "read_file".into(),
                r#"{"path": "Cargo.toml", "lines": [1, 20]}"#.into()
            ),
        ]
    );
    let starts: Vec<String> = deltas(&mut events)
        .into_iter()
        .filter_map(|d| match d {
            StreamDelta::ToolCallStart { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(starts, ["call_a", "call_b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_stop_reasons_map_and_keep_the_wire_spelling() -> R {
    let cases = [
        ("stop", StopReason::EndTurn),
        ("length", StopReason::MaxTokens),
        ("content_filter", StopReason::Refusal),
    ];
    let server = ModelServer::start(move |n, _| match cases.get(n) {
        Some((finish, _)) => oa_text(&["Some", " text"], finish),
        None => {
            let mut steps = vec![
                sse_head(),
                oa(
                    json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                            "function": {"name": "read_file", "arguments": "{}"}}]}),
                    None,
                ),
                oa(json!({}), Some("tool_calls")),
            ];
            steps.extend(oa_done());
            steps
        }
    })
    .await?;
    let s = Session::start("model-openai", &server, openai_config(&server), &[]).await?;
    for (finish, expected) in cases {
        let response = s.complete(&request("go")).await?;
        assert_eq!(response.stop_reason, expected, "{finish}");
        assert_eq!(response.stop_reason_raw, finish);
        assert_eq!(response.message.text(), "Some text");
    }
    let response = s.complete(&request("go")).await?;
    assert_eq!(
        (response.stop_reason, response.stop_reason_raw.as_str()),
        (StopReason::ToolUse, "tool_calls")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cut_at_max_tokens_mid_arguments_keeps_them_raw_and_is_not_dispatched() -> R {
    let raw = r#"{"path": "notes.md", "content": "unfini"#;
    let server = ModelServer::start(move |_, _| {
        let mut steps = vec![
            sse_head(),
            oa(json!({"content": "Writing the notes."}), None),
            oa(
                json!({"tool_calls": [{"index": 0, "id": "call_w", "type": "function",
                        "function": {"name": "write_file", "arguments": ""}}]}),
                None,
            ),
        ];
        for piece in [&raw[..12], &raw[12..25], &raw[25..]] {
            steps.push(oa(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                None,
            ));
        }
        steps.push(oa(json!({}), Some("length")));
        steps.push(oa_usage(100, 1024, 0));
        steps.extend(oa_done());
        steps
    })
    .await?;
    let s = Session::start("model-openai", &server, openai_config(&server), &[]).await?;
    let response = s.complete(&request("Write notes")).await?;
    assert_eq!(response.stop_reason, StopReason::MaxTokens);
    assert_eq!(response.stop_reason_raw, "length");
    assert_eq!(
        tool_calls(&response),
        [("call_w".into(), "write_file".into(), raw.to_owned())]
    );
    // The kernel recorded the cut call and refuses to run it.
    let outcomes = s.kernel.dispatch(&["call_w".to_owned()]).await;
    let outcome: ToolOutcome = serde_json::from_str(&outcomes[0])?;
    assert_eq!(serde_json::to_value(outcome.status)?, "not_executed");
    assert!(
        outcome.content.contains("NOT executed"),
        "{}",
        outcome.content
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_stall_with_nothing_received_is_retried_transparently() -> R {
    let server = ModelServer::start(|n, _| {
        if n == 0 {
            // Headers, then silence: the watchdog must fire.
            vec![sse_head(), Step::Sleep(5_000)]
        } else {
            oa_text(&["Recovered"], "stop")
        }
    })
    .await?;
    let mut config = openai_config(&server);
    config["idle-timeout-ms"] = json!(300);
    let s = Session::start("model-openai", &server, config, &[]).await?;
    let mut events = s.kernel.events();
    let response = s.complete(&request("hi")).await?;
    assert_eq!(response.message.text(), "Recovered");
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.retries, 1);
    assert_eq!(server.received().len(), 2);
    assert!(
        deltas(&mut events).iter().any(
            |d| matches!(d, StreamDelta::Retry { attempt: 2, reason } if reason.contains("stalled"))
        ),
        "a retry notice is shown"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_drop_after_partial_content_is_interrupted_not_retried() -> R {
    let server = ModelServer::start(|_, _| {
        vec![
            sse_head(),
            oa(json!({"role": "assistant", "content": ""}), None),
            oa(json!({"content": "The answer"}), None),
            oa(json!({"content": " is"}), None),
            Step::Sleep(50),
            Step::Drop,
        ]
    })
    .await?;
    let s = Session::start("model-openai", &server, openai_config(&server), &[]).await?;
    let response = s.complete(&request("What is it?")).await?;
    assert_eq!(response.stop_reason, StopReason::Interrupted);
    assert!(
        response.stop_reason_raw.starts_with("interrupted"),
        "{}",
        response.stop_reason_raw
    );
    assert_eq!(response.message.text(), "The answer is");
    assert_eq!(response.retries, 0);
    assert_eq!(
        server.received().len(),
        1,
        "billed partial output is not resent"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_429_waits_for_retry_after_then_succeeds() -> R {
    let server = ModelServer::start(|n, _| {
        if n == 0 {
            vec![json_response(
                "429 Too Many Requests",
                &[("retry-after", "1")],
                r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#,
            )]
        } else {
            oa_text(&["Done"], "stop")
        }
    })
    .await?;
    let s = Session::start("model-openai", &server, openai_config(&server), &[]).await?;
    let response = s.complete(&request("hi")).await?;
    assert_eq!(response.message.text(), "Done");
    assert_eq!(response.retries, 1);
    let received = server.received();
    assert_eq!(received.len(), 2);
    let waited = received[1].at.duration_since(received[0].at);
    assert!(waited >= Duration::from_secs(1), "waited only {waited:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_401_is_not_retried_and_names_the_secret_without_showing_it() -> R {
    // Like the real API, the error body echoes the key it rejected.
    let server = ModelServer::start(|_, _| {
        vec![json_response(
            "401 Unauthorized",
            &[],
            &format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {OPENAI_KEY}.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
            ),
        )]
    })
    .await?;
    let s = Session::start(
        "model-openai",
        &server,
        openai_config(&server),
        &[("OPENAI_API_KEY", OPENAI_KEY)],
    )
    .await?;
    let error = s
        .complete(&request("hi"))
        .await
        .expect_err("a rejected key fails the call")
        .to_string();
    assert!(error.contains("OPENAI_API_KEY"), "{error}");
    assert!(error.contains("401"), "{error}");
    assert!(!error.contains(OPENAI_KEY), "{error}");
    let sent = only_request(&server);
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    let log = s.audit_log();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(!log.contains(OPENAI_KEY), "{log}");

    // Without the secret the request goes out with no authorization at all (local servers
    // need none); the provider's 401 still names where the key comes from.
    let bare = ModelServer::start(|_, _| {
        vec![json_response(
            "401 Unauthorized",
            &[],
            r#"{"error":{"message":"You didn't provide an API key.","type":"invalid_request_error"}}"#,
        )]
    })
    .await?;
    let s = Session::start("model-openai", &bare, openai_config(&bare), &[]).await?;
    let error = s
        .complete(&request("hi"))
        .await
        .expect_err("401")
        .to_string();
    assert!(error.contains("OPENAI_API_KEY"), "{error}");
    assert_eq!(only_request(&bare).header("authorization"), None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_gate_refuses_a_server_the_policy_does_not_allow() -> R {
    let server = ModelServer::start(|_, _| oa_text(&["never"], "stop")).await?;
    // Point the plugin at another loopback port: not in allow_private.
    let config =
        json!({ "base-url": format!("http://127.0.0.1:{}/v1", server.port() ^ 1), "model": "m" });
    let s = Session::start("model-openai", &server, config, &[]).await?;
    let error = s
        .complete(&request("hi"))
        .await
        .expect_err("refused")
        .to_string();
    assert!(error.contains("allow_private"), "{error}");
    assert!(server.received().is_empty());
    assert!(s.audit_log().contains("\"forbid\""));
    Ok(())
}

// ---- Anthropic Messages ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_text_and_a_split_tool_call() -> R {
    let server = ModelServer::start(|_, _| {
        let mut steps = vec![
            sse_head(),
            an_start(25, 100),
            an("ping", json!({"type": "ping"})),
            an_block_start(0, json!({"type": "thinking", "thinking": ""})),
            an_delta(
                0,
                json!({"type": "thinking_delta", "thinking": "The user wants"}),
            ),
            an_delta(
                0,
                json!({"type": "thinking_delta", "thinking": " the manifest."}),
            ),
            an_delta(
                0,
                json!({"type": "signature_delta", "signature": "SIGNATURE-e2e-do-not-store"}),
            ),
            an_block_stop(0),
            an_block_start(1, json!({"type": "text", "text": ""})),
            an_delta(1, json!({"type": "text_delta", "text": "Let me"})),
            an_delta(1, json!({"type": "text_delta", "text": " read it."})),
            an_block_stop(1),
            an_block_start(
                2,
                json!({"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {}}),
            ),
        ];
        for piece in ["", "{\"pa", "th\": \"Car", "go.toml\"}"] {
            steps.push(an_delta(
                2,
                json!({"type": "input_json_delta", "partial_json": piece}),
            ));
        }
        steps.push(an_block_stop(2));
        steps.extend(an_end("tool_use", 89));
        steps
    })
    .await?;
    let s = Session::start(
        "model-anthropic",
        &server,
        anthropic_config(&server),
        &[("ANTHROPIC_API_KEY", ANTHROPIC_KEY)],
    )
    .await?;
    let mut events = s.kernel.events();
    let response = s.complete(&request("Read Cargo.toml")).await?;

    assert_eq!(
        response.message.content,
        [
            Block::Thinking {
                text: "The user wants the manifest.".into()
            },
            Block::Text {
                text: "Let me read it.".into()
            },
            Block::ToolCall {
                id: "toolu_01".into(),
                name: "read_file".into(),
                arguments: r#"{"path": "Cargo.toml"}"#.into()
            },
        ]
    );
    assert_eq!(
        (response.stop_reason, response.stop_reason_raw.as_str()),
        (StopReason::ToolUse, "tool_use")
    );
    assert_eq!(response.model, "claude-test-2025");
    assert_eq!(
        (
            response.usage.input_tokens,
            response.usage.output_tokens,
            response.usage.cache_read_tokens
        ),
        (125, 89, 100)
    );
    let stored = serde_json::to_string(&response)?;
    assert!(
        !stored.contains("SIGNATURE"),
        "no vendor signature is stored: {stored}"
    );
    assert!(!stored.contains(ANTHROPIC_KEY));

    let sent = only_request(&server);
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(sent.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    let body = sent.json();
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(body["stream"], true);

    let got = deltas(&mut events);
    assert!(
        got.contains(&StreamDelta::Thinking {
            text: "The user wants".into()
        }),
        "{got:?}"
    );
    assert!(got.contains(&StreamDelta::ToolCallStart {
        id: "toolu_01".into(),
        name: "read_file".into()
    }));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_stop_reasons_and_a_cut_tool_call() -> R {
    let cases = [
        ("end_turn", StopReason::EndTurn),
        ("stop_sequence", StopReason::StopSequence),
        ("refusal", StopReason::Refusal),
    ];
    let server = ModelServer::start(move |n, _| {
        let mut steps = vec![
            sse_head(),
            an_start(10, 0),
            an_block_start(0, json!({"type": "text", "text": ""})),
            an_delta(0, json!({"type": "text_delta", "text": "Partial"})),
            an_block_stop(0),
        ];
        match cases.get(n) {
            Some((stop, _)) => steps.extend(an_end(stop, 3)),
            None => {
                steps.push(an_block_start(
                    1,
                    json!({"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {}}),
                ));
                steps.push(an_delta(
                    1,
                    json!({"type": "input_json_delta", "partial_json": "{\"path\": \"a.md\", \"content\": \"unfin"}),
                ));
                steps.extend(an_end("max_tokens", 1024));
            }
        }
        steps
    })
    .await?;
    let s = Session::start("model-anthropic", &server, anthropic_config(&server), &[]).await?;
    for (stop, expected) in cases {
        let response = s.complete(&request("go")).await?;
        assert_eq!(response.stop_reason, expected, "{stop}");
        assert_eq!(response.stop_reason_raw, stop);
        assert_eq!(response.message.text(), "Partial");
    }
    let response = s.complete(&request("go")).await?;
    assert_eq!(
        (response.stop_reason, response.stop_reason_raw.as_str()),
        (StopReason::MaxTokens, "max_tokens")
    );
    assert_eq!(
        tool_calls(&response),
        [(
            "toolu_cut".into(),
            "write_file".into(),
            r#"{"path": "a.md", "content": "unfin"#.into()
        )]
    );
    let outcomes = s.kernel.dispatch(&["toolu_cut".to_owned()]).await;
    assert!(outcomes[0].contains("not_executed"), "{}", outcomes[0]);
    // No secret held: no key header at all.
    assert!(
        server
            .received()
            .iter()
            .all(|r| r.header("x-api-key").is_none())
    );
    Ok(())
}

// ---- Scripted ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_model_plays_its_script_step_by_step() -> R {
    let script = r#"
model = "scripted-e2e"

[[step]]
thinking = "Look first."
text = "Reading the file."
[[step.tool_calls]]
name = "read_file"
arguments = { path = "README.md" }

[[step]]
text = "All done."
"#;
    // No network at all: the server only exists to satisfy the session helper.
    let server = ModelServer::start(|_, _| Vec::new()).await?;
    let s = Session::start("model-scripted", &server, json!({ "script": script }), &[]).await?;
    let mut events = s.kernel.events();

    let first = s.complete(&request("Read the README")).await?;
    assert_eq!(first.model, "scripted-e2e");
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    let calls = tool_calls(&first);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "read_file");
    assert_eq!(
        serde_json::from_str::<Value>(&calls[0].2)?,
        json!({"path": "README.md"})
    );
    assert!(matches!(&first.message.content[0], Block::Thinking { text } if text == "Look first."));

    let mut next = request("Read the README");
    next.messages.push(first.message.clone());
    next.messages.push(Message {
        role: keel_protocol::Role::User,
        content: vec![Block::ToolResult {
            call_id: calls[0].0.clone(),
            content: "# keel".into(),
            is_error: false,
        }],
    });
    let second = s.complete(&next).await?;
    assert_eq!(second.message.text(), "All done.");
    assert_eq!(second.stop_reason, StopReason::EndTurn);

    let texts: String = deltas(&mut events)
        .into_iter()
        .filter_map(|d| match d {
            StreamDelta::Text { text } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(texts, "Reading the file.All done.");
    assert!(server.received().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_model_without_a_script_fails_to_activate_clearly() -> R {
    let dir = tempfile::tempdir()?;
    let kernel = Kernel::new(KernelConfig::default());
    let loader = PluginLoader::new(
        WasmHost::new(WasmHostConfig {
            cache_dir: Some(cache_dir()),
            ..WasmHostConfig::default()
        })?,
        LoaderConfig {
            workspace: dir.path().to_owned(),
            ..LoaderConfig::default()
        },
    );
    let status = kernel
        .load(package(&loader, "model-scripted", json!({}))?)
        .await?;
    match status.state {
        PluginState::Failed { reason } => {
            assert!(reason.contains("[config.model-scripted]"), "{reason}");
        }
        other => panic!("expected a failed activation, got {other:?}"),
    }
    Ok(())
}
