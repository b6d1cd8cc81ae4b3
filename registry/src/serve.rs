//! `keel registry serve`: a registry directory over HTTP.
//!
//! Routes: `GET /config`, `GET /index` (JSON list of names), `GET /index/{name}` (the raw
//! JSONL), `POST /index/{name}` (append one record line), `GET /blobs/sha256/{hex}`,
//! `PUT /blobs/sha256/{hex}` (the body must hash to `hex`). Appends go through the same lock
//! and checks as a local publish; with a validator, a release's component is also checked as
//! `keel publish` checks it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use keel_kernel::WasmHost;

use crate::RegistryError;
use crate::fsutil::sha256_hex;
use crate::install::manifest_of;
use crate::local::LocalRegistry;
use crate::name::PluginName;
use crate::record::Record;

/// How the server runs.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Check each published component as `keel publish` does (ABI, imports, version).
    pub validator: Option<WasmHost>,
}

struct AppState {
    registry: LocalRegistry,
    options: ServeOptions,
}

/// Refuse to listen anywhere but loopback unless `expose` (the user's explicit
/// `--expose-registry-to-network`).
pub fn check_bind_address(addr: SocketAddr, expose: bool) -> Result<(), RegistryError> {
    if addr.ip().is_loopback() || expose {
        Ok(())
    } else {
        Err(RegistryError::Refused(format!(
            "not binding to {addr}: that would let every host that can reach this machine read the registry's plugins and publish to it; use a loopback address such as 127.0.0.1:{}, or pass --expose-registry-to-network if that is what you want",
            addr.port()
        )))
    }
}

fn error_response(e: RegistryError) -> Response {
    let status = match &e {
        RegistryError::Conflict { .. } => StatusCode::CONFLICT,
        RegistryError::NoSuchPlugin { .. }
        | RegistryError::NoSuchVersion { .. }
        | RegistryError::MissingBlob { .. } => StatusCode::NOT_FOUND,
        RegistryError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        RegistryError::Io { .. } | RegistryError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    (status, e.to_string()).into_response()
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            text,
        )
            .into_response(),
        Err(e) => error_response(RegistryError::internal(e)),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, RegistryError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RegistryError::Internal(e.to_string()))?
}

async fn config(State(state): State<Arc<AppState>>) -> Response {
    json(state.registry.config())
}

async fn names(State(state): State<Arc<AppState>>) -> Response {
    let registry = state.registry.clone();
    match blocking(move || registry.names()).await {
        Ok(names) => json(&names),
        Err(e) => error_response(e),
    }
}

async fn read_index(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let registry = state.registry.clone();
    let result = blocking(move || {
        let name: PluginName = name.parse()?;
        registry.read_index(&name)
    })
    .await;
    match result {
        Ok(bytes) if bytes.is_empty() => StatusCode::NOT_FOUND.into_response(),
        Ok(bytes) => bytes.into_response(),
        Err(e) => error_response(e),
    }
}

async fn append(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let state = state.clone();
    let result = blocking(move || {
        let name: PluginName = name.parse()?;
        let line = std::str::from_utf8(&body)
            .map_err(|_| RegistryError::Refused("the record is not UTF-8".into()))?
            .trim_end_matches('\n');
        let record = Record::parse_line(line, "the submitted record")?;
        if let Some(release) = &record.release {
            manifest_of(&name, &record)?;
            if let Some(host) = &state.options.validator {
                let blob = state.registry.read_blob(&release.sha256)?;
                crate::publish::validate(
                    host,
                    std::path::Path::new("keel.toml"),
                    &release.manifest,
                    blob,
                )?;
            }
        }
        state
            .registry
            .append(&name, None, &mut |_log| Ok(record.clone()), &mut |_| {})
    })
    .await;
    match result {
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => error_response(e),
    }
}

async fn read_blob(State(state): State<Arc<AppState>>, Path(sha): Path<String>) -> Response {
    let registry = state.registry.clone();
    match blocking(move || registry.read_blob(&sha)).await {
        Ok(bytes) => bytes.into_response(),
        Err(e) => error_response(e),
    }
}

async fn write_blob(
    State(state): State<Arc<AppState>>,
    Path(sha): Path<String>,
    body: Bytes,
) -> Response {
    let registry = state.registry.clone();
    let result = blocking(move || {
        let actual = sha256_hex(&body);
        if actual != sha.to_ascii_lowercase() {
            return Err(RegistryError::Refused(format!(
                "the uploaded blob hashes to {actual}, not {sha}"
            )));
        }
        registry.write_blob(&body)
    })
    .await;
    match result {
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => error_response(e),
    }
}

fn router(registry: LocalRegistry, options: ServeOptions) -> Router {
    let limit = usize::try_from(registry.config().max_blob_bytes).unwrap_or(usize::MAX);
    let state = Arc::new(AppState { registry, options });
    Router::new()
        .route("/config", get(config))
        .route("/index", get(names))
        .route("/index/{name}", get(read_index).post(append))
        .route("/blobs/sha256/{sha}", get(read_blob).put(write_blob))
        .layer(DefaultBodyLimit::max(limit.saturating_add(4096)))
        .with_state(state)
}

/// Serve `registry` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: LocalRegistry,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(registry, options))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A server running on its own thread (tests, benchmarks); stopped when dropped.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Start serving `registry` on `addr` (loopback only) on a background thread.
pub fn spawn_server(
    registry: LocalRegistry,
    addr: SocketAddr,
    options: ServeOptions,
) -> Result<ServerHandle, RegistryError> {
    check_bind_address(addr, false)?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| RegistryError::Io {
        what: format!("listening on {addr}"),
        reason: e.to_string(),
    })?;
    let addr = listener.local_addr().map_err(RegistryError::internal)?;
    listener
        .set_nonblocking(true)
        .map_err(RegistryError::internal)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(RegistryError::internal)?;
    let thread = std::thread::spawn(move || {
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = serve(listener, registry, options, shutdown).await {
                tracing::error!("registry server stopped: {e}");
            }
        });
    });
    Ok(ServerHandle {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}
