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
            Error::Mailbox(_) => "mailbox",
            Error::Serialize { .. } => "serialize",
        }
    }

    /// Conflicts, throttling and server errors are worth retrying.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => matches!(s.code, 409 | 429 | 500..=599),
            Error::Kube { .. } => true,
            _ => false,
        }
    }
}

impl From<actix::MailboxError> for Error {
    fn from(e: actix::MailboxError) -> Self {
        Error::Mailbox(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
