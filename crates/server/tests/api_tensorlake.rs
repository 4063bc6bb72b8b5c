//! The Tensorlake SDKs' routes (tests/compat/tensorlake/WIRE.md) on the real runtime,
//! spoken as the SDKs speak them: both lifecycle path shapes, the data plane routed by
//! `Host: {id}.local` or `X-Tensorlake-Sandbox-Id`, server-sent events, and the refusals
//! that name a missing feature. The SDKs themselves run in tests/compat/tensorlake.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The JSON of each `data:` line of a server-sent event stream.
    fn events(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }
}

/// One request over the daemon's socket with the headers given (`host` among them).
fn send(
    d: &TestDaemon,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    let socket = d.socket.clone();
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    d.rt.block_on(async move {
        let s = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = send.send_request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        Answer {
            status: parts.status,
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            body: body.collect().await.unwrap().to_bytes(),
        }
    })
}

fn json_body(v: Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&v).unwrap())
}

const NS: &str = "/v1/namespaces/default";

#[test]
fn both_path_shapes_and_the_data_plane_reach_one_sandbox() {
    let d = TestDaemon::start();
    let local = [("host", "localhost:7070")];
    let body = json!({"image": "busybox", "resources": {"cpus": 1.0, "memory_mb": 128},
        "name": "tl-one", "unknown_field": true});
    let created = send(
        &d,
        Method::POST,
        &format!("{NS}/sandboxes"),
        &local,
        json_body(body),
    );
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let c = created.json();
    assert_eq!(c["status"], "running");
    assert_eq!(c["sandbox_url"], "http://localhost:7070");
    let id = c["sandbox_id"].as_str().unwrap().to_string();

    // The flat shape of a sandbox.X host, by name.
    let flat = [("host", "sandbox.example.test:7070")];
    let got = send(&d, Method::GET, "/sandboxes/tl-one", &flat, Bytes::new());
    let g = got.json();
    assert_eq!(
        (got.status, g["id"].as_str()),
        (StatusCode::OK, Some(id.as_str()))
    );
    assert_eq!(g["namespace"], "default");
    assert_eq!(g["sandbox_url"], "http://sandbox.example.test:7070");
    assert_eq!(g["resources"]["memory_mb"], 128);
    assert!(
        g.get("sandbox_id").is_none(),
        "the SDKs refuse id and sandbox_id together"
    );

    // A run as server-sent events, the exit last.
    let host = format!("{id}.local");
    let by_host = [("host", host.as_str())];
    let run = json!({"command": "sh", "args": ["-c", "echo a; echo b >&2; printf c; exit 2"]});
    let ran = send(
        &d,
        Method::POST,
        "/api/v1/processes/run",
        &by_host,
        json_body(run),
    );
    assert_eq!(ran.status, StatusCode::OK);
    assert!(
        ran.content_type.starts_with("text/event-stream"),
        "{}",
        ran.content_type
    );
    let events = ran.events();
    let lines: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.get("line").is_some())
        .map(|e| {
            (
                e["stream"].as_str().unwrap().into(),
                e["line"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(lines.len(), 3, "{events:?}");
    assert!(lines.contains(&("stdout".into(), "a".into())));
    assert!(lines.contains(&("stderr".into(), "b".into())));
    assert!(
        lines.contains(&("stdout".into(), "c".into())),
        "the last line without a newline"
    );
    let exit = events.last().unwrap();
    assert_eq!(
        (exit["exit_code"].as_i64(), exit["reason"].as_str()),
        (Some(2), Some("exited"))
    );

    // Files by the header, a listing, a missing file.
    let by_header = [
        ("host", "sandbox.example.test:7070"),
        ("x-tensorlake-sandbox-id", id.as_str()),
    ];
    let put = send(
        &d,
        Method::PUT,
        "/api/v1/files?path=/tmp/d/f.txt",
        &by_header,
        Bytes::from_static(b"hi\n"),
    );
    assert!(put.status.is_success(), "{:?}", put.json());
    let read = send(
        &d,
        Method::GET,
        "/api/v1/files?path=/tmp/d/f.txt",
        &by_header,
        Bytes::new(),
    );
    assert_eq!(
        (read.status, &read.body[..]),
        (StatusCode::OK, &b"hi\n"[..])
    );
    let ls = send(
        &d,
        Method::GET,
        "/api/v1/files/list?path=/tmp/d",
        &by_header,
        Bytes::new(),
    )
    .json();
    assert_eq!(
        ls["entries"],
        json!([{"name": "f.txt", "is_dir": false, "size": 3, "modified_at": ls["entries"][0]["modified_at"]}])
    );
    let missing = send(
        &d,
        Method::GET,
        "/api/v1/files?path=/nope",
        &by_header,
        Bytes::new(),
    );
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // A resize is answered in resource_resize, as failed and why.
    let patch = json!({"resources": {"cpus": 2.0}});
    let upd = send(
        &d,
        Method::PATCH,
        &format!("{NS}/sandboxes/{id}"),
        &local,
        json_body(patch),
    )
    .json();
    assert_eq!(upd["resource_resize"]["status"], "failed");
    assert!(upd["resource_resize"]["error_message"]
        .as_str()
        .unwrap()
        .contains("resize"));

    let gone = send(
        &d,
        Method::DELETE,
        &format!("{NS}/sandboxes/{id}"),
        &local,
        Bytes::new(),
    );
    assert!(gone.status.is_success());
    let again = send(
        &d,
        Method::GET,
        &format!("{NS}/sandboxes/{id}"),
        &local,
        Bytes::new(),
    )
    .json();
    assert_eq!(again["status"], "terminated");
    assert!(again["sandbox_url"].is_null());
}

#[test]
fn what_sandfork_lacks_is_refused_by_name() {
    let d = TestDaemon::start();
    let local = [("host", "localhost:7070")];
    let pools = send(
        &d,
        Method::POST,
        &format!("{NS}/sandbox-pools"),
        &local,
        json_body(json!({"image": "x"})),
    );
    assert_eq!(pools.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(pools.json()["code"], "unsupported");
    assert!(pools.json()["message"].as_str().unwrap().contains("pools"));
    let gpus =
        json!({"resources": {"cpus": 1, "memory_mb": 128, "gpus": [{"count": 1, "model": "x"}]}});
    let refused = send(
        &d,
        Method::POST,
        &format!("{NS}/sandboxes"),
        &local,
        json_body(gpus),
    );
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused.json()["message"].as_str().unwrap().contains("GPU"));
    let nobody = send(&d, Method::GET, "/api/v1/health", &local, Bytes::new());
    assert_eq!(
        nobody.status,
        StatusCode::BAD_REQUEST,
        "a data-plane request must name its sandbox"
    );
    let unknown = [("host", "sb-0000000000000000.local")];
    let missing = send(&d, Method::GET, "/api/v1/health", &unknown, Bytes::new());
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[test]
fn a_terminal_session_opens_only_with_its_token() {
    let d = TestDaemon::start();
    let id = d.create(json!({"memory_mb": 128}));
    let host = format!("{id}.local");
    let by_host = [("host", host.as_str())];
    let pty = json!({"command": "/bin/sh", "rows": 24, "cols": 80});
    let session = send(&d, Method::POST, "/api/v1/pty", &by_host, json_body(pty)).json();
    let sid = session["session_id"].as_str().unwrap().to_string();
    assert_eq!(session["token"].as_str().unwrap().len(), 64);
    let upgrade = |token: &str| {
        let headers = [
            ("host", host.as_str()),
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("x-pty-token", token),
        ];
        send(
            &d,
            Method::GET,
            &format!("/api/v1/pty/{sid}/ws"),
            &headers,
            Bytes::new(),
        )
        .status
    };
    assert_eq!(upgrade("not-the-token"), StatusCode::FORBIDDEN);
    assert_eq!(
        upgrade(session["token"].as_str().unwrap()),
        StatusCode::SWITCHING_PROTOCOLS
    );
    let killed = send(
        &d,
        Method::DELETE,
        &format!("/api/v1/pty/{sid}"),
        &by_host,
        Bytes::new(),
    );
    assert!(killed.status.is_success());
}
