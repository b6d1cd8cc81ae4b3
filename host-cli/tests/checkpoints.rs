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
