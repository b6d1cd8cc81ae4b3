//! The one check every name goes through before the kernel builds a path from it: plugin
//! names, session ids, spill-file names, anything a plugin or a model supplied.

/// Why a name cannot be used as a path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` cannot be used as a file name: {reason}; use 1-128 letters, digits, `-`, `_` or `.`, not starting with `.`", .name.escape_debug())]
pub struct UnsafeName {
    /// The refused name (as given).
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Longest accepted component, in bytes.
pub const MAX_COMPONENT: usize = 128;

/// `name` if it is safe as a single path component on every platform keel runs on: non-empty,
/// at most [`MAX_COMPONENT`] bytes, only ASCII letters, digits, `-`, `_` and `.`, not starting
/// with `.` (so neither `.`, `..` nor hidden files), and not a reserved Windows device name.
pub fn safe_component(name: &str) -> Result<&str, UnsafeName> {
    let refuse = |reason| {
        Err(UnsafeName {
            name: name.chars().take(200).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_COMPONENT {
        return refuse("it is too long");
    }
    if name.starts_with('.') {
        return refuse("it starts with `.`");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return refuse(match c {
            '/' | '\\' => "it contains a path separator",
            '\0' => "it contains a NUL byte",
            c if c.is_control() => "it contains a control character",
            _ => "it contains a character outside [A-Za-z0-9._-]",
        });
    }
    let stem = name.split('.').next().unwrap_or(name).to_ascii_uppercase();
    let reserved = matches!(stem.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || ((stem.starts_with("COM") || stem.starts_with("LPT"))
            && stem.len() == 4
            && stem.as_bytes()[3].is_ascii_digit());
    if reserved {
        return refuse("it is a reserved device name");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in [
            "greeter",
            "session-2026-12-02T10_00_00",
            "spill.001.txt",
            "a",
            "x_y-z.9",
        ] {
            assert_eq!(safe_component(ok), Ok(ok));
        }
    }

    #[test]
    fn refuses_escapes_and_oddities() {
        let long = "a".repeat(MAX_COMPONENT + 1);
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "../etc",
            "a/b",
            "a\\b",
            "/abs",
            "nul\0byte",
            "tab\there",
            "new\nline",
            "ünïcode",
            "sp ace",
            "CON",
            "con.txt",
            "com1",
            "LPT9.log",
            &long,
        ] {
            let e = safe_component(bad);
            assert!(e.is_err(), "{bad:?} must be refused");
            let message = e.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("cannot be used as a file name"),
                "{message}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn accepted_names_never_leave_their_directory(name in "\\PC{0,40}") {
            if let Ok(n) = safe_component(&name) {
                let joined = std::path::Path::new("/base").join(n);
                proptest::prop_assert_eq!(joined.parent(), Some(std::path::Path::new("/base")));
                proptest::prop_assert!(!n.contains(['/', '\\']) && n != "." && n != "..");
            }
        }
    }
}
