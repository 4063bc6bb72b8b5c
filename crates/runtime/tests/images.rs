//! Image builders and imports: busybox, rootfs tarballs, OCI layouts with whiteouts.

mod common;

use std::path::Path;

use common::{sh, unique_id, TestEnv};
use runtime::image::{import_oci_layout, import_tarball, BuildSpec, Images, Source};
use runtime::{Resources, SandboxSpec};
use sha2::{Digest, Sha256};

/// A tar archive of `(path, contents)` files (directories implied by `path/`).
fn tar_of(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, text) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, path, std::io::empty()).unwrap();
        } else {
            h.set_mode(0o644);
            h.set_size(text.len() as u64);
            b.append_data(&mut h, path, text.as_bytes()).unwrap();
        }
    }
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Writes a blob; returns its descriptor.
fn blob(layout: &Path, media: &str, bytes: &[u8]) -> serde_json::Value {
    let hex = format!("{:x}", Sha256::digest(bytes));
    std::fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
    serde_json::json!({"mediaType": media, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

fn oci_layout(dir: &Path) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let l1 = tar_of(&[
        ("a/", ""),
        ("a/keep", "k"),
        ("a/gone", "g"),
        ("b/", ""),
        ("b/old", "o"),
    ]);
    let l2 = tar_of(&[
        ("a/.wh.gone", ""),
        ("b/", ""),
        ("b/.wh..wh..opq", ""),
        ("b/new", "n"),
    ]);
    let layers = vec![
        blob(
            dir,
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &gzip(&l1),
        ),
        blob(dir, "application/vnd.oci.image.layer.v1.tar", &l2),
    ];
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": []},
        "config": {"Env": ["A=1", "PATH=/bin"], "WorkingDir": "/a"}});
    let config = blob(
        dir,
        "application/vnd.oci.image.config.v1+json",
        config.to_string().as_bytes(),
    );
    let manifest = serde_json::json!({"schemaVersion": 2, "config": config, "layers": layers});
    let manifest = blob(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    );
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
}

#[test]
fn oci_layout_applies_layers_and_whiteouts() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    oci_layout(&layout);
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let defaults = import_oci_layout(&layout, &root, Default::default(), &|_| {}).unwrap();
    assert_eq!(std::fs::read_to_string(root.join("a/keep")).unwrap(), "k");
    assert!(!root.join("a/gone").exists());
    assert!(!root.join("b/old").exists());
    assert_eq!(std::fs::read_to_string(root.join("b/new")).unwrap(), "n");
    assert!(!root.join("a/.wh.gone").exists() && !root.join("b/.wh..wh..opq").exists());
    assert_eq!(defaults.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(defaults.cwd.as_deref(), Some("/a"));
}

#[test]
fn tarball_import_refuses_escaping_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    // Header::set_path refuses `..`, so write the name bytes directly.
    h.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"../escaped");
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let t = tmp.path().join("bad.tar");
    std::fs::write(&t, b.into_inner().unwrap()).unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let e = import_tarball(&t, &root, Default::default(), &|_| {}).unwrap_err();
    assert!(matches!(e, runtime::Error::Layer { .. }), "{e:?}");
    // The message names the tarball, its source the entry.
    assert!(e.to_string().contains("bad.tar"), "{e}");
    let entry = std::error::Error::source(&e).unwrap().to_string();
    assert_eq!(entry, "unsafe path in layer: ../escaped");
    assert!(!tmp.path().join("escaped").exists());
}

#[test]
fn failed_build_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = blockstore::Store::open(&tmp.path().join("store")).unwrap();
    let images = Images::new(store, tmp.path().join("images"));
    let spec = BuildSpec {
        name: "broken".into(),
        source: Source::Tarball(tmp.path().join("missing.tar")),
        apt: vec![],
        pip: vec![],
    };
    assert!(images.build(&spec, &|_| {}).is_err());
    let left: Vec<_> = std::fs::read_dir(images.dir()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(images.store().list_refs().unwrap().is_empty());
    assert!(images.get("broken").is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_boots_from_an_imported_tarball() {
    let env = TestEnv::new();
    // A docker-export-style tarball of the busybox tree plus a marker file.
    let tree = env.dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    runtime::image::rootfs::busybox(&tree, &|_| {}).unwrap();
    std::fs::write(tree.join("etc/marker"), "from tarball\n").unwrap();
    let tarball = env.dir.path().join("rootfs.tar.gz");
    let st = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let images = Images::new(
        blockstore::Store::open(&env.runtime.config().data_dir.join("store")).unwrap(),
        env.runtime.config().data_dir.join("images"),
    );
    let stages = std::sync::Mutex::new(Vec::new());
    let progress = |p: runtime::image::Progress| stages.lock().unwrap().push(p.stage);
    let spec = BuildSpec {
        name: "custom".into(),
        source: Source::Tarball(tarball),
        apt: vec![],
        pip: vec![],
    };
    let meta = images.build(&spec, &progress).unwrap();
    assert_eq!(
        *stages.lock().unwrap(),
        ["unpack", "mkfs", "import", "done"]
    );
    assert_eq!(
        images
            .list()
            .unwrap()
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["busybox", "custom"]
    );
    let sb = env
        .runtime
        .create(SandboxSpec {
            id: unique_id("tar"),
            image: meta.to_ref(),
            resources: Resources {
                disk_mb: 256,
                ..Resources::default()
            },
            env: Default::default(),
            network: Default::default(),
            volumes: Vec::new(),
        })
        .await
        .unwrap();
    let (_, out, _) = sh(
        &sb.agent(),
        "cat /etc/marker; df -m / | tail -1 | awk '{print $2}'",
    )
    .await;
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("from tarball"));
    let size_mb: u64 = lines.next().unwrap().parse().unwrap();
    assert!(
        size_mb > 200,
        "root disk was not grown to disk_mb: {size_mb} MiB"
    );
}
