//! The plugin author's workflow and the registry end to end through the `keel` binary:
//! `plugin new` → `plugin build` → `publish` → `install` into a fresh home → the plugin
//! loads and its tool is called; refusals, browsing and the loopback server.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use assert_cmd::Command;
use predicates::prelude::*;

type R = Result<(), Box<dyn std::error::Error>>;

fn keel(home: &Path) -> Result<Command, Box<dyn std::error::Error>> {
    let mut cmd = Command::cargo_bin("keel")?;
    cmd.env("KEEL_HOME", home)
        .env("NO_COLOR", "1")
        .env_remove("KEEL_LOG")
        .env_remove("KEEL_REGISTRY");
    Ok(cmd)
}

/// The target directory the keel sources' guest builds use: building the new plugin there
/// reuses the already compiled SDK dependencies.
fn guest_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|t| t.join("keel-guests"))
        .unwrap_or_else(|| PathBuf::from("target/keel-guests"))
}

fn public_key(home: &Path, namespace: &str) -> Result<String, Box<dyn std::error::Error>> {
    let out = keel(home)?
        .args(["key", "new", "--namespace", namespace, "--json"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["public"].as_str().ok_or("public key")?.to_owned())
}

#[test]
fn new_build_publish_install_load_and_call() -> R {
    let tmp = tempfile::tempdir()?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");
    let crate_dir = tmp.path().join("word-count");

    keel(&author)?
        .args(["plugin", "new", "word-count", "--kind", "tool", "--dir"])
        .arg(&crate_dir)
        .assert()
        .success()
        .stdout(predicate::str::contains("created tool plugin `word-count`"));
    for file in [
        "Cargo.toml",
        "keel.toml",
        "src/lib.rs",
        "wit/keel-plugin-0.2.0/plugin.wit",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} was generated");
    }
    let cargo_toml = std::fs::read_to_string(crate_dir.join("Cargo.toml"))?;
    assert!(cargo_toml.contains("[workspace]"), "a workspace of its own");

    // One command builds the component and checks it.
    keel(&author)?
        .arg("plugin")
        .arg("build")
        .arg(&crate_dir)
        .env("CARGO_TARGET_DIR", guest_target_dir())
        .env("CARGO_NET_OFFLINE", "true")
        .assert()
        .success()
        .stdout(predicate::str::contains("ABI keel:plugin@0.4.0"))
        .stdout(predicate::str::ends_with("ok\n"));
    assert!(crate_dir.join("word-count.wasm").is_file());

    // Its tool, called in a real kernel from a calls file, without a model.
    std::fs::write(
        crate_dir.join("keel-test.toml"),
        "[[call]]\ntool = \"word_count\"\ninput = { text = \"hello keel world\" }\n\
         expect = { chars = 16, words = 3 }\n\n[[call]]\ntool = \"word_count\"\n\
         input = {}\nexpect-error = true\n",
    )?;
    keel(&author)?
        .args(["plugin", "test"])
        .arg(&crate_dir)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            r#"✔ tool word_count {"text":"hello keel world"} → {"chars":16,"words":3}"#,
        ))
        .stdout(predicate::str::contains("2 call(s), all as expected"));
    let wrong = tmp.path().join("wrong.toml");
    std::fs::write(
        &wrong,
        "[[call]]\ntool = \"word_count\"\ninput = { text = \"a b\" }\nexpect = { words = 3 }\n",
    )?;
    keel(&author)?
        .args(["plugin", "test"])
        .arg(&crate_dir)
        .arg("--calls")
        .arg(&wrong)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("expected {\"words\":3}"))
        .stdout(predicate::str::contains("1 call(s), 1 not as expected"));

    let public = public_key(&author, "acme")?;
    keel(&author)?
        .arg("publish")
        .arg(&crate_dir)
        .arg("--registry")
        .arg(&registry)
        .assert()
        .success()
        .stdout(predicate::str::contains("published acme:word-count 0.1.0"))
        .stdout(predicate::str::contains(&public));

    // A fresh home: trust the author for `acme` on this registry, then install.
    keel(&user)?
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    // Without --yes (and no terminal) nothing is installed.
    keel(&user)?
        .args(["install", "acme:word-count", "--registry"])
        .arg(&registry)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("install acme:word-count 0.1.0"))
        .stdout(predicate::str::contains("(trusted for `acme`)"))
        .stderr(predicate::str::contains("run again with --yes"));
    assert!(!user.join("keel.lock").exists());
    keel(&user)?
        .args(["install", "acme:word-count", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .success()
        .stdout(predicate::str::contains("installed 1 plugin(s)"));
    // Compiled at install time: the component cache already holds it.
    let cached = std::fs::read_dir(user.join("cache/components"))?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count();
    assert!(cached >= 1, "nothing compiled at install time");
    let lock = std::fs::read_to_string(user.join("keel.lock"))?;
    for field in [
        "name = \"acme:word-count\"",
        "version = \"0.1.0\"",
        "sha256 = ",
        "key = ",
        "capabilities = ",
    ] {
        assert!(lock.contains(field), "lockfile has {field}:\n{lock}");
    }

    // The installed plugin loads into a session and its tool is called.
    keel(&user)?
        .args(["plugin", "list"])
        .assert()
        .success()
        .stdout(predicate::str::is_match(
            r"word-count\s+0\.1\.0\s+wasm\s+active",
        )?);
    keel(&user)?
        .args([
            "tool",
            "call",
            "word_count",
            r#"{"text":"hello keel world"}"#,
        ])
        .assert()
        .success()
        .stdout(r#"{"chars":16,"words":3}"#.to_owned() + "\n");

    // In a live session it is unloaded and loaded again by name (re-hashed against the
    // lockfile again), and Tab completion knows the name.
    let config = user.join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap_or_default();
    let script = tmp.path().join("script.toml");
    std::fs::write(&script, "[[step]]\ntext = \"ok\"\n")?;
    text.push_str(&format!(
        "\n[model]\nprovider = \"scripted\"\nscript = {:?}\n",
        script.display().to_string()
    ));
    std::fs::write(&config, text)?;
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws)?;
    keel(&user)?
        .arg("--workspace")
        .arg(&ws)
        .arg("run")
        .write_stdin("/unload word-count\n/load word-count\n/exit\n")
        .assert()
        .success()
        .stderr(predicate::str::contains("unloaded word-count"))
        .stderr(predicate::str::contains("loaded word-count 0.1.0"))
        .stderr(predicate::str::contains("error").not());

    // An installed component changed on disk is refused at load, with both hashes.
    let wasm = user.join("plugins/acme/word-count/0.1.0/plugin.wasm");
    let mut bytes = std::fs::read(&wasm)?;
    bytes.push(0);
    std::fs::write(&wasm, &bytes)?;
    keel(&user)?
        .args(["plugin", "list"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("does not match the lockfile"))
        .stderr(predicate::str::contains("expected sha256"))
        .stderr(predicate::str::contains(
            "keel install acme:word-count@=0.1.0",
        ));
    Ok(())
}

/// The author's first steps with nothing but a `keel` binary: a copy of it in a directory
/// tree without keel's sources, `HOME` an empty directory (cargo's and rustup's homes still
/// the machine's, for the registry cache and the toolchain), offline. `keel plugin new`
/// vendors the SDK, the WIT and a lockfile, and the crate builds and loads.
#[test]
fn a_plugin_is_made_and_built_with_only_a_copy_of_the_binary() -> R {
    let tmp = tempfile::tempdir()?;
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin)?;
    let keel_bin = bin.join("keel");
    std::fs::copy(assert_cmd::cargo::cargo_bin("keel"), &keel_bin)?;
    let home = tmp.path().join("home");
    std::fs::create_dir(&home)?;
    let real_home = std::env::var_os("HOME").map(PathBuf::from).ok_or("HOME")?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".cargo"));
    let rustup_home = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".rustup"));
    let author = |args: &[&str]| {
        let mut cmd = Command::new(&keel_bin);
        cmd.current_dir(tmp.path())
            .env("HOME", &home)
            .env("KEEL_HOME", home.join(".keel"))
            .env("CARGO_HOME", &cargo_home)
            .env("RUSTUP_HOME", &rustup_home)
            .env("CARGO_NET_OFFLINE", "true")
            .env("CARGO_TARGET_DIR", guest_target_dir())
            .env("NO_COLOR", "1")
            .env_remove("KEEL_LOG")
            .args(args);
        cmd
    };
    author(&["plugin", "new", "tally"])
        .assert()
        .success()
        .stdout(predicate::str::contains("created tool plugin `tally`"));
    let crate_dir = tmp.path().join("tally");
    let cargo_toml = std::fs::read_to_string(crate_dir.join("Cargo.toml"))?;
    assert!(
        cargo_toml.contains("keel-sdk = { path = \"vendor/keel-sdk\" }"),
        "{cargo_toml}"
    );
    for file in [
        "vendor/keel-sdk/Cargo.toml",
        "vendor/keel-sdk/src/lib.rs",
        "wit/keel-plugin-0.2.0/plugin.wit",
        "Cargo.lock",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} was vendored");
    }
    author(&["plugin", "build", "tally"])
        .assert()
        .success()
        .stdout(predicate::str::ends_with("ok\n"));
    // Loaded in a workspace of its own (keel's home must not be inside the workspace).
    author(&["plugin", "list", "--plugin", "."])
        .current_dir(&crate_dir)
        .assert()
        .success()
        .stdout(predicate::str::is_match(
            r"tally\s+0\.1\.0\s+wasm\s+active",
        )?);
    Ok(())
}

/// The tool plugin `keel dev` develops in its test, as `version`.
fn tally_source(version: &str) -> String {
    include_str!("fixtures/tally.rs.txt").replace("VERSION", version)
}

/// `keel dev`: a save rebuilds the plugin and the running session answers with the new version
/// without a restart, its kernel-held state kept; a broken save keeps the old version answering.
#[test]
fn keel_dev_swaps_each_good_build_into_the_live_session() -> R {
    use std::io::Write as _;
    use std::sync::mpsc;
    use std::time::Duration;

    let tmp = tempfile::tempdir()?;
    let home = tmp.path().join("home");
    std::fs::create_dir(&home)?;
    let crate_dir = tmp.path().join("tally");
    keel(&home)?
        .args(["plugin", "new", "tally", "--dir"])
        .arg(&crate_dir)
        .assert()
        .success();
    std::fs::write(crate_dir.join("src/lib.rs"), tally_source("one"))?;
    // Each turn: call `tally`, then say the turn is done.
    let steps: String = (0..4)
        .map(|i| {
            format!(
                "[[step]]\n[[step.tool_calls]]\nname = \"tally\"\narguments = {{}}\n\n\
                 [[step]]\ntext = \"turn {i} done\"\n\n"
            )
        })
        .collect();
    crate::common::use_scripted_model(&home, &steps)?;
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws)?;

    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("keel"))
        .env("KEEL_HOME", &home)
        .env("KEEL_YES", "1")
        .env("NO_COLOR", "1")
        .env("CARGO_TARGET_DIR", guest_target_dir())
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("KEEL_LOG")
        .arg("--workspace")
        .arg(&ws)
        .arg("dev")
        .arg(&crate_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Every line keel prints, from both streams, in one channel.
    let (lines, seen) = mpsc::channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    // Only the readers send: when keel exits, the channel ends.
    drop(lines);
    let mut transcript = String::new();
    let mut wait_for = |what: &str| -> Result<(), String> {
        loop {
            match seen.recv_timeout(Duration::from_secs(180)) {
                Ok(line) => {
                    transcript.push_str(&line);
                    transcript.push('\n');
                    if line.contains(what) {
                        return Ok(());
                    }
                }
                Err(_) => return Err(format!("no `{what}` in:\n{transcript}")),
            }
        }
    };
    let mut stdin = child.stdin.take().ok_or("stdin")?;
    wait_for("[dev] watching")?;
    writeln!(stdin, "count")?;
    wait_for("tally one call 1")?;
    wait_for("turn 0 done")?;

    // A good save: the next turn is answered by the new build, which sees the old one's state.
    std::fs::write(crate_dir.join("src/lib.rs"), tally_source("two"))?;
    wait_for("`tally` #2 is live")?;
    writeln!(stdin, "count again")?;
    wait_for("tally two call 2")?;
    wait_for("turn 1 done")?;

    // A broken save: the compiler's complaint, and #2 keeps answering.
    std::fs::write(crate_dir.join("src/lib.rs"), "this is not rust\n")?;
    wait_for("the build failed; #2 stays live")?;
    writeln!(stdin, "and again")?;
    wait_for("tally two call 3")?;
    wait_for("turn 2 done")?;

    // Fixed again: #3.
    std::fs::write(crate_dir.join("src/lib.rs"), tally_source("three"))?;
    wait_for("`tally` #3 is live")?;

    // A save that widens the manifest (here: running commands) is not swapped in without a
    // new yes: #3 keeps answering.
    let manifest = crate_dir.join("keel.toml");
    let widened = std::fs::read_to_string(&manifest)?
        .replace("[capabilities]", "[capabilities]\nexec = true");
    std::fs::write(&manifest, widened)?;
    wait_for("asks for more than was agreed to")?;
    writeln!(stdin, "once more")?;
    wait_for("tally three call 4")?;
    writeln!(stdin, "/exit")?;
    wait_for("keel resume")?;
    assert!(child.wait()?.success());
    // A build per save, not a loop: reading the sources (the build does) is not a change.
    // (An editor's save can arrive as two settled changes, so two builds are allowed for one.)
    let builds = transcript.matches("[dev] rebuilding").count();
    assert!(
        (4..=6).contains(&builds),
        "{builds} builds for 4 saves:\n{transcript}"
    );
    assert_eq!(transcript.matches(" is live: ").count(), 2, "{transcript}");
    // The swap times, for whoever runs this with --nocapture.
    for line in transcript.lines().filter(|l| l.contains("is live")) {
        eprintln!("{line}");
    }
    Ok(())
}

/// A plugin in another language: `keel plugin new --lang python` starts from the shipped
/// Python example, `keel plugin build` makes it a component with componentize-py that imports
/// nothing but keel's interfaces, and its tool answers in a real kernel through the gates.
#[test]
fn a_python_plugin_is_made_built_and_called() -> R {
    let tmp = tempfile::tempdir()?;
    let home = tmp.path().join("home");
    let dir = tmp.path().join("tiny-count");
    keel(&home)?
        .args(["plugin", "new", "tiny-count", "--lang", "python", "--dir"])
        .arg(&dir)
        .assert()
        .success()
        .stdout(predicate::str::contains("created tool plugin `tiny-count`"));
    keel(&home)?
        .args(["plugin", "build"])
        .arg(&dir)
        .assert()
        .success()
        // Only keel's own interfaces: no WASI, so no files, clocks or sockets.
        .stdout(predicate::str::contains("wasi:").not())
        .stdout(predicate::str::ends_with("ok\n"));
    keel(&home)?
        .current_dir(&dir)
        .args(["plugin", "test"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            r#"✔ tool tiny_count {"text":"hello keel world"} → {"chars":16,"words":3}"#,
        ))
        // The plugin's own typed error reaches the caller with its kind (ABI 0.4.0).
        .stdout(predicate::str::contains(
            "invalid input: `text` is empty; send the text to count",
        ))
        .stdout(predicate::str::contains("3 call(s), all as expected"));
    Ok(())
}

/// A plugin directory holding the bundled echo-tool component under another manifest.
fn plugin_dir(root: &Path, name: &str, extra: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("keel.toml"),
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"wasm\"\ndescription = \"{name} test plugin\"\ncomponent = \"c.wasm\"\n{extra}"
        ),
    )?;
    let component = keel_bundled_plugins::get("echo-tool")
        .map(|b| b.component())
        .ok_or("echo-tool is bundled")?;
    std::fs::write(dir.join("c.wasm"), component)?;
    Ok(dir)
}

#[test]
fn install_shows_requests_and_refusals_say_how_to_fix_them() -> R {
    let tmp = tempfile::tempdir()?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");
    let fetcher = plugin_dir(
        tmp.path(),
        "fetcher",
        "[capabilities]\nnetwork = [\"api.example.com\"]\n",
    )?;
    let public = public_key(&author, "acme")?;
    keel(&author)?
        .arg("publish")
        .arg(&fetcher)
        .arg("--registry")
        .arg(&registry)
        .assert()
        .success();
    // Publishing the same version again is refused with the fix.
    keel(&author)?
        .arg("publish")
        .arg(&fetcher)
        .arg("--registry")
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("already published"))
        .stderr(predicate::str::contains("raise `version`"));

    // Unknown key: refused, naming the key and the command that trusts it.
    keel(&user)?
        .args(["install", "acme:fetcher", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains(format!(
            "keel key trust {public} --namespace acme"
        )));

    keel(&user)?
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    keel(&user)?
        .args(["install", "acme:fetcher", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "NETWORK: may send requests to api.example.com",
        ));

    // Browse.
    let out = keel(&user)?
        .args(["info", "acme:fetcher", "--json", "--registry"])
        .arg(&registry)
        .output()?;
    assert!(out.status.success());
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(info["versions"][0]["version"], "0.1.0");
    assert_eq!(info["versions"][0]["yanked"], false);
    assert_eq!(info["versions"][0]["signer"], public.as_str());
    assert_eq!(info["versions"][0]["trusted"], true);
    assert_eq!(
        info["versions"][0]["capabilities"]["network"][0],
        "api.example.com"
    );
    let out = keel(&user)?
        .args(["search", "fetch", "--json", "--registry"])
        .arg(&registry)
        .output()?;
    let hits: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(hits[0]["name"], "acme:fetcher");

    // Yank: shown by info, nothing left for a new install, the existing lockfile still loads.
    keel(&author)?
        .args(["yank", "acme:fetcher@0.1.0", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    keel(&user)?
        .args(["info", "acme:fetcher", "--registry"])
        .arg(&registry)
        .assert()
        .success()
        .stdout(predicate::str::contains("YANKED"));
    let fresh = tmp.path().join("fresh");
    keel(&fresh)?
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    keel(&fresh)?
        .args(["install", "acme:fetcher", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("0.1.0 (yanked)"));
    keel(&user)?
        .args(["install", "acme:fetcher", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "kept because the lockfile pins it",
        ));
    // It still loads (its files match the lockfile); its borrowed component's `echo` tool
    // collides with the bundled echo-tool's, which is beside the point here.
    keel(&user)?
        .args(["plugin", "list"])
        .assert()
        .success()
        .stdout(predicate::str::is_match(r"fetcher\s+0\.1\.0\s+wasm")?);
    Ok(())
}

#[test]
fn a_conflict_is_explained_through_the_binary() -> R {
    let tmp = tempfile::tempdir()?;
    let home = tmp.path().join("home");
    let registry = tmp.path().join("registry");
    let public = public_key(&home, "acme")?;
    let app = plugin_dir(
        tmp.path(),
        "app",
        "[requires]\n\"example.weather\" = \"^2\"\n",
    )?;
    keel(&home)?
        .arg("publish")
        .arg(&app)
        .arg("--registry")
        .arg(&registry)
        .assert()
        .success();
    keel(&home)?
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    keel(&home)?
        .args(["install", "acme:app", "--yes", "--registry"])
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot resolve"))
        .stderr(predicate::str::contains(
            "acme:app 0.1.0 requires service `example.weather` ^2",
        ))
        .stderr(predicate::str::contains(
            "no plugin in this registry provides it",
        ));
    Ok(())
}

#[test]
fn serve_shares_a_registry_on_loopback_only() -> R {
    let tmp = tempfile::tempdir()?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");

    keel(&author)?
        .args(["registry", "serve", "--addr", "0.0.0.0:0", "--registry"])
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--expose-registry-to-network"));

    let mut server = std::process::Command::new(assert_cmd::cargo::cargo_bin("keel"))
        .env("KEEL_HOME", &author)
        .args(["registry", "serve", "--addr", "127.0.0.1:0", "--registry"])
        .arg(&registry)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| -> R {
        let stdout = server.stdout.take().ok_or("server stdout")?;
        let mut lines = std::io::BufReader::new(stdout);
        let mut first = String::new();
        lines.read_line(&mut first)?;
        let url = first
            .split_whitespace()
            .last()
            .filter(|u| u.starts_with("http://127.0.0.1:"))
            .ok_or_else(|| format!("no URL in `{first}`"))?
            .to_owned();

        let public = public_key(&author, "acme")?;
        let echo = plugin_dir(tmp.path(), "echo-remote", "")?;
        keel(&author)?
            .arg("publish")
            .arg(&echo)
            .args(["--registry", &url])
            .assert()
            .success()
            .stdout(predicate::str::contains(format!("to {url}")));
        keel(&user)?
            .args([
                "key",
                "trust",
                &public,
                "--namespace",
                "acme",
                "--registry",
                &url,
            ])
            .assert()
            .success();
        keel(&user)?
            .args(["search", "--registry", &url])
            .assert()
            .success()
            .stdout(predicate::str::contains("acme:echo-remote 0.1.0"));
        keel(&user)?
            .args(["install", "acme:echo-remote", "--yes", "--registry", &url])
            .assert()
            .success();
        let lock = std::fs::read_to_string(user.join("keel.lock"))?;
        assert!(lock.contains(&format!("registry = \"{url}\"")), "{lock}");
        drop(lines);
        Ok(())
    })();
    server.kill()?;
    server.wait()?;
    result
}

/// Write `entries` (`[registries]` and the like) as `home`'s config.toml.
fn oci_config(home: &Path, entries: &str) -> R {
    std::fs::create_dir_all(home)?;
    std::fs::write(home.join("config.toml"), entries)?;
    Ok(())
}

#[test]
fn oci_registries_are_published_to_and_installed_from_by_name() -> R {
    use base64::Engine as _;
    use keel_tests::oci_server::OciServer;

    let tmp = tempfile::tempdir()?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let open = OciServer::anonymous()?;
    let closed = OciServer::with_user("team", "hunter2-token")?;
    let entries = format!(
        "[registries.open]\nurl = \"{}\"\nplain-http = true\n\n[registries.team]\nurl = \"{}\"\nplain-http = true\nusername = \"team\"\npassword-secret = \"TEAM_REGISTRY_TOKEN\"\n",
        open.url("keel"),
        closed.url("plugins")
    );
    oci_config(&author, &entries)?;
    oci_config(&user, &entries)?;
    let public = public_key(&author, "acme")?;

    // Anonymous: publish by name, browse, trust, install, call.
    let echo = plugin_dir(tmp.path(), "echo-oci", "")?;
    keel(&author)?
        .arg("publish")
        .arg(&echo)
        .args(["--registry", "open"])
        .assert()
        .success()
        .stdout(predicate::str::contains(open.url("keel")));
    keel(&user)?
        .args([
            "key",
            "trust",
            &public,
            "--namespace",
            "acme",
            "--registry",
            "open",
        ])
        .assert()
        .success();
    keel(&user)?
        .args(["search", "echo", "--registry", "open"])
        .assert()
        .success()
        .stdout(predicate::str::contains("acme:echo-oci 0.1.0"));
    let out = keel(&user)?
        .args(["info", "acme:echo-oci", "--json", "--registry", "open"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(info["versions"][0]["version"], "0.1.0");
    assert_eq!(info["versions"][0]["trusted"], true);
    // The same registry by its URL is the same entry (plain HTTP, as configured).
    keel(&user)?
        .args([
            "install",
            "acme:echo-oci",
            "--yes",
            "--registry",
            &open.url("keel"),
        ])
        .assert()
        .success();
    let lock = std::fs::read_to_string(user.join("keel.lock"))?;
    assert!(
        lock.contains(&format!("registry = \"{}\"", open.url("keel"))),
        "{lock}"
    );
    keel(&user)?
        .args([
            "tool",
            "call",
            "echo",
            r#"{"text":"from the OCI registry"}"#,
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("from the OCI registry"));

    // Yanked there, it is listed as yanked and kept by the lockfile that pins it.
    keel(&author)?
        .args(["yank", "acme:echo-oci@0.1.0", "--registry", "open"])
        .assert()
        .success();
    let out = keel(&user)?
        .args(["info", "acme:echo-oci", "--json", "--registry", "open"])
        .output()?;
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(info["versions"][0]["yanked"], true);
    keel(&user)?
        .args(["install", "acme:echo-oci", "--yes", "--registry", "open"])
        .assert()
        .success();

    // A URL no entry names is reached over TLS, which a plain loopback registry does not speak.
    keel(&tmp.path().join("bare"))?
        .args([
            "search",
            "--registry",
            &format!("oci://{}/keel", open.host()),
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("plain-http = true"));

    // Authenticated: the password comes from the kernel-held secret the entry names.
    let team_echo = plugin_dir(tmp.path(), "echo-team", "")?;
    keel(&author)?
        .arg("publish")
        .arg(&team_echo)
        .args(["--registry", "team"])
        .env_remove("TEAM_REGISTRY_TOKEN")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("export TEAM_REGISTRY_TOKEN"));
    keel(&author)?
        .arg("publish")
        .arg(&team_echo)
        .args(["--registry", "team"])
        .env("TEAM_REGISTRY_TOKEN", "wrong")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("password-secret"));
    keel(&author)?
        .arg("publish")
        .arg(&team_echo)
        .args(["--registry", "team"])
        .env("TEAM_REGISTRY_TOKEN", "hunter2-token")
        .assert()
        .success();
    // A secret bound to other hosts is not sent to the registry.
    let bound = tmp.path().join("bound");
    oci_config(
        &bound,
        &format!(
            "{entries}
[secrets]
TEAM_REGISTRY_TOKEN = {{ value = \"hunter2-token\", hosts = [\"api.example.com\"] }}
"
        ),
    )?;
    keel(&bound)?
        .args(["search", "--registry", "team"])
        .env_remove("TEAM_REGISTRY_TOKEN")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("binds to api.example.com only"));
    // Bound to the registry's host (any port, as the kernel reads a binding), it is sent.
    oci_config(
        &bound,
        &format!(
            "{entries}\n[secrets]\nTEAM_REGISTRY_TOKEN = {{ value = \"hunter2-token\", hosts = [\"127.0.0.1\"] }}\n"
        ),
    )?;
    keel(&bound)?
        .args(["search", "--registry", "team"])
        .env_remove("TEAM_REGISTRY_TOKEN")
        .assert()
        .success()
        .stdout(predicate::str::contains("acme:echo-team"));

    // Another user reaches it with the credentials `docker login` stored.
    let member = tmp.path().join("member");
    oci_config(
        &member,
        &format!(
            "[registries.team]\nurl = \"{}\"\nplain-http = true\n",
            closed.url("plugins")
        ),
    )?;
    let docker = tmp.path().join("docker");
    std::fs::create_dir_all(&docker)?;
    let auth = base64::engine::general_purpose::STANDARD.encode("team:hunter2-token");
    std::fs::write(
        docker.join("config.json"),
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, closed.host()),
    )?;
    keel(&member)?
        .args([
            "key",
            "trust",
            &public,
            "--namespace",
            "acme",
            "--registry",
            "team",
        ])
        .assert()
        .success();
    keel(&member)?
        .args(["install", "acme:echo-team", "--yes", "--registry", "team"])
        .env("DOCKER_CONFIG", &docker)
        .assert()
        .success();
    keel(&member)?
        .args(["tool", "call", "echo", r#"{"text":"from the team"}"#])
        .assert()
        .success()
        .stdout(predicate::str::contains("from the team"));
    // Without them, the registry refuses and the error says how to log in.
    keel(&member)?
        .args(["search", "--registry", "team"])
        .env("DOCKER_CONFIG", tmp.path().join("nowhere"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("docker login"));
    Ok(())
}

/// Cursor up, erase the line, carriage return, and a line break that starts a line looking
/// like keel's own: what a hostile manifest's text may hold to hide a request of the consent.
const HOSTILE_TEXT: &str = r"harmless\u001b[1A\u001b[2K\rrequests: nothing\n    nothing beyond its own sandbox\u001b]0;owned\u0007";

/// `keel publish` refuses a manifest with control characters; a release that carries them
/// anyway (published around keel's check, as a hostile publisher or registry would) is shown
/// by `search`, `info` and `install`'s consent without a single control character.
#[test]
fn escape_sequences_from_a_registry_never_reach_the_terminal() -> R {
    let tmp = tempfile::tempdir()?;
    let author = tmp.path().join("author");
    let user = tmp.path().join("user");
    let registry = tmp.path().join("registry");
    let dir = plugin_dir(
        tmp.path(),
        "sly",
        "[capabilities]\nnetwork = [\"exfil.example\"]\nemits = [\"sly.done\"]\n",
    )?;
    let clean = std::fs::read_to_string(dir.join("keel.toml"))?;
    let hostile = clean
        .replace("sly test plugin", HOSTILE_TEXT)
        .replace("\"sly.done\"", &format!("\"sly.done{HOSTILE_TEXT}\""));
    std::fs::write(dir.join("keel.toml"), &hostile)?;
    let public = public_key(&author, "acme")?;
    keel(&author)?
        .arg("publish")
        .arg(&dir)
        .arg("--registry")
        .arg(&registry)
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "`description` holds the control character U+001B",
        ))
        .stderr(predicate::str::contains("capabilities.emits[0]"));

    // The same release, published with the library past keel's check.
    let host = keel_kernel::WasmHost::new(keel_kernel::WasmHostConfig {
        cache_dir: Some(tmp.path().join("wasm-cache")),
        ..keel_kernel::WasmHostConfig::default()
    })?;
    let mut package = keel_registry::validate(
        &host,
        &dir.join("keel.toml"),
        &clean,
        std::fs::read(dir.join("c.wasm"))?,
    )?;
    package.manifest_text = package
        .manifest_text
        .replace("sly test plugin", HOSTILE_TEXT)
        .replace("\"sly.done\"", &format!("\"sly.done{HOSTILE_TEXT}\""));
    package.manifest =
        keel_kernel::Manifest::parse(&package.manifest_text, &dir.join("keel.toml"))?;
    assert!(package.manifest.description.contains('\u{1b}'));
    let key =
        keel_registry::KeyPair::load(&keel_registry::Home::new(&author).keys_dir(), "default")?;
    let mut session = keel_registry::Session::new(
        keel_registry::Home::new(&author),
        keel_registry::Registry::open(&registry.display().to_string(), true)?,
    )?;
    keel_registry::publish(
        &mut session,
        &"acme:sly".parse()?,
        &package,
        Some(&key),
        &mut |_| {},
    )?;
    session.finish()?;

    keel(&user)?
        .args(["key", "trust", &public, "--namespace", "acme", "--registry"])
        .arg(&registry)
        .assert()
        .success();
    let printed = |args: &[&str]| -> Result<String, Box<dyn std::error::Error>> {
        let out = keel(&user)?
            .args(args)
            .arg("--registry")
            .arg(&registry)
            .output()?;
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    for (args, lines) in [
        (&["search", "harmless"][..], 1),
        (&["info", "acme:sly"][..], 8),
        (&["install", "acme:sly", "--yes"][..], 0),
    ] {
        let out = printed(args)?;
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?} printed control characters: {out:?}"
        );
        assert!(out.contains("harmless") || args[0] == "install", "{out}");
        if lines > 0 {
            assert_eq!(out.lines().count(), lines, "{args:?}: {out}");
        }
        if args[0] == "install" {
            // Every request is on a line of its own, and no line the release wrote stands
            // among them as if keel had written it.
            assert!(
                out.contains("NETWORK: may send requests to exfil.example"),
                "{out}"
            );
            assert!(
                out.lines()
                    .any(|l| l.starts_with("    EVENTS: may emit `sly.done")
                        && l.contains("nothing beyond its own sandbox")),
                "{out}"
            );
            assert!(
                !out.lines()
                    .any(|l| l.trim() == "nothing beyond its own sandbox"),
                "{out}"
            );
        }
    }
    Ok(())
}
