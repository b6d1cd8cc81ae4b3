//! What the page asks for: the page itself, the plugin graph with each plugin's declarations
//! and call figures, the sessions and one session's log, the open approval questions, and the
//! answer to one.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{App, feed, inbox};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/app.css");

/// Where the page exchanges its link's one-time code for the token.
pub(super) const EXCHANGE: &str = "/api/session";

/// The most of an answer the page may post (a "no, and do this instead" included).
const MAX_ANSWER: usize = 4096;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route(
            "/",
            get(|| async { page(INDEX, "text/html; charset=utf-8") }),
        )
        .route("/app.js", get(|| async { page(SCRIPT, "text/javascript") }))
        .route("/app.css", get(|| async { page(STYLE, "text/css") }))
        .route(EXCHANGE, post(exchange))
        .route("/api/overview", get(overview))
        .route("/api/graph", get(graph))
        .route("/api/sessions", get(sessions))
        .route("/api/sessions/{id}", get(session))
        .route("/api/approvals", get(approvals))
        .route("/api/approvals/{id}", post(answer))
        .route("/api/events", get(feed::events))
}

fn page(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

fn json_response(value: &Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn failed(status: StatusCode, message: impl Into<String>) -> Response {
    (status, json!({ "error": message.into() }).to_string()).into_response()
}

/// `POST /api/session` `{"code": …}`: the token for a code the door gave out, once. The door
/// let it through on its Host and Origin alone (a POST must carry the page's own Origin).
async fn exchange(
    State(app): State<App>,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> Response {
    let code = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default();
    match app.door.exchange(&code) {
        Ok(token) => {
            // The connection showed a good code: it is the page's, not timed out.
            if let Some(passed) =
                extensions.get::<axum::extract::ConnectInfo<super::conn::Passed>>()
            {
                passed.0.mark();
            }
            json_response(&json!({ "token": token }))
        }
        Err(refusal) => super::refused(&refusal),
    }
}

async fn overview(State(app): State<App>) -> Response {
    let kernel = &app.sources.kernel;
    let confinement = kernel.confinement();
    json_response(&json!({
        "version": env!("CARGO_PKG_VERSION"),
        "live": app.sources.live.as_ref().map(|id| id()),
        "sandbox": confinement.describe(),
    }))
}

/// Every plugin with its state, version, kind, what it provides and requires, its limits
/// and declared capabilities, and the calls made into it; the edges by dependency.
pub(super) fn graph_value(kernel: &keel_kernel::Kernel) -> Value {
    let figures = kernel.call_figures();
    let plugins: Vec<Value> = kernel
        .list()
        .into_iter()
        .map(|status| {
            let manifest = kernel.manifest(&status.name);
            let mut entry = serde_json::to_value(&status).unwrap_or(Value::Null);
            if let Some(object) = entry.as_object_mut() {
                object.insert(
                    "figures".into(),
                    serde_json::to_value(figures.get(&status.name).copied().unwrap_or_default())
                        .unwrap_or(Value::Null),
                );
                if let Some(m) = manifest {
                    object.insert("description".into(), json!(m.description));
                    object.insert(
                        "limits".into(),
                        serde_json::to_value(m.limits).unwrap_or(Value::Null),
                    );
                    object.insert(
                        "capabilities".into(),
                        json!(keel_kernel::consent::capability_lines(&m)),
                    );
                }
            }
            entry
        })
        .collect();
    let edges: Vec<Value> = kernel
        .graph()
        .map(|g| {
            g.edges()
                .into_iter()
                .map(|(from, to, service)| json!({"from": from, "to": to, "service": service}))
                .collect()
        })
        .unwrap_or_default();
    json!({ "plugins": plugins, "edges": edges })
}

async fn graph(State(app): State<App>) -> Response {
    json_response(&graph_value(&app.sources.kernel))
}

async fn sessions(State(app): State<App>) -> Response {
    log_answer(crate::commands::sessions::list(&app.sources.kernel).await)
}

async fn session(State(app): State<App>, Path(id): Path<String>) -> Response {
    // The log plugin checks the id too; this keeps anything odd from reaching it at all.
    let plain = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !plain {
        return failed(StatusCode::BAD_REQUEST, "not a session id");
    }
    log_answer(crate::commands::sessions::read(&app.sources.kernel, &id).await)
}

/// The session log's answer as JSON: the records keel read it into, never the plugin's text
/// passed on.
fn log_answer<T: serde::Serialize>(answer: anyhow::Result<T>) -> Response {
    match answer {
        Ok(answer) => json_response(&serde_json::to_value(answer).unwrap_or(Value::Null)),
        Err(e) => failed(
            StatusCode::BAD_GATEWAY,
            format!("the session log could not be read: {e:#}"),
        ),
    }
}

async fn approvals(State(app): State<App>) -> Response {
    if app.sources.live.is_none() {
        return json_response(&json!([]));
    }
    json_response(&serde_json::to_value(inbox::inbox().open()).unwrap_or(Value::Null))
}

/// `{"answer": "y" | "s" | "a" | "n" | what to do instead}` for question `id`.
async fn answer(State(app): State<App>, Path(id): Path<u64>, body: Bytes) -> Response {
    if app.sources.live.is_none() {
        return failed(StatusCode::NOT_FOUND, "this page serves no live session");
    }
    if body.len() > MAX_ANSWER {
        return failed(StatusCode::PAYLOAD_TOO_LARGE, "the answer is too long");
    }
    let Some(line) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("answer").and_then(Value::as_str).map(str::to_owned))
    else {
        return failed(
            StatusCode::BAD_REQUEST,
            "send {\"answer\": \"y\"} (or s, a, n, or what to do instead)",
        );
    };
    if inbox::inbox().answer_from_page(id, &line) {
        json_response(&json!({ "ok": true }))
    } else {
        failed(
            StatusCode::CONFLICT,
            "that question was already answered (in the terminal, or on another page)",
        )
    }
}
