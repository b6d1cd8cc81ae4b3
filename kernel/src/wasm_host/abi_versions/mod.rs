//! The host glue of every keel ABI this kernel hosts, one module per version (as zed's
//! extension host keeps one per API version): each binds its WIT world and serves the imports
//! it adds; [`PluginPre`] and [`PluginExports`] wrap a component's exports, whatever its
//! version, in the newest shape, so the rest of the kernel calls one typed API.
//!
//! | component | imports bound in | exports | adapted |
//! |---|---|---|---|
//! | 0.2.0 | `since_v0_2` | `plugin@0.2.0` | an error string is [`PluginError::Failed`] |
//! | 0.3.0 | `since_v0_2` + `since_v0_3` | `plugin@0.2.0` | the same |
//! | 0.4.0 | `since_v0_2` + `since_v0_3` | `plugin@0.4.0` | its variants map one to one |
//! | 0.5.0 | `since_v0_2` + `since_v0_3` + `since_v0_5` | `plugin@0.4.0` | as 0.4.0 |
//! | 0.6.0 | … + `since_v0_6` | `plugin@0.4.0`, and a provider's `memory`, `compaction`, `tool-registry`, `turns`, `verifier` | as 0.4.0 |
//! | 0.7.0 | … + `since_v0_7` (the typed `agent` and `model`, `http` and `processes` with resources) | `plugin@0.4.0`, and a model adapter's `model`, the hooks plugin's `hooks` | as 0.4.0 |
//! | 0.8.0 | … + `since_v0_8` (the typed `session-log`) | `plugin@0.4.0`, and the log plugin's `session-log` | as 0.4.0 |
//!
//! 0.5.0 changes no export: it adds the kernel's own services as typed imports (`caller`,
//! `prompt-context`, `conversation`, `agents`), whose host side calls the same core as their
//! JSON door through `services.call`. 0.6.0 types the services plugins provide to each other:
//! a caller imports them, a provider exports them beside `plugin` ([`since_v0_6`]). 0.7.0 types
//! the model: the kernel's `agent` door in records, and the `model` service a model adapter
//! exports ([`since_v0_7`]). 0.8.0 types the session log: its callers import `session-log`, the
//! plugin that keeps the logs exports it ([`since_v0_8`]).
//!
//! A new version adds a module here, its interfaces to `abi.rs`'s table, and a variant to both
//! enums; the released WIT of the older ones never changes.

mod conversions;
pub(crate) mod since_v0_2;
pub(crate) mod since_v0_3;
pub(crate) mod since_v0_4;
pub(crate) mod since_v0_5;
pub(crate) mod since_v0_6;
pub(crate) mod since_v0_7;
pub(crate) mod since_v0_8;

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use crate::typed_services::{ServiceAnswer, ServiceCall};

use super::abi::ComponentReport;
use super::store::StoreState;
use crate::instance::PluginError;
use crate::types::{Event, GuardVerdict};

/// The export of an ABI 0.4.0 plugin; a component without it exports 0.2.0's `plugin`.
pub(crate) const PLUGIN_EXPORT_0_4: &str = "keel:plugin/plugin@0.4.0";
/// The export of an ABI 0.2.0 or 0.3.0 plugin.
const PLUGIN_EXPORT_0_2: &str = "keel:plugin/plugin@0.2.0";

/// Why an instance could not load `export`: it has the names of keel's WIT for it (or the
/// component would not have linked), not its types.
pub(super) fn wrong_shape(export: &str) -> String {
    format!(
        "its export `{export}` does not have the functions and types of keel's WIT for it; \
         rebuild the plugin against this keel's WIT"
    )
}

/// Add the host side of every keel import of every hosted version to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    since_v0_2::KeelPlugin::add_to_linker::<_, HasSelf<StoreState>>(linker, |state| state)?;
    // ABI 0.3.0 adds two interfaces; 0.4.0 adds none (it changes the export).
    since_v0_3::keel::plugin0_3_0::processes::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_3::keel::plugin0_3_0::tool_list::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    // ABI 0.5.0 adds the kernel's own services, typed.
    since_v0_5::keel::plugin0_5_0::caller::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_5::keel::plugin0_5_0::prompt_context::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_5::keel::plugin0_5_0::conversation::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_5::keel::plugin0_5_0::agents::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    // ABI 0.6.0 adds the services plugins provide to each other, typed.
    since_v0_6::keel::plugin0_6_0::memory::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_6::keel::plugin0_6_0::compaction::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_6::keel::plugin0_6_0::tool_registry::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_6::keel::plugin0_6_0::turns::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_6::keel::plugin0_6_0::verifier::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_6::keel::plugin0_6_0::editor::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    // ABI 0.7.0 adds the model, typed: the agent's door and the `model` service;
    since_v0_7::keel::plugin0_7_0::agent::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_7::keel::plugin0_7_0::model::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    // And HTTP bodies and processes as resources.
    since_v0_7::keel::plugin0_7_0::http::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    since_v0_7::send_from_guest_memory(linker)?;
    since_v0_7::keel::plugin0_7_0::processes::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    // ABI 0.8.0 adds the session log, typed.
    since_v0_8::keel::plugin0_8_0::session_log::add_to_linker::<_, HasSelf<StoreState>>(
        linker,
        |state| state,
    )?;
    Ok(())
}

/// A linked component, ready to instantiate: where its `plugin` export is, by the version of
/// that export, and the typed services it exports.
pub(crate) struct PluginPre {
    instance_pre: InstancePre<StoreState>,
    plugin: PluginIndices,
    services: since_v0_6::ServiceIndices,
    services_0_7: since_v0_7::ServiceIndices,
    services_0_8: since_v0_8::ServiceIndices,
}

/// Where a component's `plugin` export is, by its version.
enum PluginIndices {
    /// A 0.2.0 or 0.3.0 component: it exports `plugin@0.2.0`.
    Since0_2(since_v0_2::KeelPluginIndices),
    /// A 0.4.0 component or newer: it exports `plugin@0.4.0`.
    Since0_4(since_v0_4::KeelPluginIndices),
}

impl PluginPre {
    /// The typed pre-instance of `pre`, by the exports `report` lists; fails when an export
    /// does not have the functions and types of its version.
    pub(crate) fn new(
        pre: InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<PluginPre> {
        let plugin = if report.exports.iter().any(|e| e == PLUGIN_EXPORT_0_4) {
            PluginIndices::Since0_4(since_v0_4::KeelPluginIndices::new(&pre)?)
        } else {
            PluginIndices::Since0_2(since_v0_2::KeelPluginIndices::new(&pre)?)
        };
        let services = since_v0_6::ServiceIndices::new(&pre, report)?;
        let services_0_7 = since_v0_7::ServiceIndices::new(&pre, report)?;
        let services_0_8 = since_v0_8::ServiceIndices::new(&pre, report)?;
        Ok(PluginPre {
            instance_pre: pre,
            plugin,
            services,
            services_0_7,
            services_0_8,
        })
    }

    /// Instantiate into `store`.
    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<PluginExports> {
        let instance = self.instance_pre.instantiate_async(&mut *store).await?;
        let plugin = match &self.plugin {
            PluginIndices::Since0_2(i) => PluginBindings::Since0_2(
                i.load(&mut *store, &instance)
                    .map_err(|e| e.context(wrong_shape(PLUGIN_EXPORT_0_2)))?,
            ),
            PluginIndices::Since0_4(i) => PluginBindings::Since0_4(
                i.load(&mut *store, &instance)
                    .map_err(|e| e.context(wrong_shape(PLUGIN_EXPORT_0_4)))?,
            ),
        };
        let services = self.services.load(&mut *store, &instance)?;
        let services_0_7 = self.services_0_7.load(&mut *store, &instance)?;
        let services_0_8 = self.services_0_8.load(store, &instance)?;
        Ok(PluginExports {
            plugin,
            services,
            services_0_7,
            services_0_8,
        })
    }
}

/// The exports of a plugin instance in the newest ABI's shape: errors are [`PluginError`]s.
/// The outer `Result` is a trap; the inner one what the plugin answered.
pub(crate) struct PluginExports {
    plugin: PluginBindings,
    services: since_v0_6::ServiceExports,
    services_0_7: since_v0_7::ServiceExports,
    services_0_8: since_v0_8::ServiceExports,
}

/// An instance's `plugin` export, by its version.
enum PluginBindings {
    /// A 0.2.0 or 0.3.0 instance: its error strings are adapted to [`PluginError::Failed`].
    Since0_2(since_v0_2::KeelPlugin),
    /// A 0.4.0 instance or newer.
    Since0_4(since_v0_4::KeelPlugin),
}

/// What a 0.2.0 `plugin` export answers with: a bare string, which is a failure.
fn adapt_0_2<T>(
    answer: wasmtime::Result<Result<T, String>>,
) -> wasmtime::Result<Result<T, PluginError>> {
    answer.map(|r| r.map_err(PluginError::Failed))
}

/// What a 0.4.0 `plugin` export answers with: a variant of its own, mapped onto the kernel's.
fn adapt_0_4<T, E: Into<PluginError>>(
    answer: wasmtime::Result<Result<T, E>>,
) -> wasmtime::Result<Result<T, PluginError>> {
    answer.map(|r| r.map_err(Into::into))
}

impl PluginExports {
    /// `activate` with the plugin's configuration.
    pub(crate) async fn activate(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
    ) -> wasmtime::Result<Result<(), PluginError>> {
        match &self.plugin {
            PluginBindings::Since0_2(b) => {
                adapt_0_2(b.keel_plugin_plugin().call_activate(store, config).await)
            }
            PluginBindings::Since0_4(b) => adapt_0_4(
                b.keel_plugin0_4_0_plugin()
                    .call_activate(store, config)
                    .await,
            ),
        }
    }

    /// `deactivate`.
    pub(crate) async fn deactivate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<()> {
        match &self.plugin {
            PluginBindings::Since0_2(b) => b.keel_plugin_plugin().call_deactivate(store).await,
            PluginBindings::Since0_4(b) => b.keel_plugin0_4_0_plugin().call_deactivate(store).await,
        }
    }

    /// `handle-call` of `method` of the provided `service`.
    pub(crate) async fn handle_call(
        &self,
        store: &mut Store<StoreState>,
        service: &str,
        method: &str,
        payload: &str,
    ) -> wasmtime::Result<Result<String, PluginError>> {
        match &self.plugin {
            PluginBindings::Since0_2(b) => adapt_0_2(
                b.keel_plugin_plugin()
                    .call_handle_call(store, service, method, payload)
                    .await,
            ),
            PluginBindings::Since0_4(b) => adapt_0_4(
                b.keel_plugin0_4_0_plugin()
                    .call_handle_call(store, service, method, payload)
                    .await,
            ),
        }
    }

    /// `invoke-tool` of the registered tool `name`.
    pub(crate) async fn invoke_tool(
        &self,
        store: &mut Store<StoreState>,
        name: &str,
        input: &str,
    ) -> wasmtime::Result<Result<String, PluginError>> {
        match &self.plugin {
            PluginBindings::Since0_2(b) => adapt_0_2(
                b.keel_plugin_plugin()
                    .call_invoke_tool(store, name, input)
                    .await,
            ),
            PluginBindings::Since0_4(b) => adapt_0_4(
                b.keel_plugin0_4_0_plugin()
                    .call_invoke_tool(store, name, input)
                    .await,
            ),
        }
    }

    /// `on-event` with `event`.
    pub(crate) async fn on_event(
        &self,
        store: &mut Store<StoreState>,
        event: &Event,
    ) -> wasmtime::Result<()> {
        let event = event.into();
        match &self.plugin {
            PluginBindings::Since0_2(b) => {
                b.keel_plugin_plugin().call_on_event(store, &event).await
            }
            PluginBindings::Since0_4(b) => {
                b.keel_plugin0_4_0_plugin()
                    .call_on_event(store, &event)
                    .await
            }
        }
    }

    /// `check-tool-call` for the registered guard `guard`.
    pub(crate) async fn check_tool_call(
        &self,
        store: &mut Store<StoreState>,
        guard: &str,
        tool: &str,
        input: &str,
    ) -> wasmtime::Result<GuardVerdict> {
        // Both versions answer with 0.2.0's `guard-verdict`.
        Ok(match &self.plugin {
            PluginBindings::Since0_2(b) => b
                .keel_plugin_plugin()
                .call_check_tool_call(store, guard, tool, input)
                .await?
                .into(),
            PluginBindings::Since0_4(b) => b
                .keel_plugin0_4_0_plugin()
                .call_check_tool_call(store, guard, tool, input)
                .await?
                .into(),
        })
    }

    /// Whether the instance has a typed door for `call`'s service.
    pub(crate) fn serves(&self, call: &ServiceCall) -> bool {
        self.services.serves(call)
            || self.services_0_7.serves(call)
            || self.services_0_8.serves(call)
    }

    /// `call` through the instance's typed door; only for a call it [`serves`](Self::serves).
    pub(crate) async fn call_typed(
        &self,
        store: &mut Store<StoreState>,
        call: &ServiceCall,
    ) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
        if self.services_0_7.serves(call) {
            return self.services_0_7.call(store, call).await;
        }
        if self.services_0_8.serves(call) {
            return self.services_0_8.call(store, call).await;
        }
        self.services.call(store, call).await
    }
}
