//! API tests of the sandbox lifecycle, exec and error paths, on the real runtime.

mod common;

use common::*;
use hyper::{Method, StatusCode};
use serde_json::json;

#[test]
fn lifecycle_by_id_and_name() {
    let d = TestDaemon::start();
    let c = d.client();
    let id = d.create(json!({"name": "box-1", "memory_mb": 128, "labels": {"k": "v"}}));
    let (s, v) = c.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "running");
    assert_eq!(v["memory_mb"], 128);
    assert_eq!(v["labels"]["k"], "v");
    assert_eq!(c.get("/v1/sandboxes/box-1").1["id"], id.as_str());
    let (_, list) = c.get("/v1/sandboxes?name=box-1");
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
    let (_, list) = c.get("/v1/sandboxes?state=running");
    assert_eq!(list["sandboxes"][0]["id"], id.as_str());
    let (s, v) = c.json(Method::DELETE, "/v1/sandboxes/box-1", None);
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("terminated"))
    );
    let (s, v) = c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("terminated")),
        "idempotent"
    );
    let (s, v) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "true"})),
    );
    assert_error(s, &v, 409, "conflict");
    assert!(v["message"].as_str().unwrap().contains("terminated"), "{v}");
    assert!(
        host_traces(&d.data, &id).is_empty(),
        "{:?}",
        host_traces(&d.data, &id)
    );
    assert!(c.get("/v1/sandboxes").1["sandboxes"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn exec_collects_output_exit_code_stdin_env_and_cwd() {
    let d = TestDaemon::start();
    let id = d.create(json!({"env": {"FROM_SANDBOX": "s1"}, "secrets": {"TOKEN": "t0p"}}));
    let v = d.sh(&id, "echo out; echo err >&2; exit 3");
    assert_eq!(
        (
            v["stdout"].as_str(),
            v["stderr"].as_str(),
            v["exit_code"].as_i64()
        ),
        (Some("out\n"), Some("err\n"), Some(3))
    );
    assert_eq!(v["timed_out"], false);
    let body = json!({"command": "/bin/sh", "args": ["-c", "cat; echo $A $FROM_SANDBOX $TOKEN; pwd"],
        "stdin": "in-", "env": {"A": "a"}, "working_dir": "/tmp"});
    let (_, v) = d.client().json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(body),
    );
    assert_eq!(v["stdout"], "in-a s1 t0p\n/tmp\n");
    let (_, sb) = d.client().get(&format!("/v1/sandboxes/{id}"));
    assert!(
        !sb.to_string().contains("t0p"),
        "secrets are never echoed: {sb}"
    );
    let v = d.sh(&id, "printf '\\377\\000'");
    assert_eq!(v["stdout_b64"], "/wA=");
    let v = d.sh(&id, "kill -9 $$");
    assert_eq!(
        (v["exit_code"].is_null(), v["signal"].as_i64()),
        (true, Some(9))
    );
}

#[test]
fn exec_times_out_and_reports_unstartable_commands() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    let path = format!("/v1/sandboxes/{id}/exec");
    let (s, v) = c.json(
        Method::POST,
        &path,
        Some(json!({"command": "sleep", "args": ["30"], "timeout_secs": 0.5})),
    );
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["timed_out"], true, "{v}");
    assert!(v["duration_ms"].as_u64().unwrap() < 10_000);
    let (s, v) = c.json(Method::POST, &path, Some(json!({"command": "/bin/nope"})));
    assert_error(s, &v, 400, "exec_failed");
    let (s, v) = c.json(Method::POST, &path, Some(json!({"command": ""})));
    assert_error(s, &v, 400, "invalid_argument");
}

#[test]
fn exec_streams_ndjson_in_order_with_a_final_exit() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let body = json!({"command": "/bin/sh", "args": ["-c", "for i in 1 2 3; do echo $i; sleep 0.1; done; echo e >&2; exit 4"], "stream": true});
    let r = d.client().raw(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        "application/json",
        serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/x-ndjson");
    let lines = r.lines();
    let stdout: String = lines
        .iter()
        .filter(|l| l["type"] == "stdout")
        .map(|l| l["data"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "1\n2\n3\n");
    assert!(lines
        .iter()
        .any(|l| l["type"] == "stderr" && l["data"] == "e\n"));
    let last = lines.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["exit_code"].as_i64()),
        (Some("exit"), Some(4))
    );
}

#[test]
fn request_errors_have_the_right_status() {
    let d = TestDaemon::with(|c| c.max_json_bytes = 4096);
    let c = d.client();
    let r = c.raw(
        Method::POST,
        "/v1/sandboxes",
        "application/json",
        "{not json",
    );
    assert_error(r.status, &r.json(), 400, "invalid_argument");
    let (s, v) = c.json(Method::POST, "/v1/sandboxes", Some(json!({"imag": "x"})));
    assert_error(s, &v, 400, "invalid_argument");
    assert!(v["message"].as_str().unwrap().contains("imag"), "{v}");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": "busybox", "snapshot_id": "s"})),
    );
    assert_error(s, &v, 400, "invalid_argument");
    let big = json!({"labels": {"x": "y".repeat(10_000)}});
    let (s, v) = c.json(Method::POST, "/v1/sandboxes", Some(big));
    assert_error(s, &v, 413, "too_large");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"network": {"mode": "none"}, "deny_out": ["10.0.0.0/8"]})),
    );
    assert_error(s, &v, 422, "unsupported");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": "no-such-image"})),
    );
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"snapshot_id": "snap-x"})),
    );
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.get("/v1/sandboxes/sb-nope");
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes/sb-nope/exec",
        Some(json!({"command": "true"})),
    );
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.get("/v1/no/such/route");
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.get("/v1/sandboxes?state=bogus");
    assert_error(s, &v, 400, "invalid_argument");
    let (s, v) = c.json(Method::POST, "/v1/sandboxes/x/checkpoint", Some(json!({})));
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.get("/v1/snapshots/snap-nope");
    assert_error(s, &v, 404, "not_found");
}

#[test]
fn admission_refuses_over_capacity_and_names_conflict() {
    let d = TestDaemon::with(|c| {
        c.max_sandboxes = 2;
        c.max_memory_mb = 300;
        c.admission_wait_secs = 0;
    });
    let c = d.client();
    let a = d.create(json!({"name": "only", "memory_mb": 200}));
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"memory_mb": 200})),
    );
    assert_error(s, &v, 429, "over_capacity");
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"name": "only", "memory_mb": 16})),
    );
    assert_error(s, &v, 409, "conflict");
    d.create(json!({"memory_mb": 64}));
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"memory_mb": 16})),
    );
    assert_error(s, &v, 429, "over_capacity");
    assert!(
        v["message"].as_str().unwrap().contains("Sandbox limit"),
        "{v}"
    );
    c.json(Method::DELETE, &format!("/v1/sandboxes/{a}"), None);
    d.create(json!({"memory_mb": 200}));
    let (_, list) = c.get("/v1/sandboxes");
    assert_eq!(
        list["sandboxes"].as_array().unwrap().len(),
        2,
        "refusals left nothing behind"
    );
}

#[test]
fn idle_timeout_terminates_unnamed_sandboxes() {
    let d = TestDaemon::start();
    let id = d.create(json!({"timeout_secs": 1}));
    let c = d.client();
    assert!(eventually(15, || c.get(&format!("/v1/sandboxes/{id}")).1
        ["state"]
        == "terminated"));
    assert!(
        host_traces(&d.data, &id).is_empty(),
        "{:?}",
        host_traces(&d.data, &id)
    );
}

#[test]
fn tcp_listener_requires_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let d = TestDaemon::with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.token_file = Some(token_file.clone());
    });
    let addr = d.tcp.expect("tcp listener");
    let mut c = Client {
        socket: d.socket.clone(),
        tcp: Some(addr),
        token: None,
    };
    let (s, v) = c.get("/v1/health");
    assert_error(s, &v, 401, "unauthorized");
    c.token = Some("wrong".into());
    assert_eq!(c.get("/v1/health").0, StatusCode::UNAUTHORIZED);
    c.token = Some("s3cret-token".into());
    let (s, v) = c.get("/v1/health");
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    assert_eq!(
        d.client().get("/v1/health").0,
        StatusCode::OK,
        "the socket needs no token"
    );
}

#[test]
fn labels_are_patched_in_one_step() {
    let d = TestDaemon::start();
    let c = d.client();
    let id = d.create(json!({"memory_mb": 128, "labels": {"team": "rl", "run": "1"}}));
    let path = format!("/v1/sandboxes/{id}/labels");
    let (s, v) = c.json(
        Method::PATCH,
        &path,
        Some(json!({"set": {"run": "2"}, "remove": ["team"]})),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"labels": {"run": "2"}}));
    assert_eq!(
        c.get(&format!("/v1/sandboxes/{id}")).1["labels"],
        json!({"run": "2"})
    );
    let (s, v) = c.json(Method::PATCH, &path, Some(json!({"set": {"bad key": "x"}})));
    assert_error(s, &v, 400, "invalid_argument");
    let (s, v) = c.json(Method::PATCH, &path, Some(json!({"sett": {}})));
    assert_error(s, &v, 400, "invalid_argument");
    c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
}

#[test]
fn stats_report_cpu_memory_disk_and_network_and_metrics_carry_labels() {
    let d = TestDaemon::start();
    let c = d.client();
    let id = d.create(json!({
        "memory_mb": 128, "labels": {"team": "rl"}, "network": {"mode": "internet"}
    }));
    let stats = |id: &str| {
        let (s, v) = c.get(&format!("/v1/sandboxes/{id}/stats"));
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    };
    let before = stats(&id);
    assert_eq!(before["id"], id.as_str());
    assert_eq!(before["memory_limit_bytes"], 128 << 20, "{before}");
    assert!(before["pids"].as_u64().unwrap() >= 1, "{before}");
    assert!(before["disk_total_bytes"].as_u64().unwrap() > 0, "{before}");
    // CPU, 20 MiB written, TCP connections tried to the sandbox's own gateway (the host end
    // of its link: refused or dropped, but sent).
    let gw = {
        let v = d.sh(&id, "ip route 2>/dev/null | awk '/default/ {print $3}'");
        v["stdout"].as_str().unwrap().trim().to_string()
    };
    let script = format!(
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; \
         dd if=/dev/urandom of=/big bs=1M count=20 2>/dev/null; sync; \
         for n in 1 2 3 4 5; do nc -w 1 {gw} 9 </dev/null || true; done"
    );
    let r = d.sh(&id, &script);
    assert_eq!(r["exit_code"], 0, "{r}");
    let after = stats(&id);
    let n = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(
        n(&after, "cpu_seconds") > n(&before, "cpu_seconds"),
        "{before} {after}"
    );
    assert!(
        n(&after, "disk_used_bytes") >= n(&before, "disk_used_bytes") + 19.0 * 1048576.0,
        "{before} {after}"
    );
    assert!(
        n(&after, "net_tx_packets") >= n(&before, "net_tx_packets") + 5.0,
        "{gw:?} {r} {before} {after}"
    );
    assert!(n(&after, "memory_bytes") > 0.0, "{after}");

    let (s, text) = {
        let r = c.raw(Method::GET, "/metrics", "text/plain", Vec::new());
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    };
    assert_eq!(s, StatusCode::OK);
    let series = format!("sandfork_sandbox_memory_limit_bytes{{sandbox=\"{id}\",name=\"\",image=");
    let line = text
        .lines()
        .find(|l| l.starts_with(&series))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("label_team=\"rl\"") && line.ends_with(" 134217728"),
        "{line}"
    );

    let (s, v) = c.get("/v1/sandboxes/sb-nope/stats");
    assert_error(s, &v, 404, "not_found");
    c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
    let (s, v) = c.get(&format!("/v1/sandboxes/{id}/stats"));
    assert_error(s, &v, 409, "conflict");
}
