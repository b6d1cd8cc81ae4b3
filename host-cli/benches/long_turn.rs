//! The harness gap of a long turn, as a user feels it: the release `keel exec` with one prompt
//! that runs to 510 `read_file` calls of 10 KB files, against a loopback model server that
//! answers every request at once. The gap is the time from the end of one model stream to the
//! head of the next request: the tool call through the gates, the result into the
//! conversation, the kept state and the log, the next request built, rendered and sent.
//! Measured around steps 10, 190 (about 2 MB of history without a window) and 500 (the median
//! of the eleven steps around each), once with a 200k-token window (the turn is compacted
//! inside itself, the history stays under about 650 KB) and once with a window it never fills
//! (the history grows to about 5 MB).
//!
//! Beside the gaps it reports how many times a step copies the history across the plugin
//! boundary: the bytes the kernel counted crossing it during the step (its `keel::boundary`
//! log) over the size of that step's request. The request body itself crosses once, on its
//! way out of the model adapter, so the aim of at most one copy reads as a ratio near 1.
//!
//! `cargo bench -p keel --bench long_turn` (release); one run of each. `KEEL_BENCH_BIN` runs
//! another `keel` binary instead of this build's.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use keel_tests::model_server::ModelServer;
use keel_tests::wire::{oa_answer, oa_tool_call};

mod common;
use common::{millis, report};

const KEY: &str = "sk-bench-0123456789abcdefghijklmnop";
const COMPACTION_MARK: &str = "You are keel's compaction step";
const CALLS: usize = 510;

/// One model request of the turn: when its head arrived, when it was answered, its size.
struct Seen {
    at: Instant,
    answered: Instant,
    bytes: usize,
    /// Compactions answered before it.
    compactions: usize,
}

fn run(window: u64) -> (Vec<Seen>, usize, Vec<u64>) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let compactions = Arc::new(Mutex::new(0usize));
    let (log, count) = (seen.clone(), compactions.clone());
    let server = runtime
        .block_on(ModelServer::start_forgetting_bodies(move |_, r| {
            if r.body.contains(COMPACTION_MARK) {
                *count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                return oa_answer("SUMMARY: the files read so far were all digits.");
            }
            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
            let n = log.len();
            let compactions = *count.lock().unwrap_or_else(PoisonError::into_inner);
            let steps = if n < CALLS {
                oa_tool_call(
                    &format!("call_{n}"),
                    "read_file",
                    &format!(r#"{{"path": "f{n:04}.txt"}}"#),
                )
            } else {
                oa_answer("ALL-READ")
            };
            log.push(Seen {
                at: r.at,
                answered: Instant::now(),
                bytes: r.body.len(),
                compactions,
            });
            steps
        }))
        .expect("server");
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).expect("home");
    std::fs::create_dir_all(&ws).expect("ws");
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-bench\"\nbase-url = \"{}\"\n\
             context-window = {window}\n\n[config.agent-loop]\nmax-steps = 2000\n",
            server.url("/v1")
        ),
    )
    .expect("config");
    let line = format!("{}\n", "0123456789".repeat(10));
    for n in 0..CALLS {
        std::fs::write(ws.join(format!("f{n:04}.txt")), line.repeat(100)).expect("file");
    }
    let crossed = keel(
        &home,
        &ws,
        &[
            "exec",
            "read every file f0000.txt to f0509.txt, one at a time",
        ],
    );
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    let compactions = *compactions.lock().unwrap_or_else(PoisonError::into_inner);
    drop(server);
    drop(runtime);
    (seen, compactions, crossed)
}

/// Run keel; the bytes the kernel counted across the plugin boundary in each step, in order.
fn keel(home: &Path, ws: &Path, args: &[&str]) -> Vec<u64> {
    let out = Command::new(common::keel_binary())
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("OPENAI_API_KEY", KEY)
        .env("KEEL_LOG", "warn,keel::boundary=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("keel runs");
    assert!(out.status.success(), "keel {args:?} failed");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("across the plugin boundary"))
        .filter_map(|l| {
            let at = l.find("bytes=")? + "bytes=".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// How many times step `around`'s request crossed the boundary: what crossed during that step
/// (logged when the next step began) over the request's size.
fn copies_at(seen: &[Seen], crossed: &[u64], around: usize) -> Option<f64> {
    let bytes = seen.get(around)?.bytes as f64;
    let during = *crossed.get(around + 1)? as f64;
    Some(during / bytes)
}

/// The gaps (ms) before requests `around - 5 ..= around + 5`, leaving out any that followed a
/// compaction (that gap holds the compaction's own model call); and the request's size there.
fn gaps_around(seen: &[Seen], around: usize) -> (Vec<f64>, usize) {
    let gaps = (around - 5..=around + 5)
        .filter(|&k| k >= 1 && k < seen.len() && seen[k].compactions == seen[k - 1].compactions)
        .map(|k| millis(seen[k].at.saturating_duration_since(seen[k - 1].answered)))
        .collect();
    (gaps, seen.get(around).map_or(0, |s| s.bytes))
}

fn main() {
    println!("a long turn, whole process ({CALLS} read_file calls of 10 KB, one run each)");
    for (label, window) in [("200k window", 200_000u64), ("no compaction", 100_000_000)] {
        let started = Instant::now();
        let (seen, compactions, crossed) = run(window);
        let took = started.elapsed();
        assert_eq!(seen.len(), CALLS + 1, "every step asked the model");
        println!(
            "{label}: {} requests, {compactions} compactions, {:.1} s in all",
            seen.len(),
            took.as_secs_f64()
        );
        for step in [10, 190, 500] {
            let (mut gaps, bytes) = gaps_around(&seen, step);
            report(
                &format!("  gap at step {step} ({} KB of history)", bytes / 1024),
                "ms",
                &mut gaps,
            );
            match copies_at(&seen, &crossed, step) {
                Some(copies) => println!(
                    "  bytes across the plugin boundary in step {step}: {copies:.2}× its request"
                ),
                None => println!("  (no boundary count for step {step}: the log had none)"),
            }
        }
    }
}
