//! The gates of a session wired from its settings: the exec policy under `--approval`, the
//! approver (the terminal, or the policy when there is none), the stored grants, the network
//! gate with its audit log, and the sandbox.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use keel_kernel::gates::approvals::{
    Answer, ApprovalRequest, Approver, GrantStore, PolicyApprover,
};
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{GateConfig, NetConfig};

use crate::config::Context;
use crate::settings::{self, ModelChoice};

/// The sealed gates of a session of `ctx`, `approval` overriding the config's.
pub(crate) fn gate_config(
    ctx: &Context,
    choice: &ModelChoice,
    approval: Option<ApprovalMode>,
) -> anyhow::Result<GateConfig> {
    let mut policy = settings::load_policy(ctx)?;
    if let Some(mode) = approval {
        policy = policy.with_approval(mode);
    }
    let approver = approver_for(policy.approval());
    let grants = match GrantStore::open(&ctx.grants_file(), &ctx.workspace) {
        Ok((store, warnings)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            Some(store)
        }
        Err(e) => {
            eprintln!("warning: approvals will not be remembered across sessions: {e}");
            None
        }
    };
    Ok(GateConfig {
        workspace: Some(ctx.workspace.clone()),
        exec_policy: policy,
        approver,
        grants,
        network: NetConfig {
            policy: settings::network_policy(ctx, choice)?,
            secrets: settings::secrets(ctx),
            audit_log: Some(ctx.audit_log()),
        },
        guard_timeout: std::time::Duration::from_secs(2),
        sandbox: settings::sandbox_config(ctx)?,
    })
}

/// Asks on the terminal: once, for the session, always, or deny.
struct TerminalApprover;

impl Approver for TerminalApprover {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        let mut err = std::io::stderr();
        let always = if request.can_always {
            " / [a]lways"
        } else {
            ""
        };
        let _ = writeln!(
            err,
            "\n? {} wants to run: {}\n  why: {}\n  [y]es once / [s]ession{always} / [n]o: ",
            request.tool, request.summary, request.reason
        );
        let _ = err.flush();
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).is_err() {
            return Answer::Deny;
        }
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Answer::Once,
            "s" | "session" => Answer::Session,
            "a" | "always" if request.can_always => Answer::Always,
            _ => Answer::Deny,
        }
    }
}

fn approver_for(mode: ApprovalMode) -> Arc<dyn Approver> {
    match mode {
        ApprovalMode::Ask if std::io::stdin().is_terminal() => Arc::new(TerminalApprover),
        other => Arc::new(PolicyApprover(other)),
    }
}
