//! MCP's Streamable HTTP transport over the kernel's HTTP client: each message is a `POST` to
//! the server's URL, answered by JSON, by a server-sent event stream carrying the answer (and
//! notifications before it), or by `202 Accepted` for a notification or response. Every
//! request passes the kernel's network gate (the host the person configured, its audit line),
//! and an `Authorization` header only ever comes from a kernel-held secret the plugin names.

use std::time::Instant;

use keel_model_wire::sse::SseParser;
use keel_sdk::KernelError;
use keel_sdk::http::{self, Header, Request, SecretHeader};

use crate::Failure;

/// A Streamable HTTP server, as this plugin talks to it.
pub struct Target {
    /// The endpoint.
    pub url: String,
    /// The kernel-held secret sent as `Authorization: Bearer …`, if any.
    pub bearer_secret: Option<String>,
    /// Headers filled from kernel-held secrets, as they are.
    pub secret_headers: Vec<NamedSecretHeader>,
    /// The session the server assigned at `initialize`.
    pub session: Option<String>,
    /// The negotiated protocol revision, sent on every request after `initialize`.
    pub protocol: Option<String>,
}

/// A header the kernel fills from a kernel-held secret (its value never reaches this plugin).
#[derive(serde::Deserialize, Clone, Debug, Default)]
pub struct NamedSecretHeader {
    /// The header's name.
    pub header: String,
    /// The secret whose value it carries.
    pub secret: String,
}

fn kernel_failure(e: KernelError) -> Failure {
    match e {
        KernelError::TimedOut(_) => Failure::Timeout(std::time::Duration::ZERO),
        KernelError::Denied(m) if m.contains("cancelled the turn") => Failure::Cancelled,
        other => Failure::Kernel(other.message().to_owned()),
    }
}

impl Target {
    /// The headers of every request the kernel fills from secrets: the bearer token, and the
    /// headers named with their secrets.
    fn secret_headers(&self) -> Vec<SecretHeader> {
        self.bearer_secret
            .iter()
            .map(|secret| SecretHeader {
                secret: secret.clone(),
                header: "authorization".into(),
                prefix: "Bearer ".into(),
            })
            .chain(self.secret_headers.iter().map(|h| SecretHeader {
                secret: h.secret.clone(),
                header: h.header.clone(),
                prefix: String::new(),
            }))
            .collect()
    }

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
        let secret_headers = self.secret_headers();
        let (head, body_stream) = http::fetch(&Request {
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
        // The body is released when `body_stream` drops, whatever the answer.
        let result = self.read_answer(&body_stream, &head, deadline, on_message, &left);
        result.map_err(|e| match e {
            Failure::Timeout(_) => Failure::Timeout(begun.elapsed()),
            other => other,
        })
    }

    fn read_answer(
        &mut self,
        body: &http::Body,
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
            while let Some(chunk) = body
                .next_chunk(left(deadline).max(1))
                .map_err(kernel_failure)?
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
        // The same event-stream parser the model adapters use: any chunking, CRLF or CR line
        // ends, a split character; an event over the message bound is a flood.
        let mut events = SseParser::with_max_event_bytes(crate::wire::MAX_MESSAGE);
        loop {
            let chunk = body
                .next_chunk(left(deadline).max(1))
                .map_err(kernel_failure)?;
            let done = chunk.is_none();
            let complete = match &chunk {
                Some(chunk) => events.feed(chunk).map_err(|_| Failure::Flood)?,
                None => events.finish().into_iter().collect(),
            };
            for event in complete {
                if on_message(event.data.as_bytes())? {
                    return Ok(());
                }
            }
            if done {
                return Err(Failure::Exited(
                    "it closed the event stream without the answer".into(),
                ));
            }
        }
    }

    /// `DELETE` the session, as a client leaving should (best effort).
    pub fn end(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // The answer's body is released at once, unread.
        let _ = http::fetch(&Request {
            method: "DELETE".into(),
            url: self.url.clone(),
            headers: vec![Header {
                name: "mcp-session-id".into(),
                value: session,
            }],
            secret_headers: self.secret_headers(),
            body: Vec::new(),
            timeout_ms: 2_000,
        });
    }
}
