//! The web page in a real headless browser (Debian's chromium, driven over WebDriver by
//! chromedriver): `keel run --web` in a terminal, the page following it live — the plugin
//! graph, a `/reload` arriving without a refresh, an approval answered on the page (and one in
//! the terminal), the timeline — and the door refusing what has no token, a foreign Host or
//! a foreign Origin. Screenshots go to `target/web-screenshots/`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use keel_tests::model_server::{ModelServer, sse_head};
use keel_tests::wire::{oa, oa_done, oa_text};
use serde_json::json;

use crate::common::{home_for, keel_process};

type R = Result<(), Box<dyn std::error::Error>>;

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Result<Driver, Box<dyn std::error::Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| {
                format!("chromedriver did not start ({err}); `.ci/setup` installs chromium-driver")
            })?;
        // It says so on stdout once it listens.
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("started successfully") => break,
                Some(Ok(_)) => {}
                _ => return Err("chromedriver ended before it listened".into()),
            }
        }
        // The rest of what it says is drained so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Driver { child, port })
    }

    async fn browser(&self, profile: &Path) -> Result<Client, Box<dyn std::error::Error>> {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        Ok(ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await?)
    }
}

/// Where screenshots go: beside the build, kept after the run.
fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/web-screenshots");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

async fn screenshot(browser: &Client, name: &str) -> R {
    let png = browser.screenshot().await?;
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(shots().join(name), png)?;
    Ok(())
}

/// The element `css` once it is on the page (at most 30 s).
async fn find(browser: &Client, css: &str) -> Result<fantoccini::elements::Element, String> {
    browser
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .map_err(|err| format!("waiting for `{css}`: {err}"))
}

/// [`find`], and on failure what the page showed and where it was (the failure's context).
async fn find_or_say(browser: &Client, css: &str) -> Result<fantoccini::elements::Element, String> {
    match find(browser, css).await {
        Ok(found) => Ok(found),
        Err(e) => {
            let at = browser
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let text = match browser.find(Locator::Css("body")).await {
                Ok(body) => body.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            Err(format!("{e}\nat {at}, the page said: {text}"))
        }
    }
}

/// Markup a hostile model writes, meant to run in the page.
const HOSTILE: &str = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>";

/// A model that asks to run `touch x1.txt`, then `touch x2.txt`, then answers "Done." with
/// [`HOSTILE`] markup.
async fn two_commands() -> Result<ModelServer, Box<dyn std::error::Error>> {
    Ok(ModelServer::start(move |n, _| {
        if n >= 2 {
            // Markup from the model: the page must show it as text, never run or render it.
            return oa_text(&["Done. ", HOSTILE], "stop");
        }
        let command = format!("touch x{}.txt", n + 1);
        let mut steps = vec![sse_head()];
        steps.push(oa(
            json!({"tool_calls": [{"index": 0, "id": format!("call_{n}"), "type": "function",
                    "function": {"name": "exec_shell",
                                 "arguments": json!({"command": command}).to_string()}}]}),
            None,
        ));
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await?)
}

/// The port of the page's URL.
fn port_of(url: &str) -> Result<u16, Box<dyn std::error::Error>> {
    Ok(url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("no port in {url:?}"))?)
}

/// The one-time code of a URL keel gave (`/?code=…`).
fn code_of(url: &str) -> Result<String, Box<dyn std::error::Error>> {
    Ok(url
        .split_once("?code=")
        .map(|(_, code)| code.trim().to_owned())
        .ok_or_else(|| format!("no code in {url:?}"))?)
}

/// `POST /api/session` with `code`, as the page's first load sends it: the status and body.
fn exchange(
    port: u16,
    code: &str,
    origin: Option<&str>,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let body = json!({ "code": code }).to_string();
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    answer_of(
        port,
        &format!(
            "POST /api/session HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{origin}Content-Type: \
             application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The port of the page's URL and the token its code is exchanged for (the code is spent).
fn port_and_token(url: &str) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let port = port_of(url)?;
    let (status, body) = exchange(
        port,
        &code_of(url)?,
        Some(&format!("http://127.0.0.1:{port}")),
    )?;
    assert_eq!(status, 200, "{body}");
    let token = serde_json::from_str::<serde_json::Value>(&body)?["token"]
        .as_str()
        .ok_or_else(|| format!("no token in {body:?}"))?
        .to_owned();
    Ok((port, token))
}

/// One raw HTTP request to the page's server; the status code and the body.
fn answer_of(port: u16, head: &str) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(head.as_bytes())?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// One raw HTTP request to the page's server; the status code.
fn status_of(port: u16, head: &str) -> Result<u16, Box<dyn std::error::Error>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(head.as_bytes())?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {answer:?}"))?;
    Ok(code)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_follows_a_live_session_and_answers_its_approvals() -> R {
    let server = two_commands().await?;
    let (home, ws) = home_for(&server, "")?;
    let mut cmd = keel_process(home.path(), ws.path());
    cmd.env("OPENAI_API_KEY", "sk-web-0123456789abcdefghijklmnop")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .args(["run", "--web", "--approval", "ask"]);

    // The terminal, driven from its own thread; the test talks to it through channels.
    let (to_term, from_test) = std::sync::mpsc::channel::<(String, Vec<String>)>();
    let (to_test, from_term) = tokio::sync::mpsc::unbounded_channel::<Result<String, String>>();
    let terminal = std::thread::spawn(move || {
        let run = || -> Result<(), String> {
            let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
            term.set_expect_timeout(Some(Duration::from_secs(60)));
            let found = term
                .expect(expectrl::Regex(
                    r"http://127\.0\.0\.1:[0-9]+/\?code=[0-9a-f]{32}",
                ))
                .map_err(e("the page's URL"))?;
            let url = String::from_utf8_lossy(found.get(0).unwrap_or_default()).into_owned();
            term.expect("› ").map_err(e("the prompt"))?;
            let _ = to_test.send(Ok(url));
            // Each order: a line to send (may be empty), then what to wait for, in order.
            while let Ok((send, wait_for)) = from_test.recv() {
                if !send.is_empty() {
                    term.send_line(&send).map_err(e("typing"))?;
                }
                for text in &wait_for {
                    term.expect(text.as_str())
                        .map_err(|err| format!("waiting for {text:?}: {err}"))?;
                }
                let _ = to_test.send(Ok(String::new()));
            }
            Ok(())
        };
        if let Err(err) = run() {
            let _ = to_test.send(Err(err));
        }
    });
    let mut from_term = from_term;
    let url = from_term.recv().await.ok_or("no URL")??;
    let mut order = async |send: &str, wait_for: &[&str]| -> Result<String, String> {
        to_term
            .send((
                send.to_owned(),
                wait_for.iter().map(|s| (*s).to_owned()).collect(),
            ))
            .map_err(e("the terminal thread"))?;
        from_term
            .recv()
            .await
            .unwrap_or(Err("the terminal thread ended".into()))
    };
    let port = port_of(&url)?;
    let driver = Driver::start()?;
    let profile = tempfile::tempdir()?;
    let browser = driver.browser(profile.path()).await?;
    let outcome = async {
        // Without the token, the browser gets the refusal and nothing else.
        browser.goto(&format!("http://127.0.0.1:{port}/")).await?;
        let body = browser.find(Locator::Css("body")).await?.text().await?;
        assert!(body.contains("refused"), "{body}");

        browser.goto(&url).await?;
        find_or_say(&browser, "body[data-ready='1'][data-feed='open']").await?;
        // The code was exchanged at once and left the address bar; the token is the tab's.
        let shown = browser.current_url().await?;
        assert!(!shown.as_str().contains("code="), "{shown}");
        let token = browser
            .execute("return sessionStorage.getItem('keel-token')", vec![])
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(token.len(), 32, "{token}");
        let (status, body) = exchange(
            port,
            &code_of(&url)?,
            Some(&format!("http://127.0.0.1:{port}")),
        )?;
        assert_eq!(status, 403, "the code opens the page once: {body}");
        // A reload keeps the page: the token is kept in the tab, not in the link.
        browser.refresh().await?;
        find_or_say(&browser, "body[data-ready='1'][data-feed='open']").await?;

        // The door, from outside the browser: no token, a rebinding Host, a foreign Origin.
        let get = |path: &str, host: &str, extra: &str| {
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
        };
        let ours = format!("127.0.0.1:{port}");
        assert_eq!(status_of(port, &get("/api/graph", &ours, ""))?, 403);
        assert_eq!(
            status_of(port, &get(&format!("/api/graph?token={token}"), &ours, ""))?,
            200
        );
        assert_eq!(
            status_of(
                port,
                &get(
                    &format!("/api/graph?token={token}"),
                    &format!("evil.example:{port}"),
                    ""
                )
            )?,
            403,
            "a DNS-rebinding Host is refused even with the token"
        );
        assert_eq!(
            status_of(
                port,
                &get(
                    &format!("/api/graph?token={token}"),
                    &ours,
                    "Origin: http://evil.example\r\n"
                )
            )?,
            403,
            "another site's page is refused even with the token"
        );
        let post = format!(
            "POST /api/approvals/1?token={token} HTTP/1.1\r\nHost: {ours}\r\nContent-Length: \
             15\r\nConnection: close\r\n\r\n{{\"answer\":\"y\"}}"
        );
        assert_eq!(status_of(port, &post)?, 403, "a POST without an Origin");

        find(
            &browser,
            "#graph g[data-plugin='agent-loop'][data-state='active']",
        )
        .await?;
        find(&browser, "#graph g[data-plugin='fs-tools']").await?;
        let edges = browser
            .execute(
                "return document.querySelectorAll('#graph path[marker-end]').length",
                vec![],
            )
            .await?;
        assert!(
            edges.as_u64().unwrap_or(0) >= 1,
            "dependency edges drawn: {edges}"
        );
        screenshot(&browser, "graph.png").await?;

        // A mark that a refresh would wipe out.
        browser.execute("window.keelMark = 41;", vec![]).await?;
        order("/reload fs-tools", &["reloaded fs-tools"]).await?;
        let change = find(&browser, "#changes li[data-change='reloaded']").await?;
        let said = change.text().await?;
        assert!(said.contains("fs-tools reloaded"), "{said}");
        let mark = browser.execute("return window.keelMark", vec![]).await?;
        assert_eq!(mark, json!(41), "the page changed without a refresh");
        screenshot(&browser, "after-reload.png").await?;
        // `/web` during the session names the page already served, with a new one-time link.
        let served = format!("http://127.0.0.1:{port}/?code=");
        order("/web", &[served.as_str()]).await?;

        // An approval answered on the page: the terminal says so and the turn goes on.
        browser
            .find(Locator::Css("#tab-approvals"))
            .await?
            .click()
            .await?;
        order(
            "make two files",
            &["wants to run: touch x1.txt", "answer: "],
        )
        .await?;
        let yes = find(&browser, ".approval:not(.answered) button[data-key='y']").await?;
        let wording = browser
            .find(Locator::Css(".approval:not(.answered) pre"))
            .await?
            .text()
            .await?;
        assert!(
            wording.contains("exec_shell wants to run: touch x1.txt")
                && wording.contains("[y] yes, this once"),
            "the terminal's wording: {wording}"
        );
        screenshot(&browser, "approval.png").await?;
        yes.click().await?;
        order(
            "",
            // The terminal's read stays open and takes the next question's answer.
            &[
                "[answered on the web page: yes, this once]",
                "wants to run: touch x2.txt",
            ],
        )
        .await?;
        find(&browser, ".approval[data-answered-by='page']").await?;
        // The next question is answered in the terminal: the page shows who did.
        find(&browser, ".approval:not(.answered) button[data-key='y']").await?;
        order("y", &["Done.", "› "]).await?;
        let by_terminal = find(&browser, ".approval[data-answered-by='terminal']").await?;
        let said = by_terminal.text().await?;
        assert!(
            said.contains("answered in the terminal: yes, this once"),
            "{said}"
        );
        screenshot(&browser, "answered.png").await?;
        // The turn's calls are counted per plugin, with the guest CPU they took.
        browser
            .find(Locator::Css("#tab-plugins"))
            .await?
            .click()
            .await?;
        find(
            &browser,
            "#plugins tr[data-plugin='agent-loop']:not([data-calls='0']):not([data-cpu-us='0'])",
        )
        .await?;
        find(
            &browser,
            "#plugins tr[data-plugin='shell']:not([data-calls='0'])",
        )
        .await?;
        screenshot(&browser, "figures.png").await?;

        // The live timeline: the turn's calls and outcomes arrived as they happened.
        browser
            .find(Locator::Css("#tab-sessions"))
            .await?
            .click()
            .await?;
        find(&browser, "#timeline .row[data-kind='tool_outcome']").await?;
        find(&browser, "#timeline .row[data-kind='turn_ended']").await?;
        // A command's result says where it ran (clicked from the page's own script: the list
        // redraws its rows, so a row found first may be gone by the time it is clicked).
        browser
            .execute(
                "document.querySelector(\"#timeline .row[data-kind='tool_outcome']\").click()",
                vec![],
            )
            .await?;
        let detail = browser.find(Locator::Css("#detail")).await?.text().await?;
        assert!(
            detail.contains("$ touch x1.txt")
                && detail.contains("ran in: bubblewrap workspace-write, no network"),
            "{detail}"
        );
        // The answer streamed into one row, which its message then replaced.
        let rows = browser
            .execute(
                "return [...document.querySelectorAll('#timeline .row')].map(r => \
                 r.dataset.kind + ' ' + r.lastChild.textContent)",
                vec![],
            )
            .await?;
        let rows: Vec<String> = serde_json::from_value(rows)?;
        assert!(
            rows.iter()
                .any(|r| r == &format!("message model: Done. {HOSTILE}")),
            "the markup shown as text: {rows:#?}"
        );
        let ran = browser
            .execute(
                "return [window.pwned === undefined, \
                 document.querySelectorAll('main img, main script').length]",
                vec![],
            )
            .await?;
        assert_eq!(
            ran,
            json!([true, 0]),
            "nothing of the model's markup ran or rendered"
        );
        assert!(
            !rows.iter().any(|r| r.starts_with("streaming")),
            "{rows:#?}"
        );
        let streamed = browser
            .execute(
                "return Number(document.getElementById('timeline').dataset.streamed || 0)",
                vec![],
            )
            .await?;
        assert!(
            streamed.as_u64().unwrap_or(0) >= 1,
            "the answer's text streamed: {streamed}"
        );
        screenshot(&browser, "timeline.png").await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    let _ = browser.close().await;
    order("/exit", &["keel resume"]).await?;
    drop(to_term);
    let _ = terminal.join();
    outcome?;
    assert!(
        ws.path().join("x1.txt").exists(),
        "approved on the page, it ran"
    );
    assert!(
        ws.path().join("x2.txt").exists(),
        "approved in the terminal, it ran"
    );
    Ok(())
}

/// A session log of one prompt and `calls` tool calls, with 2 KB results, as the session-log
/// plugin writes it.
fn long_log(home: &Path, id: &str, calls: usize) -> std::io::Result<()> {
    let dir = home.join("data").join("sessions");
    std::fs::create_dir_all(&dir)?;
    let mut lines = Vec::new();
    let mut push = |event: serde_json::Value| {
        let mut line = event;
        line["seq"] = json!(lines.len());
        line["time_ms"] = json!(1_700_000_000_000u64 + lines.len() as u64 * 7);
        lines.push(line.to_string());
    };
    push(json!({"kind": "session_started", "session": id, "workspace": "/w", "model": "m"}));
    push(json!({"kind": "message", "session": id,
                "message": {"role": "user", "content": [{"type": "text", "text": "read every file"}]}}));
    for i in 0..calls {
        let call = format!("call_{i}");
        push(
            json!({"kind": "message", "session": id, "usage": {"input_tokens": 1000 + i, "output_tokens": 20},
            "message": {"role": "assistant", "content": [{"type": "tool_call", "id": call, "name": "read_file",
                "arguments": json!({"path": format!("f{i}.txt")}).to_string()}]}}),
        );
        push(json!({"kind": "tool_started", "session": id, "calls": [call]}));
        push(
            json!({"kind": "tool_outcome", "session": id, "outcome": {"call_id": call, "tool": "read_file",
            "status": "ok", "content": format!("file {i}: {}", "x".repeat(2000))}}),
        );
        push(
            json!({"kind": "message", "session": id, "message": {"role": "user", "content": [
            {"type": "tool_result", "call_id": call, "content": "…", "is_error": false}]}}),
        );
    }
    push(json!({"kind": "message", "session": id,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "All read."}]}}));
    push(json!({"kind": "turn_ended", "session": id, "end": "completed", "detail": ""}));
    std::fs::write(dir.join(format!("{id}.jsonl")), lines.join("\n") + "\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn keel_web_shows_a_thousand_call_session_in_a_list_that_stays_small() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let id = "20261205-120000-00aa";
    long_log(home.path(), id, 1000)?;
    let mut web = keel_process(home.path(), ws.path())
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .args(["web", "--no-open"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut first = String::new();
    // Held to the end: keel leaves when the reader of its stdout does.
    let mut _stdout = BufReader::new(web.stdout.take().ok_or("no stdout")?);
    _stdout.read_line(&mut first)?;
    let url = first.trim().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/?code="),
        "{url}"
    );

    let driver = Driver::start()?;
    let profile = tempfile::tempdir()?;
    let browser = driver.browser(profile.path()).await?;
    let outcome = async {
        browser.goto(&url).await?;
        find(&browser, "body[data-ready='1'][data-feed='open']").await?;
        browser
            .find(Locator::Css("#tab-sessions"))
            .await?
            .click()
            .await?;
        let began = std::time::Instant::now();
        find(&browser, &format!("#sessions button[data-session='{id}']"))
            .await?
            .click()
            .await?;
        find(&browser, "#timeline[data-rows='2004']").await?;
        eprintln!(
            "a 1,000-call session opened in {} ms (click → rows drawn)",
            began.elapsed().as_millis()
        );
        let drawn = browser
            .execute(
                "return document.querySelectorAll('#timeline .row').length",
                vec![],
            )
            .await?;
        let drawn = drawn.as_u64().unwrap_or(u64::MAX);
        assert!(
            drawn < 80,
            "only the rows in view are drawn, not 2,004: {drawn}"
        );
        // From the keyboard: into the list, End to the last entry, Enter to read it whole.
        browser
            .execute("document.getElementById('timeline').focus()", vec![])
            .await?;
        let list = browser.find(Locator::Css("#timeline")).await?;
        list.send_keys("\u{E010}").await?; // End
        list.send_keys("\u{E007}").await?; // Enter
        find(&browser, "#timeline .row[aria-selected='true']").await?;
        // Read in the page's script: the list redraws its rows as it scrolls, so an element
        // found a moment ago may be gone.
        let kind = browser
            .execute(
                "return document.querySelector(\"#timeline .row[aria-selected='true']\")\
                 .dataset.kind",
                vec![],
            )
            .await?;
        assert_eq!(kind, json!("turn_ended"));
        // …and it is where the list shows it, inside the list's box.
        let inside = browser
            .execute(
                "const r = document.querySelector(\"#timeline .row[aria-selected='true']\")\
                 .getBoundingClientRect(); const b = document.getElementById('timeline')\
                 .getBoundingClientRect(); return r.top >= b.top && r.bottom <= b.bottom + 1;",
                vec![],
            )
            .await?;
        assert_eq!(inside, json!(true), "the last entry is in view");
        let detail = browser.find(Locator::Css("#detail")).await?.text().await?;
        assert_eq!(detail, "completed");
        screenshot(&browser, "long-session.png").await?;
        // Another keel process goes on with the session: its log grows, and so does the page.
        let log = home
            .path()
            .join("data/sessions")
            .join(format!("{id}.jsonl"));
        let mut more = std::fs::OpenOptions::new().append(true).open(&log)?;
        for (seq, event) in [
            json!({"kind": "message", "session": id, "message": {"role": "user",
                   "content": [{"type": "text", "text": "and now?"}]}}),
            json!({"kind": "message", "session": id, "message": {"role": "assistant",
                   "content": [{"type": "text", "text": "Nothing more."}]}}),
            json!({"kind": "turn_ended", "session": id, "end": "completed", "detail": ""}),
        ]
        .into_iter()
        .enumerate()
        {
            let mut line = event;
            line["seq"] = json!(4004 + seq);
            line["time_ms"] = json!(1_800_000_000_000u64);
            writeln!(more, "{line}")?;
        }
        more.sync_all()?;
        find(&browser, "#timeline[data-rows='2007']").await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    let _ = browser.close().await;
    // SIGTERM ends it like Ctrl-C.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(web.id())?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let status = web.wait()?;
    outcome?;
    // It leaves by itself (the page stopped, the kernel shut down), with the status every
    // keel command gives after SIGTERM: 128 + 15.
    assert_eq!(
        status.code(),
        Some(143),
        "`keel web` ends cleanly on SIGTERM: {status}"
    );
    Ok(())
}

/// The page's feed on a raw connection: each `event: approval` asked, once per question.
fn approvals_asked(
    port: u16,
    token: &str,
) -> Result<std::sync::mpsc::Receiver<serde_json::Value>, Box<dyn std::error::Error>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "GET /api/events?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = std::collections::BTreeSet::new();
        let mut lines = BufReader::new(s).lines().map_while(Result::ok);
        while let Some(line) = lines.next() {
            if line != "event: approval" {
                continue;
            }
            let Some(data) = lines.next() else { return };
            let Some(Ok(v)) = data
                .strip_prefix("data: ")
                .map(serde_json::from_str::<serde_json::Value>)
            else {
                return;
            };
            if v["kind"] == "asked" && seen.insert(v["id"].as_u64()) && tx.send(v).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_terminal_the_question_waits_for_the_page() -> R {
    let server = two_commands().await?;
    let (home, ws) = home_for(&server, "")?;
    let mut run = keel_process(home.path(), ws.path())
        .env("OPENAI_API_KEY", "sk-web-0123456789abcdefghijklmnop")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .args(["run", "--web", "--approval", "ask", "make two files"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = BufReader::new(run.stdout.take().ok_or("no stdout")?);
    let mut first = String::new();
    stdout.read_line(&mut first)?;
    let url = first.trim().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "the URL is stdout's first line: {url:?}"
    );
    let (port, token) = port_and_token(&url)?;
    let answer = |id: u64, said: &str| -> Result<u16, Box<dyn std::error::Error>> {
        let body = json!({ "answer": said }).to_string();
        status_of(
            port,
            &format!(
                "POST /api/approvals/{id}?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 Origin: http://127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    // The first question: yes. The second: no, and the model is told what to do instead.
    let asked = approvals_asked(port, &token)?;
    let wait = Duration::from_secs(60);
    let first = asked.recv_timeout(wait)?;
    assert_eq!(first["kind"], "asked");
    assert!(
        first["wording"]
            .as_str()
            .unwrap_or_default()
            .contains("touch x1.txt"),
        "{first}"
    );
    let id = first["id"].as_u64().ok_or("no id")?;
    assert_eq!(answer(id, "y")?, 200);
    assert_eq!(answer(id, "y")?, 409, "a question is answered once");
    let second = asked.recv_timeout(wait)?;
    let id = second["id"].as_u64().ok_or("no id")?;
    assert_eq!(answer(id, "skip the second file")?, 200);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest)?;
    let mut stderr = String::new();
    run.stderr
        .take()
        .ok_or("no stderr")?
        .read_to_string(&mut stderr)?;
    let status = run.wait()?;
    assert!(status.success(), "{status}\n{stderr}");
    assert!(
        stderr.contains("[answered on the web page: yes, this once]")
            && stderr.contains("[answered on the web page: no — skip the second file]"),
        "{stderr}"
    );
    assert!(
        ws.path().join("x1.txt").exists(),
        "approved on the page, it ran"
    );
    assert!(
        !ws.path().join("x2.txt").exists(),
        "refused on the page, it did not"
    );
    Ok(())
}

/// Every process's command line that holds `needle`, as `pid: cmdline`.
fn command_lines_holding(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|p| {
            let line = std::fs::read(p.path().join("cmdline")).ok()?;
            let line = String::from_utf8_lossy(&line).replace('\0', " ");
            line.contains(needle)
                .then(|| format!("{}: {line}", p.file_name().to_string_lossy()))
        })
        .collect()
}

/// `keel web` opening the person's browser: the opener's argv (readable by every local user)
/// holds only a one-time code, the token is in no process's command line, a spent code opens
/// nothing, the door's Host and Origin checks hold for the exchange too, and connections that
/// never show the token are closed — a flood of them under a low descriptor limit does not
/// lock the page out.
#[tokio::test(flavor = "multi_thread")]
async fn the_pages_secret_is_in_no_command_line_and_idle_connections_are_closed() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    // An opener standing for xdg-open: it says where it was sent and its pid, and stays
    // running (its command line readable) until the test ends it.
    let bin = tempfile::tempdir()?;
    let (seen_url, seen_pid) = (bin.path().join("url"), bin.path().join("pid"));
    let hold = bin.path().join("hold");
    nix::unistd::mkfifo(&hold, nix::sys::stat::Mode::S_IRWXU)?;
    let opener = bin.path().join("xdg-open");
    std::fs::write(
        &opener,
        format!(
            "#!/bin/sh\nprintf '%s' \"$1\" > {u}.tmp && mv {u}.tmp {u}\necho $$ > {p}.tmp && mv \
             {p}.tmp {p}\nread _ < {h}\n",
            u = seen_url.display(),
            p = seen_pid.display(),
            h = hold.display()
        ),
    )?;
    std::fs::set_permissions(&opener, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // keel started under a soft limit on descriptors far below the flood below (through the
    // shell's `ulimit`, which then execs it); keel raises it where the hard limit allows.
    let keel = keel_process(home.path(), ws.path());
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("ulimit -S -n 128 && exec \"$@\"")
        .arg("sh")
        .arg(keel.get_program())
        .args(keel.get_args());
    for (key, value) in keel.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    if let Some(dir) = keel.get_current_dir() {
        command.current_dir(dir);
    }
    command
        .env("PATH", path)
        .env("DISPLAY", ":99")
        .env("KEEL_WEB_UNAUTHENTICATED_TIMEOUT_MS", "500")
        .args(["web"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut web = command.spawn()?;
    let mut first = String::new();
    // Held to the end: keel leaves when the reader of its stdout does.
    let mut _stdout = BufReader::new(web.stdout.take().ok_or("no stdout")?);
    _stdout.read_line(&mut first)?;
    let printed = first.trim().to_owned();
    let port = port_of(&printed)?;
    let waited = std::time::Instant::now();
    while !seen_pid.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the opener never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let opener_pid: i32 = std::fs::read_to_string(&seen_pid)?.trim().parse()?;
    let outcome = (|| -> R {
        let opened = std::fs::read_to_string(&seen_url)?;
        let opener_line = std::fs::read(format!("/proc/{opener_pid}/cmdline"))?;
        let opener_line = String::from_utf8_lossy(&opener_line).into_owned();
        assert!(opener_line.contains(&opened), "{opener_line:?}");
        let ours = format!("http://127.0.0.1:{port}");
        // The exchange keeps the door's checks: another site's page, or none, gets nothing.
        let code = code_of(&opened)?;
        assert_eq!(exchange(port, &code, Some("http://127.0.0.1:1"))?.0, 403);
        assert_eq!(
            exchange(port, &code, None)?.0,
            403,
            "a POST must say its Origin"
        );
        let (_, token) = port_and_token(&opened)?;
        assert_eq!(token.len(), 32);
        assert!(
            command_lines_holding(&token).is_empty(),
            "the token is in a command line: {:?}",
            command_lines_holding(&token)
        );
        assert!(!printed.contains(&token) && !opened.contains(&token));
        assert_ne!(
            code_of(&printed)?,
            code,
            "the printed link has its own code"
        );
        assert_eq!(exchange(port, &code, Some(&ours))?.0, 403, "a spent code");
        let (status, body) = exchange(port, &code_of(&printed)?, Some(&ours))?;
        assert_eq!(status, 200, "{body}");

        // A connection that showed the token stays; one that never does is closed.
        let graph = format!(
            "GET /api/graph HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-keel-token: {token}\r\n\r\n"
        );
        let mut kept = TcpStream::connect(("127.0.0.1", port))?;
        kept.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut kept_reader = BufReader::new(kept.try_clone()?);
        let status_line =
            |reader: &mut BufReader<TcpStream>| -> Result<String, Box<dyn std::error::Error>> {
                let mut line = String::new();
                reader.read_line(&mut line)?;
                let mut length = 0usize;
                loop {
                    let mut header = String::new();
                    reader.read_line(&mut header)?;
                    if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse()?;
                    }
                    if header == "\r\n" || header.is_empty() {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body)?;
                Ok(line)
            };
        kept.write_all(graph.as_bytes())?;
        assert!(status_line(&mut kept_reader)?.contains(" 200 "));
        // A flood of silent connections, far above the soft limit keel was started with.
        let mut flood = Vec::new();
        for _ in 0..400 {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => flood.push(s),
                Err(e) => return Err(format!("connect: {e}").into()),
            }
        }
        let mut silent = TcpStream::connect(("127.0.0.1", port))?;
        silent.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut byte = [0u8; 1];
        let closed = match silent.read(&mut byte) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
        assert!(
            closed,
            "a connection that never showed the token was left open"
        );
        // The page still answers, on the kept connection and on a new one.
        kept.write_all(graph.as_bytes())?;
        assert!(status_line(&mut kept_reader)?.contains(" 200 "));
        let fresh = format!(
            "GET /api/graph HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-keel-token: {token}\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(status_of(port, &fresh)?, 200);
        drop(flood);
        Ok(())
    })();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(opener_pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = web.kill();
    let _ = web.wait();
    outcome
}
