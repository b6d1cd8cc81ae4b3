//! The adapter's control loop, generic over a [`Transport`] so that it runs natively against
//! a fake one in tests and, in a guest plugin, against the kernel-mediated HTTP client.
//!
//! [`complete`] takes the request as the JSON text it arrived as and renders it in the
//! configured [`WireFormat`] in place ([`RequestView`]: the conversation's strings are copied
//! into the body, never decoded and encoded again), sends it, feeds the
//! body through the SSE parser and the format's decoder, passes each display fragment to a
//! callback, and applies the failure policy:
//!
//! | failure | what happens |
//! | --- | --- |
//! | idle watchdog fired or connection dropped, nothing received | transparent resend (a drop waits the backoff first); the next watchdog is wider |
//! | the same after text, thinking or tool-call bytes arrived | the partial response is returned as [`StopReason::Interrupted`], no resend (it was billed) |
//! | 429, 408, 5xx, an in-stream overloaded/server error | resend after `Retry-After` or the backoff |
//! | 401/403 | [`ModelError::Authentication`] at once, naming where the key comes from |
//! | context length exceeded | one [`crate::recovery`] step, then resend, within the recovery bound |
//! | other 4xx, malformed stream, transport refusal | an error at once |
//!
//! Every resend counts in [`ModelResponse::retries`]; resends after a retryable failure
//! (stall, drop, 429, 5xx) also count against [`RetryPolicy::max_attempts`], while resends
//! after a context-recovery step are bounded by [`RecoveryPolicy::max_steps`] instead.
//!
//! The driver never sees a key: the request names a kernel-held secret ([`SecretRef`]) that
//! the transport puts into a header. No error text includes a header value.

use keel_protocol::{ModelRequest, ModelResponse, StopReason, StreamDelta};
use thiserror::Error;

use crate::anthropic::{self, AnthropicOptions};
use crate::decode::{DecodeError, StreamDecoder};
use crate::fragments::{
    ConversationCache, ConversationSource, KeptBody, MessageParts, Rendering, Resume,
};
use crate::openai::{self, OpenAiOptions};
use crate::recovery::{ContextRecovery, RecoveryError, RecoveryPolicy};
use crate::request::{MessageView, RequestView};
use crate::retry::{ApiFailure, ErrorClass, RetryPolicy, classify, classify_stream_error};
use crate::sse::{DEFAULT_MAX_EVENT_BYTES, SseParser};
use crate::{RenderError, Rendered};

/// Where the kernel puts a secret it holds: `header: prefix + secret`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    /// The secret's name in the kernel's store (e.g. `OPENAI_API_KEY`).
    pub name: String,
    /// The header it goes into (e.g. `authorization`).
    pub header: String,
    /// What precedes it in the header value (e.g. `Bearer `).
    pub prefix: String,
}

/// An HTTP request for the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// `POST`.
    pub method: String,
    /// The endpoint.
    pub url: String,
    /// Headers, in order (never the secret).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// The secret the transport adds, when the endpoint needs one.
    pub secret: Option<SecretRef>,
    /// How long to wait for the response head, in milliseconds (the idle watchdog).
    pub timeout_ms: u64,
}

/// The status line and headers of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpHead {
    /// The HTTP status.
    pub status: u16,
    /// The headers.
    pub headers: Vec<(String, String)>,
}

/// How a transport operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    /// Nothing arrived within the idle timeout.
    #[error("no data arrived within the idle timeout")]
    TimedOut,
    /// The connection failed, was reset or closed early.
    #[error("the connection was interrupted: {0}")]
    Dropped(String),
    /// Policy refused the request (e.g. the host is not allowed). Never retried.
    #[error("the request was refused: {0}")]
    Refused(String),
    /// Anything else. Not retried.
    #[error("transport failure: {0}")]
    Other(String),
}

/// The I/O the driver needs. One response is read at a time: `send` starts it, `next_chunk`
/// reads its body.
pub trait Transport {
    /// Send a request and wait for the response head. The request is lent: a transport may
    /// take its body (the whole conversation, rendered) to send it without a copy, and puts
    /// it back afterwards, so that the next request of the conversation is assembled over it
    /// (a body not put back costs that reuse only).
    fn send(&mut self, req: &mut HttpRequest) -> Result<HttpHead, TransportError>;
    /// The next chunk of the current response's body, `None` at its end, or
    /// [`TransportError::TimedOut`] when nothing arrived for `idle_timeout_ms`.
    fn next_chunk(&mut self, idle_timeout_ms: u64) -> Result<Option<Vec<u8>>, TransportError>;
    /// Wait this long.
    fn sleep_ms(&mut self, ms: u64);
    /// A uniformly random number in `[0, 1)`, for backoff jitter.
    fn random_unit(&mut self) -> f64;
    /// Milliseconds since the Unix epoch, if known; only used for a `Retry-After` date when
    /// the response has no `Date` header.
    fn now_unix_ms(&mut self) -> Option<u64> {
        None
    }
    /// Messages `from..to` of the conversation the request being served names, as a JSON
    /// array (the kernel's `keel.conversation`); a host that holds none answers an error.
    fn read_conversation(&mut self, from: usize, to: usize) -> Result<String, String> {
        let _ = (from, to);
        Err("this host holds no conversations; send the messages in the request".into())
    }
}

/// A transport as the source of a held conversation.
struct Reader<'t, T: ?Sized>(&'t mut T);

impl<T: Transport + ?Sized> ConversationSource for Reader<'_, T> {
    fn read_conversation(&mut self, from: usize, to: usize) -> Result<String, String> {
        self.0.read_conversation(from, to)
    }
}

/// The vendor dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireFormat {
    /// OpenAI Chat Completions and compatible servers.
    OpenAi(OpenAiOptions),
    /// Anthropic Messages.
    Anthropic(AnthropicOptions),
}

/// Everything the driver needs to know about one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    /// The dialect.
    pub format: WireFormat,
    /// The endpoint URL.
    pub url: String,
    /// Extra headers (e.g. `anthropic-version`, `OpenAI-Organization`).
    pub headers: Vec<(String, String)>,
    /// The key, by reference; `None` for servers without authentication.
    pub secret: Option<SecretRef>,
    /// Where the key comes from, for the authentication error: e.g. "the OPENAI_API_KEY
    /// environment variable (config key `model.api_key_env`)".
    pub credential_hint: String,
    /// Retry numbers.
    pub retry: RetryPolicy,
    /// Context-recovery numbers.
    pub recovery: RecoveryPolicy,
    /// The cap on one server-sent event.
    pub max_event_bytes: usize,
    /// The cap on an error response body kept for its message.
    pub max_error_body_bytes: usize,
}

impl AdapterConfig {
    /// OpenAI's public endpoint for `model`, key from the `OPENAI_API_KEY` secret as a
    /// bearer token.
    pub fn openai(model: impl Into<String>) -> AdapterConfig {
        AdapterConfig::with_format(
            WireFormat::OpenAi(OpenAiOptions::new(model)),
            "https://api.openai.com/v1/chat/completions",
            Vec::new(),
            SecretRef {
                name: "OPENAI_API_KEY".into(),
                header: "authorization".into(),
                prefix: "Bearer ".into(),
            },
        )
    }

    /// Anthropic's public endpoint for `model`, key from the `ANTHROPIC_API_KEY` secret in
    /// `x-api-key`.
    pub fn anthropic(model: impl Into<String>) -> AdapterConfig {
        AdapterConfig::with_format(
            WireFormat::Anthropic(AnthropicOptions::new(model)),
            "https://api.anthropic.com/v1/messages",
            vec![(
                "anthropic-version".to_string(),
                anthropic::API_VERSION.to_string(),
            )],
            SecretRef {
                name: "ANTHROPIC_API_KEY".into(),
                header: "x-api-key".into(),
                prefix: String::new(),
            },
        )
    }

    fn with_format(
        format: WireFormat,
        url: &str,
        headers: Vec<(String, String)>,
        secret: SecretRef,
    ) -> AdapterConfig {
        AdapterConfig {
            format,
            url: url.to_string(),
            headers,
            credential_hint: format!(
                "the {} secret (set it in the environment or in keel's secret store)",
                secret.name
            ),
            secret: Some(secret),
            retry: RetryPolicy::default(),
            recovery: RecoveryPolicy::default(),
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_error_body_bytes: 64 * 1024,
        }
    }

    /// Render `req` in this endpoint's dialect.
    pub fn render(&self, req: &RequestView<'_>) -> Result<Rendered, RenderError> {
        let rendering = Rendering::of(&req.messages, |message| self.render_message(message))?;
        Ok(self.assemble(req, &rendering, None)?.0)
    }

    /// Render `req` in this endpoint's dialect; when it names a held conversation instead of
    /// carrying messages, with the messages `cache` rendered before and those `source` reads
    /// since, over the body last sent for it once that is [lent back](ConversationCache::lent_back)
    /// ([`crate::fragments`]).
    pub fn render_held(
        &self,
        req: &RequestView<'_>,
        cache: &mut ConversationCache,
        source: &mut dyn ConversationSource,
    ) -> Result<Rendered, RenderError> {
        let Some((named, held)) = req.held() else {
            return self.render(req);
        };
        if !req.messages.is_empty() {
            return Err(RenderError::Invalid(
                "a request that names a held conversation carries no messages of its own".into(),
            ));
        }
        let (rendering, kept) = cache.rendering(
            &held.keeper,
            &named.session,
            held.revision,
            named.messages,
            source,
            |message| self.render_message(message),
        )?;
        let (rendered, resume) = self.assemble(req, rendering, kept)?;
        cache.sending(resume);
        Ok(rendered)
    }

    /// The parts of the body `message` becomes in this endpoint's dialect.
    fn render_message(&self, message: &MessageView<'_>) -> Result<MessageParts, RenderError> {
        match &self.format {
            WireFormat::OpenAi(_) => openai::render_message(message),
            WireFormat::Anthropic(_) => anthropic::render_message(message),
        }
    }

    /// The body of `req` with `rendering` as its messages, in this endpoint's dialect, over
    /// `kept` where it still holds; and where the next body may pick it up.
    fn assemble(
        &self,
        req: &RequestView<'_>,
        rendering: &Rendering,
        kept: Option<KeptBody>,
    ) -> Result<(Rendered, Resume), RenderError> {
        match &self.format {
            WireFormat::OpenAi(o) => openai::assemble(req, o, rendering, kept),
            WireFormat::Anthropic(o) => anthropic::assemble(req, o, rendering, kept),
        }
    }

    /// A fresh decoder for this endpoint's dialect.
    pub fn decoder(&self, max_tokens: u32) -> Box<dyn StreamDecoder> {
        match &self.format {
            WireFormat::OpenAi(_) => Box::new(openai::Decoder::new(max_tokens)),
            WireFormat::Anthropic(_) => Box::new(anthropic::Decoder::new(max_tokens)),
        }
    }

    /// The HTTP request for `req`, with the given head timeout.
    pub fn http_request(
        &self,
        req: &RequestView<'_>,
        timeout_ms: u64,
    ) -> Result<HttpRequest, RenderError> {
        Ok(self.post(self.render(req)?.body, timeout_ms))
    }

    /// The HTTP request that posts `body`, with the given head timeout.
    pub fn post(&self, body: Vec<u8>, timeout_ms: u64) -> HttpRequest {
        let mut headers = vec![
            ("content-type".to_string(), "application/json".to_string()),
            ("accept".to_string(), "text/event-stream".to_string()),
        ];
        headers.extend(self.headers.iter().cloned());
        HttpRequest {
            method: "POST".into(),
            url: self.url.clone(),
            headers,
            body,
            secret: self.secret.clone(),
            timeout_ms,
        }
    }
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// The provider rejected the credential.
    #[error(
        "the model provider rejected the API key ({}): {hint}. The key is never shown",
        origin(*.status)
    )]
    Authentication {
        /// 401 or 403 (0 for an error inside the stream).
        status: u16,
        /// Where the key comes from.
        hint: String,
    },
    /// A client error that resending cannot fix.
    #[error("the model provider rejected the request ({}): {message}", origin(*.status))]
    Rejected {
        /// The HTTP status (0 for an error inside the stream).
        status: u16,
        /// The API's own message.
        message: String,
    },
    /// Retryable failures outlasted the attempt budget.
    #[error(
        "the model provider kept failing after {attempts} attempt(s); last: {last}; `keel \
         doctor` checks the endpoint and the key"
    )]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The provider refused the request as too long, and the caller compacts
    /// (`compacts_on_overflow`): its message begins with [`keel_protocol::CONTEXT_OVERFLOW`].
    #[error("{} (the provider said, {}: {message})", keel_protocol::CONTEXT_OVERFLOW, origin(*.status))]
    ContextOverflow {
        /// The HTTP status (0 for an error inside the stream).
        status: u16,
        /// The API's own message.
        message: String,
    },
    /// The conversation could not be shrunk enough.
    #[error(transparent)]
    ContextLength(#[from] RecoveryError),
    /// The request could not be rendered.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The stream broke a format rule.
    #[error("the model stream could not be read: {0}")]
    Stream(String),
    /// The transport refused the request or failed in a way not worth retrying.
    #[error(transparent)]
    Transport(TransportError),
}

fn origin(status: u16) -> String {
    if status == 0 {
        "in the stream".to_string()
    } else {
        format!("HTTP {status}")
    }
}

/// One failed attempt, before the policy decides.
enum Failure {
    /// Nothing was received and resending is safe (`wait` false: resend at once).
    Transient { reason: String, wait: bool },
    /// A classified HTTP or in-stream failure.
    Api(ApiFailure),
    /// Fatal.
    Fatal(ModelError),
}

/// Run one model call through `transport`; see the [module documentation](self). `request`
/// is a [`ModelRequest`]'s JSON text, as the `model` service receives it; when it names a
/// conversation the kernel holds, `cache` keeps that conversation's rendering for the next
/// call ([`crate::fragments`]).
pub fn complete<T: Transport + ?Sized>(
    transport: &mut T,
    config: &AdapterConfig,
    cache: &mut ConversationCache,
    request: &str,
    on_delta: &mut dyn FnMut(StreamDelta),
) -> Result<ModelResponse, ModelError> {
    // The request as sent: the caller's text until a recovery step shrinks a copy of it.
    let mut shrunk: Option<String> = None;
    let mut recovery = ContextRecovery::new(config.recovery.clone());
    let mut retries: u32 = 0; // resends of any kind
    let mut failures: u32 = 0; // retryable failures, counted against the attempt budget
    loop {
        let idle = config.retry.idle_timeout_for(retries);
        let text = shrunk.as_deref().unwrap_or(request);
        let req = RequestView::parse(text)?;
        let body = config
            .render_held(&req, cache, &mut Reader(transport))?
            .body;
        let mut http = config.post(body, idle);
        let outcome = attempt(transport, config, &req, &mut http, idle, on_delta);
        cache.lent_back(std::mem::take(&mut http.body));
        let failure = match outcome? {
            Ok(mut response) => {
                response.retries = retries;
                return Ok(response);
            }
            Err(failure) => failure,
        };
        let (reason, wait_ms) = match failure {
            Failure::Fatal(e) => return Err(e),
            Failure::Api(f) if f.class == ErrorClass::Authentication => {
                return Err(ModelError::Authentication {
                    status: f.status,
                    hint: config.credential_hint.clone(),
                });
            }
            // The caller keeps the conversation and compacts it for good; shrinking this one
            // request here would only have the next one refused again.
            Failure::Api(f) if f.class == ErrorClass::ContextLength && req.compacts_on_overflow => {
                return Err(ModelError::ContextOverflow {
                    status: f.status,
                    message: f.message,
                });
            }
            Failure::Api(f) if f.class == ErrorClass::ContextLength => {
                let mut typed: ModelRequest = serde_json::from_str(text)
                    .map_err(|e| RenderError::Invalid(format!("the request: {e}")))?;
                // The shrunk copy carries its messages: read a held conversation whole.
                if let Some(named) = typed.conversation.take()
                    && named.held.is_some()
                {
                    let all = transport
                        .read_conversation(0, named.messages)
                        .map_err(|e| {
                            RenderError::Invalid(format!("cannot read the conversation: {e}"))
                        })?;
                    typed.messages = serde_json::from_str(&all).map_err(|e| {
                        RenderError::Invalid(format!("the conversation's messages: {e}"))
                    })?;
                }
                let what = recovery.step(&mut typed)?;
                shrunk = Some(
                    serde_json::to_string(&typed)
                        .map_err(|e| RenderError::Invalid(format!("the request: {e}")))?,
                );
                (format!("the prompt was too long; {what}"), 0)
            }
            Failure::Api(f) if f.class.is_retryable() => {
                failures += 1;
                let label = match (f.class, f.status) {
                    (ErrorClass::RateLimited, _) => format!("rate limited (HTTP {})", f.status),
                    (_, 0) => format!("provider error in the stream: {}", f.message),
                    _ => format!("provider unavailable (HTTP {})", f.status),
                };
                if !config.retry.may_retry(failures - 1) {
                    return Err(ModelError::RetriesExhausted {
                        attempts: failures,
                        last: label,
                    });
                }
                let unit = transport.random_unit();
                (
                    label,
                    config.retry.delay_ms(failures, f.retry_after_ms, unit),
                )
            }
            Failure::Api(f) => {
                return Err(ModelError::Rejected {
                    status: f.status,
                    message: f.message,
                });
            }
            Failure::Transient { reason, wait } => {
                failures += 1;
                if !config.retry.may_retry(failures - 1) {
                    return Err(ModelError::RetriesExhausted {
                        attempts: failures,
                        last: reason,
                    });
                }
                let wait_ms = if wait {
                    let unit = transport.random_unit();
                    config.retry.backoff_ms(failures, unit)
                } else {
                    0
                };
                (reason, wait_ms)
            }
        };
        retries += 1;
        on_delta(StreamDelta::Retry {
            attempt: retries + 1,
            reason: if wait_ms > 0 {
                format!("{reason}; retrying in {:.1} s", wait_ms as f64 / 1000.0)
            } else {
                format!("{reason}; retrying now")
            },
        });
        if wait_ms > 0 {
            transport.sleep_ms(wait_ms);
        }
    }
}

/// The partial response of an interrupted stream.
fn interrupted(decoder: &mut dyn StreamDecoder, cause: &str) -> ModelResponse {
    let mut response = decoder.finish();
    response.stop_reason = StopReason::Interrupted;
    response.stop_reason_raw = format!("interrupted: {cause}");
    response
}

type Attempt = Result<Result<ModelResponse, Failure>, ModelError>;

fn attempt<T: Transport + ?Sized>(
    transport: &mut T,
    config: &AdapterConfig,
    req: &RequestView<'_>,
    http: &mut HttpRequest,
    idle: u64,
    on_delta: &mut dyn FnMut(StreamDelta),
) -> Attempt {
    let head = match transport.send(http) {
        Ok(head) => head,
        Err(TransportError::TimedOut) => {
            return Ok(Err(Failure::Transient {
                reason: format!("no response within {} s", idle / 1000),
                wait: false,
            }));
        }
        Err(TransportError::Dropped(why)) => {
            return Ok(Err(Failure::Transient {
                reason: format!("the connection failed ({why})"),
                wait: true,
            }));
        }
        Err(e) => return Err(ModelError::Transport(e)),
    };
    if !(200..300).contains(&head.status) {
        let body = read_error_body(transport, idle, config.max_error_body_bytes);
        let now = transport.now_unix_ms();
        return Ok(Err(Failure::Api(classify(
            head.status,
            &head.headers,
            &body,
            now,
        ))));
    }
    let mut parser = SseParser::with_max_event_bytes(config.max_event_bytes);
    let mut decoder = config.decoder(req.max_tokens);
    loop {
        let chunk = match transport.next_chunk(idle) {
            Ok(chunk) => chunk,
            Err(e) => {
                if decoder.received_content() {
                    let cause = match &e {
                        TransportError::TimedOut => {
                            format!("no data for {} s", idle / 1000)
                        }
                        other => other.to_string(),
                    };
                    return Ok(Ok(interrupted(decoder.as_mut(), &cause)));
                }
                return Ok(Err(match e {
                    TransportError::TimedOut => Failure::Transient {
                        reason: format!(
                            "the stream stalled: no data for {} s, nothing received",
                            idle / 1000
                        ),
                        wait: false,
                    },
                    TransportError::Dropped(why) => Failure::Transient {
                        reason: format!("the stream was interrupted ({why}), nothing received"),
                        wait: true,
                    },
                    other => Failure::Fatal(ModelError::Transport(other)),
                }));
            }
        };
        let events = match &chunk {
            Some(bytes) => parser.feed(bytes),
            None => Ok(parser.finish().into_iter().collect()),
        };
        let events = match events {
            Ok(events) => events,
            Err(e) => {
                if decoder.received_content() {
                    return Ok(Ok(interrupted(decoder.as_mut(), &e.to_string())));
                }
                return Ok(Err(Failure::Fatal(ModelError::Stream(e.to_string()))));
            }
        };
        for event in &events {
            match decoder.feed(event) {
                Ok(deltas) => deltas.into_iter().for_each(&mut *on_delta),
                Err(e) => {
                    if decoder.received_content() {
                        return Ok(Ok(interrupted(decoder.as_mut(), &e.to_string())));
                    }
                    return Ok(Err(match e {
                        DecodeError::Provider { kind, message } => {
                            let class = classify_stream_error(&kind, &message);
                            Failure::Api(ApiFailure {
                                class,
                                status: 0,
                                message: if message.is_empty() { kind } else { message },
                                retry_after_ms: None,
                            })
                        }
                        malformed => Failure::Fatal(ModelError::Stream(malformed.to_string())),
                    }));
                }
            }
            if decoder.is_done() {
                // The terminal event proves the stream complete; the rest is not awaited.
                return Ok(Ok(decoder.finish()));
            }
        }
        if chunk.is_none() {
            if decoder.received_content() {
                return Ok(Ok(interrupted(
                    decoder.as_mut(),
                    "the stream ended before its terminal event",
                )));
            }
            return Ok(Err(Failure::Transient {
                reason: "the stream ended before its terminal event, nothing received".into(),
                wait: true,
            }));
        }
    }
}

fn read_error_body<T: Transport + ?Sized>(transport: &mut T, idle: u64, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < max {
        match transport.next_chunk(idle) {
            Ok(Some(chunk)) => {
                let room = max - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}
