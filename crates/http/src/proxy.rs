//! A request passed on, by the daemon to a sandbox's port or by the cluster gateway to a
//! node: the headers that belong to one hop, the sandbox's own credentials (read, then
//! taken out), the sandbox and port a `Host` names, and the one answer to a port request
//! that opens nothing, which the daemon and the gateway give alike.

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

mod rewrite;
pub use rewrite::{
    passed_query, query_pairs, strip_credentials, strip_hop_by_hop, wants_upgrade, EXPIRES_PARAM,
    SIGNATURE_PARAM, TOKEN_HEADER, TOKEN_PARAM,
};

/// The answer to a port request without credentials that the port does not waive, the
/// same whatever sandbox or port it names.
pub const PORT_UNAUTHORIZED: &str = "This port is private: send the sandbox's access token \
     (X-Sandfork-Access-Token), use a signed URL, or the API token";
/// The answer to a port request whose credentials do not open it (wrong, expired, for
/// another sandbox or port, or naming no sandbox), the same whatever the path names.
pub const PORT_FORBIDDEN: &str = "The token or signature does not open this port (or it expired)";

/// The sandbox and port a `Host` header names under `domain` (`{port}-{id}.{domain}`).
pub fn host_target(headers: &HeaderMap, uri: &Uri, domain: &str) -> Option<(String, String)> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.host())?;
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    (!id.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (id.to_string(), port.to_string()))
}

/// What a port request presents of the sandbox's own credentials (the API token aside).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxCredentials {
    /// Its access token, by header or query parameter.
    pub access_token: Option<String>,
    /// `(expires_unix, signature)` of a signed URL.
    pub signed: Option<(u64, String)>,
}

impl SandboxCredentials {
    pub fn of(req: &Request) -> SandboxCredentials {
        let header_token = req
            .headers()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let pairs = query_pairs(req.uri().query());
        let param = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let signed = match (param(EXPIRES_PARAM), param(SIGNATURE_PARAM)) {
            (Some(e), Some(s)) => e.parse().ok().map(|e| (e, s)),
            _ => None,
        };
        SandboxCredentials {
            access_token: header_token.or_else(|| param(TOKEN_PARAM)),
            signed,
        }
    }
}

/// The answer to a port request without the API token for a sandbox that is not there (or
/// not reachable): the same fixed answer a refused request gets, so a caller without the
/// token learns nothing of what exists (the daemon's port gateway and the cluster gateway
/// answer so alike).
pub fn port_refusal(req: &Request) -> Response {
    let creds = SandboxCredentials::of(req);
    let (status, code, message) = if creds.access_token.is_none() && creds.signed.is_none() {
        (StatusCode::UNAUTHORIZED, "unauthorized", PORT_UNAUTHORIZED)
    } else {
        (StatusCode::FORBIDDEN, "forbidden", PORT_FORBIDDEN)
    };
    let body = api_types::ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn host_names_a_port_and_a_sandbox() {
        let mut h = HeaderMap::new();
        let uri: Uri = "/x".parse().unwrap();
        h.insert(
            header::HOST,
            HeaderValue::from_static("8080-sb-1a2b.localhost:7000"),
        );
        assert_eq!(
            host_target(&h, &uri, "localhost"),
            Some(("sb-1a2b".into(), "8080".into()))
        );
        for bad in [
            "localhost:7000",
            "x-sb.localhost",
            "8080-sb.other",
            "8080-.localhost",
            "a.8080-sb.localhost",
        ] {
            h.insert(header::HOST, HeaderValue::from_str(bad).unwrap());
            assert_eq!(host_target(&h, &uri, "localhost"), None, "{bad}");
        }
    }

    #[test]
    fn the_gateway_parameters_are_not_passed_on() {
        assert_eq!(
            passed_query(Some("a=1&sandfork_token=x&b=2")),
            Some("a=1&b=2".into())
        );
        assert_eq!(
            passed_query(Some("sandfork_expires=1&sandfork_signature=2")),
            None
        );
        assert_eq!(passed_query(None), None);
        // Encoded, the names are the gateway's all the same.
        assert_eq!(
            passed_query(Some("sandfork%5Ftoken=x&a=1&sandfork_%65xpires=1")),
            Some("a=1".into())
        );
    }

    #[test]
    fn hop_by_hop_headers_go_and_an_upgrade_keeps_its_pair() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret, Upgrade"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("keep-alive", HeaderValue::from_static("5"));
        let mut up = h.clone();
        strip_hop_by_hop(&mut up, true);
        assert!(
            up.contains_key(header::UPGRADE)
                && !up.contains_key("x-secret")
                && !up.contains_key("keep-alive")
        );
        strip_hop_by_hop(&mut h, false);
        assert!(!h.contains_key(header::UPGRADE) && !h.contains_key(header::CONNECTION));
    }

    #[test]
    fn a_port_request_with_no_credentials_is_unauthorized_and_with_some_forbidden() {
        let req = |uri: &str| {
            Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert_eq!(port_refusal(&req("/p")).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            port_refusal(&req("/p?sandfork_token=x")).status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            port_refusal(&req("/p?sandfork_expires=1&sandfork_signature=s")).status(),
            StatusCode::FORBIDDEN
        );
        // An expiry that is no number is no signed URL.
        assert_eq!(
            port_refusal(&req("/p?sandfork_expires=x&sandfork_signature=s")).status(),
            StatusCode::UNAUTHORIZED
        );
    }
}
