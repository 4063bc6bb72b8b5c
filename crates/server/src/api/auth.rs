//! Bearer-token authentication of the TCP listener (the token itself: `sandfork_http::token`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use sandfork_http::token::Token;

use super::error_response;

/// Marks a request that carries the API token (the gateway then needs no other).
#[derive(Debug, Clone, Copy)]
pub struct Authenticated;

/// Marks `req` [`Authenticated`] when it carries `token` (a WebSocket upgrade may carry it
/// as `access_token`, taken out of the query so that it never reaches a sandbox's port);
/// refuses nothing.
pub(super) fn mark_request(token: &Token, req: &mut Request) {
    if token.carried_by(req) {
        req.extensions_mut().insert(Authenticated);
    }
}

pub(super) async fn mark(
    State(token): State<Arc<Token>>,
    mut req: Request,
    next: Next,
) -> Response {
    mark_request(&token, &mut req);
    next.run(req).await
}

pub(super) async fn require(
    State(token): State<Arc<Token>>,
    mut req: Request,
    next: Next,
) -> Response {
    if token.carried_by(&mut req) {
        return next.run(req).await;
    }
    let mut resp = error_response(
        StatusCode::UNAUTHORIZED,
        api_types::ErrorCode::Unauthorized,
        "Missing or wrong bearer token".into(),
    );
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(uri: &str) -> Request {
        Request::builder()
            .uri(uri)
            .header(header::UPGRADE, "websocket")
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn a_port_websocket_marked_by_its_query_token_loses_it() {
        let t = Token::new("s3 cret".into());
        let mut req = upgrade("/v1/sandboxes/x/ports/80/ws?a=1&access_token=s3%20cret");
        mark_request(&t, &mut req);
        assert!(req.extensions().get::<Authenticated>().is_some());
        assert_eq!(req.uri().to_string(), "/v1/sandboxes/x/ports/80/ws?a=1");
        let mut other = upgrade("/v1/sandboxes/x/ports/80/ws?access_token=theirs");
        mark_request(&t, &mut other);
        assert!(other.extensions().get::<Authenticated>().is_none());
        assert!(
            other.uri().to_string().ends_with("access_token=theirs"),
            "the app's own"
        );
    }
}
