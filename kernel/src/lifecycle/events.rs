//! The event bus: what a plugin emits (only topics it declared), the fan-out to every
//! subscriber's bounded queue (a full queue refuses the emit rather than grow), delivery one
//! event at a time through the subscriber's slot, and draining a plugin's queue before it
//! unloads.

use super::*;

/// Deliver a plugin's queued events in order, one at a time, through its slot (so delivery
/// waits for a reload and reaches the new instance).
pub(super) async fn deliver_events(
    shared: Weak<Shared>,
    name: String,
    slot: Slot,
    mut rx: mpsc::Receiver<Arc<Event>>,
    undelivered: Arc<Backlog>,
) {
    while let Some(event) = rx.recv().await {
        let size = event_size(&event);
        deliver_one(&shared, &name, &slot, &event).await;
        undelivered.release(size);
    }
}

/// Events queued for one subscriber and not yet handled: how many, and their bytes; and the
/// bytes queued for all subscribers, which every backlog shares.
#[derive(Default)]
pub(super) struct Backlog {
    events: AtomicUsize,
    bytes: AtomicUsize,
    all: Arc<AtomicUsize>,
}

/// Which bound refused an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// The subscriber's own queue.
    Subscriber,
    /// All subscribers' queues together.
    All,
}

/// Add `size` to `counter` unless it would pass `limit`.
pub(super) fn reserve(counter: &AtomicUsize, size: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
            let total = queued.checked_add(size)?;
            (total <= limit).then_some(total)
        })
        .is_ok()
}

impl Backlog {
    pub(super) fn sharing(all: Arc<AtomicUsize>) -> Self {
        Backlog {
            all,
            ..Backlog::default()
        }
    }

    /// Count an event of `size` bytes in, unless the bytes would pass this subscriber's quota
    /// or all subscribers'. Counted before it is queued, so delivery never counts below zero.
    pub(super) fn admit(&self, size: usize) -> Result<(), Full> {
        if !reserve(&self.bytes, size, crate::quotas::MAX_QUEUED_EVENT_BYTES) {
            return Err(Full::Subscriber);
        }
        if !reserve(&self.all, size, crate::quotas::MAX_QUEUED_EVENT_BYTES_TOTAL) {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            return Err(Full::All);
        }
        self.events.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    pub(super) fn release(&self, size: usize) {
        self.events.fetch_sub(1, Ordering::SeqCst);
        self.bytes.fetch_sub(size, Ordering::SeqCst);
        self.all.fetch_sub(size, Ordering::SeqCst);
    }
}

/// What one queued copy of `event` holds.
pub(super) fn event_size(event: &Event) -> usize {
    event.topic.len() + event.source.len() + event.payload.len()
}

/// Hand one event to the plugin's current instance, if it is active; bounded and restarted
/// like any call into a plugin.
pub(super) async fn deliver_one(shared: &Weak<Shared>, name: &str, slot: &Slot, event: &Event) {
    let Some(s) = shared.upgrade() else { return };
    if s.lock()
        .plugins
        .get(name)
        .is_none_or(|r| r.state != PluginState::Active)
    {
        return;
    }
    let chain = CallChain::starting_at(KERNEL_NAME);
    let request = Request::Event { event };
    if let Err(e) = s.call_into(&chain, name, slot.clone(), request).await {
        tracing::warn!(plugin = %name, topic = %event.topic, "event handler failed: {e}");
    }
}

impl Shared {
    /// Let the events already queued for `name` be handled, waiting at most the quiesce
    /// timeout (an emitter that never stops must not block an unload forever).
    pub(super) async fn drain_events(&self, name: &str) {
        let Some(undelivered) = self.lock().plugins.get(name).map(|r| r.undelivered.clone()) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + self.config.quiesce_timeout;
        while undelivered.events.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    pub(crate) fn emit_from_plugin(
        &self,
        plugin: &str,
        generation: u64,
        topic: &str,
        payload: &str,
    ) -> Result<(), KernelError> {
        validate_topic(topic, false)?;
        if payload.len() > crate::quotas::MAX_EVENT_PAYLOAD {
            return Err(KernelError::Invalid(format!(
                "the `{topic}` event is {} bytes; at most {} may be emitted at once; send less \
                 (a path or an id instead of the content)",
                payload.len(),
                crate::quotas::MAX_EVENT_PAYLOAD
            )));
        }
        {
            let mut inner = self.lock();
            live_record(&mut inner.plugins, plugin, generation)?;
        }
        self.fan_out(Event {
            topic: topic.to_owned(),
            source: plugin.to_owned(),
            payload: payload.to_owned(),
        })
    }

    /// Queue an event of the kernel's for `plugin` alone (a process of its wrote while it did
    /// not read); nothing when its queue is full, since the next read sees the output anyway.
    pub(crate) fn notify_plugin(&self, plugin: &str, topic: &str, payload: String) {
        let event = Event {
            topic: topic.to_owned(),
            source: KERNEL_NAME.to_owned(),
            payload,
        };
        let size = event_size(&event);
        let inner = self.lock();
        if let Some(r) = inner.plugins.get(plugin)
            && r.undelivered.admit(size).is_ok()
            && r.events.try_send(Arc::new(event)).is_err()
        {
            r.undelivered.release(size);
        }
    }

    /// Queue `event` for every subscriber but its source, and for the host.
    pub(super) fn fan_out(&self, event: Event) -> Result<(), KernelError> {
        let mut refused = Vec::new();
        let size = event_size(&event);
        // One copy, shared by every queue it waits in.
        let shared = Arc::new(event);
        let event = &*shared;
        {
            let inner = self.lock();
            for subscriber in inner.env.subscribers(&event.topic) {
                if subscriber == event.source {
                    continue;
                }
                if let Some(r) = inner.plugins.get(subscriber) {
                    if let Err(full) = r.undelivered.admit(size) {
                        refused.push((subscriber.to_owned(), full));
                        continue;
                    }
                    if r.events.try_send(shared.clone()).is_err() {
                        r.undelivered.release(size);
                        refused.push((subscriber.to_owned(), Full::Subscriber));
                    }
                }
            }
        }
        // No host receiver is fine: nobody asked for host delivery. The host's ring keeps a
        // copy of every event, so a large payload is kept only as a note of its size.
        let for_host = if event.payload.len() > crate::quotas::MAX_HOST_EVENT_PAYLOAD {
            Event {
                topic: event.topic.clone(),
                source: event.source.clone(),
                payload: serde_json::json!({
                    "omitted": format!(
                        "{} bytes, more than the display keeps; subscribers got it whole",
                        event.payload.len()
                    )
                })
                .to_string(),
            }
        } else {
            event.clone()
        };
        let _ = self.host_events.send(for_host);
        if refused.is_empty() {
            Ok(())
        } else {
            let names = |which: Full| {
                refused
                    .iter()
                    .filter(|(_, full)| *full == which)
                    .map(|(name, _)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut why = Vec::new();
            let own = names(Full::Subscriber);
            if !own.is_empty() {
                why.push(format!(
                    "{own}: its queue of {} events or {} MiB is full",
                    self.config.event_queue,
                    crate::quotas::MAX_QUEUED_EVENT_BYTES >> 20
                ));
            }
            let all = names(Full::All);
            if !all.is_empty() {
                why.push(format!(
                    "{all}: all subscribers' queues together hold {} MiB",
                    crate::quotas::MAX_QUEUED_EVENT_BYTES_TOTAL >> 20
                ));
            }
            Err(KernelError::Unavailable(format!(
                "event `{}` was not delivered ({}); emit less often or retry later",
                event.topic,
                why.join("; ")
            )))
        }
    }
}
