//! File operations through the agent.

mod common;

use agent_client::ClientError;
use agent_client::WriteOptions;
use common::TestAgent;
use proto::agent::{ErrorKind, FileKind};
use tokio::io::AsyncRead;

fn kind(e: ClientError) -> ErrorKind {
    match e {
        ClientError::Agent(a) => a.kind,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

/// A deterministic byte stream of `len` bytes, produced without holding it in memory.
struct Pattern {
    left: u64,
    next: u8,
}

impl AsyncRead for Pattern {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = (buf.remaining() as u64).min(self.left) as usize;
        for _ in 0..n {
            let b = self.next;
            buf.put_slice(&[b]);
            self.next = self.next.wrapping_mul(31).wrapping_add(7);
        }
        self.left -= n as u64;
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn write_read_round_trip_50mb() {
    let a = TestAgent::start().await;
    let path = a.scratch().join("data/deep/big.bin");
    let p = path.to_str().unwrap();
    let len = 50 << 20;
    let opts = WriteOptions {
        mode: Some(0o640),
        create_parents: true,
        owner: None,
    };
    let written = a
        .client
        .write_file(p, opts, &mut Pattern { left: len, next: 1 })
        .await
        .unwrap();
    assert_eq!(written, len);

    let mut expected = Vec::new();
    tokio::io::copy(&mut Pattern { left: len, next: 1 }, &mut expected)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), expected);

    let dl = a.client.read_file(p).await.unwrap();
    assert_eq!(
        (dl.stat.size, dl.stat.mode, dl.stat.kind),
        (len, 0o640, FileKind::File)
    );
    let mut back = Vec::new();
    assert_eq!(dl.copy_to(&mut back).await.unwrap(), len);
    assert!(back == expected);

    let part = a.client.read_file_range(p, 10, Some(5)).await.unwrap();
    let mut out = Vec::new();
    part.copy_to(&mut out).await.unwrap();
    assert_eq!(out, &expected[10..15]);
}

#[tokio::test]
async fn list_stat_mkdir_remove() {
    let a = TestAgent::start().await;
    let root = a.scratch().join("tree");
    let r = root.to_str().unwrap();
    a.client
        .mkdir(&format!("{r}/a/b"), true, None)
        .await
        .unwrap();
    a.client
        .write_file_bytes(&format!("{r}/f.txt"), WriteOptions::default(), b"hello")
        .await
        .unwrap();
    std::os::unix::fs::symlink("f.txt", root.join("link")).unwrap();

    let mut entries = a.client.list_dir(r).await.unwrap();
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    let summary: Vec<_> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.stat.kind, e.stat.size))
        .collect();
    assert_eq!(summary[0], ("a", FileKind::Dir, summary[0].2));
    assert_eq!(summary[1], ("f.txt", FileKind::File, 5));
    assert_eq!(summary[2].1, FileKind::Symlink);
    assert_eq!(entries[1].stat.mode, 0o644);
    assert!(entries[1].stat.mtime_unix_ms > 1_600_000_000_000);

    assert_eq!(
        a.client.stat(&format!("{r}/link")).await.unwrap().kind,
        FileKind::Symlink
    );
    assert_eq!(
        a.client
            .read_file_bytes(&format!("{r}/link"), 100)
            .await
            .unwrap(),
        b"hello"
    );

    let e = a
        .client
        .mkdir(&format!("{r}/a"), false, None)
        .await
        .unwrap_err();
    assert_eq!(kind(e), ErrorKind::AlreadyExists);
    a.client.mkdir(&format!("{r}/a"), true, None).await.unwrap();

    let e = a.client.remove(&format!("{r}/a"), false).await.unwrap_err();
    assert_eq!(
        kind(e),
        ErrorKind::IsADirectory,
        "non-empty directory: a conflict"
    );
    a.client.remove(&format!("{r}/a"), true).await.unwrap();
    a.client.remove(&format!("{r}/f.txt"), false).await.unwrap();
    assert!(!root.join("a").exists() && !root.join("f.txt").exists());
    let e = a
        .client
        .remove(&format!("{r}/f.txt"), false)
        .await
        .unwrap_err();
    assert_eq!(kind(e), ErrorKind::NotFound);
}

#[tokio::test]
async fn errors_map_to_kinds() {
    let a = TestAgent::start_with(&["--max-transfer", "1000000"]).await;
    let s = a.scratch().to_str().unwrap().to_string();
    let c = &a.client;
    assert_eq!(
        kind(c.read_file(&format!("{s}/missing")).await.err().unwrap()),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(c.read_file(&s).await.err().unwrap()),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        kind(c.list_dir(&format!("{s}/missing")).await.unwrap_err()),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(c.read_file("relative/path").await.err().unwrap()),
        ErrorKind::InvalidInput
    );
    std::fs::write(format!("{s}/file"), "x").unwrap();
    assert_eq!(
        kind(c.list_dir(&format!("{s}/file")).await.unwrap_err()),
        ErrorKind::NotADirectory
    );
    let e = c
        .write_file_bytes(&format!("{s}/file/child"), WriteOptions::default(), b"x")
        .await;
    assert_eq!(kind(e.unwrap_err()), ErrorKind::NotADirectory);
    let e = c.write_file_bytes(&s, WriteOptions::default(), b"x").await;
    assert_eq!(kind(e.unwrap_err()), ErrorKind::IsADirectory);
    let e = c
        .write_file_bytes(&format!("{s}/no/parent"), WriteOptions::default(), b"x")
        .await;
    assert_eq!(kind(e.unwrap_err()), ErrorKind::NotFound);

    // A FIFO without a writer is refused instead of hanging the request.
    nix::unistd::mkfifo(
        &a.scratch().join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let e = c.read_file(&format!("{s}/fifo")).await.err().unwrap();
    assert_eq!(kind(e), ErrorKind::InvalidInput);
    // Character devices stream, bounded by the limit.
    assert_eq!(
        c.read_file_bytes("/dev/zero", 10)
            .await
            .err()
            .map(|e| e.to_string()),
        Some(ClientError::TooLarge(10).to_string())
    );
    let mut zeros = Vec::new();
    c.read_file_range("/dev/zero", 0, Some(100_000))
        .await
        .unwrap()
        .copy_to(&mut zeros)
        .await
        .unwrap();
    assert_eq!(zeros, vec![0u8; 100_000]);

    // Too large, both ways; a refused write leaves nothing behind.
    std::fs::write(format!("{s}/big"), vec![0u8; 2_000_000]).unwrap();
    assert_eq!(
        kind(c.read_file(&format!("{s}/big")).await.err().unwrap()),
        ErrorKind::TooLarge
    );
    let e = c
        .write_file(
            &format!("{s}/new"),
            WriteOptions::default(),
            &mut &vec![1u8; 3_000_000][..],
        )
        .await;
    assert_eq!(kind(e.unwrap_err()), ErrorKind::TooLarge);
    assert!(!a.scratch().join("new").exists());
    let leftovers: Vec<_> = std::fs::read_dir(&s)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("sandfork"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(matches!(
        c.read_file_bytes(&format!("{s}/big"), 10).await,
        Err(ClientError::TooLarge(10))
    ));
}

#[tokio::test]
async fn overwrite_is_atomic_and_keeps_mode() {
    let a = TestAgent::start().await;
    let path = a.scratch().join("conf");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let p = path.to_str().unwrap();
    a.client
        .write_file_bytes(p, WriteOptions::default(), b"new contents")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
    assert_eq!(a.client.stat(p).await.unwrap().mode, 0o600);
}

#[tokio::test]
async fn an_owned_write_gives_the_file_and_the_directories_it_makes_to_the_account() {
    use std::os::unix::fs::MetadataExt;
    let a = TestAgent::start().await;
    let scratch = a.scratch();
    std::fs::create_dir_all(scratch.join("kept")).unwrap();
    let path = scratch.join("kept/made/deeper/f.txt");
    let opts = WriteOptions {
        mode: Some(0o640),
        create_parents: true,
        owner: Some((4321, 4322)),
    };
    a.client
        .write_file_bytes(path.to_str().unwrap(), opts, b"mine")
        .await
        .unwrap();
    let owner = |p: &std::path::Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(owner(&path), (4321, 4322));
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(owner(&scratch.join("kept/made")), (4321, 4322));
    assert_eq!(owner(&scratch.join("kept/made/deeper")), (4321, 4322));
    assert_eq!(
        owner(&scratch.join("kept")),
        (0, 0),
        "a directory that was there keeps its owner"
    );
    // Replacing it without an owner keeps the file's owner, as a plain write does.
    let plain = WriteOptions {
        create_parents: true,
        ..Default::default()
    };
    a.client
        .write_file_bytes(path.to_str().unwrap(), plain, b"again")
        .await
        .unwrap();
    assert_eq!(owner(&path), (4321, 4322));
}
