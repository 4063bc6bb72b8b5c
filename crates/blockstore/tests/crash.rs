//! Crash safety: a child process runs random operations on a store and is SIGKILLed at
//! random moments; afterwards every sealed layer must verify and every ref the child
//! recorded must hold exactly the content recorded for it.
//!
//! `BLOCKSTORE_CRASH_ITERATIONS` (default 50) sets the number of kills.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use blockstore::{BlockDevice, Disk, Error, Store};

const CHILD_ENV: &str = "BLOCKSTORE_CRASH_CHILD";
const SEED_ENV: &str = "BLOCKSTORE_CRASH_SEED";
const DISK: &str = "d";

struct Rng(u64);

impl Rng {
    /// A generator whose stream is unrelated to `seed`'s own: the parent seeds children
    /// from its xorshift stream, so seeding a child with the raw value would replay the
    /// parent's (and so the next child's) sequence a few steps apart.
    fn child(seed: u64) -> Rng {
        // splitmix64 finalizer
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Expected content of each ref, from the child's log: `(store, ref) -> (hash, len)`.
/// Refs whose deletion was announced are dropped: they may or may not exist.
fn expectations(root: &Path) -> HashMap<(String, String), (String, u64)> {
    let log = fs::read_to_string(root.join("expect.log")).unwrap_or_default();
    let mut map = HashMap::new();
    for line in log.lines().filter(|l| l.ends_with(';')) {
        let f: Vec<&str> = line.trim_end_matches(';').split(' ').collect();
        match f.as_slice() {
            ["set", s, name, hash, len] => {
                map.insert(
                    (s.to_string(), name.to_string()),
                    (hash.to_string(), len.parse().unwrap()),
                );
            }
            ["del", s, name] => {
                map.remove(&(s.to_string(), name.to_string()));
            }
            _ => {}
        }
    }
    map
}

fn record(root: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("expect.log"))
        .unwrap();
    f.write_all(format!("{line};\n").as_bytes()).unwrap();
}

fn content_hash(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Reads the whole content of `layer` through a temporary fork.
fn layer_content(store: &Store, layer: &blockstore::LayerId, len: u64, tag: &str) -> Vec<u8> {
    let name = format!("check-{tag}");
    let _ = store.delete_disk(&name);
    store.create_disk(&name, len, Some(layer)).unwrap();
    let disk = store.open_disk(&name).unwrap();
    let mut buf = vec![0u8; len as usize];
    disk.read_at(&mut buf, 0).unwrap();
    drop(disk);
    store.delete_disk(&name).unwrap();
    buf
}

struct ChildState {
    root: PathBuf,
    a: Store,
    b: Store,
    disk: Option<Disk>,
    model: Vec<u8>,
    rng: Rng,
    /// Distinct per child, so ref names never repeat across children.
    seed: u64,
    seq: u64,
}

impl ChildState {
    fn open(root: &Path, seed: u64) -> ChildState {
        let a = Store::open(&root.join("a")).unwrap();
        let b = Store::open(&root.join("b")).unwrap();
        if let Err(Error::DiskNotFound(_)) = a.disk_chain(DISK) {
            a.create_disk(DISK, 256 * 1024, None).unwrap();
        }
        let disk = a.open_disk(DISK).unwrap();
        let mut model = vec![0u8; disk.size() as usize];
        disk.read_at(&mut model, 0).unwrap();
        ChildState {
            root: root.to_owned(),
            a,
            b,
            disk: Some(disk),
            model,
            rng: Rng::child(seed),
            seed,
            seq: 0,
        }
    }

    fn disk(&self) -> &Disk {
        self.disk.as_ref().unwrap()
    }

    fn step(&mut self) {
        if self.a.list_refs().unwrap().len() > 6 || self.b.list_refs().unwrap().len() > 6 {
            return self.delete_ref();
        }
        match self.rng.below(20) {
            0..=7 => self.write(),
            8 => self.discard(),
            9..=11 => self.seal(),
            12 => {
                self.disk().compact().unwrap();
            }
            13 => self.export_import(),
            14 => {
                self.a.gc().unwrap();
                self.b.gc().unwrap();
            }
            15 | 16 => self.delete_ref(),
            17 => self.reopen(),
            18 => self.grow(),
            _ => self.disk().flush().unwrap(),
        }
    }

    fn write(&mut self) {
        let size = self.model.len() as u64;
        let aligned = self.rng.below(2) == 0;
        let mut off = self.rng.below(size);
        let mut len = 1 + self.rng.below(64 * 1024);
        if aligned {
            off = off / 4096 * 4096;
            len = len.div_ceil(4096) * 4096;
        }
        let len = len.min(size - off) as usize;
        let fill = self.rng.next() as u8;
        let buf: Vec<u8> = (0..len)
            .map(|i| fill.wrapping_add((i / 512) as u8))
            .collect();
        self.disk().write_at(&buf, off).unwrap();
        self.model[off as usize..off as usize + len].copy_from_slice(&buf);
    }

    fn discard(&mut self) {
        let size = self.model.len() as u64;
        let off = self.rng.below(size);
        let len = self.rng.below(size - off);
        self.disk().discard(off, len).unwrap();
        self.model[off as usize..(off + len) as usize].fill(0);
    }

    fn seal(&mut self) {
        let id = self.disk().seal().unwrap();
        self.seq += 1;
        let name = format!("s{:x}-{}", self.seed, self.seq);
        self.a.set_ref(&name, &id).unwrap();
        let hash = content_hash(&self.model);
        record(
            &self.root,
            &format!("set a {name} {hash} {}", self.model.len()),
        );
    }

    fn pick_ref(&mut self, store_b: bool) -> Option<(String, blockstore::LayerId)> {
        let refs = if store_b {
            self.b.list_refs()
        } else {
            self.a.list_refs()
        }
        .unwrap();
        let i = self.rng.below(refs.len() as u64) as usize;
        refs.get(i).cloned()
    }

    fn export_import(&mut self) {
        let Some((name, id)) = self.pick_ref(false) else {
            return;
        };
        let Some((hash, len)) = expectations(&self.root)
            .get(&("a".into(), name.clone()))
            .cloned()
        else {
            return;
        };
        let path = self.root.join("artifact");
        let mut out = std::io::BufWriter::new(fs::File::create(&path).unwrap());
        self.a.export(&id, None, &mut out).unwrap();
        drop(out);
        let mut input = std::io::BufReader::new(fs::File::open(&path).unwrap());
        self.b.import_as(&mut input, &name).unwrap();
        record(&self.root, &format!("set b {name} {hash} {len}"));
    }

    fn delete_ref(&mut self) {
        let store_b = self.rng.below(2) == 0;
        let Some((name, _)) = self.pick_ref(store_b) else {
            return;
        };
        let s = if store_b { "b" } else { "a" };
        record(&self.root, &format!("del {s} {name}"));
        if store_b {
            self.b.delete_ref(&name)
        } else {
            self.a.delete_ref(&name)
        }
        .unwrap();
    }

    fn reopen(&mut self) {
        let disk = self.disk.take().unwrap();
        disk.flush().unwrap();
        drop(disk);
        self.a = Store::open(&self.root.join("a")).unwrap();
        self.disk = Some(self.a.open_disk(DISK).unwrap());
    }

    fn grow(&mut self) {
        let size = self.model.len() as u64;
        if size < 1 << 20 {
            self.disk().grow(size + 64 * 1024).unwrap();
            self.model.resize(size as usize + 64 * 1024, 0);
        }
    }
}

#[test]
#[ignore = "run in a child process by sigkill_at_random_points_keeps_sealed_layers_intact"]
fn crash_child() {
    let root = PathBuf::from(std::env::var(CHILD_ENV).expect("child of the crash test"));
    let seed = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    let mut st = ChildState::open(&root, seed);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        st.step();
    }
}

fn spawn_child(root: &Path, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, root)
        .env(SEED_ENV, seed.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Kills the child if a check fails.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_store(root: &Path, which: &str) {
    let store = Store::open(&root.join(which)).unwrap();
    let mut half_written = false;
    for entry in fs::read_dir(store.root().join("layers")).unwrap() {
        let id = entry
            .unwrap()
            .file_name()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        match store.layer_info(&id) {
            Ok(info) if info.sealed => {
                store
                    .verify(&id)
                    .unwrap_or_else(|e| panic!("store {which}: {e}"));
            }
            Ok(_) => {}
            // A layer directory killed before its metadata was written.
            Err(Error::LayerNotFound(_) | Error::Corrupt { .. }) => half_written = true,
            Err(e) => panic!("store {which}: layer {id}: {e}"),
        }
    }
    if half_written {
        // gc deletes only unreferenced layers: afterwards every layer must be complete.
        store.gc().unwrap();
        for entry in fs::read_dir(store.root().join("layers")).unwrap() {
            let id = entry
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            store
                .layer_info(&id)
                .unwrap_or_else(|e| panic!("store {which}: {e}"));
        }
    }
    for ((s, name), (hash, len)) in expectations(root) {
        if s != which {
            continue;
        }
        let id = store
            .get_ref(&name)
            .unwrap_or_else(|e| panic!("store {which}: {e}"));
        let content = layer_content(&store, &id, len, which);
        assert_eq!(
            content_hash(&content),
            hash,
            "content of ref {name} in store {which}"
        );
    }
}

#[test]
fn sigkill_at_random_points_keeps_sealed_layers_intact() {
    let iterations: u64 = std::env::var("BLOCKSTORE_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x2545f4914f6cdd1d ^ std::process::id() as u64);
    for i in 0..iterations {
        let mut child = KillOnDrop(spawn_child(dir.path(), rng.next()));
        std::thread::sleep(Duration::from_millis(5 + rng.below(120)));
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("child exited early in iteration {i}: {status}");
        }
        drop(child);
        check_store(dir.path(), "a");
        check_store(dir.path(), "b");
        let store = Store::open(&dir.path().join("a")).unwrap();
        match store.open_disk(DISK) {
            Ok(disk) => disk.chain().iter().for_each(|id| store.verify(id).unwrap()),
            // Killed before the first child finished creating the disk.
            Err(Error::DiskNotFound(_)) if expectations(dir.path()).is_empty() => {}
            Err(e) => panic!("disk {DISK}: {e}"),
        }
    }
    assert!(
        !expectations(dir.path()).is_empty(),
        "the child never completed a seal"
    );
}
