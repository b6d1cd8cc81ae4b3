//! keel plugin `review`: experience review, offline, started by a person (`keel review`).
//!
//! Service `review` 1.0.0 (payloads JSON):
//! - `run` (payload ignored) → `{"filed": [ID], "updated": [ID], "reopened": [ID],
//!   "logs": N, "skipped_lines": N}`: reads the newest session logs (at most
//!   [`MAX_LOGS`], [`MAX_LOG_BYTES`] each) and the verifier's ledger, and appends to the
//!   experience ledger what `keel_agent_kit::review::file` finds.
//! - `list` (`{"status": S}` or anything else for all) → `[Entry]`, newest change first.
//! - `show` (`{"id": ID}`) → `Entry`.
//! - `set` (`{"id": ID, "status": S, "note": TEXT}`) → `Entry`.
//!
//! The ledger (`/review/experience.jsonl`) is only ever appended to.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use keel_agent_kit::review::{self, Entry, LedgerOp};
use keel_sdk::{Plugin, services};
use serde_json::{Value, json};

const LEDGER: &str = "/review/experience.jsonl";
const SESSIONS: &str = "/sessions";
const VERDICTS: &str = "/verifier/verdicts.jsonl";
/// Session logs one review reads at most (the newest).
const MAX_LOGS: usize = 500;
/// Bytes of one log (or the verdict ledger) read at most.
const MAX_LOG_BYTES: usize = 32 << 20;

struct Review;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Up to [`MAX_LOG_BYTES`] of `path` as text, empty when it does not exist (a cut last line
/// is skipped by the parsers).
fn read(path: &Path) -> Result<String, String> {
    match keel_agent_kit::text::read_bounded(path, MAX_LOG_BYTES) {
        Ok((text, _)) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn ledger() -> Result<(BTreeMap<String, Entry>, usize), String> {
    Ok(review::fold(&read(Path::new(LEDGER))?))
}

fn append(ops: &[LedgerOp]) -> Result<(), String> {
    if ops.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    // A torn last line from an earlier crash must not swallow the first new one.
    let existing = read(Path::new(LEDGER))?;
    if !existing.is_empty() && !existing.ends_with('\n') {
        text.push('\n');
    }
    for op in ops {
        text.push_str(&serde_json::to_string(op).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LEDGER)
        .map_err(|e| format!("cannot open the experience ledger: {e}"))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("cannot append to the experience ledger: {e}"))
}

fn run() -> Result<Value, String> {
    let mut names: Vec<String> = std::fs::read_dir(SESSIONS)
        .map_err(|e| format!("cannot list the session logs: {e}"))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    // Session ids start with their time, so the name orders them.
    names.sort();
    let skip = names.len().saturating_sub(MAX_LOGS);
    let mut incidents = Vec::new();
    for name in &names[skip..] {
        let text = read(&Path::new(SESSIONS).join(name))?;
        incidents.extend(review::scan_log(name, &text));
    }
    incidents.extend(review::scan_verdicts(&read(Path::new(VERDICTS))?));
    let (entries, skipped) = ledger()?;
    let ops = review::file(&entries, &incidents, now_ms());
    append(&ops)?;
    let ids = |want: fn(&LedgerOp) -> Option<&str>| -> Vec<String> {
        let mut v: Vec<String> = ops.iter().filter_map(want).map(str::to_owned).collect();
        v.dedup();
        v
    };
    Ok(json!({
        "filed": ids(|op| match op { LedgerOp::Filed { entry, .. } => Some(entry.id.as_str()), _ => None }),
        "updated": ids(|op| match op { LedgerOp::Seen { id, .. } => Some(id.as_str()), _ => None }),
        "reopened": ids(|op| match op { LedgerOp::Status { id, .. } => Some(id.as_str()), _ => None }),
        "logs": names.len() - skip,
        "skipped_lines": skipped,
    }))
}

fn entry(entries: &BTreeMap<String, Entry>, id: &str) -> Result<Entry, String> {
    entries.get(id).cloned().ok_or_else(|| {
        format!("no entry `{id}` in the experience ledger; `keel review list` shows them")
    })
}

impl Plugin for Review {
    fn activate(_config: &str) -> Result<Self, String> {
        services::provide("review", "1.0.0")?;
        Ok(Review)
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != "review" {
            return Err(format!("no such service: {service}"));
        }
        let args: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
        let text = |key: &str| args[key].as_str().unwrap_or_default().to_owned();
        let answer = match method {
            "run" => run()?,
            "list" => {
                let (entries, _) = ledger()?;
                let status = text("status");
                let mut all: Vec<Entry> = entries
                    .into_values()
                    .filter(|e| status.is_empty() || e.status == status)
                    .collect();
                all.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then(a.id.cmp(&b.id)));
                serde_json::to_value(all).map_err(|e| e.to_string())?
            }
            "show" => serde_json::to_value(entry(&ledger()?.0, &text("id"))?)
                .map_err(|e| e.to_string())?,
            "set" => {
                let (id, status) = (text("id"), text("status"));
                if !review::STATUSES.contains(&status.as_str()) {
                    return Err(format!(
                        "status `{status}`: use one of {}",
                        review::STATUSES.join(", ")
                    ));
                }
                entry(&ledger()?.0, &id)?;
                let note: String = text("note").chars().take(400).collect();
                append(&[LedgerOp::Status {
                    at: now_ms(),
                    id: id.clone(),
                    status,
                    note,
                }])?;
                serde_json::to_value(entry(&ledger()?.0, &id)?).map_err(|e| e.to_string())?
            }
            other => {
                return Err(format!(
                    "the `review` service has no method `{other}`; it has run, list, show and set"
                ));
            }
        };
        serde_json::to_string(&answer).map_err(|e| e.to_string())
    }
}

keel_sdk::export_plugin!(Review);
