//! A loopback HTTP/1.1 server for model adapter tests: it records every request and answers
//! each connection with steps the test chooses — bytes, pauses, a cut connection — so the
//! real OpenAI and Anthropic streaming formats, stalls, drops and error statuses can be
//! played exactly. Binds `127.0.0.1:0`; never touches the internet.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does next on a connection.
#[derive(Debug, Clone)]
pub enum Step {
    /// Write these bytes.
    Write(Vec<u8>),
    /// Wait this many milliseconds.
    Sleep(u64),
    /// Cut the connection now (without finishing the body).
    Drop,
    /// Wait until as many connections as the barrier counts are waiting at it, at most 30
    /// seconds; after that the connection is cut (so a test that needs requests in flight
    /// together fails when they come one after another).
    Barrier(Arc<tokio::sync::Barrier>),
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// `POST`, …
    pub method: String,
    /// The request target, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Headers with lowercase names.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
    /// When the request head was complete.
    pub at: Instant,
}

impl Received {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

type Responder = Arc<dyn Fn(usize, &Received) -> Vec<Step> + Send + Sync>;

/// The running server; it stops with the test's runtime.
pub struct ModelServer {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl ModelServer {
    /// Start a server answering request number `n` (0-based) with `respond(n, &request)`.
    pub async fn start(
        respond: impl Fn(usize, &Received) -> Vec<Step> + Send + Sync + 'static,
    ) -> std::io::Result<ModelServer> {
        ModelServer::start_keeping(true, respond).await
    }

    /// [`start`](Self::start), but [`received`](Self::received) keeps each request without
    /// its body: for a test of a thousand requests of hundreds of kilobytes each, whose
    /// responder looks at each body as it arrives.
    pub async fn start_forgetting_bodies(
        respond: impl Fn(usize, &Received) -> Vec<Step> + Send + Sync + 'static,
    ) -> std::io::Result<ModelServer> {
        ModelServer::start_keeping(false, respond).await
    }

    async fn start_keeping(
        bodies: bool,
        respond: impl Fn(usize, &Received) -> Vec<Step> + Send + Sync + 'static,
    ) -> std::io::Result<ModelServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let received: Arc<Mutex<Vec<Received>>> = Arc::new(Mutex::new(Vec::new()));
        let respond: Responder = Arc::new(respond);
        let log = received.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (log, respond) = (log.clone(), respond.clone());
                tokio::spawn(serve(stream, log, respond, bodies));
            }
        });
        Ok(ModelServer { port, received })
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, as an `allow_private` entry.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    log: Arc<Mutex<Vec<Received>>>,
    respond: Responder,
    bodies: bool,
) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let n = {
        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
        log.push(Received {
            body: if bodies {
                request.body.clone()
            } else {
                String::new()
            },
            ..request.clone()
        });
        log.len() - 1
    };
    for step in respond(n, &request) {
        match step {
            Step::Write(bytes) => {
                if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::Drop => return,
            Step::Barrier(barrier) => {
                if tokio::time::timeout(Duration::from_secs(30), barrier.wait())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    let _ = stream.shutdown().await;
}

async fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let at = Instant::now();
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < end + 4 + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[end + 4..]).into_owned();
    Some(Received {
        method,
        path,
        headers,
        body,
        at,
    })
}

/// The head of a streaming (`text/event-stream`, chunked) 200 response.
pub fn sse_head() -> Step {
    Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
          transfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )
}

/// One HTTP chunk carrying `text`.
pub fn chunk(text: &str) -> Step {
    Step::Write(format!("{:x}\r\n{text}\r\n", text.len()).into_bytes())
}

/// The final zero-length chunk.
pub fn last_chunk() -> Step {
    Step::Write(b"0\r\n\r\n".to_vec())
}

/// A server-sent event with `data` (and `event` when given), as one chunk.
pub fn sse(event: Option<&str>, data: &serde_json::Value) -> Step {
    match event {
        Some(name) => chunk(&format!("event: {name}\ndata: {data}\n\n")),
        None => chunk(&format!("data: {data}\n\n")),
    }
}

/// A complete (non-streaming) response with a JSON body and extra header lines.
pub fn json_response(status: &str, extra_headers: &[(&str, &str)], body: &str) -> Step {
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in extra_headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    Step::Write(head.into_bytes())
}
