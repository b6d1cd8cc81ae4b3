//! Retention: old checkpoints dropped, content nothing names any more deleted, the rest
//! still restorable.

use std::time::Duration;

use keel_checkpoints::rewind::{Target, rewind};
use keel_checkpoints::{Node, Retention, Settings};

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
    // Inside the grace period nothing is deleted, whatever the retention.
    let none = store
        .collect_garbage(&Retention {
            per_session: 2,
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
    // c1's manifest and its version of f went; c2 and c3 and what they name stayed.
    assert_eq!(done.objects, 2, "{done:?}");
    assert!(!store.has_blob(&old));
    assert!(store.has_blob(&mid) && store.has_blob(&new) && store.has_blob(&kept));
    let ids: Vec<String> = store
        .index("s")
        .expect("index")
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["c2", "c3"]);
    // A session's last checkpoint stays, however old.
    let last = store
        .collect_garbage(&Retention {
            max_age: Duration::ZERO,
            per_session: 0,
            grace: Duration::ZERO,
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
