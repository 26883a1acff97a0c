//! API errors, answered in OpenAI's error shape
//! (`{"error": {"message", "type", "param", "code"}}`) with the status an
//! OpenAI client expects.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use std::borrow::Cow;
use std::time::Duration;

/// Everything a handler can answer with instead of a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Malformed or out-of-range input (400).
    #[error("{message}")]
    BadRequest { message: String, param: Option<Cow<'static, str>> },
    /// No, or an invalid, credential (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid credential without the right (403).
    #[error("{0}")]
    Forbidden(String),
    /// The `model` is not served here (404).
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// Another unknown id (404).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (409), e.g. a closed
    /// session or a turn already in progress.
    #[error("{0}")]
    Conflict(String),
    /// A remote the request depends on failed (502), e.g. a git fetch.
    #[error("{0}")]
    Upstream(String),
    /// The prompt does not fit the context window (413).
    #[error("this model's context is {limit} tokens, but the prompt has {tokens}")]
    ContextTooLong { tokens: usize, limit: usize },
    /// The prompt's text is longer than any prompt of the context's size could be (413), found
    /// before tokenizing it.
    #[error("this model's context is {limit} tokens, and a prompt of {bytes} bytes is far longer")]
    PromptTooLarge { bytes: usize, limit: usize },
    /// The request body is too large (413).
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The request body did not arrive within this many seconds of its head (408).
    #[error("the request body did not arrive within {0} s")]
    RequestTimeout(u64),
    /// The tenant's plan limits (429).
    #[error("{message}")]
    RateLimited { message: String, retry_after: Duration },
    /// The engine cannot serve the request in time (429).
    #[error("the server is overloaded; retry after {} s", .retry_after.as_secs().max(1))]
    Overloaded { retry_after: Duration },
    /// The model is still loading, or the database has never been reached (503).
    #[error("{0}")]
    NotReady(String),
    /// A bug or a failed dependency (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest { message: message.into(), param: None }
    }

    /// A 400 naming the parameter at fault (`"tools[2].function.parameters"` and the like).
    pub fn bad_param(param: impl Into<Cow<'static, str>>, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest { message: message.into(), param: Some(param.into()) }
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::BadRequest { .. } => ("invalid_request_error", "invalid_request"),
            ApiError::Unauthorized(_) => ("authentication_error", "invalid_api_key"),
            ApiError::Forbidden(_) => ("permission_error", "forbidden"),
            ApiError::ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
            ApiError::Conflict(_) => ("invalid_request_error", "conflict"),
            ApiError::Upstream(_) => ("server_error", "upstream_error"),
            ApiError::ContextTooLong { .. } | ApiError::PromptTooLarge { .. } => {
                ("invalid_request_error", "context_length_exceeded")
            }
            ApiError::PayloadTooLarge(_) => ("invalid_request_error", "payload_too_large"),
            ApiError::RequestTimeout(_) => ("invalid_request_error", "request_timeout"),
            ApiError::RateLimited { .. } => ("rate_limit_error", "rate_limit_exceeded"),
            ApiError::Overloaded { .. } => ("rate_limit_error", "overloaded"),
            ApiError::NotReady(_) => ("service_unavailable", "not_ready"),
            ApiError::Internal(_) => ("server_error", "internal_error"),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ApiError::ContextTooLong { .. } | ApiError::PromptTooLarge { .. } | ApiError::PayloadTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::RateLimited { .. } | ApiError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let (kind, code) = self.kind();
        let param = match self {
            ApiError::BadRequest { param, .. } => param.as_deref(),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::ContextTooLong { .. } | ApiError::PromptTooLarge { .. } => Some("messages"),
            _ => None,
        };
        let mut resp = HttpResponse::build(self.status_code());
        if let ApiError::RateLimited { retry_after, .. } | ApiError::Overloaded { retry_after } = self {
            resp.insert_header((header::RETRY_AFTER, retry_after.as_secs().max(1).to_string()));
        }
        if let ApiError::Unauthorized(_) = self {
            resp.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let ApiError::Internal(m) = self {
            tracing::error!("internal error: {m}");
        }
        resp.json(error_body(&self.to_string(), kind, param, code))
    }
}

/// OpenAI's error body.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

impl From<cachet_tenants::StoreError> for ApiError {
    fn from(e: cachet_tenants::StoreError) -> ApiError {
        use cachet_tenants::StoreError;
        match e {
            StoreError::Conflict(m) => ApiError::Conflict(m),
            StoreError::Invalid(m) => ApiError::bad(m),
            StoreError::NotFound(m) => ApiError::NotFound(m),
            StoreError::Unavailable { message: m, .. } => {
                ApiError::NotReady(format!("the database is unreachable: {m}"))
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<cachet_context::ContextError> for ApiError {
    fn from(e: cachet_context::ContextError) -> ApiError {
        use cachet_context::ContextError;
        match e {
            ContextError::BadSource(m) => ApiError::bad_param("url", m),
            ContextError::BadPath(m) => ApiError::bad(m),
            ContextError::UnknownRef(m) => ApiError::bad_param("branch", m),
            ContextError::NotFound(m) => ApiError::NotFound(m),
            e @ ContextError::Git(_) => ApiError::Upstream(e.to_string()),
            ContextError::Fetch(m) => {
                // What answered and how (refused, reset, not a repository, TLS) is for the
                // operator: told to the tenant, it would make the server a port scanner.
                tracing::warn!("fetching a repository failed: {m}");
                ApiError::Upstream(
                    "the repository could not be fetched (unreachable, not a git repository, or slower than this \
                     server allows)"
                        .into(),
                )
            }
            ContextError::BadOptions(m) => ApiError::bad_param("rules", m),
            e @ ContextError::Io(_) => ApiError::Internal(e.to_string()),
            ContextError::TooLarge(m) => ApiError::bad(m),
            other => ApiError::Internal(other.to_string()),
        }
    }
}
