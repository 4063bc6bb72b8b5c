//! The OCI runtime config (`config.json`) of a sandbox, generated from its spec with the
//! `oci-spec` crate's types.
//!
//! Every field sandfork relies on is set explicitly (the crate's builders fill unset ones
//! from its own defaults, which are not ours). See `docs/SECURITY.md` for why each
//! restriction is there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder,
    LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxPidsBuilder, LinuxResources, LinuxResourcesBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use crate::error::{Error, Result};
use crate::seccomp;
use crate::spec::SandboxSpec;

/// Where the agent binary appears inside every sandbox (read-only bind mount).
pub const AGENT_PATH: &str = "/.sandfork/agent";
/// Where the host-owned run directory appears inside every sandbox.
pub const RUN_DIR: &str = "/run/sandfork";
/// The agent's socket inside the sandbox.
pub const AGENT_SOCKET: &str = "/run/sandfork/agent.sock";

/// CFS period used for the CPU quota, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The runtime spec version the config follows.
const OCI_VERSION: &str = "1.0.2";

/// Capabilities the sandbox's processes keep; everything else is dropped.
pub const CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::AuditWrite,
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

/// CRIU options for every checkpoint and restore of a sandbox, in the CRIU configuration
/// file runc hands to CRIU (annotation `org.criu.config`). `tcp-close`: established TCP
/// connections do not block a dump and come back closed (a restored copy has its own
/// address, so they could not carry on; listeners come back as they were) — except, with
/// the CRIU `scripts/setup` builds (patch `0003`), a connection over loopback (127.0.0.0/8,
/// `::1`) whose two ends are both in the sandbox: its address is the same in every copy,
/// so it is dumped with its state and carries on established in every restored copy.
/// `network-lock skip`: CRIU does not fence the sandbox's network namespace with firewall
/// rules around a dump or restore — nothing can reach a namespace being restored before
/// the sandbox is handed out, and the only TCP state carried over is that of loopback
/// connections between two frozen processes of the sandbox, whose two images the restore
/// checks against each other (it closes both ends where they disagree) — which saved
/// ≈ 85 ms of every restore (an `iptables-restore` each to lock and to unlock).
/// `file-locks`: fcntl, flock and OFD locks are dumped and taken again on restore
/// (browsers, SQLite and package managers hold them; without it CRIU refuses the dump).
/// `ghost-limit 64M`: files deleted while open are carried in the snapshot up to 64 MiB
/// each (CRIU's default is 1 MiB).
/// `manage-cgroups ignore`: CRIU neither records nor restores cgroups. runc has put the
/// restoring CRIU in the sandbox's own cgroups (with the spec's limits) before CRIU forks
/// the tree, so the tree starts in them; a sandbox cannot make cgroups of its own
/// (its /sys/fs/cgroup is read-only). CRIU's own cgroup restore mounted every controller
/// in a scratch yard and moved each task again (≈ 10–20 ms of every restore).
pub const CRIU_OPTIONS: &str =
    "tcp-close\nnetwork-lock skip\nfile-locks\nghost-limit 64M\nmanage-cgroups ignore\n";

/// Sysctls set in the sandbox's own IPC namespace. `kernel.shm_rmid_forced`: a System V
/// shared memory segment goes away with the last process attached to it, so memory
/// charged to the sandbox cannot outlive the processes that hold it and crowd out the
/// agent (pid 1) under the memory limit.
pub const SYSCTLS: &[(&str, &str)] = &[("kernel.shm_rmid_forced", "1")];

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

/// The config's builders fail only on a field left unset that has no default; a failure
/// is a bug here, told as an invalid spec.
fn built<T>(r: std::result::Result<T, oci_spec::OciSpecError>) -> Result<T> {
    r.map_err(|e| Error::InvalidSpec(format!("OCI config: {e}")))
}

/// Builds the OCI config of a sandbox.
pub fn config(spec: &SandboxSpec, host: &HostPaths<'_>) -> Result<Spec> {
    let linux = LinuxBuilder::default()
        .namespaces(namespaces(host.netns)?)
        .cgroups_path(PathBuf::from(host.cgroup))
        .resources(resources(spec)?)
        .masked_paths(strings(MASKED_PATHS))
        .readonly_paths(strings(READONLY_PATHS))
        .seccomp(seccomp::profile()?)
        .sysctl(
            SYSCTLS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        )
        .build();
    let root = RootBuilder::default()
        .path(host.rootfs)
        .readonly(false)
        .build();
    let annotations: HashMap<String, String> = [(
        "org.criu.config".to_string(),
        host.criu_config.display().to_string(),
    )]
    .into();
    built(
        SpecBuilder::default()
            .version(OCI_VERSION)
            .process(process(spec, host.nofile)?)
            .root(built(root)?)
            .hostname(spec.id.clone())
            .mounts(mounts(host, spec)?)
            .linux(built(linux)?)
            .annotations(annotations)
            .build(),
    )
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The agent's command line: its socket, and the image's default user and working
/// directory for processes whose request names none.
fn agent_args(spec: &SandboxSpec) -> Vec<String> {
    let mut args = vec![AGENT_PATH.into(), "--socket".into(), AGENT_SOCKET.into()];
    if let Some(user) = &spec.image.user {
        args.extend(["--user".into(), user.clone()]);
    }
    if spec.image.cwd != "/" {
        args.extend(["--workdir".into(), spec.image.cwd.clone()]);
    }
    args
}

fn process(spec: &SandboxSpec, nofile: u64) -> Result<Process> {
    let caps: oci_spec::runtime::Capabilities = CAPABILITIES.iter().copied().collect();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .inheritable(oci_spec::runtime::Capabilities::new())
        .ambient(oci_spec::runtime::Capabilities::new())
        .build();
    let rlimit = |typ, limit| {
        built(
            PosixRlimitBuilder::default()
                .typ(typ)
                .soft(limit)
                .hard(limit)
                .build(),
        )
    };
    let rlimits = vec![
        rlimit(PosixRlimitType::RlimitNofile, nofile)?,
        // No core dumps: a crash in a sandbox never reaches the host's core_pattern (a
        // file there, or a helper the kernel would run as host root).
        rlimit(PosixRlimitType::RlimitCore, 0)?,
    ];
    let env: Vec<String> = spec
        .merged_env()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    built(
        ProcessBuilder::default()
            .terminal(false)
            .user(built(UserBuilder::default().uid(0u32).gid(0u32).build())?)
            .args(agent_args(spec))
            .env(env)
            .cwd("/")
            .capabilities(built(capabilities)?)
            .rlimits(rlimits)
            .no_new_privileges(true)
            .oom_score_adj(0)
            .build(),
    )
}

fn namespaces(netns: &Path) -> Result<Vec<LinuxNamespace>> {
    let own = |typ| built(LinuxNamespaceBuilder::default().typ(typ).build());
    Ok(vec![
        own(LinuxNamespaceType::Pid)?,
        own(LinuxNamespaceType::Mount)?,
        own(LinuxNamespaceType::Uts)?,
        own(LinuxNamespaceType::Ipc)?,
        own(LinuxNamespaceType::Cgroup)?,
        // Made by sandfork, not runc: a restored copy needs it to exist beforehand.
        built(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .path(netns)
                .build(),
        )?,
    ])
}

fn mount(dest: &str, kind: &str, source: &str, options: &[&str]) -> Result<Mount> {
    built(
        MountBuilder::default()
            .destination(dest)
            .typ(kind)
            .source(source)
            .options(strings(options))
            .build(),
    )
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

fn mounts(host: &HostPaths<'_>, spec: &SandboxSpec) -> Result<Vec<Mount>> {
    let memory_mb = spec.resources.memory_mb;
    let agent = host.agent_bin.to_string_lossy();
    let run = host.run_dir.to_string_lossy();
    let size = tmpfs_size(memory_mb);
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", &size],
        )?,
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
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", &size],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        )?,
        mount(
            RUN_DIR,
            "bind",
            &run,
            &["rbind", "nosuid", "nodev", "noexec"],
        )?,
        mount(
            AGENT_PATH,
            "bind",
            &agent,
            &["bind", "ro", "nosuid", "nodev"],
        )?,
    ];
    if let Some(resolv) = host.resolv_conf {
        let source = resolv.to_string_lossy();
        let options = ["bind", "ro", "nosuid", "nodev", "noexec"];
        mounts.push(mount("/etc/resolv.conf", "bind", &source, &options)?);
    }
    // Volumes: binds of their host mounts, never device nodes or set-id programs.
    for v in &spec.volumes {
        let source = v.source.to_string_lossy();
        let access = if v.read_only { "ro" } else { "rw" };
        let options = ["rbind", access, "nosuid", "nodev"];
        mounts.push(mount(&v.destination, "bind", &source, &options)?);
    }
    Ok(mounts)
}

fn resources(spec: &SandboxSpec) -> Result<LinuxResources> {
    let r = &spec.resources;
    let memory = (r.memory_mb as i64).saturating_mul(1 << 20);
    // Deny every device node; runc then allows only its default safe set (null, zero,
    // full, random, urandom, tty, ptmx/pts) which it creates in /dev.
    let deny_devices = LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build();
    let memory = LinuxMemoryBuilder::default()
        .limit(memory)
        .swap(memory)
        .build();
    let cpu = LinuxCpuBuilder::default()
        .quota((r.cpus * CPU_PERIOD_US as f64).round() as i64)
        .period(CPU_PERIOD_US)
        .build();
    let pids = LinuxPidsBuilder::default().limit(i64::from(r.pids)).build();
    built(
        LinuxResourcesBuilder::default()
            .devices(vec![built(deny_devices)?])
            .memory(built(memory)?)
            .cpu(built(cpu)?)
            .pids(built(pids)?)
            .build(),
    )
}

/// Serialises the config.
pub fn to_json(config: &Spec) -> Vec<u8> {
    serde_json::to_vec_pretty(config).expect("OCI config serialises")
}

/// The config's value as JSON, for inspection.
pub fn to_value(config: &Spec) -> serde_json::Value {
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
                user: None,
            },
            resources: Resources {
                cpus: 1.5,
                memory_mb: 256,
                pids: 100,
                disk_mb: 0,
            },
            env: [("LANG".into(), "C.UTF-8".into())].into(),
            network: Default::default(),
            volumes: Vec::new(),
        }
    }

    /// The config of `spec()` on fixed host paths, as JSON.
    fn made(resolv_conf: Option<&Path>) -> serde_json::Value {
        let host = HostPaths {
            rootfs: Path::new("/d/rootfs"),
            run_dir: Path::new("/d/run"),
            agent_bin: Path::new("/opt/agent"),
            netns: Path::new("/run/netns/sf-sb-1"),
            cgroup: "/sandfork/sb-1",
            resolv_conf,
            criu_config: Path::new("/d/bundle/criu.conf"),
            nofile: 20000,
        };
        to_value(&config(&spec(), &host).unwrap())
    }

    fn generated() -> serde_json::Value {
        made(None)
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
            let mut list: Vec<String> = list.iter().map(|c| c.to_string()).collect();
            let mut kept: Vec<String> = CAPABILITIES
                .iter()
                .map(|c| {
                    serde_json::to_value(c)
                        .unwrap()
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            list.sort();
            kept.sort();
            assert_eq!(list, kept);
            for bad in [
                "CAP_SYS_ADMIN",
                "CAP_NET_ADMIN",
                "CAP_NET_RAW",
                "CAP_SYS_PTRACE",
            ] {
                assert!(!list.iter().any(|c| c == bad));
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
        let m = has(&made(Some(Path::new("/d/resolv.conf")))).unwrap();
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

    /// Sorts the capability sets, which the crate keeps as hash sets.
    fn sorted_caps(mut v: serde_json::Value) -> serde_json::Value {
        let caps = v["process"]["capabilities"].as_object_mut().unwrap();
        for set in caps.values_mut() {
            set.as_array_mut()
                .unwrap()
                .sort_by_key(|c| c.as_str().unwrap().to_string());
        }
        v
    }

    /// The whole config, field for field: nothing the `oci-spec` builders would default
    /// (their defaults are not sandfork's) reaches it, and nothing sandfork sets is lost.
    #[test]
    fn the_config_is_exactly_the_reviewed_one() {
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("oci.golden.json")).unwrap();
        let made = made(Some(Path::new("/d/resolv.conf")));
        assert_eq!(sorted_caps(made), sorted_caps(golden));
    }
}
