//! Who may use the page: a browser on this machine that was given the launch's URL.
//!
//! The server binds 127.0.0.1 only, and every request must also pass three checks:
//! - **the token**: a random 128-bit value made at launch, carried in the URL (`?token=`) or
//!   the `x-keel-token` header, compared in constant time. Another local user or a page open
//!   in the same browser does not know it;
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

/// The launch's secret and the port it serves on.
#[derive(Clone)]
pub struct Door {
    token: String,
    port: u16,
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
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("no random token could be made for the page: {e}"))?;
        let mut token = String::with_capacity(32);
        for b in bytes {
            let _ = write!(token, "{b:02x}");
        }
        Ok(Door { token, port })
    }

    #[cfg(test)]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The URL a person opens.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/?token={}", self.port, self.token)
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
        assert!(a.url().starts_with("http://127.0.0.1:1/?token="));
    }
}
