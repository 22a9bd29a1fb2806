//! The handlers of the inbox pages: plain async functions; the extractors authenticate
//! ([`Session`]), read forms and check their CSRF tokens ([`ProtectedForm`]).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::SET_COOKIE;
use axum::response::{Html as HtmlResponse, IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::PageError;
use super::form::{PostedForm, ProtectedForm};
use super::html::Html;
use super::layout::{self, Viewer};
use super::session_cookie::{self, MAX_KEY_BYTES, Session};
use super::{automation_page, decision_form, history_page, inbox_page, sessions_page};
use crate::automation::AutomationError;
use crate::server::AppState;
use crate::server::auth::Role;
use crate::server::error::ApiError;
use crate::server::history::{cursor_text, parse_cursor};
use crate::server::routes::{automation_id, ndjson_events, run_id};
use crate::server::throttle::ClientIp;
use crate::session::{SessionError, SessionsShown};
use resumable_workflow::RunCursor;

/// The most approvals the inbox shows.
const MAX_INBOX: usize = 200;

fn html(page: Html) -> Response {
    HtmlResponse(page.into_string()).into_response()
}

/// `GET /`: the inbox when signed in, else the sign-in form.
pub async fn index(State(state): State<AppState>, session: Option<Session>) -> Result<Response, PageError> {
    let Some(session) = session else { return Ok(html(layout::sign_in(None))) };
    let approvals = state.automations.pending_approvals(&session.caller.tenant, MAX_INBOX).await?;
    let csrf = session.csrf_token(&state.inbox.csrf);
    Ok(html(inbox_page::render(Viewer { caller: &session.caller, csrf: &csrf }, &approvals)))
}

/// `POST /login` with `key`: sets the session cookie and goes to the inbox; a wrong key shows
/// the form again (401).
pub async fn login(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    form: PostedForm,
) -> Result<Response, PageError> {
    state.throttle.check(client).map_err(PageError::throttled)?;
    let key = form.get("key").unwrap_or_default().trim();
    if key.is_empty() {
        return Err(PageError::unauthorized("Enter your API key."));
    }
    if key.len() > MAX_KEY_BYTES || state.keys.caller(key).is_none() {
        state.throttle.failed(client);
        return Err(PageError::unauthorized("That API key is not valid. Check it and try again."));
    }
    let cookie = session_cookie::set(key, state.inbox.secure_cookies);
    Ok(([(SET_COOKIE, cookie)], Redirect::to("/")).into_response())
}

/// `POST /logout` (with the CSRF token): clears the session cookie.
pub async fn logout(State(state): State<AppState>, _form: ProtectedForm) -> Response {
    ([(SET_COOKIE, session_cookie::clear(state.inbox.secure_cookies))], Redirect::to("/")).into_response()
}

/// `GET /automations/{id}`: the automation's page.
pub async fn automation(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let view = state.automations.get(&session.caller.tenant, &automation_id(&id)?).await?;
    let csrf = session.csrf_token(&state.inbox.csrf);
    Ok(html(automation_page::render(Viewer { caller: &session.caller, csrf: &csrf }, &view)))
}

/// `?cursor=` of the history and sessions pages: a page's next, as its link gives it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    #[serde(default)]
    cursor: Option<String>,
}

impl PageQuery {
    fn cursor(&self) -> Result<Option<RunCursor>, PageError> {
        self.cursor.as_deref().map(|c| parse_cursor(c).map_err(PageError::from)).transpose()
    }
}

/// The rows of a history or sessions page.
const PAGE_ROWS: u32 = 50;

/// `GET /history`: the tenant's automations, newest first.
pub async fn history(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    session.caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| PageError::bad_form(format!("invalid query: {}", e.body_text())))?;
    let page = state.automations.list(&session.caller.tenant, &[], query.cursor()?, PAGE_ROWS).await?;
    let csrf = session.csrf_token(&state.inbox.csrf);
    let next = page.next.as_ref().map(cursor_text);
    Ok(html(history_page::render(Viewer { caller: &session.caller, csrf: &csrf }, &page, next)))
}

/// `GET /sessions`: the tenant's sessions, newest first.
pub async fn sessions(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    session.caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| PageError::bad_form(format!("invalid query: {}", e.body_text())))?;
    let sessions = state.automations.sessions();
    let page = sessions
        .list(&session.caller.tenant, SessionsShown::All, query.cursor()?, PAGE_ROWS)
        .await
        .map_err(|e| PageError::from(ApiError::internal(e.to_string())))?;
    let csrf = session.csrf_token(&state.inbox.csrf);
    let next = page.next.as_ref().map(cursor_text);
    Ok(html(sessions_page::list(Viewer { caller: &session.caller, csrf: &csrf }, &page, next)))
}

/// The most events a session's page shows.
const SESSION_EVENTS: u32 = 1_000;

/// `GET /sessions/{id}`: a session of the tenant, live or ended, and its events.
pub async fn session(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    session.caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let not_found = || PageError::from(ApiError::not_found("no such session"));
    let id = run_id(&id).ok_or_else(not_found)?;
    let (view, _live, events) =
        match state.automations.sessions().inspect(&session.caller.tenant, &id, SESSION_EVENTS).await {
            Ok(found) => found,
            Err(SessionError::Gone { .. }) => return Err(not_found()),
            Err(e) => return Err(ApiError::internal(e.to_string()).into()),
        };
    let csrf = session.csrf_token(&state.inbox.csrf);
    Ok(html(sessions_page::render(Viewer { caller: &session.caller, csrf: &csrf }, &view, &events)))
}

/// `?from=N` of the events route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    #[serde(default)]
    from: u64,
}

/// `GET /automations/{id}/events?from=N`: the automation's events as NDJSON, live, for the page's
/// script (the same stream as the API's, authenticated by the session cookie; read-only).
pub async fn events(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, PageError> {
    session.caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| PageError::bad_form(format!("invalid query: {}", e.body_text())))?;
    let slot = state.streams.take(&session.caller.key_id)?;
    let reader = state.automations.events(&session.caller.tenant, &automation_id(&id)?, query.from).await?;
    Ok(ndjson_events(reader, state.shutting_down, slot))
}

/// `POST /automations/{id}/decide` (with the CSRF token): decides the open round as the form
/// says, then shows the automation's page (303).
pub async fn decide(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ProtectedForm { session, form }: ProtectedForm,
) -> Result<Response, PageError> {
    let caller = &session.caller;
    caller.require(Role::APPROVER)?;
    let run = automation_id(&id)?;
    let view = state.automations.get(&caller.tenant, &run).await?;
    let Some(pending) = view.pending else {
        let error = if view.status.is_terminal() {
            AutomationError::Ended(view.status)
        } else if view.history.last().is_some_and(|r| r.decision.is_some()) {
            AutomationError::AlreadyDecided
        } else {
            AutomationError::NotWaiting
        };
        return Err(error.into());
    };
    let roles: Vec<&str> = caller.roles.iter().map(Role::as_str).collect();
    let batch = decision_form::parse(&form, &pending, &caller.actor, &roles)?;
    let round = state.automations.decide(&caller.tenant, &run, batch, &roles, Some(&caller.key_id)).await?;
    tracing::info!(automation = %run, round, actor = %caller.actor, "decision delivered from the inbox");
    Ok(Redirect::to(&format!("/automations/{run}")).into_response())
}
