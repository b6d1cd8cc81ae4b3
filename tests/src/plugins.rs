//! The agent plugins under test (`plugins/fs-tools`, `shell`, `tool-registry`, `session-log`,
//! `verifier`), compiled by this crate's build script until they join the bundled set.

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// The manifest text and component bytes of the plugin `name`, if it is one under test.
pub fn plugin(name: &str) -> Option<(&'static str, &'static [u8])> {
    PLUGINS
        .iter()
        .find(|(plugin, _, _)| *plugin == name)
        .map(|&(_, manifest, component)| (manifest, component))
}

/// The name of every plugin under test.
pub fn names() -> Vec<&'static str> {
    PLUGINS.iter().map(|&(name, _, _)| name).collect()
}
