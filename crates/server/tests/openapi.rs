//! The checked-in `docs/openapi.json` must equal the document the code generates.
//! Regenerate with `UPDATE_OPENAPI=1 cargo nextest run -p sandfork-server openapi`
//! (or `sandfork openapi > docs/openapi.json`).

use std::path::PathBuf;

fn checked_in() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

#[test]
fn openapi_document_is_current() {
    let generated = server::api::openapi_json();
    let path = checked_in();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/openapi.json is stale: run `UPDATE_OPENAPI=1 cargo nextest run -p sandfork-server openapi`"
    );
}

#[test]
fn openapi_document_lists_every_route() {
    let doc: serde_json::Value = serde_json::from_str(&server::api::openapi_json()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/processes/{pid}/output",
        "/v1/sandboxes/{id}/files",
        "/v1/images",
        "/v1/health",
        "/metrics",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
}
