//! Directories carved out of a plugin's granted ones (keel's home when the workspace holds it).
//!
//! A person may run keel in their home directory: the workspace is then `~`, and keel's home
//! `~/.keel` lies inside the workspace grant. Commands never see it (the sandbox hides it);
//! for plugins, the kernel wraps every `wasi:filesystem` descriptor method that takes a path
//! (`open-at`, `stat-at`, `rename-at`, …) and refuses, with `access`, a path that resolves
//! inside a carved-out directory, unless it lies in a directory the plugin was granted on its
//! own (its data directory, `$KEEL_DATA/<plugin>`). The path is resolved the way wasmtime-wasi
//! will resolve it: under the descriptor's directory with `openat2(RESOLVE_BENEATH)`, the
//! parent followed, the last component followed only when the call asks for it; the real
//! location comes from the kernel (`/proc/self/fd`), so neither `..` nor a link in the
//! workspace leads into the carved-out directory. An opened descriptor is checked again where
//! it actually landed (closed and refused if inside), and a link whose target does not exist
//! is never followed to create a file. Without a carved-out directory (the usual case) every
//! call goes straight to wasmtime-wasi.
//!
//! What remains: the check and wasmtime-wasi's own resolution are two lookups, so a process
//! swapping a directory for a link between them could redirect a change (not an open, which
//! is checked where it landed). Plugins run one call at a time; commands run in the sandbox,
//! which hides keel's home from them, and a command's process group ends with it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{Result, StoreContextMut};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, HostDescriptor as _, MetadataHashValue, NewTimestamp, OpenFlags,
    PathFlags,
};

use super::WasmGrants;
use super::store::StoreState;

/// The carved-out directories of one plugin's grants, and its granted directories inside them.
#[derive(Debug)]
pub(crate) struct CarvedOut {
    hidden: Vec<PathBuf>,
    kept: Vec<PathBuf>,
}

impl CarvedOut {
    /// `None` when `grants` carve nothing out: the calls then go straight to wasmtime-wasi.
    pub(crate) fn of(grants: &WasmGrants) -> Option<Arc<CarvedOut>> {
        if grants.hidden.is_empty() {
            return None;
        }
        let kept = grants
            .dirs
            .iter()
            .filter(|d| grants.hidden.iter().any(|h| d.host.starts_with(h)))
            .map(|d| d.host.clone())
            .collect();
        Some(Arc::new(CarvedOut {
            hidden: grants.hidden.clone(),
            kept,
        }))
    }

    /// Whether the real path `real` lies in a carved-out directory (and not in a granted one).
    fn hides(&self, real: &Path) -> bool {
        self.hidden.iter().any(|h| real.starts_with(h))
            && !self.kept.iter().any(|k| real.starts_with(k))
    }

    /// Whether `real` is a carved-out directory or one holding it (renaming it moves it).
    fn holds_hidden(&self, real: &Path) -> bool {
        self.hidden.iter().any(|h| h.starts_with(real))
    }

    /// Whether the call on `path` under `fd` must be refused: it resolves inside a carved-out
    /// directory (`moves`: or to one holding it).
    fn refuses(
        &self,
        table: &ResourceTable,
        fd: &Resource<Descriptor>,
        path: &str,
        follow: bool,
        moves: bool,
    ) -> bool {
        let dir = match table.get(fd) {
            Ok(Descriptor::Dir(dir)) => dir.dir.clone(),
            // Not a directory: wasmtime-wasi refuses the call itself.
            _ => return false,
        };
        match sys::resolve(&dir, path, follow) {
            sys::Resolved::Nowhere => false,
            sys::Resolved::Unknown => true,
            sys::Resolved::At(paths) => paths
                .iter()
                .any(|p| self.hides(p) || (moves && self.holds_hidden(p))),
        }
    }

    /// Whether `rename-at(fd, old_path, new_fd, new_path)` must be refused: either name is
    /// inside a carved-out directory, or the renamed one holds it.
    pub(crate) fn refuses_rename(
        &self,
        table: &ResourceTable,
        fd: &Resource<Descriptor>,
        old_path: &str,
        new_fd: &Resource<Descriptor>,
        new_path: &str,
    ) -> bool {
        self.refuses(table, fd, old_path, false, true)
            || self.refuses(table, new_fd, new_path, false, true)
    }

    /// Whether an opened descriptor landed inside a carved-out directory.
    fn refuses_opened(&self, table: &ResourceTable, fd: &Resource<Descriptor>) -> bool {
        let file = match table.get(fd) {
            Ok(Descriptor::Dir(dir)) => dir.dir.clone(),
            Ok(Descriptor::File(file)) => file.file.clone(),
            Err(_) => return false,
        };
        sys::real_path(&file).is_none_or(|real| self.hides(&real))
    }
}

/// The store's carved-out directories, if any.
fn carved(store: &StoreContextMut<'_, StoreState>) -> Option<Arc<CarvedOut>> {
    store.data().carved.clone()
}

fn refused<T>() -> Result<(Result<T, ErrorCode>,)> {
    Ok((Err(ErrorCode::Access),))
}

/// wasmtime-wasi's `FsResult` as the component value: its error code, or a trap.
fn answer<T>(result: wasmtime_wasi::p2::FsResult<T>) -> Result<(Result<T, ErrorCode>,)> {
    Ok((match result {
        Ok(v) => Ok(v),
        Err(e) => Err(e.downcast()?),
    },))
}

fn follows(flags: PathFlags) -> bool {
    flags.contains(PathFlags::SYMLINK_FOLLOW)
}

/// Shadow wasmtime-wasi's path-taking descriptor methods (except `rename-at`, which
/// `keep_mode` shadows and checks with [`CarvedOut::refuses_rename`]) with ones that honour the store's
/// carved-out directories. Call after `wasmtime_wasi::p2::add_to_linker_async`.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> Result<()> {
    linker.allow_shadowing(true);
    let defined = define(linker);
    linker.allow_shadowing(false);
    defined
}

fn define(linker: &mut Linker<StoreState>) -> Result<()> {
    let mut types = linker.instance(super::keep_mode::FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, path_flags, path, oflags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                if let Some(c) = &carved
                    && c.refuses(&*view.table, &fd, &path, follows(path_flags), false)
                {
                    return refused();
                }
                let opened = view.open_at(fd, path_flags, path, oflags, flags).await;
                if let Some(c) = &carved
                    && let Ok(new) = &opened
                    && c.refuses_opened(&*view.table, new)
                {
                    if let Ok(new) = opened {
                        view.table.delete(new)?;
                    }
                    return refused();
                }
                answer(opened)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.stat-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, path_flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                if carved.is_some_and(|c| {
                    c.refuses(&*view.table, &fd, &path, follows(path_flags), false)
                }) {
                    return refused();
                }
                answer(view.stat_at(fd, path_flags, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-times-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, path_flags, path, atim, mtim): (
            Resource<Descriptor>,
            PathFlags,
            String,
            NewTimestamp,
            NewTimestamp,
        )| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                if carved.is_some_and(|c| {
                    c.refuses(&*view.table, &fd, &path, follows(path_flags), false)
                }) {
                    return refused();
                }
                answer(view.set_times_at(fd, path_flags, path, atim, mtim).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, old_flags, old_path, new_fd, new_path): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                if carved.is_some_and(|c| {
                    c.refuses(&*view.table, &fd, &old_path, follows(old_flags), false)
                        || c.refuses(&*view.table, &new_fd, &new_path, false, false)
                }) {
                    return refused();
                }
                answer(
                    view.link_at(fd, old_flags, old_path, new_fd, new_path)
                        .await,
                )
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, target, path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                // The link's text is only followed later, and checked then.
                if carved.is_some_and(|c| c.refuses(&*view.table, &fd, &path, false, false)) {
                    return refused();
                }
                answer(view.symlink_at(fd, target, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.metadata-hash-at",
        |mut store: StoreContextMut<'_, StoreState>,
         (fd, path_flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                let carved = carved(&store);
                let mut view = store.data_mut().filesystem();
                if carved.is_some_and(|c| {
                    c.refuses(&*view.table, &fd, &path, follows(path_flags), false)
                }) {
                    return refused::<MetadataHashValue>();
                }
                answer(view.metadata_hash_at(fd, path_flags, path).await)
            })
        },
    )?;
    // The methods taking only a path, never following its last component.
    macro_rules! path_only {
        ($name:literal, $method:ident, $moves:literal) => {
            types.func_wrap_async(
                $name,
                |mut store: StoreContextMut<'_, StoreState>,
                 (fd, path): (Resource<Descriptor>, String)| {
                    Box::new(async move {
                        let carved = carved(&store);
                        let mut view = store.data_mut().filesystem();
                        if carved
                            .is_some_and(|c| c.refuses(&*view.table, &fd, &path, false, $moves))
                        {
                            return refused();
                        }
                        answer(view.$method(fd, path).await)
                    })
                },
            )?;
        };
    }
    path_only!(
        "[method]descriptor.create-directory-at",
        create_directory_at,
        false
    );
    path_only!("[method]descriptor.readlink-at", readlink_at, false);
    path_only!(
        "[method]descriptor.remove-directory-at",
        remove_directory_at,
        true
    );
    path_only!("[method]descriptor.unlink-file-at", unlink_file_at, false);
    Ok(())
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::PathBuf;

    use nix::errno::Errno;
    use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
    use nix::sys::stat::{SFlag, fstatat};

    /// Where a path leads.
    pub(super) enum Resolved {
        /// Its parent does not resolve beneath the directory: wasmtime-wasi fails the call too.
        Nowhere,
        /// The real locations the call touches (the name, and what a followed link names).
        At(Vec<PathBuf>),
        /// It cannot be told (a followed link whose target does not exist, no `/proc`).
        Unknown,
    }

    fn open_beneath(dir: &File, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(dir, path, how)
    }

    /// The real path of an open file, as the kernel knows it.
    pub(super) fn real_path(fd: &impl AsRawFd) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
    }

    pub(super) fn resolve(dir: &File, path: &str, follow: bool) -> Resolved {
        let trimmed = path.trim_end_matches('/');
        let (parent, name) = match trimmed.rsplit_once('/') {
            Some((parent, name)) => (if parent.is_empty() { "/" } else { parent }, name),
            None => (".", trimmed),
        };
        if matches!(name, "" | "." | "..") {
            // The path names a directory by itself: where it leads is all there is.
            let whole = if path.is_empty() { "." } else { path };
            return match open_beneath(dir, whole, OFlag::empty()) {
                Ok(fd) => real_path(&fd).map_or(Resolved::Unknown, |p| Resolved::At(vec![p])),
                Err(_) => Resolved::Nowhere,
            };
        }
        let Ok(parent) = open_beneath(dir, parent, OFlag::O_DIRECTORY) else {
            return Resolved::Nowhere;
        };
        let Some(parent_path) = real_path(&parent) else {
            return Resolved::Unknown;
        };
        let mut at = vec![parent_path.join(name)];
        if follow {
            match open_beneath(dir, trimmed, OFlag::empty()) {
                Ok(target) => match real_path(&target) {
                    Some(p) => at.push(p),
                    None => return Resolved::Unknown,
                },
                Err(Errno::ENOENT) => {
                    let link =
                        fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|s| {
                            SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
                        });
                    if link {
                        // A dangling link: following it would create its target, wherever.
                        return Resolved::Unknown;
                    }
                }
                // A link loop or out of the directory: wasmtime-wasi refuses it as well.
                Err(_) => {}
            }
        }
        Resolved::At(at)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;
    use std::path::PathBuf;

    pub(super) enum Resolved {
        #[allow(dead_code)]
        Nowhere,
        #[allow(dead_code)]
        At(Vec<PathBuf>),
        Unknown,
    }

    /// Without `openat2` and `/proc` nothing can be told: a carved-out grant refuses all.
    pub(super) fn real_path(_: &impl std::os::fd::AsRawFd) -> Option<PathBuf> {
        None
    }

    pub(super) fn resolve(_: &File, _: &str, _: bool) -> Resolved {
        Resolved::Unknown
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::fs::{self, File};
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    use super::sys::{Resolved, resolve};
    use super::{CarvedOut, WasmGrants};
    use crate::wasm_host::GrantedDir;

    fn at(resolved: Resolved) -> Vec<PathBuf> {
        match resolved {
            Resolved::At(paths) => paths,
            Resolved::Nowhere => vec![PathBuf::from("<nowhere>")],
            Resolved::Unknown => vec![PathBuf::from("<unknown>")],
        }
    }

    /// Where a guest's path leads, as the kernel resolves it: through `..` and links inside
    /// the granted directory (a link's target too when the call follows it), never out of
    /// it; a dangling link followed is unknown (creating through it could land anywhere).
    #[test]
    fn paths_resolve_to_where_they_lead_and_a_carved_out_home_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = root.path().canonicalize().expect("canonical");
        let home = ws.join("state/keel");
        let own = home.join("data/p");
        fs::create_dir_all(&own).expect("mkdir");
        fs::create_dir_all(ws.join("sub")).expect("mkdir");
        fs::write(home.join("secret"), "x").expect("write");
        symlink("state/keel", ws.join("link")).expect("symlink");
        symlink(&home, ws.join("absolute-link")).expect("symlink");
        symlink("state/keel/secret", ws.join("file-link")).expect("symlink");
        symlink("state/keel/new", ws.join("dangling")).expect("symlink");
        let dir = File::open(&ws).expect("open");

        assert_eq!(
            at(resolve(&dir, "sub/../state/keel/secret", false)),
            [home.join("secret")]
        );
        assert_eq!(
            at(resolve(&dir, "link/secret", false)),
            [home.join("secret")]
        );
        // An absolute link is refused by the lookup itself, as wasmtime-wasi refuses it.
        assert_eq!(
            at(resolve(&dir, "absolute-link/secret", false)),
            [PathBuf::from("<nowhere>")]
        );
        // Not followed: the link itself; followed: the link and what it names.
        assert_eq!(
            at(resolve(&dir, "file-link", false)),
            [ws.join("file-link")]
        );
        assert_eq!(
            at(resolve(&dir, "file-link", true)),
            [ws.join("file-link"), home.join("secret")]
        );
        assert_eq!(
            at(resolve(&dir, "dangling", true)),
            [PathBuf::from("<unknown>")]
        );
        assert_eq!(
            at(resolve(&dir, "missing/x", false)),
            [PathBuf::from("<nowhere>")]
        );
        assert_eq!(
            at(resolve(&dir, "../x", false)),
            [PathBuf::from("<nowhere>")]
        );
        assert_eq!(at(resolve(&dir, ".", false)), vec![ws.clone()]);

        let grants = WasmGrants {
            dirs: vec![
                GrantedDir {
                    host: ws.clone(),
                    guest: "/workspace".into(),
                    read_only: false,
                },
                GrantedDir {
                    host: own.clone(),
                    guest: "/data".into(),
                    read_only: false,
                },
            ],
            hidden: vec![home.clone()],
            ..WasmGrants::default()
        };
        let carved = CarvedOut::of(&grants).expect("carves");
        assert!(carved.hides(&home));
        assert!(carved.hides(&home.join("secret")));
        assert!(
            !carved.hides(&own.join("notes")),
            "its own data stays reachable"
        );
        assert!(!carved.hides(&ws.join("state")));
        assert!(
            carved.holds_hidden(&ws.join("state")),
            "renaming it moves the home"
        );
        assert!(CarvedOut::of(&WasmGrants::default()).is_none());
    }
}
