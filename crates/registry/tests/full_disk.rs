//! A pull that fills the disk: the blob write fails as a full disk (so the daemon answers
//! 507), no blob becomes visible and the temporary file is gone. Needs root (a small
//! tmpfs is mounted for the store).

use registry::{BlobStore, Digest};
use tokio::io::AsyncWriteExt;

struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn a_full_disk_mid_blob_leaves_nothing() {
    testkit::needs_root("mounts a tmpfs");
    let dir = testkit::data_dir("registry-full");
    let mnt = dir.path().join("store");
    std::fs::create_dir(&mnt).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &mnt,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let _guard = Tmpfs(mnt.clone());
    let store = BlobStore::open(&mnt).unwrap();
    // A blob declared larger than the disk's free space is refused before a byte is written.
    let huge = Digest::of(b"huge");
    let refused = store
        .writer(&huge, 2 << 20)
        .await
        .err()
        .expect("2 MiB declared");
    assert!(refused.is_disk_full(), "{refused:?}");
    assert_eq!(std::fs::read_dir(mnt.join("tmp")).unwrap().count(), 0);
    // One that fits when it starts, while something else then takes the room.
    let data = vec![7u8; 768 << 10];
    let digest = Digest::of(&data);
    let mut w = store.writer(&digest, data.len() as u64).await.unwrap();
    std::fs::write(mnt.join("other"), vec![1u8; 512 << 10]).unwrap();
    let wrote = async {
        w.write_all(&data).await?;
        w.flush().await
    }
    .await;
    let e = match wrote {
        Err(e) => {
            // As in a pull: the error drops the writer, which removes its file.
            drop(w);
            registry::PullError::Io {
                path: mnt.clone(),
                source: e,
            }
        }
        Ok(()) => w
            .finish()
            .await
            .expect_err("768 KiB and 512 KiB cannot fit in 1 MiB"),
    };
    assert!(e.is_disk_full(), "{e:?}");
    assert!(!store.has(&digest));
    assert_eq!(std::fs::read_dir(mnt.join("tmp")).unwrap().count(), 0);
}
