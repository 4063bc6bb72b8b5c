//! The bearer token of a TCP listener (compared in constant time) and where a request may
//! carry it.

use axum::extract::Request;
use axum::http::header;
use subtle::ConstantTimeEq;

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

    /// Whether `req` carries this token: as `Authorization: Bearer`, or (a WebSocket
    /// upgrade) as `access_token` in its query, which is then taken out of it (see
    /// [`websocket_token`]).
    pub fn carried_by(&self, req: &mut Request) -> bool {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.accepts(given) || websocket_token(self, req)
    }
}

/// A browser cannot set headers on a WebSocket, so a WebSocket upgrade may carry the token
/// as `access_token` in its query instead; it is taken out of the query when accepted (the
/// route's own query knows nothing of it).
pub fn websocket_token(token: &Token, req: &mut Request) -> bool {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(query) = req.uri().query().filter(|_| upgrade) else {
        return false;
    };
    let mut given = None;
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if key == "access_token" {
            given = Some(value.into_owned());
        } else {
            rest.append_pair(&key, &value);
        }
    }
    let Some(given) = given else {
        return false;
    };
    if !token.accepts(Some(&format!("Bearer {given}"))) {
        return false;
    }
    let rest = rest.finish();
    let path = req.uri().path();
    let uri = if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{rest}")
    };
    match uri.parse() {
        Ok(uri) => {
            *req.uri_mut() = uri;
            true
        }
        Err(_) => false,
    }
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
    fn a_websocket_may_carry_the_token_in_its_query_which_is_then_removed() {
        let t = Token::new("s3 cret".into());
        let mut req = upgrade("/v1/sandboxes/x/pty/1/connect?offset=5&access_token=s3%20cret");
        assert!(websocket_token(&t, &mut req));
        assert_eq!(
            req.uri().to_string(),
            "/v1/sandboxes/x/pty/1/connect?offset=5"
        );
        let mut wrong = upgrade("/p?access_token=s3cret");
        assert!(!websocket_token(&t, &mut wrong));
        let mut plain = Request::builder()
            .uri("/p?access_token=s3%20cret")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(
            !websocket_token(&t, &mut plain),
            "only on a WebSocket upgrade"
        );
    }

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
