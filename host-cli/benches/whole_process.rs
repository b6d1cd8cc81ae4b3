//! keel as a user feels it: the real `keel` binary against a loopback model server speaking
//! the OpenAI streaming format, no network. Each figure is the median (and the spread) over
//! repeated whole-process runs:
//!
//! - launch → first model request, with a fresh home (nothing cached) and a warm one;
//! - a one-shot answer, launch to exit, warm;
//! - the harness gap: from the model's request that answers with three parallel `read_file`
//!   calls to the next request (the reads, the gates and the turn's bookkeeping);
//! - the gap around one `read_file` call with no hook and with one no-op `pre-tool-use` hook
//!   (what a hook adds to a tool call: its process started in the OS sandbox);
//! - peak RSS of the process, fresh and warm (`wait4`'s `ru_maxrss`);
//! - the size of the first request's body.
//!
//! `cargo bench -p keel --bench whole_process` (release); `KEEL_BENCH_RUNS` sets the runs per
//! figure (default 12); `KEEL_BENCH_BIN` runs another `keel` binary instead of this build's
//! (an earlier build, measured back to back with this one).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use keel_tests::model_server::{ModelServer, sse_head};
use keel_tests::wire::{oa, oa_done, oa_text};
use serde_json::json;

mod common;
use common::{keel_binary, millis, report};

const KEY: &str = "sk-bench-0123456789abcdefghijklmnop";

/// One run of the binary: when it started, when it ended, its peak RSS in KiB.
struct Run {
    started: Instant,
    ended: Instant,
    max_rss_kib: i64,
}

/// Run `keel exec PROMPT` with `home` and `ws`, waiting for it with `wait4` for its rusage.
fn run_keel(home: &Path, ws: &Path, prompt: &str) -> Run {
    let stderr = std::fs::File::create(home.join("stderr.txt")).expect("stderr file");
    let started = Instant::now();
    let child = Command::new(keel_binary())
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(["exec", "--approval", "never", prompt])
        .env("OPENAI_API_KEY", KEY)
        .env_remove("KEEL_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("keel starts");
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for the child we spawned, once.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: nix::libc::rusage = std::mem::zeroed();
        let waited = nix::libc::wait4(pid, &mut status, 0, &mut usage);
        assert_eq!(waited, pid, "wait4 failed");
        usage
    };
    let ended = Instant::now();
    // The child was reaped by wait4; dropping the handle does not wait again.
    std::mem::forget(child);
    assert!(
        nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
        "keel exited with status {}: {}",
        nix::libc::WEXITSTATUS(status),
        std::fs::read_to_string(home.join("stderr.txt")).unwrap_or_default()
    );
    Run {
        started,
        ended,
        max_rss_kib: usage.ru_maxrss,
    }
}

fn config(home: &Path, server: &ModelServer) {
    std::fs::create_dir_all(home).expect("home");
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-bench\"\nbase-url = \"{}\"\n",
            server.url("/v1")
        ),
    )
    .expect("config");
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    for (name, text) in [
        ("a.txt", "alpha\n"),
        ("b.txt", "beta\n"),
        ("c.txt", "gamma\n"),
    ] {
        std::fs::write(ws.join(name), text).expect("file");
    }

    // A one-shot answer: text, then stop.
    let answer = ModelServer::start(|_, _| oa_text(&["Hello", " there."], "stop"))
        .await
        .expect("server");
    let blocking = |home: std::path::PathBuf, ws: std::path::PathBuf, prompt: &'static str| {
        tokio::task::spawn_blocking(move || run_keel(&home, &ws, prompt))
    };

    let (mut first_cold, mut rss_cold) = (Vec::new(), Vec::new());
    let mut request_bytes = 0usize;
    for i in 0..runs {
        let home = dir.path().join(format!("cold-{i}"));
        config(&home, &answer);
        let before = answer.received().len();
        let run = blocking(home.clone(), ws.clone(), "Say hello.")
            .await
            .expect("join");
        let received = answer.received();
        let first = &received[before];
        request_bytes = first.body.len();
        first_cold.push(millis(first.at - run.started));
        rss_cold.push(run.max_rss_kib as f64 / 1024.0);
        let _ = std::fs::remove_dir_all(&home);
    }

    let warm_home = dir.path().join("warm");
    config(&warm_home, &answer);
    blocking(warm_home.clone(), ws.clone(), "Say hello.")
        .await
        .expect("warm-up");
    let (mut first_warm, mut total_warm, mut rss_warm) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let before = answer.received().len();
        let run = blocking(warm_home.clone(), ws.clone(), "Say hello.")
            .await
            .expect("join");
        let received = answer.received();
        first_warm.push(millis(received[before].at - run.started));
        total_warm.push(millis(run.ended - run.started));
        rss_warm.push(run.max_rss_kib as f64 / 1024.0);
    }

    // Three parallel reads, then the answer: the gap between the two requests.
    let reads = ModelServer::start(|n, _| {
        if n % 2 == 1 {
            return oa_text(&["Read", " them."], "stop");
        }
        let mut steps = vec![sse_head()];
        for (i, file) in ["a.txt", "b.txt", "c.txt"].iter().enumerate() {
            steps.push(oa(
                json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function",
                        "function": {"name": "read_file",
                                     "arguments": json!({"path": file}).to_string()}}]}),
                None,
            ));
        }
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await
    .expect("server");
    let reads_home = dir.path().join("reads");
    config(&reads_home, &reads);
    blocking(reads_home.clone(), ws.clone(), "Read the files.")
        .await
        .expect("warm-up");
    let mut gap = Vec::new();
    for _ in 0..runs {
        let before = reads.received().len();
        blocking(reads_home.clone(), ws.clone(), "Read the files.")
            .await
            .expect("join");
        let received = reads.received();
        gap.push(millis(received[before + 1].at - received[before].at));
    }

    // One read_file call, then the answer: the gap between the two requests with no hook and
    // with one no-op pre-tool-use hook (`true`, started in the OS sandbox for the call).
    let one_read = ModelServer::start(|n, _| {
        if n % 2 == 1 {
            return oa_text(&["Read", " it."], "stop");
        }
        let mut steps = vec![sse_head()];
        steps.push(oa(
            json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                    "function": {"name": "read_file",
                                 "arguments": json!({"path": "a.txt"}).to_string()}}]}),
            None,
        ));
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await
    .expect("server");
    let mut hook_gaps = Vec::new();
    for (name, hooks) in [
        ("no hook", ""),
        (
            "one no-op hook",
            "[[hooks.pre-tool-use]]\nmatcher = \"read_file\"\ncommand = \"true\"\n",
        ),
    ] {
        let home = dir.path().join(format!("hooks-{}", hook_gaps.len()));
        config(&home, &one_read);
        let mut text = std::fs::read_to_string(home.join("config.toml")).expect("config");
        text.push_str(hooks);
        std::fs::write(home.join("config.toml"), text).expect("config");
        blocking(home.clone(), ws.clone(), "Read the file.")
            .await
            .expect("warm-up");
        let mut gap = Vec::new();
        for _ in 0..runs {
            let before = one_read.received().len();
            blocking(home.clone(), ws.clone(), "Read the file.")
                .await
                .expect("join");
            let received = one_read.received();
            gap.push(millis(received[before + 1].at - received[before].at));
        }
        hook_gaps.push((name, gap));
    }

    println!("keel, whole process ({runs} runs per figure, loopback model server)");
    report(
        "launch → first model request, fresh home",
        "ms",
        &mut first_cold,
    );
    report("launch → first model request, warm", "ms", &mut first_warm);
    report(
        "one-shot answer, launch to exit, warm",
        "ms",
        &mut total_warm,
    );
    report("harness gap after 3 parallel reads, warm", "ms", &mut gap);
    for (name, gap) in &mut hook_gaps {
        report(&format!("one read_file call, {name}, warm"), "ms", gap);
    }
    report("peak RSS, fresh home", "MiB", &mut rss_cold);
    report("peak RSS, warm", "MiB", &mut rss_warm);
    println!("{:<44} {request_bytes} bytes", "first request body");
}
