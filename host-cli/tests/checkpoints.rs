//! Checkpoints and rewind through the binary: a turn whose shell command deletes and creates
//! files, `keel rewind` bringing the tree back, and the rewind undone by its safety checkpoint.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::{keel, scripted_tool_step, session_ids, use_scripted_model};

/// Every path under `root` (links not followed): its kind, mode and bytes or target.
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("inside")
                .to_string_lossy()
                .into_owned();
            if rel == ".keel" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let mode = meta.mode() & 0o7777;
            let seen = if meta.file_type().is_symlink() {
                format!(
                    "link -> {}",
                    std::fs::read_link(&path).expect("link").display()
                )
            } else if meta.is_dir() {
                walk(root, &path, out);
                format!("dir {mode:o}")
            } else {
                format!(
                    "file {mode:o} {:?}",
                    String::from_utf8_lossy(&std::fs::read(&path).expect("read"))
                )
            };
            out.insert(rel, seen);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Run one turn whose only call is `exec_shell` with `command`; the session's id.
fn shell_turn(home: &Path, ws: &Path, command: &str) -> String {
    let script = format!(
        "{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[("exec_shell", format!("{{ command = {command:?} }}"))])
    );
    use_scripted_model(home, &script).expect("script");
    let out = keel(home, ws)
        .args(["exec", "--json", "--approval", "auto", "clean up"])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("keel exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = session_ids(home);
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

fn rewind(home: &Path, ws: &Path, args: &[&str]) -> std::process::Output {
    keel(home, ws)
        .arg("rewind")
        .args(args)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("keel rewind")
}

#[test]
fn a_turns_shell_command_is_rewound_and_the_rewind_undone() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("src/lib.rs"), "pub fn a() {}\n", 0o644);
    write(&ws.join("src/bin/run.sh"), "#!/bin/sh\necho run\n", 0o755);
    write(&ws.join("src/secret.txt"), "only mine\n", 0o600);
    std::fs::create_dir(ws.join("src/empty")).expect("empty dir");
    std::fs::set_permissions(ws.join("src/empty"), std::fs::Permissions::from_mode(0o750))
        .expect("chmod");
    std::os::unix::fs::symlink("lib.rs", ws.join("src/link")).expect("link");
    let before = tree(ws);

    let id = shell_turn(home.path(), ws, "rm -rf src && echo made > new.txt");
    assert!(!ws.join("src").exists(), "the command ran");
    let after = tree(ws);
    assert_eq!(
        std::fs::read_to_string(ws.join("new.txt")).expect("new"),
        "made\n"
    );

    // The checkpoints of the turn: before it, before the call, after it.
    let out = keel(home.path(), ws)
        .args(["checkpoints", "list", &id, "--json"])
        .output()
        .expect("list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let kinds: Vec<&str> = list
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["before-turn", "before-call", "after-turn"],
        "{list:?}"
    );
    assert_eq!(list[1]["tool"], "exec_shell");
    assert_eq!(list[2]["changed_count"], 8, "{list:?}");
    // What the sandboxed command did reached the change journal: the checkpoint after the
    // turn looked only at the paths it named.
    assert!(
        list[2]["walk"]
            .as_str()
            .is_some_and(|w| w.starts_with("journal:")),
        "{list:?}"
    );

    // Without a terminal and without --yes nothing happens.
    let refused = rewind(home.path(), ws, &[&id, "--turn", "1", "--files"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("pass --yes"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(tree(ws), after);

    // A dry run says what would change and changes nothing.
    let dry = rewind(
        home.path(),
        ws,
        &[&id, "--turn", "1", "--files", "--dry-run"],
    );
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let shown = String::from_utf8_lossy(&dry.stdout);
    assert!(
        shown.contains("- new.txt") && shown.contains("+ src/lib.rs"),
        "{shown}"
    );
    assert_eq!(tree(ws), after);

    let done = rewind(home.path(), ws, &[&id, "--turn", "1", "--files", "--yes"]);
    let said = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(
        done.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(tree(ws), before, "{said}");
    // The safety checkpoint is named; rewinding to it redoes what the turn did.
    let safety = said
        .split_whitespace()
        .skip_while(|w| *w != "--checkpoint")
        .nth(1)
        .expect("the safety checkpoint is named")
        .to_owned();
    let redo = rewind(
        home.path(),
        ws,
        &[&id, "--checkpoint", &safety, "--files", "--yes"],
    );
    assert!(
        redo.status.success(),
        "{}{}",
        String::from_utf8_lossy(&redo.stdout),
        String::from_utf8_lossy(&redo.stderr)
    );
    assert_eq!(tree(ws), after);

    // The conversation: a `rewound` entry appended to the log, which keeps every entry.
    let log = home.path().join(format!("data/sessions/{id}.jsonl"));
    let entries_before = std::fs::read_to_string(&log).expect("log").lines().count();
    let conv = rewind(
        home.path(),
        ws,
        &[&id, "--turn", "1", "--conversation", "--yes"],
    );
    assert!(
        conv.status.success(),
        "{}",
        String::from_utf8_lossy(&conv.stderr)
    );
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(text.lines().count(), entries_before + 1);
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("line")).expect("json");
    assert_eq!(last["kind"], "rewound", "{last}");
    assert_eq!(last["keep"], 0, "{last}");
    assert_eq!(tree(ws), after, "--conversation leaves the files alone");
}

/// A turn replaced a directory by a link out of the workspace: the rewind removes the link and
/// brings the directory back, and nothing is written where the link pointed.
#[test]
fn a_rewind_does_not_follow_a_link_out_of_the_workspace() {
    let home = tempfile::tempdir().expect("home");
    let root = tempfile::tempdir().expect("root");
    let ws = root.path().join("ws");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    write(&ws.join("src/lib.rs"), "pub fn a() {}\n", 0o644);
    let before = tree(&ws);
    let id = shell_turn(home.path(), &ws, "rm -rf src && ln -s ../outside src");
    assert!(ws.join("src").is_symlink(), "the command ran");
    let done = rewind(home.path(), &ws, &[&id, "--turn", "1", "--files", "--yes"]);
    assert!(
        done.status.success(),
        "{}{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(tree(&ws), before);
    assert_eq!(std::fs::read_dir(&outside).expect("outside").count(), 0);
}

/// Names the step of a terminal exchange that failed, for a readable failure.
fn step<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

/// `/rewind` in an interactive `keel run` on a terminal: the turn's calls are listed, the
/// picked turn's diff is shown, the files come back byte for byte, and after a conversation
/// rewind the next request goes on from the start of the turn taken back, in the same process.
#[test]
fn slash_rewind_shows_the_diff_and_takes_back_files_and_conversation() -> Result<(), String> {
    use std::time::Duration;
    let home = tempfile::tempdir().map_err(step("home"))?;
    let ws = tempfile::tempdir().map_err(step("workspace"))?;
    let ws = ws.path().to_owned();
    write(&ws.join("notes.txt"), "alpha\nbeta\ngamma\n", 0o644);
    write(&ws.join("src/lib.rs"), "pub fn a() {}\n", 0o644);
    write(&ws.join("src/bin/run.sh"), "#!/bin/sh\necho run\n", 0o755);
    let before = tree(&ws);
    // The scripted model plays the step at the index of the assistant messages in the
    // request: a conversation rewound to the start of turn 2 plays "Second answer." again.
    let script = format!(
        "{}{}[[step]]\ntext = \"Turn one done.\"\n\n[[step]]\ntext = \"Second answer.\"\n\n\
         [[step]]\ntext = \"Third answer.\"\n",
        scripted_tool_step(&[(
            "write_file",
            r#"{ path = "notes.txt", content = "alpha\nBETA\ngamma\n" }"#.to_owned()
        )]),
        scripted_tool_step(&[(
            "exec_shell",
            r#"{ command = "rm -rf src && echo made > new.txt" }"#.to_owned()
        )]),
    );
    use_scripted_model(home.path(), &script).map_err(step("script"))?;
    let mut cmd = crate::common::keel_process(home.path(), &ws);
    cmd.args(["run", "--approval", "auto"]);
    let mut term = expectrl::Session::spawn(cmd).map_err(step("spawn"))?;
    term.set_expect_timeout(Some(Duration::from_secs(90)));
    term.expect("› ").map_err(step("the prompt"))?;
    term.send_line("tidy up").map_err(step("typing"))?;
    term.expect("Turn one done.").map_err(step("turn 1"))?;
    term.expect("› ").map_err(step("the prompt after turn 1"))?;
    let after = tree(&ws);
    if after == before || ws.join("src").exists() {
        return Err(format!("turn 1 did not run its calls: {after:?}"));
    }

    // The list: the turn with its prompt, each call with its tool and input.
    term.send_line("/rewind").map_err(step("/rewind"))?;
    let listed = term
        .expect("rewind to (")
        .map_err(step("the list and its question"))?;
    let listed = String::from_utf8_lossy(listed.before()).into_owned();
    for wanted in [
        "tidy up",
        "⏺ write_file notes.txt",
        "⏺ exec_shell rm -rf src && echo made > new.txt",
    ] {
        if !listed.contains(wanted) {
            return Err(format!("`{wanted}` is not listed:\n{listed}"));
        }
    }
    term.send_line("1").map_err(step("picking turn 1"))?;
    let preview = term
        .expect("[n] cancel? ")
        .map_err(step("the preview and its question"))?;
    let preview = String::from_utf8_lossy(preview.before()).into_owned();
    for wanted in [
        "files: back to c1 (before turn, turn 1)",
        "~ notes.txt",
        "- BETA",
        "+ beta",
        "+ src/lib.rs (brought back)",
        "+ pub fn a() {}",
        "- new.txt (removed",
        "conversation: back to the start of turn 1",
    ] {
        if !preview.contains(wanted) {
            return Err(format!("`{wanted}` is not in the preview:\n{preview}"));
        }
    }
    term.send_line("f").map_err(step("choosing files"))?;
    let done = term
        .expect("undoes this rewind")
        .map_err(step("the files rewound"))?;
    let done = String::from_utf8_lossy(done.before()).into_owned();
    if !done.contains("safety checkpoint c") {
        return Err(format!("the safety checkpoint is not named:\n{done}"));
    }
    term.expect("› ")
        .map_err(step("the prompt after the rewind"))?;
    let restored = tree(&ws);
    if restored != before {
        return Err(format!(
            "the files are not back:\n{restored:?}\n!=\n{before:?}"
        ));
    }

    // The safety checkpoint named undoes the rewind.
    let safety = done
        .split_whitespace()
        .last()
        .filter(|w| w.starts_with('c'))
        .ok_or(format!("no safety checkpoint id:\n{done}"))?
        .to_owned();
    term.send_line(format!("/rewind {safety}"))
        .map_err(step("/rewind of the safety checkpoint"))?;
    term.expect("[n] cancel? ").map_err(step("the question"))?;
    term.send_line("f").map_err(step("choosing files"))?;
    term.expect("undoes this rewind")
        .map_err(step("the rewind undone"))?;
    term.expect("› ")
        .map_err(step("the prompt after the undo"))?;
    if tree(&ws) != after {
        return Err("the safety checkpoint did not bring back what turn 1 left".into());
    }

    // A change made outside keel is named, and overwritten only after a yes.
    write(&ws.join("notes.txt"), "mine\n", 0o644);
    let mine = tree(&ws);
    for (overwrite, expected) in [("n", &mine), ("y", &before)] {
        term.send_line("/rewind 1").map_err(step("/rewind 1"))?;
        term.expect("changed outside keel since then: notes.txt")
            .map_err(step("the outside change named"))?;
        term.expect("[n] cancel? ").map_err(step("the question"))?;
        term.send_line("f").map_err(step("choosing files"))?;
        term.expect("overwrite them? [y/N] ")
            .map_err(step("the overwrite question"))?;
        term.send_line(overwrite).map_err(step("answering"))?;
        term.expect(if overwrite == "n" {
            "nothing changed"
        } else {
            "undoes this rewind"
        })
        .map_err(step("the answer's outcome"))?;
        term.expect("› ").map_err(step("the prompt"))?;
        if &tree(&ws) != expected {
            return Err(format!(
                "after `{overwrite}`, the files are not as expected"
            ));
        }
    }

    // The session goes on; then its conversation goes back to the start of turn 2.
    term.send_line("again").map_err(step("typing"))?;
    term.expect("Second answer.").map_err(step("turn 2"))?;
    term.expect("› ").map_err(step("the prompt after turn 2"))?;
    term.send_line("/rewind 2").map_err(step("/rewind 2"))?;
    term.expect("conversation: back to the start of turn 2")
        .map_err(step("the conversation plan"))?;
    term.expect("[n] cancel? ").map_err(step("the question"))?;
    term.send_line("c")
        .map_err(step("choosing the conversation"))?;
    term.expect("conversation rewound to the start of turn 2")
        .map_err(step("the conversation rewound"))?;
    term.expect("› ").map_err(step("the prompt after it"))?;
    term.send_line("once more").map_err(step("typing"))?;
    let answer = term
        .expect("answer.")
        .map_err(step("the answer after the rewind"))?;
    let answer = String::from_utf8_lossy(answer.before()).into_owned();
    if !answer.ends_with("Second ") {
        return Err(format!(
            "the next request did not go on from the start of turn 2:\n{answer}"
        ));
    }
    term.expect("› ").map_err(step("the last prompt"))?;
    term.send_line("/exit").map_err(step("exit"))?;
    term.expect("keel resume").map_err(step("leaving"))?;
    if tree(&ws) != before {
        return Err("a conversation rewind changed the files".into());
    }
    Ok(())
}

/// The texts of the user messages in a request the loopback model received.
fn user_texts(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `keel ARGS` against the loopback model, to completion; it must succeed. Its stdout.
async fn keel_ok(home: &Path, ws: &Path, args: &[&str]) -> Result<String, String> {
    let (home, ws) = (home.to_owned(), ws.to_owned());
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        keel(&home, &ws)
            .env("OPENAI_API_KEY", "sk-rewind-0123456789abcdefghijklmnop")
            .args(&args)
            .timeout(std::time::Duration::from_secs(120))
            .output()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(stdout)
}

/// `keel rewind --conversation` through the binary, then `keel resume`: the model's next
/// request goes on from before turn 2 (turn 2's request is not in it); `--fork` does the same
/// into a new session and leaves the original's log as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_rewind_and_a_fork_go_on_from_before_the_turn()
-> Result<(), Box<dyn std::error::Error>> {
    use keel_tests::model_server::ModelServer;
    use keel_tests::wire::oa_text;
    let server = ModelServer::start(|_, _| oa_text(&["Noted."], "stop")).await?;
    let (home, ws) = crate::common::homes_for_server(&server, crate::common::Wire::OpenAi)?;
    let (home, ws) = (home.path(), ws.path());
    keel_ok(home, ws, &["exec", "first request"]).await?;
    let ids = session_ids(home);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].clone();
    keel_ok(home, ws, &["resume", &id, "second request"]).await?;
    let last = |server: &ModelServer| {
        server
            .received()
            .last()
            .map(|r| user_texts(&r.json()))
            .unwrap_or_default()
    };
    assert_eq!(last(&server), ["first request", "second request"]);

    let said = keel_ok(
        home,
        ws,
        &["rewind", &id, "--turn", "2", "--conversation", "--yes"],
    )
    .await?;
    assert!(
        said.contains("conversation rewound to the start of turn 2"),
        "{said}"
    );
    keel_ok(home, ws, &["resume", &id, "third request"]).await?;
    assert_eq!(
        last(&server),
        ["first request", "third request"],
        "the request after the rewind carries turn 2"
    );

    // A fork at the start of turn 2: a new session, the original's log untouched.
    let log = home.join(format!("data/sessions/{id}.jsonl"));
    let original = std::fs::read(&log)?;
    let said = keel_ok(
        home,
        ws,
        &[
            "rewind",
            &id,
            "--turn",
            "2",
            "--conversation",
            "--fork",
            "--yes",
        ],
    )
    .await?;
    let new = said
        .split_whitespace()
        .skip_while(|w| *w != "forked:")
        .nth(2)
        .ok_or(format!("no new session named: {said}"))?
        .to_owned();
    assert_ne!(new, id);
    assert_eq!(std::fs::read(&log)?, original, "the original log changed");
    assert_eq!(session_ids(home).len(), 2);
    let forked = std::fs::read_to_string(home.join(format!("data/sessions/{new}.jsonl")))?;
    let first: serde_json::Value =
        serde_json::from_str(forked.lines().next().ok_or("an empty fork")?)?;
    assert_eq!(first["forked_from"], id.as_str(), "{first}");
    assert_eq!(first["session"], new.as_str(), "{first}");
    // The fork has the original's checkpoints of turn 1, and records its own turns after it.
    std::fs::write(ws.join("later.txt"), "made after the fork")?;
    keel_ok(home, ws, &["resume", &new, "fourth request"]).await?;
    assert_eq!(last(&server), ["first request", "fourth request"]);
    let listed = keel_ok(home, ws, &["checkpoints", "list", &new, "--json"]).await?;
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed)?;
    let turns: Vec<(u64, &str)> = listed
        .iter()
        .map(|c| {
            (
                c["turn"].as_u64().unwrap_or(0),
                c["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            (1, "before-turn"),
            (1, "after-turn"),
            (2, "before-turn"),
            (2, "after-turn")
        ],
        "{listed:?}"
    );
    assert!(
        listed.iter().all(|c| c["session"] == new.as_str()),
        "{listed:?}"
    );
    // The fork's files go back to before its turn 1: `later.txt` was written outside keel
    // (between turns), so it is named and removed only when forced.
    let refused = keel_ok(
        home,
        ws,
        &["rewind", &new, "--turn", "1", "--files", "--yes"],
    )
    .await
    .expect_err("a change made outside keel is not overwritten unforced");
    assert!(
        refused.contains("back to c1 (before turn, turn 1)") && refused.contains("later.txt"),
        "{refused}"
    );
    let said = keel_ok(
        home,
        ws,
        &["rewind", &new, "--turn", "1", "--files", "--yes", "--force"],
    )
    .await?;
    assert!(!ws.join("later.txt").exists(), "{said}");
    // The original goes on as it was.
    keel_ok(home, ws, &["resume", &id, "fifth request"]).await?;
    assert_eq!(
        last(&server),
        ["first request", "third request", "fifth request"]
    );
    Ok(())
}

/// Run one turn in a new session whose only call is `exec_shell` with `command`, whatever
/// other sessions the home has; the new session's id.
fn another_shell_turn(home: &Path, ws: &Path, command: &str) -> String {
    let known = session_ids(home);
    let script = format!(
        "{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[("exec_shell", format!("{{ command = {command:?} }}"))])
    );
    use_scripted_model(home, &script).expect("script");
    let out = keel(home, ws)
        .args(["exec", "--approval", "auto", "do it"])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("keel exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new: Vec<String> = session_ids(home)
        .into_iter()
        .filter(|id| !known.contains(id))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    new[0].clone()
}

/// Two sessions in one workspace: rewinding session A's files to before its turn would undo
/// what session B's turn did since; the rewind names B and the file and refuses, and does it
/// only when told to overwrite.
#[test]
fn a_rewind_names_the_other_session_whose_changes_it_would_undo() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("shared.txt"), "v1\n", 0o644);
    let a = another_shell_turn(home.path(), ws, "echo A > a.txt");
    let b = another_shell_turn(home.path(), ws, "echo B > shared.txt");
    let after = tree(ws);

    let refused = rewind(home.path(), ws, &[&a, "--turn", "1", "--files", "--yes"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains(&format!("changed by session {b} since then: shared.txt")),
        "{said}"
    );
    assert!(
        said.contains(&format!("would undo what session {b} did")),
        "{said}"
    );
    assert_eq!(tree(ws), after, "a refused rewind changed files");

    let forced = rewind(
        home.path(),
        ws,
        &[&a, "--turn", "1", "--files", "--yes", "--force"],
    );
    assert!(
        forced.status.success(),
        "{}{}",
        String::from_utf8_lossy(&forced.stdout),
        String::from_utf8_lossy(&forced.stderr)
    );
    assert!(!ws.join("a.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("shared.txt")).expect("shared"),
        "v1\n"
    );
}

/// `keel rewind` of a session another `keel run` is running is refused, `--force` or not, and
/// naming the session; so is a second `keel resume` of it. Once that process has left, the
/// same rewind goes through.
#[test]
fn a_rewind_waits_for_the_session_running_in_another_process() {
    use std::io::Write as _;
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    use_scripted_model(home.path(), "[[step]]\ntext = \"Noted.\"\n").expect("script");
    let mut running = crate::common::keel_process(home.path(), ws)
        .arg("run")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("keel run");
    let mut input = running.stdin.take().expect("stdin");
    writeln!(input, "hello").expect("typing");
    // Until its turn has ended in the log (bounded).
    let ended = |id: &str| {
        std::fs::read_to_string(home.path().join(format!("data/sessions/{id}.jsonl")))
            .is_ok_and(|log| log.contains("\"turn_ended\""))
    };
    let started = std::time::Instant::now();
    let id = loop {
        if let Some(id) = session_ids(home.path()).into_iter().find(|id| ended(id)) {
            break id;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(90),
            "the session's turn never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let log = home.path().join(format!("data/sessions/{id}.jsonl"));
    let before = std::fs::read(&log).expect("log");
    for force in [false, true] {
        let mut args = vec![id.as_str(), "--turn", "1", "--yes"];
        if force {
            args.push("--force");
        }
        let refused = rewind(home.path(), ws, &args);
        let said = String::from_utf8_lossy(&refused.stderr).into_owned();
        assert!(!refused.status.success(), "{said}");
        assert!(
            said.contains(&format!(
                "not rewound: session {id} is running in another keel process; finish its turn \
                 and leave it (`/exit`) first"
            )),
            "{said}"
        );
    }
    let resumed = keel(home.path(), ws)
        .args(["resume", &id, "again"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("keel resume");
    assert!(!resumed.status.success());
    assert!(
        String::from_utf8_lossy(&resumed.stderr).contains("is running in another keel process"),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(std::fs::read(&log).expect("log"), before, "the log changed");

    // The session leaves (its input ends); then the rewind goes through.
    drop(input);
    let started = std::time::Instant::now();
    while running.try_wait().expect("wait").is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = running.kill();
            panic!("keel run did not leave when its input ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let done = rewind(home.path(), ws, &[&id, "--turn", "1", "--yes"]);
    assert!(
        done.status.success(),
        "{}{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
}

/// `keel checkpoints gc` keeps what `[checkpoints]` in keel's config says, unless told
/// otherwise on the command line (its flags used to override the config with their defaults).
#[test]
fn gc_by_hand_follows_the_configured_retention() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("a.txt"), "a\n", 0o644);
    let id = shell_turn(home.path(), ws, "echo b > b.txt");
    let listed = |home: &Path| -> Vec<serde_json::Value> {
        let out = keel(home, ws)
            .args(["checkpoints", "list", &id, "--json"])
            .output()
            .expect("list");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    assert_eq!(listed(home.path()).len(), 3);
    let config = home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[checkpoints]\nmax-per-session = 1\n");
    std::fs::write(&config, text).expect("config");
    let out = keel(home.path(), ws)
        .args(["checkpoints", "gc"])
        .output()
        .expect("gc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("dropped 2 checkpoint(s)"), "{stdout}");
    let kept = listed(home.path());
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["kind"], "after-turn");
}

/// `keel checkpoints list` in text names what the checkpoints do not cover (with the sandbox
/// off, everything outside the workspace), once, and each path a checkpoint did not record.
#[test]
fn the_text_list_says_what_is_not_covered_and_not_recorded() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("kept.txt"), "kept\n", 0o644);
    let fifo = std::process::Command::new("mkfifo")
        .arg(ws.join("pipe"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    let script = format!(
        "{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[("exec_shell", "{ command = \"echo hi > made.txt\" }".into())])
    );
    use_scripted_model(home.path(), &script).expect("script");
    let config = home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[sandbox]\nmode = \"off\"\n");
    std::fs::write(&config, text).expect("config");
    let out = keel(home.path(), ws)
        .args(["exec", "--json", "--approval", "auto", "make a file"])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("keel exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = session_ids(home.path());
    assert_eq!(ids.len(), 1, "{ids:?}");

    let out = keel(home.path(), ws)
        .args(["checkpoints", "list", &ids[0]])
        .output()
        .expect("list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "not covered by any checkpoint (a rewind does not bring it back): everything \
             outside the workspace"
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("not covered by any checkpoint").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("not recorded: pipe (a special file"),
        "{text}"
    );
}

/// The retention runs as a session ends, not only as the next one starts: a turn's three
/// checkpoints (before it, before its call, after it) are two once `keel exec` has exited
/// with `[checkpoints] max-per-session = 2`.
#[test]
fn a_session_applies_the_retention_as_it_ends() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("a.txt"), "a\n", 0o644);
    let script = format!(
        "{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[("exec_shell", "{ command = \"echo b > b.txt\" }".into())])
    );
    use_scripted_model(home.path(), &script).expect("script");
    let config = home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[checkpoints]\nmax-per-session = 2\n");
    std::fs::write(&config, text).expect("config");
    let out = keel(home.path(), ws)
        .args(["exec", "--json", "--approval", "auto", "make b"])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("keel exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = session_ids(home.path());
    assert_eq!(ids.len(), 1, "{ids:?}");
    let out = keel(home.path(), ws)
        .args(["checkpoints", "list", &ids[0], "--json"])
        .output()
        .expect("list");
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let kinds: Vec<&str> = list
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["before-call", "after-turn"], "{list:?}");
}

/// Every path under `root` whose name starts `.keel-restore-` (a restore's temp file).
fn restore_temp_files(root: &Path) -> Vec<String> {
    tree(root)
        .into_keys()
        .filter(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with(".keel-restore-"))
        })
        .collect()
}

/// The checkpoints of session `id` as `keel checkpoints list --json` gives them.
fn listed(home: &Path, ws: &Path, id: &str) -> Vec<serde_json::Value> {
    let out = keel(home, ws)
        .args(["checkpoints", "list", id, "--json"])
        .output()
        .expect("list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// A turn that removes `src` (five files) and makes `new.txt`, then `keel rewind --turn 1
/// --files` killed (SIGKILL, in debug builds by `KEEL_FAULT_REWIND_KILLED_AT_WRITE`) as its
/// third file is written under its temp name, before the rename: two files back, the third's
/// temp file beside them, the rest missing. The session, the tree before the turn, after it,
/// and the rewind's safety checkpoint.
struct Interrupted {
    home: tempfile::TempDir,
    ws: tempfile::TempDir,
    id: String,
    before: BTreeMap<String, String>,
    after: BTreeMap<String, String>,
    safety: String,
}

fn interrupted_rewind() -> Interrupted {
    use std::os::unix::process::ExitStatusExt as _;
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    for name in ["a", "b", "c", "d", "e"] {
        write(
            &ws.path().join(format!("src/{name}.txt")),
            &format!("{name}\n"),
            0o644,
        );
    }
    let before = tree(ws.path());
    let id = shell_turn(home.path(), ws.path(), "rm -rf src && echo made > new.txt");
    let after = tree(ws.path());
    let killed = keel(home.path(), ws.path())
        .args(["rewind", &id, "--turn", "1", "--files", "--yes"])
        .env("KEEL_FAULT_REWIND_KILLED_AT_WRITE", "3")
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("keel rewind");
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "the rewind was not killed mid-way: {}{}",
        String::from_utf8_lossy(&killed.stdout),
        String::from_utf8_lossy(&killed.stderr)
    );
    let now = tree(ws.path());
    assert!(now.contains_key("src/a.txt") && now.contains_key("src/b.txt"));
    assert!(!now.contains_key("src/c.txt") && !now.contains_key("src/e.txt"));
    assert_eq!(
        restore_temp_files(ws.path()).len(),
        1,
        "the killed rewind left its temp file: {now:?}"
    );
    let list = listed(home.path(), ws.path(), &id);
    let last = list.last().expect("checkpoints");
    assert_eq!(last["kind"], "safety", "{list:?}");
    let safety = last["id"].as_str().expect("id").to_owned();
    Interrupted {
        home,
        ws,
        id,
        before,
        after,
        safety,
    }
}

fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A rewind killed part way, run again: keel knows its restored files and its temp file as
/// its own doing, so the same rewind finishes it without `--force`, and the tree is the one
/// before the turn, with no temp file left.
#[test]
fn a_rewind_killed_part_way_is_finished_by_running_it_again() {
    let run = interrupted_rewind();
    let (home, ws) = (run.home.path(), run.ws.path());
    let listing = keel(home, ws)
        .args(["checkpoints", "list", &run.id])
        .output()
        .expect("list");
    let text = String::from_utf8_lossy(&listing.stdout);
    assert!(
        text.contains("was stopped before it was done") && text.contains(&run.safety),
        "{text}"
    );
    let again = rewind(home, ws, &[&run.id, "--turn", "1", "--files", "--yes"]);
    assert!(again.status.success(), "{}", said(&again));
    assert_eq!(tree(ws), run.before, "{}", said(&again));
    // Done: nothing is said to be unfinished any more, and the rewind can be undone.
    let listing = keel(home, ws)
        .args(["checkpoints", "list", &run.id])
        .output()
        .expect("list");
    assert!(
        !String::from_utf8_lossy(&listing.stdout).contains("was stopped before it was done"),
        "{}",
        String::from_utf8_lossy(&listing.stdout)
    );
}

/// A rewind killed part way, undone: a rewind to its safety checkpoint brings back the tree
/// the turn left, without `--force`, the temp file gone.
#[test]
fn a_rewind_killed_part_way_is_undone_by_its_safety_checkpoint() {
    let run = interrupted_rewind();
    let (home, ws) = (run.home.path(), run.ws.path());
    let undo = rewind(
        home,
        ws,
        &[&run.id, "--checkpoint", &run.safety, "--files", "--yes"],
    );
    assert!(undo.status.success(), "{}", said(&undo));
    assert_eq!(tree(ws), run.after, "{}", said(&undo));
}

/// What the person changed after the rewind was killed is theirs: a restored file edited
/// since is named and refused by both the re-run and the undo, and left as they wrote it;
/// only `--force` overwrites it.
#[test]
fn an_edit_made_after_a_killed_rewind_is_still_refused_without_force() {
    let run = interrupted_rewind();
    let (home, ws) = (run.home.path(), run.ws.path());
    std::fs::write(ws.join("src/a.txt"), "the person's edit\n").expect("edit");
    for args in [
        vec![run.id.as_str(), "--turn", "1", "--files", "--yes"],
        vec![
            run.id.as_str(),
            "--checkpoint",
            &run.safety,
            "--files",
            "--yes",
        ],
    ] {
        let refused = rewind(home, ws, &args);
        let text = said(&refused);
        assert!(!refused.status.success(), "{args:?}: {text}");
        assert!(
            text.contains("changed outside keel since then: src/a.txt"),
            "{args:?}: {text}"
        );
        assert!(
            !text.contains("changed outside keel since then: src/b.txt"),
            "keel's own restore was named as an outside change: {text}"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("src/a.txt")).expect("a"),
            "the person's edit\n",
            "{args:?}"
        );
    }
    let forced = rewind(
        home,
        ws,
        &[&run.id, "--turn", "1", "--files", "--yes", "--force"],
    );
    assert!(forced.status.success(), "{}", said(&forced));
    assert_eq!(tree(ws), run.before);
}

/// The model writes a `.gitignore` of `*`, then removes `src` and `docs` (a prompt-injected
/// model under `--approval auto`): the checkpoint before the `rm` still records every file,
/// and `keel rewind --call` of the `rm` brings them back.
#[test]
fn a_gitignore_the_model_writes_does_not_empty_the_checkpoint_before_its_rm() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    write(&ws.join("src/lib.rs"), "pub fn a() {}\n", 0o644);
    write(&ws.join("src/deep/mod.rs"), "// deep\n", 0o644);
    write(&ws.join("docs/guide.md"), "# guide\n", 0o644);
    let before = tree(ws);
    let script = format!(
        "{}{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[(
            "exec_shell",
            "{ command = \"printf '*\\\\n' > .gitignore\" }".into()
        )]),
        scripted_tool_step(&[("exec_shell", "{ command = \"rm -rf src docs\" }".into())]),
    );
    use_scripted_model(home.path(), &script).expect("script");
    let out = keel(home.path(), ws)
        .args(["exec", "--json", "--approval", "auto", "tidy up"])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("keel exec");
    assert!(out.status.success(), "{}", said(&out));
    assert!(!ws.join("src").exists() && !ws.join("docs").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join(".gitignore")).expect("the model's .gitignore"),
        "*\n"
    );
    let id = session_ids(home.path()).pop().expect("session");
    let list = listed(home.path(), ws, &id);
    let before_rm = list
        .iter()
        .find(|c| c["call"] == "call_2_1")
        .unwrap_or_else(|| panic!("no checkpoint before the rm: {list:?}"));
    assert_eq!(before_rm["files"], 3, "{before_rm}");

    let back = rewind(
        home.path(),
        ws,
        &[&id, "--call", "call_2_1", "--files", "--yes"],
    );
    assert!(back.status.success(), "{}", said(&back));
    let mut now = tree(ws);
    assert!(now.remove(".gitignore").is_some());
    assert_eq!(now, before, "{}", said(&back));
}

/// A session's checkpoints older than `max-age-days` go without being asked as the next
/// session starts or ends, its last one too (one-shot runs each leave one, which no count
/// bound drops): the content only they named is deleted, and a recent session is kept.
/// `keel doctor` says what the stores hold and the retention.
#[test]
fn old_checkpoints_are_dropped_without_being_asked_and_recent_ones_kept() {
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path();
    // 256 KiB of letters no compressor shrinks much (xorshift).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: String = (0..256 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    write(&ws.join("big.txt"), &noise, 0o644);
    let old = shell_turn(home.path(), ws, "echo old > old.txt");
    // The person removes the large file; then the old session is made 40 days old.
    std::fs::remove_file(ws.join("big.txt")).expect("rm");
    let stores: Vec<_> = std::fs::read_dir(home.path().join("checkpoints"))
        .expect("stores")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(stores.len(), 1, "{stores:?}");
    let store = &stores[0];
    let index = store.join(format!("sessions/{old}.jsonl"));
    let aged: String = std::fs::read_to_string(&index)
        .expect("index")
        .lines()
        .map(|line| {
            let mut c: serde_json::Value = serde_json::from_str(line).expect("line");
            c["time_ms"] = (c["time_ms"].as_u64().expect("time") - 40 * 24 * 3600 * 1000).into();
            format!("{c}\n")
        })
        .collect();
    std::fs::write(&index, aged).expect("age it");
    let blob_bytes = || -> u64 {
        let mut total = 0;
        for fan in std::fs::read_dir(store.join("blobs"))
            .expect("blobs")
            .flatten()
        {
            for blob in std::fs::read_dir(fan.path()).expect("fan").flatten() {
                total += blob.metadata().expect("stat").len();
            }
        }
        total
    };
    assert!(blob_bytes() > 100_000, "{}", blob_bytes());

    let recent = another_shell_turn(home.path(), ws, "echo new > new.txt");
    let old_list = listed(home.path(), ws, &old);
    assert_eq!(old_list.len(), 1, "{old_list:?}");
    assert_eq!(old_list[0]["manifest"], "", "{old_list:?}");
    assert!(
        blob_bytes() < 50_000,
        "the old session's content stayed: {} bytes",
        blob_bytes()
    );
    let recent_list = listed(home.path(), ws, &recent);
    let kinds: Vec<&str> = recent_list
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["before-turn", "before-call", "after-turn"]);

    let doctor = keel(home.path(), ws)
        .arg("doctor")
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("doctor");
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.contains("file(s) for this workspace")
            && text.contains("kept: 30 days, 1000 a session, 2.0 GiB a workspace"),
        "{text}"
    );
}

/// Checkpoints whose store fills during a turn: a 6 MB file the turn writes cannot be
/// stored (keel's `checkpoints` folder on a 2 MiB tmpfs in a mount namespace of its own),
/// and the session says so at the end of the turn, naming the file. Needs root.
#[test]
fn a_store_that_fills_during_a_turn_is_said_in_the_session() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let home = tempfile::tempdir().expect("home");
    let ws = tempfile::tempdir().expect("workspace");
    let out_dir = tempfile::tempdir().expect("out");
    write(&ws.path().join("small.txt"), "small\n", 0o644);
    let script = format!(
        "{}[[step]]\ntext = \"Done.\"\n",
        scripted_tool_step(&[(
            "exec_shell",
            "{ command = \"head -c 6000000 /dev/urandom > big.bin\" }".into()
        )])
    );
    use_scripted_model(home.path(), &script).expect("script");
    std::fs::create_dir_all(home.path().join("checkpoints")).expect("checkpoints dir");
    let script = r#"
set -u
mount -t tmpfs -o size=2m tmpfs "$H/checkpoints" || exit 90
"$KEEL" --home "$H" --workspace "$W" exec --approval auto "make it" >/dev/null 2>"$O/err"
echo $? > "$O/code"
"#;
    let status = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .env("H", home.path())
        .env("W", ws.path())
        .env("O", out_dir.path())
        .env("KEEL", assert_cmd::cargo::cargo_bin("keel"))
        .env_remove("KEEL_PROVIDER")
        .env_remove("KEEL_MODEL")
        .status()
        .expect("unshare");
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(out_dir.path().join("err")).expect("stderr");
    let code = std::fs::read_to_string(out_dir.path().join("code")).expect("code");
    assert_eq!(code.trim(), "0", "{stderr}");
    assert!(std::fs::metadata(ws.path().join("big.bin")).is_ok_and(|m| m.len() == 6_000_000));
    assert!(
        stderr.contains("this turn's checkpoint did not record big.bin")
            && stderr.contains("not stored: keel's checkpoint store could not keep it"),
        "{stderr}"
    );
    assert!(!stderr.contains("small.txt"), "{stderr}");
}
