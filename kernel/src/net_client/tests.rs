//! The client against loopback servers that write raw HTTP/1.1, so chunking, stalls and drops
//! are under the test's control.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::gates::approvals::{Answer, ApprovalRequest, Approver, DenyAll};
use crate::gates::net_policy::{NetDecision, NetPolicy};

const SECRET: &str = "sk-test-Zq8vR2mN4pL6xT0yW3bK";

/// What the server does on one connection.
#[derive(Clone)]
enum Step {
    Write(Vec<u8>),
    Sleep(u64),
}

fn write(text: &str) -> Step {
    Step::Write(text.as_bytes().to_vec())
}

type Responder = Arc<dyn Fn(usize, &str) -> Vec<Step> + Send + Sync>;

/// A loopback server; records every request's head and body as text.
struct Server {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicUsize>,
}

impl Server {
    async fn start(respond: impl Fn(usize, &str) -> Vec<Step> + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let respond: Responder = Arc::new(respond);
        let (reqs, conns) = (requests.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let n = conns.fetch_add(1, Ordering::SeqCst);
                let (reqs, respond) = (reqs.clone(), respond.clone());
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut stream).await else {
                        return;
                    };
                    reqs.lock().expect("lock").push(request.clone());
                    for step in respond(n, &request) {
                        match step {
                            Step::Write(bytes) => {
                                if stream.write_all(&bytes).await.is_err() {
                                    return;
                                }
                                let _ = stream.flush().await;
                            }
                            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                        }
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        Server {
            port,
            requests,
            connections,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn ok(body: &str) -> Vec<Step> {
    vec![write(&format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ))]
}

fn redirect(location: &str) -> Vec<Step> {
    vec![write(&format!(
        "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    ))]
}

fn star() -> Vec<String> {
    vec![String::from("*")]
}

fn allow_private(endpoints: &[String]) -> NetPolicy {
    let mut policy = NetPolicy::new(NetDecision::Allow);
    for e in endpoints {
        policy = policy.with_allow_private(e).expect("valid entry");
    }
    policy
}

fn client(policy: NetPolicy) -> NetClient {
    NetClient::new(NetConfig {
        policy,
        secrets: Secrets::new(),
        audit_log: None,
    })
}

fn get(url: &str) -> HttpRequest {
    HttpRequest {
        method: "GET".into(),
        url: url.into(),
        headers: Vec::new(),
        secret_headers: Vec::new(),
        body: bytes::Bytes::new(),
        timeout: Duration::from_secs(5),
    }
}

fn deny_all() -> Arc<dyn Approver> {
    Arc::new(DenyAll)
}

async fn read_all(c: &NetClient, plugin: &str, id: u32) -> Result<Vec<u8>, KernelError> {
    let mut body = Vec::new();
    while let Some(chunk) = c.next_chunk(plugin, id, Duration::from_secs(5)).await? {
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn denied(result: Result<(u32, HttpHead), KernelError>) -> String {
    match result {
        Err(KernelError::Denied(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn loopback_needs_allow_private() {
    let server = Server::start(|_, _| ok("hello")).await;
    let refused = client(NetPolicy::new(NetDecision::Allow));
    let m = denied(
        refused
            .send("p", &star(), &[], get(&server.url("/")), deny_all())
            .await,
    );
    assert!(m.contains("loopback"), "{m}");
    assert!(m.contains("allow_private"), "{m}");
    assert_eq!(server.connections(), 0);

    let allowed = client(allow_private(&[server.endpoint()]));
    let (id, head) = allowed
        .send("p", &star(), &[], get(&server.url("/x")), deny_all())
        .await
        .expect("allowed");
    assert_eq!(head.status, 200);
    assert_eq!(head.url, server.url("/x"));
    assert_eq!(read_all(&allowed, "p", id).await.expect("body"), b"hello");
    allowed.close("p", id);
    assert!(
        allowed
            .next_chunk("p", id, Duration::from_millis(10))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_name_is_resolved_by_the_gate_and_pinned() {
    let server = Server::start(|_, _| ok("by name")).await;
    let endpoint = format!("localhost:{}", server.port);
    let url = format!("http://localhost:{}/named", server.port);
    // `localhost` is a local name: refused unless listed exactly, port included.
    let m = denied(
        client(allow_private(&[server.endpoint()]))
            .send("p", &star(), &[], get(&url), deny_all())
            .await,
    );
    assert!(m.contains("localhost"), "{m}");
    // Listed: the gate resolves it (whatever order `127.0.0.1` and `::1` come in) and
    // connects only to what it checked.
    let c = client(allow_private(&[endpoint]));
    let (id, head) = c
        .send("p", &star(), &[], get(&url), deny_all())
        .await
        .expect("resolved and connected");
    assert_eq!(head.status, 200);
    assert_eq!(read_all(&c, "p", id).await.expect("body"), b"by name");
    assert_eq!(server.requests().len(), 1);
    assert!(
        server.requests()[0]
            .to_ascii_lowercase()
            .contains(&format!("host: localhost:{}", server.port)),
        "the Host header keeps the name: {}",
        server.requests()[0]
    );
}

#[tokio::test]
async fn metadata_private_and_mapped_addresses_are_refused() {
    let c = client(NetPolicy::new(NetDecision::Allow));
    for (url, word) in [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://10.1.2.3/", "RFC 1918"),
        ("http://192.168.0.1:8080/", "RFC 1918"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://localhost:11434/", "localhost"),
    ] {
        let m = denied(c.send("p", &star(), &[], get(url), deny_all()).await);
        assert!(m.contains(word), "{url}: {m}");
    }
}

#[tokio::test]
async fn redirects_are_checked_hop_by_hop() {
    let target = Server::start(|_, _| ok("landed")).await;
    let to_target = target.url("/landed");
    let hop = Server::start(move |_, request| {
        if request.starts_with("GET /private") {
            redirect("http://10.0.0.5/admin")
        } else if request.starts_with("GET /loopback-other") {
            redirect("http://127.0.0.1:1/")
        } else {
            redirect(&to_target)
        }
    })
    .await;
    let c = client(allow_private(&[hop.endpoint(), target.endpoint()]));

    let (id, head) = c
        .send("p", &star(), &[], get(&hop.url("/go")), deny_all())
        .await
        .expect("followed");
    assert_eq!(head.status, 200);
    assert_eq!(head.url, target.url("/landed"));
    assert_eq!(read_all(&c, "p", id).await.expect("body"), b"landed");

    let m = denied(
        c.send("p", &star(), &[], get(&hop.url("/private")), deny_all())
            .await,
    );
    assert!(m.contains("redirect refused"), "{m}");
    assert!(m.contains("10.0.0.5"), "{m}");
    let m = denied(
        c.send(
            "p",
            &star(),
            &[],
            get(&hop.url("/loopback-other")),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("127.0.0.1"), "{m}");

    // The redirect target must be declared by the plugin too.
    let only_hop = vec![hop.endpoint()];
    let m = denied(
        c.send("p", &only_hop, &[], get(&hop.url("/go")), deny_all())
            .await,
    );
    assert!(m.contains("does not declare"), "{m}");
    assert_eq!(target.requests().len(), 1);
}

#[tokio::test]
async fn more_than_five_redirects_are_refused() {
    let server = Server::start(|n, _| redirect(&format!("/{}", n + 1))).await;
    let c = client(allow_private(&[server.endpoint()]));
    let m = denied(
        c.send("p", &star(), &[], get(&server.url("/0")), deny_all())
            .await,
    );
    assert!(m.contains("redirect limit"), "{m}");
    // The first request and five followed redirects; the sixth Location is not requested.
    assert_eq!(server.requests().len(), 6);
}

#[tokio::test]
async fn undeclared_hosts_are_refused_naming_the_manifest_line() {
    let server = Server::start(|_, _| ok("x")).await;
    let c = client(allow_private(&[server.endpoint()]));
    let hosts = vec![
        String::from("api.example.com"),
        String::from(".example.org"),
    ];
    let m = denied(
        c.send("p", &hosts, &[], get(&server.url("/")), deny_all())
            .await,
    );
    assert!(
        m.contains(&format!("network = [\"127.0.0.1:{}\"]", server.port)),
        "{m}"
    );
    assert_eq!(server.connections(), 0);
    let exact = vec![server.endpoint()];
    assert!(
        c.send("p", &exact, &[], get(&server.url("/")), deny_all())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_deny_rule_wins() {
    let server = Server::start(|_, _| ok("x")).await;
    let policy = allow_private(&[server.endpoint()])
        .with_rule("127.0.0.1", NetDecision::Allow)
        .and_then(|p| p.with_rule("127.0.0.1", NetDecision::Forbid))
        .expect("rules");
    let m = denied(
        client(policy)
            .send("p", &star(), &[], get(&server.url("/")), deny_all())
            .await,
    );
    assert!(m.contains("deny rule"), "{m}");
    assert_eq!(server.connections(), 0);
}

struct Recording {
    answer: Answer,
    asked: Mutex<Vec<ApprovalRequest>>,
}

impl Approver for Recording {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        self.asked.lock().expect("lock").push(request.clone());
        self.answer
    }
}

#[tokio::test]
async fn prompt_asks_the_approver() {
    let server = Server::start(|_, _| ok("x")).await;
    let policy = NetPolicy::new(NetDecision::Prompt)
        .with_allow_private(&server.endpoint())
        .expect("valid");
    let c = client(policy);

    let no = Arc::new(Recording {
        answer: Answer::Deny,
        asked: Mutex::new(Vec::new()),
    });
    let m = denied(
        c.send("p", &star(), &[], get(&server.url("/")), no.clone())
            .await,
    );
    assert!(m.contains("declined"), "{m}");
    assert_eq!(server.connections(), 0);
    let asked = no.asked.lock().expect("lock").clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].tool, "network");
    assert!(
        asked[0]
            .summary
            .starts_with(&format!("GET 127.0.0.1:{}", server.port)),
        "{}",
        asked[0].summary
    );

    let yes = Arc::new(Recording {
        answer: Answer::Session,
        asked: Mutex::new(Vec::new()),
    });
    for _ in 0..2 {
        let (id, head) = c
            .send("p", &star(), &[], get(&server.url("/")), yes.clone())
            .await
            .expect("approved");
        assert_eq!(head.status, 200);
        c.close("p", id);
    }
    // "Session" is remembered for this plugin and host; another plugin is asked again.
    assert_eq!(yes.asked.lock().expect("lock").len(), 1);
    let m = denied(
        c.send("q", &star(), &[], get(&server.url("/")), no.clone())
            .await,
    );
    assert!(m.contains("declined"), "{m}");
}

/// An origin granted to one plugin: that plugin reaches it (and follows a redirect within it)
/// without a question; another plugin, a sandboxed command, or the same plugin on another
/// port of the host are decided by the policy as it is (here: loopback refused).
#[tokio::test]
async fn an_origin_granted_to_one_plugin_is_reached_by_it_alone() {
    let other = Server::start(|_, _| ok("other port")).await;
    let to_other = other.url("/");
    let server = Server::start(move |_, request| {
        if request.starts_with("GET /elsewhere") {
            redirect(&to_other)
        } else if request.starts_with("GET /moved") {
            redirect("/mcp")
        } else {
            ok("granted")
        }
    })
    .await;
    let policy = NetPolicy::new(NetDecision::Prompt)
        .with_origin_for("mcp", &server.url("/mcp"), true)
        .expect("valid origin");
    let c = client(policy);
    let declared = vec![server.endpoint(), other.endpoint()];

    // Granted: no question (the approver would say no), a redirect within the origin followed.
    let (id, head) = c
        .send(
            "mcp",
            &declared,
            &[],
            get(&server.url("/moved")),
            deny_all(),
        )
        .await
        .expect("granted");
    assert_eq!(head.status, 200);
    assert_eq!(head.url, server.url("/mcp"));
    assert_eq!(read_all(&c, "mcp", id).await.expect("body"), b"granted");

    // Not granted: another plugin, a command, another port, a redirect to another port.
    let m = denied(
        c.send("web", &declared, &[], get(&server.url("/mcp")), deny_all())
            .await,
    );
    assert!(m.contains("loopback"), "{m}");
    let command = c
        .admit_command(
            "mcp (sandboxed command)",
            &star(),
            "GET",
            &server.url("/mcp"),
            &deny_all(),
        )
        .await;
    assert!(command.is_err(), "{command:?}");
    let m = denied(
        c.send("mcp", &declared, &[], get(&other.url("/")), deny_all())
            .await,
    );
    assert!(m.contains("loopback"), "{m}");
    let m = denied(
        c.send(
            "mcp",
            &declared,
            &[],
            get(&server.url("/elsewhere")),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("redirect refused"), "{m}");
    assert_eq!(other.connections(), 0);
    assert_eq!(server.requests().len(), 3, "{:?}", server.requests());
}

#[tokio::test]
async fn error_statuses_are_responses_with_their_body() {
    let body = r#"{"error":{"message":"boom","type":"server_error"}}"#;
    let server = Server::start(move |_, _| {
        vec![write(&format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))]
    })
    .await;
    let c = client(allow_private(&[server.endpoint()]));
    let (id, head) = c
        .send("p", &star(), &[], get(&server.url("/")), deny_all())
        .await
        .expect("a response");
    assert_eq!(head.status, 500);
    assert!(
        head.headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == "application/json")
    );
    assert_eq!(read_all(&c, "p", id).await.expect("body"), body.as_bytes());
}

#[tokio::test]
async fn an_idle_stall_times_out_and_a_slow_head_too() {
    let server = Server::start(|n, _| {
        if n == 0 {
            vec![
                write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"),
                Step::Sleep(3_000),
            ]
        } else {
            vec![Step::Sleep(3_000)]
        }
    })
    .await;
    let c = client(allow_private(&[server.endpoint()]));
    let (id, _) = c
        .send("p", &star(), &[], get(&server.url("/")), deny_all())
        .await
        .expect("head");
    let first = c.next_chunk("p", id, Duration::from_millis(500)).await;
    assert_eq!(first, Ok(Some(b"first".to_vec())));
    let stalled = c.next_chunk("p", id, Duration::from_millis(150)).await;
    assert!(
        matches!(stalled, Err(KernelError::TimedOut(_))),
        "{stalled:?}"
    );

    let mut slow = get(&server.url("/"));
    slow.timeout = Duration::from_millis(150);
    let r = c.send("p", &star(), &[], slow, deny_all()).await;
    assert!(matches!(r, Err(KernelError::TimedOut(_))), "{r:?}");
}

#[tokio::test]
async fn a_dropped_connection_mid_body_is_reported() {
    let server = Server::start(|_, _| {
        vec![write(
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b",
        )]
    })
    .await;
    let c = client(allow_private(&[server.endpoint()]));
    let (id, _) = c
        .send("p", &star(), &[], get(&server.url("/")), deny_all())
        .await
        .expect("head");
    let mut got = Vec::new();
    let error = loop {
        match c.next_chunk("p", id, Duration::from_secs(2)).await {
            Ok(Some(chunk)) => got.extend_from_slice(&chunk),
            Ok(None) => panic!("a cut body must not end cleanly"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, b"only ten b");
    match error {
        KernelError::Unavailable(m) => assert!(m.contains("connection dropped"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn secrets_go_into_the_header_and_nowhere_else() {
    let server = Server::start(|_, request| {
        // Echo the authorization header back, as a careless server might.
        let auth = request
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .unwrap_or("authorization: none")
            .to_owned();
        vec![write(&format!(
            "HTTP/1.1 401 Unauthorized\r\nx-echo: {}\r\ncontent-length: 0\r\n\r\n",
            auth.trim_start_matches(|c| c != ':')
                .trim_start_matches(':')
                .trim()
        ))]
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("net-audit.jsonl");
    let mut secrets = Secrets::new();
    secrets.insert("OPENAI_API_KEY", SECRET, &[server.endpoint()]);
    let c = NetClient::new(NetConfig {
        policy: allow_private(&[server.endpoint()]),
        secrets,
        audit_log: Some(audit.clone()),
    });
    let declared = vec![String::from("OPENAI_API_KEY")];
    let with_secret = |url: &str, secret: &str| {
        let mut r = get(url);
        r.headers
            .push(("authorization".into(), "plugin-made".into()));
        r.secret_headers.push(SecretHeader {
            secret: secret.into(),
            header: "authorization".into(),
            prefix: "Bearer ".into(),
        });
        r
    };

    let (_, head) = c
        .send(
            "p",
            &star(),
            &declared,
            with_secret(&server.url("/v1"), "OPENAI_API_KEY"),
            deny_all(),
        )
        .await
        .expect("sent");
    assert_eq!(head.status, 401);
    let requests = server.requests();
    assert!(
        requests[0].contains(&format!("authorization: Bearer {SECRET}")),
        "{}",
        requests[0]
    );
    assert!(
        !requests[0].contains("plugin-made"),
        "the secret header replaces the plugin's"
    );
    let echo = head
        .headers
        .iter()
        .find(|(n, _)| n == "x-echo")
        .expect("echo");
    assert!(!echo.1.contains(SECRET), "{echo:?}");

    // Not declared in the manifest, or not held: refused, naming where it comes from.
    let m = denied(
        c.send(
            "p",
            &star(),
            &[],
            with_secret(&server.url("/"), "OPENAI_API_KEY"),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("secrets = [\"OPENAI_API_KEY\"]"), "{m}");
    let m = denied(
        c.send(
            "p",
            &star(),
            &[String::from("OTHER_KEY")],
            with_secret(&server.url("/"), "OTHER_KEY"),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("environment variable `OTHER_KEY`"), "{m}");

    // A refused URL carrying the key in its query: the error never shows it.
    let url = format!("http://10.0.0.1/?key={SECRET}");
    let error = c
        .send(
            "p",
            &star(),
            &declared,
            with_secret(&url, "OPENAI_API_KEY"),
            deny_all(),
        )
        .await
        .expect_err("refused");
    assert!(!error.to_string().contains(SECRET), "{error}");

    let log = std::fs::read_to_string(&audit).expect("audit log");
    assert!(!log.contains(SECRET), "{log}");
    assert_eq!(log.lines().count(), 4, "one line per request:\n{log}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&audit)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

/// A plugin allowed a key and allowed a second host still cannot send the key there, directly
/// or through a redirect from the key's own host.
#[tokio::test]
async fn secrets_go_only_to_the_hosts_they_are_bound_to() {
    let thief = Server::start(|_, _| ok("got it")).await;
    let to_thief = thief.url("/collect");
    let api = Server::start(move |_, request| {
        if request.starts_with("GET /bounce") {
            redirect(&to_thief)
        } else {
            ok("api")
        }
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("net-audit.jsonl");
    let mut secrets = Secrets::new();
    secrets.insert("OPENAI_API_KEY", SECRET, &[api.endpoint()]);
    secrets.insert("UNBOUND_KEY", SECRET, &[]);
    let c = NetClient::new(NetConfig {
        policy: allow_private(&[api.endpoint(), thief.endpoint()]),
        secrets,
        audit_log: Some(audit.clone()),
    });
    let declared = vec![String::from("OPENAI_API_KEY"), String::from("UNBOUND_KEY")];
    let with_secret = |url: &str, secret: &str| {
        let mut r = get(url);
        r.secret_headers.push(SecretHeader {
            secret: secret.into(),
            header: "authorization".into(),
            prefix: "Bearer ".into(),
        });
        r
    };

    // To its own host: sent.
    let (id, _) = c
        .send(
            "p",
            &star(),
            &declared,
            with_secret(&api.url("/v1"), "OPENAI_API_KEY"),
            deny_all(),
        )
        .await
        .expect("sent to its host");
    assert_eq!(read_all(&c, "p", id).await.expect("body"), b"api");
    assert!(api.requests()[0].contains(SECRET));

    // To another allowed, declared host: refused before anything is sent, and audited.
    let m = denied(
        c.send(
            "p",
            &star(),
            &declared,
            with_secret(&thief.url("/direct"), "OPENAI_API_KEY"),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("bound to only"), "{m}");
    assert!(m.contains("[secrets] OPENAI_API_KEY = { hosts"), "{m}");
    assert!(thief.requests().is_empty(), "nothing reached the thief");

    // A secret bound to no host goes nowhere, not even to an allowed host.
    let m = denied(
        c.send(
            "p",
            &star(),
            &declared,
            with_secret(&api.url("/v1"), "UNBOUND_KEY"),
            deny_all(),
        )
        .await,
    );
    assert!(m.contains("bound to no host"), "{m}");

    // Through a redirect from the key's host: the hop to the thief carries no secret.
    let (id, _) = c
        .send(
            "p",
            &star(),
            &declared,
            with_secret(&api.url("/bounce"), "OPENAI_API_KEY"),
            deny_all(),
        )
        .await
        .expect("followed without the key");
    assert_eq!(read_all(&c, "p", id).await.expect("body"), b"got it");
    let stolen = thief.requests();
    assert_eq!(stolen.len(), 1);
    assert!(!stolen[0].contains(SECRET), "{}", stolen[0]);
    assert!(
        !stolen[0].to_ascii_lowercase().contains("authorization"),
        "{}",
        stolen[0]
    );

    let log = std::fs::read_to_string(&audit).expect("audit log");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("is not bound to this host"))
            .count(),
        2,
        "{log}"
    );
    assert!(!log.contains(SECRET), "{log}");
}

#[tokio::test]
async fn every_request_and_hop_gets_an_audit_line() {
    let target = Server::start(|_, _| ok("x")).await;
    let to_target = target.url("/");
    let hop = Server::start(move |_, _| redirect(&to_target)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let c = NetClient::new(NetConfig {
        policy: allow_private(&[hop.endpoint(), target.endpoint()]),
        secrets: Secrets::new(),
        audit_log: Some(audit.clone()),
    });
    c.send("model-x", &star(), &[], get(&target.url("/")), deny_all())
        .await
        .expect("direct");
    c.send("model-x", &star(), &[], get(&hop.url("/")), deny_all())
        .await
        .expect("redirected");
    let _ = c
        .send(
            "model-x",
            &star(),
            &[],
            get("http://169.254.169.254/"),
            deny_all(),
        )
        .await;
    let log = std::fs::read_to_string(&audit).expect("audit log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 4, "{log}");
    for line in &lines {
        assert_eq!(line["plugin"], "model-x");
        assert!(
            line["time"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{line}"
        );
    }
    let decisions: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["decision"].as_str())
        .collect();
    assert_eq!(decisions, ["allow", "allow", "allow", "forbid"]);
    assert_eq!(lines[0]["host"], "127.0.0.1");
    assert_eq!(lines[3]["host"], "169.254.169.254");
}

#[tokio::test]
async fn open_bodies_are_bounded_per_plugin() {
    let server = Server::start(|_, _| ok("x")).await;
    let c = client(allow_private(&[server.endpoint()]));
    let mut ids = Vec::new();
    for _ in 0..MAX_OPEN_BODIES {
        let (id, _) = c
            .send("p", &star(), &[], get(&server.url("/")), deny_all())
            .await
            .expect("under the cap");
        ids.push(id);
    }
    let r = c
        .send("p", &star(), &[], get(&server.url("/")), deny_all())
        .await;
    assert!(
        matches!(&r, Err(KernelError::Unavailable(m)) if m.contains("close")),
        "{r:?}"
    );
    // Another plugin has its own budget; closing frees a slot; close_all frees all.
    assert!(
        c.send("q", &star(), &[], get(&server.url("/")), deny_all())
            .await
            .is_ok()
    );
    c.close("p", ids[0]);
    assert!(
        c.send("p", &star(), &[], get(&server.url("/")), deny_all())
            .await
            .is_ok()
    );
    c.close_all("p");
    assert!(
        c.next_chunk("p", ids[1], Duration::from_millis(10))
            .await
            .is_err()
    );
    assert_eq!(c.bodies.open_count("p"), 0);
}

/// For random user policies, secret bindings, manifests and requests: a request reaches a host
/// exactly when the user's policy allows the host, the manifest declares it, and every secret
/// it carries is declared by the manifest and bound to that host.
#[test]
fn no_request_reaches_a_host_or_carries_a_secret_that_was_not_granted() {
    use proptest::prelude::*;
    use proptest::sample::subsequence;
    use proptest::test_runner::{Config, TestRunner};

    const SECRETS: [&str; 2] = ["KEY_ZERO", "KEY_ONE"];
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let servers: Vec<Server> = rt.block_on(async {
        let mut servers = Vec::new();
        for _ in 0..3 {
            servers.push(Server::start(|_, _| ok("reached")).await);
        }
        servers
    });
    let endpoints: Vec<String> = servers.iter().map(Server::endpoint).collect();
    let all = || subsequence((0..3).collect::<Vec<usize>>(), 0..=3);
    let case = (
        all(),
        all(),
        all(),
        all(),
        subsequence(vec![0usize, 1], 0..=2),
        proptest::collection::vec((0..3usize, proptest::option::of(0..2usize)), 1..6),
    );
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    runner
        .run(
            &case,
            |(allowed, declared, bound_zero, bound_one, declared_secrets, attempts)| {
                let pick = |ix: &[usize]| -> Vec<String> {
                    ix.iter().map(|&i| endpoints[i].clone()).collect()
                };
                let mut secrets = Secrets::new();
                secrets.insert(SECRETS[0], SECRET, &pick(&bound_zero));
                secrets.insert(SECRETS[1], SECRET, &pick(&bound_one));
                let bound = [bound_zero.clone(), bound_one.clone()];
                let c = NetClient::new(NetConfig {
                    policy: allow_private(&pick(&allowed)),
                    secrets,
                    audit_log: None,
                });
                let manifest_hosts = pick(&declared);
                let manifest_secrets: Vec<String> = declared_secrets
                    .iter()
                    .map(|&i| SECRETS[i].to_owned())
                    .collect();
                for (target, secret) in attempts {
                    let before = servers[target].requests().len();
                    let mut request = get(&servers[target].url("/probe"));
                    if let Some(s) = secret {
                        request.secret_headers.push(SecretHeader {
                            secret: SECRETS[s].into(),
                            header: "authorization".into(),
                            prefix: "Bearer ".into(),
                        });
                    }
                    let result = rt.block_on(c.send(
                        "p",
                        &manifest_hosts,
                        &manifest_secrets,
                        request,
                        deny_all(),
                    ));
                    if let Ok((id, _)) = &result {
                        rt.block_on(read_all(&c, "p", *id)).expect("body");
                    }
                    let reached = servers[target].requests().len() > before;
                    let granted = allowed.contains(&target)
                        && declared.contains(&target)
                        && secret.is_none_or(|s| {
                            declared_secrets.contains(&s) && bound[s].contains(&target)
                        });
                    prop_assert_eq!(
                        reached,
                        granted,
                        "request to endpoint {} with secret {:?}: {:?}",
                        target,
                        secret,
                        result.err()
                    );
                    if !granted {
                        prop_assert!(result.is_err());
                    }
                }
                Ok(())
            },
        )
        .expect("property");
}

#[tokio::test]
async fn a_body_over_the_request_limit_is_refused_before_anything_is_sent() {
    let server = Server::start(|_, _| ok("hello")).await;
    let c = client(allow_private(&[server.endpoint()]));
    // The plugin's bytes go through the kept buffer as a model adapter's do; one over the
    // client's limit is copied plainly and refused.
    let mut req = get(&server.url("/"));
    req.method = "POST".into();
    req.body = c.request_body(&vec![b'x'; MAX_REQUEST_BODY + 1]);
    match c.send("p", &star(), &[], req, deny_all()).await {
        Err(KernelError::Invalid(m)) => assert!(m.contains("at most"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(server.connections(), 0);

    // At the limit it is sent whole.
    let mut req = get(&server.url("/"));
    req.method = "POST".into();
    req.body = c.request_body(&vec![b'y'; MAX_REQUEST_BODY]);
    let (id, head) = c
        .send("p", &star(), &[], req, deny_all())
        .await
        .expect("sent");
    assert_eq!(head.status, 200);
    assert_eq!(read_all(&c, "p", id).await.expect("body"), b"hello");
}
