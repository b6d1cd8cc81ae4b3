//! Which keel ABI a component was built against, what it imports, and whether keel can satisfy
//! those imports.

use semver::Version;
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::WasmError;
use crate::manifest::{Capabilities, Manifest};

/// The newest keel plugin ABI (WIT package `keel:plugin`) this kernel hosts.
pub const SUPPORTED_ABI: Version = Version::new(0, 8, 0);

/// The first ABI, whose interfaces every later one keeps (a 0.3.0 component imports them and
/// exports `plugin` at this version).
const BASE_ABI: Version = Version::new(0, 2, 0);

/// The versions between them: 0.3.0 added interfaces, 0.4.0 typed the export.
const ABI_0_3: Version = Version::new(0, 3, 0);
const ABI_0_4: Version = Version::new(0, 4, 0);
const ABI_0_5: Version = Version::new(0, 5, 0);
const ABI_0_6: Version = Version::new(0, 6, 0);
const ABI_0_7: Version = Version::new(0, 7, 0);

/// The interfaces each later version defines anew (0.2.0 defines every other one). 0.4.0
/// redefines `plugin`, the export, with typed errors; 0.5.0 adds the kernel's own services,
/// typed; 0.6.0 the services plugins provide to each other, typed; 0.7.0 the model and the
/// person's hooks, typed, and redefines `agent` with records and `http` and `processes` with
/// resources; 0.8.0 the session log, typed; every other name of theirs is an earlier
/// version's.
const ADDED_IN_0_3: &[&str] = &["processes", "tool-list"];
const ADDED_IN_0_4: &[&str] = &["plugin"];
const ADDED_IN_0_5: &[&str] = &["caller", "prompt-context", "conversation", "agents"];
const ADDED_IN_0_6: &[&str] = &[
    "memory",
    "compaction",
    "tool-registry",
    "turns",
    "verifier",
    "verifier-types",
    "editor",
];
const ADDED_IN_0_7: &[&str] = &[
    "model-types",
    "model",
    "agent",
    "http",
    "processes",
    "hooks",
];

const ADDED_IN_0_8: &[&str] = &["session-log-types", "session-log"];

/// The names 0.7.0 adds that 0.2.0 does not define (it redefines `agent`, `http` and 0.3.0's
/// `processes`).
const FIRST_IN_0_7: &[&str] = &["model-types", "model", "hooks"];

/// The ABI versions this kernel hosts, for messages.
fn hosted() -> String {
    format!("{BASE_ABI}, {ABI_0_3}, {ABI_0_4}, {ABI_0_5}, {ABI_0_6}, {ABI_0_7} and {SUPPORTED_ABI}")
}

/// Whether `interface` exists at `version` in an ABI this kernel hosts (glue in
/// `abi_versions/since_v*`).
fn hosted_interface(interface: &str, version: &Version) -> bool {
    if *version == BASE_ABI {
        !ADDED_IN_0_3.contains(&interface)
            && !ADDED_IN_0_5.contains(&interface)
            && !ADDED_IN_0_6.contains(&interface)
            && !FIRST_IN_0_7.contains(&interface)
            && !ADDED_IN_0_8.contains(&interface)
    } else if *version == ABI_0_3 {
        ADDED_IN_0_3.contains(&interface)
    } else if *version == ABI_0_4 {
        ADDED_IN_0_4.contains(&interface)
    } else if *version == ABI_0_5 {
        ADDED_IN_0_5.contains(&interface)
    } else if *version == ABI_0_6 {
        ADDED_IN_0_6.contains(&interface)
    } else if *version == ABI_0_7 {
        ADDED_IN_0_7.contains(&interface)
    } else {
        *version == SUPPORTED_ABI && ADDED_IN_0_8.contains(&interface)
    }
}

/// The WIT package every keel interface lives in.
const KEEL_PACKAGE: &str = "keel:plugin";

/// The interface every plugin exports.
const PLUGIN_INTERFACE: &str = "plugin";

/// The person's hooks (0.7.0): a plugin may export it, never import it.
const HOOKS_INTERFACE: &str = "hooks";

/// What a component declares: the keel ABI version it targets, and the names of its imports
/// and exports (e.g. `keel:plugin/log@0.2.0`, `wasi:cli/environment@0.2.6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentReport {
    /// The keel ABI version of the component's `keel:plugin/plugin` export.
    pub abi_version: Version,
    /// Names of every import, in the component's order.
    pub imports: Vec<String>,
    /// The imports through which the component calls something: instances with at least one
    /// function (the rest bring only types, such as `keel:plugin/types@0.2.0`).
    pub calling_imports: Vec<String>,
    /// Names of every export, in the component's order.
    pub exports: Vec<String>,
    /// Why the component does not link against the kernel's imports, as a load would link
    /// it (an import the kernel lacks, or a function of a known interface it does not have);
    /// `None` when it links. Set by [`super::inspect_component`].
    pub link_error: Option<String>,
}

/// A WIT interface name split into its parts: `ns:pkg/iface@version`.
struct InterfaceName<'a> {
    package: &'a str,
    interface: &'a str,
    version: Option<&'a str>,
}

fn split_name(name: &str) -> Option<InterfaceName<'_>> {
    let (path, version) = match name.split_once('@') {
        Some((path, version)) => (path, Some(version)),
        None => (name, None),
    };
    let (package, interface) = path.split_once('/')?;
    package.contains(':').then_some(InterfaceName {
        package,
        interface,
        version,
    })
}

/// Refuse bytes that are not a component before handing them to the compiler, with a message
/// that says what they are instead.
pub(crate) fn precheck(plugin: &str, bytes: &[u8]) -> Result<(), WasmError> {
    let not = |reason: &str| WasmError::NotAComponent {
        plugin: plugin.to_owned(),
        reason: reason.to_owned(),
    };
    if bytes.is_empty() {
        return Err(not("the file is empty"));
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(not("the file is not WebAssembly (no `\\0asm` header)"));
    }
    match bytes[4..8] {
        // Component binary format: version 0x0d, layer 1.
        [_, _, 1, 0] => Ok(()),
        [1, 0, 0, 0] => Err(not(
            "it is a core WebAssembly module, not a component; build the plugin with \
             keel-sdk for the `wasm32-wasip2` target, which produces a component",
        )),
        _ => Err(not("unknown WebAssembly binary version or layer")),
    }
}

/// Read the report of a compiled component and check that it is a keel plugin of the ABI this
/// kernel hosts.
pub(crate) fn report(
    engine: &Engine,
    plugin: &str,
    component: &Component,
) -> Result<ComponentReport, WasmError> {
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_owned()).collect();
    let calling_imports: Vec<String> = ty
        .imports(engine)
        .filter(|(_, import)| match &import.ty {
            ComponentItem::ComponentInstance(instance) => instance
                .exports(engine)
                .any(|(_, export)| matches!(export.ty, ComponentItem::ComponentFunc(_))),
            ComponentItem::ComponentFunc(_) => true,
            _ => false,
        })
        .map(|(n, _)| n.to_owned())
        .collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();

    // Every keel name must be an interface at a version this kernel hosts; the first one that
    // is not decides the error, exports first (that is where a plugin's ABI is defined). The
    // component's ABI is the newest version it uses.
    let mut exports_plugin = false;
    let mut abi_version = BASE_ABI;
    for name in exports.iter().chain(imports.iter()) {
        let Some(parts) = split_name(name) else {
            continue;
        };
        if parts.package != KEEL_PACKAGE {
            continue;
        }
        let version = parts.version.unwrap_or("(none)");
        let parsed = Version::parse(version).ok();
        match &parsed {
            Some(v) if hosted_interface(parts.interface, v) => {
                abi_version = abi_version.max(v.clone());
            }
            _ => {
                return Err(WasmError::AbiMismatch {
                    plugin: plugin.to_owned(),
                    found: version.to_owned(),
                    supported: hosted(),
                });
            }
        }
        if parts.interface == PLUGIN_INTERFACE && exports.contains(name) {
            exports_plugin = true;
        }
    }
    let abi_version =
        exports_plugin
            .then_some(abi_version)
            .ok_or_else(|| WasmError::NotAPlugin {
                plugin: plugin.to_owned(),
                exports: exports.clone(),
            })?;
    Ok(ComponentReport {
        abi_version,
        imports,
        calling_imports,
        exports,
        link_error: None,
    })
}

/// The typed interfaces that call a service, with the service: importing one is calling it,
/// so the manifest must declare that service as `services.call` needs it
/// ([`Manifest::may_call`]), or keel refuses every call.
const TYPED_SERVICE_IMPORTS: &[(&str, &str)] = &[
    ("prompt-context", "keel.prompt"),
    ("conversation", "keel.conversation"),
    ("agents", "keel.agents"),
    ("editor", "keel.editor"),
    ("memory", "memory"),
    ("compaction", "compaction"),
    ("tool-registry", "tool-registry"),
    ("turns", "agent"),
    ("verifier", "verifier"),
    ("model", "model"),
    ("session-log", "session-log"),
];

/// The problems `keel plugin check` reports for the typed service doors a component imports
/// and its manifest does not declare (keel would refuse each call), and for the editor door
/// without the whole workspace granted; empty when every such import is declared.
pub fn check_declarations(report: &ComponentReport, manifest: &Manifest) -> Vec<String> {
    let mut problems = Vec::new();
    // An import that only brings types (the records of `conversation` a `compaction` caller
    // hands over) calls nothing, so needs nothing.
    for name in &report.calling_imports {
        let Some(parts) = split_name(name).filter(|p| p.package == KEEL_PACKAGE) else {
            continue;
        };
        let Some(&(_, service)) = TYPED_SERVICE_IMPORTS
            .iter()
            .find(|(interface, _)| *interface == parts.interface)
        else {
            continue;
        };
        if !manifest.may_call(service) {
            let declare = if service.starts_with("keel.") {
                format!("`services = [\"{service}\"]` under [capabilities]")
            } else {
                format!(
                    "`{service} = \"^1\"` under [requires], or `services = [\"{service}\"]` under \
                     [capabilities] if the plugin works without it"
                )
            };
            problems.push(format!(
                "import `{name}` calls the service `{service}`, which keel.toml does not \
                 declare; keel refuses every such call: add {declare}"
            ));
        }
        let whole_workspace = manifest.capabilities.dirs.iter().any(|d| {
            d.path
                .components()
                .all(|c| c == std::path::Component::CurDir)
        });
        if service == keel_protocol::services::EDITOR && !whole_workspace {
            problems.push(format!(
                "import `{name}` reads through the editor, which keel allows only a plugin \
                 granted the whole workspace: add `dirs = [{{ path = \".\", guest = \
                 \"/workspace\", access = \"read\" }}]` under [capabilities], or drop the import"
            ));
        }
    }
    problems
}

/// WASI interface families a plugin may import without any capability. The filesystem is
/// inert without preopened directories, which only granted `dirs` provide.
const WASI_ALWAYS: &[&str] = &["cli", "io", "clocks", "random", "filesystem"];

/// The problems `keel plugin check` reports for a component's imports given the capabilities
/// its manifest requests; empty when every import can be satisfied.
///
/// `keel:plugin/*` is always allowed (its version was checked when the report was made);
/// `wasi:cli`, `wasi:io`, `wasi:clocks`, `wasi:random` and `wasi:filesystem` (0.2.x) are
/// allowed; `wasi:sockets` is never granted (network access is mediated by the kernel);
/// anything else cannot be satisfied.
pub fn check_imports(report: &ComponentReport, caps: &Capabilities) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(e) = &report.link_error {
        problems.push(format!(
            "the component does not link as a load would: {e}; build it against the keel:plugin \
             WIT package this keel ships and WASI 0.2"
        ));
    }
    for name in &report.imports {
        let Some(parts) = split_name(name) else {
            problems.push(format!(
                "import `{name}` cannot be satisfied by keel: it is not a WIT interface \
                 (keel provides only `keel:plugin/*` and WASI 0.2 interfaces)"
            ));
            continue;
        };
        if parts.package == KEEL_PACKAGE {
            // The person's hooks are keel's to call: keel serves no import of them, so such a
            // component never links.
            if parts.interface == HOOKS_INTERFACE {
                problems.push(format!(
                    "import `{name}` cannot be satisfied by keel: only keel calls the person's \
                     hooks; a plugin that runs them exports `{name}` (world `hooks-service`)"
                ));
                continue;
            }
            // The doors that reach beyond the plugin need the capability that grants them.
            let missing = match parts.interface {
                "http" if caps.network.is_empty() => {
                    Some("the `network` capability (list the hosts under [capabilities] network)")
                }
                "exec" if !caps.exec => Some("the `exec` capability (`exec = true`)"),
                "agent" | "agents" if !caps.agent => {
                    Some("the `agent` capability (`agent = true`)")
                }
                "processes" if !caps.processes => {
                    Some("the `processes` capability (`processes = true`)")
                }
                _ => None,
            };
            if let Some(what) = missing {
                problems.push(format!(
                    "import `{name}` needs {what} under [capabilities] in keel.toml"
                ));
            }
            continue;
        }
        let Some(family) = parts.package.strip_prefix("wasi:") else {
            problems.push(format!("import `{name}` cannot be satisfied by keel"));
            continue;
        };
        let version = parts.version.and_then(|v| Version::parse(v).ok());
        if !version
            .as_ref()
            .is_some_and(|v| v.major == 0 && v.minor == 2)
        {
            problems.push(format!(
                "import `{name}` cannot be satisfied by keel: keel hosts WASI 0.2.x \
                 (wasm32-wasip2); rebuild the plugin for that target"
            ));
            continue;
        }
        if WASI_ALWAYS.contains(&family) {
            continue;
        }
        match family {
            // Raw sockets are never granted: every socket address is denied at run time
            // whatever the manifest says, so accepting the import would over-promise.
            "sockets" => problems.push(format!(
                "import `{name}` asks for raw sockets, which keel never grants to plugins{}; \
                 outbound requests go through the kernel's network gate instead",
                if caps.network.is_empty() {
                    ""
                } else {
                    " (the `network` capability covers kernel-mediated requests only)"
                }
            )),
            "http" => problems.push(format!(
                "import `{name}` cannot be satisfied by keel: keel does not host wasi:http; \
                 reach the network through a kernel service instead"
            )),
            _ => problems.push(format!("import `{name}` cannot be satisfied by keel")),
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_with(imports: &[&str]) -> ComponentReport {
        ComponentReport {
            abi_version: BASE_ABI,
            imports: imports.iter().map(|s| (*s).to_owned()).collect(),
            calling_imports: imports.iter().map(|s| (*s).to_owned()).collect(),
            link_error: None,
            exports: vec!["keel:plugin/plugin@0.2.0".to_owned()],
        }
    }

    /// Importing a typed service door the manifest does not declare is a problem of the
    /// check, said with what to add; declared, it is none.
    #[test]
    fn typed_service_imports_need_their_declaration() {
        let report = report_with(&[
            "keel:plugin/memory@0.6.0",
            "keel:plugin/prompt-context@0.5.0",
            "keel:plugin/editor@0.6.0",
            "keel:plugin/log@0.2.0",
            "keel:plugin/model@0.7.0",
        ]);
        let manifest = |extra: &str| {
            Manifest::parse(
                &format!("name = \"p\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n{extra}"),
                std::path::Path::new("p/keel.toml"),
            )
            .expect("the manifest parses")
        };
        let problems = check_declarations(&report, &manifest(""));
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(
            problems[0].contains("`keel:plugin/memory@0.6.0` calls the service `memory`")
                && problems[0].contains("`memory = \"^1\"` under [requires]"),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("`services = [\"keel.prompt\"]` under [capabilities]"),
            "{problems:?}"
        );
        assert!(problems[3].contains("whole workspace"), "{problems:?}");
        assert!(
            problems[4].contains("`keel:plugin/model@0.7.0` calls the service `model`"),
            "{problems:?}"
        );
        let declared = manifest(
            "[requires]\nmemory = { version = \"^1\", optional = true }\nmodel = \"^1\"\n\
             [capabilities]\nservices = [\"keel.prompt\", \"keel.editor\"]\n\
             dirs = [{ path = \".\", guest = \"/workspace\", access = \"read\" }]\n",
        );
        assert_eq!(check_declarations(&report, &declared), Vec::<String>::new());
    }

    #[test]
    fn precheck_names_what_the_bytes_are() {
        let err = |b: &[u8]| {
            precheck("x", b)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(b"").contains("empty"));
        assert!(err(b"garbage bytes").contains("not WebAssembly"));
        assert!(err(b"\0asm\x01\0\0\0").contains("core WebAssembly module"));
        assert!(err(b"\0asm\x01\0\0\0").contains("plugin `x`"));
        assert!(precheck("x", b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn keel_and_basic_wasi_imports_need_nothing() {
        let report = report_with(&[
            "keel:plugin/log@0.2.0",
            "wasi:cli/environment@0.2.6",
            "wasi:io/streams@0.2.0",
            "wasi:clocks/monotonic-clock@0.2.3",
            "wasi:random/random@0.2.6",
            "wasi:filesystem/preopens@0.2.6",
        ]);
        assert!(check_imports(&report, &Capabilities::default()).is_empty());
    }

    /// No capability makes the person's hooks importable: keel links no such import.
    #[test]
    fn the_persons_hooks_are_never_an_import() {
        let report = report_with(&["keel:plugin/hooks@0.7.0"]);
        let everything = Capabilities {
            network: vec!["*".into()],
            exec: true,
            agent: true,
            processes: true,
            ..Capabilities::default()
        };
        let problems = check_imports(&report, &everything);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("only keel calls the person's hooks"),
            "{problems:?}"
        );
    }

    #[test]
    fn sockets_are_never_granted_and_the_rest_is_refused() {
        let report = report_with(&[
            "wasi:sockets/tcp@0.2.6",
            "wasi:http/outgoing-handler@0.2.6",
            "acme:evil/backdoor@1.0.0",
            "wasi:cli/environment@0.3.0",
        ]);
        let problems = check_imports(&report, &Capabilities::default());
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("raw sockets"), "{problems:?}");
        assert!(problems[2].contains("`acme:evil/backdoor@1.0.0` cannot be satisfied by keel"));
        assert!(problems[3].contains("0.2.x"));
        let caps = Capabilities {
            network: vec!["api.example.com".into()],
            ..Capabilities::default()
        };
        // A network capability does not make raw sockets available.
        let with_network = check_imports(&report, &caps);
        assert_eq!(with_network.len(), 4);
        assert!(
            with_network[0].contains("kernel-mediated"),
            "{with_network:?}"
        );
    }
}
