//! FUSE over io_uring (kernel ≥ 6.14, `/sys/module/fuse/parameters/enable_uring`): each
//! worker owns one ring with one registered entry (a header buffer and a payload buffer);
//! a request arrives as a completion and its reply goes back with COMMIT_AND_FETCH,
//! which also waits for the next request — one system call per request instead of a
//! `readv` and a `writev`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi::{op, InHeader, IN_HEADER_LEN};
use super::fs::{DiskFs, Reply, MAX_IO};

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], ring_ent_in_out (32 bytes).
const HEADER_LEN: usize = 128 + 128 + 32;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const PAGE: usize = 4096;

/// The module parameter that lets connections use io_uring.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns FUSE over io_uring on for the host (it only affects servers that ask for it).
pub fn enable() -> std::io::Result<()> {
    std::fs::write(ENABLE_PARAM, b"Y")
}

/// Number of FUSE ring queues: one per possible CPU. Every queue needs an entry before
/// the kernel uses the ring.
pub fn queue_count() -> usize {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    possible
        .trim()
        .rsplit(['-', ','])
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .map_or(1, |last| last + 1)
}

/// Page-aligned buffers of one ring entry; they stay put while the kernel holds them.
struct Entry {
    raw: Vec<u8>,
    header_at: usize,
    payload_at: usize,
}

impl Entry {
    fn new() -> Entry {
        let mut raw = vec![0u8; PAGE + PAGE + MAX_IO + PAGE];
        let base = raw.as_mut_ptr().align_offset(PAGE).min(PAGE);
        Entry {
            raw,
            header_at: base,
            payload_at: base + PAGE,
        }
    }

    fn split(&mut self) -> (&mut [u8], &mut [u8]) {
        let (head, rest) = self.raw.split_at_mut(self.payload_at);
        let header = &mut head[self.header_at..self.header_at + HEADER_LEN];
        (header, &mut rest[..MAX_IO])
    }

    fn iovecs(&mut self) -> [libc::iovec; 2] {
        let (h, p) = self.split();
        [
            libc::iovec {
                iov_base: h.as_mut_ptr().cast(),
                iov_len: h.len(),
            },
            libc::iovec {
                iov_base: p.as_mut_ptr().cast(),
                iov_len: p.len(),
            },
        ]
    }
}

/// Serves requests of queue `qid` until the ring is torn down (unmount or abort).
pub fn worker(dev: File, fs: Arc<DiskFs>, qid: u16) {
    if let Err(e) = run(&dev, &fs, qid) {
        eprintln!("FUSE io_uring worker {qid} stops: {e}");
    }
}

fn run(dev: &File, fs: &DiskFs, qid: u16) -> std::io::Result<()> {
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(4)?;
    let mut entry = Entry::new();
    let iov = entry.iovecs();
    let register = command(dev, CMD_REGISTER, qid, 0, Some(&iov));
    submit(&mut ring, &register)?;
    let mut scratch = Vec::with_capacity(PAGE);
    loop {
        ring.submit_and_wait(1)?;
        let Some(cqe) = ring.completion().next() else {
            continue;
        };
        if cqe.result() < 0 {
            // The kernel released the entry: the connection is ending.
            return Ok(());
        }
        let commit_id = handle(&mut entry, fs, &mut scratch);
        let commit = command(dev, CMD_COMMIT_AND_FETCH, qid, commit_id, None);
        submit(&mut ring, &commit)?;
    }
}

/// Answers the request in `entry` in place; returns its commit id.
fn handle(entry: &mut Entry, fs: &DiskFs, scratch: &mut Vec<u8>) -> u64 {
    let (header, payload) = entry.split();
    let field = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or_default());
    let commit_id = field(ENT_IN_OUT + 8);
    let payload_len = (field(ENT_IN_OUT + 16) as u32 as usize).min(payload.len());
    let Some(h) = InHeader::parse(&header[..IN_HEADER_LEN]) else {
        return commit_id;
    };
    let op_len = op_header_len(h.opcode);
    let op_in = &header[OP_IN..OP_IN + op_len];
    let reply = match h.opcode {
        op::WRITE => fs.handle(&h, op_in, &mut payload[..payload_len]),
        op::READ => fs.handle(&h, op_in, payload),
        _ => {
            scratch.clear();
            scratch.extend_from_slice(op_in);
            scratch.extend_from_slice(&payload[..payload_len]);
            fs.handle(&h, scratch, &mut [])
        }
    };
    let (error, body_len) = match reply {
        Reply::None => (0, 0),
        Reply::Error(e) => (-e, 0),
        Reply::Data(n) => (0, n),
        Reply::Body(out) => {
            let n = out.0.len().min(payload.len());
            payload[..n].copy_from_slice(&out.0[..n]);
            (0, n)
        }
    };
    let out = super::abi::out_header(h.unique, error, body_len);
    header[..out.len()].copy_from_slice(&out);
    header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(body_len as u32).to_le_bytes());
    commit_id
}

/// Size of the per-opcode header the kernel puts in `op_in` (0 when the first argument
/// is empty, as for LOOKUP).
fn op_header_len(opcode: u32) -> usize {
    match opcode {
        op::READ | op::WRITE | op::READDIR => 40,
        op::SETATTR => 88,
        op::FALLOCATE => 32,
        op::RELEASE | op::RELEASEDIR | op::FLUSH => 24,
        op::GETATTR | op::FSYNC | op::FSYNCDIR => 16,
        op::OPEN | op::OPENDIR | op::ACCESS => 8,
        _ => 0,
    }
}

/// A URING_CMD on the FUSE device carrying `struct fuse_uring_cmd_req`; REGISTER also
/// points the kernel at the entry's two buffers.
fn command(
    dev: &File,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), cmd_op).cmd(cmd);
    if let Some(iov) = iov {
        op = op.addr(Some(iov.as_ptr() as u64));
    }
    let entry = op.build();
    match iov {
        Some(_) => with_len(entry, 2),
        None => entry,
    }
}

/// Sets `sqe->len`, which the builder does not expose (REGISTER wants the iovec count).
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is a `repr(C)` plain-data 128-byte SQE (`io_uring_sqe` + 64
    // command bytes); every bit pattern is valid, and `len` is the u32 at byte 24.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&len.to_le_bytes());
    // SAFETY: as above, the bytes came from a valid entry and only `len` changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

fn submit(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    e: &squeue::Entry128,
) -> std::io::Result<()> {
    // SAFETY: the buffers the entry points at (the worker's `Entry` and its iovec array,
    // read by the kernel during this submission) outlive the ring, which the worker
    // drops before them.
    unsafe { ring.submission().push(e) }
        .map_err(|_| std::io::Error::other("submission queue full"))?;
    ring.submit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_len_is_patched_in_place() {
        let entry = opcode::UringCmd80::new(types::Fd(0), 1).build();
        let patched = with_len(entry, 2);
        // SAFETY: see `with_len`.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(patched) };
        assert_eq!(bytes[0], opcode::UringCmd80::CODE);
        assert_eq!(&bytes[24..28], &2u32.to_le_bytes());
    }

    #[test]
    fn there_is_at_least_one_queue() {
        assert!(queue_count() >= 1);
    }
}
