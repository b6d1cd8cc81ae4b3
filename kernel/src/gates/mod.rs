//! The sealed gates. Nothing here is reachable from a plugin: the WIT interfaces and the
//! native callback table expose no gate state, and every decision is made in the kernel.

pub mod approvals;
pub mod arg_repair;
mod exec_danger;
pub mod exec_policy;
mod exec_rules;
pub mod net_policy;
pub mod redact;
pub mod safe_path;
pub mod sanitize;
pub mod shell_split;
