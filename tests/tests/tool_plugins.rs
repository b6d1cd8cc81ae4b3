//! The agent's tool plugins (`fs-tools`, `shell`, `tool-registry`, `session-log`,
//! `verifier`) as real components in a real kernel. Tool calls come from the `canned-model`
//! fixture through `Kernel::complete`, so the kernel records them as a model's calls, and run
//! through `Kernel::dispatch`: the whole gate pipeline (name resolution, schema check, exec
//! policy, approval, sanitization, truncation with spill).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_kernel::gates::approvals::{Answer, ApprovalRequest, Approver};
use keel_kernel::{GateConfig, Kernel};
use keel_protocol::{
    Block, LogLine, Message, ModelRequest, ModelResponse, OutcomeStatus, Role, SessionEvent,
    ToolDef, ToolOutcome, TurnCall, Verdict, VerdictStatus, VerifyRequest, services, topics,
};
use keel_tests::Harness;
use serde_json::{Value, json};

type R = anyhow::Result<()>;

/// An approver that answers every request with the current answer (or the next scripted one)
/// and records the requests.
struct TestApprover {
    answer: Mutex<Answer>,
    script: Mutex<std::collections::VecDeque<Answer>>,
    asked: Mutex<Vec<ApprovalRequest>>,
}

impl TestApprover {
    fn set(&self, answer: Answer) {
        *self.answer.lock().expect("approver lock") = answer;
    }

    /// The next answers, in order, before the current answer applies again.
    fn script(&self, answers: &[Answer]) {
        self.script
            .lock()
            .expect("approver lock")
            .extend(answers.iter().copied());
    }

    fn asked(&self) -> Vec<String> {
        self.asked
            .lock()
            .expect("approver lock")
            .iter()
            .map(|r| r.summary.clone())
            .collect()
    }
}

impl Approver for TestApprover {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        self.asked
            .lock()
            .expect("approver lock")
            .push(request.clone());
        if let Some(next) = self.script.lock().expect("approver lock").pop_front() {
            return next;
        }
        *self.answer.lock().expect("approver lock")
    }
}

/// A kernel with a workspace, a data directory, a test approver and the canned model.
struct Setup {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    data: PathBuf,
    h: Harness,
    approver: Arc<TestApprover>,
    next_id: Mutex<u32>,
}

impl Setup {
    async fn new(plugins: &[&str]) -> anyhow::Result<Setup> {
        Setup::configured(plugins, |_| {}).await
    }

    /// A setup whose gates `configure` changes from the locked-down defaults.
    async fn configured(
        plugins: &[&str],
        configure: impl FnOnce(&mut GateConfig),
    ) -> anyhow::Result<Setup> {
        Setup::prepared(plugins, configure, |_| Ok(())).await
    }

    /// A setup whose workspace directory `prepare` sees (e.g. mounts something on) before
    /// any plugin is loaded.
    async fn prepared(
        plugins: &[&str],
        configure: impl FnOnce(&mut GateConfig),
        prepare: impl FnOnce(&std::path::Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<Setup> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().join("ws");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&ws)?;
        prepare(&ws)?;
        let ws = ws.canonicalize()?;
        let approver = Arc::new(TestApprover {
            answer: Mutex::new(Answer::Once),
            script: Mutex::default(),
            asked: Mutex::new(Vec::new()),
        });
        let mut gates = GateConfig {
            workspace: Some(ws.clone()),
            approver: approver.clone(),
            ..GateConfig::locked_down()
        };
        configure(&mut gates);
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tool-plugins-cache");
        let h = Harness::with_gates(&ws, Some(data.clone()), Some(cache), gates)?;
        h.load_fixture("canned-model").await?;
        for plugin in plugins {
            let status = h.load_plugin(plugin).await?;
            anyhow::ensure!(
                status.state == keel_kernel::PluginState::Active,
                "{plugin}: {status:?}"
            );
        }
        Ok(Setup {
            _dir: dir,
            ws,
            data,
            h,
            approver,
            next_id: Mutex::new(0),
        })
    }

    fn kernel(&self) -> &Kernel {
        &self.h.kernel
    }

    /// One model response carrying `calls` (tool name, raw arguments), dispatched; the
    /// outcomes in call order.
    async fn turn(&self, calls: &[(&str, String)]) -> anyhow::Result<Vec<ToolOutcome>> {
        let calls: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| {
                let mut n = self.next_id.lock().expect("id lock");
                *n += 1;
                json!({"id": format!("call-{n}"), "name": name, "arguments": arguments})
            })
            .collect();
        let request = ModelRequest {
            compacts_on_overflow: false,
            conversation: None,
            model: String::new(),
            system: String::new(),
            messages: vec![Message::user_text(json!({ "calls": calls }).to_string())],
            tools: Vec::new(),
            max_tokens: 1024,
        };
        let answer = self
            .kernel()
            .complete(&serde_json::to_string(&request)?)
            .await?;
        let response: ModelResponse = serde_json::from_str(&answer)?;
        let ids: Vec<String> = response
            .message
            .tool_calls()
            .map(|(id, _, _)| id.to_owned())
            .collect();
        let outcomes = self.kernel().dispatch(&ids).await;
        outcomes
            .iter()
            .map(|o| Ok(serde_json::from_str(o)?))
            .collect()
    }

    /// One call through the pipeline.
    async fn call(&self, tool: &str, input: Value) -> anyhow::Result<ToolOutcome> {
        let mut outcomes = self.turn(&[(tool, input.to_string())]).await?;
        outcomes.pop().ok_or_else(|| anyhow::anyhow!("no outcome"))
    }

    async fn shell(&self, command: &str) -> anyhow::Result<ToolOutcome> {
        self.call("exec_shell", json!({ "command": command })).await
    }
}

fn assert_status(o: &ToolOutcome, status: OutcomeStatus) {
    assert_eq!(o.status, status, "{o:#?}");
}

// ---------------------------------------------------------------------------------------------
// fs-tools

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_page_edit_and_stay_in_the_workspace() -> R {
    let s = Setup::new(&["fs-tools"]).await?;
    let text: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    std::fs::write(s.ws.join("long.txt"), text)?;

    // Paging: numbered lines and the exact call for the next page.
    let o = s.call("read_file", json!({"path": "long.txt"})).await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.starts_with("     1\tline 1\n"), "{}", o.content);
    assert!(o.content.contains("   200\tline 200"), "{}", o.content);
    assert!(!o.content.contains("line 201"), "{}", o.content);
    assert!(
        o.content.contains(
            r#"showing lines 1-200 of 300. Next page: read_file {"path": "long.txt", "offset": 201}"#
        ),
        "{}",
        o.content
    );
    let o = s
        .call("read_file", json!({"path": "long.txt", "offset": 201}))
        .await?;
    assert!(o.content.starts_with("   201\tline 201\n"), "{}", o.content);
    assert!(o.content.contains("   300\tline 300"), "{}", o.content);
    assert!(o.content.contains("end of file"), "{}", o.content);

    // write_file changes files: the approver is asked, and says yes.
    let o = s
        .call(
            "write_file",
            json!({"path": "src/a.rs", "content": "fn a() {}\nfn a() {}\n"}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(s.approver.asked().iter().any(|a| a.contains("src/a.rs")));
    assert_eq!(
        std::fs::read_to_string(s.ws.join("src/a.rs"))?,
        "fn a() {}\nfn a() {}\n"
    );

    // An ambiguous edit reaches the model as an error result and changes nothing.
    let o = s
        .call(
            "edit_file",
            json!({"path": "src/a.rs", "old_string": "fn a() {}", "new_string": "fn b() {}"}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(o.content.contains("matches 2 times"), "{}", o.content);
    assert!(o.content.contains("replace_all"), "{}", o.content);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("src/a.rs"))?,
        "fn a() {}\nfn a() {}\n"
    );
    let o = s
        .call(
            "edit_file",
            json!({"path": "src/a.rs", "old_string": "fn a() {}", "new_string": "fn b() {}", "occurrence": 2}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("src/a.rs"))?,
        "fn a() {}\nfn b() {}\n"
    );

    // Escapes are refused with a way out; nothing outside the workspace is touched.
    std::fs::write(
        s.ws.parent().expect("parent").join("secret.txt"),
        "top secret",
    )?;
    for path in ["../secret.txt", "/etc/passwd", "src/../../secret.txt"] {
        let o = s.call("read_file", json!({ "path": path })).await?;
        assert_status(&o, OutcomeStatus::Error);
        assert!(
            o.content.contains("outside the workspace") || o.content.contains("climbs out"),
            "{path}: {}",
            o.content
        );
        assert!(!o.content.contains("top secret"), "{}", o.content);
    }
    let o = s
        .call(
            "write_file",
            json!({"path": "../escaped.txt", "content": "x"}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(!s.ws.parent().expect("parent").join("escaped.txt").exists());

    // list_dir and grep run too.
    let o = s.call("list_dir", json!({"path": "."})).await?;
    assert!(
        o.content.contains("long.txt") && o.content.contains("src"),
        "{}",
        o.content
    );
    let o = s.call("grep", json!({"pattern": "line 29[0-9]"})).await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.contains("long.txt"), "{}", o.content);
    Ok(())
}

/// `write_file` and `edit_file` replace a file atomically (a temp file renamed over it) from
/// inside the WASI guest, which cannot set a mode: the kernel's `rename-at` keeps the replaced
/// file's permission bits, so an executable script stays executable.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_file_keeps_its_mode() -> R {
    use std::os::unix::fs::PermissionsExt as _;
    let s = Setup::new(&["fs-tools"]).await?;
    let script = s.ws.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho one\n")?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750))?;
    let o = s
        .call(
            "write_file",
            json!({"path": "run.sh", "content": "#!/bin/sh\necho two\n"}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    let o = s
        .call(
            "edit_file",
            json!({"path": "run.sh", "old_string": "two", "new_string": "three"}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert_eq!(std::fs::read_to_string(&script)?, "#!/bin/sh\necho three\n");
    let mode = std::fs::metadata(&script)?.permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "mode {mode:o}");
    // A new file gets the default mode; no temp file is left.
    let o = s
        .call("write_file", json!({"path": "new.txt", "content": "x"}))
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    let left: Vec<String> = std::fs::read_dir(&s.ws)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("keel-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}

/// Mounts a 256 KiB tmpfs on `dir` (needs root, as CI runs; `None` elsewhere).
fn small_tmpfs(dir: &std::path::Path) -> anyhow::Result<Option<SmallDisk>> {
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status();
    Ok(match mounted {
        Ok(status) if status.success() => Some(SmallDisk(dir.to_path_buf())),
        _ => None,
    })
}

/// A mounted tmpfs, unmounted when dropped.
struct SmallDisk(PathBuf);

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A full workspace disk: `write_file` and `edit_file` fail saying the disk is full and that
/// the file was not changed, the old content survives whole, and no temp file is left (they
/// left 16,384 bytes of partial content when writing in place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_leaves_the_old_file_and_says_so() -> R {
    let disk = std::sync::Mutex::new(None);
    let s = Setup::prepared(
        &["fs-tools"],
        |_| {},
        |ws| {
            *disk.lock().expect("lock") = small_tmpfs(ws)?;
            Ok(())
        },
    )
    .await?;
    let Some(_disk) = disk.lock().expect("lock").take() else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return Ok(());
    };
    let important = s.ws.join("important.txt");
    let old = "the person's words\n".repeat(2000);
    std::fs::write(&important, &old)?;
    let big = "x".repeat(300 * 1024);
    let o = s
        .call(
            "write_file",
            json!({"path": "important.txt", "content": big}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(o.content.contains("no space left"), "{}", o.content);
    assert!(
        o.content.contains("important.txt was not changed"),
        "{}",
        o.content
    );
    assert_eq!(std::fs::read_to_string(&important)?, old);
    let o = s
        .call(
            "edit_file",
            json!({"path": "important.txt", "old_string": "words", "new_string": big, "occurrence": 1}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(o.content.contains("no space left"), "{}", o.content);
    assert_eq!(std::fs::read_to_string(&important)?, old);
    let names: Vec<String> = std::fs::read_dir(&s.ws)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["important.txt".to_owned()]);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// tool-registry

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_lists_and_resolves_names_the_model_writes() -> R {
    let s = Setup::new(&["fs-tools", "shell", "tool-registry"]).await?;
    std::fs::write(s.ws.join("a.txt"), "hello\n")?;

    let list = s
        .kernel()
        .call_service(services::TOOL_REGISTRY, "list", "")
        .await?;
    let defs: Vec<ToolDef> = serde_json::from_str(&list)?;
    let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "edit_file",
            "exec_shell",
            "grep",
            "list_dir",
            "read_file",
            "write_file"
        ]
    );
    assert_eq!(defs[4].input_schema["required"], json!(["path"]));

    // A CamelCase name resolves to the registered tool and runs.
    let o = s.call("ReadFile", json!({"path": "a.txt"})).await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert_eq!(o.tool, "read_file");
    assert!(o.content.contains("1\thello"), "{}", o.content);

    // A typo gets "did you mean".
    let o = s.call("raed_file", json!({"path": "a.txt"})).await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(
        o.content.contains("did you mean `read_file`"),
        "{}",
        o.content
    );

    let answer = s
        .kernel()
        .call_service(
            services::TOOL_REGISTRY,
            "resolve",
            r#"{"name": "exec-shell"}"#,
        )
        .await?;
    assert_eq!(
        serde_json::from_str::<Value>(&answer)?,
        json!({"type": "found", "name": "exec_shell"})
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// shell

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_shell_runs_through_policy_and_approval() -> R {
    let s = Setup::new(&["shell"]).await?;
    std::fs::write(s.ws.join("present.txt"), "")?;

    // Allowed: runs without asking.
    let o = s.shell("ls").await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.starts_with("exit code: 0\n"), "{}", o.content);
    assert!(o.content.contains("present.txt"), "{}", o.content);
    assert_eq!(o.exec.len(), 1);
    assert_eq!(o.exec[0].command, "ls");
    assert!(s.approver.asked().is_empty(), "{:?}", s.approver.asked());

    // Prompt-class: runs only when the person says yes.
    s.approver.set(Answer::Once);
    let o = s.shell("touch approved.txt").await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(s.ws.join("approved.txt").exists());
    assert_eq!(s.approver.asked(), ["touch approved.txt"]);

    s.approver.set(Answer::Deny);
    let o = s.shell("touch denied.txt").await?;
    assert_status(&o, OutcomeStatus::Refused);
    assert!(o.content.contains("denied"), "{}", o.content);
    assert!(!s.ws.join("denied.txt").exists());
    assert!(o.exec.is_empty());
    assert_eq!(s.approver.asked().len(), 2);

    // Forbidden: refused without asking.
    s.approver.set(Answer::Once);
    let o = s.shell("rm -rf /").await?;
    assert_status(&o, OutcomeStatus::Refused);
    assert!(o.content.contains("is refused: forbid"), "{}", o.content);
    assert_eq!(s.approver.asked().len(), 2, "{:?}", s.approver.asked());

    // A non-zero exit is reported, not hidden.
    let o = s.shell("ls missing-file").await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(!o.content.starts_with("exit code: 0"), "{}", o.content);
    assert_eq!(o.exec[0].exit_code, Some(2));
    Ok(())
}

/// A loopback HTTP server answering every connection with `hello`; counts connections.
async fn hello_server() -> anyhow::Result<(u16, Arc<std::sync::atomic::AtomicUsize>)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let reply =
                    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    Ok((port, hits))
}

/// A command approved as a network command reaches the network through keel's proxy and the
/// network gate, with an audit line; a command approved for another reason gets no network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_network_command_goes_out_through_keels_gate_only() -> R {
    use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
    let (port, hits) = hello_server().await?;
    let audit_dir = tempfile::tempdir()?;
    let audit = audit_dir.path().join("network.log");
    let network = keel_kernel::NetConfig {
        policy: NetPolicy::new(NetDecision::Allow)
            .with_allow_private(&format!("127.0.0.1:{port}"))?,
        secrets: keel_kernel::Secrets::new(),
        audit_log: Some(audit.clone()),
    };
    let s = Setup::configured(&["shell"], |g| g.network = network).await?;
    s.approver.set(Answer::Once);
    let fetch = format!("curl -sS http://127.0.0.1:{port}/");
    let o = s.shell(&fetch).await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.contains("hello"), "{}", o.content);
    assert_eq!(s.approver.asked(), [fetch]);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    let log = std::fs::read_to_string(&audit)?;
    assert!(
        log.contains("shell (sandboxed command)") && log.contains("\"decision\":\"allow\""),
        "{log}"
    );

    // Approved, but for running code, not for the network: no way out at all.
    let script = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/').read())\""
    );
    let o = s.shell(&script).await?;
    assert!(!o.content.contains("hello"), "{}", o.content);
    assert_eq!(s.approver.asked().len(), 2, "{:?}", s.approver.asked());
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    Ok(())
}

/// A command the sandbox made fail may run again outside it only when the person says so, as
/// its own question, never under `auto`, and the result says which run it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_outside_the_sandbox_is_asked_separately_and_never_automatic() -> R {
    let outside = tempfile::tempdir_in("/var/tmp")?;
    let target = outside.path().canonicalize()?.join("escaped.txt");
    let write = format!("touch {}", target.display());

    let s = Setup::new(&["shell"]).await?;
    // Yes to the command, no to running it outside: it stays confined.
    s.approver.script(&[Answer::Once, Answer::Deny]);
    let o = s.shell(&write).await?;
    assert!(!target.exists(), "{}", o.content);
    assert!(
        o.content.contains("refused by the sandbox"),
        "{}",
        o.content
    );
    let asked = s.approver.asked();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0], write);
    assert_eq!(
        asked[1],
        format!("OUTSIDE the sandbox, with your full rights: {write}")
    );

    // Yes to both: it runs once outside, and the result says so.
    s.approver.script(&[Answer::Once, Answer::Session]);
    let o = s.shell(&write).await?;
    assert!(target.exists(), "{}", o.content);
    assert!(
        o.content.contains("approved running it again outside"),
        "{}",
        o.content
    );
    std::fs::remove_file(&target)?;
    // "session" was not remembered: the next failure asks again.
    s.approver.script(&[Answer::Once, Answer::Deny]);
    let _ = s.shell(&write).await?;
    assert!(!target.exists());
    assert_eq!(s.approver.asked().len(), 6, "{:?}", s.approver.asked());

    // Under `auto` nobody is asked to run it outside, and it stays confined.
    let auto = Setup::configured(&["shell"], |g| {
        g.exec_policy = keel_kernel::gates::exec_policy::ExecPolicy::builtin()
            .with_approval(keel_kernel::gates::exec_policy::ApprovalMode::Auto);
    })
    .await?;
    let o = auto.shell(&write).await?;
    assert!(!target.exists(), "{}", o.content);
    assert!(
        auto.approver
            .asked()
            .iter()
            .all(|a| !a.starts_with("OUTSIDE")),
        "{:?}",
        auto.approver.asked()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_shell_carries_the_directory_times_out_and_spills() -> R {
    let s = Setup::new(&["shell", "fs-tools"]).await?;
    std::fs::create_dir(s.ws.join("sub"))?;

    // The working directory carries over, also across a reload of the plugin.
    let o = s.shell("cd sub").await?;
    assert!(o.content.contains("cwd: sub"), "{}", o.content);
    let o = s.shell("pwd").await?;
    assert!(
        o.content
            .contains(&format!("{}\n", s.ws.join("sub").display())),
        "{}",
        o.content
    );
    s.kernel().reload(s.h.plugin("shell")?).await?;
    let o = s.shell("pwd").await?;
    assert!(o.content.contains("cwd: sub"), "{}", o.content);

    // It never leaves the workspace: the kernel keeps the old one and says so.
    let o = s.shell("cd /").await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.contains("outside the workspace"), "{}", o.content);
    let o = s.shell("pwd").await?;
    assert!(o.content.contains("cwd: sub"), "{}", o.content);
    let o = s
        .call("exec_shell", json!({"command": "pwd", "workdir": "../.."}))
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(o.content.contains("outside the workspace"), "{}", o.content);
    let o = s
        .call("exec_shell", json!({"command": "pwd", "workdir": "."}))
        .await?;
    assert!(o.content.contains("cwd: .\n"), "{}", o.content);

    // A timeout is an error result with the output so far.
    let o = s
        .call(
            "exec_shell",
            json!({"command": "echo started; sleep 10; echo never", "timeout_ms": 700}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Error);
    assert!(o.content.contains("timed out"), "{}", o.content);
    assert!(o.content.contains("started"), "{}", o.content);
    assert!(!o.content.contains("never"), "{}", o.content);
    assert!(o.exec[0].timed_out);
    assert_eq!(o.exec[0].exit_code, None);

    // Long output: head and tail kept, the full text spilled, the pointer readable.
    let o = s.shell("seq 1 20000").await?;
    assert_status(&o, OutcomeStatus::Ok);
    let spill = o.spill.clone().expect("spilled");
    assert!(spill.starts_with(".keel/spill/"), "{spill}");
    assert!(o.content.len() < 32 * 1024, "{}", o.content.len());
    assert!(o.content.contains("\n1\n2\n3\n"), "head kept");
    assert!(o.content.contains("\n19999\n20000\n"), "tail kept");
    assert!(!o.content.contains("\n10000\n"), "middle cut");
    assert!(o.content.contains(&spill), "pointer given");
    let full = std::fs::read_to_string(s.ws.join(&spill))?;
    assert!(full.contains("\n10000\n"));
    let o = s
        .call(
            "read_file",
            json!({"path": spill, "offset": 10003, "limit": 3}),
        )
        .await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert!(o.content.contains("\t10000\n"), "{}", o.content);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// session-log

async fn read_log(s: &Setup, session: &str) -> anyhow::Result<Value> {
    let text = s
        .kernel()
        .call_service(
            services::SESSION_LOG,
            "read",
            &json!({ "session": session }).to_string(),
        )
        .await?;
    Ok(serde_json::from_str(&text)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_log_appends_events_and_reads_torn_logs() -> R {
    let s = Setup::new(&["session-log"]).await?;
    let events = [
        SessionEvent::SessionStarted {
            session: "s1".into(),
            workspace: s.ws.display().to_string(),
            model: "canned".into(),
        },
        SessionEvent::Message {
            session: "s1".into(),
            message: Message::user_text("fix the tests"),
            stop_reason: None,
            usage: None,
        },
        SessionEvent::Message {
            session: "s1".into(),
            message: Message {
                role: Role::Assistant,
                content: vec![Block::Text {
                    text: "done".into(),
                }],
            },
            stop_reason: None,
            usage: None,
        },
    ];
    for event in &events {
        s.kernel()
            .emit(topics::SESSION_EVENT, &serde_json::to_string(event)?)?;
    }
    let file = s.data.join("sessions").join("s1.jsonl");
    let mut read = Value::Null;
    for _ in 0..100 {
        read = read_log(&s, "s1").await.unwrap_or(Value::Null);
        if read["lines"].as_array().is_some_and(|l| l.len() == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<LogLine> = serde_json::from_value(read["lines"].clone())?;
    assert_eq!(lines.len(), 3, "{read}");
    assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(lines[1].event, events[1]);
    assert!(lines[0].time_ms > 1_600_000_000_000, "{}", lines[0].time_ms);
    assert_eq!(read["warnings"], json!([]));
    // The file on disk is the JSONL log itself.
    let on_disk = std::fs::read_to_string(&file)?;
    assert_eq!(on_disk.lines().count(), 3);
    let first: LogLine = serde_json::from_str(on_disk.lines().next().unwrap_or_default())?;
    assert_eq!(first.event, events[0]);

    let conversation = s
        .kernel()
        .call_service(
            services::SESSION_LOG,
            "conversation",
            r#"{"session": "s1"}"#,
        )
        .await?;
    let conversation: Value = serde_json::from_str(&conversation)?;
    assert_eq!(conversation["messages"].as_array().map(Vec::len), Some(2));

    // A torn last line is skipped with a warning, never fatal.
    let torn = s.data.join("sessions").join("s2.jsonl");
    std::fs::write(
        &torn,
        format!(
            "{}\n{{\"seq\":1,\"time_ms\":5,\"kind\":\"mess",
            serde_json::to_string(&LogLine {
                seq: 0,
                time_ms: 4,
                event: SessionEvent::Message {
                    session: "s2".into(),
                    message: Message::user_text("hello"),
                    stop_reason: None,
                    usage: None,
                },
            })?
        ),
    )?;
    let read = read_log(&s, "s2").await?;
    assert_eq!(read["lines"].as_array().map(Vec::len), Some(1), "{read}");
    let warning = read["warnings"][0]["message"].as_str().unwrap_or_default();
    assert!(warning.contains("torn last line"), "{read}");
    assert_eq!(read["warnings"][0]["line"], 2);

    // Appending after the torn line continues the sequence on a fresh line.
    let seq = s
        .kernel()
        .call_service(
            services::SESSION_LOG,
            "append",
            &serde_json::to_string(&SessionEvent::TurnEnded {
                session: "s2".into(),
                end: keel_protocol::TurnEnd::Completed,
                detail: String::new(),
            })?,
        )
        .await?;
    assert_eq!(serde_json::from_str::<Value>(&seq)?, json!({"seq": 1}));
    let read = read_log(&s, "s2").await?;
    assert_eq!(read["lines"].as_array().map(Vec::len), Some(2), "{read}");

    let list = s
        .kernel()
        .call_service(services::SESSION_LOG, "list", "")
        .await?;
    let list: Value = serde_json::from_str(&list)?;
    let ids: Vec<&str> = list
        .as_array()
        .map(|l| l.iter().filter_map(|e| e["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(ids.contains(&"s1") && ids.contains(&"s2"), "{list}");
    let s1 = list
        .as_array()
        .and_then(|l| l.iter().find(|e| e["id"] == "s1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(s1["entries"], 3);
    assert_eq!(s1["preview"], "fix the tests");

    // An unsafe session id is refused, not turned into a path.
    let e = s
        .kernel()
        .call_service(services::SESSION_LOG, "read", r#"{"session": "../x"}"#)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("not valid"), "{e}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// verifier

/// The verifier's verdict on a turn, asked through its typed door (ABI 0.6.0), as the agent
/// loop asks.
async fn verify(
    s: &Setup,
    final_text: &str,
    calls: &[TurnCall],
) -> anyhow::Result<Option<Verdict>> {
    let request = VerifyRequest {
        session: "s1".into(),
        final_text: final_text.into(),
        calls: calls.to_vec(),
    };
    match s
        .kernel()
        .call_service_typed(&keel_kernel::ServiceCall::Verify(request))
        .await?
    {
        keel_kernel::ServiceAnswer::Verdict(verdict) => Ok(verdict),
        other => anyhow::bail!("the verifier answered {other:?}"),
    }
}

/// The same through its JSON door, as a caller of an earlier ABI asks.
async fn verify_json(
    s: &Setup,
    final_text: &str,
    calls: &[TurnCall],
) -> anyhow::Result<Option<Verdict>> {
    let request = VerifyRequest {
        session: "s1".into(),
        final_text: final_text.into(),
        calls: calls.to_vec(),
    };
    let answer = s
        .kernel()
        .call_service(
            services::VERIFIER,
            "verify",
            &serde_json::to_string(&request)?,
        )
        .await?;
    Ok(serde_json::from_str(&answer)?)
}

fn turn_call(input: Value, outcome: ToolOutcome) -> TurnCall {
    TurnCall {
        call_id: outcome.call_id.clone(),
        tool: outcome.tool.clone(),
        input,
        outcome,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verifier_replays_claims_through_the_kernel() -> R {
    let s = Setup::new(&["shell", "verifier"]).await?;
    std::fs::write(s.ws.join("Makefile"), "test:\n\t@sh test.sh\n")?;
    std::fs::write(
        s.ws.join("test.sh"),
        "echo 'running 3 tests'\nif [ -f broken ]; then echo 'test parse ... FAILED'; exit 1; fi\necho 'test result: ok. 3 passed'\n",
    )?;
    s.kernel().begin_turn();
    let input = json!({"command": "make test"});
    let o = s.call("exec_shell", input.clone()).await?;
    assert_status(&o, OutcomeStatus::Ok);
    assert_eq!(o.exec[0].exit_code, Some(0), "{o:#?}");
    let make_test = turn_call(input, o);

    // The claim holds: the replay passes (asked through the JSON door; the rest through the
    // typed one).
    let v = verify_json(
        &s,
        "I fixed the parser. All tests pass now.",
        std::slice::from_ref(&make_test),
    )
    .await?
    .expect("a claim was made");
    assert_eq!(v.status, VerdictStatus::VerifiedPass, "{v:#?}");
    assert_eq!(v.dimension, "tests");
    assert_eq!(v.command.as_deref(), Some("make test"));
    assert_eq!(v.call_id.as_deref(), Some(make_test.call_id.as_str()));
    assert_eq!(v.exit_code, Some(0));
    assert!(v.evidence.contains("3 passed"), "{}", v.evidence);

    // The code broke after the run: the same claim is now refuted by the replay.
    std::fs::write(s.ws.join("broken"), "")?;
    let v = verify(&s, "All tests pass.", std::slice::from_ref(&make_test))
        .await?
        .expect("a claim was made");
    assert_eq!(v.status, VerdictStatus::VerifiedFail, "{v:#?}");
    assert_eq!(v.failure_type.as_deref(), Some("test-failure"));
    assert_ne!(v.exit_code, Some(0));
    assert!(v.evidence.contains("FAILED"), "{}", v.evidence);

    // No command behind the claim: unsubstantiated. No claim: no verdict.
    let v = verify(&s, "All tests pass.", &[]).await?.expect("a claim");
    assert_eq!(v.status, VerdictStatus::Unsubstantiated, "{v:#?}");
    assert_eq!(
        verify(
            &s,
            "I changed the parser.",
            std::slice::from_ref(&make_test)
        )
        .await?,
        None
    );

    // A call the person refused never ran, so the kernel refuses to replay it.
    s.approver.set(Answer::Deny);
    let input = json!({"command": "ctest --output-on-failure"});
    let o = s.call("exec_shell", input.clone()).await?;
    assert_status(&o, OutcomeStatus::Refused);
    let refused = turn_call(input, o);
    let v = verify(&s, "All tests pass.", std::slice::from_ref(&refused))
        .await?
        .expect("a claim");
    assert_eq!(v.status, VerdictStatus::VerifyError, "{v:#?}");
    assert_eq!(v.failure_type.as_deref(), Some("refused"));
    assert!(
        v.evidence
            .contains("was not approved and run in the current turn"),
        "{}",
        v.evidence
    );
    assert_eq!(
        s.approver.asked(),
        ["ctest --output-on-failure"],
        "the replay asked nobody"
    );

    // An approved call of an earlier turn cannot be replayed either.
    s.kernel().begin_turn();
    let v = verify(&s, "All tests pass.", std::slice::from_ref(&make_test))
        .await?
        .expect("a claim");
    assert_eq!(v.status, VerdictStatus::VerifyError, "{v:#?}");
    assert!(v.evidence.contains("current turn"), "{}", v.evidence);

    // Every verdict is in the ledger; stats count them.
    let stats = s
        .kernel()
        .call_service(services::VERIFIER, "stats", "")
        .await?;
    let stats: Value = serde_json::from_str(&stats)?;
    assert_eq!(stats["verified_pass"], 1, "{stats}");
    assert_eq!(stats["verified_fail"], 1, "{stats}");
    assert_eq!(stats["unsubstantiated"], 1, "{stats}");
    assert_eq!(stats["verify_error"], 2, "{stats}");
    assert_eq!(stats["total"], 5, "{stats}");
    assert_eq!(stats["claim_match_rate"], 0.5, "{stats}");
    let ledger = std::fs::read_to_string(s.data.join("verifier").join("verdicts.jsonl"))?;
    assert_eq!(ledger.lines().count(), 5);
    Ok(())
}
