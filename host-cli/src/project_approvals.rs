//! The person's approvals of a workspace's own folders that reach the model as standing text —
//! its skills (`.keel/skills/`, `.claude/skills/`) and its memory (`.keel/memory/`) — by the
//! SHA-256 of what the folders hold, as `.mcp.json` is approved (`project_mcp.rs`). A cloned
//! repository's files are someone else's words: an edited `SKILL.md`, a new skill folder or a
//! memory file keel did not write means a new digest, which asks again.
//!
//! Each kind keeps its approvals in its own file in keel's sealed home, out of every plugin's
//! and command's reach, written atomically.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use keel_agent_kit::memory_store;
use serde::{Deserialize, Serialize};

/// Entries one digest covers at most: past it the digest says so, and any change still shows.
const MAX_ENTRIES: usize = 4096;
/// How deep below each folder a digest looks.
const MAX_DEPTH: usize = 4;
/// Bytes of each file a digest reads (no plugin reads more of one: skills 64 KiB, memory's
/// indexes 50 KiB and topics 64 KiB).
const FILE_BYTES: u64 = 256 * 1024;

/// How long recording an approval waits for another keel recording one.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What the folders `dirs` (relative to `workspace`) hold, as one SHA-256: every entry's
/// relative path and kind, a regular file's first bytes, a link's target (never followed).
/// `None` when none of them holds anything.
pub fn digest(workspace: &Path, dirs: &[&str]) -> Option<String> {
    // What the digest covers, each file by its own SHA-256, so this stays small.
    let mut covered: Vec<u8> = Vec::new();
    let mut entries = 0usize;
    for dir in dirs {
        let root = workspace.join(dir);
        let mut stack = vec![(root.clone(), 0usize)];
        while let Some((at, depth)) = stack.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&at) else {
                continue;
            };
            // A writer's lock and temporary files come and go; they are not content.
            let name = at
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            if name == memory_store::LOCK_FILE || name.ends_with(memory_store::TMP_SUFFIX) {
                continue;
            }
            let rel = at.strip_prefix(workspace).unwrap_or(&at);
            entries += 1;
            if entries > MAX_ENTRIES {
                covered.extend_from_slice(b"\0cut\0");
                return Some(keel_registry::sha256_hex(&covered));
            }
            covered.extend_from_slice(rel.as_os_str().as_encoded_bytes());
            covered.push(0);
            let kind = meta.file_type();
            if kind.is_symlink() {
                covered.extend_from_slice(b"link\0");
                if let Ok(target) = std::fs::read_link(&at) {
                    covered.extend_from_slice(target.as_os_str().as_encoded_bytes());
                }
            } else if kind.is_dir() {
                covered.extend_from_slice(b"dir\0");
                if depth < MAX_DEPTH
                    && let Ok(read) = std::fs::read_dir(&at)
                {
                    let mut children: Vec<PathBuf> =
                        read.filter_map(Result::ok).map(|e| e.path()).collect();
                    // Popped in name order.
                    children.sort_by(|a, b| b.cmp(a));
                    stack.extend(children.into_iter().map(|c| (c, depth + 1)));
                }
            } else if kind.is_file() {
                covered.extend_from_slice(b"file\0");
                covered.extend_from_slice(&meta.len().to_le_bytes());
                let mut head = Vec::new();
                if let Ok(file) = open_no_follow(&at) {
                    let _ = file.take(FILE_BYTES).read_to_end(&mut head);
                }
                covered.extend_from_slice(keel_registry::sha256_hex(&head).as_bytes());
            } else {
                covered.extend_from_slice(b"other\0");
            }
            covered.push(0);
        }
    }
    // The roots themselves count: a workspace with none of the folders holds nothing.
    let held = dirs.iter().any(|d| {
        std::fs::symlink_metadata(workspace.join(d)).is_ok_and(|m| {
            !m.is_dir()
                || std::fs::read_dir(workspace.join(d)).is_ok_and(|mut r| r.next().is_some())
        })
    });
    held.then(|| keel_registry::sha256_hex(&covered))
}

/// Opens `path` for reading without following a link in its last component.
pub fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

#[derive(Serialize, Deserialize, Default)]
struct Approvals {
    #[serde(default)]
    approved: Vec<Approved>,
}

#[derive(Serialize, Deserialize, PartialEq, Clone)]
struct Approved {
    workspace: PathBuf,
    sha256: String,
}

/// One kind of approval, kept in `home/<file>`.
pub struct Store {
    path: PathBuf,
}

impl Store {
    pub fn new(home: &Path, file: &str) -> Store {
        Store {
            path: home.join(file),
        }
    }

    fn read(&self) -> Approvals {
        std::fs::read(&self.path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Whether `sha256` is the content approved for `workspace`.
    pub fn is_approved(&self, workspace: &Path, sha256: &str) -> bool {
        self.read()
            .approved
            .iter()
            .any(|a| a.workspace == workspace && a.sha256 == sha256)
    }

    /// Whether anything was ever approved for `workspace`.
    pub fn has_any(&self, workspace: &Path) -> bool {
        self.read()
            .approved
            .iter()
            .any(|a| a.workspace == workspace)
    }

    /// Approve `sha256` for `workspace` (replacing an earlier approval there), or with `None`
    /// withdraw the approval.
    pub fn set(&self, workspace: &Path, sha256: Option<&str>) -> anyhow::Result<()> {
        // Several keel processes may record at once (sessions closing): read, change and
        // write under a lock, so none loses another's approval.
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        // An OS lock: a keel killed while holding it lets go at once.
        let lock = self.path.with_extension("lock");
        let _lock = crate::home_locks::OsLock::at(&lock, LOCK_WAIT).map_err(anyhow::Error::msg)?;
        let mut all = self.read();
        all.approved.retain(|a| a.workspace != workspace);
        if let Some(sha256) = sha256 {
            all.approved.push(Approved {
                workspace: workspace.to_path_buf(),
                sha256: sha256.to_owned(),
            });
        }
        keel_registry::atomic_write(&self.path, &serde_json::to_vec_pretty(&all)?, true)
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_changes_with_any_file_a_new_folder_or_a_link() -> anyhow::Result<()> {
        let ws = tempfile::tempdir()?;
        let dirs = &[".keel/skills", ".claude/skills"];
        assert_eq!(digest(ws.path(), dirs), None);
        let skill = ws.path().join(".claude/skills/a");
        std::fs::create_dir_all(&skill)?;
        std::fs::write(skill.join("SKILL.md"), "one")?;
        let first = digest(ws.path(), dirs).expect("held");
        assert_eq!(digest(ws.path(), dirs).as_deref(), Some(first.as_str()));
        std::fs::write(skill.join("SKILL.md"), "two")?;
        let edited = digest(ws.path(), dirs).expect("held");
        assert_ne!(first, edited);
        std::fs::create_dir_all(ws.path().join(".keel/skills/b"))?;
        let added = digest(ws.path(), dirs).expect("held");
        assert_ne!(edited, added);
        std::os::unix::fs::symlink("/etc/passwd", skill.join("x.md"))?;
        assert_ne!(digest(ws.path(), dirs).expect("held"), added);
        Ok(())
    }

    #[test]
    fn an_approval_names_one_content_of_one_workspace() -> anyhow::Result<()> {
        let home = tempfile::tempdir()?;
        let store = Store::new(home.path(), "x-approvals.json");
        let ws = Path::new("/w");
        assert!(!store.is_approved(ws, "aa"));
        store.set(ws, Some("aa"))?;
        assert!(store.is_approved(ws, "aa"));
        assert!(!store.is_approved(ws, "bb"));
        assert!(!store.is_approved(Path::new("/v"), "aa"));
        store.set(ws, Some("bb"))?;
        assert!(!store.is_approved(ws, "aa") && store.is_approved(ws, "bb"));
        store.set(ws, None)?;
        assert!(!store.has_any(ws));
        Ok(())
    }
}
