//! The OCI runtime config (`config.json`) of a sandbox, generated from its spec.
//!
//! Only the fields sandfork sets are modelled. See `docs/SECURITY.md` for why each
//! restriction is there.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::seccomp::{self, Seccomp};
use crate::spec::SandboxSpec;

/// Where the agent binary appears inside every sandbox (read-only bind mount).
pub const AGENT_PATH: &str = "/.sandfork/agent";
/// Where the host-owned run directory appears inside every sandbox.
pub const RUN_DIR: &str = "/run/sandfork";
/// The agent's socket inside the sandbox.
pub const AGENT_SOCKET: &str = "/run/sandfork/agent.sock";

/// CFS period used for the CPU quota, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Capabilities the sandbox's processes keep; everything else is dropped.
pub const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
];

/// Kernel paths hidden from the sandbox.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/interrupts",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/kernel/debug",
];

/// Kernel paths the sandbox may read but not write. `/sys/fs/cgroup` is the tmpfs that
/// holds the (read-only) cgroup hierarchies: without it, the sandbox could make
/// directories there that look like cgroups.
pub const READONLY_PATHS: &[&str] = &[
    "/sys/fs/cgroup",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub oci_version: &'static str,
    pub process: Process,
    pub root: Root,
    pub hostname: String,
    pub mounts: Vec<Mount>,
    pub linux: Linux,
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// CRIU options for every checkpoint and restore of a sandbox, in the CRIU configuration
/// file runc hands to CRIU (annotation `org.criu.config`). `tcp-close`: established TCP
/// connections do not block a dump and come back closed (a restored copy has its own
/// address, so they could not carry on; listeners come back as they were).
/// `network-lock skip`: CRIU does not fence the sandbox's network namespace with firewall
/// rules around a dump or restore — nothing can reach a namespace being restored before
/// the sandbox is handed out, and no TCP state is carried over — which saved ≈ 85 ms of
/// every restore (an `iptables-restore` each to lock and to unlock). `file-locks`: fcntl,
/// flock and OFD locks are dumped and taken again on restore (browsers, SQLite and package
/// managers hold them; without it CRIU refuses the dump). `ghost-limit 64M`: files deleted
/// while open are carried in the snapshot up to 64 MiB each (CRIU's default is 1 MiB).
pub const CRIU_OPTIONS: &str = "tcp-close\nnetwork-lock skip\nfile-locks\nghost-limit 64M\n";

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    pub terminal: bool,
    pub user: User,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub capabilities: Capabilities,
    pub rlimits: Vec<Rlimit>,
    pub no_new_privileges: bool,
    pub oom_score_adj: i32,
}

#[derive(Debug, Serialize)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Serialize)]
pub struct Capabilities {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub permitted: Vec<String>,
    pub inheritable: Vec<String>,
    pub ambient: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, Serialize)]
pub struct Root {
    pub path: PathBuf,
    pub readonly: bool,
}

#[derive(Debug, Serialize)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    pub namespaces: Vec<Namespace>,
    pub cgroups_path: String,
    pub resources: LinuxResources,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub seccomp: Seccomp,
    /// Sysctls of the sandbox's own namespaces (see [`SYSCTLS`]).
    pub sysctl: std::collections::BTreeMap<String, String>,
}

/// Sysctls set in the sandbox's own IPC namespace. `kernel.shm_rmid_forced`: a System V
/// shared memory segment goes away with the last process attached to it, so memory
/// charged to the sandbox cannot outlive the processes that hold it and crowd out the
/// agent (pid 1) under the memory limit.
pub const SYSCTLS: &[(&str, &str)] = &[("kernel.shm_rmid_forced", "1")];

#[derive(Debug, Serialize)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct LinuxResources {
    pub devices: Vec<DeviceRule>,
    pub memory: Memory,
    pub cpu: Cpu,
    pub pids: Pids,
}

#[derive(Debug, Serialize)]
pub struct DeviceRule {
    pub allow: bool,
    pub access: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Memory {
    pub limit: i64,
    pub swap: i64,
}

#[derive(Debug, Serialize)]
pub struct Cpu {
    pub quota: i64,
    pub period: u64,
}

#[derive(Debug, Serialize)]
pub struct Pids {
    pub limit: i64,
}

/// Host-side inputs to the config that are not part of the spec.
#[derive(Debug, Clone)]
pub struct HostPaths<'a> {
    pub rootfs: &'a Path,
    pub run_dir: &'a Path,
    pub agent_bin: &'a Path,
    pub netns: &'a Path,
    pub cgroup: &'a str,
    /// Host-owned resolver configuration to bind read-only at /etc/resolv.conf.
    pub resolv_conf: Option<&'a Path>,
    /// The CRIU configuration file (holding [`CRIU_OPTIONS`]).
    pub criu_config: &'a Path,
    /// RLIMIT_NOFILE given to the sandbox; at most the host's hard limit, since raising a
    /// limit needs CAP_SYS_RESOURCE, which the host may not have.
    pub nofile: u64,
}

/// Builds the OCI config of a sandbox.
pub fn config(spec: &SandboxSpec, host: &HostPaths<'_>) -> Config {
    Config {
        oci_version: "1.0.2",
        process: process(spec, host.nofile),
        root: Root {
            path: host.rootfs.to_path_buf(),
            readonly: false,
        },
        hostname: spec.id.clone(),
        mounts: mounts(host, spec.resources.memory_mb),
        linux: Linux {
            namespaces: namespaces(host.netns),
            cgroups_path: host.cgroup.to_string(),
            resources: resources(spec),
            masked_paths: MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            readonly_paths: READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
            seccomp: seccomp::profile(),
            sysctl: SYSCTLS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
        annotations: [(
            "org.criu.config".to_string(),
            host.criu_config.display().to_string(),
        )]
        .into(),
    }
}

fn process(spec: &SandboxSpec, nofile: u64) -> Process {
    let caps: Vec<String> = CAPABILITIES.iter().map(|s| s.to_string()).collect();
    Process {
        terminal: false,
        user: User { uid: 0, gid: 0 },
        args: vec![AGENT_PATH.into(), "--socket".into(), AGENT_SOCKET.into()],
        env: spec
            .merged_env()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        cwd: "/".into(),
        capabilities: Capabilities {
            bounding: caps.clone(),
            effective: caps.clone(),
            permitted: caps,
            inheritable: Vec::new(),
            ambient: Vec::new(),
        },
        rlimits: vec![
            Rlimit {
                kind: "RLIMIT_NOFILE",
                soft: nofile,
                hard: nofile,
            },
            // No core dumps: a crash in a sandbox never reaches the host's core_pattern
            // (a file there, or a helper the kernel would run as host root).
            Rlimit {
                kind: "RLIMIT_CORE",
                soft: 0,
                hard: 0,
            },
        ],
        no_new_privileges: true,
        oom_score_adj: 0,
    }
}

fn namespaces(netns: &Path) -> Vec<Namespace> {
    let own = |kind| Namespace { kind, path: None };
    vec![
        own("pid"),
        own("mount"),
        own("uts"),
        own("ipc"),
        own("cgroup"),
        // Made by sandfork, not runc: a restored copy needs it to exist beforehand.
        Namespace {
            kind: "network",
            path: Some(netns.to_path_buf()),
        },
    ]
}

fn mount(dest: &str, kind: &str, source: &str, options: &[&str]) -> Mount {
    Mount {
        destination: dest.into(),
        kind: kind.into(),
        source: source.into(),
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

/// The `size=` option of the sandbox's /dev and /dev/shm: an eighth of its memory, at
/// most 64 MiB. Their pages are charged to the sandbox's memory cgroup and cannot be
/// reclaimed, so full ones must leave room for the agent (else the OOM killer takes it).
fn tmpfs_size(memory_mb: u64) -> String {
    format!(
        "size={}k",
        (memory_mb.saturating_mul(1024) / 8).clamp(1024, 65536)
    )
}

fn mounts(host: &HostPaths<'_>, memory_mb: u64) -> Vec<Mount> {
    let agent = host.agent_bin.to_string_lossy();
    let run = host.run_dir.to_string_lossy();
    let size = tmpfs_size(memory_mb);
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", &size],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", &size],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        ),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ),
        mount(
            RUN_DIR,
            "bind",
            &run,
            &["rbind", "nosuid", "nodev", "noexec"],
        ),
        mount(
            AGENT_PATH,
            "bind",
            &agent,
            &["bind", "ro", "nosuid", "nodev"],
        ),
    ];
    if let Some(resolv) = host.resolv_conf {
        let source = resolv.to_string_lossy();
        let options = ["bind", "ro", "nosuid", "nodev", "noexec"];
        mounts.push(mount("/etc/resolv.conf", "bind", &source, &options));
    }
    mounts
}

fn resources(spec: &SandboxSpec) -> LinuxResources {
    let r = &spec.resources;
    let memory = (r.memory_mb as i64).saturating_mul(1 << 20);
    LinuxResources {
        // Deny every device node; runc then allows only its default safe set
        // (null, zero, full, random, urandom, tty, ptmx/pts) which it creates in /dev.
        devices: vec![DeviceRule {
            allow: false,
            access: "rwm",
        }],
        memory: Memory {
            limit: memory,
            swap: memory,
        },
        cpu: Cpu {
            quota: (r.cpus * CPU_PERIOD_US as f64).round() as i64,
            period: CPU_PERIOD_US,
        },
        pids: Pids {
            limit: i64::from(r.pids),
        },
    }
}

/// Serialises the config.
pub fn to_json(config: &Config) -> Vec<u8> {
    serde_json::to_vec_pretty(config).expect("OCI config serialises")
}

/// The config's value as JSON, for inspection.
pub fn to_value(config: &Config) -> serde_json::Value {
    serde_json::to_value(config).expect("OCI config serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ImageRef, Resources};

    fn spec() -> SandboxSpec {
        SandboxSpec {
            id: "sb-1".into(),
            image: ImageRef {
                name: "busybox".into(),
                layer: "l0".into(),
                env: [("LANG".into(), "C".into())].into(),
                cwd: "/".into(),
            },
            resources: Resources {
                cpus: 1.5,
                memory_mb: 256,
                pids: 100,
                disk_mb: 0,
            },
            env: [("LANG".into(), "C.UTF-8".into())].into(),
            network: Default::default(),
        }
    }

    fn generated() -> serde_json::Value {
        let host = HostPaths {
            rootfs: Path::new("/d/rootfs"),
            run_dir: Path::new("/d/run"),
            agent_bin: Path::new("/opt/agent"),
            netns: Path::new("/run/netns/sf-sb-1"),
            cgroup: "/sandfork/sb-1",
            resolv_conf: None,
            criu_config: Path::new("/d/bundle/criu.conf"),
            nofile: 20000,
        };
        to_value(&config(&spec(), &host))
    }

    #[test]
    fn shared_memory_cannot_outlive_its_processes() {
        assert_eq!(
            generated()["linux"]["sysctl"]["kernel.shm_rmid_forced"],
            "1"
        );
    }

    #[test]
    fn criu_reads_its_options_from_the_bundle() {
        let v = generated();
        assert_eq!(v["annotations"]["org.criu.config"], "/d/bundle/criu.conf");
        assert!(CRIU_OPTIONS.lines().any(|l| l == "tcp-close"));
        assert!(CRIU_OPTIONS.lines().any(|l| l == "network-lock skip"));
    }

    #[test]
    fn tmpfs_sizes_follow_memory() {
        assert_eq!(tmpfs_size(64), "size=8192k");
        assert_eq!(tmpfs_size(512), "size=65536k");
        assert_eq!(tmpfs_size(4096), "size=65536k");
        assert_eq!(tmpfs_size(1), "size=1024k");
        let v = generated();
        let shm = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .unwrap();
        assert!(shm["options"]
            .as_array()
            .unwrap()
            .contains(&"size=32768k".into()));
    }

    #[test]
    fn namespaces_and_netns_by_path() {
        let v = generated();
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        let kinds: Vec<_> = ns.iter().map(|n| n["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["pid", "mount", "uts", "ipc", "cgroup", "network"]);
        assert_eq!(ns[5]["path"], "/run/netns/sf-sb-1");
        assert!(!kinds.contains(&"user"));
        assert_eq!(v["hostname"], "sb-1");
        assert_eq!(v["linux"]["cgroupsPath"], "/sandfork/sb-1");
    }

    #[test]
    fn capabilities_are_minimal() {
        let v = generated();
        let caps = &v["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            let list: Vec<_> = caps[set]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            assert_eq!(list, CAPABILITIES);
            for bad in [
                "CAP_SYS_ADMIN",
                "CAP_NET_ADMIN",
                "CAP_NET_RAW",
                "CAP_SYS_PTRACE",
            ] {
                assert!(!list.contains(&bad));
            }
        }
        assert!(caps["ambient"].as_array().unwrap().is_empty());
        assert_eq!(v["process"]["noNewPrivileges"], true);
    }

    #[test]
    fn limits_follow_resources() {
        let v = generated();
        let r = &v["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 256 << 20);
        assert_eq!(r["memory"]["swap"], 256 << 20);
        assert_eq!(r["cpu"]["quota"], 150_000);
        assert_eq!(r["cpu"]["period"], 100_000);
        assert_eq!(r["pids"]["limit"], 100);
        assert_eq!(v["process"]["rlimits"][0]["hard"], 20000);
    }

    #[test]
    fn kernel_paths_masked_and_readonly() {
        let v = generated();
        let masked = v["linux"]["maskedPaths"].as_array().unwrap();
        for p in [
            "/proc/kcore",
            "/proc/keys",
            "/sys/firmware",
            "/proc/sched_debug",
        ] {
            assert!(masked.iter().any(|m| m == p), "{p}");
        }
        let ro = v["linux"]["readonlyPaths"].as_array().unwrap();
        assert!(ro.iter().any(|m| m == "/proc/sys"));
        assert!(ro.iter().any(|m| m == "/sys/fs/cgroup"));
        let sys = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/sys");
        assert!(sys.unwrap()["options"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "ro"));
    }

    #[test]
    fn agent_runs_as_init_with_host_owned_socket_dir() {
        let v = generated();
        assert_eq!(v["process"]["args"][0], AGENT_PATH);
        assert_eq!(v["process"]["args"][2], AGENT_SOCKET);
        let mounts = v["mounts"].as_array().unwrap();
        let run = mounts.iter().find(|m| m["destination"] == RUN_DIR).unwrap();
        assert_eq!(run["source"], "/d/run");
        let agent = mounts
            .iter()
            .find(|m| m["destination"] == AGENT_PATH)
            .unwrap();
        assert!(agent["options"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "ro"));
        let env = v["process"]["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e == "LANG=C.UTF-8"));
        assert!(env.iter().any(|e| e == "HOSTNAME=sb-1"));
    }

    #[test]
    fn resolver_bound_read_only_when_given() {
        let none = generated();
        let has = |v: &serde_json::Value| {
            let m = v["mounts"].as_array().unwrap();
            m.iter()
                .find(|m| m["destination"] == "/etc/resolv.conf")
                .cloned()
        };
        assert!(has(&none).is_none());
        let host = HostPaths {
            rootfs: Path::new("/d/rootfs"),
            run_dir: Path::new("/d/run"),
            agent_bin: Path::new("/opt/agent"),
            netns: Path::new("/run/netns/sf-sb-1"),
            cgroup: "/sandfork/sb-1",
            resolv_conf: Some(Path::new("/d/resolv.conf")),
            criu_config: Path::new("/d/bundle/criu.conf"),
            nofile: 20000,
        };
        let m = has(&to_value(&config(&spec(), &host))).unwrap();
        assert_eq!(m["source"], "/d/resolv.conf");
        assert!(m["options"].as_array().unwrap().iter().any(|o| o == "ro"));
    }

    #[test]
    fn seccomp_present_and_denies_by_default() {
        let v = generated();
        let s = &v["linux"]["seccomp"];
        assert_eq!(s["defaultAction"], "SCMP_ACT_ERRNO");
        let allowed: Vec<&str> = s["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
            .flat_map(|r| {
                r["names"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap())
            })
            .collect();
        assert!(allowed.contains(&"read"));
        for bad in [
            "kexec_load",
            "init_module",
            "mount",
            "bpf",
            "keyctl",
            "userfaultfd",
        ] {
            assert!(!allowed.contains(&bad), "{bad}");
        }
    }
}
