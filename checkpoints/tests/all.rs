//! keel-checkpoints' integration tests, one binary.

mod common;
mod hostile;
mod rewind_properties;
mod snapshots;
