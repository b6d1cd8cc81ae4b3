//! What the tests share: a workspace and a store, and the tree as it really is on disk.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use keel_checkpoints::{Recorder, Settings, Store};

/// A workspace, keel's home beside it, and a recorder for the workspace.
pub struct Fixture {
    pub workspace: PathBuf,
    #[allow(dead_code)]
    pub home: PathBuf,
    pub recorder: Recorder,
    /// Removed last, after the recorder's store has synced what it wrote.
    _dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new(settings: Settings) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).expect("workspace");
        let workspace = workspace.canonicalize().expect("canonical");
        let home = dir.path().join("home");
        let store = Store::open(&home.join("checkpoints"), &workspace).expect("store");
        Fixture {
            _dir: dir,
            workspace,
            home,
            recorder: Recorder::new(store, settings),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.workspace.join(rel)
    }

    /// A directory beside the workspace, outside it.
    pub fn outside(&self) -> PathBuf {
        let p = self.workspace.parent().expect("parent").join("outside");
        std::fs::create_dir_all(&p).expect("outside");
        p
    }
}

/// One path of a tree as it is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    File { mode: u32, bytes: Vec<u8> },
    Dir { mode: u32 },
    Link { target: PathBuf },
}

/// Everything under `root` (links not followed), skipping `.git` and `.keel`.
pub fn tree(root: &Path) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Seen>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let rel = path
            .strip_prefix(root)
            .expect("inside")
            .to_string_lossy()
            .into_owned();
        if keel_checkpoints::NEVER_TRACKED.contains(&rel.as_str()) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let mode = meta.mode() & 0o7777;
        if meta.file_type().is_symlink() {
            out.insert(
                rel,
                Seen::Link {
                    target: std::fs::read_link(&path).expect("link"),
                },
            );
        } else if meta.is_dir() {
            out.insert(rel, Seen::Dir { mode });
            walk(root, &path, out);
        } else {
            out.insert(
                rel,
                Seen::File {
                    mode,
                    bytes: std::fs::read(&path).expect("read"),
                },
            );
        }
    }
}
