//! Many threads doing I/O on one disk while it is sealed and compacted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use blockstore::{BlockDevice, Store, StoreOptions};

#[test]
fn concurrent_partial_writes_to_one_block_are_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.create_disk("d", 1 << 20, None).unwrap();
    let disk = Arc::new(store.open_disk("d").unwrap());
    const THREADS: usize = 8;
    const SPAN: usize = 3 * 4096;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let disk = disk.clone();
            std::thread::spawn(move || {
                // Thread t owns bytes whose index is t modulo 8, written 3 bytes at a time
                // spread over the same three blocks as everyone else.
                for i in (t..SPAN).step_by(THREADS * 3) {
                    let len = 3.min(SPAN - i);
                    let bytes: Vec<u8> = (i..i + len)
                        .map(|p| if p % THREADS == t { t as u8 + 1 } else { 0 })
                        .collect();
                    // Only write this thread's own byte of each 3-byte window.
                    for (k, b) in bytes.iter().enumerate() {
                        if *b != 0 {
                            disk.write_at(&[*b], (i + k) as u64 + 1000).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut buf = vec![0u8; SPAN];
    disk.read_at(&mut buf, 1000).unwrap();
    for (p, b) in buf.iter().enumerate() {
        let t = p % THREADS;
        let owned = (t..SPAN)
            .step_by(THREADS * 3)
            .any(|i| (i..i + 3).contains(&p));
        let want = if owned { t as u8 + 1 } else { 0 };
        assert_eq!(*b, want, "byte {p}");
    }
}

#[test]
fn io_during_seal_and_compact() {
    for direct_io in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(dir.path(), StoreOptions { direct_io }).unwrap();
        const REGION: u64 = 64 * 1024;
        const WRITERS: u64 = 4;
        store.create_disk("d", REGION * WRITERS, None).unwrap();
        let disk = Arc::new(store.open_disk("d").unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let disk = disk.clone();
                std::thread::spawn(move || {
                    let mut last = vec![0u8; REGION as usize];
                    for round in 0..150u32 {
                        let off = (round as u64 * 7919) % (REGION - 5000);
                        let len = 1 + (round as usize * 131) % 5000;
                        let fill = (round % 250) as u8 + 1;
                        let data = vec![fill; len];
                        disk.write_at(&data, w * REGION + off).unwrap();
                        last[off as usize..off as usize + len].fill(fill);
                        if round % 10 == 0 {
                            disk.discard(w * REGION + off, 4096).unwrap();
                            last[off as usize..off as usize + 4096].fill(0);
                        }
                    }
                    last
                })
            })
            .collect();
        let reader = {
            let (disk, stop) = (disk.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 100_000];
                while !stop.load(Ordering::Relaxed) {
                    disk.read_at(&mut buf, 12_345).unwrap();
                }
            })
        };
        let sealer = {
            let (disk, stop) = (disk.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seals = 0;
                while !stop.load(Ordering::Relaxed) {
                    disk.seal().unwrap();
                    seals += 1;
                    if seals % 4 == 0 {
                        disk.compact().unwrap();
                    }
                }
                seals
            })
        };
        let expected: Vec<Vec<u8>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert!(sealer.join().unwrap() > 0);
        let mut all = vec![0u8; (REGION * WRITERS) as usize];
        disk.read_at(&mut all, 0).unwrap();
        assert!(
            all == expected.concat(),
            "content differs after concurrent I/O"
        );
        for id in disk.chain() {
            store.verify(&id).unwrap();
        }
        disk.flush().unwrap();
        drop(disk);
        let disk = store.open_disk("d").unwrap();
        disk.read_at(&mut all, 0).unwrap();
        assert!(all == expected.concat(), "content differs after reopening");
    }
}
