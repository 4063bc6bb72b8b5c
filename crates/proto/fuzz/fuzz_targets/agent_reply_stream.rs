//! A hostile agent (agent → host): whatever an agent answers, every host-side client call
//! returns a value or a typed error, never panics, ends when the connection ends and keeps
//! what it collects within its bounds.
//!
//! The first input byte picks the call; the rest is what the fake agent writes after its
//! preamble, on a real Unix socket the client connects to.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use proto::agent::{ExecRequest, Identity, Preamble, SOCKET_NAME};
use agent_client::AgentClient;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// Bound of collected output and file reads in this target.
const MAX: u64 = 256 << 10;

struct Fake {
    rt: tokio::runtime::Runtime,
    listener: UnixListener,
    client: AgentClient,
    _dir: tempfile::TempDir,
}

fn fake() -> &'static Fake {
    static FAKE: OnceLock<Fake> = OnceLock::new();
    FAKE.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let path: PathBuf = dir.path().join(SOCKET_NAME);
        let listener = rt
            .block_on(async { UnixListener::bind(&path) })
            .expect("bind");
        Fake {
            rt,
            listener,
            client: AgentClient::new(dir.path()),
            _dir: dir,
        }
    })
}

/// Accepts one connection, answers it with the preamble and `reply`, then drains what the
/// client sends until it hangs up.
async fn serve(listener: &UnixListener, reply: &[u8]) {
    let accepted = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await;
    let Ok(Ok((mut s, _))) = accepted else {
        return;
    };
    let _ = s.write_all(&Preamble::current().to_bytes()).await;
    let _ = s.write_all(reply).await;
    let _ = s.shutdown().await;
    let mut sink = [0u8; 4096];
    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
}

fn exec_request() -> ExecRequest {
    ExecRequest {
        command: "true".into(),
        ..Default::default()
    }
}

/// Runs the client call `op` to completion; returns whether it succeeded.
async fn call(c: &AgentClient, op: u8) -> bool {
    match op % 14 {
        0 => c.hello().await.is_ok(),
        1 => c
            .exec_collect(exec_request(), MAX as usize)
            .await
            .is_ok_and(|o| o.stdout.len() as u64 <= MAX && o.stderr.len() as u64 <= MAX),
        2 => match c.exec(exec_request()).await {
            Ok(mut s) => {
                while let Ok(Some(_)) = s.next().await {}
                true
            }
            Err(_) => false,
        },
        3 => c
            .read_file_bytes("/f", MAX)
            .await
            .is_ok_and(|b| b.len() as u64 <= MAX),
        4 => match c.read_file("/f").await {
            Ok(dl) => dl.copy_to(&mut tokio::io::sink()).await.is_ok(),
            Err(_) => false,
        },
        5 => c.list_dir("/").await.is_ok(),
        6 => c.stat("/f").await.is_ok(),
        7 => c.list_processes().await.is_ok(),
        8 => match c.attach(1, (0, 0), true).await {
            Ok(mut s) => {
                while let Ok(Some(_)) = s.next().await {}
                true
            }
            Err(_) => false,
        },
        9 => c.wait(1, Some(Duration::from_secs(1))).await.is_ok(),
        10 => c.spawn(exec_request()).await.is_ok(),
        11 => c
            .write_file_bytes("/f", Default::default(), b"data")
            .await
            .is_ok(),
        12 => c.mkdir("/d", true, None).await.is_ok(),
        _ => c
            .set_identity(Identity {
                sandbox_id: "sb-1".into(),
                fork_index: 1,
                seed: vec![1; 32],
                parent_snapshot_id: None,
                env: vec![],
            })
            .await
            .is_ok(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&op, reply)) = data.split_first() else {
        return;
    };
    let f = fake();
    f.rt.block_on(async {
        let (_, _) = tokio::join!(serve(&f.listener, reply), call(&f.client, op));
    });
});
