//! A rename over an existing file keeps that file's permission bits.
//!
//! WASI has no permission bits: a guest cannot read a file's mode nor set one, so a file it
//! creates gets the default mode. A guest that replaces a file atomically (writes a temp file
//! beside it, syncs it, renames it over the old one) would therefore turn an executable script
//! into a plain file. The kernel's `rename-at` keeps the mode instead: before the rename that
//! wasmtime-wasi does (with its own checks and path confinement, unchanged), the renamed file
//! is given the permission bits (`rwx` for owner, group and others; never set-id or sticky) of
//! the regular file it replaces. The guest gains nothing it could not do already: replacing
//! the content of a file it may write.
//!
//! The two files are found with `openat2(RESOLVE_BENEATH)` under the guest's own directory
//! descriptors (so never outside them, whatever `..` or links the paths hold), opened without
//! following a final link and without blocking on a FIFO. Where that is not possible (another
//! OS, an old kernel) the rename goes ahead without it, as wasmtime-wasi's own would.

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{Result, StoreContextMut};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, HostDescriptor as _};

use super::store::StoreState;

/// The WASI filesystem interface as wasmtime-wasi 48 defines it in the linker; components
/// importing any earlier 0.2 version are linked to it.
pub(crate) const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Replace wasmtime-wasi's `descriptor.rename-at` in `linker` with one that keeps the replaced
/// file's mode. Call after `wasmtime_wasi::p2::add_to_linker_async`.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> Result<()> {
    linker.allow_shadowing(true);
    let defined = linker.instance(FILESYSTEM_TYPES).and_then(|mut types| {
        types.func_wrap_async(
            "[method]descriptor.rename-at",
            |mut store: StoreContextMut<'_, StoreState>,
             (fd, old_path, new_fd, new_path): (
                Resource<Descriptor>,
                String,
                Resource<Descriptor>,
                String,
            )| {
                Box::new(async move {
                    let carved = store.data().carved.clone();
                    let mut view = store.data_mut().filesystem();
                    if let Some(c) = carved
                        && c.refuses_rename(&*view.table, &fd, &old_path, &new_fd, &new_path)
                    {
                        return Ok((Err(ErrorCode::Access),));
                    }
                    give_replaced_mode(&*view.table, &fd, &old_path, &new_fd, &new_path);
                    let renamed = view.rename_at(fd, old_path, new_fd, new_path).await;
                    Ok((match renamed {
                        Ok(()) => Ok(()),
                        Err(e) => Err(e.downcast()?),
                    },))
                })
            },
        )
    });
    linker.allow_shadowing(false);
    defined
}

/// Best effort: give `old_path` (under `fd`) the permission bits of the regular file at
/// `new_path` (under `new_fd`), when both are regular files and both directories are writable
/// by the guest. Anything else leaves the file as it is; the rename then decides.
fn give_replaced_mode(
    table: &ResourceTable,
    fd: &Resource<Descriptor>,
    old_path: &str,
    new_fd: &Resource<Descriptor>,
    new_path: &str,
) {
    let writable_dir = |fd: &Resource<Descriptor>| match table.get(fd) {
        Ok(Descriptor::Dir(dir)) if !dir.perms.write_not_permitted() => Some(dir.dir.clone()),
        _ => None,
    };
    let (Some(old_dir), Some(new_dir)) = (writable_dir(fd), writable_dir(new_fd)) else {
        return;
    };
    if let Err(e) = sys::copy_mode(&old_dir, old_path, &new_dir, new_path) {
        tracing::debug!("rename-at: the replaced file's mode was not kept: {e}");
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::os::fd::OwnedFd;

    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    use nix::sys::stat::{Mode, SFlag, fchmod, fstat};

    /// The permission bits kept: never set-user-id, set-group-id or sticky.
    const KEPT: u32 = 0o777;

    fn open_beneath(dir: &File, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(dir, path, how)
    }

    fn is_regular(mode: u32) -> bool {
        SFlag::from_bits_truncate(mode) & SFlag::S_IFMT == SFlag::S_IFREG
    }

    pub(super) fn copy_mode(
        old_dir: &File,
        old_path: &str,
        new_dir: &File,
        new_path: &str,
    ) -> nix::Result<()> {
        // O_PATH: no read permission needed, and a FIFO or device is not opened.
        let replaced = match open_beneath(new_dir, new_path, OFlag::O_PATH) {
            Ok(fd) => fd,
            // Nothing is replaced: a new file keeps its default mode.
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let replaced = fstat(&replaced)?;
        if !is_regular(replaced.st_mode) {
            return Ok(());
        }
        // O_NONBLOCK: should the name be swapped for a FIFO meanwhile, opening it cannot hang.
        let renamed = open_beneath(old_dir, old_path, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
        let current = fstat(&renamed)?;
        if !is_regular(current.st_mode) || current.st_mode & KEPT == replaced.st_mode & KEPT {
            return Ok(());
        }
        fchmod(&renamed, Mode::from_bits_truncate(replaced.st_mode & KEPT))
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;

    pub(super) fn copy_mode(_: &File, _: &str, _: &File, _: &str) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::fs::{self, File, Permissions};
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::sys::copy_mode;

    fn mode(path: &std::path::Path) -> u32 {
        fs::symlink_metadata(path)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    /// A guest's rename names paths under its own directories only: a link or `..` leading out
    /// of them neither lends a mode nor receives one, and set-id bits are never copied.
    #[test]
    fn only_regular_files_beneath_the_guests_directory_lend_or_take_a_mode() {
        let outside = tempfile::tempdir().expect("tempdir");
        let secret = outside.path().join("secret");
        fs::write(&secret, "key").expect("write");
        fs::set_permissions(&secret, Permissions::from_mode(0o600)).expect("chmod");
        let setuid = outside.path().join("setuid");
        fs::write(&setuid, "x").expect("write");
        fs::set_permissions(&setuid, Permissions::from_mode(0o4755)).expect("chmod");

        let ws = tempfile::tempdir().expect("tempdir");
        let dir = File::open(ws.path()).expect("open dir");
        let new = ws.path().join("new");
        fs::write(&new, "new").expect("write");
        fs::set_permissions(&new, Permissions::from_mode(0o644)).expect("chmod");

        // The renamed name is a link out: it is not followed, the outside file keeps its mode.
        let exec = ws.path().join("exec");
        fs::write(&exec, "#!/bin/sh").expect("write");
        fs::set_permissions(&exec, Permissions::from_mode(0o755)).expect("chmod");
        symlink(&secret, ws.path().join("link-out")).expect("symlink");
        assert!(copy_mode(&dir, "link-out", &dir, "exec").is_err());
        assert_eq!(mode(&secret), 0o600);

        // The replaced name is a link out, or `..` out: nothing is lent.
        symlink(&setuid, ws.path().join("replaced-link")).expect("symlink");
        copy_mode(&dir, "new", &dir, "replaced-link").expect("a link is not a regular file");
        assert_eq!(mode(&new), 0o644);
        let up = format!(
            "../{}/setuid",
            outside.path().file_name().expect("name").to_string_lossy()
        );
        assert!(copy_mode(&dir, "new", &dir, &up).is_err());
        assert_eq!(mode(&new), 0o644);

        // A regular file beneath: its rwx bits are kept, never a set-id bit.
        let suid_inside = ws.path().join("suid-inside");
        fs::write(&suid_inside, "x").expect("write");
        fs::set_permissions(&suid_inside, Permissions::from_mode(0o4755)).expect("chmod");
        copy_mode(&dir, "new", &dir, "suid-inside").expect("kept");
        assert_eq!(mode(&new), 0o755);
    }
}
