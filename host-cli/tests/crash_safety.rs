//! Nothing lost: sessions after a crash. The real `keel` binary against a loopback model
//! server that checks every request as strictly as the providers do (each tool call answered
//! in the very next message, each result after its call; otherwise `400`, as OpenAI and
//! Anthropic answer) — killed with SIGKILL at seeded random points of a session, stopped with
//! SIGTERM and SIGHUP, and run with its sessions folder on a full disk. After each, the
//! session resumes into requests the server accepts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_tests::model_server::{ModelServer, Received, json_response};
use keel_tests::wire::{an_answer, an_tool_call, oa_answer, oa_tool_call, oa_tool_calls};
use serde_json::Value;

use crate::common::{Wire, homes_for_server, keel, keel_process, session_ids};

type R = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "sk-crash-0123456789abcdefghijklmnop";

/// The calls of a message and the results it carries, in one wire's shape.
fn calls_and_results(wire: Wire, m: &Value) -> (Vec<String>, Vec<String>) {
    let ids = |v: &Value, key: &str| v[key].as_str().unwrap_or_default().to_owned();
    match wire {
        Wire::OpenAi => {
            let calls = m["tool_calls"]
                .as_array()
                .map(|c| c.iter().map(|c| ids(c, "id")).collect())
                .unwrap_or_default();
            let results = if m["role"] == "tool" {
                vec![ids(m, "tool_call_id")]
            } else {
                Vec::new()
            };
            (calls, results)
        }
        Wire::Anthropic => {
            let blocks = m["content"].as_array().cloned().unwrap_or_default();
            let calls = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| ids(b, "id"))
                .collect();
            let results = blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| ids(b, "tool_use_id"))
                .collect();
            (calls, results)
        }
    }
}

/// What the providers insist on: every tool call is answered before anything else is said
/// (OpenAI: `tool` messages right after the assistant's; Anthropic: `tool_result` blocks
/// first in the next user message), and no result comes without its call just before it.
fn strictly_valid(wire: Wire, body: &Value) -> Result<(), String> {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let mut pending: Vec<String> = Vec::new();
    // OpenAI answers calls with a run of `tool` messages.
    let mut answering: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let (calls, results) = calls_and_results(wire, m);
        match wire {
            Wire::OpenAi => {
                if m["role"] == "tool" {
                    let id = &results[0];
                    let Some(at) = answering.iter().position(|p| p == id) else {
                        return Err(format!("message {i}: a result without its call: {id}"));
                    };
                    answering.remove(at);
                    continue;
                }
                if !answering.is_empty() {
                    return Err(format!("message {i}: calls {answering:?} not answered"));
                }
                answering = calls;
            }
            Wire::Anthropic => {
                let leading = m["content"]
                    .as_array()
                    .map(|b| b.iter().take_while(|b| b["type"] == "tool_result").count())
                    .unwrap_or(0);
                if leading != results.len() {
                    return Err(format!("message {i}: a tool_result after other content"));
                }
                let (mut got, mut want) = (results.clone(), pending.clone());
                got.sort();
                want.sort();
                if got != want {
                    return Err(format!(
                        "message {i}: results {got:?} do not answer the calls {want:?}"
                    ));
                }
                pending = calls;
            }
        }
    }
    if !answering.is_empty() || !pending.is_empty() {
        return Err(format!(
            "the request ends with calls not answered: {answering:?}{pending:?}"
        ));
    }
    Ok(())
}

/// How many tool results the request carries: the model asks for `calls_per_turn` calls
/// (`sleep` commands, so a kill often lands while one runs), then answers.
fn results_so_far(wire: Wire, body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map(|ms| ms.iter().map(|m| calls_and_results(wire, m).1.len()).sum())
        .unwrap_or(0)
}

/// The strict model: `400` for a request the providers would refuse; otherwise a `exec_shell`
/// call while the turn has made fewer than `calls` of them since the person last spoke, then
/// "done".
async fn strict_model(wire: Wire, calls: usize) -> std::io::Result<ModelServer> {
    ModelServer::start(move |n, r: &Received| {
        let body = r.json();
        if let Err(problem) = strictly_valid(wire, &body) {
            let error = serde_json::json!({"error": {"type": "invalid_request_error",
                "message": format!("invalid messages: {problem}")}});
            return vec![json_response("400 Bad Request", &[], &error.to_string())];
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        // Results since the last message in which the person spoke (plain text from the user).
        let since = messages
            .iter()
            .rposition(|m| {
                m["role"] == "user"
                    && match wire {
                        Wire::OpenAi => m["content"].is_string(),
                        Wire::Anthropic => m["content"]
                            .as_array()
                            .is_some_and(|b| b.iter().all(|b| b["type"] == "text")),
                    }
            })
            .map_or(0, |i| {
                results_so_far(wire, &serde_json::json!({"messages": messages[i..]}))
            });
        if since >= calls {
            return match wire {
                Wire::OpenAi => oa_answer("done"),
                Wire::Anthropic => an_answer("done"),
            };
        }
        let args = r#"{"command": "sleep 0.3; echo step"}"#;
        let id = format!("call_{n}");
        match wire {
            Wire::OpenAi => oa_tool_call(&id, "exec_shell", args),
            Wire::Anthropic => an_tool_call(&id, "exec_shell", args),
        }
    })
    .await
}

/// `keel resume ID PROMPT`: (exit code, stderr).
async fn resume(
    home: &Path,
    ws: &Path,
    wire: Wire,
    id: &str,
) -> Result<(Option<i32>, String), Box<dyn std::error::Error>> {
    let (h, w, id) = (home.to_path_buf(), ws.to_path_buf(), id.to_owned());
    let out = tokio::task::spawn_blocking(move || {
        keel(&h, &w)
            .env(wire.key_var(), KEY)
            .args(["resume", &id, "go on", "--approval", "auto"])
            .timeout(Duration::from_secs(120))
            .output()
    })
    .await??;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// After a resume: it completed, and every request the server saw was valid.
fn assert_resumed(server: &ModelServer, wire: Wire, code: Option<i32>, stderr: &str, what: &str) {
    for (i, r) in server.received().iter().enumerate() {
        if let Err(problem) = strictly_valid(wire, &r.json()) {
            panic!("{what}: request {i} would be refused: {problem}\n{stderr}");
        }
    }
    assert_eq!(
        code,
        Some(0),
        "{what}: the resumed turn did not complete\n{stderr}"
    );
}

/// A tiny deterministic generator (xorshift), so the kill points are the same on every run.
struct Seeded(u64);

impl Seeded {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Send `signal` to `pid`.
fn send(signal: &str, pid: u32) -> R {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    if !status.success() {
        return Err(format!("kill -{signal} failed").into());
    }
    Ok(())
}

/// Wait (at most 60 s) until `ready()`.
async fn until(mut ready: impl FnMut() -> bool) -> R {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if Instant::now() > deadline {
            return Err("the session never got there".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn killed_at_random_points(wire: Wire, seed: u64, runs: usize) -> R {
    let mut rng = Seeded(seed);
    let mut resumed = 0;
    for run in 0..runs {
        let server = strict_model(wire, 3).await?;
        let (home, ws) = homes_for_server(&server, wire)?;
        let mut child = keel_process(home.path(), ws.path())
            .env(wire.key_var(), KEY)
            .args(["exec", "--approval", "auto", "work"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        // Somewhere in the turn: after the k-th model request, then a little later.
        let k = 1 + rng.below(4) as usize;
        let pause = rng.below(500);
        until(|| server.received().len() >= k || matches!(child.try_wait(), Ok(Some(_)))).await?;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let _ = child.kill();
        let _ = child.wait();
        let what = format!("{wire:?} run {run}: killed after request {k} + {pause} ms");
        let Some(id) = session_ids(home.path()).into_iter().next() else {
            // Killed before the session log had anything: nothing to resume.
            continue;
        };
        let before = server.received().len();
        let (code, stderr) = resume(home.path(), ws.path(), wire, &id).await?;
        assert!(
            server.received().len() > before,
            "{what}: resumed without asking the model\n{stderr}"
        );
        assert_resumed(&server, wire, code, &stderr, &what);
        resumed += 1;
    }
    assert!(resumed > 0, "no run got far enough to be resumed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_openai_sessions_resume_into_valid_requests() -> R {
    killed_at_random_points(Wire::OpenAi, 0x5eed_0001, 4).await
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_anthropic_sessions_resume_into_valid_requests() -> R {
    killed_at_random_points(Wire::Anthropic, 0x5eed_0002, 4).await
}

/// A session killed while a command ran, then its log's last line cut in the middle (as a
/// writer stopped halfway leaves it): the resume is still valid, and the torn line is gone
/// from the log rather than left before the new entries.
#[tokio::test(flavor = "multi_thread")]
async fn a_torn_last_line_neither_breaks_the_resume_nor_stays_in_the_log() -> R {
    let wire = Wire::Anthropic;
    let server = strict_model(wire, 2).await?;
    let (home, ws) = homes_for_server(&server, wire)?;
    let mut child = keel_process(home.path(), ws.path())
        .env(wire.key_var(), KEY)
        .args(["exec", "--approval", "auto", "work"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    until(|| server.received().len() >= 2).await?;
    let _ = child.kill();
    let _ = child.wait();
    let id = session_ids(home.path())
        .into_iter()
        .next()
        .ok_or("no session log")?;
    let log = home.path().join(format!("data/sessions/{id}.jsonl"));
    let text = std::fs::read_to_string(&log)?;
    // Cut the last line in the middle.
    let last_start = text.trim_end_matches('\n').rfind('\n').map_or(0, |i| i + 1);
    let cut = last_start + (text.len() - last_start) / 2;
    std::fs::write(&log, &text.as_bytes()[..cut])?;
    let (code, stderr) = resume(home.path(), ws.path(), wire, &id).await?;
    assert_resumed(&server, wire, code, &stderr, "torn last line");
    let read = keel_agent_kit::session_log::read_log_file(&log)?;
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
    Ok(())
}

/// How a test stops a `keel` whose command is running.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// `kill -NAME`.
    Signal(&'static str),
    /// keel's terminal goes away: its stdin, stdout and stderr are a pty whose session keel
    /// leads (as a shell's child in a terminal window), and the pty's other side is closed, as
    /// closing the window does. The kernel then sends SIGHUP, and every write to the terminal
    /// fails with EIO.
    TerminalClosed,
    /// keel's stdout is a pipe whose reader closes it mid-turn: `keel exec --json … | head -1`
    /// (after the first line), or a plain `keel exec` whose answer nobody waits for any more
    /// (while the command runs, when keel has nothing to write).
    StdoutClosed { json: bool },
}

/// The thread holding a pty's master side; it answers what keel wrote to its terminal.
type Terminal = std::thread::JoinHandle<Vec<u8>>;

/// keel on a new pty, leading its session with the pty as its controlling terminal (through
/// util-linux's `setsid --ctty`, which execs keel in place: the child's pid is keel's); the
/// pty's other side (what a terminal window holds) is drained by a thread until `close` is
/// set, then closed. The thread answers what keel wrote to its terminal.
fn on_a_terminal(
    keel: &std::process::Command,
    close: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<(std::process::Child, Terminal), Box<dyn std::error::Error>> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use std::io::Read as _;
    let pty = nix::pty::openpty(None, None)?;
    // openpty's descriptors are inherited across exec: a keel holding the master side itself
    // would keep its terminal open whatever the test closes.
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    let mut cmd = std::process::Command::new("setsid");
    cmd.arg("--ctty")
        .arg(keel.get_program())
        .args(keel.get_args());
    for (name, value) in keel.get_envs() {
        match value {
            Some(value) => cmd.env(name, value),
            None => cmd.env_remove(name),
        };
    }
    cmd.stdin(pty.slave.try_clone()?)
        .stdout(pty.slave.try_clone()?)
        .stderr(pty.slave);
    let child = cmd.spawn()?;
    // The command holds the slave's copies; dropping it leaves keel the only holder.
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let drain = std::thread::spawn(move || {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd as _;
        let mut master = master;
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        while !close.load(std::sync::atomic::Ordering::SeqCst) {
            let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(20u8)).unwrap_or(0) > 0 {
                match master.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => shown.extend_from_slice(&buf[..n]),
                }
            }
        }
        // Dropping the last descriptor of the pty's master side hangs the terminal up.
        shown
    });
    Ok((child, drain))
}

/// keel stopped while a command runs (a signal, its terminal closed, its stdout's reader
/// gone): the turn ends as for Ctrl-C and is recorded, the command's process group is killed,
/// keel leaves within a few seconds with `status`, and the session resumes into valid
/// requests.
async fn stopped_by(how: Stop, status: i32) -> R {
    use std::io::BufRead as _;
    let wire = Wire::OpenAi;
    let server = ModelServer::start(move |n, r: &Received| {
        if let Err(problem) = strictly_valid(wire, &r.json()) {
            let error = serde_json::json!({"error": {"message": problem}});
            return vec![json_response("400 Bad Request", &[], &error.to_string())];
        }
        // The command is asked for in the first turn only: a turn stopped before its first
        // request is resumed into an answer, not into the command.
        let resumed = r.json()["messages"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["content"] == "go on"));
        if n > 0 || resumed {
            return oa_answer("done");
        }
        let args = r#"{"command": "touch started; (sleep 3; touch survivor) & sleep 60"}"#;
        oa_tool_call("call_1", "exec_shell", args)
    })
    .await?;
    let (home, ws) = homes_for_server(&server, wire)?;
    let started = ws.path().join("started");
    let mut cmd = keel_process(home.path(), ws.path());
    cmd.env(wire.key_var(), KEY);
    let close = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (child, terminal, sent) = match how {
        Stop::Signal(signal) => {
            let child = cmd
                .args(["exec", "--approval", "auto", "wait"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            until(|| started.exists()).await?;
            let sent = Instant::now();
            send(signal, child.id())?;
            (child, None, sent)
        }
        Stop::TerminalClosed => {
            cmd.args(["run", "--approval", "auto", "wait"]);
            let (child, drain) = on_a_terminal(&cmd, close.clone())?;
            until(|| started.exists()).await?;
            let sent = Instant::now();
            close.store(true, std::sync::atomic::Ordering::SeqCst);
            (child, Some(drain), sent)
        }
        Stop::StdoutClosed { json } => {
            if json {
                cmd.arg("exec").arg("--json");
            } else {
                cmd.arg("exec");
            }
            let mut child = cmd
                .args(["--approval", "auto", "wait"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            if json {
                // `head -1`: one line, then the pipe's only reader is gone.
                let mut first = String::new();
                std::io::BufReader::new(stdout).read_line(&mut first)?;
                assert!(first.starts_with('{'), "not a JSON line: {first}");
            } else {
                until(|| started.exists()).await?;
                drop(stdout);
            }
            (child, None, Instant::now())
        }
    };
    let (code, stderr, took) = tokio::task::spawn_blocking(move || {
        // Bounded: a keel that never leaves is killed and the test fails on its status.
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = sent.elapsed();
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            use std::io::Read as _;
            let _ = err.read_to_string(&mut stderr);
        }
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            stderr.push_str(&format!("\n[killed by signal {signal}]"));
        }
        Ok::<_, std::io::Error>((status.code(), stderr, took))
    })
    .await??;
    let stderr = match terminal {
        Some(drain) => {
            String::from_utf8_lossy(&drain.join().unwrap_or_default()).into_owned() + &stderr
        }
        None => stderr,
    };
    assert_eq!(code, Some(status), "{how:?}\n{stderr}");
    assert!(
        took < Duration::from_secs(8),
        "{how:?}: took {took:?} to leave\n{stderr}"
    );
    let id = session_ids(home.path())
        .into_iter()
        .next()
        .ok_or("no session log")?;
    let entries = crate::common::only_session_log(home.path())?;
    let ended = entries
        .iter()
        .rfind(|e| e["kind"] == "turn_ended")
        .ok_or_else(|| format!("{how:?}: the turn's end is not recorded\n{stderr}"))?;
    assert_eq!(ended["end"], "cancelled", "{how:?}: {ended}");
    // The command's background child belonged to its process group and died with it.
    let survivor = ws.path().join("survivor");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        !survivor.exists(),
        "{how:?}: a child of the stopped command outlived keel"
    );
    let (code, stderr) = resume(home.path(), ws.path(), wire, &id).await?;
    assert_resumed(&server, wire, code, &stderr, &format!("{how:?}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_turn_records_it_and_leaves_with_143() -> R {
    stopped_by(Stop::Signal("TERM"), 143).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_ends_the_turn_records_it_and_leaves_with_129() -> R {
    stopped_by(Stop::Signal("HUP"), 129).await
}

/// The terminal window closed while a command runs: keel's writes to it fail (EIO) from then
/// on, and the way out must not depend on any of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_terminal_ends_the_turn_records_it_and_leaves_with_129() -> R {
    stopped_by(Stop::TerminalClosed, 129).await
}

/// `keel exec --json … | head -1`: the reader leaves after the first line, before the command
/// has run or while it runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_json_reader_that_leaves_ends_the_turn_records_it_and_leaves_with_141() -> R {
    stopped_by(Stop::StdoutClosed { json: true }, 141).await
}

/// The reader of `keel exec`'s answer leaves while the command runs and keel writes nothing:
/// keel notices at once, not when the answer is written.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_reader_that_leaves_mid_command_ends_the_turn_with_141() -> R {
    stopped_by(Stop::StdoutClosed { json: false }, 141).await
}

/// keel's sessions folder on a full disk (a 1 MiB tmpfs in a mount namespace of its own,
/// filled but for a few KiB): the turn fails with a clear error and a non-zero status instead
/// of passing for a recorded one; once space is back the log has no corrupt line in its
/// middle and the session resumes into valid requests. Needs root (CI runs as root).
#[tokio::test(flavor = "multi_thread")]
async fn a_full_home_disk_fails_the_turn_and_leaves_a_resumable_log() -> R {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return Ok(());
    }
    let wire = Wire::OpenAi;
    let server = strict_model(wire, 2).await?;
    let (home, ws) = homes_for_server(&server, wire)?;
    let out_dir = tempfile::tempdir()?;
    let sessions = home.path().join("data/sessions");
    std::fs::create_dir_all(&sessions)?;
    let keel_bin: PathBuf = assert_cmd::cargo::cargo_bin("keel");
    // Everything on the small disk happens inside one mount namespace: fill it, run a turn,
    // free it, resume, and copy the log out before the namespace (and the tmpfs) goes.
    let script = r#"
set -u
mount -t tmpfs -o size=1m tmpfs "$S" || exit 90
cat /dev/zero > "$S/filler" 2>/dev/null
truncate -s -6k "$S/filler"
"$KEEL" --home "$H" --workspace "$W" exec --approval auto work >/dev/null 2>"$O/first.err"
echo $? > "$O/first.code"
rm -f "$S/filler"
ID=$(ls "$S" | sed -n 's/\.jsonl$//p' | head -1)
echo "$ID" > "$O/id"
"$KEEL" --home "$H" --workspace "$W" resume "$ID" "go on" --approval auto >/dev/null 2>"$O/second.err"
echo $? > "$O/second.code"
cp "$S/$ID.jsonl" "$O/log.jsonl"
"#;
    let (h, w, o) = (
        home.path().to_path_buf(),
        ws.path().to_path_buf(),
        out_dir.path().to_path_buf(),
    );
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("unshare")
            .args(["-m", "sh", "-c", script])
            .env("S", &sessions)
            .env("H", &h)
            .env("W", &w)
            .env("O", &o)
            .env("KEEL", &keel_bin)
            .env_remove("KEEL_PROVIDER")
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env(wire.key_var(), KEY)
            .env("NO_COLOR", "1")
            .status()
    })
    .await??;
    assert!(status.success(), "the namespace script failed: {status}");
    let read = |name: &str| std::fs::read_to_string(out_dir.path().join(name)).unwrap_or_default();
    let first_err = read("first.err");
    assert_ne!(
        read("first.code").trim(),
        "0",
        "a turn whose log failed passed:\n{first_err}"
    );
    assert!(
        first_err.contains("the session log could not record"),
        "{first_err}"
    );
    let log = keel_agent_kit::session_log::read_log_file(&out_dir.path().join("log.jsonl"))?;
    assert!(
        log.warnings.is_empty(),
        "a corrupt line is left in the log: {:?}",
        log.warnings
    );
    assert_eq!(read("second.code").trim(), "0", "{}", read("second.err"));
    for (i, r) in server.received().iter().enumerate() {
        if let Err(problem) = strictly_valid(wire, &r.json()) {
            panic!(
                "request {i} would be refused: {problem}\n{}",
                read("second.err")
            );
        }
    }
    Ok(())
}

/// keel's whole home and the workspace each on a small full disk (tmpfs in a mount namespace
/// of their own; the home warmed by one session first, so the session starts): `write_file`
/// and `edit_file` of the person's file fail saying the disk is full and leave it whole; the
/// turn, whose log cannot be written, ends non-zero; once space is back the log has no torn
/// line in its middle and the session resumes. Needs root (CI runs as root).
#[test]
fn a_full_home_and_workspace_keep_every_file_whole() -> R {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return Ok(());
    }
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let out_dir = tempfile::tempdir()?;
    let big = "x".repeat(300 * 1024);
    let tools = crate::common::scripted_tool_step(&[
        (
            "write_file",
            format!("{{ path = \"important.txt\", content = {big:?} }}"),
        ),
        (
            "edit_file",
            format!(
                "{{ path = \"important.txt\", old_string = \"words\", new_string = {big:?}, occurrence = 1 }}"
            ),
        ),
    ]);
    std::fs::write(
        out_dir.path().join("tools.toml"),
        format!("{tools}[[step]]\ntext = \"done\"\n"),
    )?;
    std::fs::write(
        out_dir.path().join("done.toml"),
        "[[step]]\ntext = \"done\"\n",
    )?;
    let old = "the person's words\n".repeat(2000);
    std::fs::write(out_dir.path().join("old.txt"), &old)?;
    let keel_bin: PathBuf = assert_cmd::cargo::cargo_bin("keel");
    let script = r#"
set -u
mount -t tmpfs -o size=8m tmpfs "$H" || exit 90
mount -t tmpfs -o size=256k tmpfs "$W" || exit 90
printf '[model]\nprovider = "scripted"\nscript = "%s"\n' "$O/done.toml" > "$H/config.toml"
"$KEEL" --home "$H" --workspace "$W" exec warm >/dev/null 2>"$O/warm.err" || exit 91
rm -rf "$H/data/sessions"/*
# Checkpoints off: they would take the home's last kilobytes before the session log, and
# this test is about the person's file on a full workspace (a call the log cannot record as
# started is not run: a_resume_tells_a_call_that_started_from_one_that_never_did).
printf '[model]\nprovider = "scripted"\nscript = "%s"\n[checkpoints]\nenabled = false\n' "$O/tools.toml" > "$H/config.toml"
cp "$O/old.txt" "$W/important.txt"
cat /dev/zero > "$W/filler" 2>/dev/null
cat /dev/zero > "$H/filler" 2>/dev/null
truncate -s -6k "$H/filler"
"$KEEL" --home "$H" --workspace "$W" exec --json --approval auto work >"$O/first.out" 2>"$O/first.err"
echo $? > "$O/first.code"
cp "$W/important.txt" "$O/important.after"
ls -A "$W" > "$O/ws.names"
rm -f "$H/filler" "$W/filler"
printf '[model]\nprovider = "scripted"\nscript = "%s"\n' "$O/done.toml" > "$H/config.toml"
ID=$(ls "$H/data/sessions" | sed -n 's/\.jsonl$//p' | head -1)
"$KEEL" --home "$H" --workspace "$W" resume "$ID" "go on" >/dev/null 2>"$O/second.err"
echo $? > "$O/second.code"
cp "$H/data/sessions/$ID.jsonl" "$O/log.jsonl"
"#;
    let status = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .env("H", home.path())
        .env("W", ws.path())
        .env("O", out_dir.path())
        .env("KEEL", &keel_bin)
        .env_remove("KEEL_PROVIDER")
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1")
        .status()?;
    let read = |name: &str| std::fs::read_to_string(out_dir.path().join(name)).unwrap_or_default();
    assert!(
        status.success(),
        "the namespace script failed: {status}\n{}",
        read("warm.err")
    );
    let first_err = read("first.err");
    assert_ne!(
        read("first.code").trim(),
        "0",
        "a turn whose log failed passed:\n{first_err}"
    );
    assert!(
        first_err.contains("the session log could not record"),
        "{first_err}"
    );
    let outcomes = crate::common::tool_outcomes(read("first.out").as_bytes());
    for call in ["call_1_1", "call_1_2"] {
        let (tool, _, content) = outcomes
            .get(call)
            .ok_or_else(|| format!("{call} has no outcome:\n{first_err}"))?;
        assert!(content.contains("no space left"), "{tool}: {content}");
    }
    assert_eq!(read("important.after"), old, "the person's file changed");
    // No temp file left beside it (the project's memory folder `.keel` is made at start).
    let names = read("ws.names");
    let names: Vec<&str> = names.lines().filter(|n| *n != ".keel").collect();
    assert_eq!(names, ["filler", "important.txt"]);
    let log = keel_agent_kit::session_log::read_log_file(&out_dir.path().join("log.jsonl"))?;
    assert!(
        log.warnings.is_empty(),
        "a corrupt line is left in the log: {:?}",
        log.warnings
    );
    assert_eq!(read("second.code").trim(), "0", "{}", read("second.err"));
    Ok(())
}

/// A session log holding a 1 GiB line (written sparse: no 1 GiB in memory or on disk) among
/// whole entries: `keel sessions list` still lists every session (one bad log hid them all),
/// and `keel resume` of that session skips the line with a note and makes requests the
/// provider accepts.
#[tokio::test(flavor = "multi_thread")]
async fn a_one_gib_line_hides_no_session_and_is_skipped_on_resume() -> R {
    use std::io::{Seek as _, Write as _};
    let wire = Wire::OpenAi;
    let server = strict_model(wire, 1).await?;
    let (home, ws) = homes_for_server(&server, wire)?;
    let run = |prompt: &'static str| {
        let (h, w) = (home.path().to_path_buf(), ws.path().to_path_buf());
        tokio::task::spawn_blocking(move || {
            keel(&h, &w)
                .env(wire.key_var(), KEY)
                .args(["exec", "--approval", "auto", prompt])
                .timeout(Duration::from_secs(120))
                .output()
        })
    };
    let out = run("first").await??;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let big_id = session_ids(home.path())
        .into_iter()
        .next()
        .ok_or("no session log")?;
    let out = run("second").await??;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sessions = home.path().join("data/sessions");
    let ids = crate::common::session_ids(home.path());
    assert_eq!(ids.len(), 2, "{ids:?}");

    // The first session's log: its entries, then a 1 GiB line (a hole reads as NUL bytes),
    // then the entries again after it, so whole entries follow the giant.
    let log = sessions.join(format!("{big_id}.jsonl"));
    let entries = std::fs::read(&log)?;
    let mut file = std::fs::OpenOptions::new().write(true).open(&log)?;
    let giant_end = entries.len() as u64 + (1 << 30);
    file.set_len(giant_end)?;
    file.seek(std::io::SeekFrom::Start(giant_end))?;
    file.write_all(b"\n")?;
    drop(file);

    let (h, w) = (home.path().to_path_buf(), ws.path().to_path_buf());
    let listed = tokio::task::spawn_blocking(move || {
        keel(&h, &w)
            .args(["sessions", "list"])
            .timeout(Duration::from_secs(120))
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&listed.stdout);
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(listed.status.success(), "{stdout}\n{stderr}");
    for id in &ids {
        assert!(
            stdout.contains(id.as_str()),
            "{id} is not listed:\n{stdout}\n{stderr}"
        );
    }

    let before = server.received().len();
    let (code, stderr) = resume(home.path(), ws.path(), wire, &big_id).await?;
    assert!(
        server.received().len() > before,
        "resumed without asking the model\n{stderr}"
    );
    assert_resumed(&server, wire, code, &stderr, "a 1 GiB line");
    assert!(
        stderr.contains("line of 1073741824 bytes skipped"),
        "no note of the skipped line:\n{stderr}"
    );
    Ok(())
}

/// Killed while the first of two serial calls runs: the resumed request answers the first as
/// started with its outcome unknown ("it may have run") and the second as never started ("it
/// did not run"), told apart by the start the loop records before a call runs; the second
/// call's effect indeed never happened.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_tells_a_call_that_started_from_one_that_never_did() -> R {
    use keel_agent_kit::session_log::{INTERRUPTED_CALL, NOT_STARTED_CALL};
    let wire = Wire::OpenAi;
    let server = ModelServer::start(move |n, r: &Received| {
        if let Err(problem) = strictly_valid(wire, &r.json()) {
            let error = serde_json::json!({"error": {"message": problem}});
            return vec![json_response("400 Bad Request", &[], &error.to_string())];
        }
        if n > 0 {
            return oa_answer("done");
        }
        oa_tool_calls(&[
            (
                "call_first",
                "exec_shell",
                r#"{"command": "touch started; sleep 60"}"#,
            ),
            (
                "call_second",
                "exec_shell",
                r#"{"command": "touch second"}"#,
            ),
        ])
    })
    .await?;
    let (home, ws) = homes_for_server(&server, wire)?;
    let mut child = keel_process(home.path(), ws.path())
        .env(wire.key_var(), KEY)
        .args(["exec", "--approval", "auto", "two things"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let started = ws.path().join("started");
    until(|| started.exists()).await?;
    let _ = child.kill();
    let _ = child.wait();
    let id = session_ids(home.path())
        .into_iter()
        .next()
        .ok_or("no session log")?;
    let before = server.received().len();
    let (code, stderr) = resume(home.path(), ws.path(), wire, &id).await?;
    assert_resumed(&server, wire, code, &stderr, "killed during the first call");
    let resumed = server
        .received()
        .get(before)
        .map(Received::json)
        .ok_or("the resume asked nothing")?;
    let result = |call: &str| {
        resumed["messages"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["tool_call_id"] == call))
            .and_then(|m| m["content"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    // (The OpenAI wire marks an error result with "Error: ".)
    assert!(
        result("call_first").ends_with(INTERRUPTED_CALL),
        "{resumed}"
    );
    assert!(
        result("call_second").ends_with(NOT_STARTED_CALL),
        "{resumed}"
    );
    assert!(!ws.path().join("second").exists(), "the second call ran");
    Ok(())
}
