//! `keel mcp serve`: keel as an MCP server over stdio. Another MCP client (an editor, another
//! agent) gets the tools of a keel session — and every call it makes passes the same gate
//! pipeline as a model's: schema, guards, exec policy, approval (the policy's answer, since
//! there is no terminal to ask on), the OS sandbox, output sanitising. The session is logged
//! like any other.
//!
//! The transport is the MCP stdio transport: one JSON-RPC message per line on stdin and
//! stdout, logs on stderr. Messages are bounded ([`MAX_MESSAGE`]); requests are answered one
//! at a time, in order.

use std::process::ExitCode;

use anyhow::Context as _;
use keel_kernel::gates::exec_policy::ApprovalMode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::config::Context;
use crate::session::{Display, Session, SessionOptions};

/// The protocol revisions keel speaks, newest first.
const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest message read; a longer line is answered with an error and skipped.
pub const MAX_MESSAGE: usize = 4 << 20;

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Serve the session's tools on stdin and stdout until stdin ends.
pub async fn run(ctx: &Context, approval: Option<ApprovalMode>) -> anyhow::Result<ExitCode> {
    let session = Session::start(
        ctx,
        SessionOptions {
            approval: Some(approval.unwrap_or(ApprovalMode::Never)),
            extra_plugins: Vec::new(),
            // Nothing of the session is printed: stdout belongs to the protocol.
            display: Display::Json { requests: false },
            resume: None,
            overrides: Vec::new(),
        },
    )
    .await?;
    eprintln!(
        "keel mcp serve: session {} in {}; {}",
        session.id(),
        session.workspace().display(),
        session.kernel.confinement().describe()
    );
    let mut server = Server {
        session: &session,
        initialized: false,
    };
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut stdout = tokio::io::stdout();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut stdin)
            .take(MAX_MESSAGE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .context("cannot read stdin")?;
        if read == 0 {
            break;
        }
        let reply = if line.len() > MAX_MESSAGE && !line.ends_with(b"\n") {
            // Skip the rest of the oversized line.
            let mut rest = Vec::new();
            while !rest.ends_with(b"\n") {
                rest.clear();
                let n = (&mut stdin)
                    .take(MAX_MESSAGE as u64)
                    .read_until(b'\n', &mut rest)
                    .await?;
                if n == 0 {
                    break;
                }
            }
            Some(error(
                Value::Null,
                INVALID_REQUEST,
                &format!("the message is longer than {MAX_MESSAGE} bytes"),
            ))
        } else if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            server.handle(&line).await
        };
        if let Some(reply) = reply {
            let mut text = reply.to_string();
            text.push('\n');
            stdout.write_all(text.as_bytes()).await?;
            stdout.flush().await?;
        }
    }
    session.close().await;
    Ok(ExitCode::SUCCESS)
}

struct Server<'a> {
    session: &'a Session,
    initialized: bool,
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

impl Server<'_> {
    /// The reply to one message; none for a notification or a response.
    async fn handle(&mut self, line: &[u8]) -> Option<Value> {
        let message: Value = match serde_json::from_slice(line) {
            Ok(message) => message,
            Err(e) => return Some(error(Value::Null, PARSE_ERROR, &format!("not JSON: {e}"))),
        };
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            // A response to something keel never asks, or not JSON-RPC at all.
            return message.get("id").map(|id| {
                error(
                    id.clone(),
                    INVALID_REQUEST,
                    "expected a JSON-RPC request with a `method`",
                )
            });
        };
        // A notification (no id) is never answered.
        let id = message.get("id").cloned()?;
        if message.get("jsonrpc") != Some(&json!("2.0")) {
            return Some(error(id, INVALID_REQUEST, "`jsonrpc` must be \"2.0\""));
        }
        let params = message.get("params").cloned().unwrap_or(json!({}));
        Some(match method {
            "initialize" => {
                self.initialized = true;
                let asked = params["protocolVersion"].as_str().unwrap_or_default();
                let version = PROTOCOL_VERSIONS
                    .iter()
                    .find(|v| **v == asked)
                    .unwrap_or(&PROTOCOL_VERSIONS[0]);
                result(
                    id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": false}},
                        "serverInfo": {"name": "keel", "version": env!("CARGO_PKG_VERSION")},
                        "instructions": "keel's tools; every call passes keel's gates (exec \
                            policy, approval, OS sandbox) and may be refused with the reason.",
                    }),
                )
            }
            "ping" => result(id, json!({})),
            _ if !self.initialized => error(
                id,
                INVALID_REQUEST,
                "send `initialize` before anything else",
            ),
            "tools/list" => result(id, json!({"tools": self.tools()})),
            "tools/call" => self.call(id, &params).await,
            other => error(id, METHOD_NOT_FOUND, &format!("no method `{other}`")),
        })
    }

    /// The session's tools in MCP's shape.
    fn tools(&self) -> Vec<Value> {
        let mut tools = self.session.kernel.tools();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
            .into_iter()
            .map(|t| {
                let schema: Value = serde_json::from_str(&t.input_schema)
                    .unwrap_or_else(|_| json!({"type": "object"}));
                json!({"name": t.name, "description": t.description, "inputSchema": schema})
            })
            .collect()
    }

    /// `tools/call`: through the kernel's gate pipeline; a refusal or a failure is a result
    /// with `isError`, an unknown tool or bad arguments a protocol error.
    async fn call(&self, id: Value, params: &Value) -> Value {
        let Some(name) = params["name"].as_str() else {
            return error(id, INVALID_PARAMS, "`tools/call` needs the tool's `name`");
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(args @ Value::Object(_)) => args.clone(),
            Some(_) => return error(id, INVALID_PARAMS, "`arguments` must be an object"),
        };
        if !self.session.kernel.tools().iter().any(|t| t.name == name) {
            return error(id, INVALID_PARAMS, &format!("unknown tool `{name}`"));
        }
        let outcome = self
            .session
            .kernel
            .call_tool(name, &arguments.to_string())
            .await;
        match serde_json::from_str::<keel_protocol::ToolOutcome>(&outcome) {
            Ok(outcome) => result(
                id,
                json!({
                    "content": [{"type": "text", "text": outcome.content}],
                    "isError": outcome.is_error(),
                }),
            ),
            Err(e) => result(
                id,
                json!({
                    "content": [{"type": "text", "text": format!("keel could not read the outcome: {e}")}],
                    "isError": true,
                }),
            ),
        }
    }
}
