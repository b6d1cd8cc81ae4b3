//! Syntax colour for the code blocks of the model's answers: syntect's grammars (the ones
//! Sublime Text ships, loaded once, only when the first block of a known language opens) and
//! eight terminal colours keyed by scope, so the colours follow the person's terminal theme.

use std::sync::OnceLock;

use syntect::parsing::{ParseState, ScopeStack, SyntaxSet};

fn syntaxes() -> &'static SyntaxSet {
    static SET: OnceLock<SyntaxSet> = OnceLock::new();
    SET.get_or_init(SyntaxSet::load_defaults_newlines)
}

/// Colours the lines of one code block, carrying the parser's state from line to line (a
/// string or comment may span lines).
pub(crate) struct Highlighter {
    parse: ParseState,
    stack: ScopeStack,
}

/// The terminal colour (SGR code) of the innermost scope with one, by scope-name prefix.
const COLOURS: &[(&str, &str)] = &[
    ("comment", "90"),
    ("string", "32"),
    ("constant.numeric", "36"),
    ("constant.language", "36"),
    ("constant.character", "36"),
    ("keyword", "35"),
    ("storage", "35"),
    ("entity.name.function", "34"),
    ("support.function", "34"),
    ("entity.name.type", "33"),
    ("entity.name.class", "33"),
    ("support.type", "33"),
    ("support.class", "33"),
];

impl Highlighter {
    /// A highlighter for a block fenced with `lang` (`rust`, `rs`, `py`, `sh`, …); none for a
    /// language the grammars do not know.
    pub(crate) fn for_language(lang: &str) -> Option<Highlighter> {
        let token = lang.split([' ', ',', '{']).next().unwrap_or_default();
        if token.is_empty() {
            return None;
        }
        let syntax = syntaxes().find_syntax_by_token(token)?;
        Some(Highlighter {
            parse: ParseState::new(syntax),
            stack: ScopeStack::new(),
        })
    }

    /// `line` (already safe to print, without its line break) with colours; as it is if the
    /// grammar fails on it.
    pub(crate) fn line(&mut self, line: &str) -> String {
        let with_break = format!("{line}\n");
        let Ok(ops) = self.parse.parse_line(&with_break, syntaxes()) else {
            return line.to_owned();
        };
        let mut out = String::with_capacity(line.len() * 2);
        let mut at = 0;
        for (position, op) in ops {
            let position = position.min(line.len());
            if position > at && line.is_char_boundary(position) {
                self.paint(&mut out, &line[at..position]);
                at = position;
            }
            if self.stack.apply(&op).is_err() {
                self.stack = ScopeStack::new();
            }
        }
        if at < line.len() {
            self.paint(&mut out, &line[at..]);
        }
        out
    }

    fn paint(&self, out: &mut String, text: &str) {
        let colour = self.stack.as_slice().iter().rev().find_map(|scope| {
            let name = scope.build_string();
            COLOURS
                .iter()
                .find(|(prefix, _)| name.starts_with(prefix))
                .map(|(_, colour)| *colour)
        });
        match colour {
            Some(code) => {
                out.push_str(&format!("\x1b[{code}m{text}\x1b[0m"));
            }
            None => out.push_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_coloured_by_its_syntax() {
        let mut rust = Highlighter::for_language("rust").expect("rust is known");
        let line = rust.line("fn main() { let s = \"hi\"; } // done");
        assert!(line.contains("\x1b[35mfn\x1b[0m"), "{line:?}");
        assert!(line.contains("\x1b[32m"), "a string: {line:?}");
        assert!(line.contains("\x1b[90m"), "a comment: {line:?}");
        // The text itself is all there.
        let plain: String = line
            .split('\x1b')
            .map(|p| p.split_once('m').map_or(p, |(_, t)| t))
            .collect();
        assert_eq!(plain, "fn main() { let s = \"hi\"; } // done");
        // A comment opened on one line goes on in the next.
        let mut py = Highlighter::for_language("py").expect("python is known");
        py.line("x = \"\"\"start");
        assert!(
            py.line("still text").starts_with("\x1b[32m"),
            "a string spans lines"
        );
        assert!(Highlighter::for_language("no-such-language").is_none());
        assert!(Highlighter::for_language("").is_none());
    }
}
