//! Where the agent loop's conversations are: in kernel-held state, one key per message
//! ([`keel_protocol::conversation_key`]), the one copy the model adapter reads when a request
//! names the conversation. The loop keeps only each session's length and size (what the token
//! estimate needs every step) and reads the messages back when it needs them (a compaction, a
//! trim), which is rare.
//!
//! A session whose messages the kernel does not hold is held here whole instead, and its
//! requests carry it: when the doors keep nothing (a child agent's), or from the first message
//! the kernel could not keep (its state is full), since a request may name only a prefix the
//! kernel holds. Such a session keeps nothing more in state, so after a reload it goes on from
//! the prefix that was kept, never from messages with a gap.

use std::collections::HashMap;

use keel_protocol::{CONVERSATION_KEY_PREFIX, Message, conversation_key};

use crate::agent_loop::AgentDoors;
use crate::compaction::message_chars;

/// How long a session's conversation is, and how big.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Size {
    /// Messages.
    len: usize,
    /// Their characters, as the token estimate counts them.
    chars: usize,
}

impl Size {
    fn of(messages: &[Message]) -> Size {
        Size {
            len: messages.len(),
            chars: messages.iter().map(message_chars).sum(),
        }
    }
}

/// The conversations of the loop's sessions.
#[derive(Debug, Default)]
pub struct Conversations {
    sizes: HashMap<String, Size>,
    /// The sessions whose messages are here, not in the kernel.
    carried: HashMap<String, Vec<Message>>,
}

impl Conversations {
    /// The conversations the kernel kept for the loop (after a reload): each session's
    /// messages from the first, up to the first one missing or unreadable.
    pub fn restore<D: AgentDoors>(doors: &mut D) -> Conversations {
        let mut indices: HashMap<String, Vec<usize>> = HashMap::new();
        for key in doors.state_keys() {
            let Some((session, index)) = key
                .strip_prefix(CONVERSATION_KEY_PREFIX)
                .and_then(|rest| rest.rsplit_once('/'))
            else {
                continue;
            };
            if let Ok(index) = index.parse::<usize>() {
                indices.entry(session.to_owned()).or_default().push(index);
            }
        }
        let mut restored = Conversations::default();
        for (session, mut kept) in indices {
            kept.sort_unstable();
            let mut size = Size::default();
            for (expected, index) in kept.into_iter().enumerate() {
                let message = (index == expected)
                    .then(|| doors.state_get(&conversation_key(&session, index)))
                    .flatten()
                    .and_then(|bytes| serde_json::from_slice::<Message>(&bytes).ok());
                let Some(message) = message else { break };
                size.len += 1;
                size.chars += message_chars(&message);
            }
            restored.sizes.insert(session, size);
        }
        restored
    }

    /// How many messages `session` has.
    pub fn len(&self, session: &str) -> usize {
        self.sizes.get(session).map_or(0, |s| s.len)
    }

    /// The characters of `session`'s messages, as the token estimate counts them.
    pub fn chars(&self, session: &str) -> usize {
        self.sizes.get(session).map_or(0, |s| s.chars)
    }

    /// The messages of a session held here (whose requests carry them); `None` for one the
    /// kernel holds, whose requests may name them.
    pub fn carried(&self, session: &str) -> Option<&[Message]> {
        self.carried.get(session).map(Vec::as_slice)
    }

    /// Appends `message` to `session`: kept in the kernel, or held here.
    pub fn push<D: AgentDoors>(&mut self, doors: &mut D, session: &str, message: &Message) {
        let size = self.sizes.entry(session.to_owned()).or_default();
        let index = size.len;
        size.len += 1;
        size.chars += message_chars(message);
        if let Some(carried) = self.carried.get_mut(session) {
            carried.push(message.clone());
            return;
        }
        if !doors.keeps_conversation() {
            self.carried
                .insert(session.to_owned(), vec![message.clone()]);
            return;
        }
        if let Err(e) = keep(doors, session, index, message) {
            doors.warn(&format!(
                "conversation of `{session}` not kept in the kernel from message {index} on \
                 ({e}); its requests carry it, and a reload of the agent goes on from the \
                 messages kept before it"
            ));
            let mut all = match read(doors, session, index) {
                Ok(all) => all,
                Err(e) => {
                    doors.warn(&e);
                    Vec::new()
                }
            };
            all.push(message.clone());
            self.carried.insert(session.to_owned(), all);
        }
    }

    /// Every message of `session`, read back from the kernel (or from here); an error when
    /// the kernel no longer holds one of them.
    pub fn messages<D: AgentDoors>(
        &self,
        doors: &mut D,
        session: &str,
    ) -> Result<Vec<Message>, String> {
        match self.carried.get(session) {
            Some(carried) => Ok(carried.clone()),
            None => read(doors, session, self.len(session)),
        }
    }

    /// Replaces `session`'s conversation by `messages` (a compaction, a trim, a resume): in
    /// the kernel, the surplus keys removed, or here when the kernel cannot keep them.
    pub fn replace<D: AgentDoors>(&mut self, doors: &mut D, session: &str, messages: Vec<Message>) {
        let old = self.len(session);
        self.carried.remove(session);
        self.sizes.insert(session.to_owned(), Size::of(&messages));
        if !doors.keeps_conversation() {
            self.carried.insert(session.to_owned(), messages);
            return;
        }
        let failed = messages
            .iter()
            .enumerate()
            .find_map(|(i, m)| keep(doors, session, i, m).err().map(|e| (i, e)));
        let kept = failed.as_ref().map_or(messages.len(), |(i, _)| *i);
        for i in kept..old.max(messages.len()) {
            doors.state_remove(&conversation_key(session, i));
        }
        if let Some((i, e)) = failed {
            doors.warn(&format!(
                "conversation of `{session}` not kept in the kernel from message {i} on ({e}); \
                 its requests carry it"
            ));
            self.carried.insert(session.to_owned(), messages);
        }
    }
}

/// Keeps message `index` of `session` in kernel-held state.
fn keep<D: AgentDoors>(
    doors: &mut D,
    session: &str,
    index: usize,
    message: &Message,
) -> Result<(), String> {
    let bytes = serde_json::to_vec(message).map_err(|e| e.to_string())?;
    doors
        .state_set(&conversation_key(session, index), &bytes)
        .map_err(|e| e.to_string())
}

/// The first `len` messages of `session` as the kernel holds them.
fn read<D: AgentDoors>(doors: &mut D, session: &str, len: usize) -> Result<Vec<Message>, String> {
    (0..len)
        .map(|i| {
            doors
                .state_get(&conversation_key(session, i))
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .ok_or_else(|| {
                    format!(
                        "message {i} of `{session}`'s conversation is missing from kernel-held \
                         state"
                    )
                })
        })
        .collect()
}
