//! A sandbox's root can replace `agent.sock` in its writable socket directory with a
//! socket of its own and answer the daemon as if it were the agent. The daemon talks only
//! to a socket its agent (the sandbox's init) listens on. As root: real sandboxes.

mod common;

use std::os::unix::net::UnixListener;

use common::*;
use hyper::Method;
use serde_json::json;

#[test]
fn an_impostor_at_agent_sock_is_refused_and_the_agent_is_used_again_once_it_is_gone() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let neighbour = d.create(json!({}));
    let run = d.data.join("sandboxes").join(&id).join("run");
    let sock = run.join("agent.sock");
    let real = run.join("agent.sock.real");
    std::fs::rename(&sock, &real).unwrap();
    // The impostor answers with a valid preamble and then whatever it likes.
    let impostor = UnixListener::bind(&sock).unwrap();
    let answering = std::thread::spawn(move || {
        if let Ok((mut conn, _)) = impostor.accept() {
            use std::io::Write;
            let _ = conn.write_all(b"SFAG\x02\x00\xff\xff\xff\x00junk");
        }
    });
    let (s, v) = d.client().json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "echo", "args": ["hi"]})),
    );
    assert!(s.is_server_error(), "{s} {v}");
    assert!(
        v["message"].as_str().unwrap().contains("not the agent's"),
        "{v}"
    );
    // The neighbour is not affected, and once the impostor is gone the agent answers.
    assert_eq!(d.sh(&neighbour, "echo ok")["stdout"], "ok\n");
    std::fs::remove_file(&sock).unwrap();
    std::fs::rename(&real, &sock).unwrap();
    assert_eq!(d.sh(&id, "echo back")["stdout"], "back\n");
    drop(answering);
}
