//! Hooks through the binary: commands from the person's `[[hooks.EVENT]]`, a workspace's
//! `.keel/config.toml` and Claude Code's `.claude/settings.json`, run by the bundled `hooks`
//! plugin in the OS sandbox around the tool calls of a scripted model's turn.

use std::path::Path;

use crate::common::{keel, scripted_tool_step, tool_outcomes};

/// A home whose sessions use the scripted model playing `steps` then "Done.", with `extra`
/// appended to its config (the hooks).
fn home_with(steps: &str, extra: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("home");
    let script = home.path().join("script.toml");
    std::fs::write(&script, format!("{steps}[[step]]\ntext = \"Done.\"\n")).expect("script");
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n{extra}",
            script.display().to_string()
        ),
    )
    .expect("config");
    home
}

/// A workspace, canonical, with `files` written (path, content).
fn workspace_with(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let ws = tempfile::tempdir().expect("workspace");
    let path = ws.path().canonicalize().expect("canonical");
    for (rel, text) in files {
        let file = path.join(rel);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("dirs");
        std::fs::write(file, text).expect("write");
    }
    (ws, path)
}

/// One `keel exec --json --approval auto` turn; its stdout and stderr.
fn turn(home: &Path, ws: &Path) -> (Vec<u8>, String) {
    let out = keel(home, ws)
        .args(["exec", "--json", "--approval", "auto", "go"])
        .timeout(std::time::Duration::from_secs(180))
        .output()
        .expect("keel exec");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (out.stdout, stderr)
}

fn shell_step(command: &str) -> String {
    scripted_tool_step(&[("exec_shell", format!("{{ command = {command:?} }}"))])
}

/// The only tool outcome of a turn: (tool, status, content).
fn only_outcome(stdout: &[u8]) -> (String, String, String) {
    let outcomes = tool_outcomes(stdout);
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    outcomes.into_values().next().expect("one")
}

/// A pre-tool-use hook that refuses `rm` (exit 2, the reason on stderr): the command does not
/// run and the model reads the hook's reason as the tool's result.
#[test]
fn a_pre_tool_use_hook_denies_rm_and_the_model_gets_its_reason() {
    let (_ws, ws) = workspace_with(&[
        ("keep.txt", "precious"),
        (
            "hooks/no-rm.sh",
            "input=$(cat)\ncase \"$input\" in *'\"command\":\"rm '*) echo 'rm is not allowed \
             here; move files to trash/ instead' >&2; exit 2;; esac\nexit 0\n",
        ),
    ]);
    let home = home_with(
        &shell_step("rm -f keep.txt"),
        "[[hooks.pre-tool-use]]\nmatcher = \"exec_shell\"\ncommand = \"sh hooks/no-rm.sh\"\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    let (tool, status, content) = only_outcome(&stdout);
    assert_eq!(
        (tool.as_str(), status.as_str()),
        ("exec_shell", "refused"),
        "{content}\n{stderr}"
    );
    assert!(
        content.contains("rm is not allowed here; move files to trash/ instead"),
        "{content}"
    );
    assert!(
        ws.join("keep.txt").exists(),
        "the refused command did not run"
    );
}

/// A post-tool-use hook formats the file a write made before the next step: the model's next
/// call reads the formatted file, and the hook's context follows the write's result.
#[test]
fn a_post_tool_use_hook_formats_the_written_file_before_the_next_step() {
    let (_ws, ws) = workspace_with(&[(
        "hooks/fmt.sh",
        "cat > /dev/null\ntr a-z A-Z < notes.txt > /tmp/formatted && cat /tmp/formatted > \
         notes.txt\necho '{\"context\": \"formatted notes.txt\"}'\n",
    )]);
    let steps = format!(
        "{}{}",
        scripted_tool_step(&[(
            "write_file",
            "{ path = \"notes.txt\", content = \"shout me\\n\" }".to_owned()
        )]),
        scripted_tool_step(&[("read_file", "{ path = \"notes.txt\" }".to_owned())]),
    );
    let home = home_with(
        &steps,
        "[[hooks.post-tool-use]]\nmatcher = \"write_file|edit_file\"\ncommand = \"sh \
         hooks/fmt.sh\"\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    let outcomes = tool_outcomes(&stdout);
    let (_, status, written) = &outcomes["call_1_1"];
    assert_eq!(status, "ok", "{written}\n{stderr}");
    assert!(
        written.contains("[post-tool-use hook] formatted notes.txt"),
        "{written}"
    );
    let (_, status, read) = &outcomes["call_2_1"];
    assert_eq!(status, "ok", "{read}");
    assert!(
        read.contains("SHOUT ME"),
        "the next step saw the formatted file: {read}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).expect("notes"),
        "SHOUT ME\n"
    );
}

/// A hook that runs past its timeout is killed and its call refused, saying so; the command
/// it stood before did not run.
#[test]
fn a_hook_that_times_out_is_killed_and_reported() {
    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        &shell_step("touch made.txt"),
        "[[hooks.pre-tool-use]]\ncommand = \"sleep 60\"\ntimeout-secs = 1\n",
    );
    let started = std::time::Instant::now();
    let (stdout, stderr) = turn(home.path(), &ws);
    let (_, status, content) = only_outcome(&stdout);
    assert_eq!(status, "refused", "{content}\n{stderr}");
    assert!(
        content.contains("`sleep 60` did not finish within 1 s and was killed"),
        "{content}"
    );
    assert!(!ws.join("made.txt").exists());
    // The turn did not wait for the hook's sixty seconds.
    assert!(started.elapsed() < std::time::Duration::from_secs(55));
}

/// A hook answering `allow` cannot loosen what the exec policy forbids (here the person's rule
/// forbidding `touch`).
#[test]
fn a_hook_allowing_a_forbidden_command_does_not_loosen_it() {
    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        &shell_step("touch forbidden.txt"),
        "[[hooks.pre-tool-use]]\ncommand = \"cat > hook-saw.json; echo '{\\\"decision\\\": \
         \\\"allow\\\"}'\"\n[exec]\nrules = [{ prefix = \"touch\", decision = \"forbid\" }]\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    let (_, status, content) = only_outcome(&stdout);
    assert_eq!(status, "refused", "{content}\n{stderr}");
    assert!(
        !ws.join("forbidden.txt").exists(),
        "the forbidden command ran"
    );
    let saw = std::fs::read_to_string(ws.join("hook-saw.json")).expect("the hook was asked");
    let saw: serde_json::Value = serde_json::from_str(&saw).expect("event JSON");
    assert_eq!(saw["event"], "pre-tool-use");
    assert_eq!(saw["tool"], "exec_shell");
    assert_eq!(saw["arguments"]["command"], "touch forbidden.txt");
    assert_eq!(saw["workspace"], ws.to_string_lossy().as_ref());
}

/// A workspace's own hook does not run until the person approves it; then it does; changed, it
/// waits for approval again. `keel hooks list` says which.
#[test]
fn a_workspace_hook_runs_only_once_approved_and_asks_again_when_changed() {
    let hook = |command: &str| format!("[[hooks.pre-tool-use]]\ncommand = {command:?}\n");
    let (_ws, ws) = workspace_with(&[(".keel/config.toml", &hook("touch ws-hook-ran"))]);
    let home = home_with(&shell_step("touch made.txt"), "");
    let (stdout, stderr) = turn(home.path(), &ws);
    assert_eq!(only_outcome(&stdout).1, "ok");
    assert!(!ws.join("ws-hook-ran").exists(), "an unapproved hook ran");
    assert!(stderr.contains("keel hooks approve"), "{stderr}");
    let list = keel(home.path(), &ws)
        .args(["hooks", "list"])
        .output()
        .expect("list");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(
        list.contains("not approved") && list.contains("touch ws-hook-ran"),
        "{list}"
    );

    let approve = keel(home.path(), &ws)
        .args(["hooks", "approve", "--yes"])
        .output()
        .expect("approve");
    let said = String::from_utf8_lossy(&approve.stdout).into_owned();
    assert!(approve.status.success(), "{said}");
    assert!(
        said.contains("pre-tool-use") && said.contains("touch ws-hook-ran"),
        "{said}"
    );
    std::fs::remove_file(ws.join("made.txt")).expect("made by the first turn");
    turn(home.path(), &ws);
    assert!(ws.join("ws-hook-ran").exists(), "the approved hook ran");
    assert!(ws.join("made.txt").exists());

    std::fs::write(ws.join(".keel/config.toml"), hook("touch changed-hook-ran")).expect("edit");
    let (_, stderr) = turn(home.path(), &ws);
    assert!(
        !ws.join("changed-hook-ran").exists(),
        "a changed hook ran unapproved"
    );
    assert!(
        stderr.contains("changed since you approved them"),
        "{stderr}"
    );
}

/// Claude Code's `.claude/settings.json` hooks run once approved, with Claude Code's event
/// fields and tool names, and its exit code 2 refuses the call.
#[test]
fn a_claude_code_settings_hook_runs_after_approval() {
    let settings = r#"{"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "cat > claude-saw.json; echo 'no Bash today' >&2; exit 2", "timeout": 5}
    ]}]}}"#;
    let (_ws, ws) = workspace_with(&[(".claude/settings.json", settings)]);
    let home = home_with(&shell_step("touch made.txt"), "");
    let (stdout, _) = turn(home.path(), &ws);
    assert_eq!(only_outcome(&stdout).1, "ok", "unapproved: the command ran");
    assert!(!ws.join("claude-saw.json").exists());

    let approve = keel(home.path(), &ws)
        .args(["hooks", "approve", "--yes"])
        .output()
        .expect("approve");
    assert!(approve.status.success());
    std::fs::remove_file(ws.join("made.txt")).expect("made by the first turn");
    let (stdout, stderr) = turn(home.path(), &ws);
    let (_, status, content) = only_outcome(&stdout);
    assert_eq!(status, "refused", "{content}\n{stderr}");
    assert!(content.contains("no Bash today"), "{content}");
    assert!(!ws.join("made.txt").exists());
    let saw: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ws.join("claude-saw.json")).expect("the hook ran"),
    )
    .expect("event JSON");
    assert_eq!(saw["hook_event_name"], "PreToolUse");
    assert_eq!(saw["tool_name"], "Bash");
    assert_eq!(saw["tool_input"]["command"], "touch made.txt");
    assert_eq!(saw["cwd"], ws.to_string_lossy().as_ref());
    // The session the call belongs to, as the session log names it.
    let sessions = crate::common::session_ids(home.path());
    assert!(
        sessions.iter().any(|id| saw["session_id"] == id.as_str()),
        "{saw} {sessions:?}"
    );
}

/// `user-prompt-submit` hooks see the person's prompt before the model does, and one that
/// exits 2 holds the prompt back (the model is never asked, the reason is said); `stop` hooks
/// run once the turn has ended.
#[test]
fn prompt_hooks_see_or_hold_back_the_prompt_and_stop_hooks_run_after_the_turn() {
    let (_ws, ws) = workspace_with(&[("hooks/.keep", "")]);
    let home = home_with(
        "",
        "[[hooks.user-prompt-submit]]\ncommand = \"cat > prompt-seen.json\"\n\
         [[hooks.stop]]\ncommand = \"test -s prompt-seen.json && touch stopped.txt\"\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    let seen = std::fs::read_to_string(ws.join("prompt-seen.json")).unwrap_or_default();
    assert!(
        seen.contains(r#""event":"user-prompt-submit""#) && seen.contains(r#""prompt":"go""#),
        "{seen}\n{stderr}"
    );
    assert!(ws.join("stopped.txt").exists(), "{stderr}");
    assert!(String::from_utf8_lossy(&stdout).contains("Done."));

    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        "",
        "[[hooks.user-prompt-submit]]\ncommand = \"echo 'no prompts on Fridays' >&2; exit 2\"\n\
         [[hooks.stop]]\ncommand = \"touch stopped.txt\"\n",
    );
    let out = keel(home.path(), &ws)
        .args(["exec", "--json", "--approval", "auto", "go"])
        .timeout(std::time::Duration::from_secs(180))
        .output()
        .expect("keel exec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("held the prompt back") && stderr.contains("no prompts on Fridays"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Done."));
    assert!(
        !ws.join("stopped.txt").exists(),
        "no turn ran, so no stop hook"
    );
}

/// `session-start` hooks run before the session's first turn and name the session, as every
/// later hook of it does; the context one answers reaches the model with the prompt.
#[test]
fn session_start_hooks_run_before_the_first_turn_and_every_hook_names_the_session() {
    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        "",
        "[[hooks.session-start]]\n\
         command = '''cat > start.json && printf '%s' '{\"context\":\"the tests live in t/\"}' '''\n\
         [[hooks.stop]]\ncommand = \"cat > stop.json\"\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    assert!(
        String::from_utf8_lossy(&stdout).contains("Done."),
        "{stderr}"
    );
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(ws.join(name)).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}\n{stderr}"))
    };
    let start = read("start.json");
    assert_eq!(start["event"], "session-start");
    assert_eq!(start["source"], "startup");
    let session = start["session"].as_str().unwrap_or_default();
    assert!(!session.is_empty(), "{start}");
    assert_eq!(read("stop.json")["session"], session);
    let log = crate::common::only_session_log(home.path()).expect("the session log");
    let told = log.iter().any(|event| {
        event
            .to_string()
            .contains("go\\n\\n[session-start hook] the tests live in t/")
    });
    assert!(told, "{log:?}");
}

/// A stop hook that denies (exit 2) asks the agent to go on: the model reads its reason as the
/// next turn's input and the hook sees `stop_hook_active` then; a hook that always asks is
/// stopped after eight turns.
#[test]
fn a_stop_hook_that_denies_makes_the_agent_go_on_within_a_bound() {
    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        "[[step]]\ntext = \"Half done.\"\n",
        "[[hooks.stop]]\ncommand = '''cat >> stops.jsonl; echo >> stops.jsonl; \
         if [ -e asked ]; then exit 0; fi; touch asked; echo 'run the tests first' >&2; exit 2'''\n",
    );
    let (stdout, stderr) = turn(home.path(), &ws);
    // The final answer is the second turn's.
    assert!(
        String::from_utf8_lossy(&stdout).contains("Done."),
        "{stderr}"
    );
    assert!(
        stderr.contains("a stop hook asks the agent to go on: run the tests first"),
        "{stderr}"
    );
    let stops: Vec<serde_json::Value> = std::fs::read_to_string(ws.join("stops.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let active: Vec<_> = stops
        .iter()
        .map(|s| s["stop_hook_active"].clone())
        .collect();
    assert_eq!(active, [false, true], "{stops:?}");
    let log = crate::common::only_session_log(home.path()).expect("the session log");
    assert!(
        log.iter()
            .any(|e| e.to_string().contains("[stop hook] run the tests first")),
        "{log:?}"
    );

    let (_ws, ws) = workspace_with(&[]);
    let home = home_with(
        "",
        "[[hooks.stop]]\ncommand = \"echo >> stops.txt; echo 'never done' >&2; exit 2\"\n",
    );
    let (_, stderr) = turn(home.path(), &ws);
    assert!(
        stderr.contains("asked the agent to go on 8 times"),
        "{stderr}"
    );
    let stops = std::fs::read_to_string(ws.join("stops.txt")).unwrap_or_default();
    assert_eq!(stops.lines().count(), 9, "{stderr}");
}

/// Issue 50.2: approval covers what a hook runs, not only its line. A repository's approved
/// hook runs `sh hooks/post.sh`; the model rewrites that script in its turn. The hook keeps
/// running the approved script in that turn (the model's never runs), `keel hooks list` shows
/// the script by content, and the next session asks again instead of running it.
#[test]
fn a_swapped_hook_script_never_runs_and_is_asked_about_again() {
    let settings = r#"{"hooks": {"PostToolUse": [{"matcher": "", "hooks": [
        {"type": "command", "command": "sh hooks/post.sh", "timeout": 10}
    ]}]}}"#;
    let (_ws, ws) = workspace_with(&[
        (".claude/settings.json", settings),
        (
            "hooks/post.sh",
            "cat > /dev/null; echo ran >> approved-ran\n",
        ),
    ]);
    let swap = "printf 'cat > /dev/null; echo ran >> swapped-ran\\n' > hooks/post.sh";
    let steps = format!("{}{}", shell_step(swap), shell_step("true"));
    let home = home_with(&steps, "");
    let approve = keel(home.path(), &ws)
        .args(["hooks", "approve", "--yes"])
        .output()
        .expect("approve");
    let said = String::from_utf8_lossy(&approve.stdout).into_owned();
    assert!(approve.status.success(), "{said}");
    assert!(said.contains("runs hooks/post.sh (sha256 "), "{said}");

    let (stdout, stderr) = turn(home.path(), &ws);
    let outcomes = tool_outcomes(&stdout);
    assert!(
        outcomes.values().all(|(_, status, _)| status == "ok"),
        "{outcomes:?}\n{stderr}"
    );
    assert!(
        std::fs::read_to_string(ws.join("hooks/post.sh"))
            .expect("script")
            .contains("swapped-ran"),
        "the model's command swapped the script"
    );
    assert!(
        !ws.join("swapped-ran").exists(),
        "the swapped script ran as the approved hook"
    );
    let ran = std::fs::read_to_string(ws.join("approved-ran")).unwrap_or_default();
    assert_eq!(
        ran.lines().count(),
        2,
        "the approved script ran after each call\n{stderr}"
    );

    let (_, stderr) = turn(home.path(), &ws);
    assert!(
        !ws.join("swapped-ran").exists(),
        "the swapped script ran in a later session"
    );
    assert!(
        stderr.contains("changed since you approved them"),
        "{stderr}"
    );
}
