//! The rewind's proof, in the spirit of the kernel's undo-log property: for random sequences
//! of file operations — made directly, as a file tool makes them, and by real shell commands —
//! with checkpoints in between, rewinding to any checkpoint leaves the tree exactly as it was
//! recorded (bytes, modes, links, presence), and rewinding to the rewind's safety checkpoint
//! brings back exactly the tree the rewind replaced.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use keel_checkpoints::rewind::{Target, rewind};
use keel_checkpoints::{Kind, Settings};
use proptest::prelude::*;

use crate::common::{Fixture, tree};

const FILES: &[&str] = &["f1", "f2", "a/f3", "a/c/f4", "b/f5", "a/f6"];
const DIRS: &[&str] = &["a", "b", "a/c", "d"];
const ANY: &[&str] = &[
    "f1", "f2", "a/f3", "a/c/f4", "b/f5", "a/f6", "a", "b", "a/c", "d",
];

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Write(usize, Vec<u8>),
    Delete(usize),
    Rename(usize, usize),
    Chmod(usize, u32),
    Mkdir(usize),
    Rmdir(usize),
    Link(usize, usize),
    /// The same operations through `sh -c`, as a command run by a turn would.
    ShellWrite(usize, u8),
    ShellRemoveAll(usize),
    ShellMove(usize, usize),
    ShellChmod(usize, u32),
    Checkpoint,
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES.len();
    let dir = 0..DIRS.len();
    let path = 0..ANY.len();
    let file_mode = prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o400, 0o4755]);
    let dir_mode = prop::sample::select(vec![0o755u32, 0o700, 0o750]);
    prop_oneof![
        3 => (file.clone(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(f, b)| Op::Write(f, b)),
        1 => path.clone().prop_map(Op::Delete),
        1 => (path.clone(), path.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (file.clone(), file_mode.clone()).prop_map(|(f, m)| Op::Chmod(f, m)),
        1 => (dir.clone(), dir_mode).prop_map(|(d, m)| Op::Chmod(FILES.len() + d.min(2), m)),
        2 => dir.clone().prop_map(Op::Mkdir),
        1 => dir.clone().prop_map(Op::Rmdir),
        1 => (file.clone(), path.clone()).prop_map(|(f, t)| Op::Link(f, t)),
        1 => (file.clone(), any::<u8>()).prop_map(|(f, b)| Op::ShellWrite(f, b)),
        1 => path.clone().prop_map(Op::ShellRemoveAll),
        1 => (path.clone(), path.clone()).prop_map(|(a, b)| Op::ShellMove(a, b)),
        1 => (file, file_mode).prop_map(|(f, m)| Op::ShellChmod(f, m)),
        2 => Just(Op::Checkpoint),
    ]
}

fn sh(fx: &Fixture, script: &str) {
    // A command that fails (its target is missing) changes nothing, as with a model's command.
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&fx.workspace)
        .output()
        .expect("sh runs");
}

pub(crate) fn apply(fx: &Fixture, op: &Op) {
    // Operations that do not apply to the tree as it is (a parent missing) change nothing.
    match op {
        Op::Write(f, bytes) => {
            let _ = std::fs::write(fx.path(FILES[*f]), bytes);
        }
        Op::Delete(p) => {
            let path = fx.path(ANY[*p]);
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
        }
        Op::Rename(a, b) => {
            let _ = std::fs::rename(fx.path(ANY[*a]), fx.path(ANY[*b]));
        }
        Op::Chmod(p, mode) => {
            let path = fx.path(ANY[*p]);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_symlink()) {
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode));
            }
        }
        Op::Mkdir(d) => {
            let _ = std::fs::create_dir(fx.path(DIRS[*d]));
        }
        Op::Rmdir(d) => {
            let _ = std::fs::remove_dir(fx.path(DIRS[*d]));
        }
        Op::Link(f, t) => {
            let _ = std::os::unix::fs::symlink(ANY[*t], fx.path(FILES[*f]));
        }
        Op::ShellWrite(f, b) => sh(fx, &format!("printf 'from sh %s' {b} > {}", FILES[*f])),
        Op::ShellRemoveAll(p) => sh(fx, &format!("rm -rf {}", ANY[*p])),
        Op::ShellMove(a, b) => sh(fx, &format!("mv -T {} {}", ANY[*a], ANY[*b])),
        Op::ShellChmod(f, m) => sh(fx, &format!("chmod {m:o} {}", FILES[*f])),
        Op::Checkpoint => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn rewinding_to_any_checkpoint_restores_the_recorded_tree_exactly(
        ops in prop::collection::vec(op(), 1..40),
        pick in any::<prop::sample::Index>(),
        take_last in any::<bool>(),
    ) {
        let fx = Fixture::new(Settings::default());
        let session = "prop";
        let mut recorded = Vec::new();
        let first = fx.recorder.before_turn(session).expect("first checkpoint");
        recorded.push((first.id, tree(&fx.workspace)));
        for op in &ops {
            if let Op::Checkpoint = op {
                let c = fx.recorder.before_call("call", "tool").expect("checkpoint").expect("session");
                recorded.push((c.id, tree(&fx.workspace)));
            } else {
                apply(&fx, op);
            }
        }
        // What the last operations did is recorded as a turn's end records it; without it
        // they are changes keel did not see, and the rewind must be forced over them.
        if take_last {
            fx.recorder.after_turn().expect("after").expect("session");
        }
        let before_rewind = tree(&fx.workspace);
        let (id, want) = &recorded[pick.index(recorded.len())];
        let report = match rewind(&fx.recorder, session, &Target::Checkpoint(id.clone()), false) {
            Ok(report) => report,
            Err(refused) => {
                prop_assert!(!take_last, "refused with every change recorded: {refused}");
                prop_assert_eq!(&tree(&fx.workspace), &before_rewind, "a refused rewind changed files");
                rewind(&fx.recorder, session, &Target::Checkpoint(id.clone()), true).expect("forced")
            }
        };
        prop_assert!(report.applied.failed.is_empty(), "{:?}", report.applied.failed);
        prop_assert_eq!(&tree(&fx.workspace), want, "rewind to {}", id);
        prop_assert_eq!(report.safety.kind, Kind::Safety);
        // The rewind undone: back to exactly the tree it replaced.
        let undo = rewind(&fx.recorder, session, &Target::Checkpoint(report.safety.id.clone()), false)
            .expect("undoing the rewind needs no force");
        prop_assert!(undo.applied.failed.is_empty(), "{:?}", undo.applied.failed);
        prop_assert_eq!(&tree(&fx.workspace), &before_rewind, "undo of the rewind to {}", id);
    }
}
