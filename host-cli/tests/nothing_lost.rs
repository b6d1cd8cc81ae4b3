//! Nothing lost through the `keel` binary: several keel processes updating one home at once
//! (`install`, `mcp add`, `key trust`) keep every update; temp files a killed run left are
//! removed by the next; an edit of a large file killed at any moment leaves the old or the new
//! file; a closed stdout ends a listing quietly; a missing API key is named at once; keel run
//! in the person's home directory keeps its own home out of the workspace grant; a memory
//! folder's lock is let go when its holder is killed and never taken from a slow one; keel's
//! home is made the person's alone; what killed keels left is swept, and a live keel's kept.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, keel, keel_process};

type R = Result<(), Box<dyn std::error::Error>>;

/// How many keel processes update the home at once.
const WRITERS: usize = 8;

/// Wait for every child; each must have exited 0.
fn all_succeed(children: Vec<Child>) -> R {
    for child in children {
        let out = child.wait_with_output()?;
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A plugin directory holding the bundled echo-tool component under the name `name`.
fn plugin_dir(root: &Path, name: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("keel.toml"),
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"wasm\"\ndescription = \"{name} test plugin\"\ncomponent = \"c.wasm\"\n"
        ),
    )?;
    let component = keel_bundled_plugins::get("echo-tool")
        .map(|b| b.component())
        .ok_or("echo-tool is bundled")?;
    std::fs::write(dir.join("c.wasm"), component)?;
    Ok(dir)
}

/// A new signing key in `home` for `namespace`; its public half.
fn new_key(
    home: &Path,
    ws: &Path,
    name: &str,
    namespace: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let out = keel(home, ws)
        .args([
            "key",
            "new",
            "--name",
            name,
            "--namespace",
            namespace,
            "--json",
        ])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["public"].as_str().ok_or("public key")?.to_owned())
}

/// Every temp file `atomic_write` names (`.<file>.<pid>-<n>-<hex>.tmp`) under `dir`.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(temp_files(&path));
        } else if entry.file_name().to_string_lossy().ends_with(".tmp") {
            found.push(path);
        }
    }
    found
}

/// A temp file as a writer killed between writing and renaming leaves it.
fn plant_temp(dir: &Path, file: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(".{file}.4194304-0-0123456789abcdef.tmp"));
    std::fs::write(&path, "half of it")?;
    Ok(path)
}

/// `keel install` run eight times at once, each for another plugin: the lockfile keeps all
/// eight (it kept 2 of 8 when each install wrote the lockfile it read before). Then kill -9
/// during installs, and a planted half-written lockfile temp: the next install removes every
/// temp file and the lockfile still parses.
#[test]
fn concurrent_installs_keep_every_lockfile_entry_and_leave_no_temp_files() -> R {
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");
    let public = new_key(&author, &ws, "default", "acme")?;
    for n in 0..WRITERS + 2 {
        let dir = plugin_dir(tmp.path(), &format!("p{n}"))?;
        keel(&author, &ws)
            .arg("publish")
            .arg(&dir)
            .arg("--registry")
            .arg(&registry)
            .assert()
            .success();
    }
    keel(&user, &ws)
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();

    let installs = (0..WRITERS)
        .map(|n| {
            keel_process(&user, &ws)
                .args(["install", &format!("acme:p{n}"), "--yes", "--registry"])
                .arg(&registry)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    all_succeed(installs)?;
    let lock = std::fs::read_to_string(user.join("keel.lock"))?;
    let lock: toml::Table = lock.parse()?;
    let names: Vec<&str> = lock["plugin"]
        .as_array()
        .ok_or("plugin entries")?
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names.len(), WRITERS, "{names:?}");

    // kill -9 at different moments of installs of the last plugin.
    let last = format!("acme:p{WRITERS}");
    for delay_ms in [5u64, 20, 40, 80, 120, 200] {
        let mut child = keel_process(&user, &ws)
            .args(["install", &last, "--yes", "--registry"])
            .arg(&registry)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read_to_string(user.join("keel.lock"))?;
        text.parse::<toml::Table>()
            .map_err(|e| format!("the lockfile is torn after a kill at {delay_ms} ms: {e}"))?;
    }
    let planted = plant_temp(&user, "keel.lock")?;
    let planted_code = plant_temp(&user.join("plugins").join("acme").join("p0"), "c.wasm")?;
    // The next install that writes (a plugin not installed yet).
    let next = format!("acme:p{}", WRITERS + 1);
    keel(&user, &ws)
        .args(["install", &next, "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    assert!(!planted.exists() && !planted_code.exists());
    let left = temp_files(&user);
    assert!(left.is_empty(), "temp files left: {left:?}");
    let lock: toml::Table = std::fs::read_to_string(user.join("keel.lock"))?.parse()?;
    let entries = lock["plugin"].as_array().map_or(0, Vec::len);
    // The killed installs of `last` may or may not have reached their commit point.
    assert!(
        entries == WRITERS + 1 || entries == WRITERS + 2,
        "{entries} entries: {lock}"
    );
    assert!(lock.to_string().contains(&next), "{lock}");
    Ok(())
}

/// `keel mcp add` eight times at once: config.toml keeps all eight servers; a temp file of a
/// killed `mcp add` is removed by the next one.
#[test]
fn concurrent_mcp_adds_keep_every_server() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        "# mine\n[model]\nprovider = \"scripted\"\n",
    )?;
    let planted = plant_temp(home.path(), "config.toml")?;
    let adds = (0..WRITERS)
        .map(|n| {
            keel_process(home.path(), ws.path())
                .args(["mcp", "add", &format!("server-{n}"), "--", "echo", "hi"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    all_succeed(adds)?;
    let text = std::fs::read_to_string(home.path().join("config.toml"))?;
    assert!(text.starts_with("# mine\n"), "{text}");
    let config: toml::Table = text.parse()?;
    let servers = config["mcp"]["servers"].as_table().ok_or("servers")?;
    assert_eq!(servers.len(), WRITERS, "{text}");
    assert!(
        !planted.exists(),
        "the killed writer's temp file is removed"
    );
    assert!(temp_files(home.path()).is_empty());
    Ok(())
}

/// `keel key trust` eight times at once, each another key and namespace: trust.toml keeps all.
#[test]
fn concurrent_key_trusts_keep_every_key() -> R {
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");
    let keys = (0..WRITERS)
        .map(|n| new_key(&author, &ws, &format!("k{n}"), &format!("ns{n}")))
        .collect::<Result<Vec<_>, _>>()?;
    // A registry to bind the namespaces to.
    keel(&author, &ws)
        .arg("publish")
        .arg(plugin_dir(tmp.path(), "p")?)
        .args(["--key", "k0", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    let trusts = keys
        .iter()
        .enumerate()
        .map(|(n, key)| {
            keel_process(&user, &ws)
                .args([
                    "key",
                    "trust",
                    key,
                    "--namespace",
                    &format!("ns{n}"),
                    "--registry",
                ])
                .arg(&registry)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    all_succeed(trusts)?;
    let trust = std::fs::read_to_string(user.join("trust.toml"))?;
    for key in &keys {
        assert!(trust.contains(key.as_str()), "{key} lost:\n{trust}");
    }
    Ok(())
}

/// `keel … | head -1`: the reader goes away; keel ends quietly (no panic, no exit 101).
#[test]
fn a_closed_stdout_ends_listings_quietly() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    common::use_scripted_model(home.path(), "[[step]]\ntext = \"Hello.\"\n")?;
    keel(home.path(), ws.path())
        .args(["exec", "hi"])
        .assert()
        .success();
    let commands: [&[&str]; 4] = [
        &["sessions", "list"],
        &["plugin", "list"],
        &["policy", "check", "ls -la"],
        &["verify", "stats"],
    ];
    for args in commands {
        let mut child = keel_process(home.path(), ws.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // The reader closes its end before keel writes a line.
        drop(child.stdout.take());
        let out = child.wait_with_output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            matches!(out.status.code(), Some(0 | 141)),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
    Ok(())
}

/// Without the provider's key, `keel exec` names the variable at once (no provider retries)
/// and points at `keel demo`.
#[test]
fn a_missing_api_key_is_named_before_any_request() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        "[model]\nprovider = \"openai\"\n",
    )?;
    let out = keel(home.path(), ws.path()).args(["exec", "hi"]).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("set OPENAI_API_KEY"), "{stderr}");
    assert!(stderr.contains("keel demo"), "{stderr}");
    assert!(!stderr.contains("retry"), "{stderr}");
    Ok(())
}

/// The content of the large file before and after the scripted edit.
fn large_file() -> (Vec<u8>, Vec<u8>) {
    let mut old = Vec::with_capacity(22_500_000);
    let mut n = 0u64;
    while old.len() < 22_400_000 {
        old.extend_from_slice(format!("line {n:09} of a large file to edit\n").as_bytes());
        n += 1;
    }
    old.extend_from_slice(b"THE LAST LINE\n");
    let mut new = old.clone();
    new.truncate(new.len() - b"THE LAST LINE\n".len());
    new.extend_from_slice(b"THE EDITED LAST LINE\n");
    (old, new)
}

const EDIT_SCRIPT: &str = r#"
[[step]]
text = "Editing."
[[step.tool_calls]]
name = "edit_file"
arguments = { path = "big.txt", old_string = "THE LAST LINE", new_string = "THE EDITED LAST LINE" }
[[step]]
text = "Done."
"#;

/// `edit_file` on a 22 MB file, killed with SIGKILL at moments spread over the run: the file
/// is always the whole old or the whole new content (it was left cut at 5 MiB when written in
/// place), and the next run leaves no temp file.
#[test]
fn an_edit_of_a_large_file_killed_at_any_moment_leaves_the_old_or_the_new_file() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    common::use_scripted_model(home.path(), EDIT_SCRIPT)?;
    let (old, new) = large_file();
    let big = ws.path().join("big.txt");
    let exec = || {
        keel_process(home.path(), ws.path())
            .args(["exec", "--approval", "auto", "edit it"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
    };
    // One whole run, timed, to spread the kills over it.
    std::fs::write(&big, &old)?;
    let started = Instant::now();
    let out = exec()?.wait_with_output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let whole = started.elapsed();
    assert!(std::fs::read(&big)? == new, "the edit did not land");

    const KILLS: u32 = 16;
    for k in 0..KILLS {
        std::fs::write(&big, &old)?;
        let mut child = exec()?;
        std::thread::sleep(whole * k / KILLS);
        let _ = child.kill();
        let _ = child.wait();
        let now = std::fs::read(&big)?;
        assert!(
            now == old || now == new,
            "killed at {k}/{KILLS} of {whole:?}: {} bytes, neither old ({}) nor new ({})",
            now.len(),
            old.len(),
            new.len()
        );
    }
    std::fs::write(&big, &old)?;
    let out = exec()?.wait_with_output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<String> = std::fs::read_dir(ws.path())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("keel-tmp"))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
    Ok(())
}

/// keel run in the person's home directory: the workspace holds keel's home. The session runs
/// (it was refused: the workspace grant "contains" the sealed files), and keel's home is carved
/// out of the grant: `read_file`, `list_dir`, `write_file` and `edit_file` into it are refused,
/// by its name, through a link to it and through `..`; a command sees an empty directory there.
/// Both a home named `.keel` (a control directory, so writes are refused twice over) and one
/// under another name (only the carve-out stands between the tools and it).
#[test]
fn keel_runs_in_the_home_directory_with_its_own_home_carved_out() -> R {
    const SECRET: &str = "sk-home-secret-0123456789";
    for name in [".keel", "state/keel"] {
        let person = tempfile::tempdir()?;
        let person = person.path();
        let home = person.join(name);
        std::fs::create_dir_all(&home)?;
        std::fs::create_dir_all(person.join("sub"))?;
        let secret = format!("token = \"{SECRET}\"\n");
        std::fs::write(home.join("secret.toml"), &secret)?;
        std::fs::write(person.join("notes.txt"), "my notes\n")?;
        // A relative link (an absolute one is refused by any lookup beneath the workspace).
        std::os::unix::fs::symlink(name, person.join("k"))?;
        let path = |p: &str| format!("{{ path = {p:?} }}");
        let write = |p: &str| format!("{{ path = {p:?}, content = \"planted\" }}");
        let into_home = [
            ("read_file", path(&format!("{name}/secret.toml"))),
            ("read_file", path("k/secret.toml")),
            ("read_file", path(&format!("sub/../{name}/secret.toml"))),
            ("list_dir", path(name)),
            ("write_file", write(&format!("{name}/planted.txt"))),
            ("write_file", write("k/planted-through-link.txt")),
            (
                "write_file",
                write(&format!("sub/../{name}/planted-up.txt")),
            ),
            (
                "edit_file",
                format!(
                    "{{ path = \"{name}/secret.toml\", old_string = {SECRET:?}, new_string = \"x\" }}"
                ),
            ),
        ];
        // A working call between the refused ones: eight failures in a row end the turn.
        let mut calls = into_home[..4].to_vec();
        calls.push((
            "exec_shell",
            format!(
                "{{ command = \"cat {name}/secret.toml k/secret.toml; ls -A {name}; echo listed\" }}"
            ),
        ));
        calls.push((
            "write_file",
            "{ path = \"mine.txt\", content = \"kept\" }".into(),
        ));
        calls.extend(into_home[4..].iter().cloned());
        calls.push(("read_file", path("notes.txt")));
        let refused_at = [1, 2, 3, 4, 7, 8, 9, 10];
        let script = format!(
            "{}[[step]]\ntext = \"done\"\n",
            common::scripted_tool_step(&calls)
        );
        common::use_scripted_model(&home, &script)?;
        let out = keel(&home, person)
            .env("HOME", person)
            .args(["exec", "--json", "--approval", "auto", "tidy up"])
            .timeout(Duration::from_secs(120))
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}: {:?}\n{stderr}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        // "always" answers are still kept: keel's home is out of the workspace's reach.
        assert!(
            !stderr.contains("will not be remembered"),
            "{name}: {stderr}"
        );
        let outcomes = common::tool_outcomes(&out.stdout);
        assert_eq!(
            outcomes.len(),
            calls.len(),
            "{name}: {outcomes:?}\n{stderr}"
        );
        let outcome = |n: usize| {
            outcomes
                .get(&format!("call_1_{n}"))
                .cloned()
                .unwrap_or_default()
        };
        for n in refused_at {
            let (tool, arguments) = &calls[n - 1];
            let (_, status, content) = outcome(n);
            assert_ne!(
                status, "ok",
                "{name}: {tool} {arguments} reached keel's home: {content}"
            );
            assert!(
                !content.contains(SECRET),
                "{name}: {tool} {arguments}: {content}"
            );
        }
        let (_, status, shown) = outcome(5);
        assert_eq!(status, "ok", "{name}: the command did not run: {shown}");
        assert!(
            shown.contains("listed") && !shown.contains(SECRET) && !shown.contains("script.toml"),
            "{name}: a command saw keel's home: {shown}"
        );
        let (_, status, written) = outcome(6);
        assert_eq!(status, "ok", "{name}: {written}");
        assert_eq!(std::fs::read_to_string(person.join("mine.txt"))?, "kept");
        let (_, status, notes) = outcome(11);
        assert!(
            status == "ok" && notes.contains("my notes"),
            "{name}: {notes}"
        );
        // Nothing was planted in keel's home, and its files are as they were.
        assert_eq!(std::fs::read_to_string(home.join("secret.toml"))?, secret);
        for planted in ["planted.txt", "planted-through-link.txt", "planted-up.txt"] {
            assert!(
                !home.join(planted).exists(),
                "{name}: {planted} was written"
            );
        }
    }
    Ok(())
}

/// Every `.part` file (a blob being stored) under `registry/blobs/tmp`.
fn blob_parts(registry: &Path) -> Vec<String> {
    std::fs::read_dir(registry.join("blobs/tmp"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".part"))
                .collect()
        })
        .unwrap_or_default()
}

/// The registry after a killed publish: every index holds whole records only (each line JSON
/// ending in a newline), and every blob is named by the hash of its bytes.
fn registry_is_whole(registry: &Path, what: &str) -> R {
    let mut stack = vec![registry.join("index")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                let text = std::fs::read_to_string(&path)?;
                assert!(
                    text.is_empty() || text.ends_with('\n'),
                    "{what}: {} ends in a torn record",
                    path.display()
                );
                for line in text.lines() {
                    serde_json::from_str::<serde_json::Value>(line)
                        .map_err(|e| format!("{what}: {}: {e}: {line}", path.display()))?;
                }
            }
        }
    }
    let mut stack = vec![registry.join("blobs/sha256")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let hash = keel_registry::sha256_hex(&std::fs::read(&path)?);
            assert_eq!(hash, name, "{what}: blob {} is partial", path.display());
        }
    }
    Ok(())
}

/// `keel publish` to a directory registry, killed with SIGKILL at moments spread over a
/// publish: every index keeps whole records and every blob its full bytes. A blob a killed
/// publisher left half-stored (`blobs/tmp/*.part`, its process gone) is removed by the next
/// publish — they stayed forever — while a part whose writer still runs is left alone.
#[test]
fn a_publish_killed_at_any_moment_leaves_whole_files_and_the_next_removes_its_parts() -> R {
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let author = tmp.path().join("author");
    let registry = tmp.path().join("registry");
    new_key(&author, &ws, "default", "acme")?;
    let publish = |name: &str| -> Result<Child, Box<dyn std::error::Error>> {
        let dir = plugin_dir(tmp.path(), name)?;
        Ok(keel_process(&author, &ws)
            .arg("publish")
            .arg(&dir)
            .arg("--registry")
            .arg(&registry)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?)
    };
    let started = Instant::now();
    all_succeed(vec![publish("whole")?])?;
    let whole = started.elapsed();

    const KILLS: u32 = 12;
    for k in 0..KILLS {
        let mut child = publish(&format!("killed{k}"))?;
        std::thread::sleep(whole * k / KILLS);
        let _ = child.kill();
        let _ = child.wait();
        registry_is_whole(&registry, &format!("killed at {k}/{KILLS} of {whole:?}"))?;
    }

    // A part as a publisher killed mid-blob leaves it, and one a live writer is storing.
    let mut gone = std::process::Command::new("true").spawn()?;
    let gone_pid = gone.id();
    gone.wait()?;
    let parts = registry.join("blobs/tmp");
    std::fs::create_dir_all(&parts)?;
    let dead = format!("{}.{gone_pid}-0-0123456789abcdef.part", "ab".repeat(32));
    let live = format!(
        "{}.{}-0-0123456789abcdef.part",
        "cd".repeat(32),
        std::process::id()
    );
    std::fs::write(parts.join(&dead), "half a blob")?;
    std::fs::write(parts.join(&live), "a blob on its way")?;
    all_succeed(vec![publish("after")?])?;
    registry_is_whole(&registry, "after the kills")?;
    let left = blob_parts(&registry);
    assert!(
        !left.contains(&dead),
        "a dead publisher's part stayed: {left:?}"
    );
    assert!(
        left.contains(&live),
        "a live writer's part was removed: {left:?}"
    );
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        temp_files(&registry).is_empty(),
        "{:?}",
        temp_files(&registry)
    );
    Ok(())
}

/// `keel memory consolidate --scope project --apply`, killed with SIGKILL at moments spread
/// over a run: the index is always the old one or the proposal, topic files are untouched,
/// every backup is the whole old index; a temp file a killed writer left is removed by the
/// next run, which leaves none of its own (nor its lock).
#[test]
fn a_consolidate_killed_at_any_moment_leaves_the_old_or_the_new_index() -> R {
    const BEFORE: &str =
        "# Memory\n- [a](a.md) — alpha\n- [gone](gone.md) — missing\n- [a again](a.md) — dup\n";
    const PROPOSED: &str =
        "# Memory\n## Facts\n- [a](a.md) — alpha things\n- [b](b.md) — beta things\n";
    const TIDIED: &str = "# Memory\n- [a](a.md) — alpha\n- [b](b.md) — beta fact\n";
    const TOPIC_A: &str = "# a\n- alpha fact\n";
    const TOPIC_B: &str = "# b\n- beta fact\n";
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let dir = ws.path().join(".keel/memory");
    std::fs::create_dir_all(&dir)?;
    let reset = || -> std::io::Result<()> {
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".bak") {
                std::fs::remove_file(entry.path())?;
            }
        }
        std::fs::write(dir.join("MEMORY.md"), BEFORE)?;
        std::fs::write(dir.join("a.md"), TOPIC_A)?;
        std::fs::write(dir.join("b.md"), TOPIC_B)
    };
    reset()?;
    common::use_scripted_model(
        home.path(),
        &format!(
            "[[step]]\ntext = {:?}\n",
            format!("```markdown\n{PROPOSED}```")
        ),
    )?;
    // The project's memory goes to the model only once approved (by content: the reset
    // restores the approved content).
    keel(home.path(), ws.path())
        .args(["memory", "approve", "--yes"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    let consolidate = || {
        keel_process(home.path(), ws.path())
            .args(["memory", "consolidate", "--scope", "project", "--apply"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
    };
    let started = Instant::now();
    all_succeed(vec![consolidate()?])?;
    let whole = started.elapsed();
    assert_eq!(std::fs::read_to_string(dir.join("MEMORY.md"))?, PROPOSED);

    const KILLS: u32 = 16;
    for k in 0..KILLS {
        reset()?;
        let mut child = consolidate()?;
        std::thread::sleep(whole * k / KILLS);
        let _ = child.kill();
        let _ = child.wait();
        let what = format!("killed at {k}/{KILLS} of {whole:?}");
        // Whole: the old index, the proposal, or the tidy alone (written when a killed run's
        // leftover in the folder means its content is no longer the approved one).
        let index = std::fs::read_to_string(dir.join("MEMORY.md"))?;
        assert!(
            index == BEFORE || index == PROPOSED || index == TIDIED,
            "{what}: {index:?}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("a.md"))?,
            TOPIC_A,
            "{what}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("b.md"))?,
            TOPIC_B,
            "{what}"
        );
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".bak") {
                assert_eq!(std::fs::read_to_string(entry.path())?, BEFORE, "{what}");
            }
        }
    }

    // A killed writer's temp file. The folder's lock is an OS lock, let go of when a killed
    // run died: the next run takes it at once, however recently the kill landed.
    let planted = dir.join(".MEMORY.md.4194304-0-0123456789abcdef.keeltmp");
    std::fs::write(&planted, "half an index")?;
    reset()?;
    all_succeed(vec![consolidate()?])?;
    // The planted file changes the folder, so the approval of its content no longer holds and
    // the model is not asked: the deterministic tidy is written instead.
    let index = std::fs::read_to_string(dir.join("MEMORY.md"))?;
    assert!(index == PROPOSED || index == TIDIED, "{index:?}");
    let left: Vec<String> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".keeltmp"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // The lock file stays (removing one a writer waits on would let two in), held by no one.
    assert!(!lock_is_held(&dir.join(".memory.lock"))?);
    Ok(())
}

/// Names the store, the workspace and the writer number for [`approvals_writer_process`].
const APPROVALS_WRITER: &str = "KEEL_TEST_APPROVALS_WRITER";
/// How many "always" answers each writer process records.
const APPROVALS_EACH: usize = 20;

/// The writer side of [`concurrent_always_approvals_from_several_processes_are_all_kept`]:
/// this test binary run again as a child process records "always" answers in one store. Run
/// on its own (no variable set) it does nothing.
#[test]
fn approvals_writer_process() -> R {
    let Ok(spec) = std::env::var(APPROVALS_WRITER) else {
        return Ok(());
    };
    let mut parts = spec.split('\n');
    let (Some(store), Some(ws), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("{APPROVALS_WRITER}: {spec:?}").into());
    };
    let (store, _) =
        keel_kernel::gates::approvals::GrantStore::open(Path::new(store), Path::new(ws))?;
    for i in 0..APPROVALS_EACH {
        store.grant(Path::new(ws), &format!("make target{i} (writer {n})"))?;
    }
    Ok(())
}

/// "always" answers recorded by eight processes at once into one approvals file: none is lost
/// (each process reads, merges and renames under the store's lock).
#[test]
fn concurrent_always_approvals_from_several_processes_are_all_kept() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let store = home.path().join("approvals.json");
    let writers = (0..WRITERS)
        .map(|n| {
            std::process::Command::new(std::env::current_exe()?)
                .args([
                    "--exact",
                    "nothing_lost::approvals_writer_process",
                    "--test-threads=1",
                ])
                .env(
                    APPROVALS_WRITER,
                    format!("{}\n{}\n{n}", store.display(), ws.path().display()),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    for child in writers {
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (store, _) = keel_kernel::gates::approvals::GrantStore::open(&store, ws.path())?;
    let kept = store.list(ws.path())?;
    assert_eq!(kept.len(), WRITERS * APPROVALS_EACH, "{kept:?}");
    Ok(())
}

/// Whether another process holds a `flock` on `path` (a missing file is held by no one).
fn lock_is_held(path: &Path) -> Result<bool, std::io::Error> {
    match std::fs::OpenOptions::new().read(true).open(path) {
        Ok(file) => Ok(matches!(
            file.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Poll `ready` every 20 ms until it holds, for at most `within`; `what` names it when it
/// never does.
fn wait_until(
    what: &str,
    within: Duration,
    mut ready: impl FnMut() -> Result<bool, Box<dyn std::error::Error>>,
) -> R {
    let until = Instant::now() + within;
    while !ready()? {
        if Instant::now() > until {
            return Err(format!("{what}: not within {within:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The pid of a process that ran and is gone (reaped).
fn dead_pid() -> Result<u32, std::io::Error> {
    let mut child = std::process::Command::new("true").spawn()?;
    let pid = child.id();
    child.wait()?;
    Ok(pid)
}

/// A `remember` whose session is stopped while it holds the memory folder's lock: the topic
/// file it reads is a FIFO nobody writes to, so the plugin's open of it waits, in the middle
/// of its read-change-write, for as long as the test likes. While it
/// waits, a second writer does not get the lock, even once the lock looks older than any
/// write takes; killed with SIGKILL, it lets go at that moment, and the next `keel memory
/// consolidate --apply` writes at once (a lock file left behind would make it say "busy").
#[test]
fn a_memory_lock_is_let_go_when_its_holder_is_killed_and_never_taken_from_a_slow_one() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let dir = ws.path().join(".keel/memory");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("MEMORY.md"),
        "# Memory\n- [testing](testing.md) — tests\n",
    )?;
    let fifo = dir.join("testing.md");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    common::use_scripted_model(
        home.path(),
        "[[step]]\n[[step.tool_calls]]\nname = \"remember\"\n\
         arguments = { topic = \"testing\", text = \"make check runs the tests\" }\n\n\
         [[step]]\ntext = \"Noted.\"\n",
    )?;
    let mut holder = keel_process(home.path(), ws.path())
        .args(["exec", "--approval", "auto", "remember how we test"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // The plugin waits in its open of the FIFO (for a writer that never comes), holding the
    // lock.
    let lock = dir.join(".memory.lock");
    wait_until(
        "the remember holding the folder's lock",
        Duration::from_secs(120),
        || {
            if let Some(status) = holder.try_wait()? {
                return Err(format!("the holder ended first: {status}").into());
            }
            Ok(lock_is_held(&lock)?)
        },
    )?;

    // Slow: the lock looks a minute old, which no write takes; still nobody else gets it.
    std::fs::File::options()
        .write(true)
        .open(&lock)?
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(60))?;
    // A second session (its own home: the lock is the folder's) remembering meanwhile.
    let other = tempfile::tempdir()?;
    common::use_scripted_model(
        other.path(),
        "[[step]]\n[[step.tool_calls]]\nname = \"remember\"\n\
         arguments = { topic = \"style\", text = \"Name things plainly\" }\n\n\
         [[step]]\ntext = \"Noted.\"\n",
    )?;
    let second = keel(other.path(), ws.path())
        .args(["exec", "--json", "--approval", "auto", "remember the style"])
        .timeout(Duration::from_secs(120))
        .output()?;
    let said = String::from_utf8_lossy(&second.stdout).into_owned()
        + &String::from_utf8_lossy(&second.stderr);
    let outcome = common::json_lines(&second.stdout)
        .into_iter()
        .find(|l| l["event"]["kind"] == "tool_outcome")
        .ok_or_else(|| format!("no tool outcome: {said}"))?;
    assert!(
        outcome["event"]["outcome"]["status"] != "ok"
            && outcome["event"]["outcome"]["content"]
                .as_str()
                .is_some_and(|c| c.contains("busy")),
        "{outcome}"
    );
    assert!(
        !dir.join("style.md").exists(),
        "written under another's lock"
    );

    // Killed: the next writer goes at once.
    holder.kill()?;
    holder.wait()?;
    std::fs::remove_file(&fifo)?;
    let consolidate = keel(home.path(), ws.path())
        .args([
            "memory",
            "consolidate",
            "--scope",
            "project",
            "--apply",
            "--no-model",
        ])
        .timeout(Duration::from_secs(120))
        .output()?;
    assert!(
        consolidate.status.success(),
        "{}{}",
        String::from_utf8_lossy(&consolidate.stdout),
        String::from_utf8_lossy(&consolidate.stderr)
    );
    assert!(!lock_is_held(&lock)?);
    Ok(())
}

/// keel's home is the person's alone whoever made it: one made 0755 by hand, with a session
/// log of 0644 holding a key a command printed and a checkpoint store to match, is made 0700
/// with everything in it the person's alone as soon as keel uses it; a home keel makes is
/// 0700; a home owned by someone else, a link to one, or a home in a folder anyone may write
/// is refused, saying what to do.
#[test]
fn keels_home_is_made_the_persons_alone_and_anothers_is_refused() -> R {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| -> std::io::Result<u32> {
        use std::os::unix::fs::MetadataExt as _;
        Ok(std::fs::symlink_metadata(p)?.mode() & 0o7777)
    };
    let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    let root = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let home = root.path().join("home");
    let sessions = home.join("data/sessions");
    let objects = home.join("checkpoints/objects");
    std::fs::create_dir_all(&sessions)?;
    std::fs::create_dir_all(&objects)?;
    let log = sessions.join("s1.jsonl");
    std::fs::write(
        &log,
        "{\"text\": \"-----BEGIN OPENSSH PRIVATE KEY-----\"}\n",
    )?;
    std::fs::write(objects.join("blob"), "a copy of a file")?;
    for dir in [
        &home,
        &home.join("data"),
        &sessions,
        &home.join("checkpoints"),
        &objects,
    ] {
        set(dir, 0o755)?;
    }
    set(&log, 0o644)?;
    set(&objects.join("blob"), 0o644)?;
    keel(&home, ws.path())
        .args(["sessions", "list"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    assert_eq!(mode(&home)?, 0o700);
    for dir in [
        &home.join("data"),
        &sessions,
        &home.join("checkpoints"),
        &objects,
    ] {
        assert_eq!(mode(dir)?, 0o700, "{}", dir.display());
    }
    assert_eq!(mode(&log)?, 0o600);
    assert_eq!(mode(&objects.join("blob"))?, 0o600);

    // Made private again by hand, with the logs' folder left open: closed again.
    set(&home.join("data"), 0o755)?;
    keel(&home, ws.path())
        .args(["sessions", "list"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    assert_eq!(mode(&home.join("data"))?, 0o700);

    // A home keel makes.
    let made = root.path().join("made/home");
    keel(&made, ws.path())
        .args(["sessions", "list"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    assert_eq!(mode(&made)?, 0o700);

    // A home through a link: its target is made private.
    let target = root.path().join("target");
    std::fs::create_dir(&target)?;
    set(&target, 0o755)?;
    let linked = root.path().join("linked");
    std::os::unix::fs::symlink(&target, &linked)?;
    keel(&linked, ws.path())
        .args(["sessions", "list"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    assert_eq!(mode(&target)?, 0o700);

    // Someone else's home, directly or through a link, and a home in a folder anyone may
    // write: refused, and left as it was.
    let someone = nix::unistd::Uid::from_raw(4242);
    let theirs = root.path().join("theirs");
    std::fs::create_dir(&theirs)?;
    set(&theirs, 0o755)?;
    let is_root = nix::unistd::geteuid().is_root();
    if is_root {
        nix::unistd::chown(&theirs, Some(someone), None)?;
    }
    let to_theirs = root.path().join("to-theirs");
    std::os::unix::fs::symlink(&theirs, &to_theirs)?;
    let open = root.path().join("open");
    std::fs::create_dir(&open)?;
    set(&open, 0o777)?;
    let mut refused = vec![(open.join("home"), "anyone may write")];
    if is_root {
        refused.push((theirs.clone(), "belongs to uid 4242"));
        refused.push((to_theirs, "belongs to uid 4242"));
    }
    for (home, why) in refused {
        let out = keel(&home, ws.path())
            .args(["sessions", "list"])
            .timeout(Duration::from_secs(60))
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(why) && stderr.contains("--home"),
            "{}: {stderr}",
            home.display()
        );
    }
    assert_eq!(mode(&theirs)?, 0o755);
    assert!(!open.join("home").exists());
    Ok(())
}

/// What killed keel processes left is swept by the next start and by `keel doctor --fix`:
/// exactly what is keel's and whose keel is gone. Two sessions run a long command (so each has
/// a command marker in the temp folder and a session lock); one is killed with SIGKILL, the
/// other lives on. Beside them, the temp files killed atomic writes leave (`keel mcp add`'s
/// `.config.toml.*.tmp`, a spilled output's, a restore's, a memory folder's), named for the
/// dead keel, for the live one, and for a pid used again by a later process; and files that
/// are not keel's.
#[test]
fn leftovers_of_killed_keels_are_swept_and_a_live_keels_are_kept() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let tmp = tempfile::tempdir()?;
    common::use_scripted_model(
        home.path(),
        "[[step]]\n[[step.tool_calls]]\nname = \"exec_shell\"\n\
         arguments = { command = \"sleep 120\" }\n\n[[step]]\ntext = \"done\"\n",
    )?;
    let markers = |pid: u32| -> Vec<PathBuf> {
        std::fs::read_dir(tmp.path())
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("keel-cwd-{pid}-"))
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let running = |home: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(home.join("running"))
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let session = || {
        keel_process(home.path(), ws.path())
            .env("TMPDIR", tmp.path())
            .args(["exec", "--approval", "auto", "wait"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let mut killed = session()?;
    let mut live = session()?;
    for child in [&killed, &live] {
        let pid = child.id();
        wait_until("a command's marker", Duration::from_secs(120), || {
            Ok(!markers(pid).is_empty())
        })?;
    }
    let (killed_pid, live_pid) = (killed.id(), live.id());
    let killed_marker = markers(killed_pid);
    let live_marker = markers(live_pid);
    assert_eq!(running(home.path()).len(), 2);
    killed.kill()?;
    killed.wait()?;

    // What killed writers leave, and what is not keel's.
    let dead = dead_pid()?;
    let spill = ws.path().join(".keel/spill");
    std::fs::create_dir_all(&spill)?;
    let deep = ws.path().join("src/deep");
    std::fs::create_dir_all(&deep)?;
    let memory = ws.path().join(".keel/memory");
    std::fs::create_dir_all(&memory)?;
    let plant = |path: PathBuf| -> std::io::Result<PathBuf> {
        std::fs::write(&path, "part")?;
        Ok(path)
    };
    let home_dead = plant(
        home.path()
            .join(format!(".config.toml.{dead}-0-0123456789abcdef.tmp")),
    )?;
    let home_killed = plant(
        home.path()
            .join(format!(".keel.lock.{killed_pid}-3-0123456789abcdef.tmp")),
    )?;
    let spill_dead = plant(spill.join(format!(".call-1.txt.{dead}-0-aB3dE6.tmp")))?;
    let restore_dead = plant(deep.join(format!(".keel-restore-{dead}-0-1700000000000000000.tmp")))?;
    let memory_dead = plant(memory.join(".MEMORY.md.1a2b-3c4d-0.keeltmp"))?;
    let home_live = plant(
        home.path()
            .join(format!(".config.toml.{live_pid}-0-0123456789abcdef.tmp")),
    )?;
    let restore_live = plant(deep.join(format!(
        ".keel-restore-{live_pid}-0-1700000000000000000.tmp"
    )))?;
    // Named for this test's own process, and last changed long before it started: a writer
    // whose pid this process now has.
    let me = std::process::id();
    let reused = plant(
        home.path()
            .join(format!(".trust.toml.{me}-0-0123456789abcdef.tmp")),
    )?;
    std::fs::File::options()
        .write(true)
        .open(&reused)?
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(30 * 24 * 3600))?;
    let not_keels = [
        plant(home.path().join(".config.toml.tmp"))?,
        plant(home.path().join("notes.tmp"))?,
        plant(deep.join(format!(".notes.{dead}-0-0123456789abcdef.tmp")))?,
        plant(tmp.path().join(format!("keel-other-{dead}-x")))?,
    ];

    // The next start.
    keel_process(home.path(), ws.path())
        .env("TMPDIR", tmp.path())
        .args(["sessions", "list"])
        .stdout(Stdio::null())
        .status()?;
    for gone in killed_marker
        .iter()
        .chain([&home_dead, &home_killed, &spill_dead, &reused])
    {
        assert!(!gone.exists(), "not swept at start: {}", gone.display());
    }
    assert_eq!(
        running(home.path()).len(),
        1,
        "the killed session's lock is swept"
    );
    for kept in live_marker
        .iter()
        .chain([&home_live, &restore_live, &restore_dead, &memory_dead])
        .chain(&not_keels)
    {
        assert!(kept.exists(), "swept at start: {}", kept.display());
    }

    // `keel doctor --fix`: the workspace and the memory folders too.
    let out = keel(home.path(), ws.path())
        .env("TMPDIR", tmp.path())
        .args(["doctor", "--fix"])
        .timeout(Duration::from_secs(120))
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for gone in [&restore_dead, &memory_dead] {
        assert!(!gone.exists(), "not swept by --fix: {}", gone.display());
        assert!(stdout.contains(&gone.display().to_string()), "{stdout}");
    }
    for kept in live_marker
        .iter()
        .chain([&home_live, &restore_live])
        .chain(&not_keels)
    {
        assert!(kept.exists(), "swept by --fix: {}", kept.display());
    }
    assert_eq!(
        running(home.path()).len(),
        1,
        "the live session's lock is kept"
    );

    live.kill()?;
    live.wait()?;
    Ok(())
}
