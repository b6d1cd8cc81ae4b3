//! The exporter's HTTP client: every request to the collector passes the person's network
//! policy as the kernel's own client would judge it ([`NetPolicy::decide_url`] for the URL,
//! [`NetPolicy::check_resolved`] for every address the name resolves to, the connection pinned
//! to the checked address, no redirects followed, no proxy), with one fixed deadline for the
//! whole request. A refusal or a failure is an error the exporter drops its batch on; the
//! person is told once per session, never per batch.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keel_kernel::gates::net_policy::{NetDecision, NetPolicy, NetVerdict};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The most of a collector's answer read (an OTLP answer is a few bytes; a partial-success
/// message a few hundred).
const MAX_ANSWER: usize = 64 * 1024;

/// An [`HttpClient`] that sends only where the network policy allows.
#[derive(Debug)]
pub(super) struct GatedClient {
    policy: Arc<NetPolicy>,
    /// The session's runtime: the SDK's export threads are not tokio threads, so each
    /// request runs there and the export thread waits for its answer.
    runtime: tokio::runtime::Handle,
    /// The deadline of one whole request (resolve, connect, send, answer).
    timeout: Duration,
    /// Whether the person was told that an export failed (once a session).
    warned: AtomicBool,
}

impl GatedClient {
    pub(super) fn new(
        policy: NetPolicy,
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> Self {
        GatedClient {
            policy: Arc::new(policy),
            runtime,
            timeout,
            warned: AtomicBool::new(false),
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for GatedClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let policy = self.policy.clone();
        let timeout = self.timeout;
        let task = self.runtime.spawn(async move {
            match tokio::time::timeout(timeout, send(&policy, request, timeout)).await {
                Ok(sent) => sent,
                Err(_) => Err(format!(
                    "the collector did not answer within {} ms",
                    timeout.as_millis()
                )),
            }
        });
        let sent = match task.await {
            Ok(sent) => sent,
            Err(e) => Err(format!("the export was stopped: {e}")),
        };
        if let Err(e) = &sent
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            stderrln!("warning: telemetry: {e}; spans and metrics of this session may be lost");
        }
        sent.map_err(HttpError::from)
    }
}

/// Why `verdict` (not an allow) refuses the collector at `url`, for a person.
pub(super) fn refusal(verdict: &NetVerdict) -> String {
    let target = match verdict.port {
        Some(port) => format!("{}:{port}", verdict.host),
        None => verdict.host.clone(),
    };
    let what = match verdict.decision {
        NetDecision::Prompt => "needs an approval no one can give to an exporter".to_owned(),
        _ => "is refused".to_owned(),
    };
    let mut words = format!(
        "the network policy {what} for the OTLP endpoint {target} ({})",
        verdict.reason
    );
    if let Some(s) = &verdict.suggestion {
        words.push_str("; ");
        words.push_str(s);
    }
    words
}

/// One request, judged, resolved, checked and pinned, then sent.
async fn send(
    policy: &NetPolicy,
    request: Request<Bytes>,
    timeout: Duration,
) -> Result<Response<Bytes>, String> {
    let url = request.uri().to_string();
    let verdict = policy.decide_url(&url);
    if verdict.decision != NetDecision::Allow {
        return Err(refusal(&verdict));
    }
    let parsed = url::Url::parse(&url).map_err(|e| format!("the OTLP URL is not a URL: {e}"))?;
    let (host, domain) = match parsed.host() {
        Some(url::Host::Domain(d)) => (d.to_owned(), true),
        Some(url::Host::Ipv4(a)) => (a.to_string(), false),
        Some(url::Host::Ipv6(a)) => (a.to_string(), false),
        None => return Err("the OTLP URL names no host".to_owned()),
    };
    let port = parsed
        .port_or_known_default()
        .ok_or("the OTLP URL names no port")?;
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve the OTLP endpoint {host}: {e}"))?
        .map(|a| a.ip())
        .collect();
    let ip = policy
        .check_resolved(&host, port, &addrs)
        .map_err(|r| r.to_string())?;
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(timeout)
        .timeout(timeout);
    if domain {
        // Connect to the address checked above, not to a second lookup's answer.
        client = client.resolve(&host, SocketAddr::new(ip, port));
    }
    let client = client
        .build()
        .map_err(|e| format!("cannot build the OTLP client: {e}"))?;
    let (parts, body) = request.into_parts();
    let mut response = client
        .request(parts.method, parsed)
        .headers(parts.headers)
        .body(body)
        .send()
        .await
        .map_err(|e| {
            format!(
                "cannot reach the OTLP endpoint {host}:{port}: {}",
                chain(&e)
            )
        })?;
    let status = response.status();
    let mut answer = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("the OTLP endpoint's answer broke off: {}", chain(&e)))?
    {
        if answer.len() + chunk.len() > MAX_ANSWER {
            break;
        }
        answer.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(format!("the OTLP endpoint answered {status}"));
    }
    Response::builder()
        .status(status)
        .body(Bytes::from(answer))
        .map_err(|e| e.to_string())
}

/// An error and its causes, one after the other (reqwest's own words name only the URL).
fn chain(e: &dyn std::error::Error) -> String {
    let mut words = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        words.push_str(": ");
        words.push_str(&c.to_string());
        cause = c.source();
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn post(port: u16) -> Request<Bytes> {
        Request::post(format!("http://127.0.0.1:{port}/v1/traces"))
            .body(Bytes::from_static(b"spans"))
            .expect("request")
    }

    /// Each request is judged again, whatever the start allowed: a loopback collector the
    /// policy does not list in `allow_private` is never connected to.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_the_policy_refuses_never_connects() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let port = listener.local_addr().expect("addr").port();
        let policy = NetPolicy::new(NetDecision::Allow);
        let client = GatedClient::new(
            policy,
            tokio::runtime::Handle::current(),
            Duration::from_secs(5),
        );
        let refused = client.send_bytes(post(port)).await.expect_err("refused");
        assert!(refused.to_string().contains("127.0.0.1"), "{refused}");
        // Had it connected, the connection would be waiting already.
        assert!(listener.accept().now_or_never().is_none());
    }

    /// Allowed (`allow_private` names it), the request goes out and the answer comes back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_the_policy_allows_is_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.ends_with(b"spans") {
                let n = conn.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .expect("write");
            seen
        });
        let policy = NetPolicy::new(NetDecision::Allow)
            .with_allow_private(&format!("127.0.0.1:{port}"))
            .expect("allow_private");
        let client = GatedClient::new(
            policy,
            tokio::runtime::Handle::current(),
            Duration::from_secs(5),
        );
        let answer = client.send_bytes(post(port)).await.expect("sent");
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.body().as_ref(), b"ok");
        let seen = String::from_utf8_lossy(&server.await.expect("server")).into_owned();
        assert!(seen.starts_with("POST /v1/traces HTTP/1.1"), "{seen}");
    }
}
