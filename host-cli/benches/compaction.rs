//! What a compaction costs beyond its model call, as a user feels it: the release `keel`
//! resuming a six-turn session (about 9,000 estimated tokens) against a loopback model server
//! that answers every request at once, once under a window the conversation overflows (the
//! first request of the turn is preceded by a compaction) and once under one it fits. The
//! difference between the two launch → first-request times is the compaction: choosing the
//! cut, the transcript, the kernel crossings, the model call's loopback round trip and its
//! parsing (with this instant model, all but nothing of the model's own time), the rewritten
//! conversation and its log entry.
//!
//! `cargo bench -p keel --bench compaction` (release); `KEEL_BENCH_RUNS` sets the runs (12).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use keel_tests::model_server::{ModelServer, Received};
use keel_tests::wire::{oa_answer, oa_tool_call};

mod common;
use common::{millis, report};

const KEY: &str = "sk-bench-0123456789abcdefghijklmnop";
const COMPACTION_MARK: &str = "You are keel's compaction step";

fn is_compaction(r: &Received) -> bool {
    r.body.contains(COMPACTION_MARK)
}

fn config(home: &Path, server: &ModelServer, window: u64) {
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-bench\"\nbase-url = \"{}\"\n\
             context-window = {window}\n",
            server.url("/v1")
        ),
    )
    .expect("config");
}

fn keel(home: &Path, ws: &Path, args: &[&str], stdin: &str) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("OPENAI_API_KEY", KEY)
        .env_remove("KEEL_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keel starts");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("stdin");
    }
    let status = child.wait().expect("keel runs");
    assert!(status.success(), "keel {args:?} failed");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let server = ModelServer::start(|n, r| {
        if is_compaction(r) {
            return oa_answer("SUMMARY: big.txt was read six times; nothing else happened.");
        }
        let last = r.json()["messages"]
            .as_array()
            .and_then(|m| m.last().cloned())
            .unwrap_or_default();
        if last["role"] == "tool" {
            oa_answer("done")
        } else {
            oa_tool_call(&format!("call_{n}"), "read_file", r#"{"path": "big.txt"}"#)
        }
    })
    .await
    .expect("server");
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    std::fs::write(ws.join("big.txt"), "0123456789abcdef\n".repeat(240)).expect("file");
    let base = dir.path().join("base");
    std::fs::create_dir_all(&base).expect("home");
    config(&base, &server, 1_000_000);
    let (b, w) = (base.clone(), ws.clone());
    tokio::task::spawn_blocking(move || {
        keel(
            &b,
            &w,
            &["run"],
            "read 1\nread 2\nread 3\nread 4\nread 5\nread 6\n/exit\n",
        );
    })
    .await
    .expect("join");
    let id = std::fs::read_dir(base.join("data/sessions"))
        .expect("logs")
        .filter_map(Result::ok)
        .find_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".jsonl")
                .map(str::to_owned)
        })
        .expect("a session");

    let (mut plain, mut compacted, mut before_call, mut after_call) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        for compact in [false, true] {
            let home = dir.path().join(format!("run-{i}-{compact}"));
            copy_dir(&base, &home);
            config(&home, &server, if compact { 8000 } else { 1_000_000 });
            let before = server.received().len();
            let started = Instant::now();
            let (h, w, id) = (home.clone(), ws.clone(), id.clone());
            tokio::task::spawn_blocking(move || keel(&h, &w, &["resume", &id, "read 7"], ""))
                .await
                .expect("join");
            let received = server.received();
            let new = &received[before..];
            let first = new.iter().find(|r| !is_compaction(r)).expect("a request");
            if compact {
                let c = new.iter().find(|r| is_compaction(r)).expect("a compaction");
                compacted.push(millis(first.at - started));
                before_call.push(millis(c.at - started));
                after_call.push(millis(first.at - c.at));
            } else {
                assert!(
                    !new.iter().any(is_compaction),
                    "compacted under a large window"
                );
                plain.push(millis(first.at - started));
            }
        }
    }
    println!("compaction, whole process ({runs} runs, loopback model answering at once)");
    report("resume → first request, no compaction", "ms", &mut plain);
    report(
        "resume → first request, compacting first",
        "ms",
        &mut compacted,
    );
    report(
        "  … launch → the compaction's request",
        "ms",
        &mut before_call,
    );
    report(
        "  … the compaction's request → next request",
        "ms",
        &mut after_call,
    );
    let (p, _, _) = common::summary(&mut plain);
    let (c, _, _) = common::summary(&mut compacted);
    println!(
        "{:<44} {:.1} ms",
        "compaction's cost (difference of medians)",
        c - p
    );
}
