//! Errors of the inbox pages: an [`ApiError`] (the same statuses and stable codes as the API)
//! shown as HTML; a missing or unknown key shows the sign-in page.

use axum::http::StatusCode;
use axum::response::{Html as HtmlResponse, IntoResponse, Response};

use super::layout;
use crate::automation::AutomationError;
use crate::server::error::ApiError;

/// An error answered with a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageError(pub ApiError);

impl PageError {
    /// 401: not signed in, or the key is not (or no longer) valid; shows the sign-in form.
    pub fn unauthorized(message: impl Into<String>) -> PageError {
        PageError(ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", message))
    }

    /// 403: the form's CSRF token is missing or not the one of the signed-in key.
    pub fn csrf() -> PageError {
        PageError(ApiError::new(
            StatusCode::FORBIDDEN,
            "CSRF_INVALID",
            "this form has no valid security token (it may come from another site, or from before you \
             signed in again); nothing was changed; open the page again and resubmit",
        ))
    }

    /// 429: the client presented too many unknown keys; it may try again after `wait`.
    pub fn throttled(wait: std::time::Duration) -> PageError {
        PageError(ApiError::throttled(wait))
    }

    /// 400: the form cannot be understood.
    pub fn bad_form(message: impl Into<String>) -> PageError {
        PageError(ApiError::new(StatusCode::BAD_REQUEST, "BAD_FORM", message))
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.0.code
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let ApiError { status, code, message } = self.0;
        let page = if status == StatusCode::UNAUTHORIZED {
            layout::sign_in(Some(&message))
        } else {
            layout::error(status, code, &message)
        };
        (status, HtmlResponse(page.into_string())).into_response()
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> PageError {
        PageError(e)
    }
}

impl From<AutomationError> for PageError {
    fn from(e: AutomationError) -> PageError {
        PageError(e.into())
    }
}
