//! keel-checkpoints' integration tests, one binary.

mod common;
mod durability;
mod hostile;
mod index;
mod journal;
mod retention;
mod rewind_properties;
mod snapshots;
