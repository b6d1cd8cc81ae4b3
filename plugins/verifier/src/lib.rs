//! keel plugin `verifier`: checks the success claims of a finished turn.
//!
//! For each claim in the turn's final text ("all tests pass", "the build succeeds") it finds
//! the turn's last verification-class `exec_shell` call of that dimension and replays it with
//! `agent.replay`. The kernel allows that only for an approved call that ran in the current
//! turn, with exactly its recorded input, so the verifier gains no authority of its own. A
//! claim with no such call is unsubstantiated. Every verdict is appended to the ledger
//! `/verifier/verdicts.jsonl` (the `verifier` folder of keel's data directory).
//!
//! Service `verifier` 1.0.0 (payloads JSON, types from `keel-protocol`):
//! - `verify` (`VerifyRequest`) → `Option<Verdict>`: `null` without claims, otherwise the
//!   most severe verdict of the turn (verified-fail > verify-error > unsubstantiated >
//!   verified-pass).
//! - `verify_all` (`VerifyRequest`) → `[Verdict]`, one per claimed dimension.
//! - `notice` (`Verdict`) → the text for the conversation tail.
//! - `verify` is served typed too (ABI 0.6.0's `verifier-service`), to callers of 0.6.0.
//! - `stats` (payload ignored) → `{"verified_pass", "verified_fail", "verify_error",
//!   "unsubstantiated", "skipped_lines", "total", "claim_match_rate"}` (rate `null` when
//!   nothing was checked).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use keel_agent_kit::claims;
use keel_protocol::{ToolOutcome, Verdict, VerdictStatus, VerifyRequest, services};
use keel_sdk::{KernelError, Plugin, agent, log, services as kernel_services};
use serde_json::json;

/// The verdict ledger.
const LEDGER: &str = "/verifier/verdicts.jsonl";

/// The plugin instance; it holds nothing itself.
struct Verifier;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode the answer: {e}"))
}

/// How bad a verdict is, for picking the one `verify` returns.
fn severity(status: VerdictStatus) -> u8 {
    match status {
        VerdictStatus::VerifiedPass => 0,
        VerdictStatus::Unsubstantiated => 1,
        VerdictStatus::VerifyError => 2,
        VerdictStatus::VerifiedFail => 3,
    }
}

/// The verdicts of a turn, one per claimed dimension, appended to the ledger.
fn verify_all(request: &VerifyRequest) -> Vec<Verdict> {
    let mut replays: BTreeMap<String, Result<ToolOutcome, String>> = BTreeMap::new();
    let mut verdicts = Vec::new();
    for claim in claims::detect_claims(&request.final_text) {
        let Some(call) = claims::find_replay(&request.calls, claim.dimension) else {
            verdicts.push(claims::unsubstantiated(&claim));
            continue;
        };
        // One replay per call, even when it backs two claims.
        let replay = replays
            .entry(call.call_id.clone())
            .or_insert_with(|| replay(&call.call_id));
        let verdict = match replay {
            Ok(outcome) => claims::judge(&claim, call, outcome),
            Err(reason) => Verdict {
                status: VerdictStatus::VerifyError,
                dimension: claim.dimension.as_str().into(),
                claim: claim.phrase.clone(),
                command: claims::call_command(call).map(str::to_string),
                call_id: Some(call.call_id.clone()),
                exit_code: None,
                evidence: claims::evidence(reason),
                failure_type: Some("refused".into()),
            },
        };
        verdicts.push(verdict);
    }
    let time = now_ms();
    for verdict in &verdicts {
        if let Err(e) = claims::append_verdict(Path::new(LEDGER), time, &request.session, verdict) {
            // The verdict still reaches the caller; only the statistics miss it.
            log::error(&format!("verdict not written to the ledger: {e}"));
        }
    }
    verdicts
}

/// Replay `call_id` through the kernel's typed door (ABI 0.7.0); a refusal comes back as its
/// message.
fn replay(call_id: &str) -> Result<ToolOutcome, String> {
    agent::replay_outcome(call_id)
        .map(keel_sdk_protocol::outcome_from_wit)
        .map_err(|e: KernelError| format!("the kernel refused the replay: {e}"))
}

/// The most severe verdict of a turn; among equals, the first claimed.
fn worst(request: &VerifyRequest) -> Option<Verdict> {
    verify_all(request)
        .into_iter()
        .enumerate()
        .max_by_key(|(i, v)| (severity(v.status), std::cmp::Reverse(*i)))
        .map(|(_, v)| v)
}

impl Plugin for Verifier {
    fn activate(_config: &str) -> Result<Self, String> {
        kernel_services::provide(services::VERIFIER, "1.0.0")?;
        Ok(Verifier)
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != services::VERIFIER {
            return Err(format!("no such service: {service}"));
        }
        let request = || -> Result<VerifyRequest, String> {
            serde_json::from_str(payload)
                .map_err(|e| format!("{method}: the payload is not a VerifyRequest ({e})"))
        };
        match method {
            "verify" => to_json(&worst(&request()?)),
            "verify_all" => to_json(&verify_all(&request()?)),
            "notice" => {
                let verdict: Verdict = serde_json::from_str(payload)
                    .map_err(|e| format!("notice: the payload is not a Verdict ({e})"))?;
                to_json(&claims::verdict_notice(&verdict))
            }
            "stats" => {
                let bytes = match std::fs::read(LEDGER) {
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(format!("cannot read the verdict ledger: {e}")),
                };
                let s = claims::stats_from_ledger(&bytes);
                to_json(&json!({
                    "verified_pass": s.verified_pass,
                    "verified_fail": s.verified_fail,
                    "verify_error": s.verify_error,
                    "unsubstantiated": s.unsubstantiated,
                    "skipped_lines": s.skipped_lines,
                    "total": s.total(),
                    "claim_match_rate": s.claim_match_rate(),
                }))
            }
            other => Err(format!(
                "verifier has no method `{other}`; the methods are verify, verify_all, notice and stats"
            )),
        }
    }
}

keel_sdk::export_plugin!(Verifier);

#[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
mod typed {
    wit_bindgen::generate!({
        path: [
            "../../wit/keel-plugin-0.2.0",
            "../../wit/keel-plugin-0.3.0",
            "../../wit/keel-plugin-0.4.0",
            "../../wit/keel-plugin-0.5.0",
            "../../wit/keel-plugin-0.6.0",
        ],
        world: "keel:plugin/verifier-service@0.6.0",
        with: {
            "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
            "keel:plugin/verifier-types@0.6.0": keel_sdk::bindings::keel::plugin0_6_0::verifier_types,
        },
    });
}

struct TypedVerifier;

impl typed::exports::keel::plugin0_6_0::verifier::Guest for TypedVerifier {
    fn verify(
        request: keel_sdk::verifier::VerifyRequest,
    ) -> Result<
        Option<keel_sdk::verifier::Verdict>,
        keel_sdk::bindings::keel::plugin0_2_0::types::KernelError,
    > {
        let request = keel_sdk_protocol::verify_request_from_wit(request);
        Ok(worst(&request).map(keel_sdk_protocol::verdict_to_wit))
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedVerifier with_types_in typed);
};
