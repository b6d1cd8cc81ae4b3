//! What a turn through `keel acp` adds over the same turn in `keel exec`: the real binary
//! against a loopback model server speaking the OpenAI streaming format (one text answer), no
//! network.
//!
//! Both are timed from the moment the model server received the turn's request to the moment
//! the turn's end is visible to whoever drives keel: for `keel exec --json` the `turn.report`
//! line on its stdout, for `keel acp` the `session/prompt` response (every update of the turn
//! was sent before it). The model's answer, the agent loop and the session log are the same in
//! both, and each is the first turn of a fresh process (`keel exec` is one); the difference is
//! what the editor path adds (the events put into ACP's updates, the JSON-RPC lines, the
//! turn's own bookkeeping), aimed at ≤ 1 ms. A warm ACP session's turns (the same tail, and
//! prompt sent → answer) are shown too.
//!
//! `cargo bench -p keel --bench acp_turn` (release); `KEEL_BENCH_RUNS` sets the runs per
//! figure (default 30).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use keel_tests::model_server::ModelServer;
use keel_tests::wire::oa_text;
use serde_json::{Value, json};

mod common;
use common::{millis, report, summary};

const KEY: &str = "sk-bench-0123456789abcdefghijklmnop";

fn keel(home: &Path, ws: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
    cmd.arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .env("OPENAI_API_KEY", KEY)
        .env_remove("KEEL_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

/// One `keel exec --json` turn: when its `turn.report` line was read.
fn exec_turn(home: &Path, ws: &Path) -> Instant {
    let mut child = keel(home, ws)
        .args(["exec", "--json", "--approval", "never", "Say hello."])
        .stdin(Stdio::null())
        .spawn()
        .expect("keel exec starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut ended = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("stdout line");
        if ended.is_none() && line.contains("\"topic\":\"turn.report\"") {
            ended = Some(Instant::now());
        }
    }
    let status = child.wait().expect("keel exec ends");
    assert!(status.success(), "keel exec failed: {status}");
    ended.expect("keel exec printed its turn report")
}

/// A `keel acp` process driven by raw JSON-RPC lines.
struct Acp {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::Lines<BufReader<std::process::ChildStdout>>,
    next_id: u64,
}

impl Acp {
    fn start(home: &Path, ws: &Path) -> Acp {
        let mut child = keel(home, ws)
            .args(["acp", "--approval", "never"])
            .spawn()
            .expect("keel acp starts");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Acp {
            child,
            input,
            output,
            next_id: 0,
        }
    }

    /// Send request `method`; its result, once its answer arrives (notifications skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.input, "{line}").expect("write to keel acp");
        self.input.flush().expect("flush");
        loop {
            let line = self
                .output
                .next()
                .expect("keel acp answered")
                .expect("stdout line");
            let message: Value = serde_json::from_str(&line).expect("JSON from keel acp");
            if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
        }
    }
}

impl Drop for Acp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    let ws = ws.canonicalize().expect("canonical workspace");
    let server = ModelServer::start(|_, _| oa_text(&["Hello", " there."], "stop"))
        .await
        .expect("server");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-bench\"\nbase-url = \"{}\"\n",
            server.url("/v1")
        ),
    )
    .expect("config");

    let server = std::sync::Arc::new(server);

    // keel exec: one process a turn; a warm-up first.
    let mut exec = Vec::new();
    for i in 0..=runs {
        let before = server.received().len();
        let (h, w) = (home.clone(), ws.clone());
        let ended = tokio::task::spawn_blocking(move || exec_turn(&h, &w))
            .await
            .expect("join");
        if i > 0 {
            exec.push(millis(ended - server.received()[before].at));
        }
    }

    // keel acp, as exec runs: a fresh process for one turn (initialize, session/new, the
    // prompt); then a warm session, a turn a prompt. A warm-up first in each.
    let s = server.clone();
    let (mut acp_cold, mut acp_warm, mut acp_turns) = tokio::task::spawn_blocking(move || {
        let prompt = |acp: &mut Acp, session: &Value| {
            let before = s.received().len();
            let sent = Instant::now();
            let answer = acp.call(
                "session/prompt",
                json!({"sessionId": session,
                       "prompt": [{"type": "text", "text": "Say hello."}]}),
            );
            let ended = Instant::now();
            assert_eq!(answer["stopReason"], "end_turn", "{answer}");
            (
                millis(ended - s.received()[before].at),
                millis(ended - sent),
            )
        };
        let open = |acp: &mut Acp| {
            acp.call("initialize", json!({"protocolVersion": 1}));
            acp.call("session/new", json!({"cwd": ws, "mcpServers": []}))["sessionId"].clone()
        };
        let mut cold = Vec::new();
        for i in 0..=runs {
            let mut acp = Acp::start(&home, &ws);
            let session = open(&mut acp);
            let (tail, _) = prompt(&mut acp, &session);
            if i > 0 {
                cold.push(tail);
            }
        }
        let mut acp = Acp::start(&home, &ws);
        let session = open(&mut acp);
        let (mut tails, mut turns) = (Vec::new(), Vec::new());
        for i in 0..=runs {
            let (tail, turn) = prompt(&mut acp, &session);
            if i > 0 {
                tails.push(tail);
                turns.push(turn);
            }
        }
        (cold, tails, turns)
    })
    .await
    .expect("join");

    println!("keel acp against keel exec ({runs} turns each, loopback model server)");
    let (exec_median, _, _) = summary(&mut exec);
    let (acp_median, _, _) = summary(&mut acp_cold);
    report("exec: model request → turn report line", "ms", &mut exec);
    report(
        "acp, fresh process: request → prompt answer",
        "ms",
        &mut acp_cold,
    );
    println!(
        "{:<44} {:>+9.2} ms (aim ≤ 1 ms)",
        "added by ACP (difference of medians)",
        acp_median - exec_median
    );
    report(
        "acp, warm session: request → prompt answer",
        "ms",
        &mut acp_warm,
    );
    report("acp, warm session: whole turn", "ms", &mut acp_turns);
}
