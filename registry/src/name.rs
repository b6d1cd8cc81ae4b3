//! Registry names: `namespace:name`, both parts plugin-name shaped.

use std::fmt;
use std::str::FromStr;

use keel_kernel::is_valid_plugin_name;

use crate::RegistryError;

/// A namespaced plugin name, `acme:echo`. The manifest's `name` is the part after the colon;
/// the namespace says whose keys may sign it and which registry serves it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginName {
    namespace: String,
    name: String,
}

impl PluginName {
    /// `namespace:name`, both parts `[a-z][a-z0-9-]*`.
    pub fn new(namespace: &str, name: &str) -> Result<PluginName, RegistryError> {
        if !is_valid_namespace(namespace) {
            return Err(RegistryError::InvalidName {
                name: format!("{namespace}:{name}"),
                reason: format!(
                    "namespace `{namespace}` must be lowercase letters, digits and `-`, starting with a letter"
                ),
            });
        }
        if !is_valid_plugin_name(name) {
            return Err(RegistryError::InvalidName {
                name: format!("{namespace}:{name}"),
                reason: format!(
                    "plugin name `{name}` must be lowercase letters, digits and `-`, starting with a letter"
                ),
            });
        }
        Ok(PluginName {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The namespace, `acme`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The bare plugin name, `echo`, as in the manifest.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether `ns` is a valid namespace (same shape as a plugin name).
pub fn is_valid_namespace(ns: &str) -> bool {
    is_valid_plugin_name(ns)
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.namespace, self.name)
    }
}

impl FromStr for PluginName {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some((ns, name)) => PluginName::new(ns, name),
            None => Err(RegistryError::InvalidName {
                name: s.to_owned(),
                reason: format!(
                    "registry names are namespaced; write `NAMESPACE:{s}` (e.g. `acme:{s}`)"
                ),
            }),
        }
    }
}

impl serde::Serialize for PluginName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PluginName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `NAME[@RANGE]` as typed on the command line: `acme:echo`, `acme:echo@^1.2`,
/// `acme:echo@=1.2.3`. A bare version means `^version`, as in Cargo.toml.
pub fn parse_spec(spec: &str) -> Result<(PluginName, semver::VersionReq), RegistryError> {
    let (name, range) = match spec.split_once('@') {
        Some((n, r)) => (n, r),
        None => (spec, "*"),
    };
    let name: PluginName = name.parse()?;
    let range = semver::VersionReq::parse(range).map_err(|e| RegistryError::InvalidName {
        name: spec.to_owned(),
        reason: format!("`{range}` is not a semver range ({e}); write e.g. `{name}@^1.2`"),
    })?;
    Ok((name, range))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_a_namespace() {
        assert!("acme:echo".parse::<PluginName>().is_ok());
        let err = "echo".parse::<PluginName>().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("acme:echo")));
        assert!("Acme:echo".parse::<PluginName>().is_err());
        assert!("acme:../x".parse::<PluginName>().is_err());
        assert!("acme:".parse::<PluginName>().is_err());
    }

    #[test]
    fn specs_parse_ranges() -> Result<(), RegistryError> {
        let (n, r) = parse_spec("acme:echo@^1.2")?;
        assert_eq!(n.to_string(), "acme:echo");
        assert!(r.matches(&semver::Version::new(1, 3, 0)));
        let (_, r) = parse_spec("acme:echo")?;
        assert!(r.matches(&semver::Version::new(9, 0, 0)));
        assert!(parse_spec("acme:echo@banana").is_err());
        Ok(())
    }
}
