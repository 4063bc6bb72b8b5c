//! The sandbox's seccomp profile: an allowlist modelled on the common container default.
//!
//! Everything not listed fails with EPERM (runc turns syscalls newer than the profile
//! knows into ENOSYS so that libraries fall back). Notably absent, and so refused:
//! kexec_*, *_module, mount and the new mount API, umount*, pivot_root, swapon/off,
//! reboot, bpf, perf_event_open, keyctl/add_key/request_key, userfaultfd,
//! open_by_handle_at, unshare, setns, io_uring_*, acct, quotactl, settimeofday and
//! clock_settime, iopl/ioperm, lookup_dcookie, {get,set}_mempolicy, mbind, move_pages.
//! `clone` may not create namespaces, `clone3` returns ENOSYS (so `clone` is used),
//! `socket` may not open AF_VSOCK, `personality` only the harmless personas. Only the
//! x86_64 ABI is allowed: 32-bit syscalls kill the caller.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use crate::error::{Error, Result};

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
const AF_VSOCK: u64 = 40;
/// CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME.
const CLONE_NS_FLAGS: u64 = 0x7E02_0080;

/// Syscalls allowed without argument checks.
const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "arch_prctl",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chroot",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_getfd",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "process_vm_readv",
    "process_vm_writev",
    "pselect6",
    "ptrace",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "socketpair",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
];

fn built<T>(r: std::result::Result<T, oci_spec::OciSpecError>) -> Result<T> {
    r.map_err(|e| Error::InvalidSpec(format!("seccomp profile: {e}")))
}

fn rule(
    names: &[&str],
    action: LinuxSeccompAction,
    errno: Option<u32>,
    args: Vec<LinuxSeccompArg>,
) -> Result<LinuxSyscall> {
    let mut b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .action(action);
    if let Some(errno) = errno {
        b = b.errno_ret(errno);
    }
    if !args.is_empty() {
        b = b.args(args);
    }
    built(b.build())
}

fn allow(names: &[&str], args: Vec<LinuxSeccompArg>) -> Result<LinuxSyscall> {
    rule(names, LinuxSeccompAction::ScmpActAllow, None, args)
}

fn arg(index: usize, op: LinuxSeccompOperator, value: u64) -> Result<LinuxSeccompArg> {
    built(
        LinuxSeccompArgBuilder::default()
            .index(index)
            .op(op)
            .value(value)
            .value_two(0u64)
            .build(),
    )
}

/// The profile put into every sandbox's config.
pub fn profile() -> Result<LinuxSeccomp> {
    use LinuxSeccompOperator::{ScmpCmpEq, ScmpCmpMaskedEq, ScmpCmpNe};
    let mut syscalls = vec![allow(ALLOWED, Vec::new())?];
    // `clone` with no namespace flag: (flags & CLONE_NS_FLAGS) == 0 (`valueTwo`).
    syscalls.push(allow(
        &["clone"],
        vec![arg(0, ScmpCmpMaskedEq, CLONE_NS_FLAGS)?],
    )?);
    syscalls.push(allow(&["socket"], vec![arg(0, ScmpCmpNe, AF_VSOCK)?])?);
    // Each persona is its own rule: conditions inside one rule are ANDed.
    for persona in [0u64, 0x0008, 0x20000, 0x20008, 0xffff_ffff] {
        syscalls.push(allow(&["personality"], vec![arg(0, ScmpCmpEq, persona)?])?);
    }
    syscalls.push(rule(
        &["clone3"],
        LinuxSeccompAction::ScmpActErrno,
        Some(ENOSYS),
        Vec::new(),
    )?);
    built(
        LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActErrno)
            .default_errno_ret(EPERM)
            .architectures(vec![Arch::ScmpArchX86_64])
            .syscalls(syscalls)
            .build(),
    )
}
