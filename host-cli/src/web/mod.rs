//! `keel web` and `keel run --web`: the runtime on a local page. The plugin graph live (from
//! the kernel's plugin changes, not by polling), the sessions and their timelines (from the
//! session logs, through the session-log plugin as `keel sessions` reads them), and, for a
//! live session, its events as they happen and its approval questions (the inbox).
//!
//! The server is keel's own (axum on the session's runtime); the page is three embedded files
//! with no build step. `door.rs` decides who may use it; `api.rs` answers; `feed.rs` streams.
//! Nothing of this runs unless the person asks for the page.

mod api;
mod conn;
pub mod door;
mod feed;
pub mod inbox;
mod logs;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use keel_kernel::Kernel;

use door::{Asked, Door};

/// How the page is served.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Open the person's browser at the URL.
    pub open: bool,
}

/// What the page shows.
#[derive(Clone)]
pub struct Sources {
    /// The kernel whose plugins the graph shows and whose session-log plugin reads the logs.
    pub kernel: Kernel,
    /// The live session's id, when the page serves one (`keel run --web`, `/web`): its events
    /// stream and its approval questions reach the inbox.
    pub live: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// The folder of the session logs, watched so that sessions other processes are running
    /// grow on the page (`keel web`).
    pub logs: Option<std::path::PathBuf>,
}

/// A running page; dropping it stops the server.
pub struct Served {
    door: Door,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    live: bool,
    /// Watches the session logs while the page is served.
    _logs: Option<logs::LogWatch>,
}

impl Served {
    /// A URL for the person to open: a one-time code of its own each time, good until used
    /// (it is shown, never put in a command line).
    pub fn url(&self) -> anyhow::Result<String> {
        self.door.url(None)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if self.live {
            inbox::inbox().serving(false);
        }
    }
}

#[derive(Clone)]
struct App {
    door: Door,
    sources: Sources,
    /// The sessions whose logs changed, as the watcher sees them.
    logs: Option<tokio::sync::broadcast::Sender<Vec<String>>>,
}

/// Serve the page for `sources` on 127.0.0.1.
pub async fn serve(sources: Sources, options: &Options) -> anyhow::Result<Served> {
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, options.port)))
            .await
            .with_context(|| {
                format!(
                    "cannot serve the page on 127.0.0.1:{}; choose another with --port",
                    options.port
                )
            })?;
    let port = listener.local_addr()?.port();
    let door = Door::new(port)?;
    conn::raise_descriptor_limit();
    let listener = conn::WatchedListener::new(listener, conn::unauthenticated_timeout());
    let live = sources.live.is_some();
    let watch = match &sources.logs {
        Some(dir) => match logs::LogWatch::start(dir) {
            Ok(watch) => Some(watch),
            Err(e) => {
                stderrln!("note: the page will not see sessions grow: {e:#}");
                None
            }
        },
        None => None,
    };
    let app = App {
        door: door.clone(),
        sources,
        logs: watch.as_ref().map(logs::LogWatch::sender),
    };
    let router = api::routes()
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
        .into_make_service_with_connect_info::<conn::Passed>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let server = axum::serve(listener, router).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        if let Err(e) = server.await {
            tracing::warn!("the web page's server stopped: {e}");
        }
    });
    if live {
        inbox::inbox().serving(true);
    }
    if options.open {
        // The opener's command line is readable by every local user: it gets a code of its
        // own, which lapses soon if the browser never uses it.
        open_browser(&door.url(Some(door::OPENER_CODE_LIFETIME))?);
    }
    Ok(Served {
        door,
        stop: Some(stop),
        live,
        _logs: watch,
    })
}

/// The door every request passes, and the headers every answer carries.
async fn guard(State(app): State<App>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // The page itself, its code and styles are the same for everyone and hold no secret: they
    // load without the token (the page then exchanges its link's code for it and sends it with
    // every request), and so does that exchange, which checks the code itself; but not from a
    // foreign Host or Origin.
    let public = matches!(
        request.uri().path(),
        "/" | "/app.js" | "/app.css" | api::EXCHANGE
    );
    let passed = request
        .extensions()
        .get::<axum::extract::ConnectInfo<conn::Passed>>()
        .map(|info| info.0.clone());
    let asked = Asked {
        host: text("host"),
        origin: text("origin"),
        token: door::token_in_query(request.uri().query()).or(text("x-keel-token")),
        changes_state: request.method() != Method::GET && request.method() != Method::HEAD,
    };
    let verdict = match app.door.check(&asked) {
        Err(door::Refusal::Token) if public => Ok(()),
        other => other,
    };
    let mut response = match verdict {
        Ok(()) => {
            // A request with the token makes the connection the page's: it is not timed out.
            if !public && let Some(passed) = &passed {
                passed.mark();
            }
            next.run(request).await
        }
        Err(refusal) => refused(&refusal),
    };
    secure(response.headers_mut());
    response
}

/// A refusal, on a connection that is then closed: a refused client holds no descriptor.
pub(super) fn refused(refusal: &door::Refusal) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(header::CONNECTION, "close")],
        refusal.message(),
    )
        .into_response()
}

fn secure(headers: &mut HeaderMap) {
    let set = |headers: &mut HeaderMap, name, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    );
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    set(headers, header::CACHE_CONTROL, "no-store");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
}

/// The person's browser at `url`, when there is a desktop to show it on. Its failure is only
/// a note: the URL is on stdout.
fn open_browser(url: &str) {
    let desktop = std::env::var_os("DISPLAY").is_some()
        || std::env::var_os("WAYLAND_DISPLAY").is_some()
        || cfg!(target_os = "macos");
    if !desktop {
        return;
    }
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match started {
        // Reaped in the background so it leaves no zombie.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => stderrln!("note: could not open a browser ({opener}: {e}); open the URL above"),
    }
}
