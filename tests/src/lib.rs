//! keel end-to-end test support: the hostile plugin fixtures and a kernel harness.

pub mod fixtures;
pub mod harness;
pub mod plugins;

pub use harness::Harness;
