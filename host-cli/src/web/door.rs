//! Who may use the page: a browser on this machine that was given the launch's URL.
//!
//! The launch's URL carries no secret that lasts: only a one-time **code**
//! (`/?code=…`, 128 random bits), which the page's first load exchanges at once
//! (`POST /api/session`) for the token and which is useless from then on. So the URL may
//! travel in a browser's or an opener's argv (readable by any local user through `ps`)
//! without giving the page away; a code handed to an opener also lapses after
//! [`OPENER_CODE_LIFETIME`] unused. The token never leaves keel but in the answer to that
//! exchange, into the page's `sessionStorage` (which is kept per origin, port included, so
//! a page on another localhost port cannot read it, where a cookie would be sent to it).
//!
//! The server binds 127.0.0.1 only, and every request must also pass three checks:
//! - **the token**: a random 128-bit value made at launch, carried in the `x-keel-token`
//!   header (or `?token=` for the event stream, which cannot set headers), compared in
//!   constant time. Another local user or a page open in the same browser does not know it;
//! - **`Host`**: exactly `127.0.0.1:PORT` or `localhost:PORT`. A foreign name that resolves to
//!   127.0.0.1 (DNS rebinding) is refused, so a page of another site can never read ours
//!   as same-origin;
//! - **`Origin`**, when the browser sends one (every POST, every cross-site fetch): the page's
//!   own origin. A state-changing request (POST) must carry it.
//!
//! No CORS header is ever sent, responses say `no-store` and `no-referrer` (the token is in
//! the URL and must not leak through a `Referer`), and the content security policy allows
//! only the page's own script and styles.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a code handed to the browser opener stays good unused: the opener's argv is
/// readable by every local user while it runs.
pub const OPENER_CODE_LIFETIME: Duration = Duration::from_secs(120);

/// The most codes waiting to be exchanged; a new one pushes out the oldest.
const MAX_CODES: usize = 16;

/// The launch's secret, the codes that may still be exchanged for it, and the port it serves
/// on.
#[derive(Clone)]
pub struct Door {
    token: String,
    port: u16,
    codes: Arc<Mutex<Vec<Code>>>,
}

/// A one-time code, and until when it is good (`None`: until it is used).
struct Code {
    code: String,
    until: Option<Instant>,
}

/// Why a request was refused; the text is the whole response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 403: no token, or the wrong one.
    Token,
    /// 403: a `Host` other than this server's loopback name.
    Host,
    /// 403: an `Origin` other than the page's, or a POST without one.
    Origin,
    /// 403: a code that was used already, lapsed, or never given.
    Code,
}

impl Refusal {
    pub fn message(&self) -> &'static str {
        match self {
            Refusal::Token => {
                "refused: this page needs the URL `keel web` printed, with its token; start \
                 `keel web` again for a new one"
            }
            Refusal::Host => {
                "refused: keel's web page answers only to 127.0.0.1 or localhost (a foreign \
                 Host is a DNS-rebinding attempt)"
            }
            Refusal::Origin => "refused: requests from another site's page are not accepted",
            Refusal::Code => {
                "refused: this link was used already (each link keel gives opens the page once) \
                 or has lapsed; type /web in `keel run` for a new one, or start `keel web` again"
            }
        }
    }
}

/// What the checks read off one request.
pub struct Asked<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    /// `?token=` of the URL, or the `x-keel-token` header.
    pub token: Option<&'a str>,
    /// POST and every other method that changes something.
    pub changes_state: bool,
}

impl Door {
    /// A door for `port` with a fresh random token.
    pub fn new(port: u16) -> anyhow::Result<Door> {
        Ok(Door {
            token: random_hex()?,
            port,
            codes: Arc::new(Mutex::new(Vec::new())),
        })
    }

    #[cfg(test)]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A URL that opens the page once: a fresh one-time code, good for `lifetime` (`None`:
    /// until it is used). Never the token.
    pub fn url(&self, lifetime: Option<Duration>) -> anyhow::Result<String> {
        let code = random_hex()?;
        let mut codes = self.codes();
        let now = Instant::now();
        codes.retain(|c| c.until.is_none_or(|until| until > now));
        if codes.len() >= MAX_CODES {
            codes.remove(0);
        }
        codes.push(Code {
            code: code.clone(),
            until: lifetime.map(|l| now + l),
        });
        Ok(format!("http://127.0.0.1:{}/?code={code}", self.port))
    }

    /// The token for `code`, which is spent by the exchange, whether or not it was good.
    pub fn exchange(&self, code: &str) -> Result<String, Refusal> {
        let mut codes = self.codes();
        let now = Instant::now();
        let at = codes
            .iter()
            .position(|c| constant_time_eq(c.code.as_bytes(), code.as_bytes()))
            .ok_or(Refusal::Code)?;
        let found = codes.remove(at);
        if found.until.is_some_and(|until| until <= now) {
            return Err(Refusal::Code);
        }
        Ok(self.token.clone())
    }

    fn codes(&self) -> std::sync::MutexGuard<'_, Vec<Code>> {
        self.codes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `asked` may pass.
    pub fn check(&self, asked: &Asked<'_>) -> Result<(), Refusal> {
        let host = asked.host.unwrap_or_default();
        let ours = [
            format!("127.0.0.1:{}", self.port),
            format!("localhost:{}", self.port),
        ];
        if !ours.iter().any(|o| o.eq_ignore_ascii_case(host)) {
            return Err(Refusal::Host);
        }
        match asked.origin {
            Some(origin) => {
                let ok = ours
                    .iter()
                    .any(|o| origin.eq_ignore_ascii_case(&format!("http://{o}")));
                if !ok {
                    return Err(Refusal::Origin);
                }
            }
            None if asked.changes_state => return Err(Refusal::Origin),
            None => {}
        }
        match asked.token {
            Some(t) if constant_time_eq(t.as_bytes(), self.token.as_bytes()) => Ok(()),
            _ => Err(Refusal::Token),
        }
    }
}

/// 128 random bits as 32 hex digits.
fn random_hex() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no random token could be made for the page: {e}"))?;
    let mut hex = String::with_capacity(32);
    for b in bytes {
        let _ = write!(hex, "{b:02x}");
    }
    Ok(hex)
}

/// Compares without stopping at the first difference, so the time taken says nothing about
/// how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `token` from a query string (`a=1&token=…`).
pub fn token_in_query(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door() -> Door {
        Door {
            token: "0123456789abcdef0123456789abcdef".into(),
            port: 4000,
            codes: Arc::default(),
        }
    }

    fn asked<'a>(host: &'a str, origin: Option<&'a str>, token: Option<&'a str>) -> Asked<'a> {
        Asked {
            host: Some(host),
            origin,
            token,
            changes_state: false,
        }
    }

    const T: Option<&str> = Some("0123456789abcdef0123456789abcdef");

    #[test]
    fn the_token_host_and_origin_must_all_be_ours() {
        let d = door();
        assert_eq!(d.check(&asked("127.0.0.1:4000", None, T)), Ok(()));
        assert_eq!(d.check(&asked("localhost:4000", None, T)), Ok(()));
        assert_eq!(
            d.check(&asked("127.0.0.1:4000", Some("http://127.0.0.1:4000"), T)),
            Ok(())
        );
        assert_eq!(
            d.check(&asked("127.0.0.1:4000", None, None)),
            Err(Refusal::Token)
        );
        assert_eq!(
            d.check(&asked(
                "127.0.0.1:4000",
                None,
                Some("0123456789abcdef0123456789abcdee")
            )),
            Err(Refusal::Token)
        );
        assert_eq!(
            d.check(&asked("127.0.0.1:4000", None, Some("0123"))),
            Err(Refusal::Token)
        );
        // DNS rebinding: a foreign name that resolves to loopback, another port, no Host.
        assert_eq!(
            d.check(&asked("evil.example:4000", None, T)),
            Err(Refusal::Host)
        );
        assert_eq!(
            d.check(&asked("127.0.0.1:4001", None, T)),
            Err(Refusal::Host)
        );
        let no_host = Asked {
            host: None,
            ..asked("", None, T)
        };
        assert_eq!(d.check(&no_host), Err(Refusal::Host));
        // Another site's page, even with the token (a leaked URL).
        assert_eq!(
            d.check(&asked("127.0.0.1:4000", Some("http://evil.example"), T)),
            Err(Refusal::Origin)
        );
        assert_eq!(
            d.check(&asked("127.0.0.1:4000", Some("null"), T)),
            Err(Refusal::Origin)
        );
        // A POST must say where it comes from.
        let post = Asked {
            changes_state: true,
            ..asked("127.0.0.1:4000", None, T)
        };
        assert_eq!(d.check(&post), Err(Refusal::Origin));
    }

    #[test]
    fn the_token_is_read_from_the_query() {
        assert_eq!(token_in_query(Some("a=1&token=abc")), Some("abc"));
        assert_eq!(token_in_query(Some("token=")), Some(""));
        assert_eq!(token_in_query(Some("xtoken=abc")), None);
        assert_eq!(token_in_query(None), None);
    }

    #[test]
    fn each_launch_has_its_own_token() {
        let (a, b) = (
            Door::new(1).expect("a token"),
            Door::new(1).expect("a token"),
        );
        assert_ne!(a.token(), b.token());
        assert_eq!(a.token().len(), 32);
    }

    #[test]
    fn a_code_opens_the_page_once_and_the_url_never_holds_the_token() -> anyhow::Result<()> {
        let d = door();
        let url = d.url(None)?;
        assert!(url.starts_with("http://127.0.0.1:4000/?code="), "{url}");
        assert!(!url.contains(d.token()), "{url}");
        let code = url.rsplit('=').next().unwrap_or_default();
        assert_eq!(d.exchange(code).as_deref(), Ok(d.token()));
        assert_eq!(d.exchange(code), Err(Refusal::Code), "spent");
        assert_eq!(d.exchange(""), Err(Refusal::Code));
        assert_eq!(d.exchange(d.token()), Err(Refusal::Code));
        // A code given to the opener lapses unused.
        let lapsed = d.url(Some(Duration::ZERO))?;
        let code = lapsed.rsplit('=').next().unwrap_or_default();
        assert_eq!(d.exchange(code), Err(Refusal::Code));
        // Each URL has its own code; at most MAX_CODES wait.
        let first = d.url(None)?;
        for _ in 0..MAX_CODES {
            d.url(None)?;
        }
        let code = first.rsplit('=').next().unwrap_or_default();
        assert_eq!(d.exchange(code), Err(Refusal::Code), "pushed out");
        Ok(())
    }
}
