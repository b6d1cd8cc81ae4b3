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
//!
//! 0.5.0 changes no export: it adds the kernel's own services as typed imports (`caller`,
//! `prompt-context`, `conversation`, `agents`), whose host side calls the same core as their
//! JSON door through `services.call`.
//!
//! A new version adds a module here, its interfaces to `abi.rs`'s table, and a variant to both
//! enums; the released WIT of the older ones never changes.

pub(crate) mod since_v0_2;
pub(crate) mod since_v0_3;
pub(crate) mod since_v0_4;
pub(crate) mod since_v0_5;

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use super::abi::ComponentReport;
use super::store::StoreState;
use crate::instance::PluginError;
use crate::types::{Event, GuardVerdict};

/// The export of an ABI 0.4.0 plugin; a component without it exports 0.2.0's `plugin`.
pub(crate) const PLUGIN_EXPORT_0_4: &str = "keel:plugin/plugin@0.4.0";

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
    Ok(())
}

/// A linked component, ready to instantiate, typed by the version of its `plugin` export.
pub(crate) enum PluginPre {
    /// A 0.2.0 or 0.3.0 component: it exports `plugin@0.2.0`.
    Since0_2(since_v0_2::KeelPluginPre<StoreState>),
    /// A 0.4.0 or 0.5.0 component: it exports `plugin@0.4.0`.
    Since0_4(since_v0_4::KeelPluginPre<StoreState>),
}

impl PluginPre {
    /// The typed pre-instance of `pre`, by the `plugin` export `report` lists; fails when the
    /// component's export does not have the functions and types of its version.
    pub(crate) fn new(
        pre: InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<PluginPre> {
        if report.exports.iter().any(|e| e == PLUGIN_EXPORT_0_4) {
            since_v0_4::KeelPluginPre::new(pre).map(PluginPre::Since0_4)
        } else {
            since_v0_2::KeelPluginPre::new(pre).map(PluginPre::Since0_2)
        }
    }

    /// Instantiate into `store`.
    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<PluginExports> {
        Ok(match self {
            PluginPre::Since0_2(pre) => {
                PluginExports::Since0_2(pre.instantiate_async(store).await?)
            }
            PluginPre::Since0_4(pre) => {
                PluginExports::Since0_4(pre.instantiate_async(store).await?)
            }
        })
    }
}

/// The exports of a plugin instance in the newest ABI's shape: errors are [`PluginError`]s.
/// The outer `Result` is a trap; the inner one what the plugin answered.
pub(crate) enum PluginExports {
    /// A 0.2.0 or 0.3.0 instance: its error strings are adapted to [`PluginError::Failed`].
    Since0_2(since_v0_2::KeelPlugin),
    /// A 0.4.0 or 0.5.0 instance.
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
        match self {
            PluginExports::Since0_2(b) => {
                adapt_0_2(b.keel_plugin_plugin().call_activate(store, config).await)
            }
            PluginExports::Since0_4(b) => adapt_0_4(
                b.keel_plugin0_4_0_plugin()
                    .call_activate(store, config)
                    .await,
            ),
        }
    }

    /// `deactivate`.
    pub(crate) async fn deactivate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<()> {
        match self {
            PluginExports::Since0_2(b) => b.keel_plugin_plugin().call_deactivate(store).await,
            PluginExports::Since0_4(b) => b.keel_plugin0_4_0_plugin().call_deactivate(store).await,
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
        match self {
            PluginExports::Since0_2(b) => adapt_0_2(
                b.keel_plugin_plugin()
                    .call_handle_call(store, service, method, payload)
                    .await,
            ),
            PluginExports::Since0_4(b) => adapt_0_4(
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
        match self {
            PluginExports::Since0_2(b) => adapt_0_2(
                b.keel_plugin_plugin()
                    .call_invoke_tool(store, name, input)
                    .await,
            ),
            PluginExports::Since0_4(b) => adapt_0_4(
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
        match self {
            PluginExports::Since0_2(b) => b.keel_plugin_plugin().call_on_event(store, &event).await,
            PluginExports::Since0_4(b) => {
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
        Ok(match self {
            PluginExports::Since0_2(b) => b
                .keel_plugin_plugin()
                .call_check_tool_call(store, guard, tool, input)
                .await?
                .into(),
            PluginExports::Since0_4(b) => b
                .keel_plugin0_4_0_plugin()
                .call_check_tool_call(store, guard, tool, input)
                .await?
                .into(),
        })
    }
}
