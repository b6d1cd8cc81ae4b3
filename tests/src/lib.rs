//! keel end-to-end test support: the hostile plugin fixtures, the model adapter plugins and a
//! kernel harness.

pub mod fixtures;
pub mod harness;
pub mod model_server;
pub mod models;
pub mod oci_server;
pub mod plugins;
pub mod wire;

pub use harness::Harness;
