//! An incremental Server-Sent-Events parser.
//!
//! Feed it the response body in whatever chunks the transport delivers — events, lines and
//! even UTF-8 characters may be split anywhere — and it hands back each complete event once
//! its terminating blank line has arrived. It follows the WHATWG event-stream rules that
//! matter for model APIs: `\n`, `\r\n` and `\r` line endings, a leading byte-order mark,
//! multi-line `data:` joined by `\n`, `event:` names, `:` comments, one optional space after
//! the colon, `id:` and `retry:` ignored, events without data not dispatched.
//!
//! Memory is bounded: an event (its pending line plus its accumulated data) larger than
//! [`SseParser::max_event_bytes`] is an [`SseError::EventTooLarge`], never an unbounded buffer.

use thiserror::Error;

/// The default cap on one event's size: 8 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` name; `message` when the event named none.
    pub event: String,
    /// The `data:` lines joined by `\n` (without the final newline).
    pub data: String,
}

/// What can go wrong while parsing an event stream.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SseError {
    /// One event grew past the configured cap.
    #[error("a server-sent event exceeded the {limit}-byte limit")]
    EventTooLarge {
        /// The cap in bytes.
        limit: usize,
    },
}

/// The incremental parser. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct SseParser {
    max_event_bytes: usize,
    /// Bytes of the line being read (without its terminator).
    line: Vec<u8>,
    /// The last byte seen was a `\r`, so a following `\n` belongs to the same terminator.
    after_cr: bool,
    /// Still at the very start of the stream (a byte-order mark may follow).
    at_start: bool,
    /// Bytes of a possible byte-order mark seen at the start.
    bom_seen: usize,
    data: String,
    has_data: bool,
    event: Option<String>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new()
    }
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

impl SseParser {
    /// A parser with the default 8 MiB event cap.
    pub fn new() -> SseParser {
        SseParser::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser whose events may be at most `max_event_bytes` long.
    pub fn with_max_event_bytes(max_event_bytes: usize) -> SseParser {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            bom_seen: 0,
            data: String::new(),
            has_data: false,
            event: None,
        }
    }

    /// The cap on one event's size, in bytes.
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// Feed the next chunk of the body; returns the events it completed, in order.
    ///
    /// After an error the partial event is discarded; the stream should be abandoned.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        for &byte in chunk {
            if self.at_start {
                // Strip a leading UTF-8 byte-order mark, which may itself be split.
                if byte == BOM[self.bom_seen] {
                    self.bom_seen += 1;
                    if self.bom_seen == BOM.len() {
                        self.at_start = false;
                    }
                    continue;
                }
                self.at_start = false;
                let partial = BOM[..self.bom_seen].to_vec();
                for b in partial {
                    self.push_byte(b, &mut out)?;
                }
            }
            self.push_byte(byte, &mut out)?;
        }
        Ok(out)
    }

    /// The body ended: returns the pending event if its lines were complete.
    ///
    /// The standard discards an event whose blank line never came; keel is slightly more
    /// lenient and dispatches it when its last line was terminated (some servers close the
    /// connection right after `data: [DONE]\n`). A half-received line is always discarded.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let complete_line = self.line.is_empty();
        self.line.clear();
        self.after_cr = false;
        if complete_line {
            self.dispatch()
        } else {
            self.reset_event();
            None
        }
    }

    fn push_byte(&mut self, byte: u8, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        match byte {
            b'\n' if self.after_cr => {
                self.after_cr = false;
            }
            b'\n' | b'\r' => {
                self.after_cr = byte == b'\r';
                self.end_line(out);
            }
            _ => {
                self.after_cr = false;
                if self.line.len() + self.data.len() >= self.max_event_bytes {
                    self.line.clear();
                    self.reset_event();
                    return Err(SseError::EventTooLarge {
                        limit: self.max_event_bytes,
                    });
                }
                self.line.push(byte);
            }
        }
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        if self.line.is_empty() {
            if let Some(event) = self.dispatch() {
                out.push(event);
            }
            return;
        }
        let line = std::mem::take(&mut self.line);
        let text = String::from_utf8_lossy(&line);
        if text.starts_with(':') {
            return; // comment
        }
        let (field, value) = match text.find(':') {
            Some(at) => {
                let value = &text[at + 1..];
                (&text[..at], value.strip_prefix(' ').unwrap_or(value))
            }
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            _ => {} // id, retry and unknown fields are ignored
        }
        self.line = line;
        self.line.clear();
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        if !self.has_data {
            self.reset_event();
            return None;
        }
        let event = SseEvent {
            event: self
                .event
                .take()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "message".to_string()),
            data: std::mem::take(&mut self.data),
        };
        self.reset_event();
        Some(event)
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.has_data = false;
        self.event = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.feed(c).expect("parses"));
        }
        out.extend(p.finish());
        out
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn fields_comments_and_line_endings() {
        let body = b"\xEF\xBB\xBF: keep-alive\r\nevent: ping\r\ndata: {}\r\n\r\nid: 7\nretry: 10\ndata:a\ndata: b\n\nevent: x\rdata: c\r\r";
        assert_eq!(
            parse_all(&[body]),
            vec![ev("ping", "{}"), ev("message", "a\nb"), ev("x", "c")]
        );
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert_eq!(
            parse_all(&[b"event: a\n\n: c\n\ndata\n\n"]),
            vec![ev("message", "")]
        );
    }

    #[test]
    fn split_utf8_and_crlf_across_chunks() {
        let body = "data: h\u{e9}llo \u{1F600}\r\n\r\n".as_bytes();
        let chunks: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(
            parse_all(&chunks),
            vec![ev("message", "h\u{e9}llo \u{1F600}")]
        );
    }

    #[test]
    fn finish_dispatches_a_terminated_but_unblanked_event_only() {
        assert_eq!(
            parse_all(&[b"data: [DONE]\n"]),
            vec![ev("message", "[DONE]")]
        );
        assert_eq!(parse_all(&[b"data: {\"a\":"]), vec![]);
    }

    #[test]
    fn oversized_event_is_an_error() {
        let mut p = SseParser::with_max_event_bytes(16);
        let err = p
            .feed(b"data: 0123456789abcdefghij\n\n")
            .expect_err("too large");
        assert_eq!(err, SseError::EventTooLarge { limit: 16 });
        // Multi-line data counts too.
        let mut p = SseParser::with_max_event_bytes(16);
        assert!(p.feed(b"data: 0123456789\ndata: 0123456789\n").is_err());
        let mut p = SseParser::with_max_event_bytes(64);
        assert_eq!(
            p.feed(b"data: small\n\n").expect("fits"),
            vec![ev("message", "small")]
        );
    }
}
