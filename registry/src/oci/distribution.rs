//! keel's own client of the OCI distribution API: the few calls keel makes (list a
//! repository's tags, read and write a manifest, read and write a blob, and the token
//! exchange a registry may ask for), each answer's body read within a bound WHILE it
//! streams.
//!
//! A registry is outside keel's trust. It may answer a manifest request with 2 GiB, a tags
//! page with a million tags, a body that never ends, a token or an error of any size; a
//! general client buffers a whole body before anyone can look at its size. Here every body
//! has a ceiling: a declared length above it is refused before a byte is read, and a body
//! that grows past it is dropped (closing the connection) the moment it does. What an error
//! body says reaches the person cut short and without control characters.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::{StatusCode, header};
use sha2::Digest as _;

use super::Credentials;

/// Of an error answer, the most of its body read (an error envelope is a few hundred bytes);
/// the rest is never read.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;
/// The largest token answer read (a JSON object holding a token of a few KiB).
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// How much of a registry's error message is shown.
const MAX_MESSAGE_CHARS: usize = 300;

/// What a request needs of the repository.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// Reading.
    Pull,
    /// Reading and writing.
    Push,
}

/// Why a call to the registry failed.
#[derive(Debug)]
pub enum WireError {
    /// The registry answered with an error status; `codes` are its error envelope's codes,
    /// `message` its messages (or the start of its body), cleaned for display.
    Status {
        /// The HTTP status.
        status: u16,
        /// The distribution error codes (`BLOB_UNKNOWN`, `DENIED`, …).
        codes: Vec<String>,
        /// What the registry said, cleaned and cut short.
        message: String,
    },
    /// The connection failed or a read timed out.
    Transport(reqwest::Error),
    /// A body was larger than keel reads of its kind.
    TooLarge {
        /// What the body was (`a manifest`, `a tags page`, …).
        what: &'static str,
        /// The ceiling, in bytes.
        limit: u64,
    },
    /// A blob's bytes do not hash to its digest.
    Digest {
        /// The digest asked for.
        expected: String,
        /// The digest of what was served.
        actual: String,
    },
    /// An answer keel cannot use (malformed JSON, a missing `Location`, a token service
    /// keel does not reach).
    Malformed(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Status {
                status,
                codes,
                message,
            } => {
                write!(f, "the registry answered {status}")?;
                if !codes.is_empty() {
                    write!(f, " ({})", codes.join(", "))?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            WireError::Transport(e) => write!(f, "{e}"),
            WireError::TooLarge { what, limit } => write!(
                f,
                "the registry sent {what} larger than {limit} bytes, more than keel reads of one; it is misbehaving or hostile, and nothing of the answer is used"
            ),
            WireError::Digest { expected, actual } => {
                write!(f, "expected {expected}, the bytes served hash to {actual}")
            }
            WireError::Malformed(reason) => write!(f, "{reason}"),
        }
    }
}

impl From<reqwest::Error> for WireError {
    fn from(e: reqwest::Error) -> WireError {
        WireError::Transport(e)
    }
}

impl WireError {
    /// Did the registry answer with the distribution error `code`?
    pub fn has_code(&self, code: &str) -> bool {
        matches!(self, WireError::Status { codes, .. } if codes.iter().any(|c| c == code))
    }

    /// The HTTP status the registry answered with, if it answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            WireError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// `text` as it may be shown: control characters (escape sequences, carriage returns,
/// newlines) become spaces, and it is cut to `max` characters.
pub fn display_clean(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out.trim().to_owned()
}

/// Read `response`'s body, at most `limit` bytes: a declared length above it is refused
/// before reading, and a body that grows past it as it streams is dropped there.
pub async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
    what: &'static str,
) -> Result<Vec<u8>, WireError> {
    let too_large = WireError::TooLarge {
        what,
        limit: limit as u64,
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error an answer with a failing status stands for: at most [`MAX_ERROR_BYTES`] of its
/// body are read, for the codes and messages of a distribution error envelope, or else its
/// start as text.
pub async fn status_error(mut response: reqwest::Response) -> WireError {
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ERROR_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            // The status says enough when the body cannot be read.
            Ok(None) | Err(_) => break,
        }
    }
    drop(response);
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let (codes, message) = match serde_json::from_slice::<Envelope>(&body) {
        Ok(envelope) => {
            let codes = envelope
                .errors
                .iter()
                .map(|e| display_clean(&e.code, 64))
                .filter(|c| !c.is_empty())
                .collect();
            let messages: Vec<&str> = envelope.errors.iter().map(|e| e.message.as_str()).collect();
            (
                codes,
                display_clean(&messages.join("; "), MAX_MESSAGE_CHARS),
            )
        }
        Err(_) => (
            Vec::new(),
            display_clean(&String::from_utf8_lossy(&body), MAX_MESSAGE_CHARS),
        ),
    };
    WireError::Status {
        status,
        codes,
        message,
    }
}

/// What a registry's `WWW-Authenticate` asks for.
enum Challenge {
    /// A token from the service at `realm`.
    Bearer {
        realm: String,
        service: Option<String>,
    },
    /// HTTP basic authentication.
    Basic,
}

fn parse_challenge(value: &header::HeaderValue) -> Option<Challenge> {
    let text = value.to_str().ok()?;
    let mut basic = false;
    for challenge in http_auth::ChallengeParser::new(text).flatten() {
        if challenge.scheme.eq_ignore_ascii_case("bearer") {
            let param = |name: &str| {
                challenge
                    .params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            if let Some(realm) = param("realm") {
                return Some(Challenge::Bearer {
                    realm,
                    service: param("service"),
                });
            }
        } else if challenge.scheme.eq_ignore_ascii_case("basic") {
            basic = true;
        }
    }
    basic.then_some(Challenge::Basic)
}

/// A client of one registry.
pub struct Distribution {
    http: reqwest::Client,
    /// `scheme://host[:port]/`.
    base: url::Url,
    credentials: Option<Credentials>,
    /// Bearer tokens the registry's token service issued, by scope.
    tokens: Mutex<HashMap<String, String>>,
    /// The registry asked for basic authentication: send it from the first request on.
    basic: AtomicBool,
}

impl Distribution {
    /// A client of the registry at `authority` (`host[:port]`), over plain HTTP when
    /// `plain_http` (the caller allows that for loopback only), trusting `roots` besides the
    /// public authorities.
    pub fn new(
        authority: &str,
        plain_http: bool,
        credentials: Option<Credentials>,
        roots: Vec<reqwest::Certificate>,
        user_agent: &str,
    ) -> Result<Distribution, String> {
        let scheme = if plain_http { "http" } else { "https" };
        let base = url::Url::parse(&format!("{scheme}://{authority}/"))
            .map_err(|e| format!("`{authority}` is not a host[:port] ({e})"))?;
        let mut builder = reqwest::Client::builder()
            .user_agent(user_agent)
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            // A registry may send a blob from its storage elsewhere; reqwest drops the
            // credentials on a redirect to another host.
            .redirect(reqwest::redirect::Policy::limited(5));
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
        let http = builder.build().map_err(|e| e.to_string())?;
        Ok(Distribution {
            http,
            base,
            credentials,
            tokens: Mutex::new(HashMap::new()),
            basic: AtomicBool::new(false),
        })
    }

    fn url(&self, repository: &str, tail: &str) -> String {
        format!("{}v2/{repository}/{tail}", self.base)
    }

    /// Is `url` on the registry itself (where its credentials may go)?
    fn same_origin(&self, url: &url::Url) -> bool {
        url.origin() == self.base.origin()
    }

    fn scope(repository: &str, access: Access) -> String {
        match access {
            Access::Pull => format!("repository:{repository}:pull"),
            Access::Push => format!("repository:{repository}:pull,push"),
        }
    }

    fn with_auth(
        &self,
        request: reqwest::RequestBuilder,
        token: Option<&str>,
    ) -> reqwest::RequestBuilder {
        match (token, &self.credentials) {
            (Some(token), _) => request.bearer_auth(token),
            (None, Some(c)) if self.basic.load(Ordering::Relaxed) => {
                request.basic_auth(&c.username, Some(&c.password))
            }
            _ => request,
        }
    }

    /// Send the request `build` makes for `url`, authenticated as the registry asks: on its
    /// challenge, with a token for `repository` from its token service, or with basic
    /// credentials, and then once more.
    async fn send(
        &self,
        repository: &str,
        access: Access,
        url: &str,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, WireError> {
        let parsed =
            url::Url::parse(url).map_err(|e| WireError::Malformed(format!("`{url}`: {e}")))?;
        let ours = self.same_origin(&parsed);
        let scope = Distribution::scope(repository, access);
        let token = self.token(&scope);
        let sent_basic = ours
            && token.is_none()
            && self.credentials.is_some()
            && self.basic.load(Ordering::Relaxed);
        let first = build(&self.http, url);
        let first = if ours {
            self.with_auth(first, token.as_deref())
        } else {
            first
        };
        let response = first.send().await?;
        if response.status() != StatusCode::UNAUTHORIZED || !ours {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .and_then(parse_challenge);
        match challenge {
            Some(Challenge::Bearer { realm, service }) => {
                drop(response);
                let token = self.fetch_token(&realm, service.as_deref(), &scope).await?;
                self.tokens
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(scope, token.clone());
                Ok(build(&self.http, url).bearer_auth(token).send().await?)
            }
            Some(Challenge::Basic) if self.credentials.is_some() && !sent_basic => {
                drop(response);
                self.basic.store(true, Ordering::Relaxed);
                Ok(self.with_auth(build(&self.http, url), None).send().await?)
            }
            _ => Ok(response),
        }
    }

    fn token(&self, scope: &str) -> Option<String> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(scope)
            .cloned()
    }

    /// A token for `scope` from the token service at `realm`, presenting the credentials
    /// when there are some. The answer is read within [`MAX_TOKEN_BYTES`].
    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, WireError> {
        let url = url::Url::parse(realm).map_err(|e| {
            WireError::Malformed(format!(
                "the registry names a token service keel cannot reach (`{}`: {e})",
                display_clean(realm, 200)
            ))
        })?;
        // Credentials go to a token service over TLS, or to one on this machine.
        let loopback = url.host_str().is_some_and(super::is_loopback);
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err(WireError::Malformed(format!(
                "the registry names a token service over plain HTTP off this machine (`{}`); keel sends credentials over TLS only",
                display_clean(realm, 200)
            )));
        }
        let mut request = self.http.get(url).query(&[("scope", scope)]);
        if let Some(service) = service {
            request = request.query(&[("service", service)]);
        }
        if let Some(c) = &self.credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let response = request.send().await?;
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        let body = read_bounded(response, MAX_TOKEN_BYTES, "a token answer").await?;
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            WireError::Malformed(format!("the token service's answer is not a token ({e})"))
        })?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| WireError::Malformed("the token service's answer holds no token".into()))
    }

    /// One page of `repository`'s tags, at most `n` after `last`, read within `limit` bytes.
    pub async fn tags_page(
        &self,
        repository: &str,
        n: usize,
        last: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, WireError> {
        let url = self.url(repository, "tags/list");
        let n = n.to_string();
        let response = self
            .send(repository, Access::Pull, &url, |http, url| {
                let request = http.get(url).query(&[("n", n.as_str())]);
                match last {
                    Some(last) => request.query(&[("last", last)]),
                    None => request,
                }
            })
            .await?;
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        let body = read_bounded(response, limit, "a tags page").await?;
        #[derive(serde::Deserialize)]
        struct Page {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let page: Page = serde_json::from_slice(&body)
            .map_err(|e| WireError::Malformed(format!("the tags page is not a tag list ({e})")))?;
        Ok(page.tags.unwrap_or_default())
    }

    /// The manifest `reference` (a tag) of `repository`, of media type `accept`, read
    /// within `limit` bytes.
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
        accept: &str,
        limit: usize,
    ) -> Result<Vec<u8>, WireError> {
        let url = self.url(repository, &format!("manifests/{reference}"));
        let response = self
            .send(repository, Access::Pull, &url, |http, url| {
                http.get(url).header(header::ACCEPT, accept)
            })
            .await?;
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        read_bounded(response, limit, "a manifest").await
    }

    /// The blob `sha256` of `repository`, hashed as it streams and refused when it is larger
    /// than `limit` or hashes to anything else.
    pub async fn blob(
        &self,
        repository: &str,
        sha256: &str,
        limit: u64,
    ) -> Result<Vec<u8>, WireError> {
        let url = self.url(repository, &format!("blobs/sha256:{sha256}"));
        let mut response = self
            .send(repository, Access::Pull, &url, |http, url| http.get(url))
            .await?;
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        let too_large = WireError::TooLarge {
            what: "a blob",
            limit,
        };
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large);
        }
        let mut hasher = sha2::Sha256::new();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large);
            }
            hasher.update(&chunk);
            body.extend_from_slice(&chunk);
        }
        let actual = hex::encode(hasher.finalize());
        if actual != sha256 {
            return Err(WireError::Digest {
                expected: format!("sha256:{sha256}"),
                actual: format!("sha256:{actual}"),
            });
        }
        Ok(body)
    }

    /// Upload `data` as a blob of `repository`, in one request after opening the upload.
    pub async fn push_blob(&self, repository: &str, data: &[u8]) -> Result<(), WireError> {
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)));
        let url = self.url(repository, "blobs/uploads/");
        let response = self
            .send(repository, Access::Push, &url, |http, url| {
                http.post(url).header(header::CONTENT_LENGTH, 0)
            })
            .await?;
        if response.status() != StatusCode::ACCEPTED {
            return Err(self.unexpected(response, StatusCode::ACCEPTED).await);
        }
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| {
                WireError::Malformed("the registry opened an upload without a `Location`".into())
            })?;
        let mut upload = response.url().join(location).map_err(|e| {
            WireError::Malformed(format!(
                "the upload's `Location` is not a URL (`{}`: {e})",
                display_clean(location, 200)
            ))
        })?;
        drop(response);
        upload.query_pairs_mut().append_pair("digest", &digest);
        let response = self
            .send(repository, Access::Push, upload.as_str(), |http, url| {
                http.put(url)
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .body(data.to_vec())
            })
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(self.unexpected(response, StatusCode::CREATED).await);
        }
        Ok(())
    }

    /// Put `manifest` (of media type `media_type`) at `tag` in `repository`.
    pub async fn push_manifest(
        &self,
        repository: &str,
        tag: &str,
        manifest: &[u8],
        media_type: &str,
    ) -> Result<(), WireError> {
        let url = self.url(repository, &format!("manifests/{tag}"));
        let response = self
            .send(repository, Access::Push, &url, |http, url| {
                http.put(url)
                    .header(header::CONTENT_TYPE, media_type)
                    .body(manifest.to_vec())
            })
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(self.unexpected(response, StatusCode::CREATED).await);
        }
        Ok(())
    }

    /// The error for an answer other than `expected`.
    async fn unexpected(&self, response: reqwest::Response, expected: StatusCode) -> WireError {
        if response.status().is_success() {
            WireError::Malformed(format!(
                "the registry answered {} where the distribution API says {expected}",
                response.status()
            ))
        } else {
            status_error(response).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_text_has_no_control_characters_and_is_cut_short() {
        let shown = display_clean("ok\u{1b}[2K\u{1b}[1Ahidden\r\nline", 300);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.starts_with("ok"), "{shown:?}");
        let long = display_clean(&"x".repeat(10_000), 300);
        assert_eq!(long.chars().count(), 301);
    }

    #[test]
    fn challenges_are_read() {
        let bearer = header::HeaderValue::from_static(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a:pull""#,
        );
        match parse_challenge(&bearer) {
            Some(Challenge::Bearer { realm, service }) => {
                assert_eq!(realm, "https://auth.example/token");
                assert_eq!(service.as_deref(), Some("registry.example"));
            }
            _ => panic!("a bearer challenge"),
        }
        let basic = header::HeaderValue::from_static(r#"Basic realm="registry""#);
        assert!(matches!(parse_challenge(&basic), Some(Challenge::Basic)));
        let junk = header::HeaderValue::from_static("Negotiate");
        assert!(parse_challenge(&junk).is_none());
    }
}
