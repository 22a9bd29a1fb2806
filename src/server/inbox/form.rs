//! Form posts of the inbox: the extractors refuse requests that browsers mark as coming from
//! another site, and [`ProtectedForm`] also requires the session cookie and the session's CSRF
//! token, so the cookie alone never changes anything.

use axum::RequestExt as _;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};

use super::csrf;
use super::error::PageError;
use super::session_cookie::Session;
use crate::server::AppState;
use crate::server::error::ApiError;

/// The fields of a form-encoded body, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostedForm(pub Vec<(String, String)>);

impl PostedForm {
    /// The first value of field `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// 403 when the browser says the request comes from another site (`Sec-Fetch-Site`): a second
/// line of defence next to `SameSite=Strict` cookies and CSRF tokens (it also covers sign-in).
fn refuse_cross_site(headers: &HeaderMap) -> Result<(), PageError> {
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        None | Some(b"same-origin" | b"none") => Ok(()),
        Some(_) => Err(PageError(ApiError::new(
            StatusCode::FORBIDDEN,
            "CROSS_SITE",
            "this form was posted from another site; nothing was changed",
        ))),
    }
}

impl FromRequest<AppState> for PostedForm {
    type Rejection = PageError;

    async fn from_request(req: Request, state: &AppState) -> Result<PostedForm, PageError> {
        refuse_cross_site(req.headers())?;
        let form_type =
            req.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| {
                t.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
            });
        if !form_type {
            return Err(PageError::bad_form("the form must be sent as application/x-www-form-urlencoded"));
        }
        let bytes = crate::server::body::read_body(req, state).await?;
        let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&bytes)
            .map_err(|e| PageError::bad_form(format!("the form could not be read: {e}")))?;
        Ok(PostedForm(fields))
    }
}

/// A form posted by a signed-in caller with the session's CSRF token: 401 without a session,
/// 403 without the right token.
#[derive(Clone, Debug)]
pub struct ProtectedForm {
    /// Who posted it.
    pub session: Session,
    /// Its fields.
    pub form: PostedForm,
}

impl FromRequest<AppState> for ProtectedForm {
    type Rejection = PageError;

    async fn from_request(mut req: Request, state: &AppState) -> Result<ProtectedForm, PageError> {
        refuse_cross_site(req.headers())?;
        let session = req.extract_parts_with_state::<Session, _>(state).await?;
        let form = PostedForm::from_request(req, state).await?;
        match form.get(csrf::FIELD) {
            Some(token) if session.csrf_valid(&state.inbox.csrf, token) => Ok(ProtectedForm { session, form }),
            _ => Err(PageError::csrf()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_same_origin_posts_pass() {
        let mut headers = HeaderMap::new();
        assert!(refuse_cross_site(&headers).is_ok(), "browsers without Fetch Metadata, and API clients");
        for (value, ok) in [("same-origin", true), ("none", true), ("same-site", false), ("cross-site", false)] {
            headers.insert("sec-fetch-site", HeaderValue::from_static(value));
            assert_eq!(refuse_cross_site(&headers).is_ok(), ok, "{value}");
        }
    }
}
