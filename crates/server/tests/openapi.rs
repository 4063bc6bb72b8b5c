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

/// What code generators rely on: every operation id unique, and every path parameter in
/// its path's template (query parameters declared as such).
#[test]
fn openapi_operation_ids_are_unique_and_parameters_are_where_they_are_sent() {
    let doc: serde_json::Value = serde_json::from_str(&server::api::openapi_json()).unwrap();
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            assert!(
                ids.insert(id.clone()),
                "operation id {id} used twice ({method} {path})"
            );
            for param in op["parameters"].as_array().into_iter().flatten() {
                let name = param["name"].as_str().unwrap_or_default();
                let in_template = path.contains(&format!("{{{name}}}"));
                let declared_in = param["in"].as_str().unwrap_or_default();
                assert_eq!(
                    declared_in == "path",
                    in_template,
                    "{method} {path}: parameter {name} declared in {declared_in}"
                );
            }
        }
    }
}
