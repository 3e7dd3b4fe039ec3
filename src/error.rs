//! The controller's one error type; each variant has a bounded metric label.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed while {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("invalid policy {policy}: {message}")]
    InvalidPolicy { policy: String, message: String },
    /// A DaemonSet of the policy's name that this controller did not make is
    /// being replaced by ours.
    #[error("{message}")]
    TakingOver { daemonset: String, message: String },
    /// Not sent: the object's last write failed and its backoff has not
    /// passed (see `write_backoff`).
    #[error(
        "write to {target} held back for {retry_in:?} after {failures} failure(s); last: {error}"
    )]
    WriteHeld {
        target: String,
        retry_in: std::time::Duration,
        failures: u32,
        error: String,
    },
    #[error("actor mailbox unavailable: {0}")]
    Mailbox(String),
    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// Bounded label for `ttdriver_errors_total{stage}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube_api",
            Error::InvalidPolicy { .. } => "invalid_policy",
            Error::TakingOver { .. } => "takeover",
            Error::WriteHeld { .. } => "write_backoff",
            Error::Mailbox(_) => "mailbox",
            Error::Serialize { .. } => "serialize",
        }
    }

    /// Conflicts, throttling and server errors are worth retrying.
    /// The API server refused a write on a stale resourceVersion (409).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409
        )
    }

    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => matches!(s.code, 409 | 429 | 500..=599),
            Error::Kube { .. } => true,
            // Tried again once the object's backoff has passed.
            Error::WriteHeld { .. } => true,
            _ => false,
        }
    }
}

impl Error {
    /// The API server's own words for a refusal (its message names the
    /// field), shortened; for other errors, the error itself.
    pub fn refusal_message(&self) -> String {
        let text = match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => s.message.clone(),
            e => e.to_string(),
        };
        crate::refusal::shorten(&text)
    }
}

/// Longest server-requested wait honoured before a retry.
const MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

impl Error {
    /// The wait the API server asked for (`Retry-After`, carried in the
    /// Status details of a 429 or 5xx), if any.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => s
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|secs| *secs > 0)
                .map(|secs| std::time::Duration::from_secs(secs.into()).min(MAX_RETRY_AFTER)),
            _ => None,
        }
    }
}

/// Retry policy for API writes: conflicts, throttling and server errors
/// (callers add `.adjust(honor_retry_after)` to wait at least the server's
/// Retry-After).
pub fn backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_max_times(6)
        .with_jitter()
}

/// For backon's `adjust`: wait at least what the server asked for. `None`
/// (the retry budget is spent) stays `None`.
pub fn honor_retry_after(
    e: &Error,
    planned: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    let planned = planned?;
    Some(e.retry_after().map_or(planned, |asked| planned.max(asked)))
}

impl From<actix::MailboxError> for Error {
    fn from(e: actix::MailboxError) -> Self {
        Error::Mailbox(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn api_error(code: u16, retry_after: u32) -> Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "TooManyRequests",
            "message": "slow down",
            "details": { "retryAfterSeconds": retry_after },
        }))
        .expect("status");
        Error::Kube {
            action: "testing".into(),
            source: kube::Error::Api(status.into()),
        }
    }

    #[test]
    fn retries_wait_at_least_what_the_server_asked() {
        let throttled = api_error(429, 3);
        assert!(throttled.is_transient());
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(3)));
        let short = Some(Duration::from_millis(100));
        assert_eq!(
            honor_retry_after(&throttled, short),
            Some(Duration::from_secs(3))
        );
        // A longer planned backoff is kept; a spent budget stays spent.
        let long = Some(Duration::from_secs(5));
        assert_eq!(honor_retry_after(&throttled, long), long);
        assert_eq!(honor_retry_after(&throttled, None), None);
        // No Retry-After: the backoff as planned; absurd asks are capped.
        assert_eq!(honor_retry_after(&api_error(409, 0), short), short);
        assert_eq!(api_error(429, 86_400).retry_after(), Some(MAX_RETRY_AFTER));
    }
}
