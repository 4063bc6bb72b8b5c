//! The OpenAPI document, derived from the handlers and types.

use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::{exec, files, images, processes, pty, sandboxes, snapshots, system, volumes};

#[derive(OpenApi)]
#[openapi(
    info(title = "sandfork", description = "Isolated Linux sandboxes: snapshot once, fork many.", version = "1"),
    paths(
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::update, sandboxes::patch_labels,
        sandboxes::stats, sandboxes::port_url, sandboxes::rotate_access_token,
        super::events::events,
        sandboxes::terminate,
        exec::exec,
        processes::spawn, processes::list, processes::get, processes::output, processes::stdin,
        processes::close_stdin, processes::signal, processes::wait, processes::restart,
        processes::stop,
        pty::create, pty::resize, pty::connect, processes::logs,
        files::download, files::upload, files::remove, files::list, files::watch, files::stat, files::mkdir,
        images::list, images::build, images::ensure, images::pull, images::build_dockerfile, images::from_snapshot, images::import, images::export, images::push, images::inspect, images::delete,
        volumes::create, volumes::list, volumes::inspect, volumes::delete,
        snapshots::checkpoint, snapshots::fork_sandbox, snapshots::suspend, snapshots::resume,
        snapshots::list, snapshots::get_one, snapshots::delete, snapshots::publish, snapshots::fork_snapshot,
        snapshots::export, snapshots::import,
        system::health, system::metrics, system::openapi,
    ),
    components(schemas(
        api_types::ErrorBody, api_types::ErrorCode, api_types::CreateSandbox, api_types::NetworkRequest, api_types::NetworkModeName,
        api_types::Sandbox, api_types::UpdateSandbox, api_types::LabelsPatch, api_types::Labels, api_types::NetworkView, api_types::ForkInfo, api_types::SandboxList,
        api_types::ExecRequest, api_types::ExecResult, api_types::StreamEvent, api_types::Process,
        api_types::ProcessList, api_types::SpawnProcess, api_types::StdinModeName, api_types::OutputModeName,
        api_types::RestartPolicyName, api_types::RestartConfig, api_types::HealthCheckKind,
        api_types::HealthCheckConfig, api_types::ProcessExit, api_types::ManagedProcess,
        api_types::SignalRequest, api_types::SignalSpec, api_types::CreatePty, api_types::PtySize, api_types::PortUrlRequest, api_types::PortUrl, api_types::AccessToken, api_types::ResourceUse, api_types::LogEntry, api_types::FileEntry,
        api_types::FileList, api_types::MkdirRequest, api_types::Image, api_types::ImageList, api_types::BuildImage, api_types::PullImage, api_types::ImageDetails, api_types::ImageFromSnapshot, api_types::PushImage, api_types::PushedImage, api_types::VolumeMount, api_types::CreateVolume, api_types::Volume, api_types::VolumeList,
        api_types::BuildEvent, api_types::Health, model::State,
        model::SnapshotType, api_types::CheckpointRequest,
        api_types::Snapshot, api_types::SnapshotList, api_types::ChildSpec,
        api_types::ForkRequest, api_types::ChildError, api_types::ForkChild,
        api_types::ForkResult,
    )),
    modifiers(&CommonErrors, &UniqueOperationIds),
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

/// The OpenAPI document as pretty JSON (what `docs/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut s = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}
