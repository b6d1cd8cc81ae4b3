//! The approvals inbox: a live session's approval questions, open to the page as well as the
//! terminal. Each question is answered once: whoever answers first (the page or the terminal)
//! settles it under the inbox's lock, and the other side is told who did and what they said.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;
use tokio::sync::broadcast;

/// Questions waiting at most; a page that answers nothing cannot make keel hold more.
const MAX_OPEN: usize = 64;

/// One answer the question offers, as the terminal lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    /// What the terminal takes (`y`, `s`, `a`, `n`).
    pub key: &'static str,
    /// What it lets run, in words.
    pub label: String,
}

/// An approval question as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Question {
    pub id: u64,
    /// The tool asking (and whose call it is, for a subagent's).
    pub tool: String,
    /// The command, or the path a write or edit changes.
    pub subject: String,
    /// The diff of a write or edit, as the terminal shows it (no colour).
    pub diff: Option<String>,
    /// Why the gate asks.
    pub reason: String,
    /// The whole question, word for word as the terminal prints it.
    pub wording: String,
    pub choices: Vec<Choice>,
}

/// What the page is told.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum InboxEvent {
    Asked(Question),
    Answered {
        id: u64,
        /// `page`, `terminal`, or `nobody` when the turn was cancelled first.
        by: &'static str,
        /// The answer in words.
        answer: String,
    },
}

struct Open {
    question: Question,
    /// Where the page's answer goes (the line it stands for, as if typed).
    reply: Sender<String>,
}

/// The open questions and who watches them.
pub struct Inbox {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Open>>,
    events: broadcast::Sender<InboxEvent>,
    /// Pages connected to a live session (the terminal asks the page only then).
    watching: AtomicU64,
}

/// The process's inbox: one live session per `keel run`.
pub fn inbox() -> &'static Arc<Inbox> {
    static INBOX: OnceLock<Arc<Inbox>> = OnceLock::new();
    INBOX.get_or_init(|| {
        Arc::new(Inbox {
            next: AtomicU64::new(1),
            open: Mutex::default(),
            events: broadcast::channel(256).0,
            watching: AtomicU64::new(0),
        })
    })
}

/// A question put to the page; dropping it withdraws the question if nobody answered.
pub struct Ticket {
    pub id: u64,
    pub answers: Receiver<String>,
    inbox: Arc<Inbox>,
    settled: bool,
}

impl Ticket {
    /// The question was answered by `by` (`page` or `terminal`): the page is told.
    pub fn settle(mut self, by: &'static str, answer: &str) {
        self.settled = true;
        self.inbox.settle(self.id, by, answer);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled {
            self.inbox.settle(
                self.id,
                "nobody",
                "withdrawn: the turn went on without an answer",
            );
        }
    }
}

impl Inbox {
    /// Whether a live page serves this session: a web server is up.
    pub fn served(&self) -> bool {
        self.watching.load(Ordering::SeqCst) > 0
    }

    pub(super) fn serving(&self, on: bool) {
        if on {
            self.watching.fetch_add(1, Ordering::SeqCst);
        } else {
            self.watching.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<InboxEvent> {
        self.events.subscribe()
    }

    /// The questions waiting, oldest first.
    pub fn open(&self) -> Vec<Question> {
        self.lock().values().map(|o| o.question.clone()).collect()
    }

    /// Put `question` (its `id` is assigned here) to the page. `None` when too many wait.
    pub fn ask(self: &Arc<Self>, mut question: Question) -> Option<Ticket> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        question.id = id;
        let (reply, answers) = channel();
        {
            let mut open = self.lock();
            if open.len() >= MAX_OPEN {
                return None;
            }
            open.insert(
                id,
                Open {
                    question: question.clone(),
                    reply,
                },
            );
        }
        let _ = self.events.send(InboxEvent::Asked(question));
        Some(Ticket {
            id,
            answers,
            inbox: self.clone(),
            settled: false,
        })
    }

    /// The page's answer to question `id`: `line` as the terminal would read it. `false` when
    /// the question was already answered (or never asked).
    pub fn answer_from_page(&self, id: u64, line: &str) -> bool {
        let Some(open) = self.lock().remove(&id) else {
            return false;
        };
        open.reply.send(line.to_owned()).is_ok()
    }

    /// Question `id` was settled by `by`; the page is told (through [`Ticket`], once).
    fn settle(&self, id: u64, by: &'static str, answer: &str) {
        self.lock().remove(&id);
        let _ = self.events.send(InboxEvent::Answered {
            id,
            by,
            answer: answer.to_owned(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question() -> Question {
        Question {
            id: 0,
            tool: "exec_shell".into(),
            subject: "touch x".into(),
            diff: None,
            reason: "it writes".into(),
            wording: "? exec_shell wants to run: touch x".into(),
            choices: vec![],
        }
    }

    fn fresh() -> Arc<Inbox> {
        Arc::new(Inbox {
            next: AtomicU64::new(1),
            open: Mutex::default(),
            events: broadcast::channel(16).0,
            watching: AtomicU64::new(0),
        })
    }

    #[test]
    fn the_first_answer_wins_and_the_other_side_is_told() {
        let inbox = fresh();
        let mut events = inbox.subscribe();
        let ticket = inbox.ask(question()).expect("room for a question");
        assert!(matches!(events.try_recv(), Ok(InboxEvent::Asked(q)) if q.id == ticket.id));
        assert_eq!(inbox.open().len(), 1);
        assert!(inbox.answer_from_page(ticket.id, "y"));
        assert_eq!(ticket.answers.try_recv().as_deref(), Ok("y"));
        // A second answer (another tab, the terminal racing) finds it settled.
        assert!(!inbox.answer_from_page(ticket.id, "n"));
        assert!(inbox.open().is_empty());
        ticket.settle("page", "yes, this once");
        assert!(matches!(
            events.try_recv(),
            Ok(InboxEvent::Answered { by: "page", .. })
        ));
        // Announced once: the ticket's end says nothing more.
        assert!(events.try_recv().is_err());
    }

    #[test]
    fn a_question_the_terminal_answered_cannot_be_answered_on_the_page() {
        let inbox = fresh();
        let ticket = inbox.ask(question()).expect("room for a question");
        let id = ticket.id;
        assert!(ticket.answers.try_recv().is_err());
        ticket.settle("terminal", "no");
        assert!(!inbox.answer_from_page(id, "y"));
    }

    #[test]
    fn open_questions_are_bounded_and_withdrawn_when_dropped() {
        let inbox = fresh();
        let tickets: Vec<_> = (0..MAX_OPEN)
            .map(|_| inbox.ask(question()).expect("room for a question"))
            .collect();
        assert!(inbox.ask(question()).is_none());
        drop(tickets);
        assert!(inbox.open().is_empty());
    }
}
