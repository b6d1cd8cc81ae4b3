//! What keel adds to an MCP server: one `tools/call` of an `echo` tool sent straight to the
//! server by a bare stdio client, against the same call through keel (the kernel's tool door,
//! the `mcp` plugin, the process door, the server in the OS sandbox), for a minimal server
//! (`fixtures/mcp_echo_minimal.py`, no SDK: what keel adds shows) and one written with the
//! official Python SDK (`fixtures/mcp_misbehaving.py`); and starting the SDK server bare
//! (spawn, `initialize`) against loading the `mcp` plugin, which starts it in the sandbox,
//! initializes and lists its tools.
//!
//! `cargo bench -p keel-tests --bench mcp`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use criterion::Criterion;
use keel_kernel::{GateConfig, ProcessEntry};
use keel_tests::Harness;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

/// The servers measured: (name in the results, fixture file).
const SERVERS: &[(&str, &str)] = &[
    ("minimal", "fixtures/mcp_echo_minimal.py"),
    ("python_sdk", "fixtures/mcp_misbehaving.py"),
];

fn fixture(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(file)
}

/// The server with a bare stdio client: no sandbox, no kernel.
struct Bare {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    next: u64,
}

impl Bare {
    async fn start(file: &str) -> Bare {
        let mut child = tokio::process::Command::new("python3")
            .arg(fixture(file))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the fixture");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut bare = Bare {
            child,
            stdin,
            stdout,
            next: 0,
        };
        bare.request(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"}}),
        )
        .await;
        bare.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        bare
    }

    async fn send(&mut self, message: &serde_json::Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.flush().await.expect("flush");
    }

    async fn request(&mut self, method: &str, params: serde_json::Value) -> String {
        self.next += 1;
        let id = self.next;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await;
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).await.expect("read");
            assert!(!line.is_empty(), "the server ended");
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            if v["id"] == id {
                return line;
            }
        }
    }
}

fn through_keel(dir: &Path, file: &str) -> Harness {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    let ws = ws.canonicalize().expect("canonical");
    let entry = ProcessEntry {
        command: "python3".into(),
        args: vec![fixture(file).display().to_string()],
        // A checkout under `/tmp` is hidden by the sandbox's private `/tmp`.
        read: vec![fixture("fixtures")],
        ..ProcessEntry::default()
    };
    let gates = GateConfig {
        workspace: Some(ws.clone()),
        processes: BTreeMap::from([(
            "mcp".to_owned(),
            BTreeMap::from([("bad".to_owned(), entry)]),
        )]),
        ..GateConfig::locked_down()
    };
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mcp-bench-cache");
    Harness::with_gates(&ws, None, Some(cache), gates).expect("harness")
}

fn calls(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut group = c.benchmark_group("mcp_call");
    for (name, file) in SERVERS {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bare = rt.block_on(Bare::start(file));
        group.bench_function(format!("{name}_bare_client"), |b| {
            b.iter(|| {
                let answer = rt.block_on(bare.request(
                    "tools/call",
                    serde_json::json!({"name": "echo", "arguments": {"text": "hi"}}),
                ));
                assert!(answer.contains("echo: hi"), "{answer}");
            })
        });
        drop(rt.block_on(bare.child.kill()));
        let h = through_keel(dir.path(), file);
        rt.block_on(h.load_bundled("mcp")).expect("mcp loads");
        group.bench_function(format!("{name}_through_keel"), |b| {
            b.iter(|| {
                let answer = rt
                    .block_on(h.kernel.invoke_tool("mcp__bad__echo", r#"{"text":"hi"}"#))
                    .expect("answers");
                assert!(answer.contains("echo: hi"), "{answer}");
            })
        });
        rt.block_on(h.kernel.shutdown()).expect("shutdown");
    }
    group.finish();
}

fn starts(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("mcp_start");
    group.sample_size(10);
    group.bench_function("bare_spawn_and_initialize", |b| {
        b.iter(|| {
            let mut bare = rt.block_on(Bare::start(SERVERS[1].1));
            drop(rt.block_on(bare.child.kill()));
        })
    });
    let h = through_keel(dir.path(), SERVERS[1].1);
    group.bench_function("load_mcp_sandboxed_initialize_and_list", |b| {
        b.iter(|| {
            rt.block_on(h.load_bundled("mcp")).expect("mcp loads");
            rt.block_on(h.kernel.unload("mcp")).expect("unloads");
        })
    });
    group.finish();
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = Criterion::default().configure_from_args();
    calls(&mut c, &rt);
    starts(&mut c, &rt);
    c.final_summary();
}
