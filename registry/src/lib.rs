//! The local keel plugin registry.
//!
//! It will hold the on-disk registry (per-plugin signed index files, content-addressed blobs,
//! trusted keys), version resolution, verification before load, install with a lockfile, and
//! `keel registry serve` on loopback. Until then it is an empty crate.
