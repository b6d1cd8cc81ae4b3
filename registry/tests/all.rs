//! The integration tests of the registry, as one test binary: each module was a binary of its own,
//! and linking one binary instead of several keeps builds and CI short.

mod common;

mod concurrency;
mod install;
mod oci;
mod oci_hostile;
mod serve;
