//! `keel plugin …`: list, graph and check plugins.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use keel_kernel::{
    Manifest, PluginState, check_declarations, check_imports, check_instantiation, code_path,
    inspect_component, manifest_path,
};

use super::plugin_python;
use super::plugin_sdk;
use super::plugin_template::{self, Kind};
use crate::config::Context;
use crate::runtime::Runtime;

#[derive(Subcommand)]
pub enum PluginCommand {
    /// List the plugins of a session: name, version, kind, state, what each provides and what
    /// it waits for.
    List {
        /// One JSON array on stdout.
        #[arg(long)]
        json: bool,
        /// Also load the plugin at PATH (a directory with keel.toml). Repeatable.
        #[arg(long = "plugin", value_name = "PATH")]
        plugins: Vec<PathBuf>,
    },
    /// Show the dependency graph (an edge points from a plugin to the provider it requires).
    Graph {
        /// Graphviz dot text (`keel plugin graph --dot | dot -Tsvg > graph.svg`).
        #[arg(long)]
        dot: bool,
        /// Also load the plugin at PATH. Repeatable.
        #[arg(long = "plugin", value_name = "PATH")]
        plugins: Vec<PathBuf>,
    },
    /// Create a plugin crate from an exemplar: manifest, SDK usage, one native test. It builds
    /// to a component with `keel plugin build`.
    New {
        /// The plugin's name, `[a-z][a-z0-9-]*`.
        name: String,
        /// What to start from.
        #[arg(long, value_enum, default_value = "tool")]
        kind: Kind,
        /// Where to create it (default `./NAME`); must not exist.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// A keel-sdk crate to depend on by path (default: the SDK this keel carries, vendored
        /// into the new crate with the WIT and a lockfile).
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
        /// The language to write it in: Rust (every kind), or Python (a tool plugin, built
        /// with componentize-py).
        #[arg(long, value_enum, default_value = "rust")]
        lang: plugin_python::Lang,
    },
    /// Call a plugin's tools and services in a real kernel with inputs from a file, print
    /// the results and check what the file expects (exit 1 if anything differs).
    Test {
        /// The plugin directory (with keel.toml and its built component).
        #[arg(default_value = ".")]
        path: PathBuf,
        /// The calls file (default PATH/keel-test.toml).
        #[arg(long, value_name = "FILE")]
        calls: Option<PathBuf>,
    },
    /// Build a plugin crate to a component (`cargo build --release --target wasm32-wasip2`),
    /// put it where its manifest's `component` points, and check it as `keel plugin check`
    /// does.
    Build {
        /// The plugin crate (with Cargo.toml and keel.toml).
        #[arg(default_value = ".")]
        path: PathBuf,
        /// The check's result as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Validate a plugin's manifest and component without activating it: ABI version, that
    /// every import is covered by a requested capability, that an instance can be made (every
    /// export of keel's types), and that the component was built as the manifest's version.
    Check {
        /// A plugin directory (with keel.toml) or a manifest file.
        path: PathBuf,
        /// The component to check, if not where the manifest says.
        #[arg(long, value_name = "FILE")]
        component: Option<PathBuf>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(ctx: &Context, cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCommand::List { json, plugins } => {
            let rt = Runtime::with_plugins(ctx, &plugins).await?;
            let list = rt.list();
            if json {
                stdoutln!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_table(&list);
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Graph { dot, plugins } => {
            let rt = Runtime::with_plugins(ctx, &plugins).await?;
            let graph = rt.kernel.graph()?;
            let list = rt.list();
            let state_of = |name: &str| {
                list.iter()
                    .find(|s| s.name == name)
                    .map(|s| format!("{} {}", s.version, s.state.name()))
                    .unwrap_or_default()
            };
            if dot {
                stdout!("{}", graph.to_dot(state_of));
            } else {
                stdoutln!("start order: {}", graph.start_order().join(", "));
                for (dependent, provider, service) in graph.edges() {
                    stdoutln!("{dependent} → {provider}  ({service})");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check {
            path,
            component,
            json,
        } => check(ctx, &path, component, json).await,
        PluginCommand::New {
            name,
            kind,
            dir,
            sdk,
            lang,
        } => new_plugin(&name, kind, dir, sdk, lang),
        PluginCommand::Build { path, json } => build(ctx, &path, json).await,
        PluginCommand::Test { path, calls } => super::plugin_test::run(ctx, &path, calls).await,
    }
}

fn new_plugin(
    name: &str,
    kind: Kind,
    dir: Option<PathBuf>,
    sdk: Option<PathBuf>,
    lang: plugin_python::Lang,
) -> anyhow::Result<ExitCode> {
    if !keel_kernel::is_valid_plugin_name(name) {
        bail!(
            "`{name}` is not a valid plugin name; use lowercase letters, digits and `-`, starting with a letter (e.g. `word-count`)"
        );
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists()
        && dir
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "`{}` already exists and is not empty; choose another place with --dir DIR",
            dir.display()
        );
    }
    // By default the SDK, the WIT and the lockfile keel carries are vendored into the crate;
    // `--sdk PATH` points at another keel-sdk crate instead (keel's own sources, say).
    let mut files = match (lang, sdk) {
        (plugin_python::Lang::Python, _) => plugin_python::template(name, kind)?,
        (plugin_python::Lang::Rust, None) => {
            let mut files = plugin_template::render(name, kind, "vendor/keel-sdk");
            files.extend(plugin_sdk::vendored_files()?);
            files
        }
        (plugin_python::Lang::Rust, Some(sdk)) => {
            let sdk = sdk
                .canonicalize()
                .with_context(|| format!("cannot find keel-sdk at `{}`", sdk.display()))?;
            if !sdk.join("Cargo.toml").is_file() {
                bail!(
                    "`{}` is not the keel-sdk crate (no Cargo.toml); pass --sdk PATH, or leave \
                     it out to use the SDK this keel carries",
                    sdk.display()
                );
            }
            plugin_template::render(name, kind, &sdk.display().to_string())
        }
    };
    // The plugin ABI, for reference (and for the vendored SDK, which binds it).
    files.extend(plugin_sdk::wit_files());
    for (rel, text) in files {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create `{}`", parent.display()))?;
        }
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
    }
    stdoutln!(
        "created {} plugin `{name}` in {}",
        format!("{kind:?}").to_lowercase(),
        dir.display()
    );
    let next = match lang {
        plugin_python::Lang::Rust => "cargo test && keel plugin build",
        plugin_python::Lang::Python => "keel plugin build && keel plugin test",
    };
    stdoutln!("next: cd {} && {next}", dir.display());
    Ok(ExitCode::SUCCESS)
}

async fn build(ctx: &Context, path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let (file, component) = build_component(path)?;
    if !json {
        stderrln!("built {}", component.display());
    }
    check(ctx, &file, Some(component), json).await
}

/// Build the plugin crate at `path` to its component (`cargo build --release --target
/// wasm32-wasip2`, the compiler's messages on stderr) and put it where its manifest points;
/// the manifest's path and the component's.
pub(crate) fn build_component(path: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    build_component_in(path, None)
}

/// [`build_component`], with `sandbox` inside keel's sandbox: the crate's directory the only
/// thing writable (its `target/` there), offline, a scrubbed environment, so a `build.rs`, a
/// proc macro or a `.cargo/config.toml` someone else wrote reaches nothing of the person's
/// (`keel dev`). A Python plugin is not built that way and is refused.
pub(crate) fn build_component_in(
    path: &Path,
    sandbox: Option<&keel_kernel::sandbox::SandboxConfig>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let file = manifest_path(path);
    let dir = file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let manifest = Manifest::load(&file)?;
    let cargo_toml = dir.join("Cargo.toml");
    if !cargo_toml.is_file() && dir.join(plugin_python::APP).is_file() {
        if sandbox.is_some() {
            bail!(
                "keel does not rebuild a Python plugin inside its sandbox; build it yourself with \
                 `keel plugin build {}` once you have read the change, then `/reload {}`",
                dir.display(),
                manifest.name
            );
        }
        let component = code_path(&file, &manifest);
        plugin_python::build(&dir, &manifest, &component)?;
        return Ok((file, component));
    }
    if !cargo_toml.is_file() {
        bail!(
            "`{}` has no Cargo.toml; `keel plugin build` builds a plugin crate (create one with `keel plugin new NAME`)",
            dir.display()
        );
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut argv: Vec<std::ffi::OsString> = vec![
        cargo,
        "build".into(),
        "--release".into(),
        "--target".into(),
        "wasm32-wasip2".into(),
        "--message-format=json-render-diagnostics".into(),
        "--manifest-path".into(),
        cargo_toml.clone().into(),
    ];
    // Where the build's output must be: a confined build writes only inside the crate, or in
    // the target directory keel itself was started with (`CARGO_TARGET_DIR`: the person's
    // choice, never the crate's `.cargo/config.toml`, which the variable overrides).
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if sandbox.is_some() && !t.is_empty() => {
            let t = PathBuf::from(t);
            std::fs::create_dir_all(&t)
                .with_context(|| format!("cannot make the target directory `{}`", t.display()))?;
            t.canonicalize()?
        }
        _ => dir.join("target"),
    };
    let mut command = match sandbox {
        None => {
            let mut command = std::process::Command::new(&argv[0]);
            command.args(&argv[1..]);
            command
        }
        Some(config) => {
            argv.push("--offline".into());
            let argv: Vec<String> = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let dir = dir
                .canonicalize()
                .with_context(|| format!("cannot find `{}`", dir.display()))?;
            std::fs::create_dir_all(&target_dir)?;
            let target = target_dir.canonicalize()?;
            let build = keel_kernel::sandbox::confined_build(config, &dir, &target, &argv)
                .map_err(|why| {
                    anyhow::anyhow!(
                        "not building `{}` outside keel's sandbox ({why}): its build scripts could \
                     have been written by the model. Read the change, then build it yourself \
                     with `keel plugin build {}` and `/reload {}`",
                        manifest.name,
                        dir.display(),
                        manifest.name
                    )
                })?;
            let mut command = std::process::Command::new(build.program);
            command
                .args(build.args)
                .env_clear()
                .envs(build.env)
                .env("CARGO_TARGET_DIR", &target_dir)
                .env("CARGO_NET_OFFLINE", "true");
            command
        }
    };
    let mut child = command
        // Flags meant for another build (clippy's wrapper, a host target) must not leak in.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run cargo; is the Rust toolchain installed?")?;
    let mut artifact = None;
    if let Some(stdout) = child.stdout.take() {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let is_cdylib = msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
            let wasm = msg["filenames"].as_array().and_then(|f| {
                f.iter()
                    .filter_map(|f| f.as_str())
                    .find(|f| f.ends_with(".wasm"))
            });
            if let (true, Some(wasm)) = (msg["reason"] == "compiler-artifact" && is_cdylib, wasm) {
                artifact = Some(PathBuf::from(wasm));
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "cargo build failed ({status}); fix the errors above and run `keel plugin build` again (the target is installed with `rustup target add wasm32-wasip2`)"
        );
    }
    let Some(artifact) = artifact else {
        bail!(
            "cargo built no WebAssembly component; the crate needs `crate-type = [\"cdylib\"]` under [lib]"
        );
    };
    // A confined build's output names its artifact; it is copied only from the crate's own
    // target directory, never from wherever a hostile build said.
    if sandbox.is_some() {
        let canonical = artifact.canonicalize().ok();
        let inside = target_dir.canonicalize().ok();
        if !matches!((&canonical, &inside), (Some(a), Some(t)) if a.starts_with(t)) {
            bail!(
                "the build named `{}` as its component, which is not inside `{}`; nothing was \
                 swapped in",
                artifact.display(),
                target_dir.display()
            );
        }
    }
    let component = code_path(&file, &manifest);
    if let Some(parent) = component.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(&artifact, &component).with_context(|| {
        format!(
            "cannot copy `{}` to `{}`",
            artifact.display(),
            component.display()
        )
    })?;
    Ok((file, component))
}

fn print_table(list: &[keel_kernel::PluginStatus]) {
    let rows: Vec<[String; 6]> = list
        .iter()
        .map(|s| {
            let note = match &s.state {
                PluginState::Pending { waiting_for } => {
                    format!("waits for {}", waiting_for.join("; "))
                }
                PluginState::Failed { reason } => reason.clone(),
                _ => String::new(),
            };
            [
                s.name.clone(),
                s.version.to_string(),
                s.kind.to_string(),
                s.state.name().to_owned(),
                s.provides.join(", "),
                note,
            ]
        })
        .collect();
    let header = ["NAME", "VERSION", "KIND", "STATE", "PROVIDES", "NOTE"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        stdoutln!("{}", line.join("  ").trim_end());
    }
}

async fn check(
    ctx: &Context,
    path: &std::path::Path,
    component: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let file = manifest_path(path);
    let manifest = Manifest::load(&file)?;
    let code = component.unwrap_or_else(|| code_path(&file, &manifest));
    if manifest.kind == keel_kernel::PluginKind::Native {
        anyhow::bail!(
            "`{}` is a native plugin; keel can only check WebAssembly components (native plugins run with full trust)",
            manifest.name
        );
    }
    let bytes = std::fs::read(&code).with_context(|| {
        format!(
            "cannot read component `{}`; build the plugin first, or pass --component FILE",
            code.display()
        )
    })?;
    let rt = Runtime::new(ctx)?;
    let report = inspect_component(rt.loader.wasm(), &manifest.name, &bytes)?;
    let mut problems = check_imports(&report, &manifest.capabilities);
    problems.extend(check_declarations(&report, &manifest));
    // An export's types are checked only when an instance loads it: make one (nothing granted,
    // nothing activated), so an export of another shape is found here, not at load.
    if report.link_error.is_none()
        && let Err(e) = check_instantiation(rt.loader.wasm(), &manifest.name, &bytes).await
    {
        problems.push(format!("the component would not start: {e}"));
    }
    let built_as = keel_registry::component_version(&bytes);
    match &built_as {
        Ok(Some(v)) if *v == manifest.version => {}
        Ok(Some(v)) => problems.push(format!(
            "keel.toml says version {}, but the component was built as version {v}; make `version` in keel.toml and Cargo.toml equal and rebuild",
            manifest.version
        )),
        Ok(None) => problems.push(format!(
            "the component does not declare its version (custom section `{}`); build it with keel-sdk, whose `export_plugin!` records the crate's version",
            keel_registry::VERSION_SECTION
        )),
        Err(e) => problems.push(e.clone()),
    }
    if json {
        stdoutln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "plugin": manifest.name,
                "version": manifest.version.to_string(),
                "abi": report.abi_version.to_string(),
                "imports": report.imports,
                "problems": problems,
                "ok": problems.is_empty(),
            }))?
        );
    } else {
        stdoutln!(
            "plugin {} {} ({})",
            manifest.name,
            manifest.version,
            code.display()
        );
        stdoutln!("ABI keel:plugin@{}", report.abi_version);
        stdoutln!("imports: {}", report.imports.join(", "));
        // A problem may quote the component or the manifest (names, a runtime's error).
        for p in &problems {
            stdoutln!("problem: {}", crate::session::terminal_safe(p));
        }
        stdoutln!("{}", if problems.is_empty() { "ok" } else { "refused" });
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
