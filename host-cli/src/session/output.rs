//! What a session shows: bus events rendered for a person (streamed text, one line per tool
//! call and result) or as JSON lines for scripts.

use keel_kernel::Event;
use std::io::Write as _;

use keel_protocol::{Message, SessionEvent, StreamDelta, topics};

/// How a session shows what happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Streamed text and tool lines for a person.
    Human,
    /// One JSON event per line on stdout.
    Json,
}

/// Renders bus events.
#[derive(Default)]
pub(crate) struct Printer {
    in_text: bool,
}

impl Printer {
    pub(crate) fn show(&mut self, display: Display, event: &Event) {
        match display {
            Display::Json => {
                let payload: serde_json::Value =
                    serde_json::from_str(&event.payload).unwrap_or(serde_json::Value::Null);
                let line = serde_json::json!({
                    "topic": event.topic,
                    "source": event.source,
                    "event": payload,
                });
                println!("{line}");
            }
            Display::Human => self.human(event),
        }
    }

    pub(crate) fn human(&mut self, event: &Event) {
        let mut out = std::io::stdout();
        if event.topic == topics::MODEL_DELTA {
            match serde_json::from_str::<StreamDelta>(&event.payload) {
                Ok(StreamDelta::Text { text }) => {
                    self.in_text = true;
                    let _ = write!(out, "{text}");
                    let _ = out.flush();
                }
                Ok(StreamDelta::Retry { attempt, reason }) => {
                    eprintln!("[model: retry {attempt}: {reason}]");
                }
                _ => {}
            }
            return;
        }
        if event.topic != topics::SESSION_EVENT {
            return;
        }
        let Ok(entry) = serde_json::from_str::<SessionEvent>(&event.payload) else {
            return;
        };
        match entry {
            SessionEvent::Message {
                message:
                    Message {
                        role: keel_protocol::Role::Assistant,
                        content,
                    },
                ..
            } => {
                for (_, name, args) in (Message {
                    role: keel_protocol::Role::Assistant,
                    content,
                })
                .tool_calls()
                {
                    if self.in_text {
                        println!();
                        self.in_text = false;
                    }
                    println!("⏺ {name} {}", short(args, 160));
                }
            }
            SessionEvent::ToolOutcome { outcome, .. } => {
                let head = outcome.content.lines().next().unwrap_or_default();
                println!("  ⎿ {:?}: {}", outcome.status, short(head, 200));
            }
            SessionEvent::Verdict { verdict, .. } => {
                if self.in_text {
                    println!();
                    self.in_text = false;
                }
                println!(
                    "✔ verifier: {:?} ({}) {}",
                    verdict.status,
                    verdict.dimension,
                    verdict.command.unwrap_or_default()
                );
            }
            _ => {}
        }
    }
}

pub(crate) fn short(s: &str, max: usize) -> String {
    let flat = s.replace('\n', " ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}
