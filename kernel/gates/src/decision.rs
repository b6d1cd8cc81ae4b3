//! The one ordered decision every gate gives: `Allow < Prompt < Forbid`. Guards, the exec
//! policy, the capability baseline and the network policy all answer with it, so combining
//! their verdicts is `max()`: a later gate can only tighten what an earlier one decided.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A gate's decision, ordered from loosest to strictest and combined by maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// It may go ahead without asking.
    Allow,
    /// The person must approve it first; refused outright when nobody can be asked.
    Prompt,
    /// It is refused without asking.
    Forbid,
}

impl Decision {
    /// The name used in configs, JSON and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Prompt => "prompt",
            Decision::Forbid => "forbid",
        }
    }

    /// Parses `allow`, `prompt` or `forbid`, and the spellings older configs use for the
    /// last (`forbidden` in `[exec]`, `deny` in `[network]`). ASCII case and surrounding
    /// blanks are ignored; anything else is `None`, which every config turns into an error
    /// or the strict reading (fail closed).
    pub fn parse(s: &str) -> Option<Decision> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "allow" => Some(Decision::Allow),
            "prompt" => Some(Decision::Prompt),
            "forbid" | "forbidden" | "deny" => Some(Decision::Forbid),
            _ => None,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Decision {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Decision::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown decision `{text}`; expected \"allow\", \"prompt\" or \"forbid\""
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Decision::{self, Allow, Forbid, Prompt};

    #[test]
    fn decisions_are_ordered_and_combine_by_maximum() {
        assert!(Allow < Prompt && Prompt < Forbid);
        assert_eq!([Allow, Forbid, Prompt].into_iter().max(), Some(Forbid));
        assert_eq!(Allow.max(Prompt), Prompt);
    }

    #[test]
    fn old_spellings_are_read_and_the_new_one_is_written() {
        for (text, d) in [
            ("allow", Allow),
            (" Prompt ", Prompt),
            ("forbid", Forbid),
            ("forbidden", Forbid),
            ("DENY", Forbid),
        ] {
            assert_eq!(Decision::parse(text), Some(d), "{text}");
        }
        assert_eq!(Decision::parse("ask"), None);
        assert_eq!(Decision::parse(""), None);
        let json = serde_json::to_string(&[Allow, Prompt, Forbid]).expect("encodes");
        assert_eq!(json, r#"["allow","prompt","forbid"]"#);
        let back: Vec<Decision> =
            serde_json::from_str(r#"["deny","forbidden","prompt"]"#).expect("decodes");
        assert_eq!(back, [Forbid, Forbid, Prompt]);
        assert!(serde_json::from_str::<Decision>(r#""maybe""#).is_err());
    }
}
