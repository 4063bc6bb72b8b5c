//! Sandbox benchmarks, side by side with bare runc on the same machine; prints JSON lines
//! (`bench/report.py` format).
//!
//! `cargo run --release -p sandfork-runtime --example bench_sandbox -- [--runs N] [--python]`
//!
//! - create→first exec: `Runtime::create` + agent exec of `true`, vs `runc run` of an
//!   equivalent bundle (same generated OCI config, process `true`) on a plain directory
//!   root filesystem;
//! - exec round trip: agent exec of `true` in a running sandbox vs `runc exec … true`.
//!
//! With `--python`, the `python` image is imported from the OCI layout the daemon exported
//! (`$SANDFORK_BENCH_PYTHON_OCI`, set by `bench/sandbox --python`: its build steps need a
//! build sandbox) and kept in `$SANDFORK_BENCH_DIR` (default
//! /var/tmp/sandfork-bench-runtime) for later runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use runtime::host::{Disks, RealHost};
use runtime::image::{BuildSpec, ImageMeta, Images, Source};
use runtime::{ContainerRuntime, ImageRef, Resources, RuntimeConfig, SandboxSpec};

struct Args {
    runs: usize,
    python: bool,
}

fn args() -> Args {
    let mut a = Args {
        runs: 20,
        python: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--runs" => a.runs = it.next().and_then(|n| n.parse().ok()).unwrap_or(20),
            "--python" => a.python = true,
            _ => eprintln!("bench: ignoring {flag}"),
        }
    }
    a
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn line(name: &str, ours: &mut [f64], base: &mut [f64], base_name: &str, target: &str) {
    let (v, p99) = (percentile(ours, 0.5), percentile(ours, 0.99));
    let b = percentile(base, 0.5);
    let j = serde_json::json!({
        "suite": "sandbox", "name": name, "value": round(v), "p99": round(p99), "unit": "ms",
        "baseline": round(b), "baseline_name": base_name, "ratio": (v / b * 1000.0).round() / 1000.0,
        "target": target, "runs": ours.len(),
    });
    println!("{j}");
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn image(images: &Images, name: &str, source: Source) -> Result<ImageMeta> {
    if let Ok(meta) = images.get(name) {
        return Ok(meta);
    }
    let spec = BuildSpec {
        name: name.into(),
        source,
        apt: vec![],
        pip: vec![],
    };
    let progress = |p: runtime::image::Progress| eprintln!("bench: {} {}", p.stage, p.detail);
    Ok(images.build(&spec, &progress)?)
}

fn spec(id: String, image: &ImageRef) -> SandboxSpec {
    SandboxSpec {
        id,
        image: image.clone(),
        resources: Resources {
            cpus: 1.0,
            memory_mb: 512,
            pids: 512,
            disk_mb: 0,
        },
        env: Default::default(),
        network: runtime::NetworkMode::None,
        volumes: Vec::new(),
    }
}

fn exec_true() -> proto::agent::ExecRequest {
    proto::agent::ExecRequest {
        command: "true".into(),
        args: vec![],
        env: vec![],
        cwd: None,
        user: None,
        stdin: Default::default(),
        timeout_ms: None,
    }
}

/// create→first exec, each run right after a bare `runc run` so both see the same load.
async fn create_first_exec(
    rt: &ContainerRuntime,
    image: &ImageRef,
    network: &runtime::NetworkMode,
    runs: usize,
    bare: &mut BareRun,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for i in 0..runs {
        base.push(bare.once()?);
        let id = format!("bench-{}-{i}", std::process::id());
        let t = Instant::now();
        let mut s = spec(id.clone(), image);
        s.network = network.clone();
        let sb = rt.create(s).await?;
        let r = sb.agent().exec_collect(exec_true(), 1024).await?;
        ours.push(ms(t));
        ensure!(r.code() == Some(0), "true failed in the sandbox");
        rt.destroy(&id).await?;
    }
    Ok((ours, base))
}

/// Exec round trips, alternating with `runc exec` in a bare container.
async fn exec_round_trip(
    rt: &ContainerRuntime,
    image: &ImageRef,
    runs: usize,
    bare: &BareExec,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let id = format!("bench-exec-{}", std::process::id());
    let sb = rt.create(spec(id.clone(), image)).await?;
    let agent = sb.agent();
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        base.push(bare.once()?);
        let t = Instant::now();
        agent.exec_collect(exec_true(), 1024).await?;
        ours.push(ms(t));
    }
    rt.destroy(&id).await?;
    Ok((ours, base))
}

/// A runc bundle with the same generated config, on a plain directory root filesystem
/// (a copy of the busybox image's tree), with `args` as its process.
fn bare_bundle(dir: &Path, id: &str, args: &[&str]) -> Result<(PathBuf, serde_json::Value)> {
    let bundle = dir.join(id);
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    runtime::image::rootfs::busybox(&rootfs, &|_| {})?;
    let image = ImageRef {
        name: "busybox".into(),
        layer: String::new(),
        env: Default::default(),
        cwd: "/".into(),
        user: None,
    };
    let s = spec(id.into(), &image);
    let host = runtime::oci::HostPaths {
        rootfs: &rootfs,
        run_dir: &bundle,
        agent_bin: Path::new("/bin/busybox"),
        netns: Path::new("/proc/1/ns/net"),
        cgroup: "",
        resolv_conf: None,
        criu_config: &bundle.join("criu.conf"),
        nofile: 1024,
    };
    let mut config = runtime::oci::to_value(&runtime::oci::config(&s, &host)?);
    config["process"]["args"] = serde_json::json!(args);
    // runc makes a fresh network namespace, as a bare `runc run` would.
    let ns = config["linux"]["namespaces"]
        .as_array_mut()
        .context("namespaces")?;
    ns.retain(|n| n["type"] != "network");
    ns.push(serde_json::json!({"type": "network"}));
    Ok((bundle, config))
}

/// Writes the bundle's config for container `id`, with a cgroup of its own.
fn write_config(bundle: &Path, config: &mut serde_json::Value, id: &str) -> Result<()> {
    config["linux"]["cgroupsPath"] = serde_json::json!(format!("/sandfork-bench/{id}"));
    std::fs::write(bundle.join("config.json"), serde_json::to_vec(config)?)?;
    Ok(())
}

fn runc(root: &Path, args: &[&str]) -> Result<()> {
    let st = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    ensure!(st.success(), "runc {args:?} failed");
    Ok(())
}

/// `runc run` of `true` in a fresh container each time.
struct BareRun {
    bundle: PathBuf,
    config: serde_json::Value,
    root: PathBuf,
    n: usize,
}

impl BareRun {
    fn new(dir: &Path) -> Result<BareRun> {
        let (bundle, config) = bare_bundle(dir, "bare-run", &["/bin/true"])?;
        Ok(BareRun {
            bundle,
            config,
            root: dir.join("runc"),
            n: 0,
        })
    }

    fn once(&mut self) -> Result<f64> {
        self.n += 1;
        let id = format!("bare-run-{}", self.n);
        write_config(&self.bundle, &mut self.config, &id)?;
        let t = Instant::now();
        runc(
            &self.root,
            &["run", "--bundle", &self.bundle.to_string_lossy(), &id],
        )?;
        Ok(ms(t))
    }
}

/// A bare container running `sleep`, for `runc exec`.
struct BareExec {
    root: PathBuf,
}

impl BareExec {
    fn start(dir: &Path) -> Result<BareExec> {
        let (bundle, mut config) = bare_bundle(dir, "bare-exec", &["/bin/sleep", "3600"])?;
        write_config(&bundle, &mut config, "bare-exec")?;
        let root = dir.join("runc");
        runc(
            &root,
            &[
                "run",
                "--detach",
                "--bundle",
                &bundle.to_string_lossy(),
                "bare-exec",
            ],
        )?;
        Ok(BareExec { root })
    }

    fn once(&self) -> Result<f64> {
        let t = Instant::now();
        runc(&self.root, &["exec", "bare-exec", "/bin/true"])?;
        Ok(ms(t))
    }
}

impl Drop for BareExec {
    fn drop(&mut self) {
        let _ = runc(&self.root, &["delete", "--force", "bare-exec"]);
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let a = args();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SANDFORK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let keep = std::env::var_os("SANDFORK_BENCH_DIR").map_or_else(
        || PathBuf::from("/var/tmp/sandfork-bench-runtime"),
        PathBuf::from,
    );
    let data = keep.join("data");
    let scratch = tempfile::Builder::new()
        .prefix("sandfork-bench-rt-")
        .tempdir()?;
    let disks = Disks::open(data.join("store"))?;
    let images = Images::new(disks.store().clone(), data.join("images"));
    let busybox = image(&images, "busybox", Source::Busybox)?.to_ref();
    let python = if a.python {
        // Exported by the daemon (its build steps need a build sandbox): bench/sandbox.
        let oci = std::env::var("SANDFORK_BENCH_PYTHON_OCI")
            .context("SANDFORK_BENCH_PYTHON_OCI: run through bench/sandbox --python")?;
        Some(image(&images, "python", Source::OciLayout(oci.into()))?.to_ref())
    } else {
        None
    };
    let rt = ContainerRuntime::new(
        RuntimeConfig::new(&data)?,
        Arc::new(RealHost::new(disks, "/run/sandfork")),
    );
    rt.cleanup_stale().await?;

    let base_name = "runc run, plain dir rootfs";
    let mut bare = BareRun::new(scratch.path())?;
    let none = runtime::NetworkMode::None;
    let (mut ours, mut base) = create_first_exec(&rt, &busybox, &none, a.runs, &mut bare).await?;
    line(
        "create→first exec (busybox)",
        &mut ours,
        &mut base,
        base_name,
        "≤ 2×",
    );
    let internet = runtime::NetworkMode::Internet {
        allow_out: vec![],
        deny_out: vec![],
        by_name: None,
    };
    let (mut ours, mut base) =
        create_first_exec(&rt, &busybox, &internet, a.runs, &mut bare).await?;
    line(
        "create→first exec (busybox, internet)",
        &mut ours,
        &mut base,
        base_name,
        "",
    );
    if let Some(py) = &python {
        let (mut ours, mut base) = create_first_exec(&rt, py, &none, a.runs, &mut bare).await?;
        line(
            "create→first exec (python)",
            &mut ours,
            &mut base,
            base_name,
            "≤ 2×",
        );
    }
    let bare = BareExec::start(scratch.path())?;
    let (mut ours, mut base) = exec_round_trip(&rt, &busybox, a.runs * 5, &bare).await?;
    line(
        "exec round trip (true)",
        &mut ours,
        &mut base,
        "runc exec",
        "≤ 0.3×",
    );
    Ok(())
}
