//! Build-script helper: compiles keel guest plugin crates to WebAssembly components.
//!
//! A build script lists the guest crates it embeds and calls [`build_components`], which runs
//! one nested `cargo build --release --target wasm32-wasip2` for all of them and returns where
//! each component and its `keel.toml` manifest are:
//!
//! ```no_run
//! use keel_guest_build::{GuestCrate, build_components};
//!
//! let root = keel_guest_build::workspace_root();
//! let built = build_components(&[GuestCrate::from_dir(root.join("plugins/greeter"))]);
//! for component in &built {
//!     println!("{} -> {}", component.name, component.wasm_path.display());
//! }
//! ```
//!
//! The nested build uses its own target directory, shared by every build script of the
//! workspace: `$CARGO_TARGET_DIR/keel-guests` when `CARGO_TARGET_DIR` is set, otherwise
//! `<workspace root>/target/keel-guests`. It runs with the environment cleaned of what cargo
//! sets for build scripts and of flags meant for the host build (see [`build_components`]).
//!
//! These functions run inside build scripts: they report failures by panicking with a message
//! that says what went wrong, which cargo shows as the build script's error.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every guest is compiled for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// The name of a plugin's manifest, beside its `Cargo.toml`.
pub const MANIFEST_FILE: &str = "keel.toml";

/// A guest crate to compile: a workspace member with `crate-type = ["cdylib"]` and a
/// `keel.toml` manifest beside its `Cargo.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestCrate {
    /// The cargo package name, e.g. `keel-plugin-greeter`.
    pub package: String,
    /// The crate's directory (holding `Cargo.toml` and `keel.toml`).
    pub dir: PathBuf,
}

impl GuestCrate {
    /// A guest crate with the given package name in `dir`.
    pub fn new(package: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        GuestCrate {
            package: package.into(),
            dir: dir.into(),
        }
    }

    /// The guest crate in `dir`, its package name read from `dir/Cargo.toml`.
    ///
    /// # Panics
    ///
    /// When `Cargo.toml` cannot be read or has no `package.name`.
    pub fn from_dir(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let path = dir.join("Cargo.toml");
        let table = read_toml(&path);
        let package = table
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| panic!("{} has no `package.name`", path.display()))
            .to_string();
        GuestCrate { package, dir }
    }
}

/// A compiled guest: where its component and manifest are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltComponent {
    /// The cargo package name, e.g. `keel-plugin-greeter`.
    pub package: String,
    /// The plugin's name, the `name` field of its manifest, e.g. `greeter`.
    pub name: String,
    /// Absolute path of the compiled component (`.wasm`).
    pub wasm_path: PathBuf,
    /// Absolute path of the plugin's `keel.toml`.
    pub manifest_path: PathBuf,
}

impl BuiltComponent {
    /// A Rust expression embedding the manifest text: `include_str!("<manifest_path>")`.
    pub fn include_manifest_expr(&self) -> String {
        format!("include_str!({})", path_literal(&self.manifest_path))
    }

    /// A Rust expression embedding the component bytes: `include_bytes!("<wasm_path>")`.
    pub fn include_component_expr(&self) -> String {
        format!("include_bytes!({})", path_literal(&self.wasm_path))
    }
}

/// `path` as a Rust string literal.
fn path_literal(path: &Path) -> String {
    format!("{:?}", path.to_string_lossy())
}

/// Reads and parses a TOML file, panicking with the path on failure.
fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{} is not valid TOML: {e}", path.display()))
}

/// The guest crates directly under `parent`: every subdirectory holding both a `Cargo.toml`
/// and a `keel.toml`, sorted by directory name.
///
/// # Panics
///
/// When `parent` cannot be listed or a `Cargo.toml` cannot be read.
pub fn discover(parent: &Path) -> Vec<GuestCrate> {
    let entries = std::fs::read_dir(parent)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", parent.display()));
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|dir| dir.join("Cargo.toml").is_file() && dir.join(MANIFEST_FILE).is_file())
        .collect();
    dirs.sort();
    dirs.into_iter().map(GuestCrate::from_dir).collect()
}

/// The workspace root: the nearest directory at or above `CARGO_MANIFEST_DIR` whose
/// `Cargo.toml` has a `[workspace]` table.
///
/// # Panics
///
/// When `CARGO_MANIFEST_DIR` is unset (not running under cargo) or no workspace is found.
pub fn workspace_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .expect("CARGO_MANIFEST_DIR is not set; keel-guest-build runs inside build scripts");
    find_workspace_root(&start).unwrap_or_else(|| {
        panic!(
            "no Cargo.toml with a [workspace] table at or above {}",
            start.display()
        )
    })
}

/// The nearest directory at or above `start` whose `Cargo.toml` declares a workspace.
fn find_workspace_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|text| {
                text.lines().any(|line| {
                    let line = line.trim();
                    line == "[workspace]" || line.starts_with("[workspace.")
                })
            })
        })
        .map(Path::to_path_buf)
}

/// The target directory of the nested guest builds: `$CARGO_TARGET_DIR/keel-guests` when
/// `CARGO_TARGET_DIR` is set (a relative value is taken relative to the workspace root),
/// otherwise `<workspace root>/target/keel-guests`.
pub fn guest_target_dir() -> PathBuf {
    let root = workspace_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir).join("keel-guests"),
        _ => root.join("target").join("keel-guests"),
    }
}

/// Compiles `crates` to components with one nested
/// `cargo build --release --target wasm32-wasip2 -p <package>...` and returns them in the same
/// order.
///
/// The nested cargo is `$CARGO` (the cargo running the build script), run in the workspace
/// root with `--target-dir` [`guest_target_dir`]. Its release profile is adjusted with
/// `--config`: no debug info (the workspace's `debug = "line-tables-only"` would make each
/// component about 3 MB instead of about 150 KB; the name section stays for readable
/// backtraces), fat LTO and one codegen unit.
///
/// The environment is cleaned first: `RUSTFLAGS`, `RUSTDOCFLAGS`, `RUSTC_WORKSPACE_WRAPPER`
/// (set by `cargo clippy`), `RUSTDOC`, `RUSTC_LINKER`, what cargo sets for build scripts
/// (`OUT_DIR`, `TARGET`, `HOST`, `NUM_JOBS`, `OPT_LEVEL`, `DEBUG`, `PROFILE`, `DEP_*`) and
/// every `CARGO_*` and `__CARGO_*` variable (`CARGO_ENCODED_RUSTFLAGS`, `CARGO_BUILD_*`,
/// `CARGO_TARGET_*`, `CARGO_PROFILE_*`, `CARGO_FEATURE_*`, `CARGO_CFG_*`, `CARGO_PKG_*`,
/// `CARGO_MANIFEST_*`, ...) except those that configure how cargo reaches registries and
/// talks to the user (`CARGO_HOME`, `CARGO_NET_*`, `CARGO_HTTP_*`, `CARGO_REGISTRY_*`,
/// `CARGO_REGISTRIES_*`, `CARGO_SOURCE_*`, `CARGO_TERM_*`, `CARGO_LOG`) and
/// `CARGO_MAKEFLAGS`, which lets the nested build share the outer build's job slots.
/// `RUSTC`, `RUSTC_WRAPPER` (a compiler cache) and `RUSTUP_TOOLCHAIN` are kept so the guests
/// are compiled by the same compiler.
///
/// Prints `cargo:rerun-if-changed` for each guest crate's directory, the SDK, the `wit/`
/// directory, and the workspace's `Cargo.toml` and `Cargo.lock`.
///
/// # Panics
///
/// When the `wasm32-wasip2` target is not installed (the message says to run
/// `rustup target add wasm32-wasip2`), when the nested build fails (the message holds its
/// error output), or when a component or manifest is missing afterwards.
pub fn build_components(crates: &[GuestCrate]) -> Vec<BuiltComponent> {
    let root = workspace_root();
    let target_dir = guest_target_dir();
    let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("sdk");

    for krate in crates {
        rerun_if_changed(&krate.dir);
    }
    rerun_if_changed(&sdk_dir);
    rerun_if_changed(&root.join("wit"));
    rerun_if_changed(&root.join("Cargo.toml"));
    rerun_if_changed(&root.join("Cargo.lock"));
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    if crates.is_empty() {
        return Vec::new();
    }
    check_target_installed();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    clean_environment(&mut command);
    command
        .current_dir(&root)
        .arg("build")
        .arg("--release")
        .arg("--target")
        .arg(GUEST_TARGET)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["--config", "profile.release.debug=false"])
        .args(["--config", "profile.release.strip=\"debuginfo\""])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        // Smaller code: the guests' machine code ships in keel's binary and is mapped at every
        // start; their work is parsing and bookkeeping, where size costs little speed.
        .args(["--config", "profile.release.opt-level=\"z\""]);
    for krate in crates {
        command.arg("-p").arg(&krate.package);
    }

    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run the nested cargo ({command:?}): {e}"));
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("target may not be installed")
            || (stderr.contains("can't find crate for") && stderr.contains(GUEST_TARGET))
        {
            panic!(
                "the {GUEST_TARGET} target is not installed: run `rustup target add {GUEST_TARGET}`\n\n{stderr}"
            );
        }
        panic!(
            "building the keel guest components failed ({}):\n{command:?}\n\n{stderr}",
            output.status
        );
    }

    let out_dir = target_dir.join(GUEST_TARGET).join("release");
    crates
        .iter()
        .map(|krate| {
            let wasm_path = out_dir.join(format!("{}.wasm", krate.package.replace('-', "_")));
            if !wasm_path.is_file() {
                panic!(
                    "the nested build of {} produced no {}: is its crate-type [\"cdylib\"]?",
                    krate.package,
                    wasm_path.display()
                );
            }
            let manifest_path = absolute(&krate.dir.join(MANIFEST_FILE));
            let name = read_toml(&manifest_path)
                .get("name")
                .and_then(toml::Value::as_str)
                .unwrap_or_else(|| panic!("{} has no `name`", manifest_path.display()))
                .to_string();
            BuiltComponent {
                package: krate.package.clone(),
                name,
                wasm_path,
                manifest_path,
            }
        })
        .collect()
}

/// Prints `cargo:rerun-if-changed` for `path`.
fn rerun_if_changed(path: &Path) {
    println!("cargo:rerun-if-changed={}", absolute(path).display());
}

/// `path` made absolute and free of `..` where the file system allows.
fn absolute(path: &Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Whether the nested cargo should still see the variable `name`.
fn keep_variable(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return true;
    };
    const REMOVED: &[&str] = &[
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "RUSTC_LINKER",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "NUM_JOBS",
        "OPT_LEVEL",
        "DEBUG",
        "PROFILE",
    ];
    const KEPT_CARGO: &[&str] = &[
        "CARGO_HOME",
        "CARGO_MAKEFLAGS",
        "CARGO_LOG",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRY_",
        "CARGO_REGISTRIES_",
        "CARGO_SOURCE_",
        "CARGO_TERM_",
    ];
    if REMOVED.contains(&name) || name.starts_with("DEP_") || name.starts_with("__CARGO") {
        return false;
    }
    if name == "CARGO" || name.starts_with("CARGO_") {
        return KEPT_CARGO
            .iter()
            .any(|kept| name == *kept || (kept.ends_with('_') && name.starts_with(kept)));
    }
    true
}

/// Removes from `command` the variables that would alter or pollute the nested build.
fn clean_environment(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if !keep_variable(&name) {
            command.env_remove(&name);
        }
    }
}

/// Panics with instructions when the sysroot of the compiler lacks the guest target.
///
/// Skipped silently when the sysroot cannot be determined; the nested build's own error is
/// then recognised instead.
fn check_target_installed() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return;
    };
    if !output.status.success() {
        return;
    }
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let lib = Path::new(&sysroot)
        .join("lib")
        .join("rustlib")
        .join(GUEST_TARGET);
    if Path::new(&sysroot).is_dir() && !lib.is_dir() {
        panic!(
            "the {GUEST_TARGET} target is not installed for the toolchain at {sysroot}: \
             run `rustup target add {GUEST_TARGET}`"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_filter() {
        for removed in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
            "CARGO_PROFILE_RELEASE_DEBUG",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_FEATURE_STD",
            "CARGO_CFG_TARGET_OS",
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO",
            "RUSTC_WORKSPACE_WRAPPER",
            "OUT_DIR",
            "TARGET",
            "DEP_Z_INCLUDE",
            "__CARGO_FIX_PLZ",
        ] {
            assert!(
                !keep_variable(OsStr::new(removed)),
                "{removed} should be removed"
            );
        }
        for kept in [
            "PATH",
            "HOME",
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTUP_TOOLCHAIN",
            "CARGO_HOME",
            "CARGO_MAKEFLAGS",
            "CARGO_NET_OFFLINE",
            "CARGO_HTTP_TIMEOUT",
            "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
            "CARGO_TERM_COLOR",
        ] {
            assert!(keep_variable(OsStr::new(kept)), "{kept} should be kept");
        }
    }

    #[test]
    fn finds_this_workspace() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = find_workspace_root(here).expect("the crate is in a workspace");
        assert!(root.join("plugins").join("guest-build").is_dir());
    }

    #[test]
    fn include_expressions_escape_paths() {
        let built = BuiltComponent {
            package: "p".into(),
            name: "n".into(),
            wasm_path: PathBuf::from("/a \"b\"/c.wasm"),
            manifest_path: PathBuf::from("/a/keel.toml"),
        };
        assert_eq!(
            built.include_component_expr(),
            r#"include_bytes!("/a \"b\"/c.wasm")"#
        );
        assert_eq!(
            built.include_manifest_expr(),
            r#"include_str!("/a/keel.toml")"#
        );
    }
}
