//! `keel plugin …`: list, graph and check plugins.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keel_kernel::{
    Manifest, PluginState, check_imports, code_path, inspect_component, manifest_path,
};

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
    /// Validate a plugin's manifest and component without running it: ABI version, and that
    /// every import is covered by a requested capability.
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
                println!("{}", serde_json::to_string_pretty(&list)?);
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
                print!("{}", graph.to_dot(state_of));
            } else {
                println!("start order: {}", graph.start_order().join(", "));
                for (dependent, provider, service) in graph.edges() {
                    println!("{dependent} → {provider}  ({service})");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check {
            path,
            component,
            json,
        } => check(ctx, &path, component, json),
    }
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
        println!("{}", line.join("  ").trim_end());
    }
}

fn check(
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
    let problems = check_imports(&report, &manifest.capabilities);
    if json {
        println!(
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
        println!(
            "plugin {} {} ({})",
            manifest.name,
            manifest.version,
            code.display()
        );
        println!("ABI keel:plugin@{}", report.abi_version);
        println!("imports: {}", report.imports.join(", "));
        for p in &problems {
            println!("problem: {p}");
        }
        println!("{}", if problems.is_empty() { "ok" } else { "refused" });
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
