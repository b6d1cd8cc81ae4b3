//! A hostile OCI registry on loopback: every answer it can make bigger than keel needs (a
//! manifest of gigabytes, a tags page that never ends, a token or error body of any size) is
//! refused with a clear error while it streams, after keel has read a bounded number of bytes.
//! The same for a hostile server in place of `keel registry serve` (an `http://` registry).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use keel_registry::{OciOptions, PluginName, Registry, RegistryError};

use crate::common::R;

/// What the hostile registry sends endlessly (or, in practice, up to [`FLOOD_BYTES`]).
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// A tags page: `{"tags":["a0","a1",…` without end.
    TagFlood,
    /// A catalog that names one plugin with one landed record, whose manifest never ends.
    ManifestFlood,
    /// The same, with a `Content-Length` of 2 GiB declared up front.
    ManifestDeclared,
    /// A bearer challenge whose token service answers without end.
    TokenFlood,
    /// A server error whose body never ends.
    ErrorFlood,
    /// In place of `keel registry serve`: an index (or the list of plugins) without end.
    ServeIndexFlood,
    /// In place of `keel registry serve`: a blob declaring 2 GiB.
    ServeBlobDeclared,
    /// In place of `keel registry serve`: a server error whose body never ends.
    ServeErrorFlood,
}

/// What a flood stops at, so that a client without bounds ends too (and the test with it).
const FLOOD_BYTES: u64 = 256 * 1024 * 1024;
/// What the flood may have produced when keel has hung up: the bound keel reads (at most
/// 4 MiB, for a manifest) and the loopback socket's buffers on both sides.
const SERVED_CEILING: u64 = 32 * 1024 * 1024;

const HASH: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const CLAIM: &str = "2222222222222222";

/// A body of `head`, then `unit` repeated, up to [`FLOOD_BYTES`], counting into `served`
/// what it has handed to the connection, streamed without a declared length.
fn flood(head: &'static str, unit: &'static str, served: Arc<AtomicU64>) -> Body {
    let chunk: Bytes = unit.repeat(64 * 1024 / unit.len()).into();
    let head = Bytes::from_static(head.as_bytes());
    let stream = futures::stream::unfold(Some(head), move |next| {
        let served = Arc::clone(&served);
        let chunk = chunk.clone();
        async move {
            let out = next?;
            let total = served.fetch_add(out.len() as u64, Ordering::SeqCst) + out.len() as u64;
            let following = (total < FLOOD_BYTES).then_some(chunk);
            Some((Ok::<_, std::io::Error>(out), following))
        }
    });
    Body::from_stream(stream)
}

/// A registry committing `attack` on loopback, served by its own runtime until dropped.
struct Hostile {
    attack: Attack,
    port: u16,
    served: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl Hostile {
    fn start(attack: Attack) -> Result<Hostile, Box<dyn std::error::Error>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let served = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&served);
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let served = Arc::clone(&counter);
            async move { answer(attack, port, request.uri().path(), served) }
        });
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Hostile {
            attack,
            port,
            served,
            _runtime: runtime,
        })
    }

    fn registry(&self) -> Result<Registry, RegistryError> {
        if matches!(
            self.attack,
            Attack::ServeIndexFlood | Attack::ServeBlobDeclared | Attack::ServeErrorFlood
        ) {
            return Registry::open(&format!("http://127.0.0.1:{}", self.port), false);
        }
        Registry::open_oci(
            &format!("oci://127.0.0.1:{}/keel", self.port),
            OciOptions {
                plain_http: true,
                ..OciOptions::default()
            },
        )
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
}

fn json(text: String) -> Response {
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn answer(attack: Attack, port: u16, path: &str, served: Arc<AtomicU64>) -> Response {
    let ok = |body: Body| Response::new(body);
    match attack {
        Attack::TagFlood => ok(flood(r#"{"name":"x","tags":["a""#, r#"a","a"#, served)),
        Attack::ManifestFlood | Attack::ManifestDeclared => {
            if path.ends_with("/keel-catalog/tags/list") {
                json(r#"{"name":"keel/keel-catalog","tags":["acme.echo"]}"#.into())
            } else if path.ends_with("/tags/list") {
                json(format!(
                    r#"{{"name":"keel/acme/echo","tags":["keel-record-0-{HASH}-{CLAIM}","keel-landed-{HASH}-{CLAIM}"]}}"#
                ))
            } else if path.contains("/manifests/") {
                let mut response = ok(flood(
                    r#"{"schemaVersion":2,"annotations":{"dev.keel.record":""#,
                    "x",
                    served,
                ));
                if matches!(attack, Attack::ManifestDeclared) {
                    response.headers_mut().insert(
                        header::CONTENT_LENGTH,
                        HeaderValue::from_static("2147483648"),
                    );
                }
                response
            } else {
                json("{}".into())
            }
        }
        Attack::TokenFlood => {
            if path == "/token" {
                ok(flood(r#"{"token":""#, "t", served))
            } else {
                let mut response = Response::new(Body::empty());
                *response.status_mut() = StatusCode::UNAUTHORIZED;
                let challenge =
                    format!(r#"Bearer realm="http://127.0.0.1:{port}/token",service="hostile""#);
                if let Ok(value) = HeaderValue::from_str(&challenge) {
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, value);
                }
                response
            }
        }
        Attack::ServeIndexFlood => ok(flood("[\"a", "aaaa", served)),
        Attack::ServeBlobDeclared => {
            let mut response = ok(flood("", "b", served));
            response.headers_mut().insert(
                header::CONTENT_LENGTH,
                HeaderValue::from_static("2147483648"),
            );
            response
        }
        Attack::ErrorFlood | Attack::ServeErrorFlood => {
            let mut response = ok(flood(
                r#"{"errors":[{"code":"UNKNOWN","message":""#,
                "\u{1b}[2K",
                served,
            ));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// Run `read` against a registry committing `attack`; the error it ends with, after
/// checking that the registry served a bounded part of its flood.
fn refused(
    attack: Attack,
    read: impl Fn(&Registry) -> Result<(), RegistryError>,
) -> Result<String, Box<dyn std::error::Error>> {
    let hostile = Hostile::start(attack)?;
    let registry = hostile.registry()?;
    let err = match read(&registry) {
        Ok(()) => return Err(format!("{attack:?}: the read succeeded").into()),
        Err(e) => e.to_string(),
    };
    let served = hostile.served();
    assert!(
        served < SERVED_CEILING,
        "{attack:?}: the registry served {served} bytes before keel stopped reading: {err}"
    );
    assert!(
        !err.chars().any(char::is_control),
        "{attack:?}: the error carries the registry's control characters: {err:?}"
    );
    Ok(err)
}

fn names(registry: &Registry) -> Result<(), RegistryError> {
    registry.names().map(drop)
}

fn index(registry: &Registry) -> Result<(), RegistryError> {
    let name: PluginName = "acme:echo"
        .parse()
        .map_err(|e| RegistryError::Internal(format!("{e}")))?;
    registry.read_index(&name).map(drop)
}

#[test]
fn a_tags_page_without_end_is_refused_as_it_streams() -> R {
    let err = refused(Attack::TagFlood, names)?;
    assert!(err.contains("a tags page larger than"), "{err}");
    Ok(())
}

#[test]
fn a_manifest_without_end_is_refused_as_it_streams() -> R {
    let err = refused(Attack::ManifestFlood, index)?;
    assert!(err.contains("a manifest larger than"), "{err}");
    Ok(())
}

#[test]
fn a_manifest_declaring_gigabytes_is_refused_before_it_is_read() -> R {
    let err = refused(Attack::ManifestDeclared, index)?;
    assert!(err.contains("a manifest larger than"), "{err}");
    Ok(())
}

#[test]
fn a_token_answer_without_end_is_refused_as_it_streams() -> R {
    let err = refused(Attack::TokenFlood, names)?;
    assert!(err.contains("a token answer larger than"), "{err}");
    Ok(())
}

#[test]
fn an_error_body_without_end_is_cut_short_and_cleaned() -> R {
    let err = refused(Attack::ErrorFlood, names)?;
    assert!(err.contains("answered 500"), "{err}");
    assert!(
        err.len() < 2000,
        "the registry's message is shown whole: {} bytes",
        err.len()
    );
    Ok(())
}

fn blob(registry: &Registry) -> Result<(), RegistryError> {
    let name: PluginName = "acme:echo"
        .parse()
        .map_err(|e| RegistryError::Internal(format!("{e}")))?;
    registry.read_blob(&name, HASH).map(drop)
}

#[test]
fn a_registry_servers_endless_or_oversized_answers_are_refused_as_they_stream() -> R {
    for read in [names, index] {
        let err = refused(Attack::ServeIndexFlood, read)?;
        assert!(err.contains("larger than the 16777216 bytes"), "{err}");
    }
    let err = refused(Attack::ServeBlobDeclared, blob)?;
    assert!(
        err.contains("a blob from") && err.contains("larger than"),
        "{err}"
    );
    let err = refused(Attack::ServeErrorFlood, names)?;
    assert!(err.contains("500"), "{err}");
    assert!(
        err.len() < 2000,
        "the server's message is shown whole: {} bytes",
        err.len()
    );
    Ok(())
}
