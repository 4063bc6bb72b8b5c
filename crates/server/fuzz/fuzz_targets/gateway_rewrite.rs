//! The port gateway's request rewriting: whatever query and headers a client sends, what
//! the sandbox gets holds none of the gateway's credential parameters (by any spelling
//! the gateway itself would read: percent-encoded, without a value, repeated), none of
//! its token header, no `Authorization` when that carried the API token, and no
//! hop-by-hop header; everything else is passed on unchanged and in order.
//!
//! Input: the first byte holds the flags (bit 0: an upgrade, bit 1: the API token was
//! used), then the query up to the first newline, then `name: value` header lines.
#![no_main]

use http::{header, HeaderMap, HeaderName, HeaderValue};

#[path = "../../../http/src/proxy/rewrite.rs"]
#[allow(dead_code)]
mod rewrite;

use libfuzzer_sys::fuzz_target;

const GATEWAY_PARAMS: [&str; 3] = [
    rewrite::TOKEN_PARAM,
    rewrite::EXPIRES_PARAM,
    rewrite::SIGNATURE_PARAM,
];

fn headers(lines: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for line in lines.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        h.append(name, value);
    }
    h
}

fn check_query(query: &str) {
    let passed = rewrite::passed_query(Some(query));
    let Some(passed) = passed else {
        // Nothing left: every segment was the gateway's.
        return;
    };
    // Not a credential in what the sandbox reads, as the gateway reads it…
    for (name, _) in rewrite::query_pairs(Some(&passed)) {
        assert!(
            !GATEWAY_PARAMS.contains(&name.as_str()),
            "{name:?} passed on in {passed:?} (from {query:?})"
        );
    }
    // …and every pair that is not the gateway's passed as it came, in order.
    let expected: Vec<(String, String)> = rewrite::query_pairs(Some(query))
        .into_iter()
        .filter(|(n, _)| !GATEWAY_PARAMS.contains(&n.as_str()))
        .collect();
    assert_eq!(
        rewrite::query_pairs(Some(&passed)),
        expected,
        "{query:?} became {passed:?}"
    );
    // Stripping again changes nothing.
    assert_eq!(
        rewrite::passed_query(Some(&passed)).as_deref(),
        Some(passed.as_str())
    );
}

fn check_headers(mut h: HeaderMap, upgrade: bool, api_token_used: bool) {
    let before = h.clone();
    let named: Vec<String> = before
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    rewrite::strip_credentials(&mut h, upgrade, api_token_used);
    assert!(
        !h.contains_key(rewrite::TOKEN_HEADER),
        "the token header passed"
    );
    if api_token_used {
        assert!(
            !h.contains_key(header::AUTHORIZATION),
            "the API token passed"
        );
    }
    for hop in [
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        assert!(!h.contains_key(hop), "{hop} passed");
    }
    for n in &named {
        if !(upgrade && n == "upgrade") {
            assert!(
                !h.contains_key(n.as_str()),
                "{n} (named by Connection) passed"
            );
        }
    }
    if !upgrade {
        assert!(!h.contains_key(header::CONNECTION) && !h.contains_key(header::UPGRADE));
    }
    // Nothing is added, and what stays is as it came.
    for (name, value) in &h {
        assert!(
            before.get_all(name).iter().any(|v| v == value),
            "{name} changed"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (query, lines) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    // A request's query is ASCII past the URI parser; any UTF-8 is checked all the same.
    if let Ok(query) = std::str::from_utf8(query) {
        check_query(query);
    }
    check_headers(headers(lines), flags & 1 != 0, flags & 2 != 0);
});
