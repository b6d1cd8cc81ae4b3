//! `keel dev` as a plugin author feels it: the real `keel` binary develops the example tool
//! plugin (`tests/fixtures/tally.rs.txt`) in a live session while this program saves new
//! versions of its source. For each save it reports:
//!
//! - the swap: from the finished build to the new version live in the session (the kernel
//!   compiles the new component and reloads the plugin, its kernel-held state handed over),
//!   as `keel dev` measures and prints it;
//! - save → live: from writing the file to the line saying the new version is live, which
//!   adds the watcher's settling time (150 ms) and the cargo build.
//!
//! `cargo bench -p keel --bench dev_reload` (release). It builds the plugin offline from the
//! cargo cache, in the target directory keel's own guest crates use; `KEEL_BENCH_RUNS` sets
//! the number of saves (default 8); `KEEL_BENCH_TRACE=1` prints every line `keel dev` writes.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{millis, report};

const SOURCE: &str = include_str!("../tests/fixtures/tally.rs.txt");

/// The target directory keel's guest crates build in: the SDK's dependencies are compiled
/// there already.
fn guest_target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/keel-guests")
}

fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let tmp = tempfile::tempdir().expect("temporary directory");
    let home = tmp.path().join("home");
    let ws = tmp.path().join("ws");
    let crate_dir = tmp.path().join("tally");
    std::fs::create_dir(&home).expect("home");
    std::fs::create_dir(&ws).expect("workspace");
    let keel = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
        cmd.env("KEEL_HOME", &home)
            .env("KEEL_YES", "1")
            .env("NO_COLOR", "1")
            .env("CARGO_TARGET_DIR", guest_target_dir())
            .env("CARGO_NET_OFFLINE", "true")
            .env_remove("KEEL_LOG")
            .arg("--workspace")
            .arg(&ws)
            .args(args);
        cmd
    };
    let made = keel(&["plugin", "new", "tally", "--dir"])
        .arg(&crate_dir)
        .stdout(Stdio::null())
        .status()
        .expect("keel plugin new");
    assert!(made.success());
    let lib = crate_dir.join("src/lib.rs");
    std::fs::write(&lib, SOURCE.replace("VERSION", "v0")).expect("source");
    let script = tmp.path().join("script.toml");
    std::fs::write(&script, "[[step]]\ntext = \"ok\"\n").expect("script");
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n",
            script.display().to_string()
        ),
    )
    .expect("config");

    let mut child = keel(&["dev"])
        .arg(&crate_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel dev starts");
    let (lines, seen) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str| loop {
        let (at, line) = seen
            .recv_timeout(Duration::from_secs(300))
            .unwrap_or_else(|_| panic!("keel dev never said `{what}`"));
        if std::env::var_os("KEEL_BENCH_TRACE").is_some() {
            eprintln!("{line}");
        }
        if line.contains("the build failed") {
            panic!("the plugin did not build: {line}");
        }
        if line.contains(what) {
            return (at, line);
        }
    };
    wait_for("[dev] watching");

    let (mut swaps, mut save_to_live) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        // Apart from the last swap, as an author's saves are.
        std::thread::sleep(Duration::from_millis(300));
        let saved = Instant::now();
        std::fs::write(&lib, SOURCE.replace("VERSION", &format!("v{run}"))).expect("save");
        let (live_at, line) = wait_for("is live");
        let swap = line
            .split("swapped in ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|ms| ms.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no swap time in `{line}`"));
        swaps.push(swap);
        save_to_live.push(millis(live_at - saved));
    }
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        let _ = writeln!(stdin, "/exit");
    }
    let _ = child.wait();

    println!("keel dev, the example tool plugin ({runs} saves)");
    report("swap: build finished → new version live", "ms", &mut swaps);
    report("save → new version live", "ms", &mut save_to_live);
}
