//! Bearer-token authentication of the TCP listener (constant-time comparison).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use super::error_response;

/// The token every TCP request must present as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    pub fn new(token: String) -> Self {
        Token(token)
    }

    /// Whether an `Authorization` header value carries this token.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
            return false;
        };
        given.as_bytes().ct_eq(self.0.as_bytes()).into()
    }
}

/// Marks a request that carries the API token (the gateway then needs no other).
#[derive(Debug, Clone, Copy)]
pub struct Authenticated;

/// Marks `req` [`Authenticated`] when it carries `token`; refuses nothing.
pub(super) fn mark_request(token: &Token, req: &mut Request) {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if token.accepts(given) {
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

pub(super) async fn require(State(token): State<Arc<Token>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if token.accepts(given) {
        return next.run(req).await;
    }
    let mut resp = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
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

    #[test]
    fn only_the_exact_token_passes() {
        let t = Token::new("s3cret".into());
        assert!(t.accepts(Some("Bearer s3cret")));
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("s3cret"),
            Some("Basic s3cret"),
        ] {
            assert!(!t.accepts(bad), "{bad:?}");
        }
    }
}
