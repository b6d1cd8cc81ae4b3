//! Settling: records in, dependencies resolved, plugins activated and deactivated as their
//! providers come and go, unload with its undo log replayed, reload with state handed over and
//! rolled back on failure, and an instance that died replaced.

use super::*;

impl Shared {
    pub(super) fn insert_record(&self, package: PluginPackage) {
        let name = package.manifest.name.clone();
        let slot: Slot = Arc::new(tokio::sync::Mutex::new(None));
        let (tx, rx) = mpsc::channel(self.config.event_queue.max(1));
        let undelivered = Arc::new(Backlog::sharing(self.queued_events.clone()));
        tokio::spawn(deliver_events(
            self.me.clone(),
            name.clone(),
            slot.clone(),
            rx,
            undelivered.clone(),
        ));
        let mut inner = self.lock();
        inner.plugins.insert(
            name,
            Record {
                manifest: Arc::new(package.manifest),
                source: package.source,
                state: PluginState::Pending {
                    waiting_for: Vec::new(),
                },
                undo: UndoLog::default(),
                generation: 0,
                reloads: 0,
                slot,
                extra: Vec::new(),
                events: tx,
                undelivered,
                reloading: false,
                restart: None,
            },
        );
    }

    /// The unmet required services of `manifest`, explained.
    pub(super) fn unmet(inner: &Inner, manifest: &Manifest) -> Vec<String> {
        let mut unmet = Vec::new();
        for (service, req) in &manifest.requires {
            if req.optional {
                continue;
            }
            let active = inner.env.services().get(service).filter(|e| {
                req.range.matches(&e.version)
                    && inner
                        .plugins
                        .get(&e.provider)
                        .is_some_and(|r| r.state == PluginState::Active)
            });
            if active.is_some() {
                continue;
            }
            let declared: Vec<String> = inner
                .plugins
                .values()
                .filter_map(|r| {
                    let v = r.manifest.provides.get(service)?;
                    let why = if !req.range.matches(v) {
                        format!("which does not satisfy {}", req.range)
                    } else {
                        match &r.state {
                            PluginState::Active => "which has not provided it".to_owned(),
                            PluginState::Failed { reason } => format!("which failed: {reason}"),
                            other => format!("which is {}", other.name()),
                        }
                    };
                    Some(format!("`{}` {v}, {why}", r.manifest.name))
                })
                .collect();
            let available = if declared.is_empty() {
                "no loaded plugin provides it".to_owned()
            } else {
                format!("available: {}", declared.join("; "))
            };
            unmet.push(format!("service `{service}` {} ({available})", req.range));
        }
        unmet
    }

    /// Activate whatever can run and deactivate whatever lost a provider, until nothing
    /// changes. Caller holds the lifecycle lock.
    pub(super) async fn settle_locked(&self) -> Result<(), LifecycleError> {
        loop {
            let step = {
                let mut inner = self.lock();
                let graph = PluginGraph::build(inner.plugins.values().map(|r| &*r.manifest))?;
                let mut step = None;
                for name in graph.stop_order() {
                    if let Some(r) = inner.plugins.get(&name)
                        && r.state == PluginState::Active
                        && !Self::unmet(&inner, &r.manifest).is_empty()
                    {
                        step = Some(Step::Deactivate(name));
                        break;
                    }
                }
                if step.is_none() {
                    for name in graph.start_order() {
                        let Some(r) = inner.plugins.get(&name) else {
                            continue;
                        };
                        if !matches!(r.state, PluginState::Pending { .. }) {
                            continue;
                        }
                        let unmet = Self::unmet(&inner, &r.manifest);
                        if unmet.is_empty() {
                            step = Some(Step::Activate(name));
                            break;
                        }
                        if let Some(r) = inner.plugins.get_mut(&name) {
                            r.state = PluginState::Pending { waiting_for: unmet };
                        }
                    }
                }
                step
            };
            match step {
                None => {
                    self.publish_changes();
                    return Ok(());
                }
                Some(Step::Activate(name)) => self.activate(&name).await,
                Some(Step::Deactivate(name)) => {
                    let slot = match self.lock().plugins.get(&name) {
                        Some(r) => r.slot.clone(),
                        None => continue,
                    };
                    let mut guard = self.quiesce(&name, &slot).await?;
                    self.deactivate(&name, &mut guard).await;
                    let mut inner = self.lock();
                    let unmet = inner
                        .plugins
                        .get(&name)
                        .map(|r| Self::unmet(&inner, &r.manifest))
                        .unwrap_or_default();
                    if let Some(r) = inner.plugins.get_mut(&name) {
                        r.state = PluginState::Pending { waiting_for: unmet };
                    }
                }
            }
        }
    }

    /// Wait for `name`'s in-flight calls to finish and take its slot; its extra instances
    /// are dropped once their calls have finished.
    pub(super) async fn quiesce(
        &self,
        name: &str,
        slot: &Slot,
    ) -> Result<tokio::sync::OwnedMutexGuard<Option<Box<dyn PluginInstance>>>, LifecycleError> {
        let waited = self.config.quiesce_timeout;
        let busy = || LifecycleError::Busy {
            name: name.to_owned(),
            waited,
        };
        let until = tokio::time::Instant::now() + waited;
        let guard = tokio::time::timeout_at(until, slot.clone().lock_owned())
            .await
            .map_err(|_| busy())?;
        let extra: Vec<ExtraSlot> = self
            .lock()
            .plugins
            .get(name)
            .map(|r| r.extra.clone())
            .unwrap_or_default();
        for slot in extra {
            let mut held = tokio::time::timeout_at(until, slot.lock_owned())
                .await
                .map_err(|_| busy())?;
            *held = None;
        }
        Ok(guard)
    }

    /// Instantiate and activate `name`. Failure marks it failed and undoes what it did.
    pub(super) async fn activate(&self, name: &str) {
        let slot = match self.lock().plugins.get(name) {
            Some(r) => r.slot.clone(),
            None => return,
        };
        let mut guard = slot.lock().await;
        // A failure is recorded in the plugin's state; settle moves on to the others.
        let _ = self.activate_holding(name, &mut guard).await;
    }

    /// Deactivate the instance in `guard` and replay the undo log. The record stays.
    pub(super) async fn deactivate(&self, name: &str, guard: &mut Option<Box<dyn PluginInstance>>) {
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.state = PluginState::Unloading;
        }
        let limit = self.config.deadlines.service;
        if let Some(mut instance) = guard.take() {
            let chain = CallChain::starting_at(KERNEL_NAME).enter(
                name,
                CallKind::Lifecycle,
                &self.config.deadlines,
                tokio::time::Instant::now(),
            );
            match tokio::time::timeout(limit, instance.deactivate(&chain)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(
                    plugin = name,
                    "deactivate returned an error (ignored; its effects are undone anyway): {e}"
                ),
                Err(_) => tracing::warn!(
                    plugin = name,
                    "deactivate did not finish within {} s (ignored; its effects are undone \
                     anyway)",
                    limit.as_secs()
                ),
            }
        }
        let mut inner = self.lock();
        let Inner { env, plugins, .. } = &mut *inner;
        if let Some(r) = plugins.get_mut(name) {
            super::undo_instance(&self.gates, r, name, env);
        }
    }

    /// Unload `name` and everything that depends on it. Caller holds the lifecycle lock.
    pub(super) async fn unload_locked(&self, name: &str) -> Result<(), LifecycleError> {
        let (dependents, slot) = {
            let inner = self.lock();
            let r = inner
                .plugins
                .get(name)
                .ok_or_else(|| LifecycleError::NotLoaded(name.to_owned()))?;
            let graph = PluginGraph::build(inner.plugins.values().map(|r| &*r.manifest))?;
            (graph.dependents_of(name), r.slot.clone())
        };
        for dependent in dependents {
            let (active, dslot) = match self.lock().plugins.get(&dependent) {
                Some(r) => (r.state == PluginState::Active, r.slot.clone()),
                None => continue,
            };
            if active {
                self.drain_events(&dependent).await;
                let mut guard = self.quiesce(&dependent, &dslot).await?;
                self.deactivate(&dependent, &mut guard).await;
                if let Some(r) = self.lock().plugins.get_mut(&dependent) {
                    r.state = PluginState::Pending {
                        waiting_for: vec![format!("plugin `{name}`, which is being unloaded")],
                    };
                }
            }
        }
        self.drain_events(name).await;
        let mut guard = self.quiesce(name, &slot).await?;
        self.deactivate(name, &mut guard).await;
        // Deactivation replayed the undo log, and effects are refused from then on (the
        // record is unloading), so removing the record is all that is left.
        self.gates.net.close_all(name);
        let mut inner = self.lock();
        inner.plugins.remove(name);
        if inner.state.remove(name).is_some() {
            inner.conversation_revision += 1;
        }
        drop(inner);
        tracing::info!(plugin = name, "disposed");
        self.publish_changes();
        Ok(())
    }

    pub(super) async fn reload_locked(
        &self,
        name: &str,
        slot: Slot,
        package: PluginPackage,
    ) -> Result<(), LifecycleError> {
        let mut guard = self.quiesce(name, &slot).await?;
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.reloading = true;
        }
        self.deactivate(name, &mut guard).await;
        let (old_manifest, old_source) = {
            let mut inner = self.lock();
            let Some(r) = inner.plugins.get_mut(name) else {
                return Err(LifecycleError::NotLoaded(name.to_owned()));
            };
            let old = (r.manifest.clone(), r.source.clone());
            r.manifest = Arc::new(package.manifest);
            r.source = package.source;
            old
        };
        // A plugin whose providers are missing stays pending; settle activates it later.
        {
            let mut inner = self.lock();
            let unmet = inner
                .plugins
                .get(name)
                .map(|r| Self::unmet(&inner, &r.manifest))
                .unwrap_or_default();
            if !unmet.is_empty() {
                if let Some(r) = inner.plugins.get_mut(name) {
                    r.state = PluginState::Pending { waiting_for: unmet };
                    r.reloading = false;
                }
                return Ok(());
            }
        }
        let first = self.activate_holding(name, &mut guard).await;
        let result = match first {
            Ok(()) => {
                if let Some(r) = self.lock().plugins.get_mut(name) {
                    r.reloads += 1;
                }
                Ok(())
            }
            Err(reason) => {
                {
                    let mut inner = self.lock();
                    if let Some(r) = inner.plugins.get_mut(name) {
                        r.manifest = old_manifest;
                        r.source = old_source;
                    }
                }
                let rolled_back = self.activate_holding(name, &mut guard).await.is_ok();
                Err(LifecycleError::ReloadFailed {
                    name: name.to_owned(),
                    reason,
                    rolled_back,
                })
            }
        };
        if let Some(r) = self.lock().plugins.get_mut(name) {
            r.reloading = false;
        }
        drop(guard);
        result
    }

    /// Instantiate and activate `name` with its slot already held (reload keeps the slot from
    /// quiesce to release, so waiting calls reach only the new instance).
    pub(super) async fn activate_holding(
        &self,
        name: &str,
        guard: &mut Option<Box<dyn PluginInstance>>,
    ) -> Result<(), String> {
        let (source, config, generation) = {
            let mut inner = self.lock();
            inner.next_generation += 1;
            let generation = inner.next_generation;
            let Some(r) = inner.plugins.get_mut(name) else {
                return Err(format!("plugin `{name}` vanished"));
            };
            r.state = PluginState::Loading;
            r.generation = generation;
            (r.source.clone(), r.manifest.config.to_string(), generation)
        };
        let host = HostHandle::new(self.me.clone(), name, generation);
        let limit = self.config.deadlines.service;
        let bounded = self.start_instance(name, source.as_ref(), host, &config);
        let outcome = tokio::time::timeout(limit, bounded)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "activation did not finish within {} s (the activation deadline, \
                     [timeouts] service-secs)",
                    limit.as_secs()
                ))
            });
        let mut inner = self.lock();
        let Inner { env, plugins, .. } = &mut *inner;
        let Some(r) = plugins.get_mut(name) else {
            return Err(format!("plugin `{name}` vanished"));
        };
        match outcome {
            Ok(instance) => {
                *guard = Some(instance);
                r.state = PluginState::Active;
                r.restart = None;
                tracing::info!(plugin = name, "active");
                Ok(())
            }
            Err(reason) => {
                super::undo_instance(&self.gates, r, name, env);
                tracing::warn!(plugin = name, "{reason}");
                r.state = PluginState::Failed {
                    reason: reason.clone(),
                };
                Err(reason)
            }
        }
    }

    /// A new instance of `name` from `source`, whose door is `host`, activated with
    /// `config`; why not, when it cannot be.
    pub(super) async fn start_instance(
        &self,
        name: &str,
        source: &dyn PluginSource,
        host: HostHandle,
        config: &str,
    ) -> Result<Box<dyn PluginInstance>, String> {
        let chain = CallChain::starting_at(KERNEL_NAME).enter(
            name,
            CallKind::Lifecycle,
            &self.config.deadlines,
            tokio::time::Instant::now(),
        );
        let mut instance = source
            .instantiate(host)
            .await
            .map_err(|e| format!("instantiation failed: {e}"))?;
        instance
            .activate(&chain, config)
            .await
            .map_err(|e| format!("activation failed: {e}"))?;
        Ok(instance)
    }

    /// A call trapped or hit a limit: the instance is gone. Mark the plugin failed and undo
    /// its effects now; dependents are deactivated by a settle that runs once the calls that
    /// led here have returned (running it inline could wait on the caller's own slot).
    pub(super) fn instance_died(&self, name: &str, generation: u64, reason: String) {
        {
            let mut inner = self.lock();
            let Inner { env, plugins, .. } = &mut *inner;
            let Some(r) = plugins.get_mut(name) else {
                return;
            };
            if r.generation != generation {
                return;
            }
            super::undo_instance(&self.gates, r, name, env);
            tracing::warn!(plugin = name, "failed: {reason}");
            r.state = PluginState::Failed { reason };
        }
        self.gates.net.close_all(name);
        self.publish_changes();
        self.resettle_later();
    }

    /// Deactivate what lost a provider, in a task of its own: a settle run inline could wait
    /// on the slot of a caller further up the chain.
    pub(super) fn resettle_later(&self) {
        let me = self.me.clone();
        tokio::spawn(async move {
            if let Some(shared) = me.upgrade() {
                let _lifecycle = shared.lifecycle.lock().await;
                if let Err(e) = shared.settle_locked().await {
                    tracing::warn!("re-wiring after a failed plugin: {e}");
                }
            }
        });
    }
}
