//! The OpenAPI document, derived from the handlers and types.

use utoipa::OpenApi;

use super::{exec, files, images, processes, sandboxes, snapshots, system, types};

#[derive(OpenApi)]
#[openapi(
    info(title = "sandfork", description = "Isolated Linux sandboxes: snapshot once, fork many.", version = "1"),
    paths(
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::terminate,
        exec::exec,
        processes::spawn, processes::list, processes::get, processes::output, processes::stdin,
        processes::close_stdin, processes::signal, processes::wait,
        files::download, files::upload, files::remove, files::list, files::stat, files::mkdir,
        images::list, images::build, images::delete,
        snapshots::checkpoint, snapshots::fork_sandbox, snapshots::suspend, snapshots::resume,
        snapshots::list, snapshots::get_one, snapshots::delete, snapshots::fork_snapshot,
        snapshots::export, snapshots::import,
        system::health, system::metrics, system::openapi,
    ),
    components(schemas(
        types::ErrorBody, types::CreateSandbox, types::NetworkRequest, types::NetworkModeName,
        types::Sandbox, types::NetworkView, types::ForkInfo, types::SandboxList,
        types::ExecRequest, types::ExecResult, types::StreamEvent, types::Process,
        types::ProcessList, types::SignalRequest, types::SignalSpec, types::FileEntry,
        types::FileList, types::MkdirRequest, types::Image, types::ImageList, types::BuildImage,
        types::BuildEvent, types::Health, crate::lifecycle::State,
        crate::snapshots::SnapshotType, crate::snapshots::CheckpointRequest,
        crate::snapshots::Snapshot, crate::snapshots::SnapshotList, crate::snapshots::ChildSpec,
        crate::snapshots::ForkRequest, crate::snapshots::ChildError, crate::snapshots::ForkChild,
        crate::snapshots::ForkResult,
    )),
    tags(
        (name = "sandboxes"), (name = "exec"), (name = "processes"), (name = "files"),
        (name = "images"), (name = "snapshots"), (name = "system"),
    )
)]
struct ApiDoc;

/// The OpenAPI document as pretty JSON (what `docs/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut s = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}
