//! Checkpoint, fork, suspend/resume and snapshot verbs of the `sandfork` binary against a
//! real daemon child process, including kill -9 of the daemon and restarts.

use std::time::Duration;

mod common;

use common::{eventually, Daemon};

/// A shell that keeps `$v` only in memory and writes it to /tmp/answer on /tmp/ask.
const HOLDER: &str = "v=$(cat /tmp/secret); rm /tmp/secret; while :; do \
    if [ -e /tmp/ask ]; then rm /tmp/ask; echo $v > /tmp/answer; fi; sleep 0.05; done";

fn hold(d: &Daemon, id: &str, secret: &str) {
    d.sh(id, &format!("echo {secret} > /tmp/secret"));
    let script = format!("({HOLDER}) </dev/null >/dev/null 2>&1 &");
    d.sh(id, &script);
    assert!(eventually(10, || d
        .sh(id, "test -e /tmp/secret || echo gone")
        == "gone"));
}

fn ask(d: &Daemon, id: &str) -> String {
    d.sh(id, "rm -f /tmp/answer; touch /tmp/ask");
    let mut answer = String::new();
    eventually(10, || {
        answer = d.sh(id, "cat /tmp/answer 2>/dev/null || true");
        !answer.is_empty()
    });
    answer
}

#[test]
fn checkpoint_survives_kill9_and_restart_and_suspended_sandbox_resumes() {
    let mut d = Daemon::start();
    let src = d.line(&["create", "--memory-mb", "64"]);
    hold(&d, &src, "kept-in-memory");
    let snap = d.line(&["checkpoint", &src, "--memory"]);
    assert!(snap.starts_with("snap-"), "{snap}");
    let named = d.line(&["create", "--name", "napper", "--memory-mb", "64"]);
    hold(&d, &named, "napping-value");
    d.sh(&named, "echo on-disk > /nap.txt");
    assert!(d.line(&["suspend", "napper"]).ends_with("suspended"));
    d.kill9();
    d.spawn();
    let listed = d.json(&["snapshot", "ls", "--published"]);
    assert_eq!(listed["snapshots"][0]["id"], snap.as_str(), "{listed}");
    assert_eq!(listed["snapshots"][0]["published"], false, "{listed}");
    let out = d.cli(&["snapshot", "publish", &snap]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("object_store"),
        "{err}"
    );
    let forked = d.json(&["fork", &snap, "-n", "2"]);
    for child in forked["children"].as_array().unwrap() {
        let id = child["sandbox"]["id"].as_str().unwrap();
        assert_eq!(ask(&d, id), "kept-in-memory");
    }
    assert_eq!(d.json(&["inspect", "napper"])["state"], "suspended");
    assert!(d.line(&["resume", "napper"]).ends_with("running"));
    assert_eq!(ask(&d, &named), "napping-value");
    assert_eq!(d.sh(&named, "cat /nap.txt"), "on-disk");
    d.line(&["snapshot", "rm", &snap]);
    assert!(d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .is_empty());
    let out = d.cli(&["snapshot", "rm", &snap]);
    assert!(!out.status.success(), "a deleted snapshot is gone");
}

#[test]
fn kill9_mid_checkpoint_leaves_no_half_snapshot() {
    let mut d = Daemon::start();
    let src = d.line(&["create", "--memory-mb", "512"]);
    // About 150 MB in a shell's memory makes the dump take a while.
    let script = "(x=$(head -c 150000000 /dev/zero | tr '\\0' a); while :; do sleep 1; done) \
        </dev/null >/dev/null 2>&1 & sleep 3; echo started";
    assert_eq!(d.sh(&src, script), "started");
    let mut cp = d
        .cli_cmd(&["checkpoint", &src, "--memory"])
        .spawn()
        .unwrap();
    // Killed the moment the checkpoint is under way (a fixed delay raced with dumps that
    // finish in well under 300 ms).
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while d.json(&["inspect", &src])["state"] != "checkpointing" {
        assert!(
            std::time::Instant::now() < end,
            "the checkpoint never started"
        );
    }
    d.kill9();
    let _ = cp.wait();
    d.spawn();
    assert!(
        d.json(&["snapshot", "ls"])["snapshots"]
            .as_array()
            .unwrap()
            .is_empty(),
        "no half snapshot is visible"
    );
    let resumed = d.log().contains("resumed after an interrupted checkpoint");
    eprintln!("kill -9 landed while the source was paused: {resumed}");
    // The interrupted checkpoint is dropped; the source was resumed and runs on.
    let sb = d.json(&["inspect", &src]);
    assert_eq!(sb["state"], "running", "{sb}\n{}", d.log());
    assert_eq!(d.sh(&src, "echo alive"), "alive");
    d.sh(&src, "echo still-writable > /after.txt");
    let leftovers = eventually(20, || {
        std::fs::read_dir(d.data().join("snapshots"))
            .map(|e| e.count() == 0)
            .unwrap_or(true)
    });
    assert!(leftovers, "no snapshot files are left");
    // The daemon still checkpoints after the interruption.
    let fresh = d.line(&["create", "--memory-mb", "64"]);
    let snap = d.line(&["checkpoint", &fresh]);
    let path = d.dir.path().join("snap.sfs");
    d.line(&["snapshot", "export", &snap, path.to_str().unwrap()]);
    d.line(&["snapshot", "rm", &snap]);
    let imported = d.line(&["snapshot", "import", path.to_str().unwrap()]);
    assert!(imported.starts_with("snap-"));
}
