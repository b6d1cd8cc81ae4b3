//! The one way the `keel` binary makes a kernel. Every command that runs plugins — `run`,
//! `exec`, `resume`, `demo`, `dev`, `mcp serve` (through [`super::Session::start`]), `tool
//! call`, `plugin list`/`test`, `sessions` (through [`crate::runtime::Runtime`]), `mcp list`,
//! `review`, `memory consolidate`, `doctor --analyze` — builds it here, so none can forget a
//! part of what the person configured:
//!
//! - the sealed gates of `gates::gate_config`: exec policy (with `--approval` or a command's
//!   own mode over the config's), the approver, stored grants, the network policy with its
//!   secrets and audit log, the OS sandbox, the MCP processes, the subagent policy;
//! - the `[timeouts]` deadlines of every call (a tool, a model call, a service, an event, a
//!   child agent, a turn);
//! - the plugin loader with the person's `[limits.<plugin>]` and grants.

use std::sync::Arc;

use keel_kernel::gates::approvals::Approver;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{Kernel, KernelConfig};

use super::gates;
use crate::config::Context;
use crate::runtime::{self, Runtime};
use crate::settings::ModelChoice;

/// Builds a kernel (and the loader for its plugins) with the person's gates, sandbox, timeouts
/// and limits. See the [module documentation](self).
#[must_use]
pub struct KernelBuilder<'a> {
    ctx: &'a Context,
    approval: Option<ApprovalMode>,
    asker: Option<Arc<dyn Approver>>,
}

impl<'a> KernelBuilder<'a> {
    /// The kernel of a command run in `ctx`, asking for approval as the config says.
    pub fn new(ctx: &'a Context) -> Self {
        KernelBuilder {
            ctx,
            approval: None,
            asker: None,
        }
    }

    /// The approval mode over the config's: `--approval`, or `Never` for a command with no
    /// one to ask (what would need approval is refused). `None` keeps the config's.
    pub fn approval(mut self, mode: Option<ApprovalMode>) -> Self {
        self.approval = mode;
        self
    }

    /// Who answers approval questions under `ask` in place of the terminal (an editor over
    /// ACP). The gates are the same; only the one asked changes.
    pub fn asker(mut self, asker: Option<Arc<dyn Approver>>) -> Self {
        self.asker = asker;
        self
    }

    /// The kernel, empty, and the loader for its plugins.
    pub fn build(self) -> anyhow::Result<Runtime> {
        let ctx = self.ctx;
        let gates = gates::gate_config(ctx, &ModelChoice::from(ctx), self.approval, self.asker)?;
        let config = KernelConfig {
            deadlines: ctx.config.timeouts.deadlines()?,
            ..KernelConfig::default()
        };
        Ok(Runtime {
            kernel: Kernel::with_gates(config, gates),
            loader: runtime::loader(ctx)?,
        })
    }
}
