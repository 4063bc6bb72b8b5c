//! Freezes the agent wire format: one sample of every message variant is encoded and
//! compared with `fixtures/agent-v{PROTOCOL_VERSION}.hex`. A change to the encoding without
//! a version bump fails here; variants appended at the end of an enum within a version are
//! recorded with `SANDFORK_BLESS=1` (every frozen line must still match). After bumping the version, write the new fixture with
//! `SANDFORK_BLESS=1 cargo nextest run -p sandfork-proto` and keep the old ones.

use std::path::PathBuf;

use proto::agent::*;

fn exec_request() -> ExecRequest {
    ExecRequest {
        command: "sh".into(),
        args: vec!["-c".into(), "echo hi".into()],
        env: vec![("A".into(), "1".into())],
        cwd: Some("/tmp".into()),
        user: Some("1000:1000".into()),
        stdin: StdinMode::Bytes(b"in".to_vec()),
        timeout_ms: Some(1500),
    }
}

fn stat() -> FileStat {
    FileStat {
        kind: FileKind::File,
        size: 5,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime_unix_ms: -7,
    }
}

fn identity() -> Identity {
    Identity {
        sandbox_id: "sb-1".into(),
        fork_index: 3,
        seed: vec![0xab; 4],
        parent_snapshot_id: Some("snap-1".into()),
        env: vec![("K".into(), "V".into())],
    }
}

fn restart_policy() -> RestartPolicy {
    RestartPolicy {
        when: RestartWhen::OnFailure,
        max_restarts: Some(3),
        initial_backoff_ms: 500,
        max_backoff_ms: 30_000,
    }
}

fn health_check() -> HealthCheck {
    HealthCheck {
        probe: HealthProbe::Http { path: "/".into() },
        port: 8080,
        initial_delay_ms: 5000,
        interval_ms: 1000,
        timeout_ms: 500,
        failure_threshold: 3,
    }
}

fn exit() -> ExitInfo {
    ExitInfo {
        status: ExitStatus::Signal {
            signal: 9,
            core_dumped: false,
        },
        timed_out: true,
    }
}

/// The name of a request variant; the exhaustive match makes a new variant fail to
/// compile until it gets a sample here.
fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Hello => "Request::Hello",
        Request::Exec(_) => "Request::Exec",
        Request::Spawn(_) => "Request::Spawn",
        Request::ListProcesses => "Request::ListProcesses",
        Request::Attach { .. } => "Request::Attach",
        Request::WriteStdin { .. } => "Request::WriteStdin",
        Request::CloseStdin { .. } => "Request::CloseStdin",
        Request::Signal { .. } => "Request::Signal",
        Request::Wait { .. } => "Request::Wait",
        Request::ReadFile { .. } => "Request::ReadFile",
        Request::WriteFile { .. } => "Request::WriteFile",
        Request::ListDir { .. } => "Request::ListDir",
        Request::Stat { .. } => "Request::Stat",
        Request::Remove { .. } => "Request::Remove",
        Request::Mkdir { .. } => "Request::Mkdir",
        Request::SetIdentity(_) => "Request::SetIdentity",
        Request::Restart { .. } => "Request::Restart",
        Request::Stop { .. } => "Request::Stop",
        Request::WatchDir { .. } => "Request::WatchDir",
        Request::SpawnPty { .. } => "Request::SpawnPty",
        Request::PtyConnect { .. } => "Request::PtyConnect",
        Request::ResizePty { .. } => "Request::ResizePty",
        Request::Logs { .. } => "Request::Logs",
        Request::WriteFileAs { .. } => "Request::WriteFileAs",
    }
}

fn message_name(m: &Message) -> &'static str {
    match m {
        Message::Request(r) => request_name(r),
        Message::Data(_) => "Data",
        Message::Eof => "Eof",
        Message::Hello(_) => "Hello",
        Message::Done => "Done",
        Message::Error(_) => "Error",
        Message::Started { .. } => "Started",
        Message::Output { .. } => "Output",
        Message::OutputDropped { .. } => "OutputDropped",
        Message::Exit(_) => "Exit",
        Message::Spawned { .. } => "Spawned",
        Message::Processes(_) => "Processes",
        Message::Written { .. } => "Written",
        Message::DirEntries(_) => "DirEntries",
        Message::Stat(_) => "Stat",
        Message::FsEvents(_) => "FsEvents",
        Message::PtyResize(_) => "PtyResize",
        Message::LogLines(_) => "LogLines",
    }
}

fn requests() -> Vec<Request> {
    let path = || "/a/b".to_string();
    vec![
        Request::Hello,
        Request::Exec(exec_request()),
        Request::Spawn(SpawnRequest {
            exec: ExecRequest {
                stdin: StdinMode::Stream,
                ..exec_request()
            },
            name: Some("web".into()),
            stdout: OutputMode::Capture,
            stderr: OutputMode::Discard,
            restart: Some(restart_policy()),
            health: Some(health_check()),
        }),
        Request::ListProcesses,
        Request::Attach {
            id: 7,
            stdout_offset: 1 << 20,
            stderr_offset: 0,
            follow: true,
        },
        Request::WriteStdin {
            id: 7,
            data: b"x".to_vec(),
        },
        Request::CloseStdin { id: 7 },
        Request::Signal {
            id: 7,
            signal: 15,
            group: true,
        },
        Request::Wait {
            id: 7,
            timeout_ms: None,
        },
        Request::ReadFile {
            path: path(),
            offset: 10,
            limit: Some(20),
        },
        Request::WriteFile {
            path: path(),
            mode: Some(0o600),
            create_parents: true,
        },
        Request::ListDir { path: path() },
        Request::Stat { path: path() },
        Request::Remove {
            path: path(),
            recursive: true,
        },
        Request::Mkdir {
            path: path(),
            parents: false,
            mode: None,
        },
        Request::SetIdentity(identity()),
        Request::Restart { id: 7 },
        Request::Stop { id: 7 },
        Request::WatchDir {
            path: path(),
            recursive: true,
        },
        Request::SpawnPty {
            spawn: SpawnRequest::from(exec_request()),
            size: PtySize { cols: 80, rows: 24 },
        },
        Request::PtyConnect { id: 7, offset: 300 },
        Request::ResizePty {
            id: 7,
            size: PtySize {
                cols: 120,
                rows: 40,
            },
        },
        Request::Logs {
            since: 5,
            follow: true,
        },
        Request::WriteFileAs {
            path: "/home/user/a".into(),
            mode: Some(0o600),
            create_parents: true,
            uid: 1000,
            gid: 1000,
        },
    ]
}

fn samples() -> Vec<Message> {
    let mut out: Vec<Message> = requests().into_iter().map(Message::Request).collect();
    out.extend([
        Message::Data(vec![0, 1, 2, 255]),
        Message::Eof,
        Message::Hello(HelloInfo {
            agent_version: "0.1.0".into(),
            protocol_version: 2,
            uptime_ms: 1234,
            boot_id: "00ff".into(),
            pid: 1,
            identity: Some(identity()),
        }),
        Message::Done,
        Message::Error(AgentError::new(
            ErrorKind::NotFound,
            "/bin/nope: no such file",
        )),
        Message::Started { pid: 42 },
        Message::Output {
            stream: OutputStream::Stderr,
            offset: 300,
            data: b"err".to_vec(),
        },
        Message::OutputDropped {
            stream: OutputStream::Stdout,
            from: 0,
            to: 4096,
        },
        Message::Exit(exit()),
        Message::Spawned { id: 1, pid: 43 },
        Message::Processes(vec![ProcessInfo {
            id: 1,
            pid: 43,
            command: vec!["sleep".into(), "1".into()],
            state: ProcessState::Exited(ExitInfo {
                status: ExitStatus::Code(2),
                timed_out: false,
            }),
            started_unix_ms: 1_700_000_000_000,
            stdout_len: 5,
            stderr_len: 0,
            stdin_open: false,
            name: Some("web".into()),
            ended_unix_ms: Some(1_700_000_000_500),
            managed: Some(ManagedInfo {
                status: ManagedStatus::BackingOff,
                restart_count: 2,
                restart: Some(restart_policy()),
                health: Some(health_check()),
                health_status: HealthStatus::Unhealthy,
                consecutive_health_failures: 3,
                last_exit: Some((exit(), 1_700_000_000_400)),
                last_error: Some("x".into()),
                next_restart_unix_ms: Some(1_700_000_001_000),
            }),
        }]),
        Message::Written { bytes: 1 << 30 },
        Message::DirEntries(vec![DirEntry {
            name: "f".into(),
            stat: stat(),
        }]),
        Message::Stat(FileStat {
            kind: FileKind::Symlink,
            ..stat()
        }),
        Message::FsEvents(vec![FsEvent {
            kind: FsEventKind::Rename,
            path: "/a/c".into(),
            old_path: Some("/a/b".into()),
            is_dir: false,
        }]),
        Message::PtyResize(PtySize {
            cols: 100,
            rows: 30,
        }),
        Message::LogLines(vec![LogLine {
            seq: 7,
            unix_ms: 1_700_000_000_000,
            process: 2,
            stream: OutputStream::Stderr,
            text: b"oops".to_vec(),
        }]),
    ]);
    out
}

fn all_error_kinds() -> Vec<Message> {
    use ErrorKind::*;
    [
        NotFound,
        PermissionDenied,
        TooLarge,
        IsADirectory,
        NotADirectory,
        AlreadyExists,
    ]
    .into_iter()
    .chain([InvalidInput, TimedOut, Other])
    .map(|k| Message::Error(AgentError::new(k, "")))
    .chain(
        [FileKind::File, FileKind::Dir, FileKind::Other].map(|kind| {
            Message::DirEntries(vec![DirEntry {
                name: String::new(),
                stat: FileStat { kind, ..stat() },
            }])
        }),
    )
    .chain([Message::Request(Request::Exec(ExecRequest::default()))])
    .collect()
}

fn render() -> String {
    let mut out = String::new();
    for m in samples().iter().chain(all_error_kinds().iter()) {
        let frame = encode_frame(m).expect("encodes");
        assert_eq!(&decode_frame(&frame).expect("decodes"), m, "round trip");
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{} {hex}\n", message_name(m)));
    }
    out
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/agent-v{PROTOCOL_VERSION}.hex"))
}

#[test]
fn every_variant_has_a_sample() {
    let names: std::collections::BTreeSet<_> = samples().iter().map(message_name).collect();
    assert_eq!(names.len(), samples().len(), "one sample per variant");
    assert_eq!(
        names.len(),
        18 + 24 - 1,
        "17 non-request variants + 24 requests"
    );
}

#[test]
fn wire_format_matches_fixture() {
    let rendered = render();
    let path = fixture();
    if std::env::var_os("SANDFORK_BLESS").is_some() && !path.exists() {
        std::fs::write(&path, &rendered).expect("write fixture");
    }
    let frozen = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: a new protocol version needs its fixture",
            path.display()
        )
    });
    // Every frozen frame still encodes byte for byte; a version may only gain variants
    // appended at the end of its enums (new lines), which older peers refuse cleanly.
    let changed: Vec<&str> = frozen
        .lines()
        .filter(|l| !rendered.lines().any(|r| r == *l))
        .collect();
    assert!(
        changed.is_empty(),
        "the agent wire format changed without a PROTOCOL_VERSION bump; see docs/agent-protocol.md\n\
         no longer encoded so:\n{}\nnow:\n{rendered}",
        changed.join("\n")
    );
    if rendered != frozen {
        assert!(
            std::env::var_os("SANDFORK_BLESS").is_some(),
            "variants were added: record them with SANDFORK_BLESS=1\nnow:\n{rendered}"
        );
        std::fs::write(&path, &rendered).expect("write fixture");
    }
}

#[test]
fn preamble_is_frozen() {
    assert_eq!(Preamble { version: 1 }.to_bytes(), *b"SFAG\x01\x00");
    assert_eq!(Preamble { version: 2 }.to_bytes(), *b"SFAG\x02\x00");
}
