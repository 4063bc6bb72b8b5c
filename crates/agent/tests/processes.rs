//! Background processes: they outlive connections and clients.

mod common;

use std::time::Duration;

use agent_client::AttachEvent;
use agent_client::{AgentClient, ClientError};
use common::{sh, sh_stdin, TestAgent};
use proto::agent::{ErrorKind, ExitStatus, OutputStream, ProcessState, StdinMode};

/// Everything an attach delivers, until its last event.
async fn attach_all(
    c: &AgentClient,
    id: u64,
    offsets: (u64, u64),
    follow: bool,
) -> (Vec<u8>, Vec<AttachEvent>) {
    let mut s = c.attach(id, offsets, follow).await.unwrap();
    let (mut stdout, mut events) = (Vec::new(), Vec::new());
    while let Some(ev) = s.next().await.unwrap() {
        match ev {
            AttachEvent::Output {
                stream: OutputStream::Stdout,
                data,
                ..
            } => stdout.extend(data),
            other => events.push(other),
        }
    }
    (stdout, events)
}

#[tokio::test]
async fn output_survives_reconnects() {
    let a = TestAgent::start().await;
    let (id, pid) = a
        .client
        .spawn(sh("echo first; sleep 0.3; echo second"))
        .await
        .unwrap();
    assert!(pid > 0);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // A brand-new client (as after a daemon restart) sees what it missed.
    let fresh = AgentClient::new(&a.sock_dir());
    let (out, events) = attach_all(&fresh, id, (0, 0), false).await;
    assert_eq!(out, b"first\n");
    assert_eq!(events, vec![AttachEvent::CaughtUp]);

    let (out, events) = attach_all(&fresh, id, (0, 0), true).await;
    assert_eq!(out, b"first\nsecond\n");
    assert!(matches!(events.last(), Some(AttachEvent::Exit(e)) if e.status == ExitStatus::Code(0)));

    // From an offset: only the rest.
    let (out, _) = attach_all(&fresh, id, (6, 0), true).await;
    assert_eq!(out, b"second\n");

    let list = fresh.list_processes().await.unwrap();
    let p = list.iter().find(|p| p.id == id).unwrap();
    assert_eq!(
        p.command,
        vec!["sh", "-c", "echo first; sleep 0.3; echo second"]
    );
    assert_eq!(p.stdout_len, 13);
    assert!(matches!(p.state, ProcessState::Exited(e) if e.status == ExitStatus::Code(0)));
}

#[tokio::test]
async fn dropped_output_is_marked() {
    let a = TestAgent::start().await;
    let (id, _) = a
        .client
        .spawn(sh("head -c 3000000 /dev/zero"))
        .await
        .unwrap();
    a.client
        .wait(id, Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let (out, events) = attach_all(&a.client, id, (0, 0), true).await;
    let ring = agent::server::RING_CAPACITY as u64;
    assert_eq!(out.len() as u64, ring);
    let dropped = AttachEvent::Dropped {
        stream: OutputStream::Stdout,
        from: 0,
        to: 3_000_000 - ring,
    };
    assert_eq!(events[0], dropped);
    assert!(matches!(events.last(), Some(AttachEvent::Exit(_))));
}

#[tokio::test]
async fn stdin_signal_and_wait() {
    let a = TestAgent::start().await;
    let (id, _) = a
        .client
        .spawn(sh_stdin(
            "while read l; do echo got $l; done; echo eof",
            StdinMode::Stream,
        ))
        .await
        .unwrap();
    a.client.write_stdin(id, b"one\ntwo\n").await.unwrap();
    a.client.close_stdin(id).await.unwrap();
    let exit = a
        .client
        .wait(id, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(exit.status, ExitStatus::Code(0));
    let (out, _) = attach_all(&a.client, id, (0, 0), true).await;
    assert_eq!(out, b"got one\ngot two\neof\n");
    let e = a.client.write_stdin(id, b"late").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Agent(ref a) if a.kind == ErrorKind::InvalidInput),
        "{e:?}"
    );

    let (id, _) = a
        .client
        .spawn(sh_stdin("sleep 30", StdinMode::Stream))
        .await
        .unwrap();
    let list = a.client.list_processes().await.unwrap();
    assert!(list.iter().any(|p| p.id == id && p.stdin_open));
    let e = a
        .client
        .wait(id, Some(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Agent(ref a) if a.kind == ErrorKind::TimedOut),
        "{e:?}"
    );
    a.client.signal(id, 15, true).await.unwrap();
    let exit = a
        .client
        .wait(id, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        exit.status,
        ExitStatus::Signal {
            signal: 15,
            core_dumped: false
        }
    );
    assert!(
        a.client.signal(id, 15, true).await.is_err(),
        "signal after exit"
    );
    // The agent lets go of the stdin of a process that ended.
    let mut open = true;
    for _ in 0..100 {
        let list = a.client.list_processes().await.unwrap();
        open = list.iter().any(|p| p.id == id && p.stdin_open);
        if !open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!open);
    assert!(
        a.client.signal(424242, 15, true).await.is_err(),
        "unknown id"
    );
    let e = a.client.wait(424242, None).await.unwrap_err();
    assert!(matches!(e, ClientError::Agent(ref a) if a.kind == ErrorKind::NotFound));
}

#[tokio::test]
async fn background_timeout_and_waiters() {
    let a = TestAgent::start().await;
    let req = proto::agent::ExecRequest {
        timeout_ms: Some(200),
        ..sh("sleep 30")
    };
    let (id, _) = a.client.spawn(req).await.unwrap();
    let waits = (0..3).map(|_| {
        let c = a.client.clone();
        tokio::spawn(async move { c.wait(id, None).await })
    });
    for w in waits.collect::<Vec<_>>() {
        let exit = w.await.unwrap().unwrap();
        assert!(exit.timed_out);
    }
}

#[tokio::test]
async fn sigterm_stops_children_and_the_agent_exits_cleanly() {
    let mut a = TestAgent::start().await;
    let (_, pid) = a.client.spawn(sh("sleep 60")).await.unwrap();
    // An orphan: its parent exits at once, so it is adopted by the agent.
    let pidfile = a.scratch().join("orphan.pid");
    let script = format!("(sleep 60 & echo $! > {}) ; true", pidfile.display());
    let out = a.client.exec_collect(sh(&script), 100).await.unwrap();
    assert_eq!(out.code(), Some(0));
    let orphan: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let status = a.stop();
    assert!(status.success(), "{status:?}");
    for p in [pid as i32, orphan] {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok();
        assert!(!alive, "process {p} outlived the agent");
    }
    assert!(!a.sock_dir().join("agent.sock").exists());
}
