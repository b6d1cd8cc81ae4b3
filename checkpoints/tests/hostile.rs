//! A workspace that fights back: links planted where directories were, paths that leave the
//! workspace, changes made outside keel.

use keel_checkpoints::restore::{self, Change, Plan};
use keel_checkpoints::rewind::{Target, rewind};
use keel_checkpoints::{Manifest, Node, Settings};

use crate::common::{Fixture, Seen, tree};

/// A restore writes only through directories it opened without following a link: with `src`
/// a link out of the workspace, writing `src/a.txt` is refused and nothing appears outside.
#[test]
fn a_restore_never_writes_through_a_linked_parent() {
    let fx = Fixture::new(Settings::default());
    let outside = fx.outside();
    std::os::unix::fs::symlink(&outside, fx.path("src")).expect("plant the link");
    let content = b"restored\n";
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(content))
    };
    fx.recorder
        .store()
        .put_blob(&hash, content)
        .expect("store the content");
    let plan = Plan {
        changes: vec![
            Change::Write {
                path: "src/a.txt".into(),
                hash,
                mode: 0o644,
            },
            Change::DirMode {
                path: "src".into(),
                mode: 0o700,
            },
            Change::MakeDir("src/sub".into()),
        ],
    };
    let applied = restore::apply(fx.recorder.store(), &fx.workspace, &plan).expect("applies");
    assert_eq!(applied.done, 0, "{applied:?}");
    assert_eq!(applied.failed.len(), 3, "{applied:?}");
    assert!(
        applied
            .failed
            .iter()
            .all(|f| f.contains("never follows a link")),
        "{applied:?}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).expect("outside").count(),
        0,
        "the restore wrote outside the workspace"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_ne!(
        std::fs::metadata(&outside)
            .expect("outside")
            .permissions()
            .mode()
            & 0o777,
        0o700,
        "the restore changed the mode of a directory outside the workspace"
    );
}

/// A manifest naming a path that leaves the workspace is refused whole.
#[test]
fn a_checkpoint_naming_a_path_outside_the_workspace_is_refused() {
    for bad in ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", ""] {
        let mut target = Manifest::default();
        target
            .entries
            .insert(bad.to_owned(), Node::Dir { mode: 0o755 });
        let err = restore::plan(&Manifest::default(), &target).expect_err(bad);
        assert!(
            err.0.contains("not a path inside the workspace"),
            "{bad}: {err}"
        );
    }
}

/// A turn replaced `src` by a link out of the workspace (a command did, so keel recorded it):
/// the rewind removes the link itself and brings the directory back; what the link points at
/// is untouched.
#[test]
fn a_link_a_turn_made_is_removed_not_followed() {
    let fx = Fixture::new(Settings::default());
    let outside = fx.outside();
    std::fs::write(outside.join("keep.txt"), "theirs").expect("outside file");
    std::fs::create_dir(fx.path("src")).expect("src");
    std::fs::write(fx.path("src/keep.txt"), "ours").expect("file");
    let want = tree(&fx.workspace);
    fx.recorder.before_turn("s").expect("before");
    std::fs::remove_dir_all(fx.path("src")).expect("rm");
    std::os::unix::fs::symlink(&outside, fx.path("src")).expect("link");
    fx.recorder.after_turn().expect("after");
    let report = rewind(&fx.recorder, "s", &Target::Turn(1), false).expect("rewinds");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(tree(&fx.workspace), want);
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).expect("outside"),
        "theirs"
    );
}

/// A link planted outside keel after the last checkpoint is a change keel did not make: the
/// rewind refuses, naming it; forced, it replaces the link and never writes through it.
#[test]
fn a_link_planted_outside_keel_is_named_and_never_followed() {
    let fx = Fixture::new(Settings::default());
    let outside = fx.outside();
    std::fs::create_dir(fx.path("src")).expect("src");
    std::fs::write(fx.path("src/main.rs"), "fn main() {}\n").expect("file");
    let want = tree(&fx.workspace);
    fx.recorder.before_turn("s").expect("before");
    std::fs::write(fx.path("src/main.rs"), "changed by the turn\n").expect("turn");
    fx.recorder.after_turn().expect("after");
    // Outside keel: src swapped for a link out.
    std::fs::remove_dir_all(fx.path("src")).expect("rm");
    std::os::unix::fs::symlink(&outside, fx.path("src")).expect("plant");
    let refused = rewind(&fx.recorder, "s", &Target::Turn(1), false).expect_err("refused");
    assert!(refused.0.contains("changed outside keel"), "{refused}");
    assert!(refused.0.contains("src"), "{refused}");
    assert!(matches!(
        tree(&fx.workspace).get("src"),
        Some(Seen::Link { .. })
    ));
    let report = rewind(&fx.recorder, "s", &Target::Turn(1), true).expect("forced");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    assert_eq!(tree(&fx.workspace), want);
    assert_eq!(std::fs::read_dir(&outside).expect("outside").count(), 0);
}

/// The ignore rules are the workspace's, so a command of the turn can write them: a
/// `.gitignore` of `*` written before `rm -rf src docs` must not leave the checkpoint before
/// the `rm` empty. What the session's checkpoints recorded stays recorded while it is there,
/// so the checkpoint before the `rm` still holds every file and a rewind to it brings them
/// back.
#[test]
fn ignore_rules_written_during_a_session_do_not_shrink_what_it_records() {
    let fx = Fixture::new(Settings::default());
    std::fs::create_dir_all(fx.path("src/deep")).expect("src");
    std::fs::create_dir(fx.path("docs")).expect("docs");
    std::fs::write(fx.path("src/lib.rs"), "pub fn a() {}\n").expect("lib");
    std::fs::write(fx.path("src/deep/mod.rs"), "// deep\n").expect("deep");
    std::fs::write(fx.path("docs/guide.md"), "# guide\n").expect("guide");
    std::os::unix::fs::symlink("lib.rs", fx.path("src/link")).expect("link");
    let want = tree(&fx.workspace);
    let first = fx.recorder.before_turn("s").expect("before the turn");
    assert_eq!(first.files, 3);

    fx.recorder
        .before_call("call_1", "exec_shell")
        .expect("before .gitignore");
    std::fs::write(fx.path(".gitignore"), "*\n").expect("ignore everything");
    let before_rm = fx
        .recorder
        .before_call("call_2", "exec_shell")
        .expect("before rm")
        .expect("a checkpoint");
    assert_eq!(
        before_rm.files, 3,
        "the checkpoint before the rm lost what the new .gitignore hides: {before_rm:?}"
    );
    std::fs::remove_dir_all(fx.path("src")).expect("rm src");
    std::fs::remove_dir_all(fx.path("docs")).expect("rm docs");
    fx.recorder.after_turn().expect("after the turn");

    let report = rewind(&fx.recorder, "s", &Target::Call("call_2".into()), false)
        .expect("rewinds without --force");
    assert!(report.applied.failed.is_empty(), "{:?}", report.applied);
    let mut now = tree(&fx.workspace);
    assert!(
        now.remove(".gitignore").is_some(),
        "the .gitignore was there before the rm"
    );
    assert_eq!(now, want);
}

/// What the session recorded is looked at again only through directories opened without
/// following a link: with `.gitignore` hiding everything and `src` swapped for a link to a
/// directory outside holding files of the same names, nothing outside is recorded.
#[test]
fn what_stays_recorded_is_never_read_through_a_link() {
    let fx = Fixture::new(Settings::default());
    let outside = fx.outside();
    std::fs::write(outside.join("lib.rs"), "the person's secret\n").expect("outside file");
    std::fs::create_dir(fx.path("src")).expect("src");
    std::fs::write(fx.path("src/lib.rs"), "pub fn a() {}\n").expect("lib");
    fx.recorder.before_turn("s").expect("before the turn");
    std::fs::write(fx.path(".gitignore"), "*\n").expect("ignore everything");
    std::fs::remove_dir_all(fx.path("src")).expect("rm src");
    std::os::unix::fs::symlink(&outside, fx.path("src")).expect("link out");
    fx.recorder
        .before_call("call_1", "exec_shell")
        .expect("before call");
    let (_, manifest) = fx
        .recorder
        .record("s", keel_checkpoints::Kind::AfterTurn, None)
        .expect("after");
    assert_eq!(
        manifest.entries.get("src"),
        Some(&Node::Symlink {
            target: outside.display().to_string()
        }),
        "{manifest:?}"
    );
    assert!(
        !manifest.entries.contains_key("src/lib.rs"),
        "a file was recorded through a link out of the workspace: {manifest:?}"
    );
}
