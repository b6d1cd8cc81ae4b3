//! OpenTelemetry export (`[telemetry] otlp-endpoint`): a session's turns, model calls, tool
//! calls, gate decisions and plugin lifecycle as spans, token counts and latencies as metrics,
//! sent over OTLP/HTTP with protobuf bodies.
//!
//! - **Off by default.** Without `otlp-endpoint` nothing here runs: no task, no thread, no
//!   allocation ([`Telemetry::start`] returns `None` before touching anything).
//! - **Through the network gate.** The endpoint is judged by the person's network policy at
//!   session start (one warning and no exporter when it is refused or would need a prompt), and
//!   every request again, address by address, by [`client::GatedClient`].
//! - **No content** (prompt, model text, tool arguments and results, command lines) unless
//!   `content = true`, and then each attribute cut to [`record::MAX_CONTENT`] bytes.
//! - **Bounded.** Spans go through the SDK's batch processor (its own thread, a queue of
//!   [`MAX_QUEUE`] spans: more are dropped, never waited for); metrics through a periodic
//!   reader. Each request has [`EXPORT_TIMEOUT`] and no retries; closing waits at most
//!   [`CLOSE_BOUND`] in all, so a dead collector never slows a turn and slows the exit by at
//!   most that.
//!
//! Where the data comes from: the kernel's bus (`Kernel::events`, topic `session.event`,
//! each entry the agent loop logs) and its plugin observer (`Kernel::plugin_changes`,
//! `Kernel::call_figures`). [`record::Recorder`] says what each span covers.

mod client;
mod record;

use std::sync::Mutex;
use std::time::Duration;

use keel_kernel::Kernel;
use keel_kernel::gates::net_policy::NetDecision;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Context;
use crate::settings::ModelChoice;

/// The deadline of one export request (resolve, connect, send, answer).
const EXPORT_TIMEOUT: Duration = Duration::from_millis(1500);
/// The most [`Telemetry::close`] waits, in all, for the last spans and metrics to go out.
const CLOSE_BOUND: Duration = Duration::from_secs(2);
/// Spans waiting for export at most; more are dropped.
const MAX_QUEUE: usize = 2048;
/// How often a batch of spans goes out.
const SPAN_DELAY: Duration = Duration::from_secs(2);
/// How often metrics go out (and once more at close).
const METRIC_INTERVAL: Duration = Duration::from_secs(30);

/// A session's exporter: the providers and the task reading the kernel's broadcasts.
pub struct Telemetry {
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Telemetry {
    /// The exporter of `ctx`'s `[telemetry]`, reading `kernel`'s events from now on; `None`
    /// (after one warning) when it is not configured, the endpoint is not a URL or the
    /// network policy does not allow it. Must be called on the session's runtime.
    pub fn start(ctx: &Context, choice: &ModelChoice, kernel: &Kernel) -> Option<Telemetry> {
        let settings = &ctx.config.telemetry;
        let endpoint = settings.otlp_endpoint.as_deref()?;
        match Telemetry::build(ctx, choice, kernel, endpoint, settings.content) {
            Ok(t) => Some(t),
            Err(e) => {
                stderrln!("warning: telemetry: {e}; nothing of this session is exported");
                None
            }
        }
    }

    fn build(
        ctx: &Context,
        choice: &ModelChoice,
        kernel: &Kernel,
        endpoint: &str,
        content: bool,
    ) -> anyhow::Result<Telemetry> {
        let base = url::Url::parse(endpoint).map_err(|e| {
            anyhow::anyhow!("[telemetry] otlp-endpoint `{endpoint}` is not a URL: {e}")
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            anyhow::bail!(
                "[telemetry] otlp-endpoint `{endpoint}`: give an http:// or https:// URL"
            );
        }
        let base = base.as_str().trim_end_matches('/').to_owned();
        let traces = format!("{base}/v1/traces");
        let metrics = format!("{base}/v1/metrics");
        let (policy, _warnings) = crate::settings::network_policy_quiet(ctx, choice)?;
        for url in [&traces, &metrics] {
            let verdict = policy.decide_url(url);
            if verdict.decision != NetDecision::Allow {
                anyhow::bail!("{}", client::refusal(&verdict));
            }
        }
        let runtime = tokio::runtime::Handle::current();
        let http = std::sync::Arc::new(client::GatedClient::new(policy, runtime, EXPORT_TIMEOUT));
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("keel")
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();

        let span_exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(traces)
            .with_timeout(EXPORT_TIMEOUT)
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .with_shared_http_client(http.clone())
            .build()?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(MAX_QUEUE)
            .with_scheduled_delay(SPAN_DELAY)
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(span_exporter)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_resource(resource.clone())
            .build();

        let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(metrics)
            .with_timeout(EXPORT_TIMEOUT)
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .with_shared_http_client(http)
            .build()?;
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(
                PeriodicReader::builder(metric_exporter)
                    .with_interval(METRIC_INTERVAL)
                    .build(),
            )
            .with_resource(resource)
            .build();

        let recorder = record::Recorder::new(
            tracer_provider.tracer("keel"),
            &meter_provider,
            kernel.clone(),
            content,
        );
        // Subscribed before anything of the session happens: the plugins load after this.
        let events = kernel.events();
        let changes = kernel.plugin_changes();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(record::run(recorder, events, changes, stopped));
        Ok(Telemetry {
            tracer_provider,
            meter_provider,
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
        })
    }

    /// Read what is left of the broadcasts, end what is still open and send the last spans
    /// and metrics: at most [`CLOSE_BOUND`] in all, whatever the collector does.
    pub async fn close(&self) {
        let deadline = tokio::time::Instant::now() + CLOSE_BOUND;
        if let Some(stop) = take(&self.stop) {
            let _ = stop.send(());
        }
        if let Some(task) = take(&self.task) {
            let _ = tokio::time::timeout_at(deadline, task).await;
        }
        let (done, mut finished) = tokio::sync::mpsc::channel(2);
        self.shut_down(Some(done));
        for _ in 0..2 {
            if tokio::time::timeout_at(deadline, finished.recv())
                .await
                .is_err()
            {
                break;
            }
        }
    }

    /// Shut both providers down, each on a thread of its own (the SDK's shutdown blocks until
    /// its last export ends); `done` hears of each as it finishes.
    fn shut_down(&self, done: Option<tokio::sync::mpsc::Sender<()>>) {
        let traces = self.tracer_provider.clone();
        let metrics = self.meter_provider.clone();
        let done2 = done.clone();
        let spawned = std::thread::Builder::new()
            .name("keel-otlp-close".into())
            .spawn(move || {
                let _ = traces.shutdown_with_timeout(EXPORT_TIMEOUT);
                if let Some(done) = done {
                    let _ = done.blocking_send(());
                }
            })
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("keel-otlp-close".into())
                    .spawn(move || {
                        let _ = metrics.shutdown_with_timeout(EXPORT_TIMEOUT);
                        if let Some(done) = done2 {
                            let _ = done.blocking_send(());
                        }
                    })
            });
        if let Err(e) = spawned {
            stderrln!("warning: telemetry: cannot shut the exporter down: {e}");
        }
    }
}

impl Drop for Telemetry {
    /// A session dropped without [`Telemetry::close`] (an error path): the providers are shut
    /// down off this thread, so dropping the last of them never blocks on a collector.
    fn drop(&mut self) {
        if take(&self.task).is_some() {
            self.shut_down(None);
        }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}
