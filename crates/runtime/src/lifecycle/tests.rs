use std::path::PathBuf;

use super::*;
use crate::host::FakeHost;
use crate::spec::{ImageRef, Resources};

struct Env {
    _dir: tempfile::TempDir,
    layout: Layout,
    net: NetConfig,
    agent: PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let net = NetConfig {
        pool: "10.77.0.0/28".parse().unwrap(),
        lease_dir: dir.path().join("leases"),
    };
    Env {
        layout: Layout::new(dir.path().join("data")),
        net,
        agent: dir.path().join("agent"),
        _dir: dir,
    }
}

fn ctx<'a>(env: &'a Env, host: &'a FakeHost) -> Ctx<'a> {
    Ctx {
        host,
        layout: &env.layout,
        net: &env.net,
        agent_bin: &env.agent,
        ready_timeout: Duration::from_secs(1),
        restore_images: None,
    }
}

fn spec(id: &str, network: NetworkMode) -> SandboxSpec {
    SandboxSpec {
        id: id.into(),
        image: ImageRef {
            name: "busybox".into(),
            layer: "L".into(),
            env: Default::default(),
            cwd: "/".into(),
        },
        resources: Resources::default(),
        env: Default::default(),
        network,
    }
}

fn internet() -> NetworkMode {
    NetworkMode::Internet {
        allow_out: vec![],
        deny_out: vec![],
    }
}

const CREATE_NONE: &[&str] = &[
    "mount_run_dir",
    "create_disk",
    "mount_disk",
    "netns_add",
    "write_config",
    "runc_run",
    "wait_agent",
];
const CREATE_INTERNET: &[&str] = &[
    "mount_run_dir",
    "create_disk",
    "mount_disk",
    "netns_add",
    "veth_add",
    "nft_prepare",
    "nft_apply",
    "write_config",
    "runc_run",
    "wait_agent",
];
/// Undo of every step, in order.
const UNDO_ALL: &[&str] = &[
    "runc_kill",
    "runc_delete",
    "cgroup_remove",
    "nft_remove",
    "veth_delete",
    "netns_delete",
    "unmount_disk",
    "delete_disk",
    "unmount_run_dir",
];

#[test]
fn create_runs_steps_in_order() {
    let env = env();
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("a", NetworkMode::None)).unwrap();
    assert_eq!(host.ops(), CREATE_NONE);
    assert!(rec.net.is_none());
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("b", internet())).unwrap();
    assert_eq!(host.ops(), CREATE_INTERNET);
    let alloc = rec.net.unwrap();
    assert!(alloc.lease.exists());
    assert_eq!(
        Record::load(&env.layout.sandbox("b").record()).unwrap().net,
        Some(alloc)
    );
}

/// Undo operations expected after the create step running `failed` failed.
fn expected_undo(failed: &str, network: bool) -> Vec<&'static str> {
    let attempted_rank = |op: &str| -> usize {
        let order = [
            "mount_run_dir",
            "create_disk",
            "mount_disk",
            "netns_add",
            "veth_add",
            "nft_prepare",
            "write_config",
            "runc_run",
            "wait_agent",
        ];
        order.iter().position(|o| *o == op).unwrap()
    };
    let f = attempted_rank(failed);
    let mut undo = Vec::new();
    // Container undo covers runc_run and wait_agent failures.
    if f >= attempted_rank("runc_run") {
        undo.extend(["runc_kill", "runc_delete", "cgroup_remove"]);
    }
    if network && f >= attempted_rank("nft_prepare") {
        undo.push("nft_remove");
    }
    if network && f >= attempted_rank("veth_add") {
        undo.push("veth_delete");
    }
    if f > attempted_rank("netns_add") {
        undo.push("netns_delete");
    }
    if f >= attempted_rank("mount_disk") {
        undo.push("unmount_disk");
    }
    if f >= attempted_rank("create_disk") {
        undo.push("delete_disk");
    }
    undo.push("unmount_run_dir");
    undo
}

#[test]
fn failed_create_undoes_every_attempted_step() {
    for (network, steps) in [(false, CREATE_NONE), (true, CREATE_INTERNET)] {
        for failed in steps.iter().filter(|s| **s != "nft_apply") {
            let env = env();
            let host = FakeHost::new();
            host.fail_on(failed);
            let mode = if network {
                internet()
            } else {
                NetworkMode::None
            };
            assert!(create(&ctx(&env, &host), spec("x", mode)).is_err());
            let ops = host.ops();
            let at = ops.iter().position(|o| o == failed).unwrap();
            assert_eq!(&ops[..at], &steps[..at], "{failed}");
            assert_eq!(
                ops[at + 1..].to_vec(),
                expected_undo(failed, network),
                "after {failed}"
            );
            assert!(!env.layout.sandbox("x").dir.exists(), "{failed}");
            assert!(net::leases_owned(&env.net, "").is_empty(), "{failed}");
        }
    }
}

#[test]
fn destroy_undoes_everything_and_is_idempotent() {
    let env = env();
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("d", internet())).unwrap();
    host.clear();
    destroy(&ctx(&env, &host), "d").unwrap();
    assert_eq!(host.ops(), UNDO_ALL);
    assert!(!rec.net.unwrap().lease.exists());
    assert!(!env.layout.sandbox("d").dir.exists());
    host.clear();
    destroy(&ctx(&env, &host), "d").unwrap();
    assert!(host.ops().is_empty());
}

#[test]
fn destroy_continues_past_failures_and_keeps_dir() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("f", NetworkMode::None)).unwrap();
    host.clear();
    host.fail_on("unmount_disk");
    assert!(destroy(&ctx(&env, &host), "f").is_err());
    assert_eq!(
        host.ops(),
        UNDO_ALL
            .iter()
            .filter(|o| !o.starts_with("nft") && **o != "veth_delete")
            .copied()
            .collect::<Vec<_>>()
    );
    assert!(
        env.layout.sandbox("f").dir.exists(),
        "a mounted rootfs must not be removed"
    );
}

#[test]
fn destroy_of_half_created_sandbox_without_record() {
    let env = env();
    let host = FakeHost::new();
    env.layout.sandbox("h").create("h").unwrap();
    destroy(&ctx(&env, &host), "h").unwrap();
    assert!(host.ops().contains(&"netns_delete".to_string()));
    assert!(!env.layout.sandbox("h").dir.exists());
}

#[test]
fn duplicate_and_invalid_ids_are_refused_without_side_effects() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("dup", NetworkMode::None)).unwrap();
    host.clear();
    assert!(matches!(
        create(&ctx(&env, &host), spec("dup", NetworkMode::None)),
        Err(Error::Exists(_))
    ));
    assert!(matches!(
        create(&ctx(&env, &host), spec("../x", NetworkMode::None)),
        Err(Error::InvalidSpec(_))
    ));
    assert!(host.ops().is_empty());
    assert!(env.layout.sandbox("dup").dir.exists());
}

#[test]
fn stop_then_restart_reuses_disk_and_network() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("s", internet())).unwrap();
    host.clear();
    assert!(matches!(
        restart(&ctx(&env, &host), "s"),
        Err(Error::NotStopped(_))
    ));
    assert_eq!(
        host.ops(),
        ["runc_state"],
        "a running sandbox is left alone"
    );
    host.clear();
    stop(&ctx(&env, &host), "s").unwrap();
    restart(&ctx(&env, &host), "s").unwrap();
    let ops = [
        "runc_kill",
        "runc_delete",
        "runc_state",
        "write_config",
        "runc_run",
        "wait_agent",
    ];
    assert_eq!(host.ops(), ops);
}
