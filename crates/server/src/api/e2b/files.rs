//! envd's `GET /health`, `GET /files` (download) and `POST /files` (upload, multipart or
//! raw, gzip or not), over the daemon's streamed file calls. Uploads are bounded by the
//! daemon's `max_upload_bytes`.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use futures::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::envd::{self, Ctx, Refusal};
use super::errors::{files_error, sandbox_gone, unauthorized, ApiErr};
use super::multipart::{boundary, Multipart, Reader, Source};
use super::{users, E2bState, Shared};
use crate::backend::{BackendError, WriteAs, STREAM_DEPTH};
use crate::error::Error;

/// `GET /health`: 204 while the sandbox runs.
pub async fn health(State(s): State<E2bState>, headers: HeaderMap) -> Response {
    let id = envd::sandbox_id(&headers);
    match s.manager.get(&id) {
        Ok(v) if envd::reachable(&v) => StatusCode::NO_CONTENT.into_response(),
        _ => sandbox_gone(&id),
    }
}

fn params(raw: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// A signed URL's signature: `v1_` + unpadded base64 of a SHA-256 over path, operation,
/// user, the access token and the expiry (when there is one).
pub fn signature(path: &str, op: &str, user: &str, token: &str, expires: Option<&str>) -> String {
    let mut msg = format!("{path}:{op}:{user}:{token}");
    if let Some(e) = expires {
        msg.push(':');
        msg.push_str(e);
    }
    let digest = Sha256::digest(msg.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The sandbox of a `/files` request: opened by its access token, or by a signature.
fn admit(
    s: &Shared,
    headers: &HeaderMap,
    p: &HashMap<String, String>,
    op: &str,
) -> Result<String, Refusal> {
    if headers.contains_key("x-access-token") {
        return envd::admit(s, headers);
    }
    let named = envd::sandbox_id(headers);
    if named.is_empty() {
        let refused = ApiErr::bad_request(
            "a signed URL needs the E2b-Sandbox-Id header: sandfork serves every sandbox's \
             envd at one origin, so the URL alone cannot name its sandbox",
        );
        return Err(Box::new(refused.into_response()));
    }
    let id = match s.manager.get(&named) {
        Ok(v) if envd::reachable(&v) => v.id,
        _ => return Err(Box::new(sandbox_gone(&named))),
    };
    let Some(given) = p.get("signature") else {
        return Err(Box::new(unauthorized()));
    };
    let token =
        envd::access_token(s, &id).map_err(|e| Box::new(ApiErr::from(e).into_response()))?;
    let path = p.get("path").map(String::as_str).unwrap_or_default();
    let user = p.get("username").map(String::as_str).unwrap_or_default();
    let expires = p.get("signature_expiration").map(String::as_str);
    let want = signature(path, op, user, &token, expires);
    if !bool::from(want.as_bytes().ct_eq(given.as_bytes())) {
        let refused = ApiErr::new(StatusCode::UNAUTHORIZED, "invalid signature");
        return Err(Box::new(refused.into_response()));
    }
    let expired = expires.is_some_and(|e| {
        e.parse::<u64>()
            .map_or(true, |e| e < crate::manager::unix_now())
    });
    if expired {
        let refused = ApiErr::new(StatusCode::UNAUTHORIZED, "signature is already expired");
        return Err(Box::new(refused.into_response()));
    }
    Ok(id)
}

/// Admission, then the account (`?username=` or `Authorization`).
async fn context(
    s: &Shared,
    headers: &HeaderMap,
    p: &HashMap<String, String>,
    op: &str,
) -> Result<Ctx, Refusal> {
    let id = admit(s, headers, p, op)?;
    let named = p
        .get("username")
        .cloned()
        .or_else(|| users::named_user(headers));
    Ctx::new(s, id, named.as_deref())
        .await
        .map_err(|m| Box::new(ApiErr::new(StatusCode::UNAUTHORIZED, m).into_response()))
}

/// `GET /files?path=…`: the file's bytes, streamed.
pub async fn download(State(s): State<E2bState>, RawQuery(q): RawQuery, req: Request) -> Response {
    let p = params(q.as_deref());
    let ctx = match context(&s, req.headers(), &p, "read").await {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    let given = p.get("path").map(String::as_str).unwrap_or_default();
    let path = match ctx.path(given) {
        Ok(p) => p,
        Err(m) => return ApiErr::bad_request(m).into_response(),
    };
    let chunks = match s.manager.read_file(&ctx.id, &path).await {
        Ok((st, _)) if st.kind == proto::agent::FileKind::Dir => {
            return ApiErr::bad_request(format!("path '{path}' is a directory")).into_response()
        }
        Ok((_, chunks)) => chunks,
        Err(e) => return files_error(e, &path),
    };
    let body =
        ReceiverStream::new(chunks).map(|c| c.map_err(|e| std::io::Error::other(e.to_string())));
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

/// `POST /files`: one file per multipart part, or the raw body to `?path=`.
pub async fn upload(State(s): State<E2bState>, RawQuery(q): RawQuery, req: Request) -> Response {
    let p = params(q.as_deref());
    let ctx = match context(&s, req.headers(), &p, "write").await {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    if req
        .headers()
        .keys()
        .any(|k| k.as_str().starts_with("x-metadata-"))
    {
        // Read (and drop) the upload first: a client still sending it gets the answer.
        drain(req.into_body()).await;
        return ApiErr::missing("file metadata (X-Metadata-* headers on uploads)").into_response();
    }
    match write_all(&s, &ctx, &p, req).await {
        Ok(written) => Json(Value::Array(written)).into_response(),
        Err((e, path)) => files_error(e, &path),
    }
}

/// Reads and drops a refused upload, within bounds.
async fn drain(body: Body) {
    const MAX_DRAIN: usize = 64 << 20;
    let mut stream = body.into_data_stream();
    let read = async {
        let mut seen = 0;
        while let Some(Ok(c)) = stream.next().await {
            seen += c.len();
            if seen > MAX_DRAIN {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
}

type Failed = (Error, String);

async fn write_all(
    s: &Shared,
    ctx: &Ctx,
    p: &HashMap<String, String>,
    req: Request,
) -> Result<Vec<Value>, Failed> {
    let headers = req.headers().clone();
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"));
    let reader = Reader::new(req.into_body(), gzip, s.manager.config().max_upload_bytes);
    let query_path = p.get("path").filter(|p| !p.is_empty());
    let resolve = |given: &str| {
        ctx.path(given)
            .map_err(|m| (Error::InvalidArgument(m), given.to_string()))
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let Some(b) = boundary(content_type) else {
        let Some(given) = query_path else {
            let e = Error::InvalidArgument("an upload that is not multipart needs ?path=".into());
            return Err((e, String::new()));
        };
        let path = resolve(given)?;
        write_one(s, ctx, &path, reader).await?;
        return Ok(vec![written(&path)]);
    };
    let mut form = Multipart::new(reader, &b);
    let mut out = Vec::new();
    while let Some(part) = form.next_part().await.map_err(|e| (e, String::new()))? {
        if part.head.filename.is_none() && part.head.name.as_deref() != Some("file") {
            continue;
        }
        let given = match (query_path, &part.head.filename) {
            (Some(q), _) => q.clone(),
            (None, Some(f)) => f.clone(),
            (None, None) => {
                let e = Error::InvalidArgument("a part without a filename needs ?path=".into());
                return Err((e, String::new()));
            }
        };
        let path = resolve(&given)?;
        write_one(s, ctx, &path, part).await?;
        out.push(written(&path));
    }
    if out.is_empty() {
        let e = Error::InvalidArgument("the upload holds no file".into());
        return Err((e, String::new()));
    }
    Ok(out)
}

fn written(path: &str) -> Value {
    let name = path.rsplit('/').next().unwrap_or_default();
    json!({"path": path, "name": name, "type": "file"})
}

/// Streams one file from `src` into the sandbox; it then belongs to the request's user.
/// The body is read on a task of its own, so parsing it and writing to the agent overlap.
async fn write_one<S: Source + Send + 'static>(
    s: &Shared,
    ctx: &Ctx,
    path: &str,
    mut src: S,
) -> Result<(), Failed> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    let feed = tokio::spawn(async move {
        loop {
            match src.chunk().await {
                Ok(Some(b)) => {
                    if tx.send(Ok(b)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    let _ = tx
                        .send(Err(BackendError::InvalidInput(e.to_string())))
                        .await;
                    return Err(e);
                }
            }
        }
    });
    // The file, and the directories the write makes, belong to the request's user.
    let how = WriteAs {
        mode: None,
        owner: (ctx.account.uid != 0).then_some((ctx.account.uid, ctx.account.gid)),
    };
    let wrote = s.manager.write_file(&ctx.id, path, how, rx).await;
    let fed = feed.await.unwrap_or_else(|e| {
        Err(Error::Backend(BackendError::Host(format!(
            "the upload's reader failed: {e}"
        ))))
    });
    fed.map_err(|e| (e, path.to_string()))?;
    wrote.map_err(|e| (e, path.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks() {
        // sha256("/home/user/x.txt:read::ea_t") in unpadded base64, as both SDKs compute it
        let sig = signature("/home/user/x.txt", "read", "", "ea_t", None);
        assert!(sig.starts_with("v1_") && !sig.ends_with('='));
        assert_ne!(
            sig,
            signature("/home/user/x.txt", "write", "", "ea_t", None)
        );
        assert_ne!(
            sig,
            signature("/home/user/x.txt", "read", "", "ea_t", Some("1"))
        );
    }
}
