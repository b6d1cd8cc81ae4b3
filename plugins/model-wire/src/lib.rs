//! The pure core of keel's model adapter plugins.
//!
//! Everything here is deterministic computation over bytes and [`keel_protocol`] values — no
//! I/O, threads, clocks or randomness of its own — so it is tested natively and runs inside
//! the `wasm32-wasip2` guest plugins (`model-openai`, `model-anthropic`, `model-scripted`)
//! that wrap it around the kernel-mediated HTTP client.
//!
//! - [`sse`]: an incremental, bounded Server-Sent-Events parser.
//! - [`request`]: a model request read in place, its strings kept as the JSON text they
//!   arrived as, so a renderer copies them into the body instead of decoding and encoding.
//! - [`fragments`]: messages rendered one at a time, and a conversation the kernel holds
//!   rendered once per message across requests ([`fragments::ConversationCache`]).
//! - [`openai`] and [`anthropic`]: each vendor's request rendering and stream decoding,
//!   to and from keel's neutral vocabulary (principle 8: the trajectory is stored in keel's
//!   words; dialects are rendered at request time).
//! - [`decode`]: what the decoders share — the interruption rule (no terminal event, no
//!   clean finish) and the derived stop reason.
//! - [`retry`]: error classification, backoff and the idle watchdog schedule.
//! - [`recovery`]: bounded context-length recovery on a request.
//! - [`driver`]: the control loop over a [`driver::Transport`].
//! - [`scripted`]: a deterministic scripted model.

pub mod anthropic;
pub mod decode;
pub mod driver;
pub mod fragments;
pub mod openai;
pub mod recovery;
pub mod request;
pub mod retry;
pub mod scripted;
pub mod sse;

use thiserror::Error;

/// A request body in a vendor's dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The JSON body, as sent.
    pub body: Vec<u8>,
    /// What rendering had to change or leave out (e.g. unparseable tool arguments replaced
    /// by `{}`), for the log; empty when nothing.
    pub notes: Vec<String>,
}

/// Why a request could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    /// Neither the request nor the adapter's configuration names a model.
    #[error("no model is configured: set the model name in the adapter's configuration")]
    NoModel,
    /// The request is not a valid `ModelRequest`.
    #[error("{0}")]
    Invalid(String),
}

impl Rendered {
    /// The body parsed, for tests and diagnostics.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}
