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
