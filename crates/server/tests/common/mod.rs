//! Harness of the API tests: a real daemon (container runtime, agent, block store) serving
//! in-process on a private data directory and socket, a small HTTP client, and checks that
//! nothing of a sandbox is left on the host.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use server::{Config, Daemon};

/// A daemon on its own thread and runtime; dropped → every sandbox terminated, stopped.
pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub data: PathBuf,
    pub tcp: Option<std::net::SocketAddr>,
    pub manager: Arc<server::Manager>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub rt: tokio::runtime::Runtime,
}

impl TestDaemon {
    pub fn start() -> TestDaemon {
        Self::with(|_| {})
    }

    /// Starts with a config adjusted by `f`.
    pub fn with(f: impl FnOnce(&mut Config)) -> TestDaemon {
        testkit::needs_root("a daemon runs real sandboxes");
        let dir = testkit::data_dir("api");
        let data = dir.path().join("data");
        let mut config = Config {
            data_dir: data.clone(),
            socket: Some(dir.path().join("api.sock")),
            reaper_interval_ms: 100,
            default_image: "busybox".into(),
            ..Config::default()
        };
        f(&mut config);
        let socket = config.socket_path();
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let backend = server::runc::RuncBackend::open(&config).unwrap();
                let daemon = Daemon::start(config, backend).await.unwrap();
                tx.send((daemon.manager().clone(), daemon.tcp_addr()))
                    .unwrap();
                daemon
                    .serve(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        let (manager, tcp) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("daemon did not start");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        TestDaemon {
            dir,
            socket,
            data,
            tcp,
            manager,
            stop: Some(stop_tx),
            thread: Some(thread),
            rt,
        }
    }

    pub fn client(&self) -> Client {
        Client {
            socket: self.socket.clone(),
            tcp: None,
            token: None,
        }
    }

    /// Creates a sandbox and returns its id.
    pub fn create(&self, body: Value) -> String {
        let (status, v) = self
            .client()
            .json(Method::POST, "/v1/sandboxes", Some(body));
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// Runs `sh -c script` (non-streaming) and returns the result.
    pub fn sh(&self, id: &str, script: &str) -> Value {
        let body = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]});
        let (status, v) = self.client().json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(body),
        );
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let manager = self.manager.clone();
        let ids: Vec<String> = manager
            .list(&Default::default())
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.id)
            .collect();
        self.rt.block_on(async {
            for id in ids {
                let _ = manager.terminate(&id).await;
            }
        });
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A minimal HTTP client (one connection per request).
#[derive(Clone)]
pub struct Client {
    pub socket: PathBuf,
    pub tcp: Option<std::net::SocketAddr>,
    pub token: Option<String>,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// NDJSON lines.
    pub fn lines(&self) -> Vec<Value> {
        self.body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }
}

impl Client {
    pub fn raw(&self, method: Method, path: &str, ctype: &str, body: impl Into<Bytes>) -> Reply {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(self.raw_async(method, path, ctype, body.into()))
    }

    pub async fn raw_async(&self, method: Method, path: &str, ctype: &str, body: Bytes) -> Reply {
        let mut send = match self.tcp {
            Some(addr) => {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                send
            }
            None => {
                let s = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                send
            }
        };
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if !ctype.is_empty() {
            req = req.header("content-type", ctype);
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = send
            .send_request(req.body(Full::new(body)).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn json(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let r = match body {
            Some(b) => self.raw(
                method,
                path,
                "application/json",
                serde_json::to_vec(&b).unwrap(),
            ),
            None => self.raw(method, path, "", Bytes::new()),
        };
        (r.status, r.json())
    }

    pub fn get(&self, path: &str) -> (StatusCode, Value) {
        self.json(Method::GET, path, None)
    }
}

/// Asserts the error shape and code of a reply.
pub fn assert_error(status: StatusCode, v: &Value, want: u16, code: &str) {
    assert_eq!(status.as_u16(), want, "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

#[allow(unused_imports)] // each test binary uses its own subset
pub use testkit::{eventually, processes_mentioning, sandbox_traces as host_traces};
