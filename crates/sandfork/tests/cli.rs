//! The `sandfork` binary against a real daemon (`sandfork serve` as a child process on a
//! private data directory): every verb, errors, kill -9 / restart and SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;

use common::{eventually, Daemon, BIN};

/// What of sandbox `id` is still on the host.
fn traces(data: &Path, id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let runc = Command::new("runc")
        .arg("--root")
        .arg(data.join("runc"))
        .args(["list", "-q"])
        .output();
    if runc.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == id)) {
        found.push("runc container".to_string());
    }
    if Path::new("/run/sandfork/netns")
        .join(format!("sf-{id}"))
        .exists()
    {
        found.push("netns".into());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    found.extend(
        mounts
            .lines()
            .filter(|l| l.contains(id))
            .map(|l| format!("mount {l}")),
    );
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        if h.path().join("sandfork").join(id).exists() {
            found.push(format!("cgroup in {}", h.path().display()));
        }
    }
    if data.join("sandboxes").join(id).exists() {
        found.push("sandbox directory".into());
    }
    let loops = Command::new("losetup").arg("-a").output();
    let loops = loops
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    found.extend(
        loops
            .lines()
            .filter(|l| l.contains(id))
            .map(|l| format!("loop device {l}")),
    );
    found.extend(
        processes_mentioning(id)
            .into_iter()
            .map(|p| format!("process {p}")),
    );
    found
}

/// Processes whose command line mentions `needle` (disk servers, runc shims).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.chars().all(|c| c.is_ascii_digit()) && name != me
    })
    .filter_map(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        cmd.contains(needle).then_some(cmd)
    })
    .collect()
}

#[test]
fn verbs_work_end_to_end() {
    let d = Daemon::start();
    assert_eq!(
        d.ok(&["run", "--", "echo", "hello", "world"]),
        "hello world\n"
    );
    let out = d.cli(&[
        "run",
        "--memory-mb",
        "64",
        "--",
        "sh",
        "-c",
        "echo bye >&2; exit 7",
    ]);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(7), "bye\n")
    );
    assert!(d.live_ids().is_empty(), "run cleans up its sandbox");
    let id = d
        .ok(&[
            "create",
            "--name",
            "cli-box",
            "--env",
            "GREETING=hi",
            "--memory-mb",
            "128",
        ])
        .trim()
        .to_string();
    assert!(id.starts_with("sb-"), "{id}");
    let other = d.ok(&["create", "--memory-mb", "64", "--label", "team=rl"]);
    let other = other.trim();
    assert_eq!(
        d.ok(&["label", "cli-box", "team=eval", "run=7"]),
        "run=7\nteam=eval\n"
    );
    assert_eq!(d.ok(&["label", "cli-box", "--rm", "run"]), "team=eval\n");
    let only_rl = d.ok(&["ls", "--filter", "label=team=rl"]);
    assert!(
        only_rl.contains(other) && !only_rl.contains(&id),
        "{only_rl}"
    );
    let out = d.cli(&["ls", "--filter", "state=running"]);
    assert_eq!(out.status.code(), Some(1));
    let timed = d.json(&["timeout", "cli-box", "600", "--on-timeout", "terminate"]);
    assert_eq!(
        (timed["timeout_secs"].as_u64(), timed["on_timeout"].as_str()),
        (Some(600), Some("terminate"))
    );
    assert!(timed["expires_at"].is_string(), "{timed}");
    d.ok(&["timeout", "cli-box", "0"]);
    let table = d.ok(&["stats", "cli-box"]);
    assert!(
        table.starts_with("ID") && table.contains(&id) && table.contains("128.0 MiB"),
        "{table}"
    );
    let feed = d.ok(&["events", "--sandbox", &id, "--since", "0", "--no-follow"]);
    let kinds: Vec<&str> = feed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(kinds, ["created", "started"], "{feed}");
    // Without following, the kept events are replayed as the SDKs do (not "only new ones",
    // which would be nothing at all).
    let replayed = d.ok(&["events", "--sandbox", &id, "--no-follow"]);
    assert_eq!(replayed, feed);
    // A terminal session from piped input: the program's output, then its exit code (the
    // local end of input reaches it as ^D after the typed lines).
    let mut shell = d.cli_cmd(&["shell", "cli-box", "--", "sh"]);
    shell
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = shell.spawn().unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        b"stty size; echo tty-$((6*7))\nexit 5\n",
    )
    .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}");
    assert!(text.contains("24 80") && text.contains("tty-42"), "{text}");
    let url = d.json(&["url", "cli-box", "8080", "--expires-in", "60"]);
    assert_eq!(
        url["path"].as_str(),
        Some(format!("/v1/sandboxes/{id}/ports/8080/").as_str()),
        "{url}"
    );
    // Egress lists: set at create (implying internet), shown, replaced live, refused with
    // the reason.
    let net_id = d
        .ok(&[
            "create",
            "--memory-mb",
            "64",
            "--allow-out",
            "api.example.test",
            "--deny-out",
            "*.bad.example.test",
        ])
        .trim()
        .to_string();
    let net = d.json(&["network", &net_id]);
    assert_eq!(
        (
            net["mode"].as_str(),
            net["allow_out"][0].as_str(),
            net["deny_out"][0].as_str()
        ),
        (
            Some("internet"),
            Some("api.example.test"),
            Some("*.bad.example.test")
        ),
        "{net}"
    );
    assert_eq!(
        d.ok(&[
            "network",
            &net_id,
            "--allow-out",
            "198.51.100.0/24",
            "--allow-out",
            "*.example.test",
            "--clear-deny"
        ]),
        "mode      internet\nallow_out 198.51.100.0/24 *.example.test\ndeny_out  -\n"
    );
    let refused = d.cli(&["network", &net_id, "--allow-out", "a.*.example.test"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("first label"),
        "{err}"
    );
    assert_eq!(
        d.json(&["network", &net_id])["allow_out"][1].as_str(),
        Some("*.example.test")
    );
    d.ok(&["rm", &net_id]);
    assert!(d
        .ok(&["url", "cli-box", "8080"])
        .contains("sandfork_signature="));
    // Terminal sessions are not in the sandbox log (it is empty here); lines are checked
    // by the SDK's tests.
    assert_eq!(d.ok(&["logs", "cli-box", "--tail", "5"]), "");
    // `watch` prints changes as they happen, one line each, until stopped.
    d.sh(&id, "mkdir -p /tmp/w");
    let mut watch = d.cli_cmd(&["watch", "cli-box", "/tmp/w"]);
    let mut child = watch.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let first = std::thread::spawn(move || lines.next().map(|l| l.unwrap()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !first.is_finished() && std::time::Instant::now() < deadline {
        d.sh(&id, "echo x > /tmp/w/f-$RANDOM$RANDOM");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = first.join().unwrap().unwrap_or_default();
    assert!(
        line.starts_with("create") && line.contains("/tmp/w/f-"),
        "{line}"
    );
    let all = d.json(&["stats"]);
    assert_eq!(all["stats"].as_array().map(Vec::len), Some(2), "{all}");
    assert!(d.json(&["inspect", "cli-box"])["expires_at"].is_null());
    assert_eq!(d.ok(&["rm", other]).trim(), other);
    let table = d.ok(&["ls"]);
    assert!(
        table.starts_with("ID") && table.contains(&id) && table.contains("cli-box"),
        "{table}"
    );
    let sb = d.json(&["inspect", "cli-box"]);
    assert_eq!(
        (sb["id"].as_str(), sb["state"].as_str()),
        (Some(id.as_str()), Some("running"))
    );
    assert_eq!(
        d.ok(&["exec", "cli-box", "--", "sh", "-c", "echo $GREETING"]),
        "hi\n"
    );
    let out = d.cli(&["exec", &id, "--", "sh", "-c", "exit 42"]);
    assert_eq!(out.status.code(), Some(42));
    let host = d.dir.path().join("up.txt");
    std::fs::write(&host, "payload\n").unwrap();
    d.ok(&[
        "cp",
        host.to_str().unwrap(),
        &format!("{id}:/root/in/up.txt"),
    ]);
    assert_eq!(
        d.ok(&["exec", &id, "--", "cat", "/root/in/up.txt"]),
        "payload\n"
    );
    let back = d.dir.path().join("down.txt");
    d.ok(&[
        "cp",
        &format!("{id}:/root/in/up.txt"),
        back.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "payload\n");
    let result = d.json(&["exec", &id, "--", "echo", "j"]);
    assert_eq!(
        (result["stdout"].as_str(), result["exit_code"].as_i64()),
        (Some("j\n"), Some(0))
    );
    assert_eq!(d.ok(&["rm", &id]).trim(), id);
    assert!(
        traces(&d.data(), &id).is_empty(),
        "{:?}",
        traces(&d.data(), &id)
    );
}

#[test]
fn errors_are_one_line_with_a_failing_exit_code() {
    let d = Daemon::start();
    for (args, want) in [
        (vec!["inspect", "nope"], "error: Sandbox nope not found\n"),
        (
            vec!["exec", "nope", "--", "true"],
            "error: Sandbox nope not found\n",
        ),
        (
            vec!["create", "--image", "missing"],
            "error: Image missing not found",
        ),
        (
            vec!["create", "--env", "BAD"],
            "error: invalid --env \"BAD\": use K=V\n",
        ),
        (
            vec!["cp", "a", "b"],
            "error: one side of cp must be ID:/path\n",
        ),
    ] {
        let out = d.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.starts_with(want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let out = Command::new(BIN)
        .args(["ls"])
        .env("SANDFORK_URL", "unix:///nonexistent/x.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the daemon"));
}

/// The client flags are global (they may follow any client verb) but are no part of the
/// daemon's or the gateway's help; every option of every verb says what it is.
#[test]
fn help_shows_each_verb_its_own_flags_each_described() {
    let help = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let client = ["--url <URL>", "--token <TOKEN>", "--json"];
    for verb in ["serve", "gateway"] {
        let text = help(&[verb, "--help"]);
        assert!(text.contains("--data-dir") || verb == "gateway", "{text}");
        for flag in client {
            assert!(!text.contains(flag), "{verb} --help shows {flag}:\n{text}");
        }
    }
    for args in [&["--help"][..], &["ls", "--help"], &["exec", "--help"]] {
        let text = help(args);
        for flag in client {
            assert!(text.contains(flag), "{args:?} lacks {flag}:\n{text}");
        }
    }
    // Every option line of `serve --help` and `create --help` is followed by a description.
    for verb in ["serve", "create"] {
        let text = help(&[verb, "--help"]);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let option = line.trim_start().starts_with("--") || line.trim_start().starts_with("-h");
            if option && !line.contains("  ") {
                let next = lines.get(i + 1).map_or("", |l| l.trim());
                assert!(
                    !next.is_empty() && !next.starts_with('-'),
                    "{verb}: {line} has no description"
                );
            }
        }
    }
    // The client flags still work after a verb.
    let out = Command::new(BIN)
        .args(["ls", "--json", "--url", "unix:///nonexistent/x.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot reach the daemon at /nonexistent/x.sock"));
}

#[test]
fn images_build_list_remove() {
    let d = Daemon::start();
    let out = d.ok(&["image", "build", "tiny", "--builder", "busybox"]);
    assert!(out.starts_with("tiny ("), "{out}");
    let list = d.json(&["image", "ls"]);
    assert!(
        list["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"] == "tiny"),
        "{list}"
    );
    assert_eq!(
        d.ok(&["run", "--image", "tiny", "--", "echo", "ok"]),
        "ok\n"
    );
    d.ok(&["image", "rm", "tiny"]);
    let out = d.cli(&["image", "rm", "tiny"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn kill9_then_restart_readopts_or_cleans_up() {
    let mut d = Daemon::start();
    let kept = d.ok(&["create", "--name", "survivor"]).trim().to_string();
    let lost = d.ok(&["create"]).trim().to_string();
    d.ok(&["exec", &kept, "--", "sh", "-c", "echo before > /root/state"]);
    d.kill9();
    // While the daemon is down, one sandbox dies under it.
    let runc_root = d.data().join("runc");
    Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["kill", &lost, "KILL"])
        .status()
        .unwrap();
    assert!(eventually(10, || {
        let o = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["state", &lost])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).contains("stopped") || !o.status.success()
    }));
    d.spawn();
    let sb = d.json(&["inspect", "survivor"]);
    assert_eq!(
        (sb["id"].as_str(), sb["state"].as_str()),
        (Some(kept.as_str()), Some("running"))
    );
    assert_eq!(
        d.ok(&["exec", "survivor", "--", "cat", "/root/state"]),
        "before\n"
    );
    let gone = d.json(&["inspect", &lost]);
    assert_eq!(gone["state"], "failed", "{gone}");
    let why = gone["error"].as_str().unwrap();
    assert!(
        why.contains("while the daemon was down") || why.contains("restart"),
        "{gone}"
    );
    assert!(
        traces(&d.data(), &lost).is_empty(),
        "{:?}",
        traces(&d.data(), &lost)
    );
    d.ok(&["rm", &kept]);
    assert!(
        traces(&d.data(), &kept).is_empty(),
        "{:?}",
        traces(&d.data(), &kept)
    );
}

#[test]
fn sigterm_stops_cleanly_and_state_survives() {
    let mut d = Daemon::start();
    let id = d.ok(&["create"]).trim().to_string();
    let pid = d.pid();
    let status = d.sigterm();
    assert_eq!(
        status.code(),
        Some(0),
        "daemon {pid} exit: {status:?}\n{}",
        d.log()
    );
    assert!(!d.socket().exists(), "socket removed on shutdown");
    d.spawn();
    assert_eq!(d.json(&["inspect", &id])["state"], "running");
    assert_eq!(d.ok(&["exec", &id, "--", "echo", "again"]), "again\n");
}

#[test]
fn kill9_during_creates_leaks_nothing() {
    let mut d = Daemon::start();
    d.ok(&["run", "--", "true"]); // The default image exists before the rush.
    let url = format!("unix://{}", d.socket().display());
    let clients: Vec<Child> = (0..6)
        .map(|_| {
            Command::new(BIN)
                .args(["create", "--memory-mb", "64"])
                .env("SANDFORK_URL", &url)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(250));
    d.kill9();
    for mut c in clients {
        let _ = c.wait();
    }
    d.spawn();
    let all: Vec<Value> = ["running", "failed", "creating", "terminating"]
        .iter()
        .flat_map(|s| {
            d.json(&["ls", "--state", s])["sandboxes"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    let states: Vec<&str> = all.iter().map(|s| s["state"].as_str().unwrap()).collect();
    eprintln!("after restart: {states:?}");
    for sb in &all {
        let state = sb["state"].as_str().unwrap();
        assert!(state == "running" || state == "failed", "{sb}");
        if state == "running" {
            d.ok(&["exec", sb["id"].as_str().unwrap(), "--", "true"]);
        }
    }
    for sb in &all {
        let id = sb["id"].as_str().unwrap();
        if sb["state"] == "running" {
            d.ok(&["rm", id]);
        }
        assert!(
            traces(&d.data(), id).is_empty(),
            "{id}: {:?}",
            traces(&d.data(), id)
        );
    }
    let left = std::fs::read_dir(d.data().join("sandboxes"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "sandbox directories left");
    let runc = Command::new("runc")
        .arg("--root")
        .arg(d.data().join("runc"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    assert!(
        runc.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&runc.stdout)
    );
    let daemon = d.pid().to_string();
    let strays: Vec<String> = processes_mentioning(&d.data().to_string_lossy())
        .into_iter()
        .filter(|p| !p.contains(" serve --data-dir"))
        .collect();
    assert!(strays.is_empty(), "daemon {daemon}, strays: {strays:?}");
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused() {
    let d = Daemon::start();
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--data-dir")
        .arg(d.dir.path().join("other"))
        .arg("--socket")
        .arg(d.socket())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: Another daemon is already serving"),
        "{err}"
    );
    assert!(
        d.cli(&["ls"]).status.success(),
        "the first daemon still serves"
    );
    let bad = d.dir.path().join("bad.toml");
    std::fs::write(&bad, "max_sandbox = 3\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("max_sandbox"), "{err}");
}

#[test]
fn a_client_whose_reader_leaves_ends_quietly() {
    // `sandfork openapi` prints ~100 KB without a daemon; the reader takes one byte.
    let mut child = Command::new(BIN)
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
