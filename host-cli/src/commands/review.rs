//! `keel review`: experience review through the `review` plugin, in a kernel of its own (no
//! model, no session): `keel review` files the recurring failures of the session logs and the
//! verdict ledger and lists what is open; `list`, `show` (with each evidence line read back
//! from its log) and `set ID STATUS` work the ledger.

use std::io::{BufRead as _, BufReader};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::config::Context;
use crate::session::terminal_safe;

#[derive(Args)]
pub struct ReviewArgs {
    #[command(subcommand)]
    cmd: Option<ReviewCommand>,
    /// JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// The ledger's entries: the open and in-progress ones, or all.
    List {
        /// Every entry, whatever its status.
        #[arg(long)]
        all: bool,
    },
    /// One entry, with its evidence read back from the logs.
    Show {
        /// The entry's id (`E…`).
        id: String,
    },
    /// Move an entry along its lifecycle: open, in-progress, resolved, accepted, wont-fix.
    Set {
        /// The entry's id.
        id: String,
        /// The new status.
        status: String,
        /// Why (kept with the entry).
        #[arg(long, default_value = "")]
        note: String,
    },
}

async fn call(ctx: &Context, method: &str, payload: Value) -> anyhow::Result<Value> {
    let kernel = crate::session::offline_kernel(ctx, &["review"]).await?;
    let answer = kernel
        .call_service("review", method, &payload.to_string())
        .await;
    let _ = kernel.shutdown().await;
    let answer = answer.map_err(|e| anyhow::anyhow!("{e}"))?;
    serde_json::from_str(&answer).context("the review plugin's answer is not JSON")
}

pub async fn run(ctx: &Context, args: ReviewArgs) -> anyhow::Result<ExitCode> {
    let json = args.json;
    match args.cmd {
        None => {
            let ran = call(ctx, "run", json!({})).await?;
            let open = open_entries(call(ctx, "list", json!({})).await?);
            if json {
                stdoutln!("{}", json!({ "run": ran, "open": open }));
            } else {
                let count = |k: &str| ran[k].as_array().map_or(0, Vec::len);
                stdoutln!(
                    "reviewed {} session logs: {} filed, {} with new evidence, {} reopened",
                    ran["logs"],
                    count("filed"),
                    count("updated"),
                    count("reopened")
                );
                print_list(&open);
            }
        }
        Some(ReviewCommand::List { all }) => {
            let entries = call(ctx, "list", json!({})).await?;
            let entries = if all { entries } else { open_entries(entries) };
            if json {
                stdoutln!("{entries}");
            } else {
                print_list(&entries);
            }
        }
        Some(ReviewCommand::Show { id }) => {
            let mut entry = call(ctx, "show", json!({ "id": id })).await?;
            let lines: Vec<Value> = entry["evidence"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|link| {
                    let link = link.as_str().unwrap_or_default();
                    match resolve(&ctx.data_dir(), link) {
                        Ok(line) => json!({ "link": link, "line": line }),
                        Err(e) => json!({ "link": link, "error": format!("{e:#}") }),
                    }
                })
                .collect();
            entry["resolved"] = Value::Array(lines);
            if json {
                stdoutln!("{entry}");
            } else {
                print_entry(&entry, &ctx.data_dir());
            }
        }
        Some(ReviewCommand::Set { id, status, note }) => {
            let entry = call(
                ctx,
                "set",
                json!({ "id": id, "status": status, "note": note }),
            )
            .await?;
            if json {
                stdoutln!("{entry}");
            } else {
                stdoutln!(
                    "{} is now {}",
                    terminal_safe(entry["id"].as_str().unwrap_or_default()),
                    terminal_safe(entry["status"].as_str().unwrap_or_default())
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn open_entries(entries: Value) -> Value {
    Value::Array(
        entries
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| matches!(e["status"].as_str(), Some("open" | "in-progress")))
            .collect(),
    )
}

fn print_list(entries: &Value) {
    let entries = entries.as_array().cloned().unwrap_or_default();
    if entries.is_empty() {
        stdoutln!("nothing recurring is open");
    }
    for e in &entries {
        let s = |k: &str| terminal_safe(e[k].as_str().unwrap_or_default());
        stdoutln!(
            "{}  {:<11} {:<6} {:<18} {}",
            s("id"),
            s("status"),
            s("severity"),
            s("bucket"),
            s("summary")
        );
    }
}

fn print_entry(e: &Value, data: &Path) {
    let s = |k: &str| terminal_safe(e[k].as_str().unwrap_or_default());
    stdoutln!("{}  {}", s("id"), s("summary"));
    stdoutln!("  bucket      {} ({})", s("bucket"), s("signature"));
    stdoutln!(
        "  status      {}{}",
        s("status"),
        if s("note").is_empty() {
            String::new()
        } else {
            format!(" — {}", s("note"))
        }
    );
    stdoutln!(
        "  severity    {}, confidence {}",
        s("severity"),
        e["confidence"]
    );
    stdoutln!("  owner       {}", s("owner"));
    stdoutln!("  evidence    (under {})", data.display());
    for r in e["resolved"].as_array().cloned().unwrap_or_default() {
        let link = terminal_safe(r["link"].as_str().unwrap_or_default());
        match r["line"].as_str() {
            Some(line) => stdoutln!("    {link}\n      {}", terminal_safe(line)),
            None => stdoutln!(
                "    {link}\n      (cannot read it: {})",
                terminal_safe(r["error"].as_str().unwrap_or_default())
            ),
        }
    }
}

/// The line an evidence link names (`sessions/ID.jsonl#L12`), cut at 300 characters. The
/// ledger is a plugin's file: a link may name only a file in keel's `sessions` or `verifier`
/// folder.
fn resolve(data: &Path, link: &str) -> anyhow::Result<String> {
    let (path, line) = link
        .rsplit_once("#L")
        .context("the link names no line (`#L12`)")?;
    let line: usize = line.parse().context("the link's line is not a number")?;
    let relative = PathBuf::from(path);
    let inside = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        && matches!(
            relative.components().next(),
            Some(Component::Normal(first)) if first == "sessions" || first == "verifier"
        );
    anyhow::ensure!(
        inside,
        "`{path}` is not a file of the session logs or the verdicts"
    );
    let file =
        std::fs::File::open(data.join(&relative)).with_context(|| format!("cannot open {path}"))?;
    let text = BufReader::new(file)
        .lines()
        .nth(line.checked_sub(1).context("lines count from 1")?)
        .with_context(|| format!("{path} has no line {line}"))??;
    Ok(text.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::resolve;

    /// The ledger is a plugin's file: its links may name only a line of the logs.
    #[test]
    fn an_evidence_link_resolves_only_inside_the_logs() -> anyhow::Result<()> {
        let data = tempfile::tempdir()?;
        std::fs::create_dir_all(data.path().join("sessions"))?;
        std::fs::write(data.path().join("sessions/s.jsonl"), "one\ntwo\n")?;
        std::fs::write(data.path().join("secret.txt"), "key\n")?;
        assert_eq!(resolve(data.path(), "sessions/s.jsonl#L2")?, "two");
        for bad in [
            "sessions/s.jsonl#L3",
            "sessions/s.jsonl#L0",
            "sessions/s.jsonl",
            "secret.txt#L1",
            "sessions/../secret.txt#L1",
            "/etc/passwd#L1",
        ] {
            assert!(resolve(data.path(), bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
