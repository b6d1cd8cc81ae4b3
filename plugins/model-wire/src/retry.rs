//! Error classification and the retry schedule.
//!
//! [`classify`] sorts a failed HTTP response into an [`ErrorClass`]: authentication (never
//! retried), context length exceeded (not retried; goes to [`crate::recovery`]), rate limited
//! and overloaded/server errors (retried with backoff) and other client errors (not retried).
//! [`RetryPolicy`] holds the numbers: exponential backoff with caller-supplied jitter, the
//! server's `Retry-After` taking precedence, the attempt budget, and the per-event idle
//! watchdog that widens with each retry. Nothing here reads a clock or a random source: the
//! caller passes the current time and a number in `[0, 1)`.

use serde_json::Value;

/// What kind of failure a response was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 401/403: the credential is missing, wrong or lacks permission. Never retried.
    Authentication,
    /// The prompt does not fit the model's context window. Not retried as is: the request
    /// is shrunk by [`crate::recovery`] first.
    ContextLength,
    /// 429: too many requests. Retried, honouring `Retry-After`.
    RateLimited,
    /// 408 and 5xx (including Anthropic's 529 overloaded): retried with backoff.
    Overloaded,
    /// Any other client error (bad request, not found, quota exhausted). Not retried.
    Client,
}

impl ErrorClass {
    /// Whether resending the same request may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorClass::RateLimited | ErrorClass::Overloaded)
    }
}

/// A classified failed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// The class.
    pub class: ErrorClass,
    /// The HTTP status.
    pub status: u16,
    /// The API's own error message from the body (at most 500 characters). Empty for
    /// authentication failures, whose messages may echo part of the key.
    pub message: String,
    /// How long the server asked the client to wait, in milliseconds.
    pub retry_after_ms: Option<u64>,
}

const CONTEXT_PHRASES: &[&str] = &[
    "context_length_exceeded",
    "prompt is too long",
    "maximum context length",
    "context length",
    "context window",
    "too many tokens",
    "input is too long",
    "request_too_large",
];

/// Whether an error message says the prompt was too long for the model.
pub fn mentions_context_length(message: &str) -> bool {
    let lower = message.to_lowercase();
    CONTEXT_PHRASES.iter().any(|p| lower.contains(p))
}

/// Classify a failed response. `now_unix_ms` is only needed for a `Retry-After` HTTP-date
/// when the response carries no `Date` header.
pub fn classify(
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    now_unix_ms: Option<u64>,
) -> ApiFailure {
    let text = String::from_utf8_lossy(body);
    let message = api_error_message(&text);
    let class = match status {
        401 | 403 => ErrorClass::Authentication,
        413 => ErrorClass::ContextLength,
        400..=499 if status != 429 && mentions_context_length(&text) => ErrorClass::ContextLength,
        429 if text.contains("insufficient_quota") => ErrorClass::Client,
        429 => ErrorClass::RateLimited,
        408 | 500..=599 => ErrorClass::Overloaded,
        _ => ErrorClass::Client,
    };
    ApiFailure {
        class,
        status,
        message: if class == ErrorClass::Authentication {
            String::new()
        } else {
            message
        },
        retry_after_ms: retry_after_ms(headers, now_unix_ms),
    }
}

/// Classify an error object the provider sent inside a stream, by its type and message.
pub fn classify_stream_error(kind: &str, message: &str) -> ErrorClass {
    let kind = kind.to_lowercase();
    if mentions_context_length(&kind) || mentions_context_length(message) {
        ErrorClass::ContextLength
    } else if kind.contains("authentication") || kind.contains("permission") {
        ErrorClass::Authentication
    } else if kind.contains("rate_limit") {
        ErrorClass::RateLimited
    } else if kind.contains("overloaded")
        || kind.contains("api_error")
        || kind.contains("server_error")
        || kind.contains("timeout")
        || kind.is_empty()
    {
        ErrorClass::Overloaded
    } else {
        ErrorClass::Client
    }
}

/// The error message of a JSON error body (`error.message`, `message` or `detail`), or the
/// body itself; at most 500 characters.
pub fn api_error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let e = v.get("error").unwrap_or(&v);
        e.get("message")
            .or_else(|| e.get("detail"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| e.as_str().map(str::to_string))
    });
    let message = from_json.unwrap_or_else(|| body.trim().to_string());
    truncate_chars(&message, 500)
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// The wait the server asked for, in milliseconds: `retry-after-ms`, else `Retry-After` as
/// seconds or as an HTTP-date (measured from the response's `Date` header, else from
/// `now_unix_ms`; a date already past means no wait).
pub fn retry_after_ms(headers: &[(String, String)], now_unix_ms: Option<u64>) -> Option<u64> {
    if let Some(ms) = header(headers, "retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(ms.ceil() as u64);
    }
    let value = header(headers, "retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).ceil() as u64);
    }
    let at = parse_http_date(value)?;
    let now_secs = header(headers, "date")
        .and_then(parse_http_date)
        .or(now_unix_ms.map(|ms| ms / 1000))?;
    Some(at.saturating_sub(now_secs) * 1000)
}

/// Parse an HTTP-date (IMF-fixdate, RFC 850 or asctime form) to seconds since the Unix epoch.
pub fn parse_http_date(s: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let cleaned: String = s
        .chars()
        .map(|c| if c == ',' || c == '-' { ' ' } else { c })
        .collect();
    let mut month = None;
    let mut time = None;
    let mut numbers = Vec::new();
    for token in cleaned.split_whitespace().skip(1) {
        let lower = token.to_ascii_lowercase();
        if let Some(m) = MONTHS.iter().position(|m| *m == lower) {
            month = Some(m as u64 + 1);
        } else if token.contains(':') {
            let parts: Vec<u64> = token
                .split(':')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            if parts.len() != 3 || parts[0] > 23 || parts[1] > 59 || parts[2] > 60 {
                return None;
            }
            time = Some(parts[0] * 3600 + parts[1] * 60 + parts[2]);
        } else if let Ok(n) = token.parse::<u64>() {
            numbers.push((n, token.len()));
        } else if lower != "gmt" && lower != "utc" {
            return None;
        }
    }
    let [(day, _), (year, year_len)] = numbers[..] else {
        return None;
    };
    let year = match year_len {
        2 if year >= 70 => 1900 + year,
        2 => 2000 + year,
        _ => year,
    };
    let (month, time) = (month?, time?);
    if !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), for years ≥ 1970.
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + time)
}

/// The retry numbers. All durations are milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 4: one try and three retries).
    pub max_attempts: u32,
    /// The first backoff (default 1 s).
    pub base_ms: u64,
    /// The backoff's growth per retry (default 2).
    pub factor: f64,
    /// The longest backoff (default 30 s).
    pub cap_ms: u64,
    /// The jitter's half-width as a fraction of the backoff (default 0.2: ±20 %).
    pub jitter: f64,
    /// The longest `Retry-After` honoured (default 120 s); longer waits are cut to it.
    pub retry_after_cap_ms: u64,
    /// The idle watchdog: the longest silence between two chunks (default 120 s).
    pub idle_timeout_ms: u64,
    /// How much the watchdog widens per retry already made (default 30 s).
    pub idle_widen_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_ms: 1_000,
            factor: 2.0,
            cap_ms: 30_000,
            jitter: 0.2,
            retry_after_cap_ms: 120_000,
            idle_timeout_ms: 120_000,
            idle_widen_ms: 30_000,
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (1 for the first retry): `base · factor^(retry-1)`
    /// scaled by `1 − jitter + 2·jitter·unit`, then capped. `unit` is clamped to `[0, 1)`.
    pub fn backoff_ms(&self, retry: u32, unit: f64) -> u64 {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let exponent = retry.saturating_sub(1).min(64) as i32;
        let raw = (self.base_ms as f64) * self.factor.powi(exponent);
        let jittered = raw * (1.0 - self.jitter + 2.0 * self.jitter * unit);
        (jittered.min(self.cap_ms as f64).max(0.0)) as u64
    }

    /// The wait before retry number `retry`: the server's `Retry-After` (capped at
    /// [`retry_after_cap_ms`](Self::retry_after_cap_ms)) when it gave one, else the backoff.
    pub fn delay_ms(&self, retry: u32, retry_after_ms: Option<u64>, unit: f64) -> u64 {
        match retry_after_ms {
            Some(ms) => ms.min(self.retry_after_cap_ms),
            None => self.backoff_ms(retry, unit),
        }
    }

    /// The idle watchdog for an attempt made after `retries` retries: base + widen × retries.
    pub fn idle_timeout_for(&self, retries: u32) -> u64 {
        self.idle_timeout_ms
            .saturating_add(self.idle_widen_ms.saturating_mul(u64::from(retries)))
    }

    /// Whether another attempt is allowed after `retries` retries.
    pub fn may_retry(&self, retries: u32) -> bool {
        retries.saturating_add(1) < self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn statuses_and_bodies_classify() {
        let c = |status, body: &str| classify(status, &[], body.as_bytes(), None).class;
        assert_eq!(c(401, "{}"), ErrorClass::Authentication);
        assert_eq!(c(403, "{}"), ErrorClass::Authentication);
        assert_eq!(
            c(
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","code":"context_length_exceeded"}}"#
            ),
            ErrorClass::ContextLength
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#
            ),
            ErrorClass::ContextLength
        );
        assert_eq!(c(413, "too big"), ErrorClass::ContextLength);
        assert_eq!(c(429, "{}"), ErrorClass::RateLimited);
        assert_eq!(
            c(429, r#"{"error":{"code":"insufficient_quota"}}"#),
            ErrorClass::Client
        );
        for s in [500, 502, 503, 504, 529, 408] {
            assert_eq!(c(s, ""), ErrorClass::Overloaded, "{s}");
        }
        let f = classify(
            404,
            &[],
            br#"{"error":{"message":"The model `gpt-9` does not exist"}}"#,
            None,
        );
        assert_eq!(f.class, ErrorClass::Client);
        assert_eq!(f.message, "The model `gpt-9` does not exist");
        assert!(!f.class.is_retryable());
    }

    #[test]
    fn authentication_failures_never_carry_the_body_message() {
        let f = classify(
            401,
            &[],
            br#"{"error":{"message":"Incorrect API key provided: sk-abc***xyz."}}"#,
            None,
        );
        assert_eq!(f.message, "");
    }

    #[test]
    fn retry_after_in_all_its_forms() {
        assert_eq!(
            retry_after_ms(&h(&[("Retry-After", "7")]), None),
            Some(7_000)
        );
        assert_eq!(
            retry_after_ms(
                &h(&[("retry-after", "7"), ("retry-after-ms", "1500.5")]),
                None
            ),
            Some(1_501)
        );
        let dated = h(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT"),
        ]);
        assert_eq!(retry_after_ms(&dated, None), Some(30_000));
        let undated = h(&[("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT")]);
        assert_eq!(retry_after_ms(&undated, None), None);
        assert_eq!(
            retry_after_ms(&undated, Some(784_111_777_000 + 10_000)),
            Some(20_000)
        );
        assert_eq!(retry_after_ms(&h(&[("retry-after", "soon")]), None), None);
    }

    #[test]
    fn http_dates_in_three_forms() {
        let t = Some(784_111_777);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), t);
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), t);
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), t);
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 12:00:00 GMT"),
            Some(1_835_438_400)
        );
        assert_eq!(parse_http_date("not a date"), None);
    }

    #[test]
    fn backoff_grows_caps_and_jitters_deterministically() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_ms(1, 0.5), 1_000);
        assert_eq!(p.backoff_ms(2, 0.5), 2_000);
        assert_eq!(p.backoff_ms(3, 0.0), 3_200);
        assert_eq!(p.backoff_ms(10, 0.99), 30_000);
        assert_eq!(p.delay_ms(1, Some(7_000), 0.9), 7_000);
        assert_eq!(p.delay_ms(1, Some(900_000), 0.9), 120_000);
        assert_eq!(p.idle_timeout_for(0), 120_000);
        assert_eq!(p.idle_timeout_for(3), 210_000);
        assert!(p.may_retry(2));
        assert!(!p.may_retry(3));
    }
}
