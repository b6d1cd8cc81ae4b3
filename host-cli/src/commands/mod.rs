//! One module per command group.

pub mod dev;
pub mod doctor;
pub mod key;
pub mod mcp;
pub mod memory;
pub mod plugin;
mod plugin_python;
mod plugin_sdk;
mod plugin_template;
mod plugin_test;
pub mod policy;
pub mod registry;
pub mod review;
pub mod run;
pub mod sessions;
pub mod skills;
pub mod tool;
