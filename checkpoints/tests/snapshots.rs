//! What a snapshot records and what it leaves alone.

use std::time::{Duration, SystemTime};

use keel_checkpoints::rewind::{Target, prepare, rewind};
use std::os::unix::fs::PermissionsExt;

use keel_checkpoints::{Kind, Node, Recorder, Settings, Store};

use crate::common::{Fixture, Seen};

/// Outside a git repository `.gitignore` is still honoured, and so is `[checkpoints] ignore`;
/// a file over the size limit is not recorded, and the checkpoint says so.
#[test]
fn ignored_and_oversized_files_are_left_out_and_said() {
    let fx = Fixture::new(Settings {
        max_file_bytes: 1000,
        ignore: vec!["secrets/**".into()],
        ..Settings::default()
    });
    std::fs::write(fx.path(".gitignore"), "target/\n*.log\n").expect("gitignore");
    std::fs::create_dir_all(fx.path("target/debug")).expect("target");
    std::fs::write(fx.path("target/debug/out"), "built").expect("built");
    std::fs::write(fx.path("run.log"), "log").expect("log");
    std::fs::create_dir(fx.path("secrets")).expect("secrets");
    std::fs::write(fx.path("secrets/key"), "k").expect("key");
    std::fs::write(fx.path("big.bin"), vec![7u8; 1001]).expect("big");
    std::fs::write(fx.path("kept.txt"), "kept").expect("kept");
    let c = fx.recorder.before_turn("s").expect("checkpoint");
    let manifest = fx.recorder.store().manifest(&c.manifest).expect("manifest");
    let paths: Vec<&str> = manifest.entries.keys().map(String::as_str).collect();
    assert_eq!(paths, [".gitignore", "kept.txt", "secrets"], "{paths:?}");
    assert_eq!(c.skipped.len(), 1, "{:?}", c.skipped);
    assert_eq!(c.skipped[0].path, "big.bin");
    assert!(
        c.skipped[0].reason.contains("over the size limit"),
        "{:?}",
        c.skipped
    );
}

/// The person's repository is never recorded nor touched: a rewind leaves `.git` as it is
/// now, and works the same where there is no repository at all.
#[test]
fn a_rewind_never_touches_the_repository() {
    let fx = Fixture::new(Settings::default());
    std::fs::create_dir_all(fx.path(".git/refs")).expect(".git");
    std::fs::write(fx.path(".git/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    std::fs::create_dir_all(fx.path("sub/.git")).expect("nested .git");
    std::fs::write(fx.path("sub/.git/index"), "one").expect("index");
    std::fs::write(fx.path("a.txt"), "one").expect("a");
    fx.recorder.before_turn("s").expect("before");
    std::fs::write(fx.path(".git/HEAD"), "ref: refs/heads/other\n").expect("HEAD");
    std::fs::write(fx.path(".git/refs/new"), "x").expect("ref");
    std::fs::write(fx.path("sub/.git/index"), "two").expect("index");
    std::fs::write(fx.path("a.txt"), "two").expect("a");
    fx.recorder.after_turn().expect("after");
    let report = rewind(&fx.recorder, "s", &Target::Turn(1), false).expect("rewinds");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(std::fs::read_to_string(fx.path("a.txt")).expect("a"), "one");
    assert_eq!(
        std::fs::read_to_string(fx.path(".git/HEAD")).expect("HEAD"),
        "ref: refs/heads/other\n"
    );
    assert!(fx.path(".git/refs/new").exists());
    assert_eq!(
        std::fs::read_to_string(fx.path("sub/.git/index")).expect("index"),
        "two"
    );
    let manifest = fx
        .recorder
        .store()
        .manifest(&report.safety.manifest)
        .expect("manifest");
    assert!(
        manifest
            .entries
            .keys()
            .all(|p| !p.split('/').any(|c| c == ".git")),
        "{:?}",
        manifest.entries.keys()
    );
}

/// The incremental walk reuses a hash only when nothing about the file moved: a write that
/// keeps the size and puts the modification time back is still seen (its change time moved).
#[test]
fn a_write_that_keeps_size_and_mtime_is_still_recorded() {
    let fx = Fixture::new(Settings::default());
    let old = SystemTime::now() - Duration::from_secs(3600);
    std::fs::write(fx.path("f"), "aaaa").expect("f");
    let f = std::fs::File::options()
        .write(true)
        .open(fx.path("f"))
        .expect("open");
    f.set_modified(old).expect("mtime");
    drop(f);
    let c1 = fx.recorder.before_turn("s").expect("c1");
    std::fs::write(fx.path("f"), "bbbb").expect("rewrite");
    let f = std::fs::File::options()
        .write(true)
        .open(fx.path("f"))
        .expect("open");
    f.set_modified(old).expect("mtime back");
    drop(f);
    let c2 = fx.recorder.after_turn().expect("c2").expect("session");
    let store = fx.recorder.store();
    let hash = |c: &keel_checkpoints::Checkpoint| match store
        .manifest(&c.manifest)
        .expect("manifest")
        .entries
        .get("f")
    {
        Some(Node::File { hash, .. }) => hash.clone(),
        other => panic!("{other:?}"),
    };
    assert_ne!(hash(&c1), hash(&c2));
    assert_eq!(c2.changed, ["f"]);
    assert!(!c2.outside, "a turn's own change is not outside keel");
}

/// Between turns nothing of keel's runs: what changed then is recorded as changed outside keel
/// (never silently merged into the turn's work), and a rewind over it is refused by name.
#[test]
fn changes_between_turns_are_recorded_as_outside_keel() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("notes.txt"), "v1").expect("notes");
    fx.recorder.before_turn("s").expect("turn 1");
    std::fs::write(fx.path("made.txt"), "by the turn").expect("made");
    fx.recorder.after_turn().expect("after 1");
    std::fs::write(fx.path("notes.txt"), "v2 by the person").expect("person");
    let c = fx.recorder.before_turn("s").expect("turn 2");
    assert_eq!(c.kind, Kind::BeforeTurn);
    assert_eq!(c.turn, 2);
    assert!(c.outside);
    assert_eq!(c.changed, ["notes.txt"]);
    fx.recorder.after_turn().expect("after 2");
    let preview = prepare(&fx.recorder, "s", &Target::Turn(1)).expect("preview");
    assert_eq!(preview.conflicts, ["notes.txt"]);
    assert_eq!(preview.lines(), ["- made.txt", "~ notes.txt"]);
    let refused = rewind(&fx.recorder, "s", &Target::Turn(1), false).expect_err("refused");
    assert!(refused.0.contains("notes.txt"), "{refused}");
    assert_eq!(
        std::fs::read_to_string(fx.path("notes.txt")).expect("notes"),
        "v2 by the person"
    );
    // Two sessions in one workspace: the other's index is its own.
    assert!(
        fx.recorder
            .store()
            .index("other")
            .expect("index")
            .is_empty()
    );
}

/// Every path of `manifest` is the tree on disk, and the other way round: kinds, modes, link
/// targets and, through the store, every byte.
fn assert_manifest_is_the_tree(fx: &Fixture, manifest: &keel_checkpoints::Manifest) {
    let seen = crate::common::tree(&fx.workspace);
    let recorded: Vec<&String> = manifest.entries.keys().collect();
    assert_eq!(recorded, seen.keys().collect::<Vec<_>>());
    for (path, node) in &manifest.entries {
        match (node, &seen[path]) {
            (Node::File { mode, hash, .. }, Seen::File { mode: m, bytes }) => {
                assert_eq!(mode, m, "{path}");
                assert_eq!(
                    &fx.recorder.store().blob(hash).expect("blob"),
                    bytes,
                    "{path}"
                );
            }
            (Node::Dir { mode }, Seen::Dir { mode: m }) => assert_eq!(mode, m, "{path}"),
            (Node::Symlink { target }, Seen::Link { target: t }) => {
                assert_eq!(std::path::Path::new(target), t, "{path}");
            }
            (n, s) => panic!("{path}: recorded {n:?}, on disk {s:?}"),
        }
    }
}

/// A new session's first checkpoint starts from the workspace's newest one (another session's)
/// and reads only files whose stat moved: a rewrite that kept size and mtime (by keel's
/// process and by a child process), a rename within a directory and a chmod are all recorded.
#[test]
fn a_new_session_starts_from_the_last_checkpoint_and_misses_no_change() {
    let fx = Fixture::new(Settings::default());
    let old = SystemTime::now() - Duration::from_secs(3600);
    let set_old = |rel: &str| {
        std::fs::File::options()
            .write(true)
            .open(fx.path(rel))
            .expect("open")
            .set_modified(old)
            .expect("mtime");
    };
    std::fs::create_dir(fx.path("d")).expect("d");
    for (rel, text) in [("a", "one"), ("b", "bee"), ("c", "sea"), ("d/e", "eee")] {
        std::fs::write(fx.path(rel), text).expect("write");
        set_old(rel);
    }
    // A file's stat is trusted only when it changed over 2 s (`RACY_NS`) before the walk that
    // recorded it: let the files' change times (just now) age past that.
    std::thread::sleep(Duration::from_millis(2100));
    fx.recorder.before_turn("first").expect("first session");
    std::fs::write(fx.path("a"), "two").expect("rewrite");
    set_old("a");
    std::fs::set_permissions(fx.path("b"), std::fs::Permissions::from_mode(0o751)).expect("chmod");
    std::fs::rename(fx.path("d/e"), fx.path("d/f")).expect("rename");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf SEA > c && touch -r d c")
        .current_dir(&fx.workspace)
        .status()
        .expect("sh");
    assert!(status.success());
    set_old("c");
    let second = Recorder::new(
        Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("store"),
        Settings::default(),
    );
    let c = second.before_turn("second").expect("second session");
    let manifest = fx.recorder.store().manifest(&c.manifest).expect("manifest");
    assert_manifest_is_the_tree(&fx, &manifest);
    assert_eq!(
        std::fs::read(fx.path("a")).expect("a"),
        b"two",
        "the rewrite kept its size"
    );
    // Nothing is counted as changed in a session that has no checkpoint before.
    assert_eq!(c.changed_count, 0);
}

/// The first checkpoint of a workspace of many files reads them on several threads: the
/// manifest is exactly the tree, and a rewind after removing everything brings it back.
#[test]
fn a_large_first_checkpoint_read_in_parallel_is_exact() {
    let fx = Fixture::new(Settings::default());
    for i in 0..300u32 {
        let dir = format!("d{}", i % 7);
        std::fs::create_dir_all(fx.path(&dir)).expect("dir");
        let rel = format!("{dir}/f{i}");
        std::fs::write(fx.path(&rel), format!("{i}").repeat(i as usize % 50 + 1)).expect("file");
        std::fs::set_permissions(
            fx.path(&rel),
            std::fs::Permissions::from_mode(if i % 3 == 0 { 0o755 } else { 0o644 }),
        )
        .expect("mode");
    }
    std::os::unix::fs::symlink("d0/f0", fx.path("link")).expect("link");
    let want = crate::common::tree(&fx.workspace);
    let c = fx.recorder.before_turn("s").expect("checkpoint");
    assert_eq!(c.files, 300);
    let manifest = fx.recorder.store().manifest(&c.manifest).expect("manifest");
    assert_manifest_is_the_tree(&fx, &manifest);
    for i in 0..7 {
        std::fs::remove_dir_all(fx.path(&format!("d{i}"))).expect("rm");
    }
    fx.recorder.after_turn().expect("after");
    let report = rewind(&fx.recorder, "s", &Target::Turn(1), false).expect("rewind");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(crate::common::tree(&fx.workspace), want);
}

/// A workspace past the size from which walks run on several threads: the second walk (on
/// several threads, from the first's stats) finds exactly what changed, and a workspace over
/// `max_entries` is refused, not recorded in part.
#[test]
fn a_walk_on_several_threads_finds_every_change() {
    let fx = Fixture::new(Settings::default());
    for i in 0..2500u32 {
        let dir = format!("d{}", i % 25);
        std::fs::create_dir_all(fx.path(&dir)).expect("dir");
        std::fs::write(fx.path(&format!("{dir}/f{i}")), format!("file {i}")).expect("file");
    }
    let c1 = fx.recorder.before_turn("s").expect("first");
    assert_eq!(c1.files, 2500);
    std::fs::write(fx.path("d3/f3"), "changed").expect("change");
    std::fs::remove_file(fx.path("d4/f4")).expect("delete");
    std::fs::write(fx.path("d5/new"), "new").expect("add");
    std::fs::set_permissions(fx.path("d6/f6"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    std::fs::rename(fx.path("d7/f7"), fx.path("d7/moved")).expect("rename");
    let c2 = fx.recorder.after_turn().expect("second").expect("session");
    assert_eq!(
        c2.changed,
        ["d3/f3", "d4/f4", "d5/new", "d6/f6", "d7/f7", "d7/moved"]
    );
    let manifest = fx
        .recorder
        .store()
        .manifest(&c2.manifest)
        .expect("manifest");
    assert_manifest_is_the_tree(&fx, &manifest);
    let small = Fixture::new(Settings {
        max_entries: 2000,
        ..Settings::default()
    });
    for i in 0..2100u32 {
        std::fs::write(small.path(&format!("f{i}")), "x").expect("file");
    }
    let refused = small.recorder.before_turn("s").expect_err("too many");
    assert!(refused.0.contains("more than 2000"), "{refused}");
    assert!(small.recorder.store().index("s").expect("index").is_empty());
}

/// What the session may write outside the workspace is named by every checkpoint (as `keel
/// checkpoints list --json` shows it), since none records it.
#[test]
fn every_checkpoint_names_what_it_does_not_cover() {
    let fx = Fixture::new(Settings {
        not_covered: vec!["/srv/data (writable by the MCP server `files`)".into()],
        ..Settings::default()
    });
    std::fs::write(fx.path("a"), "a").expect("a");
    let c1 = fx.recorder.before_turn("s").expect("before");
    let c2 = fx.recorder.after_turn().expect("after").expect("session");
    for c in [c1, c2] {
        assert_eq!(
            c.not_covered,
            ["/srv/data (writable by the MCP server `files`)"]
        );
        let json = serde_json::to_value(&c).expect("json");
        assert_eq!(
            json["not_covered"][0],
            "/srv/data (writable by the MCP server `files`)"
        );
    }
    let index = fx.recorder.store().index("s").expect("index");
    assert!(index.iter().all(|c| c.not_covered.len() == 1));
}
