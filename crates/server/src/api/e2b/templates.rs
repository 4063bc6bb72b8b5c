//! E2B's template build API, onto the daemon's Dockerfile builder.
//!
//! `POST /v3/templates` names the template (an image name) and hands out a build id;
//! `GET /templates/{id}/files/{hash}` says whether a COPY's files are here, else gives a
//! signed URL on this daemon where the SDK PUTs them as a tar (unpacked with the daemon's
//! safe unpack and its import limits, under `<data>/tmp/e2b-templates/<id>/<hash>`);
//! `POST /v2/templates/{id}/builds/{buildID}` translates the steps into a Dockerfile
//! ([`build_plan`]) and runs [`Manager::build_dockerfile`] in the background, whose
//! progress lines become the build's log entries (`GET …/builds/{buildID}/status`).
//! Template tags are not served: they answer an error naming them.
//!
//! [`Manager::build_dockerfile`]: crate::manager::Manager::build_dockerfile

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use super::build_plan::{self, BuildStart, Settings};
use super::errors::ApiErr;
use super::{E2bState, Shared};
use crate::error::Error;

type Answer = Result<Response, ApiErr>;

/// Builds remembered (finished ones are dropped oldest first beyond this).
const MAX_BUILDS: usize = 256;
/// Log entries kept per build (later ones are counted, not kept).
const MAX_LOG_ENTRIES: usize = 20_000;
/// Entries of one status answer (E2B's page size).
const MAX_PAGE: usize = 100;
/// Lines of the failure's output repeated in its reason.
const REASON_TAIL: usize = 20;

pub fn routes() -> Router<E2bState> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/{id}/files/{hash}", get(file_link).put(upload))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(tags_missing).delete(tags_missing))
        .route("/templates/{id}/tags", get(tags_missing))
        .route("/templates", get(list_missing).post(v1_missing))
        .route("/v2/templates", post(v1_missing))
}

/// The builds of this daemon's run, and the key that signs upload URLs.
pub struct Templates {
    key: [u8; 32],
    builds: Mutex<BuildMap>,
}

#[derive(Default)]
struct BuildMap {
    by_id: HashMap<String, Arc<Mutex<Build>>>,
    order: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Building => "building",
            Phase::Ready => "ready",
            Phase::Error => "error",
        }
    }
}

struct Build {
    template: String,
    settings: Settings,
    phase: Phase,
    logs: Vec<Value>,
    dropped: usize,
    reason: Option<Value>,
}

impl Build {
    fn log(&mut self, level: &str, message: String, step: Option<String>) {
        if self.logs.len() >= MAX_LOG_ENTRIES {
            self.dropped += 1;
            return;
        }
        let mut e =
            json!({"timestamp": model::timestamp::now(), "level": level, "message": message});
        if let Some(s) = step {
            e["step"] = json!(s);
        }
        self.logs.push(e);
    }
}

impl Default for Templates {
    fn default() -> Self {
        Templates {
            // No randomness: upload URLs then need the API key instead.
            key: model::ids::random_bytes::<32>().unwrap_or([0; 32]),
            builds: Mutex::default(),
        }
    }
}

impl Templates {
    fn get(&self, id: &str) -> Option<Arc<Mutex<Build>>> {
        lock(&self.builds).by_id.get(id).cloned()
    }

    fn insert(&self, id: String, b: Build) {
        let mut map = lock(&self.builds);
        while map.order.len() >= MAX_BUILDS {
            // The oldest finished build goes; if none has finished, the oldest.
            let at = map
                .order
                .iter()
                .position(|k| {
                    map.by_id
                        .get(k)
                        .is_some_and(|b| matches!(lock(b).phase, Phase::Ready | Phase::Error))
                })
                .unwrap_or(0);
            let gone = map.order.remove(at);
            map.by_id.remove(&gone);
        }
        map.order.push(id.clone());
        map.by_id.insert(id, Arc::new(Mutex::new(b)));
    }

    /// The signature of an upload URL for `template`'s files `hash`.
    fn signature(&self, template: &str, hash: &str) -> String {
        let d = Sha256::new()
            .chain_update(b"sandfork-e2b-upload\0")
            .chain_update(self.key)
            .chain_update(template.as_bytes())
            .chain_update(b"\0")
            .chain_update(hash.as_bytes())
            .finalize();
        build_plan::hex_bytes(&d)
    }

    fn signed(&self, template: &str, hash: &str, given: &str) -> bool {
        self.key != [0; 32]
            && bool::from(
                self.signature(template, hash)
                    .as_bytes()
                    .ct_eq(given.as_bytes()),
            )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the uploaded files of `template` are kept.
fn files_dir(s: &Shared, template: &str) -> PathBuf {
    s.manager
        .config()
        .data_dir
        .join("tmp")
        .join("e2b-templates")
        .join(template)
}

/// A template name as an image name: 1-64 of `[a-z0-9._-]`, not starting with `-`/`.`.
fn check_name(name: &str) -> Result<(), ApiErr> {
    if name.contains(':') {
        return Err(ApiErr::missing(
            "template tags (a name:tag build); build under a plain name",
        ));
    }
    if crate::manager::is_image_name(name) {
        Ok(())
    } else {
        Err(ApiErr::bad_request(format!(
            "Invalid template name {name:?}: sandfork names images with 1-64 of lowercase letters, digits, '-', '_' and '.'"
        )))
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(s: &Shared, req: Request) -> Result<T, ApiErr> {
    let (_, bytes) = super::control::read(s, req).await?;
    super::control::body(&bytes)
}

// Requesting a build -----------------------------------------------------------------

/// `TemplateBuildRequestV3`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BuildRequest {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
    min_free_disk_mb: Option<u64>,
}

async fn request_build(State(s): State<E2bState>, req: Request) -> Answer {
    let r: BuildRequest = read_json(&s, req).await?;
    let name = r
        .name
        .or(r.alias)
        .ok_or_else(|| ApiErr::bad_request("A template name is needed"))?;
    check_name(&name)?;
    if r.tags.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiErr::missing("template tags"));
    }
    if r.min_free_disk_mb.is_some_and(|m| m > 0) {
        return Err(ApiErr::missing(
            "minFreeDiskMb (a sandbox's disk grows as it is written, up to its size)",
        ));
    }
    if r.cpu_count == Some(0) || r.memory_mb.is_some_and(|m| m < 16) {
        return Err(ApiErr::bad_request(
            "cpuCount must be 1 or more and memoryMB 16 or more",
        ));
    }
    let build_id = model::ids::random_id::<16>("build").map_err(Error::from)?;
    s.templates.insert(
        build_id.clone(),
        Build {
            template: name.clone(),
            settings: Settings {
                cpu_count: r.cpu_count,
                memory_mb: r.memory_mb,
            },
            phase: Phase::Waiting,
            logs: Vec::new(),
            dropped: 0,
            reason: None,
        },
    );
    let body = json!({
        "templateID": name, "buildID": build_id, "public": false,
        "names": [name], "tags": [], "aliases": [name],
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

// Files --------------------------------------------------------------------------------

/// Whether a COPY's files are here; if not, where to PUT them (this daemon, signed).
async fn file_link(
    State(s): State<E2bState>,
    UrlPath((id, hash)): UrlPath<(String, String)>,
    req: Request,
) -> Answer {
    let (headers, _) = super::control::read(&s, req).await?;
    check_name(&id)?;
    if !build_plan::valid_hash(&hash) {
        return Err(ApiErr::bad_request(
            "A files hash is 64 lowercase hex digits",
        ));
    }
    if files_dir(&s, &id).join(&hash).is_dir() {
        return Ok((StatusCode::CREATED, Json(json!({"present": true}))).into_response());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiErr::bad_request("A Host header is needed for the upload URL"))?;
    let url = format!(
        "http://{host}/templates/{id}/files/{hash}?signature={}",
        s.templates.signature(&id, &hash)
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({"present": false, "url": url})),
    )
        .into_response())
}

/// The PUT of a COPY's files: a tar (gzip or not), unpacked safely into the template's
/// files under its hash.
async fn upload(
    State(s): State<E2bState>,
    UrlPath((id, hash)): UrlPath<(String, String)>,
    RawQuery(q): RawQuery,
    req: Request,
) -> Answer {
    check_name(&id)?;
    if !build_plan::valid_hash(&hash) {
        return Err(ApiErr::bad_request(
            "A files hash is 64 lowercase hex digits",
        ));
    }
    let signature = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "signature")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !s.templates.signed(&id, &hash, &signature) {
        super::control::check_key(&s, req.headers())?;
    }
    let dir = files_dir(&s, &id);
    let dest = dir.join(&hash);
    let tmp = model::ids::random_id::<8>(".upload").map_err(Error::from)?;
    let (tar, unpacked) = (dir.join(format!("{tmp}.tar")), dir.join(&tmp));
    let received = receive(&s, req.into_body(), &tar, &unpacked).await;
    let _ = tokio::fs::remove_file(&tar).await;
    if let Err(e) = received {
        let _ = tokio::fs::remove_dir_all(&unpacked).await;
        return Err(e.into());
    }
    if tokio::fs::rename(&unpacked, &dest).await.is_err() {
        // The same files arrived meanwhile (the hash names their content).
        let _ = tokio::fs::remove_dir_all(&unpacked).await;
    }
    Ok(StatusCode::OK.into_response())
}

/// Receives an upload and unpacks it as the image routes unpack a build context: the
/// upload within `max_import_bytes` and the disk floor, the unpacking within the same
/// cap, nothing written outside `context`.
async fn receive(
    s: &Shared,
    body: axum::body::Body,
    tar: &Path,
    context: &Path,
) -> Result<(), Error> {
    let ctx_err = |e: std::io::Error| Error::InvalidArgument(format!("Template files: {e}"));
    tokio::fs::create_dir_all(context).await.map_err(ctx_err)?;
    let config = s.manager.config();
    super::super::snapshots::receive(body, tar, config).await?;
    let limits = runtime::image::UnpackLimits {
        max_bytes: config.max_import_bytes,
        floor_bytes: crate::config::IMPORT_SPACE_FLOOR,
    };
    let (tar, context) = (tar.to_path_buf(), context.to_path_buf());
    tokio::task::spawn_blocking(move || {
        runtime::image::import_tarball(&tar, &context, limits, &|_| {})
    })
    .await
    .map_err(|e| Error::InvalidArgument(e.to_string()))?
    .map_err(|e| {
        let chain = model::error_chain(&e);
        match e {
            runtime::Error::TooLarge(_) => Error::TooLarge(format!("Template files: {chain}")),
            _ => Error::InvalidArgument(format!("Template files: {chain}")),
        }
    })
}

// Building -----------------------------------------------------------------------------

async fn start_build(
    State(s): State<E2bState>,
    UrlPath((id, build_id)): UrlPath<(String, String)>,
    req: Request,
) -> Answer {
    let start: BuildStart = read_json(&s, req).await?;
    let build = s
        .templates
        .get(&build_id)
        .filter(|b| lock(b).template == id)
        .ok_or_else(|| ApiErr::not_found(format!("Build {build_id} of template {id} not found")))?;
    let settings = {
        let mut b = lock(&build);
        if b.phase != Phase::Waiting {
            return Err(ApiErr::new(
                StatusCode::CONFLICT,
                format!("Build {build_id} was already started"),
            ));
        }
        b.phase = Phase::Building;
        b.settings.clone()
    };
    let prepared = prepare(&s, &id, &build_id, &start, &settings).await;
    let (plan, context, dockerfile) = match prepared {
        Ok(p) => p,
        Err(e) => {
            lock(&build).phase = Phase::Waiting;
            return Err(e);
        }
    };
    let s2 = s.clone();
    tokio::spawn(async move {
        run(&s2, &id, &build, plan, &context, &dockerfile).await;
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The base image, the plan and its Dockerfile written into the template's files.
async fn prepare(
    s: &Shared,
    id: &str,
    build_id: &str,
    start: &BuildStart,
    settings: &Settings,
) -> Result<(build_plan::Plan, PathBuf, String), ApiErr> {
    if start.from_image_registry.is_some() {
        return Err(ApiErr::missing(
            "fromImageRegistry (registry credentials of a template's base image)",
        ));
    }
    let from = base_image(s, start).await?;
    let base_user = match s.manager.image_details(&from).await {
        Ok(d) => d
            .user
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".into()),
        Err(_) => "root".into(),
    };
    let context = files_dir(s, id);
    tokio::fs::create_dir_all(&context)
        .await
        .map_err(|e| ApiErr::from(Error::InvalidArgument(format!("Template files: {e}"))))?;
    let plan = build_plan::plan(start, &from, &base_user, settings, build_id, &context)
        .map_err(|e| ApiErr::bad_request(e.0))?;
    let dockerfile = format!(".Dockerfile-{build_id}");
    tokio::fs::write(context.join(&dockerfile), &plan.dockerfile)
        .await
        .map_err(|e| ApiErr::from(Error::InvalidArgument(format!("Template files: {e}"))))?;
    Ok((plan, context, dockerfile))
}

/// The image a build starts from: `fromTemplate` an image (or `base`), `fromImage` an
/// image of that name, E2B's base image (`base`), or a registry reference the builder
/// pulls as a Dockerfile's FROM would.
async fn base_image(s: &Shared, start: &BuildStart) -> Result<String, ApiErr> {
    let default = || s.manager.config().default_image.clone();
    let exists = |name: String| async move { s.manager.image_details(&name).await.is_ok() };
    match (start.from_template.as_deref(), start.from_image.as_deref()) {
        (Some(t), _) => {
            if exists(t.to_string()).await {
                Ok(t.to_string())
            } else if t == "base" {
                Ok(default())
            } else {
                Err(ApiErr::not_found(format!(
                    "template '{t}' not found: build or pull an image of that name first"
                )))
            }
        }
        (None, Some(i)) => {
            let e2b_base = matches!(i, "base" | "e2bdev/base" | "e2bdev/base:latest");
            if e2b_base {
                Ok(if exists("base".into()).await {
                    "base".into()
                } else {
                    default()
                })
            } else if exists(i.to_string()).await || registry::looks_like_reference(i) {
                Ok(i.to_string())
            } else {
                Err(ApiErr::not_found(format!("image '{i}' not found")))
            }
        }
        (None, None) => Err(ApiErr::bad_request("fromImage or fromTemplate is needed")),
    }
}

/// Runs the build, its progress lines as log entries; then ready, or error with the
/// failing step named.
async fn run(
    s: &Shared,
    id: &str,
    build: &Arc<Mutex<Build>>,
    plan: build_plan::Plan,
    context: &Path,
    dockerfile: &str,
) {
    let started = std::time::SystemTime::now();
    // Dockerfile step number (1-based, FROM not counted) → E2B step.
    // Every line after FROM is one step of the builder.
    let step_of_df: BTreeMap<usize, usize> = plan
        .step_of_line
        .iter()
        .map(|(line, step)| (line - 1, *step))
        .collect();
    {
        let mut b = lock(build);
        b.log(
            "info",
            format!("Building image {id} with sandfork's Dockerfile builder"),
            None,
        );
        for line in plan.dockerfile.lines() {
            b.log("debug", format!("Dockerfile: {line}"), None);
        }
    }
    let (tx, mut rx) = mpsc::channel::<String>(256);
    let follower = {
        let build = build.clone();
        let step_of_df = step_of_df.clone();
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                let step = df_step(&line)
                    .and_then(|n| step_of_df.get(&n))
                    .map(|n| n.to_string());
                lock(&build).log("info", line, step);
            }
        })
    };
    let result = s
        .manager
        .build_dockerfile(id, context, dockerfile, &BTreeMap::new(), tx)
        .await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), follower).await;
    let _ = tokio::fs::remove_file(context.join(dockerfile)).await;
    let e = match result {
        Ok(image) => {
            prune(context, &plan.hashes, started).await;
            let mut b = lock(build);
            b.log(
                "info",
                format!("Image {} is ready ({})", image.name, image.layer_id),
                None,
            );
            b.phase = Phase::Ready;
            return;
        }
        Err(e) => e,
    };
    let message = e.message();
    let step = failed_step(&message, &plan.step_of_line);
    let text = match step {
        Some(n) => format!("Build step {n} failed: {message}"),
        None => format!("Build failed: {message}"),
    };
    let mut b = lock(build);
    b.log("error", text.clone(), step.map(|n| n.to_string()));
    let tail: Vec<Value> = b
        .logs
        .iter()
        .rev()
        .take(REASON_TAIL)
        .rev()
        .cloned()
        .collect();
    let mut reason = json!({"message": text, "logEntries": tail});
    if let Some(n) = step {
        reason["step"] = json!(n.to_string());
    }
    b.reason = Some(reason);
    b.phase = Phase::Error;
}

/// The Dockerfile step a progress line is about (`step 3/7: RUN …`).
fn df_step(line: &str) -> Option<usize> {
    let rest = line.strip_prefix("step ")?;
    let (n, _) = rest.split_once('/')?;
    n.parse().ok()
}

/// The E2B step of a build error (`Dockerfile line N: …`), else the only candidate of
/// an error that names no line.
fn failed_step(message: &str, step_of_line: &BTreeMap<usize, usize>) -> Option<usize> {
    let at = message.find("Dockerfile line ")? + "Dockerfile line ".len();
    let digits: String = message[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    step_of_line.get(&digits.parse().ok()?).copied()
}

/// After a build: the template's files that this build did not read, and that were
/// there before it started, are removed (a rebuild with the same files finds them).
async fn prune(context: &Path, keep: &[String], started: std::time::SystemTime) {
    let Ok(mut entries) = tokio::fs::read_dir(context).await else {
        return;
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        if !build_plan::valid_hash(&name) || keep.contains(&name) {
            continue;
        }
        let old = e
            .metadata()
            .await
            .and_then(|m| m.modified())
            .is_ok_and(|t| t < started);
        if old {
            let _ = tokio::fs::remove_dir_all(e.path()).await;
        }
    }
}

async fn status(
    State(s): State<E2bState>,
    UrlPath((id, build_id)): UrlPath<(String, String)>,
    RawQuery(q): RawQuery,
    req: Request,
) -> Answer {
    let _ = super::control::read(&s, req).await?;
    let p: HashMap<String, String> = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let number = |k: &str| -> Result<Option<usize>, ApiErr> {
        p.get(k)
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiErr::bad_request(format!("Invalid {k} {v:?}")))
            })
            .transpose()
    };
    let offset = number("logsOffset")?.unwrap_or(0);
    let limit = number("limit")?.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let level = p.get("level").cloned();
    let build = s
        .templates
        .get(&build_id)
        .filter(|b| lock(b).template == id)
        .ok_or_else(|| ApiErr::not_found(format!("Build {build_id} of template {id} not found")))?;
    let b = lock(&build);
    let entries: Vec<&Value> = b
        .logs
        .iter()
        .skip(offset)
        .filter(|e| level.as_ref().is_none_or(|l| at_least(e, l)))
        .take(limit)
        .collect();
    let mut out = json!({
        "templateID": id, "buildID": build_id, "status": b.phase.name(),
        "logEntries": entries, "logs": [],
    });
    if let Some(r) = &b.reason {
        out["reason"] = r.clone();
    }
    Ok(Json(out).into_response())
}

/// Whether a log entry is at `level` or above.
fn at_least(entry: &Value, level: &str) -> bool {
    let rank = |l: &str| match l {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    };
    rank(entry["level"].as_str().unwrap_or("info")) >= rank(level)
}

// Aliases, tags and the rest --------------------------------------------------------------

/// A template exists when an image of that name does (`base` always does).
async fn alias(State(s): State<E2bState>, UrlPath(alias): UrlPath<String>, req: Request) -> Answer {
    let _ = super::control::read(&s, req).await?;
    if alias == "base" || s.manager.image_details(&alias).await.is_ok() {
        return Ok(Json(json!({"templateID": alias, "public": false})).into_response());
    }
    Err(ApiErr::not_found(format!("template '{alias}' not found")))
}

async fn tags_missing(State(s): State<E2bState>, req: Request) -> Answer {
    let _ = super::control::read(&s, req).await?;
    Err(ApiErr::missing("template tags"))
}

async fn list_missing(State(s): State<E2bState>, req: Request) -> Answer {
    let _ = super::control::read(&s, req).await?;
    Err(ApiErr::missing(
        "listing templates (templates are images: GET /v1/images)",
    ))
}

async fn v1_missing(State(s): State<E2bState>, req: Request) -> Answer {
    let _ = super::control::read(&s, req).await?;
    Err(ApiErr::missing(
        "the v1 template build API (these SDKs use POST /v3/templates)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_their_e2b_step() {
        let lines = BTreeMap::from([(3, 2), (5, 4)]);
        let m = "Dockerfile line 5: Image build step \"step 4/6: RUN […]\" failed (Code(1)): boom";
        assert_eq!(failed_step(m, &lines), Some(4));
        assert_eq!(failed_step("Dockerfile line 9: x", &lines), None);
        assert_eq!(failed_step("no line", &lines), None);
        assert_eq!(df_step("step 12/30: RUN x"), Some(12));
        assert_eq!(df_step("step x"), None);
    }

    #[test]
    fn names_are_image_names_and_tags_are_refused() {
        assert!(check_name("my-template_1.0").is_ok());
        assert_eq!(check_name("t:v1").unwrap_err().status.as_u16(), 501);
        for bad in ["", "Upper", "../x", ".x", "a/b", &"x".repeat(65)] {
            assert_eq!(check_name(bad).unwrap_err().status.as_u16(), 400, "{bad}");
        }
    }

    #[test]
    fn upload_signatures_bind_template_and_hash() {
        let t = Templates::default();
        let sig = t.signature("a", "h");
        assert!(t.signed("a", "h", &sig));
        assert!(!t.signed("b", "h", &sig));
        assert!(!t.signed("a", "g", &sig));
        assert!(!t.signed("a", "h", ""));
    }

    #[test]
    fn routes_merge_with_the_control_plane() {
        let _ = super::super::control::routes().merge(routes());
    }
}
