//! From the kernel's broadcasts to spans and metrics.
//!
//! What each span covers (times are when the entry reached this task, within a millisecond or
//! so of when the agent loop logged it):
//!
//! - `keel.turn` (a root; for a subagent, a child of the parent's `keel.tool.call` that
//!   started it): from the person's input entering the conversation (the first user message
//!   while no turn is open) to the `TurnEnded` entry.
//! - `keel.model.call` (child of the turn): from the turn's start, or from the tool results of
//!   the step before (logged right after the last `ToolOutcome`), to the assistant message the
//!   call produced. It includes the context fitting (compaction) before the request. A
//!   request that failed is a span with an error status ending at `TurnEnded`.
//! - `keel.tool.call` (child of the turn): from the assistant message asking for it to its
//!   `ToolOutcome`, so it includes the gates' checks and any approval wait (`ToolStarted`
//!   goes to the session log by a service call, not over the bus). The gate's decision
//!   is its `keel.tool.status` (`ok`, `error`, `refused`, `not_executed`, or `unfinished` when
//!   the turn ended first) with an event `keel.gate.refused` / `keel.gate.not_executed`, and
//!   one `keel.exec` event per command the kernel ran (exit code, whether it timed out).
//! - `keel.plugin.<change>` (a root of no length): a plugin loaded, reloaded, restarted,
//!   changed state or unloaded.
//! - `keel.compaction` (a root of no length) for a compaction outside a turn; inside one it
//!   is an event `keel.compacted` of the turn.
//!
//! Metrics: `gen_ai.client.token.usage` (tokens per model call, `gen_ai.token.type` input or
//! output), `keel.turn.duration`, `keel.model.call.duration`, `keel.tool.call.duration` (s),
//! and per plugin the kernel's call figures (`keel.plugin.calls`, `keel.plugin.call.failures`,
//! `keel.plugin.call.wall_time`, `keel.plugin.call.cpu_time`, µs), read when metrics go out.

use std::collections::HashMap;
use std::time::SystemTime;

use keel_kernel::{Event, Kernel, PluginChange, PluginChangeKind};
use keel_protocol::{Block, Message, OutcomeStatus, Role, SessionEvent, ToolOutcome, TurnEnd};
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::{Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracer;
use tokio::sync::{broadcast, oneshot};

/// The most bytes of one content attribute (`content = true`); longer text is cut there.
pub(super) const MAX_CONTENT: usize = 4096;

/// The tracer, the instruments and the settings: what every agent's entries are recorded with.
pub(super) struct Instruments {
    tracer: SdkTracer,
    content: bool,
    model: String,
    turn_time: Histogram<f64>,
    model_time: Histogram<f64>,
    tool_time: Histogram<f64>,
    tokens: Histogram<u64>,
    lost: Counter<u64>,
}

/// One agent's open spans: the session's main agent, or a subagent.
#[derive(Default)]
struct Agent {
    /// A subagent's parent tool call span, and the call's id.
    parent: Option<(Context, String)>,
    /// A subagent's number and label.
    child: Option<(u64, String)>,
    turn: Option<Turn>,
    /// The tool calls of the last assistant message: id → (name as written, arguments).
    calls: HashMap<String, (String, String)>,
}

struct Turn {
    cx: Context,
    start: SystemTime,
    /// When the model call now running began (none between its answer and the next step).
    model_since: Option<SystemTime>,
    /// Open tool calls: id → (span, start, name).
    tools: HashMap<String, (Context, SystemTime, String)>,
    model_calls: i64,
    tool_calls: i64,
}

/// The task's state: the instruments, the main agent and the subagents running, by the
/// kernel's number (a grandchild's entries come on `subagent.event` like a child's).
pub(super) struct Recorder {
    inst: Instruments,
    main: Agent,
    children: HashMap<u64, Agent>,
}

impl Recorder {
    pub(super) fn new(
        tracer: SdkTracer,
        meters: &SdkMeterProvider,
        kernel: Kernel,
        content: bool,
    ) -> Recorder {
        let meter = meters.meter("keel");
        let seconds = |name: &'static str, what: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(what)
                .build()
        };
        let inst = Instruments {
            tracer,
            content,
            model: String::new(),
            turn_time: seconds("keel.turn.duration", "How long a turn took."),
            model_time: seconds("keel.model.call.duration", "How long a model call took."),
            tool_time: seconds("keel.tool.call.duration", "How long a tool call took."),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens per model call, input or output.")
                .build(),
            lost: meter
                .u64_counter("keel.telemetry.lost_events")
                .with_description("Bus entries the exporter fell too far behind to read.")
                .build(),
        };
        // The kernel's per-plugin call figures, read each time metrics go out.
        type Pick = fn(&keel_kernel::CallFigures) -> u64;
        let figures: [(&'static str, &'static str, Pick); 4] = [
            ("keel.plugin.calls", "{call}", |f| f.calls),
            ("keel.plugin.call.failures", "{call}", |f| f.failed),
            ("keel.plugin.call.wall_time", "us", |f| f.wall_us),
            ("keel.plugin.call.cpu_time", "us", |f| f.cpu_us),
        ];
        for (name, unit, pick) in figures {
            let kernel = kernel.clone();
            meter
                .u64_observable_counter(name)
                .with_unit(unit)
                .with_callback(move |observer| {
                    for (plugin, f) in kernel.call_figures() {
                        observer.observe(pick(&f), &[KeyValue::new("keel.plugin.name", plugin)]);
                    }
                })
                .build();
        }
        Recorder {
            inst,
            main: Agent::default(),
            children: HashMap::new(),
        }
    }

    fn on_bus(&mut self, event: Event) {
        use keel_protocol::topics;
        // The kernel takes `session.event` only from the `agent` provider, and
        // `subagent.event` only from the plugin holding that child.
        if event.topic == topics::SESSION_EVENT {
            let Ok(entry) = serde_json::from_str::<SessionEvent>(&event.payload) else {
                return;
            };
            if let SessionEvent::SessionStarted { model, .. } = &entry {
                self.inst.model = model.clone();
            }
            on_entry(&self.inst, &mut self.main, entry, SystemTime::now());
        } else if event.topic == topics::SUBAGENT_EVENT {
            let Ok(sub) = serde_json::from_str::<keel_protocol::SubagentEvent>(&event.payload)
            else {
                return;
            };
            self.on_subagent(sub, SystemTime::now());
        }
    }

    /// A child agent's entry: its spans go under the tool call that started it, found among
    /// the open calls of the main agent, then of the other children (a grandchild's). Call ids
    /// of children running at once may coincide; the first open call of that id is taken.
    fn on_subagent(&mut self, sub: keel_protocol::SubagentEvent, now: SystemTime) {
        if !self.children.contains_key(&sub.child) {
            let open = |agent: &Agent| {
                agent
                    .turn
                    .as_ref()
                    .and_then(|t| t.tools.get(&sub.parent_call))
                    .map(|(cx, _, _)| cx.clone())
            };
            let parent = open(&self.main).or_else(|| self.children.values().find_map(open));
            self.children.insert(
                sub.child,
                Agent {
                    parent: parent.map(|cx| (cx, sub.parent_call.clone())),
                    child: Some((sub.child, sub.label.clone())),
                    ..Agent::default()
                },
            );
        }
        let ended = matches!(sub.event, SessionEvent::TurnEnded { .. });
        if let Some(agent) = self.children.get_mut(&sub.child) {
            on_entry(&self.inst, agent, sub.event, now);
        }
        if ended {
            self.children.remove(&sub.child);
        }
    }

    fn on_change(&mut self, change: PluginChange) {
        let now = SystemTime::now();
        let (what, from) = match &change.kind {
            PluginChangeKind::Loaded => ("loaded", None),
            PluginChangeKind::Reloaded { from } => ("reloaded", Some(from.to_string())),
            PluginChangeKind::Restarted => ("restarted", None),
            PluginChangeKind::State { from } => ("state", Some(from.clone())),
            PluginChangeKind::Unloaded => ("unloaded", None),
        };
        let mut attrs = vec![
            KeyValue::new("keel.plugin.name", change.plugin.clone()),
            KeyValue::new("keel.plugin.change", what),
        ];
        if let Some(from) = from {
            attrs.push(KeyValue::new("keel.plugin.from", from));
        }
        if let Some(status) = &change.status {
            attrs.push(KeyValue::new(
                "keel.plugin.version",
                status.version.to_string(),
            ));
            attrs.push(KeyValue::new("keel.plugin.state", status.state.name()));
            attrs.push(KeyValue::new(
                "keel.plugin.kind",
                format!("{:?}", status.kind).to_lowercase(),
            ));
        }
        let span = self
            .inst
            .tracer
            .span_builder(format!("keel.plugin.{what}"))
            .with_start_time(now)
            .with_attributes(attrs)
            .start_with_context(&self.inst.tracer, &Context::new());
        Context::new()
            .with_span(span)
            .span()
            .end_with_timestamp(now);
    }

    fn lost(&self, n: u64) {
        self.inst.lost.add(n, &[]);
    }

    /// End whatever is still open (the session closed mid-turn).
    fn finish(&mut self) {
        let now = SystemTime::now();
        for (_, mut child) in self.children.drain() {
            end_agent(&self.inst, &mut child, now);
        }
        end_agent(&self.inst, &mut self.main, now);
    }
}

/// Read the broadcasts until `stop`, then what is left of them, then end what is still open.
pub(super) async fn run(
    mut rec: Recorder,
    mut events: broadcast::Receiver<Event>,
    mut changes: broadcast::Receiver<PluginChange>,
    mut stop: oneshot::Receiver<()>,
) {
    use broadcast::error::{RecvError, TryRecvError};
    let (mut events_open, mut changes_open) = (true, true);
    while events_open || changes_open {
        tokio::select! {
            biased;
            e = events.recv(), if events_open => match e {
                Ok(e) => rec.on_bus(e),
                Err(RecvError::Lagged(n)) => rec.lost(n),
                Err(RecvError::Closed) => events_open = false,
            },
            c = changes.recv(), if changes_open => match c {
                Ok(c) => rec.on_change(c),
                Err(RecvError::Lagged(n)) => rec.lost(n),
                Err(RecvError::Closed) => changes_open = false,
            },
            _ = &mut stop => break,
        }
    }
    loop {
        match events.try_recv() {
            Ok(e) => rec.on_bus(e),
            Err(TryRecvError::Lagged(n)) => rec.lost(n),
            Err(_) => break,
        }
    }
    loop {
        match changes.try_recv() {
            Ok(c) => rec.on_change(c),
            Err(TryRecvError::Lagged(n)) => rec.lost(n),
            Err(_) => break,
        }
    }
    rec.finish();
}

/// `text` as an attribute value, cut to [`MAX_CONTENT`] bytes (at a character boundary).
pub(super) fn bounded(text: &str) -> String {
    if text.len() <= MAX_CONTENT {
        return text.to_owned();
    }
    let mut end = MAX_CONTENT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn seconds(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map_or(0.0, |d| d.as_secs_f64())
}

/// A span named `name` under `parent`, started at `start`.
fn child_span(
    inst: &Instruments,
    name: &'static str,
    parent: &Context,
    start: SystemTime,
    attrs: Vec<KeyValue>,
) -> Context {
    let span = inst
        .tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attrs)
        .start_with_context(&inst.tracer, parent);
    Context::new().with_span(span)
}

/// A tool call's span under the turn `parent`, started at `start`.
fn tool_span(
    inst: &Instruments,
    parent: &Context,
    id: &str,
    name: &str,
    arguments: &str,
    start: SystemTime,
) -> Context {
    let mut attrs = vec![
        KeyValue::new("keel.tool.call_id", id.to_owned()),
        KeyValue::new("keel.tool.name", name.to_owned()),
    ];
    if inst.content {
        attrs.push(KeyValue::new("keel.tool.arguments", bounded(arguments)));
    }
    child_span(inst, "keel.tool.call", parent, start, attrs)
}

fn on_entry(inst: &Instruments, agent: &mut Agent, entry: SessionEvent, now: SystemTime) {
    match entry {
        SessionEvent::Message {
            session,
            message,
            stop_reason,
            usage,
        } => match message.role {
            Role::User => on_user_message(inst, agent, &session, &message, now),
            Role::Assistant => {
                agent.calls = message
                    .tool_calls()
                    .map(|(id, name, args)| (id.to_owned(), (name.to_owned(), args.to_owned())))
                    .collect();
                let Some(turn) = &mut agent.turn else {
                    return;
                };
                let start = turn.model_since.take().unwrap_or(now);
                let mut attrs = vec![KeyValue::new("gen_ai.request.model", inst.model.clone())];
                if let Some(u) = &usage {
                    attrs.push(KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        u.input_tokens as i64,
                    ));
                    attrs.push(KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        u.output_tokens as i64,
                    ));
                    attrs.push(KeyValue::new(
                        "keel.usage.cache_read_tokens",
                        u.cache_read_tokens as i64,
                    ));
                    attrs.push(KeyValue::new(
                        "keel.usage.cache_write_tokens",
                        u.cache_write_tokens as i64,
                    ));
                    let model = KeyValue::new("gen_ai.request.model", inst.model.clone());
                    inst.tokens.record(
                        u.input_tokens,
                        &[KeyValue::new("gen_ai.token.type", "input"), model.clone()],
                    );
                    inst.tokens.record(
                        u.output_tokens,
                        &[KeyValue::new("gen_ai.token.type", "output"), model],
                    );
                }
                if let Some(r) = stop_reason {
                    let r = serde_json::to_value(r)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    attrs.push(KeyValue::new("keel.model.stop_reason", r));
                }
                if inst.content {
                    attrs.push(KeyValue::new("keel.model.text", bounded(&message.text())));
                }
                let cx = child_span(inst, "keel.model.call", &turn.cx, start, attrs);
                cx.span().end_with_timestamp(now);
                turn.model_calls += 1;
                inst.model_time.record(
                    seconds(start, now),
                    &[KeyValue::new("gen_ai.request.model", inst.model.clone())],
                );
                for (id, (name, arguments)) in &agent.calls {
                    let cx = tool_span(inst, &turn.cx, id, name, arguments, now);
                    turn.tools.insert(id.clone(), (cx, now, name.clone()));
                }
            }
        },
        SessionEvent::ToolOutcome { outcome, .. } => {
            let Some(turn) = &mut agent.turn else {
                return;
            };
            let (cx, start, _) = match turn.tools.remove(&outcome.call_id) {
                Some(open) => open,
                None => {
                    // A call no assistant message of this turn asked for: no length.
                    let (name, arguments) = agent
                        .calls
                        .get(&outcome.call_id)
                        .cloned()
                        .unwrap_or_default();
                    let cx = tool_span(inst, &turn.cx, &outcome.call_id, &name, &arguments, now);
                    (cx, now, name)
                }
            };
            end_tool(inst, &cx, start, &outcome, now);
            turn.tool_calls += 1;
        }
        SessionEvent::TurnEnded { end, detail, .. } => end_turn(inst, agent, end, &detail, now),
        SessionEvent::Compacted {
            replaced,
            summary,
            reason,
            tokens_before,
            tokens_after,
            ..
        } => {
            let mut attrs = vec![
                KeyValue::new("keel.compaction.reason", reason),
                KeyValue::new("keel.compaction.replaced", replaced as i64),
                KeyValue::new("keel.compaction.tokens_before", tokens_before as i64),
                KeyValue::new("keel.compaction.tokens_after", tokens_after as i64),
            ];
            if inst.content {
                attrs.push(KeyValue::new("keel.compaction.summary", bounded(&summary)));
            }
            match &agent.turn {
                Some(turn) => turn
                    .cx
                    .span()
                    .add_event_with_timestamp("keel.compacted", now, attrs),
                None => {
                    let parent = agent
                        .parent
                        .as_ref()
                        .map_or_else(Context::new, |(cx, _)| cx.clone());
                    let cx = child_span(inst, "keel.compaction", &parent, now, attrs);
                    cx.span().end_with_timestamp(now);
                }
            }
        }
        // `Subagent` is how the session log files a child's entries; on the bus they come
        // on `subagent.event` (`Recorder::on_subagent`).
        SessionEvent::Subagent { .. }
        | SessionEvent::ToolStarted { .. }
        | SessionEvent::SessionStarted { .. }
        | SessionEvent::Context { .. }
        | SessionEvent::Verdict { .. }
        | SessionEvent::Rewound { .. } => {}
    }
}

fn on_user_message(
    inst: &Instruments,
    agent: &mut Agent,
    session: &str,
    message: &Message,
    now: SystemTime,
) {
    let results = message
        .content
        .iter()
        .any(|b| matches!(b, Block::ToolResult { .. }));
    match &mut agent.turn {
        // The tool results of a step: the next model call begins.
        Some(turn) if results => turn.model_since = Some(now),
        // A notice or verdict at the tail of the turn.
        Some(_) => {}
        None if results => {}
        None => {
            let mut attrs = vec![
                KeyValue::new("keel.session.id", session.to_owned()),
                KeyValue::new("gen_ai.request.model", inst.model.clone()),
            ];
            if let Some((n, label)) = &agent.child {
                attrs.push(KeyValue::new("keel.subagent.child", *n as i64));
                if inst.content {
                    attrs.push(KeyValue::new("keel.subagent.label", bounded(label)));
                }
            }
            if inst.content {
                attrs.push(KeyValue::new("keel.prompt", bounded(&message.text())));
            }
            let parent = agent
                .parent
                .as_ref()
                .map_or_else(Context::new, |(cx, _)| cx.clone());
            let cx = child_span(inst, "keel.turn", &parent, now, attrs);
            agent.turn = Some(Turn {
                cx,
                start: now,
                model_since: Some(now),
                tools: HashMap::new(),
                model_calls: 0,
                tool_calls: 0,
            });
        }
    }
}

/// The outcome's status, the gate's decision and the commands run, on the tool's span; then
/// the span ends.
fn end_tool(
    inst: &Instruments,
    cx: &Context,
    start: SystemTime,
    outcome: &ToolOutcome,
    now: SystemTime,
) {
    let span = cx.span();
    let status = match outcome.status {
        OutcomeStatus::Ok => "ok",
        OutcomeStatus::Error => "error",
        OutcomeStatus::Refused => "refused",
        OutcomeStatus::NotExecuted => "not_executed",
    };
    span.set_attribute(KeyValue::new("keel.tool", outcome.tool.clone()));
    span.set_attribute(KeyValue::new("keel.tool.status", status));
    span.set_attribute(KeyValue::new(
        "keel.tool.exec_count",
        outcome.exec.len() as i64,
    ));
    span.set_attribute(KeyValue::new(
        "keel.tool.exec_timed_out",
        outcome.exec.iter().any(|e| e.timed_out),
    ));
    let gate = match outcome.status {
        OutcomeStatus::Refused => Some("keel.gate.refused"),
        OutcomeStatus::NotExecuted => Some("keel.gate.not_executed"),
        _ => None,
    };
    if let Some(gate) = gate {
        let mut attrs = Vec::new();
        if inst.content {
            attrs.push(KeyValue::new("keel.gate.reason", bounded(&outcome.content)));
        }
        span.add_event_with_timestamp(gate, now, attrs);
    }
    for exec in &outcome.exec {
        let mut attrs = vec![KeyValue::new("keel.exec.timed_out", exec.timed_out)];
        if let Some(code) = exec.exit_code {
            attrs.push(KeyValue::new("keel.exec.exit_code", i64::from(code)));
        }
        if inst.content {
            attrs.push(KeyValue::new("keel.exec.command", bounded(&exec.command)));
        }
        span.add_event_with_timestamp("keel.exec", now, attrs);
    }
    if inst.content {
        span.set_attribute(KeyValue::new("keel.tool.result", bounded(&outcome.content)));
    }
    if outcome.status != OutcomeStatus::Ok {
        span.set_status(Status::error(status));
    }
    span.end_with_timestamp(now);
    inst.tool_time.record(
        seconds(start, now),
        &[
            KeyValue::new("keel.tool", outcome.tool.clone()),
            KeyValue::new("keel.tool.status", status),
        ],
    );
}

fn end_turn(inst: &Instruments, agent: &mut Agent, end: TurnEnd, detail: &str, now: SystemTime) {
    let Some(mut turn) = agent.turn.take() else {
        return;
    };
    // A model call that never answered.
    if let Some(start) = turn.model_since.take()
        && end == TurnEnd::ModelError
    {
        let mut attrs = vec![KeyValue::new("gen_ai.request.model", inst.model.clone())];
        if inst.content {
            attrs.push(KeyValue::new("keel.model.error", bounded(detail)));
        }
        let cx = child_span(inst, "keel.model.call", &turn.cx, start, attrs);
        cx.span().set_status(Status::error("the model failed"));
        cx.span().end_with_timestamp(now);
        turn.model_calls += 1;
    }
    for (_, (cx, _, _)) in turn.tools.drain() {
        cx.span()
            .set_attribute(KeyValue::new("keel.tool.status", "unfinished"));
        cx.span().set_status(Status::error("unfinished"));
        cx.span().end_with_timestamp(now);
    }
    let end_name = serde_json::to_value(end)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let span = turn.cx.span();
    span.set_attribute(KeyValue::new("keel.turn.end", end_name.clone()));
    span.set_attribute(KeyValue::new("keel.turn.model_calls", turn.model_calls));
    span.set_attribute(KeyValue::new("keel.turn.tool_calls", turn.tool_calls));
    if matches!(end, TurnEnd::ModelError | TurnEnd::LoopGuard) {
        span.set_status(Status::error(end_name.clone()));
    }
    span.end_with_timestamp(now);
    inst.turn_time.record(
        seconds(turn.start, now),
        &[KeyValue::new("keel.turn.end", end_name)],
    );
}

/// End an agent's open turn, as cut off.
fn end_agent(inst: &Instruments, agent: &mut Agent, now: SystemTime) {
    if let Some(turn) = agent.turn.take() {
        for (_, (cx, _, _)) in turn.tools {
            cx.span()
                .set_attribute(KeyValue::new("keel.tool.status", "unfinished"));
            cx.span().end_with_timestamp(now);
        }
        let span = turn.cx.span();
        span.set_attribute(KeyValue::new("keel.turn.end", "unfinished"));
        span.end_with_timestamp(now);
        inst.turn_time.record(
            seconds(turn.start, now),
            &[KeyValue::new("keel.turn.end", "unfinished")],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_CONTENT);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_CONTENT + "…".len(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }
}
