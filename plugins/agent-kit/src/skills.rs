//! Skills as Claude Code and Codex keep them: a folder with a `SKILL.md` whose front matter
//! names the skill and says when to use it, followed by its instructions; other files in the
//! folder are read when the instructions point at them.
//!
//! ```text
//! ---
//! name: release-notes
//! description: Write release notes from the git log since the last tag.
//! ---
//! # Release notes
//! …
//! ```

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// A skill's name at most, in bytes.
pub const NAME_MAX: usize = 64;
/// A skill's description at most, in characters.
pub const DESCRIPTION_MAX: usize = 1024;
/// Bytes of a `SKILL.md` (or another file of the skill) read at most.
pub const FILE_MAX_BYTES: usize = 64 * 1024;
/// Skills taken from one directory at most.
pub const MAX_SKILLS: usize = 64;

/// A skill's name and description, from its front matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillHead {
    /// Lowercase letters, digits and `-`.
    pub name: String,
    /// When to use it.
    pub description: String,
}

/// The name and description in `text`'s front matter (the lines between a first line `---`
/// and the next `---`; `key: value`, values optionally quoted; other keys ignored), and where
/// the body starts.
pub fn parse(text: &str) -> Result<(SkillHead, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(
            "SKILL.md must start with front matter: a line `---`, then `name:` and \
                    `description:`, then `---`"
                .into(),
        );
    }
    let mut name = None;
    let mut description = None;
    let mut offset = text.find('\n').map_or(text.len(), |i| i + 1);
    let mut closed = false;
    for line in lines {
        offset += line.len();
        let line = line.trim_end();
        if line == "---" {
            closed = true;
            break;
        }
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            match key.trim() {
                "name" => name = Some(value.to_owned()),
                "description" => description = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    if !closed {
        return Err("the front matter has no closing `---` line".into());
    }
    let name = name.ok_or("the front matter has no `name:`")?;
    if name.is_empty()
        || name.len() > NAME_MAX
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "name `{}` must be 1-{NAME_MAX} lowercase letters, digits and `-`",
            name.escape_debug()
        ));
    }
    let description: String = description
        .ok_or("the front matter has no `description:`")?
        .chars()
        .filter(|c| !c.is_control())
        .take(DESCRIPTION_MAX)
        .collect();
    if description.trim().is_empty() {
        return Err("the description is empty: say when the skill should be used".into());
    }
    Ok((
        SkillHead { name, description },
        text.get(offset..).unwrap_or(""),
    ))
}

/// The skill folders in `root`, sorted, at most [`MAX_SKILLS`]: each folder with the head of
/// its `SKILL.md` (read up to [`FILE_MAX_BYTES`]) or why it does not parse. Folders without a
/// readable `SKILL.md` are not skills and are left out.
pub fn scan(root: &std::path::Path) -> Vec<(std::path::PathBuf, Result<SkillHead, String>)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<std::path::PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .take(MAX_SKILLS)
        .filter_map(|dir| {
            let (text, _) =
                crate::text::read_bounded(&dir.join(SKILL_FILE), FILE_MAX_BYTES).ok()?;
            let head = parse(&text).map(|(head, _)| head);
            Some((dir, head))
        })
        .collect()
}

/// Whether `relative` names a file inside a skill's folder: plain components only (no `..`,
/// no root, no hidden files).
pub fn is_inside(relative: &str) -> bool {
    !relative.is_empty()
        && std::path::Path::new(relative).components().all(|c| {
            matches!(c, std::path::Component::Normal(s)
                if !s.to_string_lossy().starts_with('.'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_gives_the_name_description_and_body() {
        let text = "---\nname: release-notes\ndescription: \"Write notes: from the log\"\nallowed-tools: x\n---\n# Body\n";
        let (head, body) = parse(text).expect("ok");
        assert_eq!(head.name, "release-notes");
        assert_eq!(head.description, "Write notes: from the log");
        assert_eq!(body, "# Body\n");
        assert!(parse("# no front matter\n").is_err());
        assert!(parse("---\nname: x\ndescription: y\n").is_err());
        assert!(parse("---\nname: Bad Name\ndescription: y\n---\n").is_err());
        assert!(parse("---\nname: ok\n---\n").is_err());
        assert!(parse("---\nname: ok\ndescription:  \n---\n").is_err());
    }

    #[test]
    fn only_plain_paths_inside_a_skill_are_read() {
        assert!(is_inside("reference.md"));
        assert!(is_inside("scripts/run.sh"));
        for bad in [
            "",
            "../x",
            "/etc/passwd",
            "a/../../b",
            ".env",
            "a/.git/config",
        ] {
            assert!(!is_inside(bad), "{bad}");
        }
    }
}
