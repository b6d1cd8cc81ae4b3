//! MCP's stdio transport as data: newline-delimited JSON-RPC 2.0 messages, the messages keel
//! sends, and what it makes of what a server sends. Nothing here touches a process, so it is
//! tested natively.

use serde_json::{Value, json};

use keel_mcp_wire::{Frame, Message, codes, encode};
pub use keel_mcp_wire::{LineFramer as Lines, MAX_MESSAGE, PROTOCOL_VERSIONS as PROTOCOLS};

/// The next line a stdio server sent, or `Err` when it sent a line longer than
/// [`MAX_MESSAGE`] (a flood).
pub fn next_line(lines: &mut Lines) -> Option<Result<Vec<u8>, ()>> {
    match lines.next_frame()? {
        Frame::Line(line) => Some(Ok(line)),
        Frame::Oversized => Some(Err(())),
    }
}

/// A request, as one line.
pub fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    encode(&keel_mcp_wire::request(id, method, params))
}

/// A notification, as one line.
pub fn notification(method: &str, params: Value) -> Vec<u8> {
    encode(&keel_mcp_wire::notification(method, params))
}

/// A response to a server's request, as one line.
pub fn response(id: &Value, outcome: Result<Value, (i64, &str)>) -> Vec<u8> {
    encode(&match outcome {
        Ok(result) => keel_mcp_wire::response(id.clone(), result),
        Err((code, message)) => keel_mcp_wire::error_response(id.clone(), code, message),
    })
}

/// The answer to a server request keel does not serve.
pub const NOT_OFFERED: (i64, &str) = (
    codes::METHOD_NOT_FOUND,
    "keel does not offer this to MCP servers",
);

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

/// Read one message (a line, an HTTP body, an event's data).
pub fn parse(line: &[u8]) -> Incoming {
    match keel_mcp_wire::parse(line) {
        Err(invalid) => Incoming::Invalid(invalid.message),
        Ok(Message::Request { id, method, .. }) => Incoming::Request { id, method },
        Ok(Message::Notification { method, params }) => Incoming::Notification { method, params },
        Ok(Message::Response { id, outcome }) => match id.as_u64() {
            Some(id) => Incoming::Response {
                id,
                outcome: outcome.map_err(|e| e.to_string()),
            },
            None => Incoming::Invalid(format!("a response to an id keel never sent: {id}")),
        },
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
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":"s"}"#),
            Incoming::Invalid(_)
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":4}"#),
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
