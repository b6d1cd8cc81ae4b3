//! The in-process plugin of the kernel tests: it registers what its manifest and behaviour
//! say, through the same HostHandle a WebAssembly plugin uses, and can play the parts the gate
//! pipeline tests need (a canned model, a command tool, a guard) from a shared [`Script`].
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_kernel::{
    CallChain, Event, ExecCommand, GuardVerdict, HostHandle, InstanceError, Manifest,
    PluginInstance, PluginPackage, PluginSource, ToolCapabilities, ToolSpec,
};
use keel_protocol::ModelResponse;

/// The part a fake plays besides being a plain plugin.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub enum Part {
    /// Only what its manifest and [`Behaviour`] say.
    #[default]
    Plain,
    /// Every call answers the script's model response.
    Model,
    /// Registers `exec_shell`, which runs its `command` through the exec gate.
    Shell,
    /// Registers the guard `hostile.allow-everything`, which answers the script's verdict.
    Guard,
    /// Registers `read_file` (reads files) and `write_file` (writes files); both count their
    /// runs in the script's `tool_runs`.
    Files,
}

/// What the model, shell and guard parts do, shared with the test that steers them.
#[derive(Clone, Default)]
pub struct Script {
    /// The model's next response.
    pub response: Arc<Mutex<Option<ModelResponse>>>,
    /// How often the shell tool ran.
    pub tool_runs: Arc<AtomicUsize>,
    /// The guard's answer; `None` makes it fail.
    pub guard: Arc<Mutex<Option<GuardVerdict>>>,
    /// Where the shell tool's exec calls are sent instead of the command in its input.
    pub exec_override: Arc<Mutex<Option<String>>>,
    /// How much output the shell tool prints instead of running anything.
    pub output_bytes: Arc<AtomicUsize>,
    /// Every request the model part was sent, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
}

/// What the fake does besides providing its declared services.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// Register a tool named `tool_<plugin>` (dashes become underscores).
    pub tool: bool,
    /// Fail activation after registering everything.
    pub fail_activate: bool,
    /// In deactivate, try to register a tool and record the kernel's answer in `log`.
    pub effect_in_deactivate: Option<Arc<std::sync::Mutex<Vec<String>>>>,
    /// handle_call sleeps this long before answering.
    pub call_delay: Duration,
    /// Method `forward` calls this service through the kernel.
    pub forward_to: Option<String>,
    /// The part it plays, steered by `script`.
    pub part: Part,
    /// See [`Script`].
    pub script: Script,
}

pub fn manifest(
    name: &str,
    version: &str,
    provides: &[(&str, &str)],
    requires: &[(&str, &str)],
) -> Manifest {
    let mut text =
        format!("name = \"{name}\"\nversion = \"{version}\"\nkind = \"wasm\"\n[provides]\n");
    for (s, v) in provides {
        text.push_str(&format!("\"{s}\" = \"{v}\"\n"));
    }
    text.push_str("[requires]\n");
    for (s, r) in requires {
        text.push_str(&format!("\"{s}\" = \"{r}\"\n"));
    }
    match Manifest::parse(&text, Path::new("fake/keel.toml")) {
        Ok(m) => m,
        Err(e) => panic!("fake manifest does not parse: {e}"),
    }
}

pub fn package(manifest: Manifest, behaviour: Behaviour) -> PluginPackage {
    PluginPackage {
        source: Arc::new(FakeSource {
            manifest: manifest.clone(),
            behaviour,
        }),
        manifest,
    }
}

struct FakeSource {
    manifest: Manifest,
    behaviour: Behaviour,
}

#[async_trait]
impl PluginSource for FakeSource {
    async fn instantiate(
        &self,
        host: HostHandle,
    ) -> Result<Box<dyn PluginInstance>, InstanceError> {
        Ok(Box::new(Fake {
            host,
            manifest: self.manifest.clone(),
            behaviour: self.behaviour.clone(),
        }))
    }
}

struct Fake {
    host: HostHandle,
    manifest: Manifest,
    behaviour: Behaviour,
}

fn ke(e: keel_kernel::KernelError) -> InstanceError {
    InstanceError::Returned(e.to_string().into())
}

fn fail(e: impl std::fmt::Display) -> InstanceError {
    InstanceError::Returned(e.to_string().into())
}

#[async_trait]
impl PluginInstance for Fake {
    async fn activate(&mut self, chain: &CallChain, _config: &str) -> Result<(), InstanceError> {
        self.host.enter(chain);
        for (service, version) in &self.manifest.provides {
            self.host
                .provide(service, &version.to_string())
                .map_err(ke)?;
        }
        if self.behaviour.tool {
            self.host
                .register_tool(ToolSpec {
                    name: format!("tool_{}", self.manifest.name.replace('-', "_")),
                    description: format!("tool of {}", self.manifest.name),
                    input_schema: "{\"type\":\"object\"}".into(),
                    capabilities: ToolCapabilities::default(),
                    parallel_safe: true,
                })
                .map_err(ke)?;
        }
        self.host.subscribe("test.*").map_err(ke)?;
        self.host
            .add_prompt_fragment(
                "intro",
                &format!("{} {}", self.manifest.name, self.manifest.version),
            )
            .map_err(ke)?;
        match self.behaviour.part {
            Part::Plain | Part::Model => {}
            Part::Shell => self
                .host
                .register_tool(ToolSpec {
                    name: "exec_shell".into(),
                    description: "runs a command".into(),
                    input_schema: r#"{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}"#.into(),
                    capabilities: ToolCapabilities {
                        executes_code: true,
                        ..ToolCapabilities::default()
                    },
                    parallel_safe: false,
                })
                .map_err(ke)?,
            Part::Guard => self
                .host
                .register_guard("hostile.allow-everything")
                .map_err(ke)?,
            Part::Files => {
                for (name, capabilities) in [
                    ("read_file", ToolCapabilities::READS_FILES),
                    ("write_file", ToolCapabilities::WRITES_FILES),
                ] {
                    self.host
                        .register_tool(ToolSpec {
                            name: name.into(),
                            description: format!("{name} of the fake"),
                            input_schema: r#"{"type":"object"}"#.into(),
                            capabilities,
                            parallel_safe: false,
                        })
                        .map_err(ke)?;
                }
            }
        }
        if self.behaviour.fail_activate {
            return Err(InstanceError::Returned("configured to fail".into()));
        }
        Ok(())
    }

    async fn deactivate(&mut self, chain: &CallChain) -> Result<(), InstanceError> {
        self.host.enter(chain);
        if let Some(log) = &self.behaviour.effect_in_deactivate {
            let answer = self.host.register_tool(ToolSpec {
                name: "late_tool".into(),
                description: String::new(),
                input_schema: "{}".into(),
                capabilities: ToolCapabilities::default(),
                parallel_safe: false,
            });
            if let Ok(mut log) = log.lock() {
                log.push(match answer {
                    Ok(()) => "accepted".into(),
                    Err(e) => e.to_string(),
                });
            }
        }
        Ok(())
    }

    async fn handle_call(
        &mut self,
        chain: &CallChain,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, InstanceError> {
        self.host.enter(chain);
        if self.behaviour.part == Part::Model {
            self.behaviour
                .script
                .requests
                .lock()
                .map_err(fail)?
                .push(payload.to_owned());
            let response = self.behaviour.script.response.lock().map_err(fail)?.clone();
            let response = response.ok_or_else(|| fail("no scripted response"))?;
            return serde_json::to_string(&response).map_err(fail);
        }
        if !self.behaviour.call_delay.is_zero() {
            tokio::time::sleep(self.behaviour.call_delay).await;
        }
        match method {
            "forward" => {
                let target = self.behaviour.forward_to.clone().unwrap_or_default();
                self.host.call(&target, "echo", payload).await.map_err(ke)
            }
            // The door properties: call any service, emit any topic, as a plugin would.
            "call" => self.host.call(payload, "echo", "probe").await.map_err(ke),
            // `SERVICE METHOD PAYLOAD`: call any method of any service.
            "call-method" => {
                let mut words = payload.splitn(3, ' ');
                let service = words.next().unwrap_or_default();
                let method = words.next().unwrap_or_default();
                let rest = words.next().unwrap_or_default();
                self.host.call(service, method, rest).await.map_err(ke)
            }
            "emit" => self
                .host
                .emit(payload, "probe")
                .map(|()| String::from("emitted"))
                .map_err(ke),
            // `TOPIC BYTES`: emit a payload of that many bytes.
            "emit-sized" => {
                let (topic, bytes) = payload.split_once(' ').unwrap_or((payload, "0"));
                let bytes = bytes.parse().unwrap_or(0);
                self.host
                    .emit(topic, &"x".repeat(bytes))
                    .map(|()| String::from("emitted"))
                    .map_err(ke)
            }
            "count" => {
                let n = self
                    .host
                    .state_get("count")
                    .and_then(|v| String::from_utf8(v).ok())
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0)
                    + 1;
                self.host
                    .state_set("count", n.to_string().into_bytes())
                    .map_err(ke)?;
                Ok(n.to_string())
            }
            // `memory` `recall` through the JSON door: one entry naming this plugin.
            "recall" => {
                let request: keel_protocol::RecallRequest =
                    serde_json::from_str(payload).map_err(fail)?;
                Ok(serde_json::json!([{
                    "source": format!("{}@{}", self.manifest.name, self.manifest.version),
                    "text": request.input,
                }])
                .to_string())
            }
            // A typed `memory` `recall` (ABI 0.6.0's door) for the input `payload`.
            "recall-typed" => {
                let call = keel_kernel::ServiceCall::Recall(keel_protocol::RecallRequest {
                    session: "s".into(),
                    input: payload.to_owned(),
                });
                Ok(match self.host.call_typed(&call).await {
                    Ok(answer) => format!("{answer:?}"),
                    Err(e) => format!("error: {e}"),
                })
            }
            "last-event" => Ok(self
                .host
                .state_get("last-event")
                .and_then(|v| String::from_utf8(v).ok())
                .unwrap_or_default()),
            _ => Ok(format!(
                "{}@{} {service}.{method}({payload})",
                self.manifest.name, self.manifest.version
            )),
        }
    }

    async fn invoke_tool(
        &mut self,
        chain: &CallChain,
        name: &str,
        input: &str,
    ) -> Result<String, InstanceError> {
        self.host.enter(chain);
        if self.behaviour.part == Part::Files {
            self.behaviour
                .script
                .tool_runs
                .fetch_add(1, Ordering::SeqCst);
            return Ok(format!("{name} ran"));
        }
        if self.behaviour.part != Part::Shell {
            return Ok(format!("{name}:{input}"));
        }
        let script = &self.behaviour.script;
        script.tool_runs.fetch_add(1, Ordering::SeqCst);
        let input: serde_json::Value = serde_json::from_str(input).map_err(fail)?;
        let bytes = script.output_bytes.load(Ordering::SeqCst);
        if bytes > 0 {
            return Ok("x".repeat(bytes));
        }
        let command = script
            .exec_override
            .lock()
            .map_err(fail)?
            .clone()
            .or_else(|| input["command"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let out = self
            .host
            .exec(ExecCommand {
                line: command,
                cwd: ".".into(),
                timeout: Duration::from_secs(10),
            })
            .await
            .map_err(fail)?;
        Ok(format!("exit {:?}\n{}", out.exit_code, out.output))
    }

    async fn check_tool_call(
        &mut self,
        _chain: &CallChain,
        _guard: &str,
        _tool: &str,
        _input: &str,
    ) -> Result<GuardVerdict, InstanceError> {
        self.behaviour
            .script
            .guard
            .lock()
            .map_err(fail)?
            .clone()
            .ok_or_else(|| fail("the guard crashed"))
    }

    async fn on_event(&mut self, chain: &CallChain, event: &Event) -> Result<(), InstanceError> {
        self.host.enter(chain);
        self.host
            .state_set("last-event", event.payload.clone().into_bytes())
            .map_err(ke)
    }
}
