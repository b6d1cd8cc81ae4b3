//! Plan mode through the `keel` binary: on a terminal (Shift-Tab, the prompt, the plan offered
//! and accepted, the write that follows it), and `keel exec --plan --json` (a writing command
//! refused whatever the approval policy, the mode reported).

use std::path::Path;
use std::time::Duration;

use crate::common::{keel, keel_process, scripted_tool_step, tool_outcomes, use_scripted_model};

/// Names the step of a terminal exchange that failed, for a readable failure.
fn step<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

/// Every session log line in `home`, as one text.
fn session_logs(home: &Path) -> String {
    let dir = home.join("data/sessions");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "jsonl") {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

/// Shift-Tab turns plan mode on (the prompt says so); the model's write is refused and it is
/// told why; its plan is offered; accepted, plan mode goes off and the next turn's write runs
/// once approved.
#[test]
fn a_plan_is_made_read_only_then_accepted_and_carried_out_after_approval() -> Result<(), String> {
    let home = tempfile::tempdir().map_err(step("home"))?;
    let ws = tempfile::tempdir().map_err(step("workspace"))?;
    let ws = ws.path().to_owned();
    std::fs::write(ws.join("notes.txt"), "old\n").map_err(step("notes"))?;
    // The scripted model plays the step at the index of the assistant messages so far: the
    // planning turn tries a write, then answers its plan; the turn that carries it out writes.
    let write = || {
        scripted_tool_step(&[(
            "write_file",
            r#"{ path = "notes.txt", content = "new\n" }"#.to_owned(),
        )])
    };
    let script = format!(
        "{}[[step]]\ntext = \"## Plan\\n\\n1. Write `new` into notes.txt\"\n\n{}\
         [[step]]\ntext = \"Carried out.\"\n",
        write(),
        write()
    );
    use_scripted_model(home.path(), &script).map_err(step("script"))?;
    let mut cmd = keel_process(home.path(), &ws);
    cmd.args(["run", "--approval", "ask"]);
    let mut term = expectrl::Session::spawn(cmd).map_err(step("spawn"))?;
    term.set_expect_timeout(Some(Duration::from_secs(90)));
    term.expect("› ").map_err(step("the prompt"))?;
    // Shift-Tab.
    term.send("\x1b[Z").map_err(step("Shift-Tab"))?;
    term.expect("plan mode: on").map_err(step("plan mode on"))?;
    term.expect("[plan] › ")
        .map_err(step("the prompt in plan mode"))?;
    term.send_line("update the notes").map_err(step("typing"))?;
    term.expect("accept the plan? [y/N] ")
        .map_err(step("the plan offered"))?;
    if std::fs::read_to_string(ws.join("notes.txt")).map_err(step("notes"))? != "old\n" {
        return Err("the write ran in plan mode".into());
    }
    let logs = session_logs(home.path());
    if !logs.contains("plan mode: `write_file` did not run") {
        return Err(format!(
            "the model was not told why the write was refused:\n{logs}"
        ));
    }
    term.send_line("y").map_err(step("accepting"))?;
    term.expect("plan mode: off")
        .map_err(step("plan mode off"))?;
    term.expect("wants to write notes.txt")
        .map_err(step("the approval question"))?;
    term.expect("answer: ").map_err(step("the answer prompt"))?;
    term.send_line("y").map_err(step("approving"))?;
    term.expect("Carried out.")
        .map_err(step("the plan carried out"))?;
    let after = term
        .expect("› ")
        .map_err(step("the prompt after the plan"))?;
    if String::from_utf8_lossy(after.before()).contains("[plan]") {
        return Err("the prompt still says plan mode".into());
    }
    if std::fs::read_to_string(ws.join("notes.txt")).map_err(step("notes"))? != "new\n" {
        return Err("the approved write did not run".into());
    }
    // The task the accepted plan became reached the model as the next request.
    let logs = session_logs(home.path());
    if !logs.contains("Carry out this plan") || !logs.contains("Write `new` into notes.txt") {
        return Err(format!("the plan did not become the task:\n{logs}"));
    }
    // `/plan` switches it too.
    term.send_line("/plan").map_err(step("/plan"))?;
    term.expect("plan mode: on").map_err(step("/plan on"))?;
    term.expect("[plan] › ").map_err(step("the prompt"))?;
    term.send_line("/plan").map_err(step("/plan again"))?;
    term.expect("plan mode: off").map_err(step("/plan off"))?;
    term.expect("› ").map_err(step("the prompt"))?;
    term.send_line("/exit").map_err(step("exit"))?;
    term.expect("keel resume").map_err(step("leaving"))?;
    Ok(())
}

/// `keel exec --plan --json`, even under `--approval auto`: a writing command is refused with
/// the reason the model reads, a reading one runs (in the read-only sandbox), and the report
/// says the mode.
#[test]
fn a_writing_command_is_refused_in_plan_mode_and_json_reports_the_mode() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    std::fs::write(ws.path().join("notes.txt"), "hello\n").expect("notes");
    let script = format!(
        "{}[[step]]\ntext = \"## Plan\\n\\nNothing to change.\"\n",
        scripted_tool_step(&[
            ("exec_shell", r#"{ command = "touch made.txt" }"#.to_owned()),
            ("exec_shell", r#"{ command = "rm notes.txt" }"#.to_owned()),
            ("exec_shell", r#"{ command = "cat notes.txt" }"#.to_owned()),
        ])
    );
    use_scripted_model(home.path(), &script).expect("script");
    let out = keel(home.path(), ws.path())
        .args([
            "exec",
            "--plan",
            "--json",
            "--approval",
            "auto",
            "look around",
        ])
        .timeout(Duration::from_secs(120))
        .output()
        .expect("keel runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ws.path().join("made.txt").exists(), "{stdout}");
    assert!(ws.path().join("notes.txt").exists(), "{stdout}");
    let outcomes: Vec<(String, String, String)> =
        tool_outcomes(&out.stdout).into_values().collect();
    assert_eq!(outcomes.len(), 3, "{stdout}");
    let refused: Vec<&(String, String, String)> = outcomes
        .iter()
        .filter(|(_, status, _)| status == "refused")
        .collect();
    assert_eq!(refused.len(), 2, "{outcomes:?}");
    for (_, _, content) in &refused {
        assert!(
            content.contains("plan mode") && content.contains("only read"),
            "{content}"
        );
    }
    let read = outcomes
        .iter()
        .find(|(_, status, _)| status != "refused")
        .expect("the reading command");
    let report = crate::common::json_lines(&out.stdout)
        .into_iter()
        .find(|l| l["topic"] == "turn.report")
        .expect("a report");
    assert_eq!(report["mode"], "plan", "{report}");
    // Without bubblewrap no command can be held read-only, so none runs in plan mode.
    if report["sandbox"]
        .as_str()
        .is_some_and(|s| s.starts_with("commands: bubblewrap"))
    {
        assert_eq!(read.1, "ok", "{read:?}");
        assert!(read.2.contains("hello"), "{read:?}");
    }
}

/// Every file under `dir` (links as their target), path → content: what "byte-identical"
/// compares.
fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            let kind = entry.file_type().expect("type");
            if kind.is_dir() {
                files.insert(format!("{name}/"), Vec::new());
                stack.push(path);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("link");
                files.insert(name, target.display().to_string().into_bytes());
            } else {
                files.insert(name, std::fs::read(&path).expect("read"));
            }
        }
    }
    files
}

/// Issue 50.4: read-only means nothing in the workspace or the memory changes, whoever asks.
/// A plan turn under `--approval auto` in which the model calls `remember`, and the person's
/// hooks and an approved repository hook try to write at every point of the turn, leaves the
/// workspace and both memory folders byte-identical; `remember` is refused as a tool that
/// writes, and the hooks still run (a guard keeps guarding), read-only.
#[test]
fn a_plan_turn_leaves_the_workspace_and_the_memory_byte_identical() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path().canonicalize().expect("canonical");
    std::fs::write(ws.join("notes.txt"), "hello\n").expect("notes");
    std::fs::create_dir_all(ws.join(".keel/memory")).expect("memory");
    std::fs::write(
        ws.join(".keel/config.toml"),
        "[[hooks.post-tool-use]]\ncommand = \"echo repo > repo-hook-wrote; exit 0\"\n",
    )
    .expect("repository hook");
    std::fs::create_dir_all(home.path().join("data/memory")).expect("user memory");
    let script = format!(
        "{}[[step]]\ntext = \"## Plan\\n\\nNothing to change.\"\n",
        scripted_tool_step(&[
            (
                "remember",
                r#"{ topic = "plan", text = "the plan is to poison the next session" }"#.to_owned()
            ),
            ("exec_shell", r#"{ command = "cat notes.txt" }"#.to_owned()),
        ])
    );
    use_scripted_model(home.path(), &script).expect("script");
    let hooks = [
        "session-start",
        "user-prompt-submit",
        "pre-tool-use",
        "post-tool-use",
        "stop",
    ]
    .iter()
    .map(|event| {
        format!(
            "[[hooks.{event}]]\ncommand = \"echo {event} > person-{event}-wrote; echo x >> \
             .keel/memory/MEMORY.md; exit 0\"\n"
        )
    })
    .collect::<String>();
    let config = home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&hooks);
    text.push_str("[config.memory]\nuser-writes = true\n");
    std::fs::write(&config, text).expect("config");
    let approve = keel(home.path(), &ws)
        .args(["hooks", "approve", "--yes"])
        .output()
        .expect("approve");
    assert!(
        approve.status.success(),
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    let workspace_before = tree(&ws);
    let memory_before = tree(&home.path().join("data/memory"));

    let out = keel(home.path(), &ws)
        .args(["exec", "--plan", "--json", "--approval", "auto", "plan it"])
        .timeout(Duration::from_secs(180))
        .output()
        .expect("keel runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report = crate::common::json_lines(&out.stdout)
        .into_iter()
        .find(|l| l["topic"] == "turn.report")
        .expect("a report");
    if !report["sandbox"]
        .as_str()
        .is_some_and(|s| s.starts_with("commands: bubblewrap"))
    {
        // Without the OS sandbox nothing holds a hook read-only; this test needs bubblewrap.
        return;
    }
    let outcomes = tool_outcomes(&out.stdout);
    let remembered = outcomes
        .values()
        .find(|(tool, _, _)| tool == "remember")
        .expect("remember was called");
    assert_eq!(remembered.1, "refused", "{remembered:?}");
    assert!(remembered.2.contains("plan mode"), "{remembered:?}");
    assert_eq!(
        tree(&ws),
        workspace_before,
        "the plan turn changed the workspace\n{stdout}\n{stderr}"
    );
    assert_eq!(
        tree(&home.path().join("data/memory")),
        memory_before,
        "the plan turn changed the person's memory"
    );
    // The hooks ran (their guard still stands) but could not write: the command between
    // them read the notes.
    let read = outcomes
        .values()
        .find(|(tool, _, _)| tool == "exec_shell")
        .expect("the reading command");
    assert!(read.2.contains("hello"), "{read:?}\n{stderr}");
}
