//! keel-checkpoints' integration tests, one binary.

mod common;
mod hostile;
mod retention;
mod rewind_properties;
mod snapshots;
