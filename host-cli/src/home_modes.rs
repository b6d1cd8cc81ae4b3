//! keel's home is the person's alone, whoever made it: it holds their session logs (the text
//! of every file a command printed, a key among them), the checkpoint store (copies of their
//! files), their approvals and their config. Each time keel uses it ([`keep_private`]):
//!
//! - a missing home is made 0700 (and the folders leading to it);
//! - a home owned by someone else, or reached through a link or a folder someone else owns or
//!   anyone may write (without the sticky bit, which keeps others from renaming what is not
//!   theirs), is refused with what to do: whoever controls it could read the sessions or plant
//!   a config and approvals keel trusts;
//! - a home the person owns with any group or other bit is made 0700, and everything in it
//!   loses those bits once (the logs and the checkpoint store made before); its `data` and
//!   `checkpoints` folders are checked each time too, so a home made private again later still
//!   has its logs and store the person's alone.
//!
//! A link inside the home is never followed and its target never changed: every entry is
//! opened with `O_NOFOLLOW` and changed through that descriptor.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use anyhow::{Context as _, bail};

/// The mode bits of a person's alone: none for group or others.
const OTHERS: u32 = 0o077;

/// Keep `home` (absolute) the person's alone; see the module documentation.
pub fn keep_private(home: &Path) -> anyhow::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    let link = match std::fs::symlink_metadata(home) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = home.parent() {
                check_folders_leading_to(parent, me)?;
            }
            return std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home)
                .with_context(|| format!("cannot create keel's home {}", home.display()));
        }
        Err(e) => return Err(e).context(format!("cannot read keel's home {}", home.display())),
    };
    if link.file_type().is_symlink() {
        if link.uid() != me && link.uid() != 0 {
            bail!(
                "keel's home {} is a link owned by uid {}, not by you: its owner can point it \
                 anywhere. Remove the link or use a home of your own (--home DIR or KEEL_HOME)",
                home.display(),
                link.uid()
            );
        }
        if let Some(parent) = home.parent() {
            check_folders_leading_to(parent, me)?;
        }
    }
    let real = home
        .canonicalize()
        .with_context(|| format!("cannot resolve keel's home {}", home.display()))?;
    let meta = std::fs::metadata(&real)
        .with_context(|| format!("cannot read keel's home {}", real.display()))?;
    if !meta.is_dir() {
        bail!(
            "keel's home {} is not a directory; pass --home DIR (or set KEEL_HOME) to a \
             directory of your own",
            real.display()
        );
    }
    if meta.uid() != me {
        bail!(
            "keel's home {} belongs to uid {}, not to you (uid {me}): its owner could read \
             your sessions and change the config and approvals keel trusts. Use a directory of \
             your own (--home DIR or KEEL_HOME), or have it given to you (chown)",
            real.display(),
            meta.uid()
        );
    }
    if let Some(parent) = real.parent() {
        check_folders_leading_to(parent, me)?;
    }
    if meta.mode() & OTHERS != 0 {
        tighten_tree(&real);
    } else {
        for folder in ["data", "checkpoints"] {
            let path = real.join(folder);
            let loose = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.is_dir() && m.mode() & OTHERS != 0);
            if loose {
                tighten_tree(&path);
            }
        }
    }
    Ok(())
}

/// Refuse a home below a folder someone else could use to swap it: one owned by another
/// user than the person or root, or one anyone may write without the sticky bit.
fn check_folders_leading_to(start: &Path, me: u32) -> anyhow::Result<()> {
    // From the nearest folder that exists (keel makes the missing ones, the person's), as
    // its links resolve.
    let Some(real) = start.ancestors().find_map(|a| a.canonicalize().ok()) else {
        return Ok(());
    };
    for dir in real.ancestors() {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        if meta.uid() != me && meta.uid() != 0 {
            bail!(
                "keel's home is inside {}, which belongs to uid {}: its owner could replace \
                 the home. Use a home in a folder of your own (--home DIR or KEEL_HOME)",
                dir.display(),
                meta.uid()
            );
        }
        if mode & 0o002 != 0 && mode & 0o1000 == 0 {
            bail!(
                "keel's home is inside {}, which anyone may write (mode {:o}): anyone could \
                 replace the home. Use a home in a folder of your own (--home DIR or \
                 KEEL_HOME), or set the sticky bit (chmod +t)",
                dir.display(),
                mode & 0o7777
            );
        }
    }
    Ok(())
}

/// Take the group and other bits off `root` and everything below it, never through a link.
fn tighten_tree(root: &Path) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = meta.file_type();
        if !(kind.is_dir() || kind.is_file()) {
            continue;
        }
        if meta.mode() & OTHERS != 0 {
            tighten(&path);
        }
        if kind.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
}

/// Take the group and other bits off the file or folder at `path`, through a descriptor
/// opened without following a link (so a link swapped in meanwhile changes nothing).
fn tighten(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    let Ok(meta) = file.metadata() else {
        return;
    };
    if meta.is_dir() || meta.is_file() {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(
            meta.mode() & 0o7777 & !OTHERS,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .map(|m| m.mode() & 0o7777)
            .unwrap_or(0)
    }

    #[test]
    fn a_loose_home_is_made_private_and_a_link_in_it_is_not_followed() -> anyhow::Result<()> {
        let root = tempfile::tempdir()?;
        let home = root.path().join("home");
        let sessions = home.join("data/sessions");
        std::fs::create_dir_all(&sessions)?;
        let outside = root.path().join("outside.txt");
        std::fs::write(&outside, "not keel's")?;
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644))?;
        std::os::unix::fs::symlink(&outside, sessions.join("link.jsonl"))?;
        std::fs::write(sessions.join("a.jsonl"), "{}\n")?;
        for path in [&home, &home.join("data"), &sessions] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::set_permissions(
            sessions.join("a.jsonl"),
            std::fs::Permissions::from_mode(0o644),
        )?;
        keep_private(&home)?;
        assert_eq!(mode(&home), 0o700);
        assert_eq!(mode(&sessions), 0o700);
        assert_eq!(mode(&sessions.join("a.jsonl")), 0o600);
        assert_eq!(mode(&outside), 0o644);

        // Made private again by hand later, with the logs' folder left open: closed again.
        std::fs::set_permissions(home.join("data"), std::fs::Permissions::from_mode(0o755))?;
        keep_private(&home)?;
        assert_eq!(mode(&home.join("data")), 0o700);

        let made = root.path().join("new/home");
        keep_private(&made)?;
        assert_eq!(mode(&made), 0o700);
        Ok(())
    }
}
