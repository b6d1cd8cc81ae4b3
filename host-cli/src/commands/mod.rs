//! One module per command group.

pub mod key;
pub mod plugin;
mod plugin_template;
pub mod policy;
pub mod registry;
pub mod tool;
