//! Unit tests of `plugins/agent-kit/src/registry.rs`.

use super::*;
use crate::tools::{ToolCapabilities, all_specs};

fn spec(name: &str, description: &str, schema: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema.into(),
        capabilities: ToolCapabilities::default(),
        parallel_safe: true,
    }
}

fn registry() -> Registry {
    let mut specs = all_specs();
    specs.push(spec("exec_shell", "Run a command.", r#"{"type":"object"}"#));
    Registry::new(specs)
}

fn found(name: &str) -> Resolution {
    Resolution::Found { name: name.into() }
}

#[test]
fn resolution_table() {
    let r = registry();
    let table = [
        ("read_file", found("read_file")),
        ("ReadFile", found("read_file")),
        ("readFile", found("read_file")),
        ("read-file", found("read_file")),
        ("READ_FILE", found("read_file")),
        ("read_file_tool", found("read_file")),
        ("ReadFileTool", found("read_file")),
        ("ExecShell", found("exec_shell")),
        ("exec-shell-tool", found("exec_shell")),
        ("Grep", found("grep")),
        ("grep_tool", found("grep")),
        (
            "raed_file",
            Resolution::Unknown {
                did_you_mean: vec!["read_file".into()],
            },
        ),
        (
            "edit",
            Resolution::Unknown {
                did_you_mean: vec![],
            },
        ),
    ];
    for (written, expected) in table {
        assert_eq!(r.resolve(written), expected, "{written}");
    }
    let Resolution::Unknown { did_you_mean } = r.resolve("rite_file") else {
        panic!("rite_file should be unknown");
    };
    assert_eq!(did_you_mean.first().map(String::as_str), Some("write_file"));
    assert!(did_you_mean.len() <= MAX_SUGGESTIONS);
}

#[test]
fn suffix_is_added_when_the_registered_name_has_it() {
    let r = Registry::new([spec("search_tool", "Search.", r#"{"type":"object"}"#)]);
    assert_eq!(r.resolve("search"), found("search_tool"));
    assert_eq!(r.resolve("Search"), found("search_tool"));
}

#[test]
fn list_is_sorted_by_name() {
    let names: Vec<String> = registry().list().into_iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        [
            "edit_file",
            "exec_shell",
            "grep",
            "list_dir",
            "read_file",
            "write_file"
        ]
    );
}

#[test]
fn an_invalid_spec_becomes_a_placeholder_and_the_others_stay_usable() {
    let r = Registry::new([
        spec("good", "Works.", r#"{"type":"object"}"#),
        spec("broken", "Bad schema.", r#"{"type":"object""#),
        spec("arrayish", "Wrong type.", r#"{"type":"array"}"#),
        spec("mute", "  ", r#"{"type":"object"}"#),
        spec("Bad Name", "Bad name.", r#"{"type":"object"}"#),
        spec("good", "Duplicate.", r#"{"type":"object"}"#),
    ]);
    assert_eq!(r.resolve("good"), found("good"));
    assert!(r.parallel_safe("good"));
    let Resolution::Disabled { name, reason } = r.resolve("broken") else {
        panic!("broken should be disabled");
    };
    assert_eq!(name, "broken");
    assert!(reason.contains("not valid JSON"), "{reason}");
    assert!(!r.parallel_safe("broken"));
    assert!(
        matches!(r.resolve("arrayish"), Resolution::Disabled { reason, .. } if reason.contains("\"type\": \"object\""))
    );
    assert!(
        matches!(r.resolve("mute"), Resolution::Disabled { reason, .. } if reason.contains("description"))
    );
    assert!(matches!(r.resolve("Bad Name"), Resolution::Disabled { .. }));

    let list = r.list();
    let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["arrayish", "broken", "good", "mute"]);
    let broken = &list[1];
    assert!(
        broken.description.starts_with("DISABLED"),
        "{}",
        broken.description
    );
    assert_eq!(broken.input_schema["not"], json!({}));
    assert_eq!(list[2].description, "Works.");
    assert_eq!(r.problems().len(), 5, "{:?}", r.problems());
    assert!(r.problems()[4].contains("registered twice"));
    let msg = r
        .refusal_message("broken", &r.resolve("broken"))
        .expect("a refusal");
    assert!(msg.contains("disabled"), "{msg}");
}

#[test]
fn unknown_names_get_a_message_with_suggestions_and_the_available_tools() {
    let r = registry();
    let res = r.resolve("raed_file");
    let msg = r.refusal_message("raed_file", &res).expect("a refusal");
    assert!(msg.contains("Did you mean: read_file?"), "{msg}");
    assert!(msg.contains("edit_file, exec_shell, grep"), "{msg}");
    assert_eq!(r.refusal_message("grep", &r.resolve("grep")), None);
}

#[test]
fn names_are_checked() {
    assert!(check_name("read_file2").is_ok());
    for bad in [
        "",
        "2read",
        "Read",
        "read-file",
        "read file",
        &"a".repeat(65),
    ] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
    assert_eq!(to_snake("HTTPServerTool"), "http_server_tool");
    assert_eq!(to_snake("readFile2Now"), "read_file2_now");
}
