//! A server's tool names as keel tool names: `mcp__<server>__<tool>`, in the tool-name grammar
//! (`[a-z][a-z0-9_]*`, at most 64 bytes).

/// Longest keel tool name.
const MAX_NAME: usize = 64;

/// `text` in the tool-name alphabet: lowercase ASCII letters, digits and `_`; anything else
/// becomes `_`.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect()
}

/// FNV-1a, enough to keep two long names apart after cutting.
fn short_hash(text: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// The keel name of `tool` of `server`. A name over 64 bytes keeps its first 55 bytes and
/// ends in `_` and a hash of the whole, so two long names stay apart.
pub fn keel_name(server: &str, tool: &str) -> String {
    let full = format!("mcp__{}__{}", clean(server), clean(tool));
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = short_hash(&format!("{server}\0{tool}"));
    let keep = MAX_NAME - hash.len() - 1;
    format!("{}_{hash}", &full[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_grammar_and_the_length_limit() {
        assert_eq!(
            keel_name("everything", "get-sum"),
            "mcp__everything__get_sum"
        );
        assert_eq!(
            keel_name("My Server", "Read.File"),
            "mcp__my_server__read_file"
        );
        let long = keel_name("files", &"x".repeat(200));
        assert_eq!(long.len(), 64);
        assert_ne!(long, keel_name("files", &"x".repeat(201)));
        for name in [long, keel_name("ü", "☃")] {
            assert!(name.starts_with("mcp__"));
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
    }

    #[test]
    fn different_tools_can_meet_in_one_name() {
        // Which is why the plugin refuses the second and names both.
        assert_eq!(keel_name("s", "a-b"), keel_name("s", "a_b"));
    }
}
