//! keel's HTTP proxy: the only way out of a sandboxed command's network namespace
//! ([`super::netns`]). Every connection passes the same network gate as a plugin's request
//! ([`crate::net_client`]): the user's host policy (allow / prompt / deny, a prompt asking the
//! person), refused private and metadata addresses unless named in `allow_private`, the name
//! resolved here and the connection pinned to the checked address, one audit line per
//! connection. The command's environment names the proxy in `HTTP_PROXY`/`HTTPS_PROXY`.
//!
//! Two forms, one request per connection:
//! - `CONNECT host:port` (HTTPS and anything else tunnelled): the tunnel is opened to the
//!   admitted address and bytes are copied both ways; keel never sees inside TLS.
//! - `METHOD http://host[:port]/path` (plain HTTP): the request is sent on to the admitted
//!   address in origin form with `Connection: close`, proxy headers removed.
//!
//! Bounds: the request head at most [`MAX_HEAD`] bytes within [`HEAD_TIMEOUT`], the upstream
//! connection within [`CONNECT_TIMEOUT`], at most [`MAX_CONNECTIONS`] open at once; the proxy
//! lives exactly as long as the command (its deadline bounds every tunnel). A refused
//! connection gets `403` with keel's reason in the body, and the reason is kept for the
//! command's result, so the model learns what the gate refused and why.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::gates::approvals::Approver;
use crate::net_client::NetClient;

/// Largest request head the proxy reads.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send its request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the upstream connection may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen queue.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// Headers that concern only the hop between the command and the proxy.
const HOP_HEADERS: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// The network gate as a sandboxed command meets it.
pub(crate) struct CommandNet<'a> {
    net: &'a NetClient,
    /// The name in audit lines and approval questions: the plugin whose command it is.
    who: String,
    /// The hosts it may reach, as a manifest's `network` list (`*`: what the policy allows).
    declared: Vec<String>,
    approver: Arc<dyn Approver>,
    refused: Mutex<Vec<String>>,
}

impl<'a> CommandNet<'a> {
    /// A command the exec gate let use the network: the user's policy decides every host.
    pub(crate) fn new(net: &'a NetClient, plugin: &str, approver: Arc<dyn Approver>) -> Self {
        CommandNet::limited(
            net,
            format!("{plugin} (sandboxed command)"),
            vec!["*".to_owned()],
            approver,
        )
    }

    /// A process that may reach only `declared` (a process entry's `hosts`), under `who`.
    pub(crate) fn limited(
        net: &'a NetClient,
        who: String,
        declared: Vec<String>,
        approver: Arc<dyn Approver>,
    ) -> Self {
        CommandNet {
            net,
            who,
            declared,
            approver,
            refused: Mutex::new(Vec::new()),
        }
    }

    /// What the gate refused while the command ran, one line each.
    pub(crate) fn refusals(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn note_refusal(&self, text: &str) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        if refused.len() < 16 && !refused.iter().any(|r| r == text) {
            refused.push(text.to_owned());
        }
    }

    async fn admit(&self, method: &str, url: &str) -> Result<Vec<SocketAddr>, String> {
        self.net
            .admit_command(&self.who, &self.declared, method, url, &self.approver)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Serve `listener` until the future is dropped (when the command ends).
pub(crate) async fn serve(listener: TcpListener, gate: &CommandNet<'_>) {
    let mut open = FuturesUnordered::new();
    loop {
        tokio::select! {
            accepted = listener.accept(), if open.len() < MAX_CONNECTIONS => {
                if let Ok((client, _)) = accepted {
                    open.push(handle(client, gate));
                }
            }
            Some(()) = open.next(), if !open.is_empty() => {}
        }
    }
}

/// One request from the command.
async fn handle(mut client: TcpStream, gate: &CommandNet<'_>) {
    let Ok(Ok((head, rest))) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await
    else {
        let _ = respond(
            &mut client,
            400,
            "keel's proxy: no complete request head arrived",
        )
        .await;
        return;
    };
    let Some(request) = Request::parse(&head) else {
        let _ = respond(
            &mut client,
            400,
            "keel's proxy: the request head is malformed",
        )
        .await;
        return;
    };
    let (url, origin_form) = if request.method == "CONNECT" {
        (format!("https://{}/", request.target), None)
    } else if let Ok(url) = url::Url::parse(&request.target)
        && url.scheme() == "http"
    {
        let mut path = url.path().to_owned();
        if let Some(query) = url.query() {
            path.push('?');
            path.push_str(query);
        }
        (request.target.clone(), Some(path))
    } else {
        let _ = respond(
            &mut client,
            400,
            "keel's proxy forwards `http://` URLs and CONNECT tunnels only",
        )
        .await;
        return;
    };
    let addrs = match gate.admit(&request.method, &url).await {
        Ok(addrs) => addrs,
        Err(reason) => {
            gate.note_refusal(&format!("{} {}: {reason}", request.method, request.target));
            let _ = respond(&mut client, 403, &format!("keel's network gate: {reason}")).await;
            return;
        }
    };
    let mut upstream = match connect(&addrs).await {
        Ok(stream) => stream,
        Err(e) => {
            let _ = respond(
                &mut client,
                502,
                &format!("keel's proxy cannot reach {}: {e}", request.target),
            )
            .await;
            return;
        }
    };
    let forwarded = match origin_form {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        Some(path) => {
            let head = request.forwarded_head(&path);
            upstream.write_all(head.as_bytes()).await
        }
    };
    if forwarded.is_err() || upstream.write_all(&rest).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// Connect to the first admitted address that answers.
async fn connect(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::other("no address was admitted");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::from(std::io::ErrorKind::TimedOut),
        }
    }
    Err(last)
}

/// Read up to the blank line ending the head; the head and whatever arrived after it.
async fn read_head(client: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            let head = String::from_utf8(buf).map_err(|_| std::io::ErrorKind::InvalidData)?;
            return Ok((head, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
}

async fn respond(client: &mut TcpStream, status: u16, text: &str) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let body = format!("{text}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

/// A request head as the proxy reads it.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn parse(head: &str) -> Option<Request> {
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let method = first.next()?.to_owned();
        let target = first.next()?.to_owned();
        let version = first.next()?.to_owned();
        let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic());
        if first.next().is_some() || !token(&method) || !version.starts_with("HTTP/1.") {
            return None;
        }
        let mut headers = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':')?;
            if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
                return None;
            }
            headers.push((name.to_owned(), value.trim().to_owned()));
        }
        Some(Request {
            method,
            target,
            version,
            headers,
        })
    }

    /// The head sent on to the origin: origin form, hop headers dropped, one request only.
    fn forwarded_head(&self, path: &str) -> String {
        let mut head = format!("{} {path} {}\r\n", self.method, self.version);
        for (name, value) in &self.headers {
            if !HOP_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        head.push_str("Connection: close\r\n\r\n");
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_request_is_sent_on_in_origin_form_without_proxy_headers() {
        let head = "GET http://example.test:8080/a/b?c=d HTTP/1.1\r\nHost: example.test:8080\r\n\
                    Proxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\n\
                    Accept: */*\r\n\r\n";
        let request = Request::parse(head).expect("parses");
        assert_eq!(request.method, "GET");
        assert_eq!(
            request.forwarded_head("/a/b?c=d"),
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.test:8080\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        for head in [
            "",
            "GET\r\n\r\n",
            "GET / HTTP/2\r\n\r\n",
            "G3T http://x/ HTTP/1.1\r\n\r\n",
            "GET http://x/ HTTP/1.1 extra\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nno colon\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
        ] {
            assert_eq!(Request::parse(head), None, "{head:?}");
        }
    }
}
