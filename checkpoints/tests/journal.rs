//! The change journal's proof: a checkpoint that looked only at what the journal named
//! records exactly the manifest a walk of everything records, after any sequence of file
//! operations (made directly and by shell commands, in new and moved directories too); and
//! when the journal cannot vouch (its queue overflowed, a directory could not be watched,
//! what git ignores changed), the checkpoint walks everything and says so.

use std::os::unix::fs::PermissionsExt;

use keel_checkpoints::snapshot::snapshot;
use keel_checkpoints::{Checkpoint, Manifest, Recorder, Settings, Store};
use proptest::prelude::*;

use crate::common::Fixture;
use crate::rewind_properties::{Op, apply, op};

/// The manifest `checkpoint` recorded, and the one a walk of everything (reading every file)
/// records of the tree as it is now.
fn recorded_and_walked(fx: &Fixture, checkpoint: &Checkpoint) -> (Manifest, Manifest) {
    let store = fx.recorder.store();
    let recorded = store
        .manifest(&checkpoint.manifest)
        .expect("recorded manifest");
    let walked =
        snapshot(store, &fx.workspace, fx.recorder.settings(), None).expect("walk of everything");
    (recorded, walked)
}

fn walk_note(c: &Checkpoint) -> &str {
    c.walk.as_deref().unwrap_or("")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_journal_records_what_a_walk_of_everything_records(
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let fx = Fixture::new(Settings::default());
        // Something git ignores, so the narrowed walks must apply the same rules.
        std::fs::write(fx.path(".gitignore"), "f2\nb/\n").expect("gitignore");
        let first = fx.recorder.before_turn("prop").expect("first checkpoint");
        prop_assert!(walk_note(&first).starts_with("everything:"), "{:?}", first.walk);
        for op in ops.iter().chain([&Op::Checkpoint]) {
            if !matches!(op, Op::Checkpoint) {
                apply(&fx, op);
                continue;
            }
            let c = fx.recorder.before_call("call", "tool").expect("checkpoint").expect("session");
            prop_assert!(walk_note(&c).starts_with("journal:"), "{:?}", c.walk);
            let (recorded, walked) = recorded_and_walked(&fx, &c);
            prop_assert_eq!(&recorded.entries, &walked.entries, "after {:?}", ops);
            prop_assert_eq!(&recorded.skipped, &walked.skipped);
        }
    }
}

/// A checkpoint with nothing changed since the last names the same manifest, through the
/// journal; one after a change looks only at the changed path.
#[test]
fn a_call_that_changed_nothing_names_the_last_manifest() {
    let fx = Fixture::new(Settings::default());
    for d in 0..5 {
        std::fs::create_dir(fx.path(&format!("d{d}"))).expect("dir");
        for f in 0..5 {
            std::fs::write(fx.path(&format!("d{d}/f{f}")), format!("{d}{f}")).expect("file");
        }
    }
    let first = fx.recorder.before_turn("s").expect("first");
    let same = fx
        .recorder
        .before_call("c1", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&same), "journal: nothing changed");
    assert_eq!(same.manifest, first.manifest);
    std::fs::write(fx.path("d3/f1"), "changed").expect("write");
    std::fs::create_dir_all(fx.path("new/deeper")).expect("new dirs");
    std::fs::write(fx.path("new/deeper/g"), "g").expect("new file");
    let after = fx
        .recorder
        .before_call("c2", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&after), "journal: 2 paths looked at");
    assert_eq!(
        after.changed,
        ["d3/f1", "new", "new/deeper", "new/deeper/g"]
    );
    // A file in the new directory, written after it was walked: its watch reports it.
    std::fs::write(fx.path("new/deeper/g"), "again").expect("rewrite");
    let again = fx
        .recorder
        .before_call("c3", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&again), "journal: 1 paths looked at");
    assert_eq!(again.changed, ["new/deeper/g"]);
    let (recorded, walked) = recorded_and_walked(&fx, &again);
    assert_eq!(recorded.entries, walked.entries);
}

/// More events than the kernel queues: the overflow is seen, the checkpoint walks
/// everything (and records it exactly), and the next one uses the journal again.
#[test]
fn an_overflowed_queue_falls_back_to_a_walk_of_everything() {
    let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .expect("max_queued_events")
        .trim()
        .parse()
        .expect("a number");
    assert!(
        max <= 1 << 20,
        "fs.inotify.max_queued_events is {max}: too many events to overflow in a test"
    );
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("a"), "a").expect("a");
    std::fs::write(fx.path("b"), "b").expect("b");
    fx.recorder.before_turn("s").expect("first");
    let warm = fx
        .recorder
        .before_call("c1", "t")
        .expect("call")
        .expect("session");
    assert!(walk_note(&warm).starts_with("journal:"), "{:?}", warm.walk);
    // Alternating files, so no event merges with the one before it.
    for i in 0..=max {
        let name = if i % 2 == 0 { "a" } else { "b" };
        std::fs::write(fx.path(name), i.to_string()).expect("write");
    }
    let overflowed = fx
        .recorder
        .before_call("c2", "t")
        .expect("call")
        .expect("session");
    assert_eq!(
        walk_note(&overflowed),
        "everything: the change queue overflowed"
    );
    let (recorded, walked) = recorded_and_walked(&fx, &overflowed);
    assert_eq!(recorded.entries, walked.entries);
    std::fs::write(fx.path("a"), "after").expect("write");
    let next = fx
        .recorder
        .before_call("c3", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&next), "journal: 1 paths looked at");
    assert_eq!(next.changed, ["a"]);
}

/// A directory the journal may not watch (here: more directories than its limit): it turns
/// itself off, and every checkpoint walks everything, exactly.
#[test]
fn a_missing_watch_turns_the_journal_off() {
    let fx = Fixture::new(Settings::default());
    let store = Store::open(&fx.home.join("limited"), &fx.workspace).expect("store");
    let recorder = Recorder::new(store, Settings::default()).with_max_watched_dirs(2);
    for d in ["x", "y", "x/z"] {
        std::fs::create_dir(fx.path(d)).expect("dir");
    }
    std::fs::write(fx.path("x/z/f"), "f").expect("file");
    recorder.before_turn("s").expect("first");
    std::fs::write(fx.path("x/z/f"), "changed").expect("write");
    let c = recorder
        .before_call("c1", "t")
        .expect("call")
        .expect("session");
    assert!(
        walk_note(&c).starts_with("everything: no change journal: the workspace has more than 2"),
        "{:?}",
        c.walk
    );
    assert_eq!(c.changed, ["x/z/f"]);
    let recorded = recorder.store().manifest(&c.manifest).expect("manifest");
    let walked =
        snapshot(recorder.store(), &fx.workspace, recorder.settings(), None).expect("walk");
    assert_eq!(recorded.entries, walked.entries);
}

/// What git ignores changing changes what is recorded of paths nobody touched: a
/// `.gitignore` or a repository's `info/exclude` written makes the checkpoint walk
/// everything.
#[test]
fn changed_ignore_rules_make_a_walk_of_everything() {
    let fx = Fixture::new(Settings::default());
    std::fs::create_dir_all(fx.path(".git/info")).expect("git dir");
    std::fs::write(fx.path("old.txt"), "old").expect("old");
    std::fs::write(fx.path("kept.txt"), "kept").expect("kept");
    fx.recorder.before_turn("s").expect("first");
    fx.recorder
        .before_call("c1", "t")
        .expect("call")
        .expect("session");

    // What the session recorded stays recorded (old.txt); the new rules apply to the rest
    // (new.txt, made since, is left out).
    std::fs::write(fx.path(".git/info/exclude"), "old.txt\nnew.txt\n").expect("exclude");
    std::fs::write(fx.path("new.txt"), "new").expect("new");
    let c = fx
        .recorder
        .before_call("c2", "t")
        .expect("call")
        .expect("session");
    assert!(
        walk_note(&c).starts_with("everything: a repository's `info/exclude`"),
        "{:?}",
        c.walk
    );
    assert!(c.changed.is_empty(), "{:?}", c.changed);
    let previous = fx.recorder.store().manifest(&c.manifest).expect("manifest");
    assert!(previous.entries.contains_key("old.txt"));

    std::fs::write(fx.path(".gitignore"), "kept.txt\nlater.txt\n").expect("gitignore");
    std::fs::write(fx.path("later.txt"), "later").expect("later");
    let c = fx
        .recorder
        .before_call("c3", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&c), "everything: a `.gitignore` changed");
    assert_eq!(c.changed, [".gitignore"]);
    let (recorded, walked) = recorded_and_walked(&fx, &c);
    let covering = keel_checkpoints::snapshot::snapshot_covering(
        fx.recorder.store(),
        &fx.workspace,
        fx.recorder.settings(),
        None,
        Some(&previous),
    )
    .expect("walk of everything, covering what was recorded");
    assert_eq!(recorded.entries, covering.entries);
    let left_out: Vec<&String> = recorded
        .entries
        .keys()
        .filter(|p| !walked.entries.contains_key(*p))
        .collect();
    assert_eq!(left_out, ["kept.txt", "old.txt"]);

    // A mode change of a directory is an event of the directory's own.
    std::fs::create_dir(fx.path("d")).expect("d");
    fx.recorder
        .before_call("c4", "t")
        .expect("call")
        .expect("session");
    std::fs::set_permissions(fx.path("d"), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let c = fx
        .recorder
        .before_call("c5", "t")
        .expect("call")
        .expect("session");
    assert_eq!(c.changed, ["d"]);
    assert!(walk_note(&c).starts_with("journal:"), "{:?}", c.walk);
}

/// A file with a second name outside the workspace changes through that name without an
/// event in the workspace: a file with more than one link is stat-ed at every checkpoint.
#[test]
fn a_file_linked_from_outside_is_looked_at_every_time() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("shared.txt"), "one").expect("file");
    let other_name = fx.outside().join("other-name.txt");
    std::fs::hard_link(fx.path("shared.txt"), &other_name).expect("hard link");
    fx.recorder.before_turn("s").expect("first");
    fx.recorder
        .before_call("c1", "t")
        .expect("call")
        .expect("session");
    std::fs::write(&other_name, "changed through the other name").expect("write");
    let c = fx
        .recorder
        .before_call("c2", "t")
        .expect("call")
        .expect("session");
    assert_eq!(walk_note(&c), "journal: 1 paths looked at");
    assert_eq!(c.changed, ["shared.txt"]);
    let (recorded, walked) = recorded_and_walked(&fx, &c);
    assert_eq!(recorded.entries, walked.entries);
}
