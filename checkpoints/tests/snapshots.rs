//! What a snapshot records and what it leaves alone.

use std::time::{Duration, SystemTime};

use keel_checkpoints::rewind::{Target, prepare, rewind};
use keel_checkpoints::{Kind, Node, Settings};

use crate::common::Fixture;

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
