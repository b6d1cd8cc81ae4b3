//! MCP's JSON-RPC 2.0 wire as data, shared by both ends keel plays: `keel mcp serve` (keel as
//! a server on stdio) and the `mcp` plugin (keel as a client of stdio and Streamable HTTP
//! servers). Nothing here does I/O, so both sides frame, parse and answer messages the same
//! way, with the same bound on a message and the same list of protocol revisions.
//!
//! - [`LineFramer`]: bytes in whatever chunks a pipe delivers, out as whole lines; a line
//!   longer than its bound is reported once ([`Frame::Oversized`]) and skipped, so memory stays
//!   bounded whatever the peer sends.
//! - [`parse`]: one message, told apart as request, notification or response, or why it is
//!   not JSON-RPC 2.0 (with the error code a server answers it with).
//! - [`request`], [`notification`], [`response`], [`error_response`], [`encode`]: messages as
//!   values and as lines.

use std::collections::VecDeque;
use std::fmt;

use serde_json::{Value, json};

/// The MCP protocol revisions keel speaks, newest first. As a client keel asks for the first
/// and accepts any of them; as a server it answers with the one asked for when it is listed,
/// else with the first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest message either side takes, in bytes without its line end (4 MiB): a longer
/// line is a flood.
pub const MAX_MESSAGE: usize = 4 << 20;

/// JSON-RPC 2.0 error codes.
pub mod codes {
    /// The message is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a JSON-RPC 2.0 message (or too long to read).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The method's parameters are wrong.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed while handling the request.
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// What a [`LineFramer`] hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// One line without its end (`\n` or `\r\n`); lines of only whitespace are skipped.
    Line(Vec<u8>),
    /// A line longer than the bound arrived (or is arriving); its bytes are dropped up to and
    /// including its end. Reported once per such line.
    Oversized,
}

/// Cuts a byte stream into lines of at most `max` bytes. Holds at most `max` bytes of an
/// unfinished line, plus the complete lines of the last chunk not yet taken.
#[derive(Debug)]
pub struct LineFramer {
    max: usize,
    /// The unfinished line so far.
    partial: Vec<u8>,
    /// Inside an oversized line (already reported): drop bytes until its end.
    skipping: bool,
    ready: VecDeque<Frame>,
}

impl Default for LineFramer {
    fn default() -> Self {
        LineFramer::new(MAX_MESSAGE)
    }
}

impl LineFramer {
    /// A framer whose lines are at most `max` bytes before their newline (a CR included).
    pub fn new(max: usize) -> Self {
        LineFramer {
            max,
            partial: Vec::new(),
            skipping: false,
            ready: VecDeque::new(),
        }
    }

    /// Append what was read.
    pub fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
                if !self.skipping {
                    if self.partial.len() + bytes.len() > self.max {
                        self.oversized();
                    } else {
                        self.partial.extend_from_slice(bytes);
                    }
                }
                return;
            };
            let (head, rest) = (&bytes[..end], &bytes[end + 1..]);
            bytes = rest;
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(head);
            // The bound counts every byte before the newline, a CR of a CRLF end included: an
            // unfinished line is judged the same way, so however the bytes arrive in pieces,
            // the same lines pass.
            if line.len() > self.max {
                self.ready.push_back(Frame::Oversized);
                continue;
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                self.ready.push_back(Frame::Line(line));
            }
        }
    }

    fn oversized(&mut self) {
        self.partial = Vec::new();
        self.skipping = true;
        self.ready.push_back(Frame::Oversized);
    }

    /// The next complete line (or oversize report), if any.
    pub fn next_frame(&mut self) -> Option<Frame> {
        self.ready.pop_front()
    }

    /// Bytes held of the unfinished line.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    /// Forget everything held (the peer is being restarted).
    pub fn clear(&mut self) {
        self.partial.clear();
        self.skipping = false;
        self.ready.clear();
    }
}

/// A JSON-RPC error a peer answered with.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Its code, when it had an integer one.
    pub code: Option<i64>,
    /// Its message (`no message` when it had none).
    pub message: String,
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "{} (JSON-RPC error {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// One JSON-RPC 2.0 message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request: answered with the same `id`.
    Request {
        /// Its id (a string or a number).
        id: Value,
        /// The method.
        method: String,
        /// Its parameters (`null` when it had none).
        params: Value,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
        /// Its parameters (`null` when it had none).
        params: Value,
    },
    /// A response to a request.
    Response {
        /// The id of the request it answers.
        id: Value,
        /// Its result, or the error.
        outcome: Result<Value, RpcError>,
    },
}

/// Why a line is not a JSON-RPC 2.0 message.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// The message's id when one could be read (a server answers with it), else `null`.
    pub id: Value,
    /// The error code a server answers with ([`codes::PARSE_ERROR`] or
    /// [`codes::INVALID_REQUEST`]).
    pub code: i64,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Read one message (a line from [`LineFramer`], or an HTTP body or event's data).
pub fn parse(line: &[u8]) -> Result<Message, Invalid> {
    let invalid = |id: Value, code: i64, message: String| Invalid { id, code, message };
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| invalid(Value::Null, codes::PARSE_ERROR, format!("not JSON ({e})")))?;
    let Value::Object(mut object) = value else {
        return Err(invalid(
            Value::Null,
            codes::INVALID_REQUEST,
            "not a JSON-RPC object".into(),
        ));
    };
    let id = object.remove("id").filter(|id| !id.is_null());
    if let Some(id) = &id
        && !(id.is_string() || id.is_number())
    {
        return Err(invalid(
            Value::Null,
            codes::INVALID_REQUEST,
            format!("`id` must be a string or a number, not {id}"),
        ));
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(
            id.unwrap_or(Value::Null),
            codes::INVALID_REQUEST,
            "`jsonrpc` must be \"2.0\"".into(),
        ));
    }
    let params = object.remove("params").unwrap_or(Value::Null);
    match (object.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Message::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
        (Some(_), id) => Err(invalid(
            id.unwrap_or(Value::Null),
            codes::INVALID_REQUEST,
            "`method` must be a string".into(),
        )),
        (None, Some(id)) => {
            let outcome = match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Ok(result),
                (None, Some(error)) => Err(RpcError {
                    code: error.get("code").and_then(Value::as_i64),
                    message: error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("no message")
                        .to_owned(),
                }),
                _ => Err(RpcError {
                    code: None,
                    message: "the response has neither a result nor an error".into(),
                }),
            };
            Ok(Message::Response { id, outcome })
        }
        (None, None) => Err(invalid(
            Value::Null,
            codes::INVALID_REQUEST,
            "neither a request, a response nor a notification".into(),
        )),
    }
}

/// A request.
pub fn request(id: impl Into<Value>, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "method": method, "params": params})
}

/// A notification.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// A successful response to request `id`.
pub fn response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response to request `id` (`null` when the request's id could not be read).
pub fn error_response(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// `message` as one line of the stdio transport (JSON text has no raw newline, so it cannot
/// split).
pub fn encode(message: &Value) -> Vec<u8> {
    let mut bytes = message.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests;
