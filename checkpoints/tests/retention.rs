//! Retention: old checkpoints dropped, content nothing names any more deleted, the rest
//! still restorable.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keel_checkpoints::rewind::{Target, rewind};
use keel_checkpoints::{Collected, Node, Recorder, Retention, Settings, Store};

use crate::common::{Fixture, tree};

fn blob_of(fx: &Fixture, manifest: &str, path: &str) -> String {
    match fx
        .recorder
        .store()
        .manifest(manifest)
        .expect("manifest")
        .entries
        .get(path)
    {
        Some(Node::File { hash, .. }) => hash.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn collection_keeps_what_kept_checkpoints_name_and_deletes_the_rest() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("f"), "first version").expect("f");
    std::fs::write(fx.path("g"), "unchanged").expect("g");
    let c1 = fx.recorder.before_turn("s").expect("c1");
    std::fs::write(fx.path("f"), "second version").expect("f");
    let c2 = fx.recorder.after_turn().expect("c2").expect("session");
    std::fs::write(fx.path("f"), "third version").expect("f");
    let c3 = fx.recorder.before_turn("s").expect("c3");
    let want = tree(&fx.workspace);
    let store = fx.recorder.store();
    let (old, mid, new) = (
        blob_of(&fx, &c1.manifest, "f"),
        blob_of(&fx, &c2.manifest, "f"),
        blob_of(&fx, &c3.manifest, "f"),
    );
    let kept = blob_of(&fx, &c1.manifest, "g");
    // Inside a grace period nothing is deleted, whatever the retention.
    let none = store
        .collect_garbage(&Retention {
            per_session: 2,
            grace: Duration::from_secs(3600),
            ..Retention::default()
        })
        .expect("gc");
    assert_eq!((none.checkpoints, none.objects), (1, 0), "{none:?}");
    assert!(store.has_blob(&old));
    let done = store
        .collect_garbage(&Retention {
            per_session: 2,
            grace: Duration::ZERO,
            ..Retention::default()
        })
        .expect("gc");
    // c1's version of f went; c2 and c3 and what they name stayed, c1's manifest too: c2's
    // is stored as the differences from it.
    assert_eq!(done.objects, 1, "{done:?}");
    assert!(!store.has_blob(&old));
    assert!(store.has_blob(&mid) && store.has_blob(&new) && store.has_blob(&kept));
    let ids: Vec<String> = store
        .index("s")
        .expect("index")
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["c2", "c3"]);
    // A session's last checkpoint stays, whatever the count.
    let last = store
        .collect_garbage(&Retention {
            per_session: 0,
            ..Retention::default()
        })
        .expect("gc");
    assert_eq!(last.checkpoints, 1, "{last:?}");
    assert_eq!(store.index("s").expect("index").len(), 1);
    std::fs::write(fx.path("f"), "changed by the turn").expect("f");
    fx.recorder.after_turn().expect("after").expect("session");
    let report =
        rewind(&fx.recorder, "s", &Target::Checkpoint("c3".into()), false).expect("rewind");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(tree(&fx.workspace), want);
}

/// Bytes no compressor shrinks, different for every `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The bytes of every stored object (blobs and manifests) of the store at `root`.
fn stored_bytes(root: &Path) -> u64 {
    let mut total = 0;
    for kind in ["blobs", "manifests"] {
        for fan in std::fs::read_dir(root.join(kind)).expect("fans") {
            for object in std::fs::read_dir(fan.expect("fan").path()).expect("objects") {
                total += object.expect("object").metadata().expect("stat").len();
            }
        }
    }
    total
}

/// Every checkpoint in `store`'s indexes has its manifest and every content it names, each
/// checked against its hash: each can be restored.
fn every_kept_checkpoint_is_whole(store: &Store) -> usize {
    let mut checked = std::collections::BTreeSet::new();
    let mut n = 0;
    for session in store.sessions().expect("sessions") {
        for c in store.index(&session).expect("index") {
            n += 1;
            if !checked.insert(c.manifest.clone()) {
                continue;
            }
            let manifest = store
                .manifest(&c.manifest)
                .unwrap_or_else(|e| panic!("{session} {}: {e}", c.id));
            for node in manifest.entries.values() {
                if let Node::File { hash, .. } = node
                    && checked.insert(hash.clone())
                {
                    store
                        .blob(hash)
                        .unwrap_or_else(|e| panic!("{session} {}: {e}", c.id));
                }
            }
        }
    }
    n
}

/// Past `max_total_bytes` the oldest checkpoints of any session go until the rest fit; each
/// session's last one stays, and what is kept still restores.
#[test]
fn the_total_bytes_bound_is_held() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    // Another session's only checkpoint, older than all the rest: it stays.
    std::fs::write(fx.path("shared.bin"), noise(0, 20_000)).expect("shared");
    let other = fx.recorder.before_turn("other").expect("other");
    let fx2_recorder = Recorder::new(
        Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("store"),
        Settings::default(),
    );
    for round in 1..=10u64 {
        for f in 0..5u64 {
            std::fs::write(fx.path(&format!("f{f}")), noise(round * 10 + f, 20_000))
                .expect("write");
        }
        fx2_recorder.before_turn("s").expect("checkpoint");
    }
    let want = tree(&fx.workspace);
    let before = stored_bytes(store.root());
    assert!(before > 1_000_000, "{before}");
    let bound = 300_000;
    let done = store
        .collect_garbage(&Retention {
            max_total_bytes: bound,
            ..Retention::default()
        })
        .expect("gc");
    let after = stored_bytes(store.root());
    assert!(
        after <= bound,
        "{after} stored bytes, over the bound of {bound}: {done:?}"
    );
    assert_eq!(after, done.kept_bytes);
    assert_eq!(done.over_by, 0);
    assert_eq!(before - after, done.bytes);
    // The newest checkpoints that fit (two rounds of five new files each), the oldest gone.
    let ids: Vec<String> = store
        .index("s")
        .expect("index")
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["c9", "c10"], "{done:?}");
    assert_eq!(store.index("other").expect("other"), [other]);
    assert_eq!(every_kept_checkpoint_is_whole(store), 3);
    // Rewound to the oldest kept state and back: byte for byte.
    // Forced: the files changed between turns, outside keel.
    let report =
        rewind(&fx2_recorder, "s", &Target::Checkpoint("c9".into()), true).expect("rewind");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(std::fs::read(fx.path("f0")).expect("f0"), noise(90, 20_000));
    let back = rewind(
        &fx2_recorder,
        "s",
        &Target::Checkpoint(report.safety.id),
        false,
    )
    .expect("undo");
    assert!(back.applied.failed.is_empty(), "{:?}", back.applied);
    assert_eq!(tree(&fx.workspace), want);
    // A bound the sessions' last checkpoints alone exceed: they stay, and it is said.
    let tight = store
        .collect_garbage(&Retention {
            max_total_bytes: 1000,
            ..Retention::default()
        })
        .expect("gc");
    assert!(tight.over_by > 0, "{tight:?}");
    assert_eq!(every_kept_checkpoint_is_whole(store), 2);
}

/// A collection due neither by age, count nor bytes reads no manifest and deletes nothing;
/// one that is due runs.
#[test]
fn the_automatic_collection_runs_only_when_due() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    for round in 0..3u64 {
        std::fs::write(fx.path("f"), noise(round, 5000)).expect("f");
        fx.recorder.before_turn("s").expect("checkpoint");
    }
    let roomy = Retention::default();
    assert_eq!(
        store.collect_garbage_automatically(&roomy).expect("gc"),
        Some(Collected::default())
    );
    assert_eq!(store.index("s").expect("index").len(), 3);
    let by_count = store
        .collect_garbage_automatically(&Retention {
            per_session: 2,
            ..Retention::default()
        })
        .expect("gc")
        .expect("ran");
    // The first checkpoint's content of f; its manifest stays, the next one's being stored
    // as the differences from it.
    assert_eq!(
        (by_count.checkpoints, by_count.objects),
        (1, 1),
        "{by_count:?}"
    );
    let by_bytes = store
        .collect_garbage_automatically(&Retention {
            max_total_bytes: 6000,
            ..Retention::default()
        })
        .expect("gc")
        .expect("ran");
    assert_eq!(by_bytes.checkpoints, 1, "{by_bytes:?}");
    assert_eq!(every_kept_checkpoint_is_whole(store), 1);
}

/// A recorder made to collect at its session's end does when it goes, and skips it, without
/// waiting, when another keel process is recording in the store.
#[test]
fn a_session_collects_when_it_ends_unless_the_store_is_busy() {
    let fx = Fixture::new(Settings::default());
    let two = Retention {
        per_session: 2,
        ..Retention::default()
    };
    let session = |name: &str| {
        let store = Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("store");
        let recorder = Recorder::new(store, Settings::default()).collect_at_end(two.clone());
        for round in 0..4u64 {
            std::fs::write(fx.path("f"), noise(round, 3000)).expect("f");
            recorder.before_turn(name).expect("checkpoint");
        }
        recorder
    };
    let store = fx.recorder.store();

    // Another process records (holds the store busy) as the session ends: nothing collected,
    // and the end does not wait for it.
    let busy = store.busy().expect("busy");
    let ended = std::time::Instant::now();
    drop(session("busy"));
    assert!(
        ended.elapsed() < std::time::Duration::from_secs(1),
        "the end waited {:?} for the store",
        ended.elapsed()
    );
    assert_eq!(store.index("busy").expect("index").len(), 4);
    drop(busy);

    drop(session("idle"));
    assert_eq!(store.index("idle").expect("index").len(), 2);
    assert_eq!(store.index("busy").expect("index").len(), 2);
    assert_eq!(every_kept_checkpoint_is_whole(store), 4);
}

/// The environment variable that has this test binary, run again as a child, play a role in
/// a test of two processes; [`child_process`] does nothing without it.
const CHILD_ROLE: &str = "KEEL_CHECKPOINTS_TEST_CHILD";

/// Run `role` in a child process of this test binary, on the store of `workspace` in `home`.
fn spawn_child(role: &str, home: &Path, workspace: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "retention::child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, role)
        .env("KEEL_TEST_HOME", home)
        .env("KEEL_TEST_WORKSPACE", workspace)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("child")
}

/// The child's side: `record` takes a checkpoint after each of 150 file changes; `gc` says
/// `collecting`, collects keeping one checkpoint per session, and says how long it took.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    let home = PathBuf::from(std::env::var("KEEL_TEST_HOME").expect("home"));
    let workspace = PathBuf::from(std::env::var("KEEL_TEST_WORKSPACE").expect("workspace"));
    let store = Store::open(&home.join("checkpoints"), &workspace).expect("store");
    match role.as_str() {
        "record" => {
            let recorder = Recorder::new(store, Settings::default());
            recorder.before_turn("racer").expect("first");
            for i in 0..150u64 {
                std::fs::write(workspace.join(format!("f{}", i % 7)), noise(1000 + i, 3000))
                    .expect("write");
                recorder
                    .before_call(&format!("call-{i}"), "exec_shell")
                    .expect("checkpoint")
                    .expect("in a session");
            }
        }
        "gc" => {
            println!("collecting");
            let started = Instant::now();
            store
                .collect_garbage(&Retention {
                    per_session: 1,
                    ..Retention::default()
                })
                .expect("gc");
            println!("took {}", started.elapsed().as_micros());
        }
        other => panic!("no role {other}"),
    }
}

/// The lines a child writes to its stdout, as they come.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// What follows `prefix` in a line from `lines` of `child` (the test harness may have begun
/// the line), waiting at most 60 s.
fn wait_for(
    child: &mut std::process::Child,
    lines: &mpsc::Receiver<String>,
    prefix: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(prefix) => {
                return line
                    .split_once(prefix)
                    .map(|(_, rest)| rest.to_owned())
                    .unwrap_or_default();
            }
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "no `{prefix}` from the child ({e}; {:?}) after {seen:?}",
                    child.wait()
                )
            }
        }
    }
}

/// Collections in this process while another records checkpoint after checkpoint: every
/// append succeeds, and every checkpoint left in the index has all it names.
#[test]
fn a_collection_racing_recordings_in_another_process_loses_nothing() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    let mut child = spawn_child("record", &fx.home, &fx.workspace);
    let mut collections = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("child") {
            break status;
        }
        store
            .collect_garbage(&Retention {
                per_session: 2,
                max_total_bytes: 20_000,
                ..Retention::default()
            })
            .expect("gc");
        collections += 1;
        every_kept_checkpoint_is_whole(store);
    };
    assert!(status.success(), "the recording child failed: {status:?}");
    assert!(collections > 10, "only {collections} collections ran");
    let last = store.last("racer").expect("last").expect("a checkpoint");
    assert_eq!(last.seq, 151);
    every_kept_checkpoint_is_whole(store);
    // The last checkpoint is the workspace as the child left it.
    let manifest = store.manifest(&last.manifest).expect("manifest");
    for f in 0..7 {
        let Some(Node::File { hash, .. }) = manifest.entries.get(&format!("f{f}")) else {
            panic!("f{f} not recorded");
        };
        assert_eq!(
            store.blob(hash).expect("blob"),
            std::fs::read(fx.path(&format!("f{f}"))).expect("file")
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for entry in std::fs::read_dir(from).expect("read") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A collection killed (SIGKILL) at points spread over its run: every checkpoint left in the
/// indexes still has all it names, and a collection run after it finishes the work.
#[test]
fn a_collection_killed_at_any_point_leaves_every_kept_checkpoint_whole() {
    let fx = Fixture::new(Settings::default());
    // Two sessions, twenty checkpoints, 100 new files each: two thousand objects to delete.
    for (n, session) in ["a", "b"].iter().enumerate() {
        let recorder = Recorder::new(
            Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("store"),
            Settings::default(),
        );
        for round in 0..10u64 {
            for f in 0..100u64 {
                std::fs::write(
                    fx.path(&format!("f{f:03}")),
                    noise((n as u64 * 100 + round) * 100 + f, 200),
                )
                .expect("write");
            }
            recorder.before_turn(session).expect("checkpoint");
        }
    }
    let pristine = fx.home.join("pristine");
    copy_tree(&fx.home.join("checkpoints"), &pristine);
    let run_home = fx.home.join("run");
    let fresh = || {
        let _ = std::fs::remove_dir_all(&run_home);
        copy_tree(&pristine, &run_home.join("checkpoints"));
        Store::open(&run_home.join("checkpoints"), &fx.workspace).expect("store")
    };
    // One whole run, for how long a collection takes.
    let store = fresh();
    let objects_before = stored_bytes(store.root());
    let mut child = spawn_child("gc", &run_home, &fx.workspace);
    let lines = lines_of(&mut child);
    let took: u64 = wait_for(&mut child, &lines, "took ")
        .parse()
        .expect("micros");
    assert!(child.wait().expect("gc").success());
    let collected = stored_bytes(store.root());
    assert!(
        collected < objects_before / 5,
        "{collected} of {objects_before}"
    );
    let mut cut_short = 0;
    for round in 0..16u64 {
        let store = fresh();
        let mut child = spawn_child("gc", &run_home, &fx.workspace);
        let lines = lines_of(&mut child);
        wait_for(&mut child, &lines, "collecting");
        std::thread::sleep(Duration::from_micros(took * round / 12));
        child.kill().expect("kill");
        child.wait().expect("reaped");
        let left = stored_bytes(store.root());
        if left > collected && left < objects_before {
            cut_short += 1;
        }
        let kept = every_kept_checkpoint_is_whole(&store);
        assert!(kept >= 2, "round {round}: {kept} checkpoints");
        // Finishing it leaves what an uninterrupted collection does.
        store
            .collect_garbage(&Retention {
                per_session: 1,
                ..Retention::default()
            })
            .expect("gc");
        assert_eq!(stored_bytes(store.root()), collected, "round {round}");
        assert_eq!(every_kept_checkpoint_is_whole(&store), 2);
    }
    assert!(
        cut_short > 0,
        "no kill landed while objects were being deleted"
    );
}

/// Age drops a session's last checkpoint too (one-shot runs each leave a session whose last
/// checkpoint no count bound ever drops): its stored content goes, and its index keeps one
/// line naming no manifest, so a resumed session numbers its turns where it stood and a
/// rewind to it is refused by name. A recent session is kept whole.
#[test]
fn age_drops_a_sessions_last_checkpoint_and_keeps_its_turn_count() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("f"), noise(1, 4096)).expect("f");
    fx.recorder.before_turn("old").expect("old 1");
    std::fs::write(fx.path("f"), noise(2, 4096)).expect("f");
    let old_last = fx.recorder.before_turn("old").expect("old 2");
    let old_blob = blob_of(&fx, &old_last.manifest, "f");
    // Made old: every line of its index 40 days back.
    let store = fx.recorder.store();
    let index_path = store.root().join("sessions/old.jsonl");
    let aged: String = std::fs::read_to_string(&index_path)
        .expect("index")
        .lines()
        .map(|line| {
            let mut c: serde_json::Value = serde_json::from_str(line).expect("line");
            c["time_ms"] = (c["time_ms"].as_u64().expect("time") - 40 * 24 * 3600 * 1000).into();
            format!("{c}\n")
        })
        .collect();
    std::fs::write(&index_path, aged).expect("age the index");
    std::fs::write(fx.path("f"), noise(3, 4096)).expect("f");
    let recent = fx.recorder.before_turn("new").expect("new 1");

    let done = store
        .collect_garbage_automatically(&Retention::default())
        .expect("gc")
        .expect("not busy");
    assert_eq!(done.checkpoints, 2, "{done:?}");
    assert!(
        !store.has_blob(&old_blob),
        "the old session's content stayed"
    );
    let old = store.index("old").expect("index");
    assert_eq!(old.len(), 1, "{old:?}");
    assert!(old[0].is_dropped(), "{old:?}");
    assert_eq!(old[0].turn, 2);
    assert!(store.unrestorable(&old).is_empty());
    let refused = rewind(&fx.recorder, "old", &Target::Turn(2), false).expect_err("refused");
    assert!(
        refused
            .0
            .contains("has no checkpoint before turn 2 any more"),
        "{refused}"
    );
    assert_eq!(store.index("new").expect("index"), [recent]);
    // Nothing more is due; the line that stands for the old session stays as it is.
    let again = store
        .collect_garbage_automatically(&Retention::default())
        .expect("gc")
        .expect("not busy");
    assert_eq!(again, keel_checkpoints::Collected::default());
    assert_eq!(store.index("old").expect("index"), old);
    // Resumed, the old session goes on from turn 3.
    let resumed = fx.recorder.before_turn("old").expect("old 3");
    assert_eq!(resumed.turn, 3);
}
