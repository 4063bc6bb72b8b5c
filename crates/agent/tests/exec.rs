//! Exec against the real agent binary.

mod common;

use std::time::{Duration, Instant};

use agent_client::ClientError;
use agent_client::ExecEvent;
use common::{sh, sh_stdin, vm_hwm_kib, TestAgent};
use proto::agent::{ErrorKind, ExecRequest, ExitStatus, StdinMode};

const MAX: usize = 1 << 20;

fn agent_error(e: ClientError) -> proto::agent::AgentError {
    match e {
        ClientError::Agent(a) => a,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[tokio::test]
async fn echo_has_exact_output_and_exit_code() {
    let a = TestAgent::start().await;
    let req = ExecRequest {
        command: "echo".into(),
        args: vec!["hello".into(), "world".into()],
        ..Default::default()
    };
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert_eq!(out.stdout, b"hello world\n");
    assert_eq!(out.stderr, b"");
    assert_eq!(out.code(), Some(0));
    assert!(!out.exit.timed_out);

    let out = a
        .client
        .exec_collect(sh("echo out; echo err >&2; exit 7"), MAX)
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice(), out.code()),
        (&b"out\n"[..], &b"err\n"[..], Some(7))
    );
}

#[tokio::test]
async fn env_cwd_and_user() {
    let a = TestAgent::start().await;
    let req = ExecRequest {
        env: vec![
            ("GREETING".into(), "hi there".into()),
            ("PATH".into(), "/usr/bin:/bin".into()),
        ],
        cwd: Some("/tmp".into()),
        ..sh("echo \"$GREETING\"; pwd; echo $PATH; id -u; id -g")
    };
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi there\n/tmp\n/usr/bin:/bin\n0\n0\n"
    );

    let req = ExecRequest {
        user: Some("65534:65533".into()),
        ..sh("id -u; id -g; id -G")
    };
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "65534\n65533\n65533\n"
    );

    let req = ExecRequest {
        user: Some("nobody".into()),
        ..sh("id -un; echo $HOME $USER")
    };
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("nobody\n"),
        "{out:?}"
    );
}

#[tokio::test]
async fn stdin_bytes_and_streamed() {
    let a = TestAgent::start().await;
    let req = sh_stdin("tr a-z A-Z", StdinMode::Bytes(b"shout\n".to_vec()));
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert_eq!(out.stdout, b"SHOUT\n");

    let mut s = a
        .client
        .exec(sh_stdin("tee /dev/stderr | wc -c", StdinMode::Stream))
        .await
        .unwrap();
    let mut stdin = s.take_stdin().unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..100 {
            stdin.write(&[b'x'; 10_000]).await?;
        }
        stdin.close().await
    });
    let (mut out, mut err, mut exit) = (Vec::new(), 0usize, None);
    while let Some(ev) = s.next().await.unwrap() {
        match ev {
            ExecEvent::Stdout(d) => out.extend(d),
            ExecEvent::Stderr(d) => err += d.len(),
            ExecEvent::Exit(e) => exit = Some(e),
        }
    }
    writer.await.unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&out).trim(), "1000000");
    assert_eq!(err, 1_000_000);
    assert_eq!(exit.unwrap().status, ExitStatus::Code(0));

    // Stdin mode None: the process reads end of file at once.
    let out = a
        .client
        .exec_collect(sh("cat; echo done"), MAX)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"done\n");
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let a = TestAgent::start().await;
    let marker = a.scratch().join("survivor");
    let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
    let req = ExecRequest {
        timeout_ms: Some(300),
        ..sh(&script)
    };
    let start = Instant::now();
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(out.exit.timed_out);
    assert_eq!(
        out.exit.status,
        ExitStatus::Signal {
            signal: 9,
            core_dumped: false
        }
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !marker.exists(),
        "the background child of the timed-out command survived"
    );
}

#[tokio::test]
async fn exit_by_signal() {
    let a = TestAgent::start().await;
    let out = a
        .client
        .exec_collect(sh("kill -TERM $$"), MAX)
        .await
        .unwrap();
    assert_eq!(
        out.exit.status,
        ExitStatus::Signal {
            signal: 15,
            core_dumped: false
        }
    );
    assert_eq!(out.code(), None);
    assert!(!out.exit.timed_out);
}

#[tokio::test]
async fn missing_binary_and_bad_cwd_are_clear_errors() {
    let a = TestAgent::start().await;
    let req = ExecRequest {
        command: "/bin/nope".into(),
        ..Default::default()
    };
    let e = agent_error(a.client.exec(req).await.err().unwrap());
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, "/bin/nope: no such file or directory");

    let req = ExecRequest {
        command: "no-such-command-xyz".into(),
        ..Default::default()
    };
    let e = agent_error(a.client.exec(req).await.err().unwrap());
    assert_eq!(
        (e.kind, e.message.as_str()),
        (
            ErrorKind::NotFound,
            "no-such-command-xyz: command not found in PATH"
        )
    );

    let req = ExecRequest {
        cwd: Some("/no/such/dir".into()),
        ..sh("true")
    };
    let e = agent_error(a.client.exec(req).await.err().unwrap());
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("/no/such/dir"), "{}", e.message);

    let req = ExecRequest {
        user: Some("no-such-user".into()),
        ..sh("true")
    };
    assert_eq!(
        agent_error(a.client.exec(req).await.err().unwrap()).kind,
        ErrorKind::NotFound
    );

    // A file that exists but cannot be executed.
    let plain = a.scratch().join("plain-file");
    std::fs::write(&plain, "not a program").unwrap();
    let req = ExecRequest {
        command: plain.to_string_lossy().into(),
        ..Default::default()
    };
    assert_eq!(
        agent_error(a.client.exec(req).await.err().unwrap()).kind,
        ErrorKind::PermissionDenied
    );
}

#[tokio::test]
async fn large_output_streams_with_bounded_memory() {
    let a = TestAgent::start().await;
    let total: u64 = 100_000_000;
    let mut s = a
        .client
        .exec(sh(&format!("head -c {total} /dev/zero")))
        .await
        .unwrap();
    // Let the agent hit backpressure before reading anything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut got = 0u64;
    let mut biggest = 0usize;
    let exit = loop {
        match s.next().await.unwrap().unwrap() {
            ExecEvent::Stdout(d) => {
                biggest = biggest.max(d.len());
                got += d.len() as u64;
            }
            ExecEvent::Stderr(_) => panic!("unexpected stderr"),
            ExecEvent::Exit(e) => break e,
        }
    };
    assert_eq!(got, total);
    assert_eq!(exit.status, ExitStatus::Code(0));
    assert!(biggest <= 64 << 10, "chunks are bounded, got {biggest}");
    let hwm = vm_hwm_kib(a.pid());
    let own = vm_hwm_kib(std::process::id() as i32);
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "100 MB exec: {:.0} MB/s, agent peak RSS {hwm} KiB, client peak RSS {own} KiB",
        total as f64 / 1e6 / secs
    );
    assert!(hwm > 0 && hwm < 32 << 10, "agent peak RSS {hwm} KiB");
    assert!(own > 0 && own < 64 << 10, "client peak RSS {own} KiB");
}

#[tokio::test]
async fn client_disconnect_kills_the_process() {
    let a = TestAgent::start().await;
    let marker = a.scratch().join("still-running");
    let s = a
        .client
        .exec(sh(&format!("sleep 1; touch {}", marker.display())))
        .await
        .unwrap();
    let pid = s.pid() as i32;
    drop(s);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!marker.exists());
    assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err());
}

#[tokio::test]
async fn concurrent_execs() {
    let a = TestAgent::start().await;
    let runs = (0..20).map(|i| {
        let c = a.client.clone();
        async move { c.exec_collect(sh(&format!("echo {i}")), MAX).await }
    });
    let outs = futures_join_all(runs).await;
    for (i, out) in outs.into_iter().enumerate() {
        assert_eq!(out.unwrap().stdout, format!("{i}\n").as_bytes());
    }
}

async fn futures_join_all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn exec_round_trip_latency() {
    let a = TestAgent::start().await;
    let req = || ExecRequest {
        command: "true".into(),
        ..Default::default()
    };
    let mut times = Vec::new();
    for _ in 0..50 {
        let start = Instant::now();
        let out = a.client.exec_collect(req(), MAX).await.unwrap();
        times.push(start.elapsed());
        assert_eq!(out.code(), Some(0));
    }
    times.sort();
    let (p50, p99) = (times[25], times[49]);
    eprintln!("exec `true` round trip: p50 {p50:?}, max {p99:?}");
    assert!(p50 < Duration::from_millis(100), "p50 {p50:?}");
}

#[tokio::test]
async fn exit_is_not_held_back_by_descendants() {
    let a = TestAgent::start().await;
    // A background writer that keeps the pipes open and never stops.
    let req = ExecRequest {
        timeout_ms: Some(20_000),
        ..sh("(while :; do echo bg; sleep 0.01; done) & echo main")
    };
    let start = Instant::now();
    let out = a.client.exec_collect(req, MAX).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.code(), Some(0));
    assert!(out.stdout.starts_with(b"main\n") || out.stdout.windows(5).any(|w| w == b"main\n"));
    // One that goes quiet is waited for only briefly.
    let start = Instant::now();
    let out = a
        .client
        .exec_collect(sh("sleep 5 & echo quick"), MAX)
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.stdout, b"quick\n");
}
