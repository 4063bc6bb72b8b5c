//! Checkpoint/restore/fork benchmarks; prints JSON lines (`bench/report.py` format).
//!
//! `cargo run --release -p sandfork-runtime --example bench_fork -- [--python] [--mb 50,500]
//!  [--runs N] [--fanout 1,8,32]`
//!
//! A process holding `mb` MB of memory (python3 with `--python`, using the python image of
//! `bench/sandbox` kept in `$SANDFORK_BENCH_DIR`, else a busybox shell holding a string):
//! memory checkpoint time (the sandbox keeps running); warm restore → first exec, against
//! a cold create → first exec of the same image; fork fan-out of N children restored 4 at a
//! time (total and per-child p50/p99), against N cold creates at the same parallelism.
//! The warm restores and cold creates are also broken down into their steps (the runtime's
//! `sandfork::steps` events): the median of each step, restore next to create.
//! Then filesystem checkpoint time vs bytes changed and vs disk size.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use runtime::host::{Disks, RealHost};
use runtime::image::{BuildSpec, Images, Source};
use runtime::{
    CheckpointKind, ContainerRuntime, ImageRef, Resources, RestoreOptions, RuntimeConfig,
    SandboxSpec, SnapshotSource,
};
use tokio::sync::Semaphore;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

const PARALLEL: usize = 4;

struct Args {
    python: bool,
    sizes: Vec<u64>,
    runs: usize,
    fanout: Vec<usize>,
}

fn list(s: Option<String>) -> Vec<u64> {
    s.unwrap_or_default()
        .split(',')
        .filter_map(|n| n.parse().ok())
        .collect()
}

fn args() -> Args {
    let mut a = Args {
        python: false,
        sizes: vec![50],
        runs: 5,
        fanout: vec![1, 8, 32],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--python" => a.python = true,
            "--mb" => a.sizes = list(it.next()),
            "--runs" => a.runs = it.next().and_then(|n| n.parse().ok()).unwrap_or(5),
            "--fanout" => a.fanout = list(it.next()).into_iter().map(|n| n as usize).collect(),
            _ => eprintln!("bench: ignoring {flag}"),
        }
    }
    a
}

fn pct(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() as f64 - 1.0) * p).round() as usize]
}

fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn emit(
    name: &str,
    ours: &[f64],
    base: Option<(&[f64], &str)>,
    unit: &str,
    extra: serde_json::Value,
) {
    let v = pct(ours, 0.5);
    let mut j = serde_json::json!({
        "suite": "fork", "name": name, "value": r2(v), "p99": r2(pct(ours, 0.99)),
        "unit": unit, "runs": ours.len(),
    });
    if let Some((b, bn)) = base {
        let bv = pct(b, 0.5);
        j["baseline"] = r2(bv).into();
        j["baseline_name"] = bn.into();
        j["ratio"] = ((v / bv * 1000.0).round() / 1000.0).into();
    }
    if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    println!("{j}");
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The runtime's step timings (`sandfork::steps` events) since the last [`Steps::take`].
#[derive(Clone, Default)]
struct Steps(Arc<Mutex<Vec<(String, f64)>>>);

impl Steps {
    fn take(&self) -> Vec<(String, f64)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[derive(Default)]
struct StepVisitor {
    step: Option<String>,
    ms: Option<f64>,
}

impl tracing::field::Visit for StepVisitor {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        if field.name() == "ms" {
            self.ms = Some(value);
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "step" {
            self.step = Some(value.to_string());
        }
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for Steps {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "sandfork::steps" {
            return;
        }
        let mut v = StepVisitor::default();
        event.record(&mut v);
        if let (Some(step), Some(ms)) = (v.step, v.ms) {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((step, ms));
        }
    }
}

/// Per step, the times of every run.
type Breakdown = BTreeMap<String, Vec<f64>>;

fn add_steps(into: &mut Breakdown, steps: Vec<(String, f64)>) {
    for (step, ms) in steps {
        into.entry(step).or_default().push(ms);
    }
}

struct Bench {
    steps: Steps,
    rt: ContainerRuntime,
    image: ImageRef,
    python: bool,
    dir: PathBuf,
    n: std::sync::atomic::AtomicUsize,
}

impl Bench {
    fn id(&self, tag: &str) -> String {
        let n = self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("bf-{tag}-{}-{n}", std::process::id())
    }

    fn spec(&self, id: String, memory_mb: u64, disk_mb: u64) -> SandboxSpec {
        SandboxSpec {
            id,
            image: self.image.clone(),
            resources: Resources {
                cpus: 1.0,
                memory_mb,
                pids: 512,
                disk_mb,
            },
            env: Default::default(),
            network: runtime::NetworkMode::None,
            volumes: Vec::new(),
        }
    }

    fn holder(&self, mb: u64) -> String {
        if self.python {
            format!(
                "python3 -c \"import os,time; b=bytearray(os.urandom({mb}<<20)); \
                 open('/tmp/ready','w').close(); time.sleep(1e9)\""
            )
        } else {
            format!(
                "x=$(head -c {} /dev/urandom | od -An -v -tx1 | tr -d ' \\n' | head -c {}); \
                 touch /tmp/ready; while :; do sleep 1; done",
                (mb << 20) / 2,
                mb << 20
            )
        }
    }
}

/// Destroys a sandbox, retrying while its disk server is still exiting.
async fn destroy(rt: &ContainerRuntime, id: &str) -> Result<()> {
    let mut attempt = 0;
    loop {
        match rt.destroy(id).await {
            Err(e) if attempt < 5 => eprintln!("bench: destroy retry: {e}"),
            r => return Ok(r?),
        }
        attempt += 1;
        tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
    }
}

async fn sh(agent: &agent_client::AgentClient, script: &str) -> Result<String> {
    let req = proto::agent::ExecRequest {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        cwd: None,
        user: None,
        stdin: Default::default(),
        timeout_ms: None,
    };
    let out = agent.exec_collect(req, 1 << 20).await?;
    ensure!(
        out.code() == Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts a sandbox holding `mb` MB in one process; returns its id.
async fn source(b: &Bench, mb: u64) -> Result<String> {
    let id = b.id("src");
    let sb = b.rt.create(b.spec(id.clone(), mb * 4 + 256, 0)).await?;
    let agent = sb.agent();
    let mut req = proto::agent::ExecRequest {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), b.holder(mb)],
        ..Default::default()
    };
    req.stdin = proto::agent::StdinMode::Null;
    agent.spawn(req).await?;
    sh(&agent, "while [ ! -e /tmp/ready ]; do sleep 0.1; done").await?;
    Ok(id)
}

async fn restore_ready(b: &Bench, from: &SnapshotSource, memory_mb: u64) -> Result<(String, f64)> {
    let id = b.id("r");
    let t = Instant::now();
    let h =
        b.rt.restore(
            b.spec(id.clone(), memory_mb, 0),
            from.clone(),
            RestoreOptions::default(),
        )
        .await?;
    sh(&h.agent(), "true").await?;
    Ok((id, ms(t)))
}

async fn cold_ready(b: &Bench, memory_mb: u64) -> Result<(String, f64)> {
    let id = b.id("c");
    let t = Instant::now();
    let h = b.rt.create(b.spec(id.clone(), memory_mb, 0)).await?;
    sh(&h.agent(), "true").await?;
    Ok((id, ms(t)))
}

/// `n` starts, `PARALLEL` at a time: (total ms, per-child ms).
async fn fan_out(
    b: &Arc<Bench>,
    n: usize,
    from: Option<SnapshotSource>,
    mem: u64,
) -> Result<(f64, Vec<f64>)> {
    let sem = Arc::new(Semaphore::new(PARALLEL));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (b, sem, from) = (b.clone(), sem.clone(), from.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await?;
            match &from {
                Some(f) => restore_ready(&b, f, mem).await,
                None => cold_ready(&b, mem).await,
            }
        }));
    }
    let mut per = Vec::new();
    let mut ids = Vec::new();
    for task in tasks {
        let (id, m) = task.await??;
        per.push(m);
        ids.push(id);
    }
    let total = ms(t);
    for id in ids {
        destroy(&b.rt, &id).await?;
    }
    Ok((total, per))
}

async fn memory_suite(b: &Arc<Bench>, mb: u64, runs: usize, fanout: &[usize]) -> Result<()> {
    let kind = if b.python { "python" } else { "sh" };
    let src = source(b, mb).await?;
    let mem = mb * 4 + 256;
    let mut cp = Vec::new();
    let mut last = None;
    for i in 0..runs.max(3) {
        let dir = b.dir.join(format!("snap-{mb}-{i}"));
        let info =
            b.rt.checkpoint(&src, CheckpointKind::Memory, Some(dir))
                .await?;
        cp.push(info.times.total_ms);
        last = Some(info);
    }
    let info = last.context("no checkpoint")?;
    let extra = serde_json::json!({"memory_image_mb": r2(info.memory_bytes as f64 / 1048576.0),
        "paused_ms": r2(info.times.paused_ms), "seal_ms": r2(info.times.seal_ms),
        "dump_ms": r2(info.times.dump_ms), "target": if mb <= 50 { "< 300 ms" } else { "" }});
    emit(
        &format!("memory checkpoint, {kind} holding {mb} MB"),
        &cp,
        None,
        "ms",
        extra,
    );
    let from = SnapshotSource {
        layer: info.layer,
        memory_dir: info.memory_dir,
    };
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    let (mut warm_steps, mut cold_steps) = (Breakdown::new(), Breakdown::new());
    for _ in 0..runs {
        b.steps.take();
        let (id, m) = cold_ready(b, mem).await?;
        add_steps(&mut cold_steps, b.steps.take());
        destroy(&b.rt, &id).await?;
        cold.push(m);
        b.steps.take();
        let (id, m) = restore_ready(b, &from, mem).await?;
        add_steps(&mut warm_steps, b.steps.take());
        destroy(&b.rt, &id).await?;
        warm.push(m);
    }
    for (step, times) in &warm_steps {
        let base = cold_steps
            .get(step)
            .map(|c| (c.as_slice(), "the same step of a cold create"));
        emit(
            &format!("restore step: {step}, {kind} {mb} MB"),
            times,
            base,
            "ms",
            serde_json::json!({}),
        );
    }
    for (step, times) in cold_steps
        .iter()
        .filter(|(s, _)| !warm_steps.contains_key(*s))
    {
        emit(
            &format!("create step: {step}, {kind} {mb} MB"),
            times,
            None,
            "ms",
            serde_json::json!({}),
        );
    }
    let base = Some((cold.as_slice(), "cold create → first exec, same image"));
    emit(
        &format!("warm restore → first exec, {kind} {mb} MB"),
        &warm,
        base,
        "ms",
        serde_json::json!({}),
    );
    for &n in fanout {
        // Copies share no memory: keep the total within a shared machine's means.
        if n as u64 * mb > 8192 {
            eprintln!("bench: skipping fan-out x{n} of {mb} MB (over 8 GiB in total)");
            continue;
        }
        let (total, per) = fan_out(b, n, Some(from.clone()), mem).await?;
        let (ctotal, cper) = fan_out(b, n, None, mem).await?;
        let extra = serde_json::json!({"parallelism": PARALLEL});
        emit(
            &format!("fork fan-out ×{n} total, {kind} {mb} MB"),
            &[total],
            Some((&[ctotal], "cold creates, same parallelism")),
            "ms",
            extra.clone(),
        );
        emit(
            &format!("fork fan-out ×{n} per child, {kind} {mb} MB"),
            &per,
            Some((&cper, "cold create per child")),
            "ms",
            extra,
        );
    }
    destroy(&b.rt, &src).await?;
    Ok(())
}

async fn fs_suite(b: &Bench) -> Result<()> {
    for (changed, disk_mb) in [
        (0u64, 2048u64),
        (16, 2048),
        (64, 2048),
        (256, 2048),
        (16, 8192),
        (16, 32768),
    ] {
        let id = b.id("fs");
        let sb = b.rt.create(b.spec(id.clone(), 512, disk_mb)).await?;
        let agent = sb.agent();
        sh(&agent, "sync").await?;
        let mut times = Vec::new();
        for i in 0..3 {
            if changed > 0 {
                let s = format!("head -c {} /dev/urandom > /data-{i}; sync", changed << 20);
                sh(&agent, &s).await?;
            }
            let info =
                b.rt.checkpoint(&id, CheckpointKind::Filesystem, None)
                    .await?;
            times.push(info.times.total_ms);
        }
        let size = sh(&agent, "df -m / | tail -1 | awk '{print $2}'").await?;
        let fs_mb = size.trim().parse::<u64>().unwrap_or(0);
        let extra = serde_json::json!({"changed_mb": changed, "disk_mb": disk_mb, "fs_mb": fs_mb});
        emit(
            &format!("filesystem checkpoint, {changed} MB changed, disk {disk_mb} MB"),
            &times,
            None,
            "ms",
            extra,
        );
        destroy(&b.rt, &id).await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let a = args();
    let steps = Steps::default();
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::EnvFilter::from_default_env());
    let timings = steps.clone().with_filter(
        tracing_subscriber::filter::Targets::new()
            .with_target("sandfork::steps", tracing::Level::DEBUG),
    );
    tracing_subscriber::registry()
        .with(logs)
        .with(timings)
        .init();
    let bench_dir =
        std::env::var("SANDFORK_BENCH_DIR").unwrap_or("/var/tmp/sandfork-bench-runtime".into());
    let shared = PathBuf::from(bench_dir).join("data");
    let dir = tempfile::Builder::new()
        .prefix("sandfork-bench-fork-")
        .tempdir_in("/var/tmp")?;
    let data = dir.path().join("data");
    let store = if a.python {
        shared.join("store")
    } else {
        data.join("store")
    };
    let disks = Disks::open(&store)?;
    let images = Images::new(
        disks.store().clone(),
        if a.python {
            shared.join("images")
        } else {
            data.join("images")
        },
    );
    let image = if a.python {
        images
            .get("python")
            .context("no python image: run `bench/sandbox --python` first")?
    } else {
        let spec = BuildSpec {
            name: "busybox".into(),
            source: Source::Busybox,
            apt: vec![],
            pip: vec![],
        };
        images.build(&spec, &|_| {})?
    };
    let mut config = RuntimeConfig::new(&data)?;
    config.ready_timeout = std::time::Duration::from_secs(60);
    let rt = ContainerRuntime::new(config, Arc::new(RealHost::new(disks, "/run/sandfork")));
    let b = Arc::new(Bench {
        steps,
        rt,
        image: image.to_ref(),
        python: a.python,
        dir: dir.path().join("snaps"),
        n: Default::default(),
    });
    let mut result = Ok(());
    for &mb in &a.sizes {
        result = result.and(memory_suite(&b, mb, a.runs, &a.fanout).await);
    }
    result = result.and(fs_suite(&b).await);
    for id in b.rt.list().await.unwrap_or_default() {
        let _ = b.rt.destroy(&id).await;
    }
    result
}
