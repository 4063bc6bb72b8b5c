//! API tests of background processes, files, images, metrics and the OpenAPI route.

mod common;

use common::*;
use hyper::{Method, StatusCode};
use serde_json::json;

#[test]
fn background_processes_output_stdin_signal_wait() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    let base = format!("/v1/sandboxes/{id}/processes");
    let (s, p) = c.json(
        Method::POST,
        &base,
        Some(json!({"command": "/bin/sh", "args": ["-c", "echo started; cat; echo done"]})),
    );
    assert_eq!(s, StatusCode::CREATED, "{p}");
    assert_eq!(
        (p["command"].as_str(), p["state"].as_str()),
        (Some("/bin/sh"), Some("running"))
    );
    let pid = p["pid"].as_u64().unwrap();
    let r = c.raw(
        Method::POST,
        &format!("{base}/{pid}/stdin"),
        "application/octet-stream",
        "fed\n",
    );
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.json());
    let r = c.raw(Method::POST, &format!("{base}/{pid}/stdin/close"), "", "");
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let (s, p) = c.json(
        Method::POST,
        &format!("{base}/{pid}/wait?timeout_secs=10"),
        None,
    );
    assert_eq!(
        (s, p["state"].as_str(), p["exit_code"].as_i64()),
        (StatusCode::OK, Some("exited"), Some(0)),
        "{p}"
    );
    let r = c.raw(
        Method::GET,
        &format!("{base}/{pid}/output?follow=false"),
        "",
        "",
    );
    let out: String = r
        .lines()
        .iter()
        .filter(|l| l["type"] == "stdout")
        .map(|l| l["data"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(out, "started\nfed\ndone\n");
    let r = c.raw(
        Method::GET,
        &format!("{base}/{pid}/output?offset=8"),
        "",
        "",
    );
    let first = &r.lines()[0];
    assert_eq!(
        (first["offset"].as_u64(), first["data"].as_str()),
        (Some(8), Some("fed\ndone\n")),
        "{first}"
    );
    assert_eq!(r.lines().last().unwrap()["type"], "exit");
    let r = c.raw(Method::GET, &format!("{base}/987654/output"), "", "");
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.json());

    let (_, p) = c.json(
        Method::POST,
        &base,
        Some(json!({"command": "sleep", "args": ["60"]})),
    );
    let pid2 = p["pid"].as_u64().unwrap();
    let (s, p) = c.json(
        Method::POST,
        &format!("{base}/{pid2}/wait?timeout_secs=0.2"),
        None,
    );
    assert_eq!((s, p["state"].as_str()), (StatusCode::OK, Some("running")));
    let (s, v) = c.json(
        Method::POST,
        &format!("{base}/{pid2}/signal"),
        Some(json!({"signal": "TERM"})),
    );
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (_, p) = c.json(
        Method::POST,
        &format!("{base}/{pid2}/wait?timeout_secs=10"),
        None,
    );
    assert_eq!(p["signal"].as_i64(), Some(15), "{p}");
    let (_, list) = c.get(&base);
    assert_eq!(list["processes"].as_array().unwrap().len(), 2);
    assert_eq!(
        c.get(&format!("{base}/{pid2}")).1["pid"].as_u64(),
        Some(pid2)
    );
    let (s, v) = c.get(&format!("{base}/999"));
    assert_error(s, &v, 404, "not_found");
    // A word names a supervised process; none is called so.
    let (s, v) = c.get(&format!("{base}/abc"));
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.get(&format!("{base}/%01"));
    assert_error(s, &v, 400, "invalid_argument");
    let (s, v) = c.json(
        Method::POST,
        &format!("{base}/{pid2}/signal"),
        Some(json!({"signal": "BOGUS"})),
    );
    assert_error(s, &v, 400, "invalid_argument");
}

#[test]
fn files_round_trip_list_stat_mkdir_remove() {
    let d = TestDaemon::with(|c| c.max_upload_bytes = 4 << 20);
    let id = d.create(json!({}));
    let c = d.client();
    let files = format!("/v1/sandboxes/{id}/files");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let r = c.raw(
        Method::PUT,
        &format!("{files}?path=/data/deep/blob.bin&mode=0600"),
        "application/octet-stream",
        data.clone(),
    );
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.json());
    let r = c.raw(
        Method::GET,
        &format!("{files}?path=/data/deep/blob.bin"),
        "",
        "",
    );
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body == data, "downloaded bytes differ");
    let (s, st) = c.get(&format!("{files}/stat?path=/data/deep/blob.bin"));
    assert_eq!(
        (
            s,
            st["type"].as_str(),
            st["size"].as_u64(),
            st["mode"].as_u64()
        ),
        (StatusCode::OK, Some("file"), Some(3_000_000), Some(0o600))
    );
    let (s, v) = c.json(
        Method::POST,
        &format!("{files}/mkdir"),
        Some(json!({"path": "/data/sub/dir"})),
    );
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (_, list) = c.get(&format!("{files}/list?path=/data"));
    let mut names: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["deep", "sub"]);
    assert!(list["entries"][0]["path"]
        .as_str()
        .unwrap()
        .starts_with("/data/"));
    let r = c.raw(Method::DELETE, &format!("{files}?path=/data/deep"), "", "");
    assert_eq!(
        r.status.as_u16() / 100,
        4,
        "non-recursive remove of a directory is refused"
    );
    let r = c.raw(
        Method::DELETE,
        &format!("{files}?path=/data/deep&recursive=true"),
        "",
        "",
    );
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let (s, v) = c.get(&format!("{files}/stat?path=/data/deep/blob.bin"));
    assert_error(s, &v, 404, "not_found");
    let r = c.raw(Method::GET, &format!("{files}?path=/nope"), "", "");
    assert_error(r.status, &r.json(), 404, "not_found");
    let r = c.raw(Method::GET, &format!("{files}?path=relative"), "", "");
    assert_error(r.status, &r.json(), 400, "invalid_argument");
    let big = vec![7u8; 5 << 20];
    let r = c.raw(
        Method::PUT,
        &format!("{files}?path=/big"),
        "application/octet-stream",
        big,
    );
    assert_error(r.status, &r.json(), 413, "too_large");
    let (s, _) = c.get(&format!("{files}/stat?path=/big"));
    assert_eq!(s, StatusCode::NOT_FOUND, "a refused upload leaves no file");
}

#[test]
fn images_list_build_delete() {
    let d = TestDaemon::start();
    let c = d.client();
    let body = json!({"name": "bb2", "builder": "busybox"});
    let r = c.raw(
        Method::POST,
        "/v1/images",
        "application/json",
        serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(r.status, StatusCode::OK);
    let lines = r.lines();
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "done", "{lines:?}");
    assert_eq!(last["image"]["name"], "bb2");
    assert!(lines.iter().any(|l| l["type"] == "progress"));
    let (_, list) = c.get("/v1/images");
    assert!(list["images"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "bb2"));
    let id = d.create(json!({"image": "bb2"}));
    assert_eq!(d.sh(&id, "echo ok")["stdout"], "ok\n");
    let r = c.raw(Method::DELETE, "/v1/images/bb2", "", "");
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        d.sh(&id, "echo still")["stdout"],
        "still\n",
        "deleting an image keeps its users"
    );
    let r = c.raw(Method::DELETE, "/v1/images/bb2", "", "");
    assert_error(r.status, &r.json(), 404, "not_found");
    let (s, v) = c.json(
        Method::POST,
        "/v1/images",
        Some(json!({"name": "x", "builder": "alpine"})),
    );
    assert_error(s, &v, 400, "invalid_argument");
    let (s, v) = c.json(
        Method::POST,
        "/v1/images",
        Some(json!({"name": "x", "builder": "busybox", "apt": ["curl"]})),
    );
    assert_error(s, &v, 422, "unsupported");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn metrics_move_and_openapi_is_served() {
    let d = TestDaemon::start();
    let c = d.client();
    let text = |c: &Client| {
        String::from_utf8(c.raw(Method::GET, "/metrics", "", "").body.to_vec()).unwrap()
    };
    let before = text(&c);
    let id = d.create(json!({}));
    d.sh(&id, "true");
    c.get("/v1/sandboxes/sb-missing");
    let after = text(&c);
    for (name, delta) in [
        ("sandfork_create_seconds_count", 1.0),
        ("sandfork_exec_seconds_count", 1.0),
        ("sandfork_errors_total{kind=\"not_found\"}", 1.0),
        ("sandfork_sandboxes{state=\"running\"}", 1.0),
    ] {
        assert_eq!(
            metric(&after, name) - metric(&before, name),
            delta,
            "{name}\n{after}"
        );
    }
    c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
    let end = text(&c);
    assert_eq!(
        metric(&end, "sandfork_sandboxes{state=\"terminated\"}"),
        1.0
    );
    let r = c.raw(Method::GET, "/v1/openapi.json", "", "");
    assert_eq!(
        String::from_utf8(r.body.to_vec()).unwrap(),
        server::api::openapi_json()
    );
    let (s, h) = c.get("/v1/health");
    assert_eq!((s, h["api_version"].as_u64()), (StatusCode::OK, Some(1)));
}

#[test]
fn checkpoint_and_restore_metrics_move() {
    let d = TestDaemon::start();
    let c = d.client();
    let text = |c: &Client| {
        String::from_utf8(c.raw(Method::GET, "/metrics", "", "").body.to_vec()).unwrap()
    };
    let id = d.create(json!({}));
    let before = text(&c);
    let (s, snap) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/checkpoint"),
        Some(json!({"type": "filesystem"})),
    );
    assert_eq!(s, StatusCode::CREATED, "{snap}");
    let child = d.create(json!({"snapshot_id": snap["id"]}));
    assert_eq!(d.sh(&child, "echo restored")["stdout"], "restored\n");
    let after = text(&c);
    for name in [
        "sandfork_checkpoint_seconds_count",
        "sandfork_restore_seconds_count",
    ] {
        assert_eq!(
            metric(&after, name) - metric(&before, name),
            1.0,
            "{name}\n{after}"
        );
    }
}
