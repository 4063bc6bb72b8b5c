//! What the port gateway reads from a request and removes before passing it on: its own
//! query parameters and headers (the daemon's credentials) and hop-by-hop headers. Apart
//! from `proxy.rs` (it depends on `http` and `form_urlencoded` only) so that
//! crates/server/fuzz compiles it on its own (target `gateway_rewrite`).

use super::{header, HeaderMap};

/// The header that carries a sandbox's access token.
pub const TOKEN_HEADER: &str = "x-sandfork-access-token";
/// Query parameters the gateway reads (and removes before passing a request on).
pub const TOKEN_PARAM: &str = "sandfork_token";
pub const EXPIRES_PARAM: &str = "sandfork_expires";
pub const SIGNATURE_PARAM: &str = "sandfork_signature";

/// Headers that belong to one hop and are not passed on (RFC 9110 §7.6.1), but for the
/// `Connection: upgrade` / `Upgrade` pair of an upgrade.
const HOP_BY_HOP: [&str; 7] = [
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// The query's pairs, names and values decoded, as the gateway reads its credentials.
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// The query without the gateway's own parameters (`None` when nothing is left).
pub fn passed_query(query: Option<&str>) -> Option<String> {
    let query = query?;
    // Names compared as decoded, as the credentials were read: `sandfork%5Ftoken` is the
    // gateway's too, and never reaches the sandbox.
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| {
            let raw = p.split('=').next().unwrap_or("");
            let name: String = form_urlencoded::parse(raw.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            ![TOKEN_PARAM, EXPIRES_PARAM, SIGNATURE_PARAM].contains(&name.as_str())
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// Whether a request asks to switch protocols (`Connection: upgrade` with `Upgrade`).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Removes hop-by-hop headers, and those `Connection` names; an upgrade keeps its
/// `Connection: upgrade` and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .filter(|t| !(upgrade && t == "upgrade"))
        .collect();
    for name in named.iter().map(String::as_str).chain(HOP_BY_HOP) {
        headers.remove(name);
    }
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// The headers as the sandbox gets them: without hop-by-hop headers, the access-token
/// header, and `Authorization` when it carried the API token.
pub fn strip_credentials(headers: &mut HeaderMap, upgrade: bool, api_token_used: bool) {
    strip_hop_by_hop(headers, upgrade);
    headers.remove(TOKEN_HEADER);
    if api_token_used {
        headers.remove(header::AUTHORIZATION);
    }
}
