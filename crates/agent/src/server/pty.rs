//! Terminal sessions, laid out so that CRIU can checkpoint them.
//!
//! CRIU checkpoints a shell on a terminal (one that opened `/dev/tty`, as every shell with
//! job control does) only when the first process it meets holding that terminal is the
//! shell itself, the session leader in the terminal's foreground. So the agent keeps no
//! end of the terminal: it starts the program on the slave side (session leader,
//! controlling terminal), then — after it, so that CRIU meets the program first — a
//! *relay*: the agent binary again (`--pty-keeper`), holding the master side as fd 3 and
//! moving bytes between it and its own stdin/stdout pipes to the agent. The relay's stdin
//! carries protocol frames: `Data` (typed input) and `PtyResize`. It ends when no process
//! holds the terminal's slave side any more.
//!
//! A checkpoint while a job runs in the terminal's foreground is still refused by CRIU
//! ("ctty inheritance"); at the prompt it works.
//!
//! The relay is plain code (poll over two descriptors, the master side non-blocking): it
//! runs in a process that does nothing else.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{open, OFlag};
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
use nix::sys::stat::Mode;
use proto::agent::{decode_payload, payload_len, Message, PtySize, CHUNK_SIZE};

/// The argument that makes the agent binary a terminal relay.
pub const KEEPER_ARG: &str = "--pty-keeper";

/// A new terminal: the master and the slave side, both close-on-exec.
pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

pub fn open_pty(size: PtySize) -> io::Result<Pty> {
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let path = ptsname_r(&master)?;
    let slave = open(
        path.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let master = OwnedFd::from(master);
    resize(master.as_fd(), size)?;
    Ok(Pty { master, slave })
}

nix::ioctl_write_ptr_bad!(set_winsize, nix::libc::TIOCSWINSZ, nix::pty::Winsize);

/// Sets the terminal's size; the kernel signals its foreground process group (SIGWINCH).
pub fn resize(master: BorrowedFd<'_>, size: PtySize) -> io::Result<()> {
    let ws = nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `master` is an open terminal descriptor and `ws` a valid winsize that lives
    // across the call; TIOCSWINSZ only reads it.
    unsafe { set_winsize(master.as_raw_fd(), &ws) }?;
    Ok(())
}

/// The descriptor the relay finds the terminal's master side on.
pub const MASTER_FD: RawFd = 3;

/// Typed input the relay holds for a terminal that is not reading (a program busy writing
/// output): past this much it stops taking input from the agent until the terminal drains.
const TYPED_LIMIT: usize = 1 << 20;

/// Input typed before the program first writes anything (a shell's prompt) is held until it
/// does, or this long: a shell that gets Ctrl-C before it has set up its signals dies of it.
const HOLD_UNTIL_OUTPUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs the relay until no process holds the terminal any more; its exit code.
///
/// Output never waits on input: the master side is non-blocking, typed input the terminal
/// cannot take yet is held (up to [`TYPED_LIMIT`]) and written as the terminal drains, so a
/// program writing a flood of output while its input queue is full (a terminal emulator
/// answering queries found in that output) cannot stall the session.
pub fn keep() -> i32 {
    // SAFETY: the agent started this process with the master side on MASTER_FD (dup2 in
    // its pre_exec), which nothing else in this process owns.
    let master = unsafe { OwnedFd::from_raw_fd(MASTER_FD) };
    if set_nonblocking(master.as_fd()).is_err() {
        return 1;
    }
    let mut stdin = io::stdin().lock();
    let mut out = io::stdout().lock();
    let mut buf = vec![0u8; CHUNK_SIZE];
    let mut input = Input::default();
    let held_until = std::time::Instant::now() + HOLD_UNTIL_OUTPUT;
    loop {
        if !input.ready && std::time::Instant::now() >= held_until {
            input.ready = true;
        }
        let take = input.open && input.typed.len() < TYPED_LIMIT;
        let give = if input.typed.is_empty() || !input.ready {
            0
        } else {
            POLLOUT
        };
        let mut fds = [
            poll_fd(0, take, POLLIN),
            poll_fd(master.as_raw_fd(), true, POLLIN | give),
        ];
        let wait = if input.ready {
            -1
        } else {
            held_until
                .saturating_duration_since(std::time::Instant::now())
                .as_millis() as i32
                + 1
        };
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let n = unsafe { nix::libc::poll(fds.as_mut_ptr(), fds.len() as _, wait) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return 1;
        }
        let ready = fds[1].revents;
        if ready & !POLLOUT != 0 {
            match pass_output(&master, &mut buf, &mut out) {
                // No slave side is open any more (EIO): the session is over. The agent
                // gone (a broken stdout) ends it too.
                None => return 0,
                Some(0) => {}
                Some(_) => input.ready = true,
            }
        }
        if ready & POLLOUT != 0 {
            input.type_into(master.as_fd());
        }
        if take && fds[0].revents != 0 {
            input.take(&mut stdin, &mut buf, master.as_fd());
        }
    }
}

const POLLIN: i16 = nix::libc::POLLIN;
const POLLOUT: i16 = nix::libc::POLLOUT;

fn poll_fd(fd: RawFd, on: bool, events: i16) -> nix::libc::pollfd {
    nix::libc::pollfd {
        fd: if on { fd } else { -1 },
        events,
        revents: 0,
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// One read of the terminal's output passed on: how many bytes (0: none yet), or `None`
/// when the terminal has ended or the output cannot be delivered.
fn pass_output(master: &OwnedFd, buf: &mut [u8], out: &mut impl Write) -> Option<usize> {
    match nix::unistd::read(master.as_fd(), buf) {
        Ok(n) if n > 0 => out
            .write_all(&buf[..n])
            .and_then(|()| out.flush())
            .ok()
            .map(|()| n),
        Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => Some(0),
        _ => None,
    }
}

/// The relay's side of the agent's frames: bytes of an incomplete frame, and typed input
/// the terminal has not taken yet.
struct Input {
    open: bool,
    /// The program has written something (or [`HOLD_UNTIL_OUTPUT`] passed): typed input
    /// goes to it.
    ready: bool,
    frames: Vec<u8>,
    typed: Vec<u8>,
}

impl Default for Input {
    fn default() -> Self {
        Input {
            open: true,
            ready: false,
            frames: Vec::new(),
            typed: Vec::new(),
        }
    }
}

impl Input {
    /// Reads what the agent sent and applies every complete frame; at end of input, stops
    /// taking more.
    fn take(&mut self, stdin: &mut impl Read, buf: &mut [u8], master: BorrowedFd<'_>) {
        let n = match stdin.read(buf) {
            Ok(0) | Err(_) => {
                self.open = false;
                return;
            }
            Ok(n) => n,
        };
        self.frames.extend_from_slice(&buf[..n]);
        while let Some((msg, used)) = split_frame(&self.frames) {
            self.frames.drain(..used);
            match msg {
                Some(Message::Data(data)) => self.typed.extend_from_slice(&data),
                Some(Message::PtyResize(size)) => {
                    let _ = resize(master, size);
                }
                _ => {}
            }
        }
        if self.ready {
            self.type_into(master);
        }
    }

    /// Writes as much held input as the terminal takes now.
    fn type_into(&mut self, master: BorrowedFd<'_>) {
        while !self.typed.is_empty() {
            match nix::unistd::write(master, &self.typed) {
                Ok(n) => {
                    self.typed.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                // EAGAIN: the terminal is full, POLLOUT says when it drains. Any other
                // error: the terminal is ending, and its output side says so.
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(_) => {
                    self.typed.clear();
                    return;
                }
            }
        }
    }
}

/// The first complete frame of `buf` and its length (`None` for a frame that does not
/// decode), or nothing while the frame is incomplete.
fn split_frame(buf: &[u8]) -> Option<(Option<Message>, usize)> {
    let prefix: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    let len = payload_len(prefix).ok()?;
    let payload = buf.get(4..4 + len)?;
    Some((decode_payload(payload).ok(), 4 + len))
}
