//! MCP's Streamable HTTP transport over the kernel's HTTP client: each message is a `POST` to
//! the server's URL, answered by JSON, by a server-sent event stream carrying the answer (and
//! notifications before it), or by `202 Accepted` for a notification or response. Every
//! request passes the kernel's network gate (the host the person configured, its audit line),
//! and an `Authorization` header only ever comes from a kernel-held secret the plugin names.

use std::time::Instant;

use keel_sdk::KernelError;
use keel_sdk::http::{self, Header, Request, SecretHeader};

use crate::Failure;

/// Server-sent events, cut into the `data` of each event.
#[derive(Default)]
pub struct Events {
    buf: Vec<u8>,
}

impl Events {
    /// Append what was read.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that are not yet a whole event.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The data of the next complete event (its `data:` lines joined), if one is complete;
    /// events without data (comments, keep-alives) are skipped. Events are cut on bytes, so a
    /// character split across chunks is whole by the time its event is.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            // An event ends at an empty line (`\n\n` or `\r\n\r\n`).
            let mut start = 0;
            let mut end = None;
            for (i, &b) in self.buf.iter().enumerate() {
                if b != b'\n' {
                    continue;
                }
                let line = &self.buf[start..i];
                if line.is_empty() || line == b"\r" {
                    end = Some((start, i + 1));
                    break;
                }
                start = i + 1;
            }
            let (event_end, consumed) = end?;
            let event = String::from_utf8_lossy(&self.buf[..event_end]).into_owned();
            self.buf.drain(..consumed);
            let data: Vec<&str> = event
                .lines()
                .map(|l| l.strip_suffix('\r').unwrap_or(l))
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                return Some(data.join("\n"));
            }
        }
    }
}

/// A Streamable HTTP server, as this plugin talks to it.
pub struct Target {
    /// The endpoint.
    pub url: String,
    /// The kernel-held secret sent as `Authorization: Bearer …`, if any.
    pub bearer_secret: Option<String>,
    /// The session the server assigned at `initialize`.
    pub session: Option<String>,
    /// The negotiated protocol revision, sent on every request after `initialize`.
    pub protocol: Option<String>,
}

fn kernel_failure(e: KernelError) -> Failure {
    match e {
        KernelError::TimedOut(_) => Failure::Timeout(std::time::Duration::ZERO),
        KernelError::Denied(m) if m.contains("cancelled the turn") => Failure::Cancelled,
        other => Failure::Kernel(other.message().to_owned()),
    }
}

impl Target {
    /// `POST` one message. Each message the answer carries goes to `on_message` until it says
    /// it has what it waited for (`true`); a `202` carries none.
    pub fn post(
        &mut self,
        body: &[u8],
        deadline: Instant,
        on_message: &mut dyn FnMut(&[u8]) -> Result<bool, Failure>,
    ) -> Result<(), Failure> {
        let left = |deadline: Instant| {
            let left = deadline.saturating_duration_since(Instant::now());
            u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
        };
        if left(deadline) == 0 {
            return Err(Failure::Timeout(std::time::Duration::ZERO));
        }
        let begun = Instant::now();
        let mut headers = vec![
            Header {
                name: "content-type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "accept".into(),
                value: "application/json, text/event-stream".into(),
            },
        ];
        if let Some(session) = &self.session {
            headers.push(Header {
                name: "mcp-session-id".into(),
                value: session.clone(),
            });
        }
        if let Some(protocol) = &self.protocol {
            headers.push(Header {
                name: "mcp-protocol-version".into(),
                value: protocol.clone(),
            });
        }
        let secret_headers = self
            .bearer_secret
            .iter()
            .map(|secret| SecretHeader {
                secret: secret.clone(),
                header: "authorization".into(),
                prefix: "Bearer ".into(),
            })
            .collect();
        let (body_id, head) = http::send(&Request {
            method: "POST".into(),
            url: self.url.clone(),
            headers,
            secret_headers,
            body: body.to_vec(),
            timeout_ms: left(deadline).max(1),
        })
        .map_err(|e| match kernel_failure(e) {
            Failure::Timeout(_) => Failure::Timeout(begun.elapsed()),
            other => other,
        })?;
        let result = self.read_answer(body_id, &head, deadline, on_message, &left);
        http::close(body_id);
        result.map_err(|e| match e {
            Failure::Timeout(_) => Failure::Timeout(begun.elapsed()),
            other => other,
        })
    }

    fn read_answer(
        &mut self,
        body_id: u32,
        head: &http::ResponseHead,
        deadline: Instant,
        on_message: &mut dyn FnMut(&[u8]) -> Result<bool, Failure>,
        left: &dyn Fn(Instant) -> u32,
    ) -> Result<(), Failure> {
        let header = |name: &str| {
            head.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value.clone())
        };
        if let Some(session) = header("mcp-session-id")
            && !session.is_empty()
            && session.len() <= 256
        {
            self.session = Some(session);
        }
        let read = |limit: usize| -> Result<Vec<u8>, Failure> {
            let mut all = Vec::new();
            while let Some(chunk) =
                http::next_chunk(body_id, left(deadline).max(1)).map_err(kernel_failure)?
            {
                all.extend_from_slice(&chunk);
                if all.len() > limit {
                    return Err(Failure::Flood);
                }
            }
            Ok(all)
        };
        match head.status {
            202 => return Ok(()),
            404 if self.session.is_some() => {
                return Err(Failure::Exited(
                    "the server ended its session (HTTP 404)".into(),
                ));
            }
            status if !(200..300).contains(&status) => {
                let body = read(64 * 1024).unwrap_or_default();
                return Err(Failure::Rpc(format!(
                    "HTTP {status}: {}",
                    crate::clean(&String::from_utf8_lossy(&body), 300)
                )));
            }
            _ => {}
        }
        let streamed = header("content-type").is_some_and(|t| t.contains("text/event-stream"));
        if !streamed {
            let body = read(crate::wire::MAX_MESSAGE)?;
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(());
            }
            on_message(&body)?;
            return Ok(());
        }
        let mut events = Events::default();
        loop {
            while let Some(data) = events.next_data() {
                if on_message(data.as_bytes())? {
                    return Ok(());
                }
            }
            if events.pending() > crate::wire::MAX_MESSAGE {
                return Err(Failure::Flood);
            }
            match http::next_chunk(body_id, left(deadline).max(1)).map_err(kernel_failure)? {
                Some(chunk) => events.push(&chunk),
                None => {
                    return Err(Failure::Exited(
                        "it closed the event stream without the answer".into(),
                    ));
                }
            }
        }
    }

    /// `DELETE` the session, as a client leaving should (best effort).
    pub fn end(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if let Ok((body, _)) = http::send(&Request {
            method: "DELETE".into(),
            url: self.url.clone(),
            headers: vec![Header {
                name: "mcp-session-id".into(),
                value: session,
            }],
            secret_headers: self
                .bearer_secret
                .iter()
                .map(|secret| SecretHeader {
                    secret: secret.clone(),
                    header: "authorization".into(),
                    prefix: "Bearer ".into(),
                })
                .collect(),
            body: Vec::new(),
            timeout_ms: 2_000,
        }) {
            http::close(body);
        }
    }
}

/// The `data` of `value` for tests.
#[cfg(test)]
fn all_data(events: &mut Events) -> Vec<String> {
    std::iter::from_fn(|| events.next_data()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_at_blank_lines_and_keep_partial_tails() {
        let mut events = Events::default();
        events.push(b": keep-alive\n\nevent: message\r\ndata: {\"a\":1}\r\n\r\ndata: {\"b\"");
        assert_eq!(all_data(&mut events), vec!["{\"a\":1}".to_owned()]);
        events.push(b":2}\ndata: more\n\n");
        assert_eq!(all_data(&mut events), vec!["{\"b\":2}\nmore".to_owned()]);
        assert_eq!(events.pending(), 0);
    }

    #[test]
    fn a_character_split_across_chunks_arrives_whole() {
        let mut events = Events::default();
        let text = "data: caf\u{e9}\n\n".as_bytes();
        let split = text.iter().position(|&b| b == 0xc3).expect("the é") + 1;
        events.push(&text[..split]);
        assert_eq!(events.next_data(), None);
        events.push(&text[split..]);
        assert_eq!(events.next_data().as_deref(), Some("caf\u{e9}"));
    }

    #[test]
    fn a_value_round_trips_through_an_event() {
        let mut events = Events::default();
        let value: serde_json::Value = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {}});
        events.push(format!("id: 7\ndata: {value}\n\n").as_bytes());
        let data = events.next_data().expect("one event");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&data).ok(),
            Some(value)
        );
    }
}
