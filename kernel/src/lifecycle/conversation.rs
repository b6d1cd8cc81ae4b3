//! A model request that names its conversation instead of carrying it
//! ([`keel_protocol::ModelRequest::conversation`]): the agent keeps each message in its
//! kernel-held state as it is added, so the request that crosses the agent's door is small.
//!
//! Two ways on from there, by the version of the `model` service its provider declares:
//!
//! - An adapter that reads conversations itself
//!   ([`keel_protocol::services::MODEL_READS_CONVERSATIONS`]) gets the request as it is, with
//!   where the conversation is held ([`keel_protocol::ConversationRef::held`]), and reads through `keel.conversation`
//!   ([`read`]) only the messages it has not rendered yet. A step then copies across a
//!   component boundary what is new since the last step, not the history. Only the frame that
//!   serves that one model call may read, and only that conversation
//!   ([`crate::call_chain::CallChain::reading_conversation`]); a reading after any kept message
//!   changed is refused (the revision the adapter was told is no longer true).
//! - Any other gets the messages put in ([`kept_messages`]): the history crosses once a step.
//!
//! The messages go out as the agent kept them (JSON text, not parsed here): they are the
//! agent's own data, as the messages it could have sent inline are, and whatever reads them
//! next parses them (the child-agent narrowing, the adapter).

use keel_protocol::ConversationRef;

use crate::call_chain::ConversationGrant;
use crate::types::KernelError;

/// The kept messages `named` names, each looked up by its [`keel_protocol::conversation_key`]
/// in the agent's kept state, as one JSON array ([`crate::typed_services::ModelCall::kept`]).
/// A message the kernel does not hold is refused (the agent then sends its messages inline).
pub(super) fn kept_messages<'a>(
    named: &ConversationRef,
    lookup: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<String, KernelError> {
    join(&kept(
        &named.session,
        0..named.messages,
        named.messages,
        lookup,
    )?)
}

/// `keel.conversation` `read`: the kept texts of messages `range` of the conversation `grant`
/// names, when the conversation is still as it was when the request was made. Both doors of
/// the service (JSON, typed) read through this one check.
pub(super) fn read<'a>(
    grant: &ConversationGrant,
    revision: u64,
    range: keel_protocol::ConversationRead,
    lookup: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<Vec<&'a str>, KernelError> {
    if range.from > range.to || range.to > grant.messages {
        return Err(KernelError::Invalid(format!(
            "messages {}..{} are not part of the request, which names the first {} of session \
             `{}`",
            range.from, range.to, grant.messages, grant.session
        )));
    }
    if revision != grant.revision {
        return Err(KernelError::Conflict(format!(
            "the conversation of session `{}` changed since the request was made; the agent \
             asks again",
            grant.session
        )));
    }
    kept(&grant.session, range.from..range.to, grant.messages, lookup)
}

/// The kept texts of messages `range` of `session` (of `named` in all), in order.
fn kept<'a>(
    session: &str,
    range: std::ops::Range<usize>,
    named: usize,
    lookup: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<Vec<&'a str>, KernelError> {
    let mut messages = Vec::with_capacity(range.len().min(1 << 16));
    for index in range {
        let key = keel_protocol::conversation_key(session, index);
        let kept = lookup(&key).ok_or_else(|| {
            KernelError::Invalid(format!(
                "the request names {named} messages of session `{session}`, but the kernel \
                 holds no message {index} of it; send the messages in the request"
            ))
        })?;
        let text = std::str::from_utf8(kept).map_err(|_| {
            KernelError::Invalid(format!("the kept message `{key}` is not UTF-8 text"))
        })?;
        messages.push(text);
    }
    Ok(messages)
}

/// Kept messages as one JSON array: the texts joined, not parsed (they are the agent's own
/// data; whoever reads them next parses them).
pub(super) fn join(messages: &[&str]) -> Result<String, KernelError> {
    let bytes = messages.iter().map(|t| t.len() + 1).sum::<usize>() + 2;
    let mut out = String::with_capacity(bytes);
    out.push('[');
    for (i, text) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(text);
    }
    out.push(']');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use keel_protocol::{Block, Message, ModelRequest, Role};

    use super::*;
    use crate::typed_services::ModelCall;

    fn message(text: &str) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    fn request(named: Option<ConversationRef>, messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: String::new(),
            system: "sys".into(),
            messages,
            tools: Vec::new(),
            max_tokens: 100,
            compacts_on_overflow: true,
            conversation: named,
        }
    }

    #[test]
    fn a_named_conversation_is_spliced_in_whole_and_in_order() -> Result<(), KernelError> {
        let mut kept = BTreeMap::new();
        // A text with the field's own name, quotes and brackets in it changes nothing.
        let texts = ["first", "\"conversation\": ], {\"messages\":[", "third"];
        for (i, text) in texts.iter().enumerate() {
            let json = serde_json::to_vec(&message(text)).unwrap_or_default();
            kept.insert(keel_protocol::conversation_key("s1", i), json);
        }
        kept.insert(
            keel_protocol::conversation_key("other", 0),
            serde_json::to_vec(&message("not mine")).unwrap_or_default(),
        );
        let named = ConversationRef {
            session: "s1".into(),
            messages: 3,
            held: None,
        };
        let lookup = |key: &str| kept.get(key).map(Vec::as_slice);
        let inline: Vec<Message> = texts.iter().map(|t| message(t)).collect();
        let expected = request(None, inline.clone());
        // Through a JSON door: the kept texts spliced into the request's text.
        let call = crate::typed_services::ServiceCall::Complete(Box::new(ModelCall {
            request: request(None, Vec::new()),
            kept: Some(kept_messages(&named, lookup)?),
        }));
        let parsed: ModelRequest = serde_json::from_str(&call.to_json())
            .map_err(|e| KernelError::Failed(e.to_string()))?;
        assert_eq!(parsed, expected);
        // Through a typed door: decoded into the record.
        let crate::typed_services::ServiceCall::Complete(model) = &call else {
            return Err(KernelError::Failed("not a model call".into()));
        };
        assert_eq!(model.to_request().map_err(KernelError::Failed)?, expected);
        // Fewer named than kept: only those.
        let two = ConversationRef {
            messages: 2,
            ..named.clone()
        };
        let joined = kept_messages(&two, lookup)?;
        let parsed: Vec<Message> =
            serde_json::from_str(&joined).map_err(|e| KernelError::Failed(e.to_string()))?;
        assert_eq!(parsed, inline[..2]);
        Ok(())
    }

    #[test]
    fn a_missing_message_is_refused() {
        let kept: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let named = ConversationRef {
            session: "s1".into(),
            messages: usize::MAX,
            held: None,
        };
        let lookup = |key: &str| kept.get(key).map(Vec::as_slice);
        let err = kept_messages(&named, lookup);
        assert!(
            matches!(&err, Err(KernelError::Invalid(m)) if m.contains("holds no message 0")),
            "{err:?}"
        );
    }

    /// The one check both doors of `keel.conversation` `read` pass (the JSON one joins what
    /// it returns, the typed one parses it): only messages the request names, only while the
    /// conversation is as it was when the request was made.
    #[test]
    fn a_reading_beyond_the_request_or_after_a_change_is_refused() -> Result<(), KernelError> {
        let mut kept = BTreeMap::new();
        for (i, text) in ["one", "two", "three"].iter().enumerate() {
            let json = serde_json::to_vec(&message(text)).unwrap_or_default();
            kept.insert(keel_protocol::conversation_key("s1", i), json);
        }
        let lookup = |key: &str| kept.get(key).map(Vec::as_slice);
        let grant = ConversationGrant {
            keeper: "agent-loop".into(),
            session: "s1".into(),
            messages: 2,
            revision: 7,
        };
        let range = |from, to| keel_protocol::ConversationRead { from, to };
        let texts = read(&grant, 7, range(0, 2), lookup)?;
        assert_eq!(texts.len(), 2);
        let joined = join(&texts)?;
        let parsed: Vec<Message> =
            serde_json::from_str(&joined).map_err(|e| KernelError::Failed(e.to_string()))?;
        assert_eq!(parsed, vec![message("one"), message("two")]);
        // The third is kept, but the request named two.
        let err = read(&grant, 7, range(1, 3), lookup);
        assert!(
            matches!(&err, Err(KernelError::Invalid(m)) if m.contains("names the first 2")),
            "{err:?}"
        );
        let err = read(&grant, 7, range(2, 1), lookup);
        assert!(matches!(&err, Err(KernelError::Invalid(_))), "{err:?}");
        // A kept message changed since (the revision moved): nothing is read.
        let err = read(&grant, 8, range(0, 1), lookup);
        assert!(
            matches!(&err, Err(KernelError::Conflict(m)) if m.contains("changed since")),
            "{err:?}"
        );
        Ok(())
    }
}
