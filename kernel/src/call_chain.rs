//! The call chain: which plugins a call has passed through, from the host or kernel inward,
//! and the budget every call on it shares: a wall-clock deadline, an account of guest CPU, and
//! whether Ctrl-C stops it. The kernel refuses re-entrant calls against the chain, answers
//! `keel.caller` from it, and bounds every call into a guest by its budget.
//!
//! # Why the budget travels with the chain
//!
//! A budget per call would let a plugin escape it by delegating: a guest that loops calling
//! another plugin spends almost no time itself, and every nested call would start a fresh
//! allowance. So the kernel opens a new budget only at the doors it runs on the user's behalf
//! (a turn, a tool call, a model call, a guard, an event delivery, an activation); a service
//! call from one plugin to another is charged to the budget of the call it is part of, and its
//! deadline is never later than its caller's.
//!
//! # Why an agent's account is renewed per step
//!
//! A turn (host → agent) and a child agent's run are one call each, but they last as long as
//! the task: hundreds of model requests and tool calls. Those each open their own account, so
//! what is left on the turn's account is the agent's own work between them and the service
//! calls it makes itself (the tool registry, the session log, compaction's bookkeeping). Held
//! to one limit for the whole turn, that ran out after about 250 tool calls of ordinary work.
//! So the account opened at a turn or child door is *per step*: it is renewed each time the
//! agent that owns it asks the model for the next step (`agent.complete`, see
//! [`CallChain::renew_step`]). An agent spinning without calling out, or burning CPU through
//! the services it calls, is still stopped within one step's allowance; one that keeps asking
//! the model is bounded by its step limit, the person's turn deadline (`[timeouts]
//! turn-secs`, none by default) and Ctrl-C, as the person's own turn should be.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::agents::AgentScope;

/// The door a call came through: it sets the call's deadline and whether the call starts a
/// CPU account of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// The host asks the agent for a turn. No deadline unless the person set one (the person
    /// ends it with Ctrl-C); its CPU account is renewed at every step; at Ctrl-C the agent sees its inner calls stopped and ends the turn itself, and is stopped
    /// only if it has not within a longer grace.
    Turn,
    /// A tool call, through the gate pipeline or from the host.
    Tool,
    /// A tool call served by a plugin that drives agents (the `agent` capability): a whole
    /// child agent's run, whose own model and tool calls each have their deadlines.
    Child,
    /// A call to the `model` service.
    Model,
    /// A guard asked about a tool call.
    Guard,
    /// An event handed to a subscriber.
    Event,
    /// Any other service call.
    Service,
    /// Activation or deactivation.
    Lifecycle,
}

impl CallKind {
    /// How the deadline of this kind is named in messages and in the user's config.
    pub fn deadline_name(self) -> (&'static str, &'static str) {
        match self {
            CallKind::Turn => ("turn", "turn-secs"),
            CallKind::Tool => ("tool-call", "tool-secs"),
            CallKind::Child => ("subagent", "subagent-secs"),
            CallKind::Model => ("model-call", "model-secs"),
            CallKind::Guard => ("guard", "service-secs"),
            CallKind::Event => ("event-handler", "event-secs"),
            CallKind::Service => ("service-call", "service-secs"),
            CallKind::Lifecycle => ("activation", "service-secs"),
        }
    }
}

/// How long a call through each kind of door may take, wall clock, before the kernel stops it.
/// A nested call gets the smaller of its own and its caller's remaining time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// A tool call (default 300 s).
    pub tool: Duration,
    /// A child agent's whole run, one tool call of a plugin that drives agents (default
    /// 1800 s).
    pub subagent: Duration,
    /// A model call: one whole completion, streamed (default 600 s).
    pub model: Duration,
    /// Any other service call, a guard, an activation (default 120 s).
    pub service: Duration,
    /// One event handled by one subscriber (default 30 s).
    pub event: Duration,
    /// A whole turn, when the person set one (`[timeouts] turn-secs`; none by default: a turn
    /// is bounded by its step limit and Ctrl-C).
    pub turn: Option<Duration>,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            tool: Duration::from_secs(300),
            subagent: Duration::from_secs(1800),
            model: Duration::from_secs(600),
            service: Duration::from_secs(120),
            event: Duration::from_secs(30),
            turn: None,
        }
    }
}

impl Deadlines {
    /// The deadline of `kind`; `None` for a turn unless the person set one.
    pub fn of(&self, kind: CallKind) -> Option<Duration> {
        match kind {
            CallKind::Turn => self.turn,
            CallKind::Tool => Some(self.tool),
            CallKind::Child => Some(self.subagent),
            CallKind::Model => Some(self.model),
            CallKind::Event => Some(self.event),
            CallKind::Guard | CallKind::Service | CallKind::Lifecycle => Some(self.service),
        }
    }
}

/// Guest CPU spent on behalf of one root call, by every plugin the call passed through, and
/// the limit it is held to: the per-call limit of the first plugin that ran guest code for it.
/// An agent's account (a turn's, a child's run) is held to it per step instead: see the
/// module documentation.
#[derive(Debug, Default)]
pub struct CpuAccount {
    spent_ns: AtomicU64,
    /// Everything ever charged, never renewed: what the call figures read.
    ever_ns: AtomicU64,
    /// 0 until the first metered plugin enters.
    limit_ns: AtomicU64,
    /// Whether [`renew`](Self::renew) starts it afresh (an account opened at a turn or child
    /// door).
    per_step: bool,
}

impl CpuAccount {
    /// An account renewed at every step of the agent that owns it.
    pub(crate) fn per_step() -> Self {
        CpuAccount {
            per_step: true,
            ..CpuAccount::default()
        }
    }

    /// Start a per-step account afresh; whether it was one (others are never renewed).
    pub(crate) fn renew(&self) -> bool {
        if self.per_step {
            self.spent_ns.store(0, Ordering::Relaxed);
        }
        self.per_step
    }

    /// Add guest time.
    pub(crate) fn charge(&self, time: Duration) {
        let ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
        self.ever_ns.fetch_add(ns, Ordering::Relaxed);
        // Saturating: an account that reached u64::MAX ns is far over any limit anyway.
        let _ = self
            .spent_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s.saturating_add(ns))
            });
    }

    /// Guest time charged so far.
    pub(crate) fn spent(&self) -> Duration {
        Duration::from_nanos(self.spent_ns.load(Ordering::Relaxed))
    }

    /// Guest time charged since the account was opened, renewals included.
    pub(crate) fn charged_ever(&self) -> Duration {
        Duration::from_nanos(self.ever_ns.load(Ordering::Relaxed))
    }

    /// The account's limit, once a metered plugin has set it.
    pub(crate) fn limit(&self) -> Option<Duration> {
        match self.limit_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The account's limit, set to `own` if no plugin has set it yet.
    pub(crate) fn limit_or(&self, own: Duration) -> Duration {
        let own_ns = u64::try_from(own.as_nanos()).unwrap_or(u64::MAX).max(1);
        match self
            .limit_ns
            .compare_exchange(0, own_ns, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => own,
            Err(set) => Duration::from_nanos(set),
        }
    }
}

/// The wall-clock deadline of a chain and which door set it.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// When every call on the chain must have returned.
    pub at: Instant,
    /// The kind whose deadline it is.
    pub kind: CallKind,
    /// Its length.
    pub length: Duration,
}

/// The budget calls on a chain share.
#[derive(Debug, Clone, Default)]
struct Budget {
    deadline: Option<Deadline>,
    cpu: Arc<CpuAccount>,
    /// Part of the person's turn: Ctrl-C stops it.
    interruptible: bool,
    /// Calls made under it are part of the person's turn.
    in_turn: bool,
    /// The length of the chain at the door that opened `cpu` when it is per step: only the
    /// agent in that frame renews it.
    step_owner: Option<usize>,
}

/// The plugins a call has passed through, outermost first, and the budget the calls on it
/// share. Used to refuse re-entrant calls (a store is exclusive while a call runs, so
/// A → B → A would otherwise deadlock) and to bound every call into a guest.
#[derive(Debug, Clone, Default)]
pub struct CallChain {
    plugins: Vec<Arc<str>>,
    budget: Budget,
    /// The child agent the calls on this chain act for (`None`: the main agent).
    agent: Option<Arc<AgentScope>>,
    /// A child agent the innermost plugin opened while serving this call; the calls it makes
    /// from then on act for that child.
    opened: Arc<OnceLock<Arc<AgentScope>>>,
    /// The tool call the innermost plugin serves (call id, tool owner), set by the
    /// dispatcher for exactly that plugin's frame.
    serving: Option<(Arc<str>, Arc<str>)>,
    /// The tool call the next frame will serve, if that frame is the tool owner's.
    serve_next: Option<(Arc<str>, Arc<str>)>,
    /// The conversation the innermost plugin may read through `keel.conversation`: set by the
    /// kernel for exactly the frame that serves one `model.complete` whose request names it.
    reading: Option<Arc<ConversationGrant>>,
    /// The conversation the next frame may read.
    read_next: Option<Arc<ConversationGrant>>,
}

/// A held conversation one model call may read: the first `messages` messages of `session`
/// that `keeper` keeps, as they were at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConversationGrant {
    pub(crate) keeper: String,
    pub(crate) session: String,
    pub(crate) messages: usize,
    pub(crate) revision: u64,
}

impl CallChain {
    /// A chain that starts at `plugin`, with a budget of its own and no deadline.
    pub fn starting_at(plugin: &str) -> Self {
        CallChain {
            plugins: vec![Arc::from(plugin)],
            ..CallChain::default()
        }
    }

    /// This chain extended by `plugin`, sharing its budget. The new frame acts for the child
    /// agent its caller opened, if any, else for its caller's.
    pub fn then(&self, plugin: &str) -> Self {
        let mut next = self.plugins.clone();
        next.push(Arc::from(plugin));
        CallChain {
            plugins: next,
            budget: self.budget.clone(),
            agent: self.opened.get().cloned().or_else(|| self.agent.clone()),
            opened: Arc::default(),
            serving: self
                .serve_next
                .clone()
                .filter(|(_, owner)| &**owner == plugin),
            serve_next: None,
            reading: self.read_next.clone(),
            read_next: None,
        }
    }

    /// This chain, about to hand a model request naming `grant`'s conversation to its
    /// provider: the frame entered next, and no other, may read it.
    pub(crate) fn reading_conversation(&self, grant: ConversationGrant) -> Self {
        CallChain {
            read_next: Some(Arc::new(grant)),
            ..self.clone()
        }
    }

    /// The conversation the innermost plugin may read, if any.
    pub(crate) fn conversation_grant(&self) -> Option<&ConversationGrant> {
        self.reading.as_deref()
    }

    /// This chain, about to run tool call `id` of `owner`: the frame entered next, if it is
    /// `owner`'s, serves that call.
    pub(crate) fn serving_call(&self, id: &str, owner: &str) -> Self {
        CallChain {
            serve_next: Some((Arc::from(id), Arc::from(owner))),
            ..self.clone()
        }
    }

    /// The id of the tool call the innermost plugin serves, if it serves one.
    pub(crate) fn served_call(&self) -> Option<&str> {
        self.serving.as_ref().map(|(id, _)| &**id)
    }

    /// The child agent the innermost plugin opened in this call.
    pub(crate) fn opened_agent(&self) -> Option<&Arc<AgentScope>> {
        self.opened.get()
    }

    /// Open `scope` for this call; refused when one is open already.
    pub(crate) fn open_agent(&self, scope: Arc<AgentScope>) -> Result<(), Arc<AgentScope>> {
        self.opened.set(scope)
    }

    /// The child agent this chain's calls act for: the one the innermost plugin opened, else
    /// the one it was called under (`None`: the main agent).
    pub(crate) fn acting_agent(&self) -> Option<&Arc<AgentScope>> {
        self.opened.get().or(self.agent.as_ref())
    }

    /// The child agent the innermost plugin was called under (the parent of one it opens).
    pub(crate) fn parent_agent(&self) -> Option<&Arc<AgentScope>> {
        self.agent.as_ref()
    }

    /// The chain of a `kind` call into `plugin` made on this chain at `now`: a new CPU account
    /// if the kernel opens one at this door (every kind but a plugin's service call, and every
    /// call straight from the host), the earlier of the caller's deadline and this kind's.
    pub(crate) fn enter(
        &self,
        plugin: &str,
        kind: CallKind,
        deadlines: &Deadlines,
        now: Instant,
    ) -> Self {
        let mut next = self.then(plugin);
        let shares_account = kind == CallKind::Service && !self.is_root();
        if !shares_account {
            if matches!(kind, CallKind::Turn | CallKind::Child) {
                next.budget.cpu = Arc::new(CpuAccount::per_step());
                next.budget.step_owner = Some(next.plugins.len());
            } else {
                next.budget.cpu = Arc::default();
                next.budget.step_owner = None;
            }
        }
        if let Some(length) = deadlines.of(kind) {
            let own = Deadline {
                at: now + length,
                kind,
                length,
            };
            next.budget.deadline = Some(match self.budget.deadline {
                Some(caller) if caller.at <= own.at => caller,
                _ => own,
            });
        }
        let in_turn = match kind {
            CallKind::Turn
            | CallKind::Tool
            | CallKind::Child
            | CallKind::Model
            | CallKind::Guard => true,
            CallKind::Service => self.budget.in_turn,
            CallKind::Event | CallKind::Lifecycle => false,
        };
        next.budget.in_turn = in_turn;
        next.budget.interruptible = in_turn;
        next
    }

    /// Whether the chain is only its start (the host, or a plugin outside any call): a call
    /// made on it is the first of its chain.
    pub fn is_root(&self) -> bool {
        self.plugins.len() <= 1
    }

    /// Whether `plugin` is already inside this chain.
    pub fn contains(&self, plugin: &str) -> bool {
        self.plugins.iter().any(|p| &**p == plugin)
    }

    /// The plugins in the chain, outermost first.
    pub fn plugins(&self) -> impl Iterator<Item = &str> {
        self.plugins.iter().map(|p| &**p)
    }

    /// When calls on this chain must have returned, if ever.
    pub fn deadline(&self) -> Option<Deadline> {
        self.budget.deadline
    }

    /// The guest-CPU account of this chain.
    pub fn cpu(&self) -> &Arc<CpuAccount> {
        &self.budget.cpu
    }

    /// Whether Ctrl-C stops calls on this chain.
    pub fn interruptible(&self) -> bool {
        self.budget.interruptible
    }

    /// The agent in this frame asks the model for its next step: if it owns a per-step
    /// account (it serves a turn or a child's run, and is the frame the door opened), that
    /// account starts afresh; whether it did. A plugin further in on the chain renews nothing.
    pub(crate) fn renew_step(&self) -> bool {
        self.budget.step_owner == Some(self.plugins.len()) && self.budget.cpu.renew()
    }
}

impl fmt::Display for CallChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.plugins().collect();
        f.write_str(&names.join(" → "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_service_call_shares_its_callers_account_and_never_outlives_its_deadline() {
        let deadlines = Deadlines {
            tool: Duration::from_secs(10),
            service: Duration::from_secs(60),
            ..Deadlines::default()
        };
        let now = Instant::now();
        let host = CallChain::starting_at("keel");
        let tool = host.enter("a", CallKind::Tool, &deadlines, now);
        assert!(tool.interruptible());
        let nested = tool.enter("b", CallKind::Service, &deadlines, now);
        assert!(Arc::ptr_eq(tool.cpu(), nested.cpu()), "charged to the root");
        let d = nested.deadline().expect("a deadline");
        assert_eq!(
            d.kind,
            CallKind::Tool,
            "the caller's earlier deadline holds"
        );
        assert_eq!(d.at, now + Duration::from_secs(10));
        assert!(nested.interruptible());
        // A service call straight from the host opens its own account, outside any turn.
        let direct = host.enter("b", CallKind::Service, &deadlines, now);
        assert!(!Arc::ptr_eq(direct.cpu(), tool.cpu()));
        assert!(!direct.interruptible());
        // A turn has no deadline; Ctrl-C stops it (after a longer grace) and what it calls.
        let turn = host.enter("agent", CallKind::Turn, &deadlines, now);
        assert!(turn.deadline().is_none() && turn.interruptible());
        let model = turn.enter("model", CallKind::Model, &deadlines, now);
        assert!(model.interruptible() && !Arc::ptr_eq(model.cpu(), turn.cpu()));
        let log = turn.enter("log", CallKind::Service, &deadlines, now);
        assert!(log.interruptible() && Arc::ptr_eq(log.cpu(), turn.cpu()));
        // Events are nobody's turn.
        let event = host.enter("log", CallKind::Event, &deadlines, now);
        assert!(!event.interruptible());
    }

    #[tokio::test]
    async fn only_the_agent_that_opened_a_turn_or_child_renews_its_account_per_step() {
        let deadlines = Deadlines::default();
        let now = Instant::now();
        let host = CallChain::starting_at("keel");
        let turn = host.enter("agent", CallKind::Turn, &deadlines, now);
        turn.cpu().charge(Duration::from_millis(900));
        // A service the agent calls shares the account but cannot renew it.
        let log = turn.enter("log", CallKind::Service, &deadlines, now);
        log.cpu().charge(Duration::from_millis(100));
        assert!(!log.renew_step());
        assert_eq!(turn.cpu().spent(), Duration::from_secs(1));
        // The agent asking for its next step does.
        assert!(turn.renew_step());
        assert_eq!(log.cpu().spent(), Duration::ZERO);
        // A child's run (a tool call into a plugin that drives agents) is per step too; a
        // plain tool call, a model call or a service call from the host never is.
        let child = turn.enter("subagents", CallKind::Child, &deadlines, now);
        child.cpu().charge(Duration::from_millis(5));
        assert!(child.renew_step() && child.cpu().spent() == Duration::ZERO);
        for kind in [CallKind::Tool, CallKind::Model, CallKind::Guard] {
            let call = turn.enter("p", kind, &deadlines, now);
            call.cpu().charge(Duration::from_millis(5));
            assert!(!call.renew_step(), "{kind:?}");
            assert_eq!(call.cpu().spent(), Duration::from_millis(5));
        }
        let direct = host.enter("agent", CallKind::Service, &deadlines, now);
        assert!(!direct.renew_step());
        // A turn has no deadline unless the person set one.
        assert!(turn.deadline().is_none());
        let bounded = Deadlines {
            turn: Some(Duration::from_secs(5)),
            ..Deadlines::default()
        };
        let turn = host.enter("agent", CallKind::Turn, &bounded, now);
        assert_eq!(
            turn.deadline().map(|d| d.at),
            Some(now + Duration::from_secs(5))
        );
        let model = turn.enter("model", CallKind::Model, &bounded, now);
        assert_eq!(model.deadline().map(|d| d.kind), Some(CallKind::Turn));
    }

    #[test]
    fn the_first_limit_set_is_the_accounts() {
        let account = CpuAccount::default();
        assert_eq!(
            account.limit_or(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            account.limit_or(Duration::from_secs(5)),
            Duration::from_millis(500)
        );
        account.charge(Duration::from_millis(3));
        account.charge(Duration::from_millis(4));
        assert_eq!(account.spent(), Duration::from_millis(7));
    }
}
