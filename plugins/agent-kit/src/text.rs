//! Small text helpers shared by the modules.

/// The longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub(crate) fn head_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The first `max` chars of `s`, with `…` appended when cut.
pub(crate) fn preview(s: &str, max_chars: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = flat.chars().take(max_chars).collect();
    if flat.chars().count() > max_chars {
        out.push('…');
    }
    out
}

/// At most `max` bytes of the file at `path` as text, and whether the file was longer: a
/// character cut at the end is dropped, other invalid UTF-8 is replaced. For files a model, a
/// person or a cloned repository wrote (memory, skills, logs), which are never read whole.
pub fn read_bounded(path: &std::path::Path, max: usize) -> std::io::Result<(String, bool)> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)?;
    let cut = bytes.len() > max;
    bytes.truncate(max);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // Only the last character is incomplete: where the cut fell.
        Err(e) if e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok((text, cut))
}

/// Levenshtein edit distance over chars.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_read_cuts_at_a_character_and_says_so() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        std::fs::write(&path, "abé")?;
        assert_eq!(read_bounded(&path, 3)?, ("ab".to_owned(), true));
        assert_eq!(read_bounded(&path, 4)?, ("abé".to_owned(), false));
        std::fs::write(&path, b"a\xffb")?;
        assert_eq!(read_bounded(&path, 10)?, ("a\u{fffd}b".to_owned(), false));
        assert!(read_bounded(&dir.path().join("missing"), 10).is_err());
        Ok(())
    }

    #[test]
    fn head_bytes_respects_char_boundaries() {
        assert_eq!(head_bytes("héllo", 2), "h");
        assert_eq!(head_bytes("héllo", 3), "hé");
        assert_eq!(head_bytes("abc", 10), "abc");
    }

    #[test]
    fn levenshtein_counts_edits() {
        assert_eq!(levenshtein("raed_file", "read_file"), 2);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("grep", "grep"), 0);
    }

    #[test]
    fn preview_flattens_and_cuts() {
        assert_eq!(preview("a\n  b", 10), "a b");
        assert_eq!(preview("abcdef", 3), "abc…");
    }
}
