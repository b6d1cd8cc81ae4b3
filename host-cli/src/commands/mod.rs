//! One module per command group.

pub mod plugin;
pub mod policy;
