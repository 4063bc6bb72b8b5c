//! Hostile peers on both sides: a planted symlink must not redirect the host, and broken
//! frames must not hurt the agent.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use agent_client::{AgentClient, ClientError};
use common::TestAgent;
use proto::agent::{encode_frame, Message, Preamble, Request, MAX_FRAME};

#[tokio::test]
async fn symlinked_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A "host" socket that a sandbox would like to reach.
    let target = dir.path().join("host-api.sock");
    let listener = UnixListener::bind(&target).unwrap();
    listener.set_nonblocking(true).unwrap();
    let sock_dir = dir.path().join("run");
    std::fs::create_dir(&sock_dir).unwrap();
    std::os::unix::fs::symlink(&target, sock_dir.join("agent.sock")).unwrap();

    let err = AgentClient::new(&sock_dir).hello().await.unwrap_err();
    assert!(matches!(err, ClientError::NotASocket(_)), "{err:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        listener.accept().is_err(),
        "the host socket was connected to"
    );

    // A regular file or a directory in its place is refused too.
    std::fs::remove_file(sock_dir.join("agent.sock")).unwrap();
    std::fs::write(sock_dir.join("agent.sock"), "").unwrap();
    let err = AgentClient::new(&sock_dir).hello().await.unwrap_err();
    assert!(matches!(err, ClientError::NotASocket(_)), "{err:?}");

    // A real socket in its place is connected to (this one never answers).
    std::fs::remove_file(sock_dir.join("agent.sock")).unwrap();
    let real = UnixListener::bind(sock_dir.join("agent.sock")).unwrap();
    real.set_nonblocking(true).unwrap();
    let client = AgentClient::new(&sock_dir);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), client.hello())
            .await
            .is_err()
    );
    assert!(real.accept().is_ok());
}

fn raw(a: &TestAgent) -> UnixStream {
    let s = UnixStream::connect(a.sock_dir().join("agent.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until the agent closes the connection; returns what it sent. (A close with our
/// bytes still unread shows as a reset after its data.)
fn read_to_close(mut s: UnixStream) -> Vec<u8> {
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("agent did not close the connection: {e}"),
    }
    out
}

#[tokio::test]
async fn malformed_frames_close_only_that_connection() {
    let a = TestAgent::start().await;
    let preamble = Preamble::current().to_bytes();
    let oversized = ((MAX_FRAME + 1) as u32).to_le_bytes();
    let mut garbage = preamble.to_vec();
    garbage.extend_from_slice(&[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]);
    let mut trailing = preamble.to_vec();
    let mut hello = encode_frame(&Message::Request(Request::Hello)).unwrap();
    hello[0] += 1;
    hello.push(0);
    trailing.extend_from_slice(&hello);
    let cases: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        [&preamble[..], &oversized[..]].concat(),
        [&preamble[..], &u32::MAX.to_le_bytes()[..]].concat(),
        garbage,
        trailing,
        [&preamble[..], &encode_frame(&Message::Eof).unwrap()[..]].concat(),
    ];
    for case in cases {
        let mut s = raw(&a);
        s.write_all(&case).unwrap();
        let reply = read_to_close(s);
        assert!(
            reply.len() >= Preamble::LEN,
            "the agent answers with its preamble"
        );
    }
    // A peer that sends nothing, and one that vanishes mid-frame, do not stall others.
    let _idle = raw(&a);
    let mut half = raw(&a);
    half.write_all(&preamble).unwrap();
    half.write_all(&[100, 0, 0, 0, 1, 2]).unwrap();
    drop(half);
    let hello = a.client.hello().await.unwrap();
    assert_eq!(hello.pid, a.pid() as u32);
}

#[tokio::test]
async fn version_mismatch_is_reported() {
    let a = TestAgent::start().await;
    let mut s = raw(&a);
    let mut future = Preamble { version: 999 }.to_bytes().to_vec();
    future.extend(encode_frame(&Message::Request(Request::Hello)).unwrap());
    s.write_all(&future).unwrap();
    let reply = read_to_close(s);
    assert_eq!(
        Preamble::parse(reply[..6].try_into().unwrap()).unwrap(),
        Preamble::current()
    );
    let rest = proto::agent::decode_frame(&reply[6..]).unwrap();
    assert!(
        matches!(rest, Message::Error(ref e) if e.message.contains("999")),
        "{rest:?}"
    );
}

#[tokio::test]
async fn client_rejects_a_hostile_agent() {
    // A fake agent: answers the preamble, then announces an oversized frame.
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("agent.sock")).unwrap();
    let server = std::thread::spawn(move || {
        for reply in [
            &((MAX_FRAME as u32) + 1).to_le_bytes()[..],
            &[3, 0, 0, 0, 0xff, 0xff, 0xff][..],
        ] {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            s.write_all(&Preamble::current().to_bytes()).unwrap();
            s.write_all(reply).unwrap();
        }
    });
    let c = AgentClient::new(dir.path());
    let e = c.hello().await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Protocol(proto::agent::ProtoError::FrameTooLarge(_))
        ),
        "{e:?}"
    );
    let e = c.hello().await.unwrap_err();
    assert!(matches!(e, ClientError::Protocol(_)), "{e:?}");
    server.join().unwrap();
}

#[tokio::test]
async fn identity_is_written_and_exported() {
    let a = TestAgent::start().await;
    let id = proto::agent::Identity {
        sandbox_id: "sb-7".into(),
        fork_index: 4,
        seed: vec![0x01, 0xab],
        parent_snapshot_id: Some("snap-1".into()),
        env: vec![("SECRET".into(), "s3".into())],
    };
    a.client.set_identity(id.clone()).await.unwrap();
    let file = std::fs::read_to_string(a.scratch().join("etc-sandfork/fork")).unwrap();
    assert!(
        file.contains("SANDFORK_FORK_INDEX=4\n") && file.contains("SANDFORK_FORK_SEED=01ab\n"),
        "{file}"
    );
    assert_eq!(a.client.hello().await.unwrap().identity, Some(id));
    let out = a
        .client
        .exec_collect(common::sh("echo $SANDFORK_FORK_INDEX $SECRET"), 100)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"4 s3\n");
    let bad = proto::agent::Identity {
        sandbox_id: "../x\n".into(),
        fork_index: 0,
        seed: vec![],
        parent_snapshot_id: None,
        env: vec![],
    };
    assert!(matches!(
        a.client.set_identity(bad).await,
        Err(ClientError::Agent(_))
    ));
}

/// Splits a byte string into the frames it holds.
fn frames(mut bytes: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize + 4;
        out.push(proto::agent::decode_frame(&bytes[..len]).unwrap());
        bytes = &bytes[len..];
    }
    out
}

#[tokio::test]
async fn a_protocol_violation_mid_exec_kills_the_process() {
    let a = TestAgent::start().await;
    let mut s = raw(&a);
    let req = proto::agent::ExecRequest {
        stdin: proto::agent::StdinMode::Stream,
        ..common::sh("sleep 30")
    };
    let mut bytes = Preamble::current().to_bytes().to_vec();
    bytes.extend(encode_frame(&Message::Request(Request::Exec(req))).unwrap());
    bytes.extend(encode_frame(&Message::Data(b"ok".to_vec())).unwrap());
    // Not valid once the request is under way.
    bytes.extend(encode_frame(&Message::Request(Request::Hello)).unwrap());
    s.write_all(&bytes).unwrap();
    let start = std::time::Instant::now();
    let reply = read_to_close(s);
    assert!(start.elapsed() < Duration::from_secs(5));
    let got = frames(&reply[Preamble::LEN..]);
    assert!(matches!(got[0], Message::Started { .. }), "{got:?}");
    let killed = proto::agent::ExitStatus::Signal {
        signal: 9,
        core_dumped: false,
    };
    assert!(
        matches!(got.last(), Some(Message::Exit(e)) if e.status == killed),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_request_from_a_newer_host_is_refused_as_one_this_agent_predates() {
    // A request variant past the last this agent knows (as a newer host appends them):
    // `Message::Request` (variant 0) of request variant 127.
    let a = TestAgent::start().await;
    let mut s = raw(&a);
    let mut frame = Preamble::current().to_bytes().to_vec();
    frame.extend_from_slice(&[2, 0, 0, 0, 0, 127]);
    s.write_all(&frame).unwrap();
    let reply = read_to_close(s);
    let Message::Error(e) = proto::agent::decode_frame(&reply[6..]).unwrap() else {
        panic!("expected an error frame");
    };
    assert!(ClientError::Agent(e.clone()).predates_request(), "{e:?}");
    // Other refusals are not mistaken for it.
    let bad_path = a
        .client
        .write_file_bytes("relative/path", agent_client::WriteOptions::default(), b"x")
        .await
        .unwrap_err();
    assert!(!bad_path.predates_request(), "{bad_path:?}");
}
