//! `[telemetry] otlp-endpoint`: a `keel exec` turn with a tool call, exported over OTLP/HTTP to
//! a loopback receiver that decodes it with the official OpenTelemetry protobuf definitions
//! (`tests/fixtures/otlp_receiver.py`, the `opentelemetry-proto` package); the content rule;
//! the network gate; a collector that never answers.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{keel, scripted_tool_step};

const PROMPT: &str = "prompt-marker-4f1c look at the notes";
const ARGUMENT: &str = "argument-marker-9b2e.txt";
const RESULT: &str = "result-marker-77ad";
const ANSWER: &str = "answer-marker-c3d0";

/// The receiver, running; its output file; killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    fn start() -> Receiver {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("otlp.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/otlp_receiver.py");
        let mut child = Command::new("python3")
            .arg("-u")
            .arg(script)
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 otlp_receiver.py (needs opentelemetry-proto: .ci/setup)");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver's port");
        let port = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the receiver did not start (is opentelemetry-proto installed?): {line:?}")
        });
        Receiver {
            child,
            port,
            out,
            _dir: dir,
        }
    }

    /// What it decoded so far, one value a line.
    fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// Every request body it received, as bytes.
    fn raw(&self) -> Vec<u8> {
        std::fs::read(self.out.with_extension("jsonl.raw")).unwrap_or_default()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A home whose scripted model reads a file (a tool call) and then answers; `extra` is
/// appended to its config. A workspace holding the file.
fn home_and_workspace(extra: &str) -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let home = tempfile::tempdir().expect("home");
    let script = home.path().join("script.toml");
    std::fs::write(
        &script,
        format!(
            "{}[[step]]\ntext = \"{ANSWER}\"\nusage = {{ input_tokens = 1200, output_tokens = 64 }}\n",
            scripted_tool_step(&[("read_file", format!("{{ path = \"{ARGUMENT}\" }}"))])
        ),
    )
    .expect("script");
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n{extra}",
            script.display().to_string()
        ),
    )
    .expect("config");
    let ws = tempfile::tempdir().expect("workspace");
    let path = ws.path().canonicalize().expect("canonical");
    std::fs::write(path.join(ARGUMENT), format!("{RESULT}\n")).expect("file");
    (home, ws, path)
}

/// `[telemetry]` pointing at 127.0.0.1:`port`, with the network policy allowing it when
/// `allowed`.
fn telemetry_config(port: u16, content: bool, allowed: bool) -> String {
    let mut config =
        format!("[telemetry]\notlp-endpoint = \"http://127.0.0.1:{port}\"\ncontent = {content}\n");
    if allowed {
        config.push_str(&format!(
            "[network]\nrules = [{{ host = \"127.0.0.1\", decision = \"allow\" }}]\nallow_private \
             = [\"127.0.0.1:{port}\"]\n"
        ));
    }
    config
}

/// One `keel exec` turn; its stderr and how long it took.
fn exec(home: &Path, ws: &Path) -> (String, Duration) {
    let started = Instant::now();
    let out = keel(home, ws)
        .args(["exec", "--json", "--approval", "auto", PROMPT])
        .timeout(Duration::from_secs(120))
        .output()
        .expect("keel exec");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(ANSWER), "{stdout}");
    (stderr, took)
}

fn spans<'a>(lines: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    lines
        .iter()
        .filter(|l| l["kind"] == "span" && l["name"] == name)
        .collect()
}

fn metric<'a>(lines: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    lines
        .iter()
        .find(|l| l["kind"] == "metric" && l["name"] == name)
}

/// The turn's span, its model calls and its tool call arrive at the receiver, decoded by the
/// official definitions, with one trace id and the turn as their parent; tokens and latencies
/// arrive as metrics; nothing of the prompt, the arguments, the result or the answer leaves.
#[test]
fn a_turn_is_exported_as_linked_spans_and_metrics_without_content() {
    let receiver = Receiver::start();
    let (home, _ws, ws) = home_and_workspace(&telemetry_config(receiver.port, false, true));
    let (stderr, _) = exec(home.path(), &ws);
    assert!(!stderr.contains("telemetry"), "{stderr}");
    let lines = receiver.lines();
    let requests: Vec<_> = lines.iter().filter(|l| l["kind"] == "request").collect();
    assert!(
        requests
            .iter()
            .all(|r| r["content_type"] == "application/x-protobuf"),
        "{requests:?}"
    );

    let turns = spans(&lines, "keel.turn");
    assert_eq!(turns.len(), 1, "{lines:#?}");
    let turn = turns[0];
    assert_eq!(turn["service"], "keel");
    assert_eq!(turn["parent_span_id"], "", "the turn is a root");
    assert_eq!(turn["attributes"]["keel.turn.end"], "completed");
    assert_eq!(turn["attributes"]["keel.turn.model_calls"], 2);
    assert_eq!(turn["attributes"]["keel.turn.tool_calls"], 1);
    let models = spans(&lines, "keel.model.call");
    let tools = spans(&lines, "keel.tool.call");
    assert_eq!(models.len(), 2, "{lines:#?}");
    assert_eq!(tools.len(), 1, "{lines:#?}");
    for child in models.iter().chain(&tools) {
        assert_eq!(child["trace_id"], turn["trace_id"], "{child}");
        assert_eq!(child["parent_span_id"], turn["span_id"], "{child}");
        assert!(
            child["start_ns"].as_u64() >= turn["start_ns"].as_u64(),
            "{child}"
        );
        assert!(
            child["end_ns"].as_u64() <= turn["end_ns"].as_u64(),
            "{child}"
        );
    }
    let tool = tools[0];
    assert_eq!(tool["attributes"]["keel.tool.name"], "read_file");
    assert_eq!(tool["attributes"]["keel.tool.status"], "ok");
    assert_eq!(tool["attributes"]["keel.tool.call_id"], "call_1_1");
    // The model call before the tool ends before the tool starts; the one after it starts
    // after it ends.
    let (first, last) = if models[0]["end_ns"].as_u64() < models[1]["end_ns"].as_u64() {
        (models[0], models[1])
    } else {
        (models[1], models[0])
    };
    assert!(first["end_ns"].as_u64() <= tool["start_ns"].as_u64());
    assert!(last["start_ns"].as_u64() >= tool["end_ns"].as_u64());
    assert_eq!(last["attributes"]["gen_ai.usage.input_tokens"], 1200);
    assert_eq!(last["attributes"]["gen_ai.usage.output_tokens"], 64);

    // Plugin lifecycle: the bundled plugins' loading, and their unloading at exit.
    assert!(
        spans(&lines, "keel.plugin.loaded")
            .iter()
            .any(|s| s["attributes"]["keel.plugin.name"] == "agent-loop"),
        "{lines:#?}"
    );
    assert!(
        !spans(&lines, "keel.plugin.unloaded").is_empty(),
        "{lines:#?}"
    );

    // Metrics.
    let tokens = metric(&lines, "gen_ai.client.token.usage").expect("token metric");
    let output = tokens["points"]
        .as_array()
        .expect("points")
        .iter()
        .find(|p| p["attributes"]["gen_ai.token.type"] == "output")
        .expect("output tokens");
    assert_eq!(output["count"], 2, "{tokens}");
    assert!(output["sum"].as_f64() >= Some(64.0), "{tokens}");
    for name in [
        "keel.turn.duration",
        "keel.model.call.duration",
        "keel.tool.call.duration",
        "keel.plugin.calls",
    ] {
        assert!(metric(&lines, name).is_some(), "{name}: {lines:#?}");
    }

    // No content anywhere in what left, decoded or not.
    let raw = receiver.raw();
    assert!(!raw.is_empty());
    for marker in [PROMPT, ARGUMENT, RESULT, ANSWER] {
        let bytes = marker.as_bytes();
        assert!(
            !raw.windows(bytes.len()).any(|w| w == bytes),
            "`{marker}` was exported without content = true"
        );
    }
}

/// With `content = true` the prompt, the arguments, the result and the answer are on the
/// spans.
#[test]
fn content_is_exported_only_when_asked_for() {
    let receiver = Receiver::start();
    let (home, _ws, ws) = home_and_workspace(&telemetry_config(receiver.port, true, true));
    exec(home.path(), &ws);
    let lines = receiver.lines();
    let turn = spans(&lines, "keel.turn")[0];
    assert_eq!(turn["attributes"]["keel.prompt"], PROMPT);
    let tool = spans(&lines, "keel.tool.call")[0];
    let arguments = tool["attributes"]["keel.tool.arguments"]
        .as_str()
        .expect("arguments");
    assert!(arguments.contains(ARGUMENT), "{arguments}");
    let result = tool["attributes"]["keel.tool.result"]
        .as_str()
        .expect("result");
    assert!(result.contains(RESULT), "{result}");
    assert!(
        spans(&lines, "keel.model.call")
            .iter()
            .any(|m| m["attributes"]["keel.model.text"] == ANSWER),
        "{lines:#?}"
    );
}

/// An endpoint the network policy does not allow: one warning at the start, nothing reaches
/// it, and the session runs as without telemetry.
#[test]
fn an_endpoint_the_network_policy_refuses_gets_nothing_and_one_warning() {
    let receiver = Receiver::start();
    let (home, _ws, ws) = home_and_workspace(&telemetry_config(receiver.port, false, false));
    let (stderr, _) = exec(home.path(), &ws);
    assert!(receiver.lines().is_empty(), "{:?}", receiver.lines());
    assert!(receiver.raw().is_empty());
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("telemetry")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("network policy") && warnings[0].contains("127.0.0.1"),
        "{}",
        warnings[0]
    );
}

/// A collector that accepts the connection and never answers: the exit is late by at most
/// the exporter's bound (2 s; asserted with room for a loaded machine), with one warning.
#[test]
fn a_collector_that_never_answers_delays_the_exit_by_a_bounded_time() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = silent.local_addr().expect("addr").port();
    let (home, _ws, ws) = home_and_workspace("");
    let (_, without) = exec(home.path(), &ws);
    let (home, _ws2, ws) = home_and_workspace(&telemetry_config(port, false, true));
    let (stderr, with) = exec(home.path(), &ws);
    eprintln!("keel exec: {without:?} without telemetry, {with:?} with a silent collector");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("telemetry")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        with < without + Duration::from_secs(6),
        "{with:?} with a silent collector, {without:?} without"
    );
    drop(silent);
}

/// A subagent's turn is a child of the parent's `task` call span, in the parent's trace, and
/// its own model call a child of its turn.
#[test]
fn a_subagents_turn_is_a_child_of_the_tool_call_that_started_it() {
    let receiver = Receiver::start();
    let home = tempfile::tempdir().expect("home");
    let script = home.path().join("script.toml");
    std::fs::write(
        &script,
        format!(
            // The scripted model plays a conversation's steps by its length: the child asks
            // for `task` too (refused: a child has none) and then answers as the parent does.
            "{}[[step]]\ntext = \"{ANSWER}\"\n",
            scripted_tool_step(&[(
                "task",
                "{ description = \"look around\", prompt = \"list nothing\" }".to_owned()
            )])
        ),
    )
    .expect("script");
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n{}",
            script.display().to_string(),
            telemetry_config(receiver.port, false, true)
        ),
    )
    .expect("config");
    let ws = tempfile::tempdir().expect("workspace");
    exec(home.path(), ws.path());
    let lines = receiver.lines();
    let turns = spans(&lines, "keel.turn");
    assert_eq!(turns.len(), 2, "{lines:#?}");
    let (parent, child): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) =
        turns.iter().partition(|t| t["parent_span_id"] == "");
    assert_eq!((parent.len(), child.len()), (1, 1), "{turns:#?}");
    let (parent, child) = (parent[0], child[0]);
    // The parent's `task` call (the child asked for one too, refused).
    let task = spans(&lines, "keel.tool.call")
        .into_iter()
        .find(|t| {
            t["attributes"]["keel.tool.name"] == "task" && t["parent_span_id"] == parent["span_id"]
        })
        .expect("the parent's task call span");
    assert_eq!(task["attributes"]["keel.tool.status"], "ok");
    assert_eq!(child["parent_span_id"], task["span_id"], "{child}");
    assert_eq!(child["trace_id"], parent["trace_id"]);
    assert!(
        child["attributes"]["keel.subagent.child"].is_i64(),
        "{child}"
    );
    let refused = spans(&lines, "keel.tool.call")
        .into_iter()
        .find(|t| t["parent_span_id"] == child["span_id"])
        .expect("the child's own call");
    assert_eq!(refused["attributes"]["keel.tool.status"], "refused");
    assert!(
        refused["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["name"] == "keel.gate.refused")),
        "{refused}"
    );
    assert!(
        spans(&lines, "keel.model.call")
            .iter()
            .any(|m| m["parent_span_id"] == child["span_id"]),
        "the child's model call: {lines:#?}"
    );
}
