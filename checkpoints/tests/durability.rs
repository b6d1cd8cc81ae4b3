//! Checkpoints before a tool call are written at once and made durable on another thread: what
//! a machine that stopped in between can leave — an index line naming a manifest or a content
//! that is missing or torn — is reported and refused, never restored wrong, and every other
//! checkpoint still restores exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_checkpoints::rewind::{Target, rewind};
use keel_checkpoints::{Node, Recorder, Retention, Settings, Store};

use crate::common::{Fixture, Seen, tree};

/// Where the store keeps an object in place.
fn object(store: &Store, kind: &str, hash: &str) -> PathBuf {
    store.root().join(kind).join(&hash[..2]).join(&hash[2..])
}

/// The content hash a checkpoint's manifest records for `path`.
fn content_hash(store: &Store, manifest: &str, path: &str) -> String {
    match store
        .manifest(manifest)
        .expect("manifest")
        .entries
        .get(path)
    {
        Some(Node::File { hash, .. }) => hash.clone(),
        other => panic!("{path} is {other:?}"),
    }
}

/// Calls that each changed a file, then a crash of the machine as it can leave the store:
/// one call's content torn in `pending/` (its line reached the disk, the content did not) and
/// the last call's manifest never written. The next keel process removes the torn content;
/// those two checkpoints are reported and a rewind to them is refused with the workspace
/// untouched; every other one restores exactly.
#[test]
fn checkpoints_a_crash_damaged_are_reported_and_the_others_restore_exactly() {
    let fx = Fixture::new(Settings::default());
    let store = fx.recorder.store();
    std::fs::write(fx.path("a.txt"), "a1").expect("a");
    std::fs::write(fx.path("b.txt"), "b1").expect("b");
    let mut seen: BTreeMap<String, BTreeMap<String, Seen>> = BTreeMap::new();
    let first = fx.recorder.before_turn("s").expect("c1");
    seen.insert(first.id.clone(), tree(&fx.workspace));
    let steps: [(&str, &str, &str); 4] = [
        ("a.txt", "a2", "k2"),
        ("b.txt", "b2", "k3"),
        ("b.txt", "b3", "k4"),
        ("a.txt", "a4", "k5"),
    ];
    let mut ids = BTreeMap::new();
    for (path, text, call) in steps {
        std::fs::write(fx.path(path), text).expect("write");
        let c = fx
            .recorder
            .before_call(call, "write_file")
            .expect("checkpoint")
            .expect("a session");
        seen.insert(c.id.clone(), tree(&fx.workspace));
        ids.insert(call, c);
    }
    store.sync().expect("sync");
    let index = store.index("s").expect("index");
    assert!(store.unrestorable(&index).is_empty());
    // What the crash left: b2's content in `pending/`, cut short; k5's manifest nowhere.
    let b2 = content_hash(store, &ids["k3"].manifest, "b.txt");
    let whole = std::fs::read(object(store, "blobs", &b2)).expect("blob");
    std::fs::create_dir_all(store.root().join("pending").join(&b2[..2])).expect("pending");
    std::fs::write(
        store
            .root()
            .join(format!("pending/{}/blobs-{b2}-4242-0-1", &b2[..2])),
        &whole[..whole.len() / 2],
    )
    .expect("tear");
    std::fs::remove_file(object(store, "blobs", &b2)).expect("not in place");
    std::fs::remove_file(object(store, "manifests", &ids["k5"].manifest)).expect("lose");
    // The next keel process opens the store.
    let next = Recorder::new(
        Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("open"),
        Settings::default(),
    );
    let store = next.store();
    let damaged = store.unrestorable(&index);
    assert_eq!(
        damaged.keys().collect::<Vec<_>>(),
        [&ids["k3"].id, &ids["k5"].id],
        "{damaged:?}"
    );
    assert!(damaged[&ids["k3"].id].contains("b.txt"), "{damaged:?}");
    assert!(
        damaged[&ids["k5"].id].contains(&ids["k5"].manifest)
            && damaged[&ids["k5"].id].contains("is missing"),
        "{damaged:?}"
    );

    for call in ["k3", "k5"] {
        let before = tree(&fx.workspace);
        let e = rewind(&next, "s", &Target::Call(call.into()), true)
            .expect_err("a damaged checkpoint is not restored");
        assert!(e.0.contains("cannot be restored"), "{e}");
        assert!(e.0.contains("keel checkpoints list s"), "{e}");
        assert_eq!(tree(&fx.workspace), before, "nothing changed");
    }
    for call in ["k2", "k4"] {
        let report = rewind(&next, "s", &Target::Call(call.into()), true).expect("rewinds");
        assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
        assert_eq!(tree(&fx.workspace), seen[&ids[call].id], "before {call}");
    }
    let report = rewind(&next, "s", &Target::Turn(1), true).expect("rewinds");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(tree(&fx.workspace), seen[&first.id]);

    // A content damaged in place (not something a crash leaves: it is synced before it is
    // moved there) is caught by its hash when a rewind reads it, before anything changes.
    let b3 = content_hash(store, &ids["k4"].manifest, "b.txt");
    let path = object(store, "blobs", &b3);
    let whole = std::fs::read(&path).expect("blob");
    std::fs::write(&path, vec![0u8; whole.len()]).expect("zeroes");
    let before = tree(&fx.workspace);
    let e = rewind(&next, "s", &Target::Call("k4".into()), true)
        .expect_err("damaged content is not restored");
    assert!(
        e.0.contains("cannot be restored") && e.0.contains(&b3),
        "{e}"
    );
    assert_eq!(tree(&fx.workspace), before, "nothing changed");
}

/// Objects a keel process left in `pending/` (it was killed, or the machine stopped, before
/// they were synced) are checked against their hash when the store is next opened: a whole
/// one is moved into place, a torn one removed, and the checkpoint naming it reported.
#[test]
fn what_a_stopped_process_left_pending_is_moved_into_place_or_removed() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("kept.txt"), "kept in the page cache").expect("kept");
    std::fs::write(fx.path("torn.txt"), "torn by the power going").expect("torn");
    let c = fx.recorder.before_turn("s").expect("checkpoint");
    let store = fx.recorder.store();
    store.sync().expect("sync");
    let kept = content_hash(store, &c.manifest, "kept.txt");
    let torn = content_hash(store, &c.manifest, "torn.txt");
    // Back to `pending/`, as a process that never synced them leaves them: one whole, one
    // cut short.
    let pending = |hash: &str| store.root().join("pending").join(&hash[..2]);
    std::fs::create_dir_all(pending(&kept)).expect("pending");
    std::fs::create_dir_all(pending(&torn)).expect("pending");
    let kept_pending = pending(&kept).join(format!("blobs-{kept}-4242-0-1"));
    std::fs::rename(object(store, "blobs", &kept), &kept_pending).expect("kept back");
    let torn_pending = pending(&torn).join(format!("blobs-{torn}-4242-0-2"));
    let whole = std::fs::read(object(store, "blobs", &torn)).expect("torn blob");
    std::fs::write(&torn_pending, &whole[..whole.len() - 3]).expect("torn back");
    std::fs::remove_file(object(store, "blobs", &torn)).expect("torn gone");
    // Still readable from `pending/` before anything moves it.
    assert_eq!(
        store.blob(&kept).expect("pending read"),
        b"kept in the page cache"
    );

    let reopened = Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("open");
    assert!(
        object(&reopened, "blobs", &kept).exists(),
        "moved into place"
    );
    assert!(!kept_pending.exists());
    assert!(!torn_pending.exists(), "a torn object is removed");
    assert!(!reopened.has_blob(&torn));
    let index = reopened.index("s").expect("index");
    let damaged = reopened.unrestorable(&index);
    assert_eq!(damaged.keys().collect::<Vec<_>>(), [&c.id], "{damaged:?}");
    assert!(damaged[&c.id].contains("torn.txt"), "{damaged:?}");
}

/// The next keel process does not carry a lost content forward: a file whose stat is
/// unchanged is read again when the checkpoint it would reuse the hash of names content that
/// is not stored, so its new checkpoint is whole (and, the content being the same, so is the
/// old one again).
#[test]
fn a_lost_content_is_stored_again_not_named_again() {
    let fx = Fixture::new(Settings::default());
    std::fs::write(fx.path("same.txt"), "unchanged since").expect("same");
    // A file's stat is trusted only when it changed over 2 s (`RACY_NS`) before the walk that
    // recorded it: let its change time (just now) age past that, so the next walk would
    // reuse its hash unread.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let c1 = fx.recorder.before_turn("s").expect("c1");
    let store = fx.recorder.store();
    store.sync().expect("sync");
    let hash = content_hash(store, &c1.manifest, "same.txt");
    std::fs::remove_file(object(store, "blobs", &hash)).expect("lost");

    let next = Recorder::new(
        Store::open(&fx.home.join("checkpoints"), &fx.workspace).expect("open"),
        Settings::default(),
    );
    let c2 = next.before_turn("s").expect("c2");
    assert_eq!(content_hash(next.store(), &c2.manifest, "same.txt"), hash);
    assert!(next.store().has_blob(&hash), "stored again");
    let index = next.store().index("s").expect("index");
    assert!(next.store().unrestorable(&index).is_empty());
}

/// A checkpoint that changed one file stores its manifest as the differences from the one
/// before; a collection that keeps only the last checkpoint keeps the manifests it is read
/// from, so it still restores exactly.
#[test]
fn a_collection_keeps_what_a_kept_manifest_is_read_from() {
    let fx = Fixture::new(Settings::default());
    for i in 0..40 {
        std::fs::write(fx.path(&format!("f{i:02}.txt")), format!("{i}")).expect("file");
    }
    fx.recorder.before_turn("s").expect("first");
    for i in 0..5 {
        std::fs::write(fx.path(&format!("f{i:02}.txt")), format!("changed {i}")).expect("w");
        fx.recorder
            .before_call(&format!("k{i}"), "write_file")
            .expect("checkpoint");
    }
    let last = fx.recorder.after_turn().expect("after").expect("a session");
    let expected = tree(&fx.workspace);
    let store = fx.recorder.store();
    let stored = |m: &str| {
        std::fs::read(object(store, "manifests", m))
            .map(|packed| zstd::stream::decode_all(&packed[..]).expect("unpack"))
            .expect("in place")
    };
    let json: serde_json::Value = serde_json::from_slice(&stored(&last.manifest)).expect("json");
    assert_eq!(json["version"], 2, "stored as differences");
    assert_eq!(json["entries"].as_object().map(|e| e.len()), Some(1));

    let collected = store
        .collect_garbage(&Retention {
            per_session: 1,
            ..Retention::default()
        })
        .expect("gc");
    assert_eq!(collected.checkpoints, 6, "{collected:?}");
    assert!(collected.objects > 0, "{collected:?}");
    let index = store.index("s").expect("index");
    assert_eq!(index.len(), 1);
    assert!(store.unrestorable(&index).is_empty());
    for i in 0..5 {
        std::fs::write(fx.path(&format!("f{i:02}.txt")), "later").expect("later");
    }
    let report = rewind(
        &fx.recorder,
        "s",
        &Target::Checkpoint(last.id.clone()),
        true,
    )
    .expect("rewinds");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(tree(&fx.workspace), expected);
}
