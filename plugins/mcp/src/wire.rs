//! MCP's stdio transport as data: newline-delimited JSON-RPC 2.0 messages, the messages keel
//! sends, and what it makes of what a server sends. Nothing here touches a process, so it is
//! tested natively.

use serde_json::{Value, json};

/// The protocol revisions keel speaks, newest first; it asks for the first and accepts any.
pub const PROTOCOLS: &[&str] = &["2025-11-25", "2025-06-18"];

/// Longest message keel takes from a server; a longer line is a flood.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Bytes read from a server, cut into lines.
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Append what was read.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line, without its end; empty lines are skipped.
    pub fn next_line(&mut self) -> Option<Vec<u8>> {
        loop {
            let end = self.buf.iter().position(|&b| b == b'\n')?;
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Some(line);
            }
        }
    }

    /// Bytes held that are not yet a whole line.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Forget everything held (the server is being restarted).
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// A request, as one line.
pub fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

/// A notification, as one line.
pub fn notification(method: &str, params: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
}

/// A response to a server's request, as one line.
pub fn response(id: &Value, outcome: Result<Value, (i64, &str)>) -> Vec<u8> {
    line(&match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    })
}

fn line(value: &Value) -> Vec<u8> {
    let mut bytes = value.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

/// The `initialize` request's parameters.
pub fn initialize_params(client_version: &str) -> Value {
    json!({
        "protocolVersion": PROTOCOLS[0],
        // No roots, sampling or elicitation: a server gets nothing from keel but tool calls.
        "capabilities": {},
        "clientInfo": {"name": "keel", "version": client_version},
    })
}

/// What one line from a server is.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// The answer to request `id`: its result, or the error's words.
    Response {
        id: u64,
        outcome: Result<Value, String>,
    },
    /// A notification.
    Notification { method: String, params: Value },
    /// A request of the server's (answered "not supported", except `ping`).
    Request { id: Value, method: String },
    /// Not JSON-RPC; why.
    Invalid(String),
}

/// Read one line.
pub fn parse(line: &[u8]) -> Incoming {
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Incoming::Invalid(format!("not JSON ({e})")),
    };
    let Some(object) = value.as_object() else {
        return Incoming::Invalid("not a JSON-RPC object".into());
    };
    let method = object.get("method").and_then(Value::as_str);
    let id = object.get("id").filter(|id| !id.is_null());
    match (method, id) {
        (Some(method), Some(id)) => Incoming::Request {
            id: id.clone(),
            method: method.to_owned(),
        },
        (Some(method), None) => Incoming::Notification {
            method: method.to_owned(),
            params: object.get("params").cloned().unwrap_or(Value::Null),
        },
        (None, Some(id)) => {
            let Some(id) = id.as_u64() else {
                return Incoming::Invalid(format!("a response to an id keel never sent: {id}"));
            };
            let outcome = match (object.get("result"), object.get("error")) {
                (Some(result), None) => Ok(result.clone()),
                (None, Some(error)) => Err(error_words(error)),
                _ => Err("the response has neither a result nor an error".into()),
            };
            Incoming::Response { id, outcome }
        }
        (None, None) => {
            Incoming::Invalid("neither a request, a response nor a notification".into())
        }
    }
}

fn error_words(error: &Value) -> String {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("no message");
    match error.get("code").and_then(Value::as_i64) {
        Some(code) => format!("{message} (JSON-RPC error {code})"),
        None => message.to_owned(),
    }
}

/// A server's tool, as `tools/list` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTool {
    /// Its name on the server.
    pub name: String,
    /// Its description (with its title, when it has one).
    pub description: String,
    /// Its input schema.
    pub input_schema: Value,
}

/// Largest number of tools keel takes from one server.
pub const MAX_TOOLS: usize = 256;

/// The tools of one `tools/list` page and the cursor of the next.
pub fn tools_page(result: &Value) -> Result<(Vec<ServerTool>, Option<String>), String> {
    let tools = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or("the tools/list result has no `tools` list")?;
    let mut page = Vec::new();
    for tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            continue;
        };
        let mut description = tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if let Some(title) = tool.get("title").and_then(Value::as_str)
            && !title.is_empty()
        {
            description = format!("{title}: {description}");
        }
        let input_schema = match tool.get("inputSchema") {
            Some(schema) if schema.is_object() => schema.clone(),
            _ => json!({"type": "object"}),
        };
        page.push(ServerTool {
            name: name.to_owned(),
            description,
            input_schema,
        });
    }
    let next = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    Ok((page, next))
}

/// A `tools/call` result as text for the model, and whether the server said it failed.
/// Images and audio are described rather than dropped; structured content is added as JSON
/// when no text block already carries it.
pub fn render_result(result: &Value) -> (bool, String) {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let mut parts: Vec<String> = Vec::new();
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let str_of = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
        let size = |key: &str| str_of(key).len() / 4 * 3;
        parts.push(match kind {
            "text" => str_of("text").to_owned(),
            "image" | "audio" => format!(
                "[{kind}: {}, about {} bytes; keel passes on its description only]",
                str_of("mimeType"),
                size("data")
            ),
            "resource_link" => format!("[resource link: {} {}]", str_of("uri"), str_of("name")),
            "resource" => {
                let resource = block.get("resource").cloned().unwrap_or(Value::Null);
                let field = |key: &str| {
                    resource
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                match resource.get("text").and_then(Value::as_str) {
                    Some(text) => format!("[resource {}]\n{text}", field("uri")),
                    None => format!(
                        "[resource {}: {}, about {} bytes of binary data]",
                        field("uri"),
                        field("mimeType"),
                        field("blob").len() / 4 * 3
                    ),
                }
            }
            other => format!("[content of type `{other}`, which keel does not show]"),
        });
    }
    // A server that returns structured content should carry it as text too; when it sent no
    // text at all, the JSON is the result.
    if let Some(structured) = result.get("structuredContent")
        && parts.is_empty()
    {
        parts.push(format!("structured content: {structured}"));
    }
    (is_error, parts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_and_keep_partial_tails() {
        let mut lines = Lines::default();
        lines.push(b"{\"a\":1}\r\n\n  \n{\"b\"");
        assert_eq!(lines.next_line(), Some(b"{\"a\":1}".to_vec()));
        assert_eq!(lines.next_line(), None);
        assert_eq!(lines.pending(), 4);
        lines.push(b":2}\n");
        assert_eq!(lines.next_line(), Some(b"{\"b\":2}".to_vec()));
    }

    #[test]
    fn messages_are_told_apart() {
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":3,"result":{"x":1}}"#),
            Incoming::Response {
                id: 3,
                outcome: Ok(json!({"x": 1}))
            }
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"nope"}}"#),
            Incoming::Response {
                id: 3,
                outcome: Err("nope (JSON-RPC error -32601)".into())
            }
        );
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#),
            Incoming::Notification { method, .. } if method == "notifications/tools/list_changed"
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":"x","method":"roots/list"}"#),
            Incoming::Request { method, .. } if method == "roots/list"
        ));
        assert!(matches!(parse(b"hello"), Incoming::Invalid(_)));
        assert!(matches!(parse(b"[1,2]"), Incoming::Invalid(_)));
        assert!(matches!(parse(br#"{"id":"s"}"#), Incoming::Invalid(_)));
        assert!(matches!(
            parse(br#"{"id":4}"#),
            Incoming::Response {
                id: 4,
                outcome: Err(_)
            }
        ));
    }

    #[test]
    fn results_keep_text_describe_images_and_add_structured_content() {
        let (err, text) = render_result(&json!({
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "mimeType": "image/png", "data": "AAAA"},
                {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}}
            ],
            "structuredContent": {"t": 21}
        }));
        assert!(!err);
        assert_eq!(
            text,
            "hello\n[image: image/png, about 3 bytes; keel passes on its description only]\n\
             [resource file:///a]\ninside"
        );
        let (_, text) = render_result(&json!({"content": [], "structuredContent": {"t": 21}}));
        assert_eq!(text, "structured content: {\"t\":21}");
        let (err, text) = render_result(&json!({
            "content": [{"type": "text", "text": "{\"t\": 21}"}],
            "structuredContent": {"t": 21},
            "isError": true
        }));
        assert!(err);
        assert_eq!(text, "{\"t\": 21}");
    }

    #[test]
    fn tool_pages_carry_their_cursor() {
        let (tools, next) = tools_page(&json!({
            "tools": [{"name": "a", "title": "A", "description": "does a", "inputSchema": {"type": "object"}},
                      {"description": "nameless"}],
            "nextCursor": "2"
        }))
        .expect("page");
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].description, "A: does a");
        assert_eq!(next.as_deref(), Some("2"));
        assert!(tools_page(&json!({})).is_err());
    }
}
