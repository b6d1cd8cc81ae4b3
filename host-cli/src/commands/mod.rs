//! One module per command group.

pub mod doctor;
pub mod plugin;
pub mod policy;
pub mod run;
pub mod sessions;
