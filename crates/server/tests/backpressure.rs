//! The daemon is not a buffer: a client that stops reading a streamed exec stops the
//! command's output instead of growing the daemon's memory.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::json;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn a_stalled_reader_holds_back_the_output() {
    let d = TestDaemon::start();
    let id = d.create(json!({}));
    let socket = d.socket.clone();
    let body = json!({"command": "/bin/sh", "args": ["-c", "yes abcdefghijklmnop | head -c 100000000"], "stream": true});
    d.rt.block_on(async move {
        let s = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::post(format!("/v1/sandboxes/{id}/exec"))
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
            .unwrap();
        let mut resp = send.send_request(req).await.unwrap().into_body();
        let first = resp.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        let before = rss_bytes();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let grown = rss_bytes().saturating_sub(before);
        assert!(
            grown < 32 << 20,
            "daemon buffered {} MiB for a stalled reader",
            grown >> 20
        );
        // Reading on drains the rest: every byte arrives and the stream ends with the exit.
        let mut text = Vec::new();
        while let Some(f) = resp.frame().await {
            if let Ok(d) = f.unwrap().into_data() {
                text.extend_from_slice(&d[d.len().saturating_sub(200)..]);
                let keep = text.len().saturating_sub(400);
                text.drain(..keep);
            }
        }
        let tail = String::from_utf8_lossy(&text);
        assert!(
            tail.contains("\"type\":\"exit\"") && tail.contains("\"exit_code\":0"),
            "{tail}"
        );
    });
}
