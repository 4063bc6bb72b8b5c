//! The OpenAPI document, derived from the handlers and types.

use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "sandfork", description = "Isolated Linux sandboxes: snapshot once, fork many.", version = "1"),
    tags(
        (name = "sandboxes"), (name = "exec"), (name = "processes"), (name = "pty"), (name = "files"),
        (name = "images"), (name = "volumes"), (name = "snapshots"), (name = "system"),
    )
)]
struct ApiDoc;

/// Adds to every operation the error answers any handler of its shape can give, so that
/// the document lists every status the daemon sends: 400 for a malformed parameter or body,
/// 404 for an unknown path id, 409 for a sandbox that is not in a state to serve it.
struct CommonErrors;

impl Modify for CommonErrors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for (path, op) in operations(doc) {
            add_common_errors(path, op);
        }
    }
}

/// Every operation of the document, with its path.
fn operations(doc: &mut utoipa::openapi::OpenApi) -> impl Iterator<Item = (&str, &mut Operation)> {
    doc.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        .map(move |op| (path.as_str(), op))
    })
}

/// Names every operation `<tag>_<handler>` (`sandboxes_list`, `images_list`): handlers of
/// different routers share names, and OpenAPI wants operation ids unique, as the code
/// generators that read the document (the TypeScript SDK's types) rely on.
struct UniqueOperationIds;

impl Modify for UniqueOperationIds {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for (_, op) in operations(doc) {
            let tag = op.tags.as_ref().and_then(|t| t.first()).cloned();
            if let (Some(tag), Some(id)) = (tag, op.operation_id.as_mut()) {
                if !id.starts_with(&format!("{tag}_")) {
                    *id = format!("{tag}_{id}");
                }
            }
        }
    }
}

fn add_common_errors(path: &str, op: &mut Operation) {
    let has_input =
        op.request_body.is_some() || op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let on_sandbox = path.starts_with("/v1/sandboxes/{id}/");
    let statuses = [
        ("400", "Invalid parameter or body", has_input),
        ("404", "No such resource", path.contains('{')),
        (
            "409",
            "The sandbox is not in a state to do this",
            on_sandbox,
        ),
    ];
    for (status, description, applies) in statuses {
        if applies && !op.responses.responses.contains_key(status) {
            let response = ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build();
            op.responses
                .responses
                .insert(status.into(), response.into());
        }
    }
}

/// The OpenAPI document: the routes' entries (`super::api_routes`, where each route is
/// registered once), the shared schemas and tags, then every operation's common errors
/// and unique id.
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, mut doc) =
        utoipa_axum::router::OpenApiRouter::<super::AppState>::with_openapi(ApiDoc::openapi())
            .merge(super::api_routes())
            .split_for_parts();
    CommonErrors.modify(&mut doc);
    UniqueOperationIds.modify(&mut doc);
    doc
}

/// The OpenAPI document as pretty JSON (what `docs/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut s = document().to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}
