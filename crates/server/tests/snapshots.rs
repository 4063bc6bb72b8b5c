//! API tests of checkpoints, snapshots, fork fan-out, suspend/resume and export/import, on
//! the real runtime (runc + CRIU).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

/// Holds a value only in memory (its file is deleted) and answers with it in /tmp/answer
/// whenever /tmp/ask appears; also counts, so output keeps growing.
const HOLDER: &str = "v=$(cat /tmp/secret); rm /tmp/secret; while :; do \
    if [ -e /tmp/ask ]; then rm /tmp/ask; echo $v > /tmp/answer; fi; sleep 0.05; done";

fn post(d: &TestDaemon, path: &str, body: Value) -> (StatusCode, Value) {
    d.client().json(Method::POST, path, Some(body))
}

fn out(v: &Value) -> String {
    v["stdout"].as_str().unwrap_or_default().trim().to_string()
}

/// Starts HOLDER with `secret` in a sandbox.
fn hold(d: &TestDaemon, id: &str, secret: &str) {
    d.sh(id, &format!("echo {secret} > /tmp/secret"));
    let (s, v) = post(
        d,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"command": "/bin/sh", "args": ["-c", HOLDER]}),
    );
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert!(eventually(10, || out(
        &d.sh(id, "test -e /tmp/secret || echo gone")
    ) == "gone"));
}

/// Asks the in-memory holder of sandbox `id` for its value.
fn ask(d: &TestDaemon, id: &str) -> String {
    d.sh(id, "rm -f /tmp/answer; touch /tmp/ask");
    let mut answer = String::new();
    eventually(10, || {
        answer = out(&d.sh(id, "cat /tmp/answer 2>/dev/null"));
        !answer.is_empty()
    });
    answer
}

fn checkpoint(d: &TestDaemon, id: &str, kind: &str) -> Value {
    let (s, snap) = post(
        d,
        &format!("/v1/sandboxes/{id}/checkpoint"),
        json!({"type": kind}),
    );
    assert_eq!(s, StatusCode::CREATED, "{snap}");
    snap
}

fn layer_count(d: &TestDaemon) -> usize {
    std::fs::read_dir(d.data.join("store/layers"))
        .map(|e| e.count())
        .unwrap_or(0)
}

#[test]
fn memory_snapshot_forks_diverge_and_delete_keeps_children() {
    let d = TestDaemon::start();
    let c = d.client();
    let src = d.create(json!({"memory_mb": 128, "network": {"mode": "internet"}}));
    hold(&d, &src, "only-in-memory-42");
    d.sh(&src, "echo parent > /shared.txt; mkdir -p /www; echo hi > /www/index.html; httpd -p 8080 -h /www");
    let snap = checkpoint(&d, &src, "memory");
    assert_eq!(snap["type"], "memory");
    assert!(snap["id"].as_str().unwrap().starts_with("snap-"));
    assert!(snap["size_bytes"].as_u64().unwrap() > 0);
    let sid = snap["id"].as_str().unwrap().to_string();
    assert_eq!(
        ask(&d, &src),
        "only-in-memory-42",
        "the source keeps running"
    );

    let per_child: Vec<Value> = (0..8)
        .map(|i| json!({"env": {"CHILD": i.to_string()}}))
        .collect();
    let (s, r) = post(
        &d,
        &format!("/v1/snapshots/{sid}/fork"),
        json!({"count": 8, "per_child": per_child, "labels": {"group": "g"}}),
    );
    assert_eq!(s, StatusCode::OK, "{r}");
    let children = r["children"].as_array().unwrap();
    assert_eq!(children.len(), 8);
    let mut ids = Vec::new();
    let mut addrs = HashSet::new();
    let mut seeds = HashSet::new();
    for (i, ch) in children.iter().enumerate() {
        assert!(ch["error"].is_null(), "child {i}: {ch}");
        let sb = &ch["sandbox"];
        assert_eq!(sb["fork"]["index"], i);
        assert_eq!(sb["labels"]["group"], "g");
        addrs.insert(sb["network"]["address"].as_str().unwrap().to_string());
        ids.push(sb["id"].as_str().unwrap().to_string());
    }
    assert_eq!(addrs.len(), 8, "every child has its own address");
    // Deleting the snapshot never breaks its children.
    let (s, _) = c.json(Method::DELETE, &format!("/v1/snapshots/{sid}"), None);
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        c.get(&format!("/v1/snapshots/{sid}")).0,
        StatusCode::NOT_FOUND
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(ask(&d, id), "only-in-memory-42", "child {i} resumed warm");
        assert_eq!(out(&d.sh(id, "echo $CHILD")), i.to_string());
        let fork = out(&d.sh(id, "cat /etc/sandfork/fork"));
        assert!(fork.contains(&format!("SANDFORK_FORK_INDEX={i}")), "{fork}");
        assert!(
            fork.contains(&format!("SANDFORK_PARENT_SNAPSHOT_ID={sid}")),
            "{fork}"
        );
        seeds.insert(
            fork.lines()
                .find(|l| l.contains("SEED"))
                .unwrap_or("")
                .to_string(),
        );
        assert_eq!(out(&d.sh(id, "wget -qO- http://127.0.0.1:8080/")), "hi");
        d.sh(id, &format!("echo {i} > /mine-{i}"));
    }
    assert_eq!(seeds.len(), 8, "every child has its own seed");
    for (i, id) in ids.iter().enumerate() {
        let ls = out(&d.sh(id, "ls / | grep mine- | tr '\\n' ' '"));
        assert_eq!(
            ls,
            format!("mine-{i}"),
            "forks never see each other's files"
        );
        assert_eq!(out(&d.sh(id, "cat /shared.txt")), "parent");
    }
    // Storage is freed once the last user goes.
    for id in ids.iter().chain([&src]) {
        assert_eq!(
            c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
                .0,
            StatusCode::OK
        );
    }
    assert!(
        layer_count(&d) <= 1,
        "only the image layer is left: {}",
        layer_count(&d)
    );
}

#[test]
fn filesystem_snapshot_boots_cold_and_pins_nothing_it_should_not() {
    let d = TestDaemon::start();
    let src = d.create(json!({"memory_mb": 64}));
    hold(&d, &src, "x");
    d.sh(&src, "echo v1 > /state.txt");
    let snap = checkpoint(&d, &src, "filesystem");
    let sid = snap["id"].as_str().unwrap();
    assert_eq!(snap["source_sandbox_id"], src.as_str());
    let (_, list) = d
        .client()
        .get(&format!("/v1/snapshots?source={src}&type=filesystem"));
    assert_eq!(list["snapshots"][0]["id"], sid);
    let child = d.create(json!({"snapshot_id": sid, "memory_mb": 96}));
    assert_eq!(out(&d.sh(&child, "cat /state.txt")), "v1");
    let (_, procs) = d.client().get(&format!("/v1/sandboxes/{child}/processes"));
    assert_eq!(
        procs["processes"].as_array().unwrap().len(),
        0,
        "no process came back"
    );
    let (_, v) = d.client().get(&format!("/v1/sandboxes/{child}"));
    assert_eq!(
        v["memory_mb"], 96,
        "a filesystem snapshot pins no resources"
    );
    // After-restore hooks run in every child before it is handed out.
    let hook = |script: &str| json!({"command": "/bin/sh", "args": ["-c", script]});
    let body = json!({"type": "filesystem", "hooks": [hook("echo hooked > /hooked")]});
    let (s, hooked) = post(&d, &format!("/v1/sandboxes/{src}/checkpoint"), body);
    assert_eq!(s, StatusCode::CREATED, "{hooked}");
    let child = d.create(json!({"snapshot_id": hooked["id"]}));
    assert_eq!(out(&d.sh(&child, "cat /hooked")), "hooked");
    let body = json!({"hooks": [hook("echo nope >&2; exit 3")]});
    let (_, failing) = post(&d, &format!("/v1/sandboxes/{src}/checkpoint"), body);
    let (s, v) = post(&d, "/v1/sandboxes", json!({"snapshot_id": failing["id"]}));
    assert!(s.is_server_error(), "{v}");
    assert!(v["message"].as_str().unwrap().contains("nope"), "{v}");
}

#[test]
fn bad_ids_and_pinned_resources_are_refused() {
    let d = TestDaemon::start();
    let c = d.client();
    for bad in ["snap-nope", "nope", "snap-..%2F..%2Fx"] {
        assert_error_code(c.get(&format!("/v1/snapshots/{bad}")), 404);
        assert_error_code(
            c.json(Method::DELETE, &format!("/v1/snapshots/{bad}"), None),
            404,
        );
        assert_error_code(
            post(
                &d,
                &format!("/v1/snapshots/{bad}/fork"),
                json!({"count": 2}),
            ),
            404,
        );
        assert_error_code(post(&d, "/v1/sandboxes", json!({"snapshot_id": bad})), 404);
        assert_error_code(
            post(&d, &format!("/v1/snapshots/{bad}/export"), json!({})),
            404,
        );
    }
    assert_error_code(post(&d, "/v1/sandboxes/sb-nope/checkpoint", json!({})), 404);
    assert_error_code(post(&d, "/v1/sandboxes/sb-nope/suspend", json!({})), 404);
    let src = d.create(json!({"memory_mb": 64}));
    let snap = checkpoint(&d, &src, "memory");
    let sid = snap["id"].as_str().unwrap();
    let (s, v) = post(
        &d,
        "/v1/sandboxes",
        json!({"snapshot_id": sid, "memory_mb": 256}),
    );
    assert_error(s, &v, 422, "unsupported");
    assert!(v["message"].as_str().unwrap().contains("memory_mb"), "{v}");
    let (s, v) = post(
        &d,
        "/v1/sandboxes",
        json!({"snapshot_id": sid, "image": "busybox"}),
    );
    assert_error(s, &v, 400, "invalid_argument");
    assert_error_code(
        post(
            &d,
            &format!("/v1/snapshots/{sid}/fork"),
            json!({"count": 0}),
        ),
        400,
    );
    // A resume of a running sandbox is a state conflict.
    assert_error_code(
        post(&d, &format!("/v1/sandboxes/{src}/resume"), json!({})),
        409,
    );
}

fn assert_error_code((s, v): (StatusCode, Value), want: u16) {
    assert_eq!(s.as_u16(), want, "{v}");
}

#[test]
fn five_suspend_resume_cycles_keep_files_and_memory() {
    let d = TestDaemon::start();
    let id = d.create(json!({"name": "keeper", "memory_mb": 64}));
    // A shell whose counter lives only in memory: each /tmp/ask bumps and reports it.
    let script = "n=0; while :; do if [ -e /tmp/ask ]; then rm /tmp/ask; n=$((n+1)); \
        echo $n > /tmp/answer; fi; sleep 0.05; done";
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"command": "/bin/sh", "args": ["-c", script]}),
    );
    assert_eq!(s, StatusCode::CREATED, "{v}");
    for cycle in 1..=5 {
        assert_eq!(
            ask(&d, &id),
            cycle.to_string(),
            "memory counter before suspend {cycle}"
        );
        d.sh(&id, &format!("echo {cycle} >> /cycles.txt"));
        let (s, v) = post(&d, "/v1/sandboxes/keeper/suspend", json!({}));
        assert_eq!(
            (s, v["state"].as_str()),
            (StatusCode::OK, Some("suspended")),
            "{v}"
        );
        assert_eq!(v["id"], id.as_str());
        assert!(
            host_traces(&d.data, &id)
                .iter()
                .all(|t| !t.contains("runc")),
            "nothing runs"
        );
        let (s, v) = post(&d, "/v1/sandboxes/keeper/resume", json!({}));
        assert_eq!(
            (s, v["state"].as_str()),
            (StatusCode::OK, Some("running")),
            "{v}"
        );
        let want: Vec<String> = (1..=cycle).map(|i| i.to_string()).collect();
        assert_eq!(out(&d.sh(&id, "cat /cycles.txt")), want.join("\n"));
    }
    // Suspended snapshots are internal.
    let (_, list) = d.client().get("/v1/snapshots");
    assert!(list["snapshots"].as_array().unwrap().is_empty(), "{list}");
}

#[test]
fn named_sandbox_suspends_at_timeout_unnamed_terminates() {
    let d = TestDaemon::start();
    let named = d.create(json!({"name": "sleepy", "memory_mb": 64, "timeout_secs": 1}));
    let unnamed = d.create(json!({"memory_mb": 64, "timeout_secs": 1}));
    let state = |id: &str| d.client().get(&format!("/v1/sandboxes/{id}")).1["state"].clone();
    assert!(
        eventually(30, || state(&named) == "suspended"),
        "{}",
        state(&named)
    );
    assert!(
        eventually(30, || state(&unnamed) == "terminated"),
        "{}",
        state(&unnamed)
    );
    let (s, v) = post(&d, &format!("/v1/sandboxes/{named}/resume"), json!({}));
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[test]
fn export_import_round_trip_and_corruption_refused() {
    let d = TestDaemon::start();
    let src = d.create(json!({"memory_mb": 64}));
    hold(&d, &src, "travelling-value");
    d.sh(&src, "echo travels > /exported.txt");
    let snap = checkpoint(&d, &src, "memory");
    let sid = snap["id"].as_str().unwrap();
    let reply = d
        .client()
        .raw(Method::POST, &format!("/v1/snapshots/{sid}/export"), "", "");
    assert_eq!(reply.status, StatusCode::OK);
    let file = reply.body.to_vec();
    assert!(file.len() > 1000);
    let mut bad = file.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    let r = d.client().raw(
        Method::POST,
        "/v1/snapshots/import",
        "application/octet-stream",
        bad,
    );
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.json());
    let (s, _) = d
        .client()
        .json(Method::DELETE, &format!("/v1/snapshots/{sid}"), None);
    assert_eq!(s, StatusCode::NO_CONTENT);
    let r = d.client().raw(
        Method::POST,
        "/v1/snapshots/import",
        "application/octet-stream",
        file,
    );
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let imported = r.json();
    assert_eq!(imported["type"], "memory");
    let child = d.create(json!({"snapshot_id": imported["id"]}));
    assert_eq!(out(&d.sh(&child, "cat /exported.txt")), "travels");
    assert_eq!(ask(&d, &child), "travelling-value");
    // Nothing of the transfers is left in the data directory's scratch space.
    let scratch = d.data.join("tmp/snapshot-transfer");
    let left = std::fs::read_dir(&scratch).map(|e| e.count()).unwrap_or(0);
    assert_eq!(left, 0);
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn memory_checkpoint_waits_for_requests_in_flight() {
    let d = TestDaemon::start();
    let id = d.create(json!({"memory_mb": 64}));
    std::thread::scope(|s| {
        let slow = s.spawn(|| d.sh(&id, "sleep 1; echo finished"));
        std::thread::sleep(Duration::from_millis(300));
        let (status, snap) = post(
            &d,
            &format!("/v1/sandboxes/{id}/checkpoint"),
            json!({"type": "memory"}),
        );
        assert_eq!(status, StatusCode::CREATED, "{snap}");
        assert_eq!(out(&slow.join().unwrap()), "finished");
    });
    assert_eq!(out(&d.sh(&id, "echo after")), "after");
}

#[test]
fn memory_checkpoint_refuses_while_a_request_stays_open() {
    let d = TestDaemon::start();
    let id = d.create(json!({"memory_mb": 64}));
    let (s, p) = post(
        &d,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"command": "sleep", "args": ["30"]}),
    );
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let pid = p["pid"].as_u64().unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            post(
                &d,
                &format!("/v1/sandboxes/{id}/processes/{pid}/wait"),
                json!({}),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let (status, v) = post(
            &d,
            &format!("/v1/sandboxes/{id}/checkpoint"),
            json!({"type": "memory"}),
        );
        assert_error(status, &v, 409, "conflict");
        assert!(
            v["message"].as_str().unwrap().contains("in progress"),
            "{v}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        // The sandbox carries on: the wait ends when its process does.
        assert_eq!(out(&d.sh(&id, "echo still-here")), "still-here");
        let (s, v) = post(
            &d,
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            json!({"signal": 9}),
        );
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
        let (s, v) = waiting.join().unwrap();
        assert_eq!(s, StatusCode::OK, "{v}");
    });
    let (_, list) = d.client().get(&format!("/v1/snapshots?source={id}"));
    assert!(list["snapshots"].as_array().unwrap().is_empty(), "{list}");
}

fn import(d: &TestDaemon, file: &[u8]) -> (StatusCode, Value) {
    let r = d.client().raw(
        Method::POST,
        "/v1/snapshots/import",
        "application/octet-stream",
        file.to_vec(),
    );
    (r.status, r.json())
}

fn import_trusted(d: &TestDaemon, file: &[u8]) -> (StatusCode, Value) {
    let r = d.client().raw(
        Method::POST,
        "/v1/snapshots/import?trust_unsigned=true",
        "application/octet-stream",
        file.to_vec(),
    );
    (r.status, r.json())
}

/// The entries of a version-2 snapshot file, changed by `change`, written back as an
/// unsigned version-1 file (what a forger can make without the key).
fn forge_v1(file: &[u8], change: impl FnOnce(&mut Vec<(String, Vec<u8>)>)) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    assert_eq!(&file[..8], b"SFSNAP2\n");
    let body = &file[8..file.len() - 80];
    let (mut entries, mut at) = (Vec::new(), 0);
    while at < body.len() {
        let n = u16::from_le_bytes([body[at], body[at + 1]]) as usize;
        let name = String::from_utf8(body[at + 2..at + 2 + n].to_vec()).unwrap();
        at += 2 + n;
        let len = u64::from_le_bytes(body[at..at + 8].try_into().unwrap()) as usize;
        entries.push((name, body[at + 8..at + 8 + len].to_vec()));
        at += 8 + len;
    }
    change(&mut entries);
    let mut out = b"SFSNAP1\n".to_vec();
    for (name, data) in entries {
        out.extend((name.len() as u16).to_le_bytes());
        out.extend(name.as_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        out.extend(data);
    }
    let digest = Sha256::digest(&out);
    out.extend(b"SFSNAPZ\n");
    out.extend(digest);
    out
}

fn export(d: &TestDaemon, sid: &str) -> Vec<u8> {
    let reply = d
        .client()
        .raw(Method::POST, &format!("/v1/snapshots/{sid}/export"), "", "");
    assert_eq!(reply.status, StatusCode::OK);
    reply.body.to_vec()
}

#[test]
fn memory_snapshots_import_only_with_the_exporters_key() {
    let a = TestDaemon::start();
    let b = TestDaemon::start();
    let src = a.create(json!({"memory_mb": 64}));
    a.sh(&src, "echo from-a > /a.txt");
    let mem = export(&a, checkpoint(&a, &src, "memory")["id"].as_str().unwrap());
    let fs = export(
        &a,
        checkpoint(&a, &src, "filesystem")["id"].as_str().unwrap(),
    );

    let (s, v) = import(&b, &mem);
    assert_error(s, &v, 400, "invalid_argument");
    assert!(v["message"].as_str().unwrap().contains("not signed"), "{v}");
    // Without its signature (as a forger would have to send it) it is refused too.
    let (s, _) = import(&b, &mem[..mem.len() - 40]);
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // A filesystem snapshot from another host is refused unless trusted explicitly...
    let (s, v) = import(&b, &fs);
    assert_error(s, &v, 400, "invalid_argument");
    assert!(
        v["message"].as_str().unwrap().contains("trust_unsigned"),
        "{v}"
    );
    let (s, v) = import_trusted(&b, &fs);
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // ...which never covers memory images.
    let (s, v) = import_trusted(&b, &mem);
    assert_error(s, &v, 400, "invalid_argument");
    let (_, list) = b.client().get("/v1/snapshots?type=memory");
    assert!(list["snapshots"].as_array().unwrap().is_empty(), "{list}");
    // Nor a file that declares a memory snapshot under another entry name (kind confusion),
    // in the unsigned version-1 format.
    let forged = forge_v1(&fs, |entries| {
        let manifest = entries
            .iter_mut()
            .find(|(n, _)| n == "manifest.json")
            .unwrap();
        let mut m: Value = serde_json::from_slice(&manifest.1).unwrap();
        m["view"]["type"] = "memory".into();
        manifest.1 = serde_json::to_vec(&m).unwrap();
        entries.push(("memory".into(), b"not a CRIU image".to_vec()));
    });
    let (s, v) = import_trusted(&b, &forged);
    assert_error(s, &v, 400, "invalid_argument");
    assert!(
        v["message"].as_str().unwrap().contains("memory images"),
        "{v}"
    );

    // Given A's key, B trusts A's exports.
    std::fs::copy(a.data.join("snapshot.key"), b.data.join("snapshot.key")).unwrap();
    let (s, v) = import(&b, &mem);
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let child = b.create(json!({"snapshot_id": v["id"]}));
    assert_eq!(out(&b.sh(&child, "cat /a.txt")), "from-a");
}

#[test]
fn an_imported_disk_that_is_not_a_clean_filesystem_is_refused_before_any_mount() {
    // A hostile exporting host (one that holds the key) damages the ext4 superblock under
    // a sandbox, then exports its filesystem snapshot: the blocks are all checksummed, so
    // only the filesystem check can tell.
    let a = TestDaemon::start();
    let b = TestDaemon::start();
    let src = a.create(json!({"memory_mb": 64}));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fuse = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .find(|m| m.contains(&src) && m.ends_with("/fuse"))
        .expect("the sandbox's FUSE mount")
        .to_string();
    // The first block of /bin (a directory nothing changes, so the kernel never writes
    // it back over the damage) is overwritten under the mounted filesystem.
    let file = format!("{fuse}/disk");
    let bmap = std::process::Command::new("debugfs")
        .args(["-R", "bmap /bin 0", &file])
        .output()
        .unwrap();
    let block: u64 = String::from_utf8_lossy(&bmap.stdout)
        .trim()
        .parse()
        .unwrap();
    let stats = std::process::Command::new("dumpe2fs")
        .args(["-h", &file])
        .output()
        .unwrap();
    let block_size: u64 = String::from_utf8_lossy(&stats.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Block size:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap();
    let disk = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    let junk = vec![0xA5; block_size as usize];
    std::os::unix::fs::FileExt::write_all_at(&disk, &junk, block * block_size).unwrap();
    disk.sync_all().unwrap();
    let fs = export(
        &a,
        checkpoint(&a, &src, "filesystem")["id"].as_str().unwrap(),
    );
    std::fs::copy(a.data.join("snapshot.key"), b.data.join("snapshot.key")).unwrap();
    let (s, v) = import(&b, &fs);
    assert_error(s, &v, 400, "invalid_argument");
    assert!(v["message"].as_str().unwrap().contains("e2fsck"), "{v}");
    let (_, list) = b.client().get("/v1/snapshots");
    assert!(list["snapshots"].as_array().unwrap().is_empty(), "{list}");
}

#[test]
fn secrets_reach_the_sandbox_but_no_snapshot_export_or_readable_file() {
    use std::os::unix::fs::PermissionsExt;
    let d = TestDaemon::start();
    let secret = "s3cr3t-7f3a9c";
    let src = d.create(json!({"memory_mb": 64, "secrets": {"API_TOKEN": secret}}));
    assert_eq!(out(&d.sh(&src, "echo $API_TOKEN")), secret);
    let (_, view) = d.client().get(&format!("/v1/sandboxes/{src}"));
    assert!(!view.to_string().contains(secret), "{view}");
    let fs = checkpoint(&d, &src, "filesystem");
    let fs_id = fs["id"].as_str().unwrap();
    assert!(!fs.to_string().contains(secret));
    let file = export(&d, fs_id);
    assert!(
        !file.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "a filesystem export carries no secret"
    );
    // Restored without it, a child lacks it; given at restore, it has the new one.
    let child = d.create(json!({"snapshot_id": fs_id}));
    assert_eq!(out(&d.sh(&child, "echo x${API_TOKEN}x")), "xx");
    let child = d.create(json!({"snapshot_id": fs_id, "secrets": {"API_TOKEN": "fresh"}}));
    assert_eq!(out(&d.sh(&child, "echo $API_TOKEN")), "fresh");
    // Wherever the daemon wrote it on the host, only root can read it.
    let mut holders = Vec::new();
    let mut stack = vec![d.data.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let (path, meta) = (e.path(), e.metadata().unwrap());
            if meta.is_dir() && !path.ends_with("rootfs") && !path.ends_with("store") {
                stack.push(path);
            } else if meta.is_file() && meta.len() < (64 << 20) {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                    holders.push((path, meta.permissions().mode() & 0o777));
                }
            }
        }
    }
    for (path, mode) in &holders {
        assert_eq!(
            mode & 0o077,
            0,
            "{} (mode {mode:o}) holds the secret",
            path.display()
        );
    }
    let data_mode = std::fs::metadata(&d.data).unwrap().permissions().mode() & 0o777;
    assert_eq!(data_mode, 0o700);
}
