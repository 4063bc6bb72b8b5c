//! API tests of supervised processes (names, restart policies, health checks, stop and
//! restart), stdin and output modes, entrypoints, and sandbox updates. As root: real
//! sandboxes.

mod common;

use common::*;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

fn spawn(c: &Client, id: &str, body: Value) -> Value {
    let (s, p) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(body),
    );
    assert_eq!(s, StatusCode::CREATED, "{p}");
    p
}

fn process(c: &Client, id: &str, pid_or_name: &str) -> Value {
    let (s, p) = c.get(&format!("/v1/sandboxes/{id}/processes/{pid_or_name}"));
    assert_eq!(s, StatusCode::OK, "{p}");
    p
}

#[test]
fn a_named_process_is_restarted_on_failure_and_found_by_name() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    let first = spawn(
        &c,
        &id,
        json!({"command": "sh", "args": ["-c", "echo run; sleep 60"], "name": "worker",
               "restart": {"policy": "on_failure", "initial_backoff_ms": 50}}),
    );
    assert_eq!(first["name"], "worker");
    assert_eq!(first["managed"]["status"], "running", "{first}");
    assert_eq!(first["managed"]["restart"]["policy"], "on_failure");
    let pid = first["pid"].as_u64().unwrap();
    let (s, _) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/worker/signal"),
        Some(json!({"signal": "KILL"})),
    );
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(
        eventually(10, || {
            let p = process(&c, &id, "worker");
            p["pid"].as_u64() != Some(pid) && p["state"] == "running"
        }),
        "restarted under the same name"
    );
    let again = process(&c, &id, "worker");
    assert_eq!(again["managed"]["restart_count"], 1, "{again}");
    assert_eq!(again["managed"]["last_exit"]["signal"], 9, "{again}");
    let old = process(&c, &id, &pid.to_string());
    assert_eq!(
        (old["state"].as_str(), old["status"].as_str()),
        (Some("exited"), Some("signaled"))
    );
    assert!(old["ended_at"].is_string(), "{old}");
    let (s, v) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(json!({"command": "true", "name": "worker"})),
    );
    assert_error(s, &v, 409, "conflict");
    let (s, v) = c.get(&format!("/v1/sandboxes/{id}/processes/nobody"));
    assert_error(s, &v, 404, "not_found");
    let (s, v) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(json!({"command": "true", "name": "123"})),
    );
    assert_error(s, &v, 400, "invalid_argument");
}

#[test]
fn stop_ends_supervision_and_restart_starts_a_new_run() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    let first = spawn(
        &c,
        &id,
        json!({"command": "sleep", "args": ["60"], "name": "svc",
               "restart": {"policy": "always", "initial_backoff_ms": 50}}),
    );
    let (s, restarted) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/svc/restart"),
        None,
    );
    assert_eq!(s, StatusCode::OK, "{restarted}");
    assert_ne!(restarted["pid"], first["pid"], "a new run");
    assert_eq!(restarted["state"], "running");
    let r = c.raw(
        Method::DELETE,
        &format!("/v1/sandboxes/{id}/processes/svc"),
        "",
        "",
    );
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.json());
    let stopped = process(&c, &id, "svc");
    assert_eq!(stopped["state"], "exited", "{stopped}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let still = process(&c, &id, "svc");
    assert_eq!(still["pid"], stopped["pid"], "not restarted after a stop");
    assert_eq!(still["managed"]["status"], "stopped", "{still}");
    // A plain process restarts too, as a new process with the same command.
    let plain = spawn(&c, &id, json!({"command": "sleep", "args": ["60"]}));
    let pid = plain["pid"].as_u64().unwrap();
    let (s, next) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/{pid}/restart"),
        None,
    );
    assert_eq!(s, StatusCode::OK, "{next}");
    assert_eq!(next["args"], json!(["60"]));
    assert!(next["managed"].is_null());
}

#[test]
fn a_failing_health_check_kills_the_run_and_the_policy_restarts_it() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    spawn(
        &c,
        &id,
        json!({"command": "sleep", "args": ["60"], "name": "web",
               "restart": {"policy": "always", "initial_backoff_ms": 50},
               "health_check": {"type": "tcp", "port": 9, "initial_delay_ms": 0,
                                "interval_ms": 50, "timeout_ms": 50, "failure_threshold": 2}}),
    );
    assert!(
        eventually(10, || process(&c, &id, "web")["managed"]["restart_count"]
            .as_u64()
            .is_some_and(|n| n >= 1)),
        "an unhealthy run is replaced"
    );
    let p = process(&c, &id, "web");
    assert!(
        p["managed"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("health check failed")),
        "{p}"
    );
    // A healthy one stays: busybox's nc listens on the probed port.
    spawn(
        &c,
        &id,
        json!({"command": "sh", "args": ["-c", "while :; do nc -l -p 7001 </dev/null; done"],
               "name": "ok", "health_check": {"type": "tcp", "port": 7001, "initial_delay_ms": 0,
                                               "interval_ms": 50, "failure_threshold": 3}}),
    );
    assert!(
        eventually(10, || process(&c, &id, "ok")["managed"]["health_status"]
            == "healthy"),
        "{}",
        process(&c, &id, "ok")
    );
}

#[test]
fn stdin_and_output_modes() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let c = d.client();
    let closed = spawn(
        &c,
        &id,
        json!({"command": "sh", "args": ["-c", "cat; echo out; echo err >&2"],
               "stdin_mode": "closed", "stderr_mode": "discard"}),
    );
    assert_eq!(closed["stdin_writable"], false);
    let pid = closed["pid"].as_u64().unwrap();
    let (s, p) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/{pid}/wait?timeout_secs=10"),
        None,
    );
    assert_eq!(
        (s, p["exit_code"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{p}"
    );
    assert_eq!(
        (p["stdout_len"].as_u64(), p["stderr_len"].as_u64()),
        (Some(4), Some(0))
    );
    let piped = spawn(&c, &id, json!({"command": "cat", "stdin_mode": "pipe"}));
    assert_eq!(piped["stdin_writable"], true);
    let (s, v) = c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(json!({"command": "cat", "stdin_mode": "pipe", "stdin": "x"})),
    );
    assert_error(s, &v, 400, "invalid_argument");
}

#[test]
fn an_entrypoint_starts_with_the_sandbox() {
    let d = TestDaemon::start();
    let id = d.create(json!({"entrypoint": ["sh", "-c", "echo up > /tmp/up; sleep 60"]}));
    let c = d.client();
    let (_, sb) = c.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(sb["entrypoint"][0], "sh");
    let (_, list) = c.get(&format!("/v1/sandboxes/{id}/processes"));
    assert_eq!(list["processes"][0]["command"], "sh", "{list}");
    assert!(eventually(5, || d.sh(&id, "cat /tmp/up")["stdout"] == "up\n"));
    let (s, v) = c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"entrypoint": ["/no/such/program"]})),
    );
    assert!(s.is_client_error(), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("/no/such/program"),
        "{v}"
    );
}

#[test]
fn a_sandbox_is_renamed_relabelled_and_its_egress_changed() {
    let d = TestDaemon::start();
    let c = d.client();
    let a = d.create(json!({"allow_internet_access": true}));
    let b = d.create(json!({"name": "taken", "network": {"mode": "none"}}));
    let path = format!("/v1/sandboxes/{a}");
    let (s, v) = c.json(
        Method::PATCH,
        &path,
        Some(json!({"name": "renamed", "labels": {"k": "v"}})),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["name"].as_str(), v["labels"]["k"].as_str()),
        (Some("renamed"), Some("v"))
    );
    assert_eq!(c.get("/v1/sandboxes/renamed").1["id"], a.as_str());
    let (s, v) = c.json(Method::PATCH, &path, Some(json!({"name": "taken"})));
    assert_error(s, &v, 409, "conflict");
    let (s, v) = c.json(Method::PATCH, &path, Some(json!({})));
    assert_error(s, &v, 400, "invalid_argument");
    let (s, v) = c.json(
        Method::PATCH,
        &path,
        Some(json!({"deny_out": ["198.18.7.0/24"], "allow_out": ["198.18.0.0/15"]})),
    );
    // A guarded range opens only where the operator allowed it (allow_out_guarded).
    assert_error(s, &v, 403, "forbidden");
    let (s, v) = c.json(
        Method::PATCH,
        &path,
        Some(json!({"deny_out": ["198.18.7.0/24"], "allow_out": ["203.0.113.0/24"]})),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["network"]["deny_out"], json!(["198.18.7.0/24"]));
    let rules = std::process::Command::new("nft")
        .args(["list", "table", "inet", "sandfork"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        rules.contains("198.18.7.0/24"),
        "the ruleset changed:\n{rules}"
    );
    let (s, v) = c.json(
        Method::PATCH,
        &format!("/v1/sandboxes/{b}"),
        Some(json!({"allow_out": ["203.0.113.0/24"]})),
    );
    assert_error(s, &v, 422, "unsupported");
    let (s, v) = c.json(Method::PATCH, &path, Some(json!({"deny_out": ["no pe"]})));
    assert_error(s, &v, 400, "invalid_argument");
}
