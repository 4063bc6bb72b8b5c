//! The events feed.

use axum::extract::State;
use axum::response::Response;

use super::extract::ApiQuery;
use super::{ndjson, AppState};
use crate::manager::events::Follow;
use api_types::{ErrorBody, EventsQuery, SandboxEvent};

/// What happens to sandboxes, as NDJSON: created, forked, started, checkpointed,
/// suspended, resumed, terminated, failed, oom. Follows new events until the client
/// leaves (or, with `no_follow`, ends after the replay of kept events after `since`).
#[utoipa::path(get, path = "/v1/events", tag = "sandboxes", params(EventsQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = SandboxEvent),
        (status = 400, body = ErrorBody)))]
pub async fn events(State(m): State<AppState>, ApiQuery(q): ApiQuery<EventsQuery>) -> Response {
    let rx = m.events().stream(Follow {
        sandbox: q.sandbox,
        since: q.since,
        follow: !q.no_follow,
    });
    ndjson::json_lines_with_heartbeat(rx)
}
