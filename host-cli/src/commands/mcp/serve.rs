//! `keel mcp serve`: keel as an MCP server over stdio. Another MCP client (an editor, another
//! agent) gets the tools of a keel session — and every call it makes passes the same gate
//! pipeline as a model's: schema, guards, exec policy, approval (the policy's answer, since
//! there is no terminal to ask on), the OS sandbox, output sanitising. The session is logged
//! like any other.
//!
//! The transport is the MCP stdio transport: one JSON-RPC message per line on stdin and
//! stdout, logs on stderr. Framing, parsing, error codes, the message bound and the protocol
//! revisions are `keel-mcp-wire`'s, shared with the mcp plugin (keel as a client); requests are
//! answered one at a time, in order.

use std::process::ExitCode;

use anyhow::Context as _;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_mcp_wire::codes::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use keel_mcp_wire::{
    Frame, LineFramer, MAX_MESSAGE, Message, PROTOCOL_VERSIONS, error_response as error,
    response as result,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::config::Context;
use crate::session::{Display, Session, SessionOptions};

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
    stderrln!(
        "keel mcp serve: session {} in {}; {}",
        session.id(),
        session.workspace().display(),
        session.kernel.confinement().describe()
    );
    let mut server = Server {
        session: &session,
        initialized: false,
    };
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut framer = LineFramer::new(MAX_MESSAGE);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut ended = false;
    while !ended {
        let n = stdin.read(&mut chunk).await.context("cannot read stdin")?;
        if n == 0 {
            // A last message without its line end still counts.
            framer.push(b"\n");
            ended = true;
        } else {
            framer.push(&chunk[..n]);
        }
        while let Some(frame) = framer.next_frame() {
            let reply = match frame {
                Frame::Oversized => Some(error(
                    Value::Null,
                    INVALID_REQUEST,
                    &format!("the message is longer than {MAX_MESSAGE} bytes"),
                )),
                Frame::Line(line) => server.handle(&line).await,
            };
            if let Some(reply) = reply {
                stdout.write_all(&keel_mcp_wire::encode(&reply)).await?;
                stdout.flush().await?;
            }
        }
    }
    session.close().await;
    Ok(ExitCode::SUCCESS)
}

struct Server<'a> {
    session: &'a Session,
    initialized: bool,
}

impl Server<'_> {
    /// The reply to one message; none for a notification or a response.
    async fn handle(&mut self, line: &[u8]) -> Option<Value> {
        let (id, method, params) = match keel_mcp_wire::parse(line) {
            Ok(Message::Request { id, method, params }) => (id, method, params),
            // A notification is never answered.
            Ok(Message::Notification { .. }) => return None,
            // A response to something keel never asks.
            Ok(Message::Response { id, .. }) => {
                return Some(error(
                    id,
                    INVALID_REQUEST,
                    "expected a JSON-RPC request with a `method`",
                ));
            }
            Err(invalid) => return Some(error(invalid.id, invalid.code, &invalid.message)),
        };
        let params = if params.is_null() { json!({}) } else { params };
        Some(match method.as_str() {
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
