//! The page's live feed (server-sent events): plugin changes as the kernel makes them, the
//! call figures once a second while they change, and, for a live session, its log entries
//! (a subagent's too), the model's text as it streams and approval questions as they happen. A page that falls behind is told to read everything
//! again (`resync`) rather than shown a timeline with a hole in it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use keel_kernel::{CallFigures, Kernel, PluginChange};
use keel_protocol::topics;
use tokio::sync::broadcast::{self, error::RecvError};

use super::inbox::{self, InboxEvent};
use super::{App, api};

/// How often the figures are compared and, when changed, sent.
const FIGURES_EVERY: Duration = Duration::from_secs(1);

struct Feed {
    kernel: Kernel,
    changes: broadcast::Receiver<PluginChange>,
    /// The live session's bus (absent for `keel web` on its own).
    events: Option<broadcast::Receiver<keel_kernel::Event>>,
    inbox: Option<broadcast::Receiver<InboxEvent>>,
    /// Sessions whose logs changed (`keel web`).
    logs: Option<broadcast::Receiver<Vec<String>>>,
    tick: tokio::time::Interval,
    figures: BTreeMap<String, CallFigures>,
    /// Sent before anything else: the questions already waiting when the page connected.
    first: std::collections::VecDeque<Event>,
}

pub(super) async fn events(
    State(app): State<App>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let kernel = app.sources.kernel.clone();
    let live = app.sources.live.is_some();
    let mut tick = tokio::time::interval(FIGURES_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Subscribed before the open questions are read, so none falls between the two (one
    // asked in between comes twice; the page keeps questions by id).
    let asked = live.then(|| inbox::inbox().subscribe());
    let first = if live {
        inbox::inbox()
            .open()
            .into_iter()
            .map(|q| approval(&InboxEvent::Asked(q)))
            .collect()
    } else {
        Default::default()
    };
    let feed = Feed {
        changes: kernel.plugin_changes(),
        events: live.then(|| kernel.events()),
        inbox: asked,
        logs: app.logs.as_ref().map(broadcast::Sender::subscribe),
        figures: kernel.call_figures(),
        kernel,
        tick,
        first,
    };
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await;
        Some((Ok(event), feed))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// What a receiver gave: a value, nothing more ever, or a gap.
fn received<T>(r: Result<T, RecvError>) -> Option<Result<T, u64>> {
    match r {
        Ok(v) => Some(Ok(v)),
        Err(RecvError::Lagged(n)) => Some(Err(n)),
        Err(RecvError::Closed) => None,
    }
}

async fn recv_or_never<T: Clone>(r: &mut Option<broadcast::Receiver<T>>) -> Option<Result<T, u64>> {
    match r {
        Some(r) => received(r.recv().await),
        None => std::future::pending().await,
    }
}

fn approval(event: &InboxEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_default();
    Event::default().event("approval").data(data)
}

fn resync(missed: u64) -> Event {
    Event::default()
        .event("resync")
        .data(format!("{{\"missed\":{missed}}}"))
}

impl Feed {
    async fn next(&mut self) -> Event {
        if let Some(first) = self.first.pop_front() {
            return first;
        }
        loop {
            tokio::select! {
                change = self.changes.recv() => match received(change) {
                    Some(Ok(change)) => {
                        let data = serde_json::json!({
                            "change": change,
                            "graph": api::graph_value(&self.kernel),
                        });
                        return Event::default().event("plugin").data(data.to_string());
                    }
                    Some(Err(n)) => return resync(n),
                    None => return std::future::pending().await,
                },
                event = recv_or_never(&mut self.events) => match event {
                    Some(Ok(event)) => {
                        let name = match event.topic.as_str() {
                            topics::SESSION_EVENT => "session",
                            topics::SUBAGENT_EVENT => "subagent",
                            topics::MODEL_DELTA => "delta",
                            _ => continue,
                        };
                        return Event::default().event(name).data(event.payload);
                    }
                    Some(Err(n)) => return resync(n),
                    None => self.events = None,
                },
                asked = recv_or_never(&mut self.inbox) => match asked {
                    Some(Ok(asked)) => return approval(&asked),
                    Some(Err(n)) => return resync(n),
                    None => self.inbox = None,
                },
                changed = recv_or_never(&mut self.logs) => match changed {
                    Some(Ok(ids)) => {
                        let data = serde_json::to_string(&ids).unwrap_or_default();
                        return Event::default().event("logs").data(data);
                    }
                    // Missed changes: the page reads the list again either way.
                    Some(Err(_)) => {
                        return Event::default().event("logs").data("[]");
                    }
                    None => self.logs = None,
                },
                _ = self.tick.tick() => {
                    let now = self.kernel.call_figures();
                    if now != self.figures {
                        self.figures = now;
                        let data = serde_json::to_string(&self.figures).unwrap_or_default();
                        return Event::default().event("figures").data(data);
                    }
                }
            }
        }
    }
}
