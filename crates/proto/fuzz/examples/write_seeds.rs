//! Writes the seed corpora of this crate's fuzz targets into `seeds/<target>/`:
//! `cargo run --example write_seeds` from crates/proto/fuzz.

use std::path::Path;

use proto::agent::*;

fn frames(msgs: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        encode_into(m, &mut out).expect("encodes");
    }
    out
}

fn stat(kind: FileKind, size: u64) -> FileStat {
    FileStat {
        kind,
        size,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime_unix_ms: 1,
    }
}

fn exit(code: i32) -> Message {
    Message::Exit(ExitInfo {
        status: ExitStatus::Code(code),
        timed_out: false,
    })
}

fn output(stream: OutputStream, data: &[u8]) -> Message {
    Message::Output {
        stream,
        offset: 0,
        data: data.to_vec(),
    }
}

fn requests() -> Vec<(&'static str, Vec<Message>)> {
    let exec = ExecRequest {
        command: "sh".into(),
        args: vec!["-c".into(), "echo hi".into()],
        env: vec![("A".into(), "B".into())],
        cwd: Some("/".into()),
        user: Some("1000:1000".into()),
        stdin: StdinMode::Stream,
        timeout_ms: Some(1000),
    };
    let req = |r: Request| Message::Request(r);
    vec![
        ("hello", vec![req(Request::Hello)]),
        (
            "exec-stream",
            vec![
                req(Request::Exec(exec.clone())),
                Message::Data(b"in".to_vec()),
                Message::Eof,
            ],
        ),
        ("spawn", vec![req(Request::Spawn(exec))]),
        (
            "write-file",
            vec![
                req(Request::WriteFile {
                    path: "/tmp/f".into(),
                    mode: Some(0o600),
                    create_parents: true,
                }),
                Message::Data(vec![7; 100]),
                Message::Eof,
            ],
        ),
        (
            "attach",
            vec![req(Request::Attach {
                id: 1,
                stdout_offset: 5,
                stderr_offset: 0,
                follow: true,
            })],
        ),
        (
            "signal",
            vec![req(Request::Signal {
                id: 1,
                signal: 15,
                group: true,
            })],
        ),
        (
            "identity",
            vec![req(Request::SetIdentity(Identity {
                sandbox_id: "sb-1".into(),
                fork_index: 3,
                seed: vec![9; 32],
                parent_snapshot_id: Some("snap-1".into()),
                env: vec![("K".into(), "V".into())],
            }))],
        ),
    ]
}

/// Replies, each with the number of the client call (see agent_reply_stream.rs) first.
fn replies() -> Vec<(&'static str, u8, Vec<Message>)> {
    use OutputStream::*;
    let hello = HelloInfo {
        agent_version: "0.1.0".into(),
        protocol_version: PROTOCOL_VERSION,
        uptime_ms: 5,
        boot_id: "ab".into(),
        pid: 1,
        identity: None,
    };
    let started = Message::Started { pid: 7 };
    let proc_info = ProcessInfo {
        id: 1,
        pid: 7,
        command: vec!["sleep".into(), "9".into()],
        state: ProcessState::Exited(ExitInfo {
            status: ExitStatus::Signal {
                signal: 9,
                core_dumped: false,
            },
            timed_out: true,
        }),
        started_unix_ms: 1,
        stdout_len: 3,
        stderr_len: 0,
        stdin_open: false,
    };
    let err = Message::Error(AgentError::new(ErrorKind::NotFound, "no such file"));
    vec![
        ("hello", 0, vec![Message::Hello(hello)]),
        (
            "exec-collect",
            1,
            vec![
                started.clone(),
                output(Stdout, b"hi\n"),
                output(Stderr, b"oops"),
                exit(0),
            ],
        ),
        (
            "exec-stream",
            2,
            vec![started, output(Stdout, b"x"), exit(3)],
        ),
        (
            "read-bytes",
            3,
            vec![
                Message::Stat(stat(FileKind::File, 4)),
                Message::Data(b"data".to_vec()),
                Message::Eof,
            ],
        ),
        (
            "read-copy",
            4,
            vec![Message::Stat(stat(FileKind::File, 0)), Message::Eof],
        ),
        (
            "list-dir",
            5,
            vec![
                Message::DirEntries(vec![DirEntry {
                    name: "a".into(),
                    stat: stat(FileKind::Dir, 0),
                }]),
                Message::Eof,
            ],
        ),
        ("stat-error", 6, vec![err]),
        ("processes", 7, vec![Message::Processes(vec![proc_info])]),
        (
            "attach",
            8,
            vec![
                Message::OutputDropped {
                    stream: Stdout,
                    from: 0,
                    to: 10,
                },
                output(Stdout, b"tail"),
                Message::Eof,
            ],
        ),
        ("wait", 9, vec![exit(1)]),
        ("spawn", 10, vec![Message::Spawned { id: 1, pid: 7 }]),
        (
            "write-file",
            11,
            vec![Message::Done, Message::Written { bytes: 4 }],
        ),
        ("mkdir", 12, vec![Message::Done]),
        ("identity", 13, vec![Message::Done]),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("create seeds dir");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

fn main() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let preamble = Preamble::current().to_bytes();
    for (name, msgs) in requests() {
        let bytes = frames(&msgs);
        write(&seeds.join("decode_frame"), name, &frames(&msgs[..1]));
        let stream = [&preamble[..], &bytes].concat();
        write(&seeds.join("agent_request_stream"), name, &stream);
    }
    for (name, op, msgs) in replies() {
        let bytes = frames(&msgs);
        write(
            &seeds.join("decode_frame"),
            &format!("reply-{name}"),
            &frames(&msgs[..1]),
        );
        write(
            &seeds.join("agent_reply_stream"),
            name,
            &[&[op][..], &bytes].concat(),
        );
    }
}
