//! Experience review: recurring failures found in the session logs and the verdict ledger,
//! filed as entries of an experience ledger with a lifecycle. Pure functions over the files'
//! contents; the `review` plugin reads and appends.
//!
//! What counts, by bucket: `loop-guard` (a call blocked or a turn stopped by the loop guard),
//! `refused-command` (the exec policy refused a command; keyed by its program),
//! `approval-denied` (the person or the approval mode said no; keyed by program or tool),
//! `verify-fail`
//! (a claim the verifier replayed and saw fail; keyed by dimension and command),
//! `interrupted-stream` (a model stream broke off), `model-error`, `tool-error` (keyed by
//! tool). A failure is filed once it happened twice (in one session or across sessions).
//!
//! The ledger is append-only JSONL (`LedgerOp` a line): filing, new evidence and status
//! changes are appended, never rewritten; a torn last line is skipped when it is read.
//! Evidence links name a line of a file under keel's data directory, `sessions/ID.jsonl#L12`
//! or `verifier/verdicts.jsonl#L3` (1-based), so they resolve with any text tool.

use std::collections::{BTreeMap, BTreeSet};

use keel_protocol::{LogLine, OutcomeStatus, SessionEvent, TurnEnd, VerdictStatus};
use serde::{Deserialize, Serialize};

/// Evidence links kept per entry at most (the count goes on).
pub const MAX_EVIDENCE: usize = 20;
/// How often a failure must happen before it is filed.
pub const RECURS_AT: usize = 2;

/// The lifecycle of an entry.
pub const STATUSES: &[&str] = &["open", "in-progress", "resolved", "accepted", "wont-fix"];

/// One failure seen in a log or the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    /// Its bucket.
    pub bucket: &'static str,
    /// What recurs within the bucket (a program, a tool, a model).
    pub signature: String,
    /// The session it happened in.
    pub session: String,
    /// Where: `sessions/ID.jsonl#L12`.
    pub link: String,
}

/// An entry of the experience ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Stable for its bucket and signature.
    pub id: String,
    /// Its bucket.
    pub bucket: String,
    /// What recurs.
    pub signature: String,
    /// One line for a person.
    pub summary: String,
    /// `high`, `medium` or `low`.
    pub severity: String,
    /// How sure the review is that this recurs (0 to 0.95).
    pub confidence: f64,
    /// Who would fix it.
    pub owner: String,
    /// Where it happened (at most [`MAX_EVIDENCE`]).
    pub evidence: Vec<String>,
    /// How often it happened.
    pub count: usize,
    /// In how many sessions.
    pub sessions: usize,
    /// `open`, `in-progress`, `resolved`, `accepted` or `wont-fix`.
    pub status: String,
    /// The last status change's note.
    #[serde(default)]
    pub note: String,
    /// When it was filed (ms since the epoch).
    pub filed_ms: u64,
    /// When it last changed.
    pub updated_ms: u64,
}

/// A line of the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum LedgerOp {
    /// A new entry.
    Filed {
        /// When.
        at: u64,
        /// The entry as filed.
        entry: Entry,
    },
    /// More evidence of an entry.
    Seen {
        /// When.
        at: u64,
        /// Its id.
        id: String,
        /// The new links.
        evidence: Vec<String>,
        /// Its count and sessions now.
        count: usize,
        /// In how many sessions now.
        sessions: usize,
        /// Its confidence now.
        confidence: f64,
    },
    /// A status change.
    Status {
        /// When.
        at: u64,
        /// Its id.
        id: String,
        /// The new status.
        status: String,
        /// Why.
        #[serde(default)]
        note: String,
    },
}

/// The ledger folded from its lines: entries by id, and how many lines were unreadable.
pub fn fold(text: &str) -> (BTreeMap<String, Entry>, usize) {
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let mut skipped = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<LedgerOp>(line) {
            Ok(op) => apply(&mut entries, op),
            Err(_) => skipped += 1,
        }
    }
    (entries, skipped)
}

fn apply(entries: &mut BTreeMap<String, Entry>, op: LedgerOp) {
    match op {
        LedgerOp::Filed { entry, .. } => {
            entries.entry(entry.id.clone()).or_insert(entry);
        }
        LedgerOp::Seen {
            at,
            id,
            evidence,
            count,
            sessions,
            confidence,
        } => {
            if let Some(e) = entries.get_mut(&id) {
                for link in evidence {
                    if e.evidence.len() < MAX_EVIDENCE && !e.evidence.contains(&link) {
                        e.evidence.push(link);
                    }
                }
                e.count = count;
                e.sessions = sessions;
                e.confidence = confidence;
                e.summary = summary(&e.bucket, &e.signature, count, sessions);
                e.updated_ms = at;
            }
        }
        LedgerOp::Status {
            at,
            id,
            status,
            note,
        } => {
            if let Some(e) = entries.get_mut(&id) {
                e.status = status;
                e.note = note;
                e.updated_ms = at;
            }
        }
    }
}

/// The program a refused command line starts with, from the refusal's text.
fn refused_program(content: &str) -> Option<String> {
    let start = content.find('`')? + 1;
    let rest = content.get(start..)?;
    let end = rest.find("` is refused")?;
    let program = rest.get(..end)?.split_whitespace().next()?;
    Some(program.chars().take(64).collect())
}

/// The incidents in a session log (`name` is its file name in the `sessions` folder).
pub fn scan_log(name: &str, text: &str) -> Vec<Incident> {
    let mut out = Vec::new();
    let mut model = String::from("the model");
    for (i, line) in text.lines().enumerate() {
        let Ok(entry) = serde_json::from_str::<LogLine>(line) else {
            continue;
        };
        let link = format!("sessions/{name}#L{}", i + 1);
        let session = entry.event.session().to_owned();
        let mut push = |bucket: &'static str, signature: String| {
            out.push(Incident {
                bucket,
                signature,
                session: session.clone(),
                link: link.clone(),
            });
        };
        match entry.event {
            SessionEvent::SessionStarted { model: m, .. } => model = m,
            SessionEvent::ToolOutcome { outcome, .. } => match outcome.status {
                OutcomeStatus::Refused if outcome.content.contains("by the loop guard") => {
                    push("loop-guard", outcome.tool)
                }
                OutcomeStatus::Refused => {
                    // `CMD` is refused: forbid: … (the policy) or: prompt: … (it needed an
                    // approval the mode or the person did not give).
                    if let Some(program) = refused_program(&outcome.content) {
                        if outcome.content.contains("` is refused: forbid") {
                            push("refused-command", program);
                        } else {
                            push("approval-denied", program);
                        }
                    } else if outcome.content.contains(" did not run: ") {
                        push("approval-denied", outcome.tool);
                    } else {
                        push("refused-command", outcome.tool);
                    }
                }
                OutcomeStatus::Error => push("tool-error", outcome.tool),
                OutcomeStatus::Ok | OutcomeStatus::NotExecuted => {}
            },
            SessionEvent::TurnEnded { end, .. } => match end {
                TurnEnd::LoopGuard => push("loop-guard", "turn stopped".into()),
                TurnEnd::Interrupted => push("interrupted-stream", model.clone()),
                TurnEnd::ModelError => push("model-error", model.clone()),
                _ => {}
            },
            _ => {}
        }
    }
    out
}

/// The verify-fail incidents in the verifier's ledger (`verdicts.jsonl`).
pub fn scan_verdicts(text: &str) -> Vec<Incident> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let verdict = v.get("verdict").unwrap_or(&v);
        let Ok(status) = serde_json::from_value::<VerdictStatus>(verdict["status"].clone()) else {
            continue;
        };
        if status != VerdictStatus::VerifiedFail {
            continue;
        }
        let dimension = verdict["dimension"].as_str().unwrap_or("claim");
        let command = verdict["command"].as_str().unwrap_or("?");
        out.push(Incident {
            bucket: "verify-fail",
            signature: format!(
                "{dimension}: {}",
                command.chars().take(80).collect::<String>()
            ),
            session: v["session"].as_str().unwrap_or_default().to_owned(),
            link: format!("verifier/verdicts.jsonl#L{}", i + 1),
        });
    }
    out
}

fn severity(bucket: &str) -> &'static str {
    match bucket {
        "verify-fail" | "loop-guard" => "high",
        "approval-denied" => "low",
        _ => "medium",
    }
}

fn owner(bucket: &str, signature: &str) -> String {
    match bucket {
        "loop-guard" => "agent-loop (how the model recovers from failures)".into(),
        "refused-command" => "exec policy: your [exec] rules, or the model's habits".into(),
        "approval-denied" => "approvals: the model keeps asking for what you refuse".into(),
        "verify-fail" => "the project's tests or build, as the verifier ran them".into(),
        "interrupted-stream" | "model-error" => format!("model adapter ({signature})"),
        _ => format!("the plugin providing `{signature}`"),
    }
}

fn summary(bucket: &str, signature: &str, count: usize, sessions: usize) -> String {
    let what = match bucket {
        "loop-guard" if signature == "turn stopped" => {
            "turns stopped by the loop guard after repeated failures".to_owned()
        }
        "loop-guard" => format!("`{signature}` calls blocked by the loop guard"),
        "refused-command" => format!("`{signature}` commands refused by the exec policy"),
        "approval-denied" => format!("`{signature}` calls not approved"),
        "verify-fail" => format!("claims that failed when replayed ({signature})"),
        "interrupted-stream" => format!("model streams from {signature} that broke off"),
        "model-error" => format!("turns ended by errors from {signature}"),
        _ => format!("`{signature}` calls that failed"),
    };
    format!("{what}: {count} times in {sessions} session(s)")
}

fn confidence(count: usize, sessions: usize) -> f64 {
    let c = 0.5
        + 0.05 * (count.saturating_sub(RECURS_AT) as f64)
        + 0.15 * (sessions.saturating_sub(1) as f64);
    (c.min(0.95) * 100.0).round() / 100.0
}

/// A stable id for a bucket and signature: `E` and eight hex digits (FNV-1a).
pub fn entry_id(bucket: &str, signature: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bucket.bytes().chain([0]).chain(signature.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("E{:08x}", h >> 32)
}

/// The lines to append to the ledger for `incidents`: a new entry for each failure that
/// recurs and was not filed, new evidence for one that was, and a reopening of a resolved
/// entry that happened again.
pub fn file(entries: &BTreeMap<String, Entry>, incidents: &[Incident], now: u64) -> Vec<LedgerOp> {
    let mut groups: BTreeMap<(&str, &str), Vec<&Incident>> = BTreeMap::new();
    for i in incidents {
        groups
            .entry((i.bucket, i.signature.as_str()))
            .or_default()
            .push(i);
    }
    let mut ops = Vec::new();
    for ((bucket, signature), seen) in groups {
        let links: Vec<String> = seen.iter().map(|i| i.link.clone()).collect();
        let sessions: BTreeSet<&str> = seen.iter().map(|i| i.session.as_str()).collect();
        let id = entry_id(bucket, signature);
        match entries.get(&id) {
            None if seen.len() >= RECURS_AT => ops.push(LedgerOp::Filed {
                at: now,
                entry: Entry {
                    id,
                    bucket: bucket.into(),
                    signature: signature.into(),
                    summary: summary(bucket, signature, seen.len(), sessions.len()),
                    severity: severity(bucket).into(),
                    confidence: confidence(seen.len(), sessions.len()),
                    owner: owner(bucket, signature),
                    evidence: links.into_iter().take(MAX_EVIDENCE).collect(),
                    count: seen.len(),
                    sessions: sessions.len(),
                    status: "open".into(),
                    note: String::new(),
                    filed_ms: now,
                    updated_ms: now,
                },
            }),
            None => {}
            Some(entry) => {
                // Each run reads every log again: only links not seen before are new.
                let new: Vec<String> = links
                    .into_iter()
                    .filter(|l| !entry.evidence.contains(l))
                    .collect();
                if new.is_empty()
                    || entry.evidence.len() >= MAX_EVIDENCE && entry.count >= seen.len()
                {
                    continue;
                }
                let count = seen.len().max(entry.count);
                let sessions = sessions.len().max(entry.sessions);
                ops.push(LedgerOp::Seen {
                    at: now,
                    id: id.clone(),
                    evidence: new,
                    count,
                    sessions,
                    confidence: confidence(count, sessions),
                });
                if entry.status == "resolved" {
                    ops.push(LedgerOp::Status {
                        at: now,
                        id,
                        status: "open".into(),
                        note: "it happened again after it was resolved".into(),
                    });
                }
            }
        }
    }
    ops
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
