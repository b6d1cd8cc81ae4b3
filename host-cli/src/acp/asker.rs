//! The approver of a session an editor drives: the kernel's question (asked on a blocking
//! thread, as the terminal's is) goes to the session's turn, which puts it to the client as
//! `session/request_permission` and hands the answer back. The gates decide what is asked;
//! this only changes who is asked.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use keel_kernel::gates::approvals::{Answer, ApprovalRequest, Approver};

/// One question waiting for the client, with where its answer goes.
pub struct Question {
    pub request: ApprovalRequest,
    pub answer: std::sync::mpsc::SyncSender<Answer>,
}

/// See the [module documentation](self).
pub struct EditorAsker {
    questions: tokio::sync::mpsc::UnboundedSender<Question>,
    /// The turn is being cancelled: every question is a no at once, as Ctrl-C makes it on the
    /// terminal.
    cancelled: AtomicBool,
    /// The editor chose `never` for this session: every question is a no without asking.
    never: AtomicBool,
    /// Approval keys the client refused for the rest of the session ("no, and refuse any …").
    refused: Mutex<Vec<String>>,
}

impl EditorAsker {
    pub fn new() -> (EditorAsker, tokio::sync::mpsc::UnboundedReceiver<Question>) {
        let (questions, asked) = tokio::sync::mpsc::unbounded_channel();
        (
            EditorAsker {
                questions,
                cancelled: AtomicBool::new(false),
                never: AtomicBool::new(false),
                refused: Mutex::new(Vec::new()),
            },
            asked,
        )
    }

    pub fn set_cancelled(&self, cancelled: bool) {
        self.cancelled.store(cancelled, Ordering::SeqCst);
    }

    /// Refuse every question without asking (`never`), or ask again.
    pub fn set_never(&self, never: bool) {
        self.never.store(never, Ordering::SeqCst);
    }

    pub fn is_never(&self) -> bool {
        self.never.load(Ordering::SeqCst)
    }

    /// Refuse `key` without asking for the rest of the session.
    pub fn refuse(&self, key: &str) {
        let mut refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !refused.iter().any(|k| k == key) {
            refused.push(key.to_owned());
        }
    }

    fn is_refused(&self, request: &ApprovalRequest) -> bool {
        request.key.as_ref().is_some_and(|key| {
            self.refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|k| k == key)
        })
    }
}

impl Approver for EditorAsker {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        if self.cancelled.load(Ordering::SeqCst) || self.is_never() || self.is_refused(request) {
            return Answer::Deny;
        }
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let question = Question {
            request: request.clone(),
            answer,
        };
        if self.questions.send(question).is_err() {
            return Answer::Deny;
        }
        // A turn that ends, a client that goes away or a cancel drops or answers it: never
        // left waiting for good.
        answered.recv().unwrap_or(Answer::Deny)
    }
}
