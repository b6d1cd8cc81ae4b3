//! Which folders an editor may make a session's workspace. The workspace is what the sandbox
//! leaves writable and what the file tools reach, so a session whose `cwd` is `/`, the
//! person's home (or a folder holding it) or a system folder would confine no write at all
//! under `--approval auto`: the editor (or a project setting it passes on) must name a project.

use std::path::{Path, PathBuf};

/// Folders of the system that are never a project: the workspace may lie below some of them
/// (`/srv/site`, `/opt/tool`), never be one of them.
const SYSTEM_FOLDERS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/snap",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/local",
    "/usr/sbin",
    "/usr/share",
    "/var",
    "/var/lib",
    "/var/tmp",
    "/home",
    "/Users",
    "/System",
    "/Library",
    "/Applications",
    "/private",
];

/// Why `workspace` (an absolute, resolved path) may not be a session's workspace, or `None`
/// when it may. `home` is the person's home directory, `keel_home` keel's own.
pub(crate) fn refusal(workspace: &Path, home: Option<&Path>, keel_home: &Path) -> Option<String> {
    let resolved = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let workspace = resolved(workspace);
    let what = if workspace.parent().is_none() {
        Some("the root of the file system".to_owned())
    } else if let Some(home) = home.map(resolved).filter(|h| h.starts_with(&workspace)) {
        Some(if home == workspace {
            "your home directory".to_owned()
        } else {
            format!("a folder holding your home directory {}", home.display())
        })
    } else if SYSTEM_FOLDERS
        .iter()
        .any(|f| workspace == resolved(Path::new(f)) || workspace == Path::new(f))
    {
        Some("a system folder".to_owned())
    } else if workspace.starts_with(resolved(keel_home)) {
        Some(format!("inside keel's home {}", keel_home.display()))
    } else {
        None
    }?;
    Some(format!(
        "`cwd` {} is {what}: a session's workspace is what its commands may write, so keel \
         takes only a project's folder; open the project's own folder in the editor",
        workspace.display()
    ))
}

/// The person's home directory, as `$HOME` names it.
pub(crate) fn person_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_the_home_and_system_folders_are_refused_a_project_is_not() -> std::io::Result<()> {
        let person = tempfile::tempdir()?;
        let home = person.path().join("me");
        let project = home.join("code/app");
        let keel_home = home.join(".keel");
        std::fs::create_dir_all(&project)?;
        std::fs::create_dir_all(keel_home.join("sessions"))?;
        let refused = |p: &Path| refusal(p, Some(&home), &keel_home);
        for p in [
            Path::new("/"),
            Path::new("/etc"),
            Path::new("/usr"),
            Path::new("/home"),
            home.as_path(),
            person.path(),
            keel_home.as_path(),
            keel_home.join("sessions").as_path(),
        ] {
            assert!(refused(p).is_some(), "{} was taken", p.display());
        }
        assert_eq!(refused(&project), None);
        assert_eq!(refused(&home.join("code")), None);
        // Through a link, the folder it leads to is judged.
        let link = person.path().join("link-to-root");
        std::os::unix::fs::symlink("/", &link)?;
        assert!(refused(&link).is_some());
        Ok(())
    }
}
