//! ABI 0.8.0: the session log, typed. The `session-log` service a caller that declared it
//! imports (the agent loop records its calls' start through `started`), and the export of the
//! plugin that keeps the logs.
//!
//! As in [`super::since_v0_7`], both sides of a call are here and the kernel routes it in
//! `keel_protocol`'s types: the import side is a [`ServiceCall`] through the same routing,
//! checks and bounds as every typed service (the provider itself decides who it serves, by the
//! kernel-attested caller), and the call reaches the provider's typed export when it has one,
//! its `handle-call` with the JSON of the same request otherwise. The records of
//! `session-log-types` are shared by both sides' bindings, so one conversion
//! (`super::conversions`) serves them.

use keel_protocol::services;
use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre};

use super::conversions::{
    log_health_from_wit, log_health_to_wit, log_read_from_wit, log_read_to_wit,
    logged_conversation_from_wit, logged_conversation_to_wit, session_event_from_wit,
    session_event_to_wit, session_summary_from_wit, session_summary_to_wit,
};
use super::since_v0_2::keel::plugin::types::KernelError;
use crate::instance::PluginError;
use crate::typed_services::{ServiceAnswer, ServiceCall};
use crate::wasm_host::abi::ComponentReport;
use crate::wasm_host::store::StoreState;

wasmtime::component::bindgen!({
    path: [
        "../wit/keel-plugin-0.2.0",
        "../wit/keel-plugin-0.3.0",
        "../wit/keel-plugin-0.4.0",
        "../wit/keel-plugin-0.5.0",
        "../wit/keel-plugin-0.6.0",
        "../wit/keel-plugin-0.7.0",
        "../wit/keel-plugin-0.8.0",
    ],
    inline: "
        package keel:host-imports;

        world session-log-imports {
            import keel:plugin/session-log@0.8.0;
        }
    ",
    world: "keel:host-imports/session-log-imports",
    imports: { default: async },
    with: {
        "keel:plugin/types@0.2.0": super::since_v0_2::keel::plugin::types,
        "keel:plugin/conversation@0.5.0": super::since_v0_5::keel::plugin0_5_0::conversation,
        "keel:plugin/tool-registry@0.6.0": super::since_v0_6::keel::plugin0_6_0::tool_registry,
        "keel:plugin/turns@0.6.0": super::since_v0_6::keel::plugin0_6_0::turns,
        "keel:plugin/verifier-types@0.6.0": super::since_v0_6::keel::plugin0_6_0::verifier_types,
        "keel:plugin/model-types@0.7.0": super::since_v0_7::keel::plugin0_7_0::model_types,
    },
});

/// The provider's side: the log plugin's `session-log` export, its records those of the
/// import side.
mod provider_exports {
    wasmtime::component::bindgen!({
        path: [
            "../wit/keel-plugin-0.2.0",
            "../wit/keel-plugin-0.3.0",
            "../wit/keel-plugin-0.4.0",
            "../wit/keel-plugin-0.5.0",
            "../wit/keel-plugin-0.6.0",
            "../wit/keel-plugin-0.7.0",
            "../wit/keel-plugin-0.8.0",
        ],
        inline: "
            package keel:host;

            world provider-exports {
                export keel:plugin/session-log@0.8.0;
            }
        ",
        world: "keel:host/provider-exports",
        exports: { default: async },
        with: {
            "keel:plugin/types@0.2.0": crate::wasm_host::abi_versions::since_v0_2::keel::plugin::types,
            "keel:plugin/session-log-types@0.8.0": crate::wasm_host::abi_versions::since_v0_8::keel::plugin0_8_0::session_log_types,
        },
    });
}

use keel::plugin0_8_0::{session_log, session_log_types};
use provider_exports::exports::keel::plugin0_8_0::session_log as session_log_export;

/// The export of the plugin that keeps the session logs, its typed door.
pub(crate) const SESSION_LOG_EXPORT: &str = "keel:plugin/session-log@0.8.0";

impl session_log_types::Host for StoreState {}

impl StoreState {
    /// `call` to the session log, through the kernel's routing.
    async fn ask_session_log(&mut self, call: ServiceCall) -> Result<ServiceAnswer, KernelError> {
        let _host = self.meter.host_call();
        Ok(self.host.call_typed(&call).await?)
    }

    /// `conversation` or `resume` (`call`), through the kernel's routing.
    async fn logged_conversation(
        &mut self,
        call: ServiceCall,
    ) -> Result<session_log_types::LoggedConversation, KernelError> {
        let method = call.method();
        match self.ask_session_log(call).await? {
            ServiceAnswer::Conversation(c) => Ok(logged_conversation_to_wit(*c)),
            _ => Err(misrouted(method)),
        }
    }
}

/// The answer to a session-log call that is not of the method asked, as an error.
fn misrouted(method: &str) -> KernelError {
    KernelError::Failed(format!(
        "keel routed a typed `session-log.{method}` call and got another method's answer; \
         please report this"
    ))
}

impl session_log::Host for StoreState {
    async fn append(&mut self, event: session_log_types::SessionEvent) -> Result<u64, KernelError> {
        let event = session_event_from_wit(event).map_err(KernelError::Invalid)?;
        match self
            .ask_session_log(ServiceCall::LogAppend(Box::new(event)))
            .await?
        {
            ServiceAnswer::Appended(seq) => Ok(seq),
            _ => Err(misrouted("append")),
        }
    }

    async fn started(&mut self, session: String, calls: Vec<String>) -> Result<u64, KernelError> {
        match self
            .ask_session_log(ServiceCall::LogStarted { session, calls })
            .await?
        {
            ServiceAnswer::Appended(seq) => Ok(seq),
            _ => Err(misrouted("started")),
        }
    }

    async fn list(&mut self) -> Result<Vec<session_log_types::SessionSummary>, KernelError> {
        match self.ask_session_log(ServiceCall::LogList).await? {
            ServiceAnswer::Sessions(sessions) => {
                Ok(sessions.into_iter().map(session_summary_to_wit).collect())
            }
            _ => Err(misrouted("list")),
        }
    }

    async fn read(&mut self, session: String) -> Result<session_log_types::LogRead, KernelError> {
        match self.ask_session_log(ServiceCall::LogRead(session)).await? {
            ServiceAnswer::LogRead(read) => Ok(log_read_to_wit(read)),
            _ => Err(misrouted("read")),
        }
    }

    async fn conversation(
        &mut self,
        session: String,
    ) -> Result<session_log_types::LoggedConversation, KernelError> {
        self.logged_conversation(ServiceCall::LogConversation(session))
            .await
    }

    async fn resume(
        &mut self,
        session: String,
    ) -> Result<session_log_types::LoggedConversation, KernelError> {
        self.logged_conversation(ServiceCall::LogResume(session))
            .await
    }

    async fn health(&mut self) -> Result<session_log_types::LogHealth, KernelError> {
        match self.ask_session_log(ServiceCall::LogHealth).await? {
            ServiceAnswer::LogHealth(h) => Ok(log_health_to_wit(h)),
            _ => Err(misrouted("health")),
        }
    }
}

/// Where the typed services a component exports at 0.8.0 (`session-log`) are, found when it is
/// linked.
#[derive(Default)]
pub(crate) struct ServiceIndices {
    session_log: Option<session_log_export::GuestIndices>,
}

impl ServiceIndices {
    /// The typed services `report` lists among the component's exports.
    pub(crate) fn new(
        pre: &InstancePre<StoreState>,
        report: &ComponentReport,
    ) -> wasmtime::Result<ServiceIndices> {
        Ok(ServiceIndices {
            session_log: report
                .exports
                .iter()
                .any(|e| e == SESSION_LOG_EXPORT)
                .then(|| session_log_export::GuestIndices::new(pre))
                .transpose()?,
        })
    }

    /// The exports of `instance`, each type-checked against this package's WIT: one of another
    /// shape fails the instance, naming the export.
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<ServiceExports> {
        Ok(ServiceExports {
            session_log: self
                .session_log
                .as_ref()
                .map(|i| i.load(&mut *store, instance))
                .transpose()
                .map_err(|e| e.context(super::wrong_shape(SESSION_LOG_EXPORT)))?,
        })
    }
}

/// The 0.8.0 typed services an instance exports.
pub(crate) struct ServiceExports {
    session_log: Option<session_log_export::Guest>,
}

impl ServiceExports {
    /// Whether the instance serves `call` through a 0.8.0 typed door.
    pub(crate) fn serves(&self, call: &ServiceCall) -> bool {
        call.service() == services::SESSION_LOG && self.session_log.is_some()
    }

    /// `call` through the typed export; only for a call it [`serves`](Self::serves).
    pub(crate) async fn call(
        &self,
        store: &mut Store<StoreState>,
        call: &ServiceCall,
    ) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
        let log = self.session_log.as_ref().ok_or_else(|| {
            wasmtime::format_err!("the instance has no typed door for `{}`", call.service())
        })?;
        // What the provider answered; a record that does not convert (a tool schema that is
        // not JSON) fails the call, naming it.
        fn answered<T>(
            answer: wasmtime::Result<Result<T, KernelError>>,
            to: impl FnOnce(T) -> Result<ServiceAnswer, String>,
        ) -> wasmtime::Result<Result<ServiceAnswer, PluginError>> {
            answer.map(|r| match r {
                Ok(value) => to(value).map_err(PluginError::Failed),
                Err(e) => Err(super::since_v0_6::provider_error(e)),
            })
        }
        match call {
            ServiceCall::LogAppend(event) => {
                let event = session_event_to_wit((**event).clone());
                answered(log.call_append(store, &event).await, |seq| {
                    Ok(ServiceAnswer::Appended(seq))
                })
            }
            ServiceCall::LogStarted { session, calls } => {
                answered(log.call_started(store, session, calls).await, |seq| {
                    Ok(ServiceAnswer::Appended(seq))
                })
            }
            ServiceCall::LogList => answered(log.call_list(store).await, |sessions| {
                Ok(ServiceAnswer::Sessions(
                    sessions.into_iter().map(session_summary_from_wit).collect(),
                ))
            }),
            ServiceCall::LogRead(session) => {
                answered(log.call_read(store, session).await, |read| {
                    log_read_from_wit(read).map(ServiceAnswer::LogRead)
                })
            }
            ServiceCall::LogConversation(session) | ServiceCall::LogResume(session) => {
                let asked = if matches!(call, ServiceCall::LogResume(_)) {
                    log.call_resume(store, session).await
                } else {
                    log.call_conversation(store, session).await
                };
                answered(asked, |c| {
                    logged_conversation_from_wit(c)
                        .map(|c| ServiceAnswer::Conversation(Box::new(c)))
                })
            }
            ServiceCall::LogHealth => answered(log.call_health(store).await, |h| {
                Ok(ServiceAnswer::LogHealth(log_health_from_wit(h)))
            }),
            _ => Err(wasmtime::format_err!(
                "the instance has no typed door for `{}`",
                call.service()
            )),
        }
    }
}
