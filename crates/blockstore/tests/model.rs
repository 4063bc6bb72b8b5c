//! Property tests: random operation sequences against a flat byte vector per disk.

use blockstore::{BlockDevice, Disk, LayerId, Store, StoreOptions, BLOCK_SIZE};
use proptest::prelude::*;

const BS: u64 = BLOCK_SIZE;

#[derive(Clone, Debug)]
enum Op {
    Write {
        disk: usize,
        off: u64,
        len: usize,
        seed: u8,
        zeros: bool,
    },
    Discard {
        disk: usize,
        off: u64,
        len: u64,
    },
    WriteZeroes {
        disk: usize,
        off: u64,
        len: u64,
    },
    Seal {
        disk: usize,
    },
    Fork {
        disk: usize,
    },
    Compact {
        disk: usize,
        full: bool,
    },
    Grow {
        disk: usize,
        blocks: u64,
    },
    Read {
        disk: usize,
        off: u64,
        len: usize,
    },
    Transfer {
        disk: usize,
        to_file: bool,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let d = 0..8usize;
    let off = 0..200_000u64;
    prop_oneof![
        6 => (d.clone(), off.clone(), 1..20_000usize, any::<u8>(), prop::bool::weighted(0.2))
            .prop_map(|(disk, off, len, seed, zeros)| Op::Write { disk, off, len, seed, zeros }),
        2 => (d.clone(), off.clone(), 0..30_000u64)
            .prop_map(|(disk, off, len)| Op::Discard { disk, off, len }),
        1 => (d.clone(), off.clone(), 0..30_000u64)
            .prop_map(|(disk, off, len)| Op::WriteZeroes { disk, off, len }),
        3 => d.clone().prop_map(|disk| Op::Seal { disk }),
        2 => d.clone().prop_map(|disk| Op::Fork { disk }),
        1 => (d.clone(), any::<bool>()).prop_map(|(disk, full)| Op::Compact { disk, full }),
        1 => (d.clone(), 1..8u64).prop_map(|(disk, blocks)| Op::Grow { disk, blocks }),
        2 => (d.clone(), off, 1..30_000usize).prop_map(|(disk, off, len)| Op::Read { disk, off, len }),
        1 => (d.clone(), any::<bool>()).prop_map(|(disk, to_file)| Op::Transfer { disk, to_file }),
        1 => Just(Op::Reopen),
    ]
}

struct ModelDisk {
    name: String,
    data: Vec<u8>,
    sealed: Option<(LayerId, Vec<u8>)>,
    disk: Option<Disk>,
}

struct World {
    store: Store,
    root: std::path::PathBuf,
    opts: StoreOptions,
    disks: Vec<ModelDisk>,
    next: usize,
}

fn fill(len: usize, seed: u8, zeros: bool) -> Vec<u8> {
    if zeros {
        return vec![0; len];
    }
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) ^ 0x5a)
        .collect()
}

/// Clamps `[off, off + len)` into a disk of `size` bytes.
fn clamp(off: u64, len: u64, size: u64) -> (u64, u64) {
    let off = off % size;
    (off, len.min(size - off))
}

impl World {
    fn new(dir: &std::path::Path, direct_io: bool) -> World {
        let opts = StoreOptions { direct_io };
        let store = Store::open_with(dir, opts).unwrap();
        let mut w = World {
            store,
            root: dir.to_owned(),
            opts,
            disks: Vec::new(),
            next: 0,
        };
        w.add_disk(64 * 1024, None, vec![0; 64 * 1024]);
        w
    }

    fn add_disk(&mut self, size: u64, base: Option<&LayerId>, data: Vec<u8>) {
        let name = format!("d{}", self.next);
        self.next += 1;
        self.store.create_disk(&name, size, base).unwrap();
        let disk = Some(self.store.open_disk(&name).unwrap());
        self.disks.push(ModelDisk {
            name,
            data,
            sealed: None,
            disk,
        });
    }

    fn apply(&mut self, op: &Op) {
        let n = self.disks.len();
        match *op {
            Op::Write {
                disk,
                off,
                len,
                seed,
                zeros,
            } => {
                let m = &mut self.disks[disk % n];
                let (off, len) = clamp(off, len as u64, m.data.len() as u64);
                let buf = fill(len as usize, seed, zeros);
                m.disk.as_ref().unwrap().write_at(&buf, off).unwrap();
                m.data[off as usize..(off + len) as usize].copy_from_slice(&buf);
            }
            Op::Discard { disk, off, len } | Op::WriteZeroes { disk, off, len } => {
                let m = &mut self.disks[disk % n];
                let (off, len) = clamp(off, len, m.data.len() as u64);
                let d = m.disk.as_ref().unwrap();
                if matches!(op, Op::Discard { .. }) {
                    d.discard(off, len).unwrap();
                } else {
                    d.write_zeroes(off, len).unwrap();
                }
                m.data[off as usize..(off + len) as usize].fill(0);
            }
            Op::Seal { disk } => {
                let m = &mut self.disks[disk % n];
                let id = m.disk.as_ref().unwrap().seal().unwrap();
                m.sealed = Some((id, m.data.clone()));
            }
            Op::Fork { disk } => {
                if let Some((id, data)) = self.disks[disk % n].sealed.clone() {
                    if n < 6 {
                        self.add_disk(data.len() as u64, Some(&id), data);
                    }
                }
            }
            Op::Compact { disk, full } => {
                let d = self.disks[disk % n].disk.as_ref().unwrap();
                let depth = d.depth();
                let res = if full { d.compact_from(0) } else { d.compact() }.unwrap();
                let from = if full { 0 } else { 1 };
                assert_eq!(res.is_some(), depth >= from + 2);
                if res.is_some() {
                    assert_eq!(d.depth(), from + 1);
                }
            }
            Op::Grow { disk, blocks } => {
                let m = &mut self.disks[disk % n];
                let size = m.data.len() as u64 + blocks * BS;
                m.disk.as_ref().unwrap().grow(size).unwrap();
                m.data.resize(size as usize, 0);
            }
            Op::Read { disk, off, len } => {
                let m = &self.disks[disk % n];
                let (off, len) = clamp(off, len as u64, m.data.len() as u64);
                let mut buf = vec![1u8; len as usize];
                m.disk.as_ref().unwrap().read_at(&mut buf, off).unwrap();
                assert!(
                    buf == m.data[off as usize..(off + len) as usize],
                    "read mismatch"
                );
            }
            Op::Transfer { disk, to_file } => self.transfer(disk % n, to_file),
            Op::Reopen => self.reopen(),
        }
    }

    /// Exports the disk's last sealed state, imports it into a fresh store and checks a
    /// fork of it there.
    fn transfer(&self, disk: usize, to_file: bool) {
        let Some((id, data)) = &self.disks[disk].sealed else {
            return;
        };
        let mut art = Vec::new();
        if to_file {
            let file = tempfile::tempfile().unwrap();
            self.store.export_file(id, None, &file).unwrap();
            let mut reader = &file;
            std::io::Seek::rewind(&mut reader).unwrap();
            std::io::Read::read_to_end(&mut reader, &mut art).unwrap();
        } else {
            self.store.export(id, None, &mut art).unwrap();
        }
        let other_dir = tempfile::tempdir().unwrap();
        let other = Store::open(other_dir.path()).unwrap();
        assert_eq!(&other.import(&mut &art[..]).unwrap(), id);
        other
            .create_disk("copy", data.len() as u64, Some(id))
            .unwrap();
        let copy = other.open_disk("copy").unwrap();
        let mut buf = vec![1u8; data.len()];
        copy.read_at(&mut buf, 0).unwrap();
        assert!(&buf == data, "imported copy differs");
    }

    fn reopen(&mut self) {
        for m in &mut self.disks {
            let d = m.disk.take().unwrap();
            d.flush().unwrap();
        }
        self.store = Store::open_with(&self.root, self.opts).unwrap();
        for m in &mut self.disks {
            m.disk = Some(self.store.open_disk(&m.name).unwrap());
        }
    }

    fn check_all(&self) {
        for m in &self.disks {
            let d = m.disk.as_ref().unwrap();
            assert_eq!(d.size(), m.data.len() as u64);
            let mut buf = vec![1u8; m.data.len()];
            d.read_at(&mut buf, 0).unwrap();
            assert!(buf == m.data, "disk {} differs from the model", m.name);
        }
    }

    fn verify_sealed(&self) {
        for m in &self.disks {
            for id in m.disk.as_ref().unwrap().chain() {
                self.store.verify(&id).unwrap();
            }
        }
    }
}

/// 24 cases by default; `BLOCKSTORE_PROPTEST_CASES` runs more.
fn cases() -> u32 {
    std::env::var("BLOCKSTORE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn disks_match_the_model(ops in prop::collection::vec(op(), 1..40), direct_io in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut world = World::new(dir.path(), direct_io);
        for op in &ops {
            world.apply(op);
            world.check_all();
        }
        world.verify_sealed();
        world.reopen();
        world.check_all();
        for m in &mut world.disks {
            m.disk.take();
        }
        let names: Vec<String> = world.disks.iter().map(|m| m.name.clone()).collect();
        for name in &names {
            world.store.delete_disk(name).unwrap();
        }
        world.store.gc().unwrap();
        let left = std::fs::read_dir(dir.path().join("layers")).unwrap().count();
        prop_assert_eq!(left, 0);
    }
}
