//! What subagents cost and whether they run side by side, as a user feels it: the release
//! `keel` running one turn in which the model hands out N `task` calls at once (N = 1, 2, 4);
//! each child reads a file and answers, two model requests. Timed from the parent's first
//! request to its next one (every child done), against a loopback model server that answers
//! each request at once, and again after a fixed 200 ms (a model's latency, which children
//! running side by side overlap). With the instant model the time is keel's own per child:
//! starting an instance, the child's loop, its kernel crossings and tool call.
//!
//! `cargo bench -p keel --bench subagents` (release); `KEEL_BENCH_RUNS` sets the runs (8).

use std::path::Path;
use std::process::{Command, Stdio};

use keel_tests::model_server::{ModelServer, Received, Step};
use keel_tests::wire::{oa_answer, oa_tool_call, oa_tool_calls};
use serde_json::json;

mod common;
use common::{millis, report};

const KEY: &str = "sk-bench-0123456789abcdefghijklmnop";
const CHILD: &str = "You are a subagent of keel";

fn is_child(r: &Received) -> bool {
    r.body.contains(CHILD)
}

fn ends_with_result(r: &Received) -> bool {
    r.json()["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .is_some_and(|m| m["role"] == "tool")
}

/// The parent asks for as many `task` calls as its input says (`children N`).
fn children_asked(r: &Received) -> usize {
    let body = r.json();
    let first = body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user").cloned())
        .unwrap_or_default();
    first["content"]
        .as_str()
        .and_then(|t| t.strip_prefix("children "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1)
}

fn keel(home: &Path, ws: &Path, input: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(["run", input])
        .env("OPENAI_API_KEY", KEY)
        .env_remove("KEEL_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("keel runs");
    assert!(status.success(), "keel failed");
}

async fn measure(latency_ms: u64, runs: usize) {
    let server = ModelServer::start(move |_, r| {
        let mut steps = vec![Step::Sleep(latency_ms)];
        if is_child(r) {
            steps.extend(if ends_with_result(r) {
                oa_answer("found it")
            } else {
                oa_tool_call("c1", "read_file", r#"{"path": "notes.txt"}"#)
            });
            return steps;
        }
        if ends_with_result(r) {
            steps.extend(oa_answer("all done"));
            return steps;
        }
        let n = children_asked(r);
        // Distinct sub-tasks (the loop guard stops identical calls).
        let calls: Vec<(String, String)> = (0..n)
            .map(|i| {
                let args = json!({"description": format!("look {i}"),
                                  "prompt": format!("read notes.txt, part {i}")});
                (format!("call_{i}"), args.to_string())
            })
            .collect();
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(id, args)| (id.as_str(), "task", args.as_str()))
            .collect();
        steps.extend(oa_tool_calls(&calls));
        steps
    })
    .await
    .expect("server");
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    std::fs::write(ws.join("notes.txt"), "the answer is 42\n".repeat(20)).expect("file");
    println!(
        "subagents, whole process ({runs} runs, loopback model answering after {latency_ms} ms)"
    );
    for n in [1usize, 2, 4] {
        let mut spans = Vec::new();
        for i in 0..runs {
            let home = dir.path().join(format!("home-{latency_ms}-{n}-{i}"));
            std::fs::create_dir_all(&home).expect("home");
            std::fs::write(
                home.join("config.toml"),
                format!(
                    "[model]\nprovider = \"openai\"\nmodel = \"gpt-bench\"\nbase-url = \"{}\"\n",
                    server.url("/v1")
                ),
            )
            .expect("config");
            let before = server.received().len();
            let (h, w) = (home.clone(), ws.clone());
            tokio::task::spawn_blocking(move || keel(&h, &w, &format!("children {n}")))
                .await
                .expect("join");
            let received = server.received();
            let parents: Vec<&Received> =
                received[before..].iter().filter(|r| !is_child(r)).collect();
            assert_eq!(parents.len(), 2, "two parent requests");
            let children = received[before..].iter().filter(|r| is_child(r)).count();
            assert_eq!(children, 2 * n, "two requests per child");
            spans.push(millis(parents[1].at - parents[0].at));
        }
        report(
            &format!("{n} child(ren): first request → next request"),
            "ms",
            &mut spans,
        );
    }
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    measure(0, runs).await;
    measure(200, runs).await;
}
