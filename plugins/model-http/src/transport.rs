//! [`Transport`] over the kernel-mediated HTTP client of the SDK.
//!
//! Error mapping: the kernel's `timed-out` is [`TransportError::TimedOut`] (the idle
//! watchdog); `unavailable` (a refused or dropped connection, a body cut mid-stream) is
//! [`TransportError::Dropped`]; `denied` (the network gate refused) is
//! [`TransportError::Refused`], never retried; anything else is [`TransportError::Other`].
//!
//! A request whose secret the kernel does not hold ("secret `X` is not set") is sent again
//! without the secret header, and so is every later request of this transport: local
//! servers (Ollama, llama.cpp) need no key, and a hosted API answers 401, which the driver
//! reports naming the secret.
//!
//! Waiting ([`Transport::sleep_ms`]) is `std::thread::sleep`, which on `wasm32-wasip2` blocks
//! in a WASI clock poll. The kernel's CPU meter pauses while the guest waits on WASI (the
//! call's future is pending), so a `Retry-After` wait does not count against the plugin's
//! CPU bound.

use std::hash::{BuildHasher as _, Hasher as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_model_wire::driver::{HttpHead, HttpRequest, Transport, TransportError};
use keel_sdk::KernelError;
use keel_sdk::http::{self, Header, Request, SecretHeader};

/// The driver's transport over [`keel_sdk::http`]. One response body is open at a time: a
/// resource (ABI 0.7.0), released when the next request is sent, at its end, and when the
/// transport is dropped.
#[derive(Debug)]
pub struct SdkTransport {
    body: Option<http::Body>,
    without_secret: bool,
    rng: u64,
}

impl Default for SdkTransport {
    fn default() -> Self {
        SdkTransport::new()
    }
}

impl SdkTransport {
    /// A transport with no open body.
    pub fn new() -> SdkTransport {
        // `RandomState` is seeded from the host's random source (WASI `random` in a guest).
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        SdkTransport {
            body: None,
            without_secret: false,
            rng: hasher.finish() | 1,
        }
    }

    fn close_body(&mut self) {
        // Dropping the body releases it.
        self.body = None;
    }
}

/// The kernel's error as the driver's.
pub fn map_error(error: KernelError) -> TransportError {
    match error {
        KernelError::TimedOut(_) => TransportError::TimedOut,
        KernelError::Unavailable(m) => TransportError::Dropped(m),
        KernelError::Denied(m) => TransportError::Refused(m),
        other => TransportError::Other(other.to_string()),
    }
}

/// Whether `error` says the kernel holds no secret `name`.
pub fn is_missing_secret(error: &KernelError, name: &str) -> bool {
    matches!(error, KernelError::Denied(m) if m.contains(&format!("secret `{name}` is not set")))
}

fn clamp_ms(ms: u64) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

impl Transport for SdkTransport {
    fn send(&mut self, req: &mut HttpRequest) -> Result<HttpHead, TransportError> {
        self.close_body();
        let mut request = Request {
            method: req.method.clone(),
            url: req.url.clone(),
            headers: req
                .headers
                .iter()
                .map(|(name, value)| Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            secret_headers: Vec::new(),
            // Lent to the call (the kernel copies it out of this plugin's memory) and put back.
            body: std::mem::take(&mut req.body),
            timeout_ms: clamp_ms(req.timeout_ms),
        };
        let result = match &req.secret {
            Some(secret) if !self.without_secret => {
                request.secret_headers.push(SecretHeader {
                    secret: secret.name.clone(),
                    header: secret.header.clone(),
                    prefix: secret.prefix.clone(),
                });
                let sent = http::fetch(&request);
                match sent {
                    Err(e) if is_missing_secret(&e, &secret.name) => {
                        keel_sdk::log::info(&format!(
                            "the secret {} is not set; sending requests without it",
                            secret.name
                        ));
                        self.without_secret = true;
                        request.secret_headers.clear();
                        http::fetch(&request)
                    }
                    other => other,
                }
            }
            _ => http::fetch(&request),
        };
        req.body = std::mem::take(&mut request.body);
        let (head, body) = result.map_err(map_error)?;
        self.body = Some(body);
        Ok(HttpHead {
            status: head.status,
            headers: head
                .headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
        })
    }

    fn next_chunk(&mut self, idle_timeout_ms: u64) -> Result<Option<Vec<u8>>, TransportError> {
        let Some(body) = &self.body else {
            return Ok(None);
        };
        match body.next_chunk(clamp_ms(idle_timeout_ms.max(1))) {
            Ok(Some(bytes)) => Ok(Some(bytes)),
            Ok(None) => {
                self.close_body();
                Ok(None)
            }
            Err(e) => Err(map_error(e)),
        }
    }

    fn sleep_ms(&mut self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    fn random_unit(&mut self) -> f64 {
        // xorshift64*: plenty for backoff jitter.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn now_unix_ms(&mut self) -> Option<u64> {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok())
    }

    fn read_conversation(&mut self, from: usize, to: usize) -> Result<String, String> {
        let range = serde_json::to_string(&keel_protocol::ConversationRead { from, to })
            .map_err(|e| e.to_string())?;
        keel_sdk::services::call(keel_protocol::services::CONVERSATION, "read", &range)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_driver_vocabulary() {
        assert_eq!(
            map_error(KernelError::TimedOut("x".into())),
            TransportError::TimedOut
        );
        assert_eq!(
            map_error(KernelError::Unavailable("connection dropped".into())),
            TransportError::Dropped("connection dropped".into())
        );
        assert_eq!(
            map_error(KernelError::Denied("no".into())),
            TransportError::Refused("no".into())
        );
        assert!(matches!(
            map_error(KernelError::Invalid("bad".into())),
            TransportError::Other(m) if m.contains("bad")
        ));
        let missing = KernelError::Denied("secret `OPENAI_API_KEY` is not set: set ...".into());
        assert!(is_missing_secret(&missing, "OPENAI_API_KEY"));
        assert!(!is_missing_secret(&missing, "ANTHROPIC_API_KEY"));
    }

    #[test]
    fn jitter_is_in_the_unit_interval() {
        let mut t = SdkTransport::new();
        for _ in 0..1000 {
            let u = t.random_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
        assert!(t.now_unix_ms().is_some_and(|ms| ms > 1_600_000_000_000));
    }
}
