//! API errors: one HTTP status and a stable code per case, as `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::automation::AutomationError;

/// An error answered to an API caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code (`UNAUTHORIZED`, `NOT_FOUND`, ...).
    pub code: &'static str,
    /// What went wrong, for a human; never a secret or token.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    /// 400: the request cannot be understood.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    /// 401: no key or an unknown key.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "a valid API key is required (Authorization: Bearer KEY)",
        )
    }

    /// 429: the client presented too many unknown keys; it may try again after `wait`.
    pub fn throttled(wait: std::time::Duration) -> ApiError {
        let seconds = wait.as_secs().max(1);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_FAILURES",
            format!("too many unknown API keys from this address; try again in {seconds} s"),
        )
    }

    /// 403: the caller may not do this.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN", message)
    }

    /// 404: nothing here.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }

    /// 413: the body or the script is too large.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "TOO_LARGE", message)
    }

    /// 503: the request was carried out, but its audit entry could not be written (the log says
    /// why). A retry of an idempotent request records it; a decision retried is `ALREADY_DECIDED`.
    pub fn audit_unavailable() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "AUDIT_UNAVAILABLE",
            "the request was carried out, but its audit entry could not be written",
        )
    }

    /// 500: our fault; the details go to the log, not to the caller.
    pub fn internal(cause: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %cause, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

impl From<AutomationError> for ApiError {
    fn from(e: AutomationError) -> ApiError {
        let message = e.to_string();
        match e {
            AutomationError::NotFound => ApiError::not_found(message),
            AutomationError::WrongTenant => ApiError::forbidden(message),
            AutomationError::Ended(_) => ApiError::new(StatusCode::GONE, "ENDED", message),
            AutomationError::AlreadyDecided => ApiError::new(StatusCode::CONFLICT, "ALREADY_DECIDED", message),
            AutomationError::NotWaiting => ApiError::new(StatusCode::CONFLICT, "NOT_WAITING", message),
            AutomationError::IdempotencyConflict => {
                ApiError::new(StatusCode::CONFLICT, "IDEMPOTENCY_CONFLICT", message)
            }
            AutomationError::NotApprover(_) => ApiError::new(StatusCode::FORBIDDEN, "NOT_APPROVER", message),
            AutomationError::FourEyes(_) => ApiError::new(StatusCode::FORBIDDEN, "FOUR_EYES", message),
            AutomationError::Invalid(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "INVALID_DECISIONS", message)
            }
            AutomationError::Config(_) | AutomationError::Internal(_) => ApiError::internal(message),
            // The cause is in the log; the caller learns that the act stands.
            AutomationError::Audit(_) => ApiError::audit_unavailable(),
            AutomationError::QuotaExceeded(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "QUOTA_EXCEEDED", message)
            }
        }
    }
}
