//! image build | ls | rm.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::args::ImageCommand;
use crate::client::{encode_segment, full, Client, Lines};
use crate::output;

pub async fn image(client: &Client, cmd: ImageCommand, json: bool) -> Result<i32> {
    match cmd {
        ImageCommand::Build {
            target,
            tag,
            file,
            build_arg,
            builder,
            apt,
            pip,
        } => match builder {
            Some(builder) => {
                let name =
                    target.ok_or_else(|| anyhow!("image build --builder needs the image name"))?;
                let body = json!({ "name": name, "builder": builder, "apt": apt, "pip": pip });
                build(client, &body, json).await
            }
            None => {
                if !(apt.is_empty() && pip.is_empty()) {
                    bail!("--apt and --pip go with --builder; a Dockerfile RUNs its installs");
                }
                let name = tag.ok_or_else(|| anyhow!("image build: give -t NAME (and the context directory), or NAME --builder B"))?;
                let dir = std::path::PathBuf::from(target.unwrap_or_else(|| ".".into()));
                let file = file.unwrap_or_else(|| dir.join("Dockerfile"));
                build_dockerfile(client, &name, &dir, &file, &build_arg, json).await
            }
        },
        ImageCommand::Pull {
            reference,
            username,
            password_stdin,
        } => {
            let mut body = json!({ "reference": reference });
            if let (Some(user), true) = (username, password_stdin) {
                let mut password = String::new();
                std::io::stdin().read_line(&mut password)?;
                body["username"] = json!(user);
                body["password"] = json!(password.trim_end_matches(['\r', '\n']));
            }
            pull(client, &body, json).await
        }
        ImageCommand::Import { source, tag } => import(client, &source, tag.as_deref(), json).await,
        ImageCommand::Export {
            name,
            output,
            format,
        } => export(client, &name, &output, &format).await,
        ImageCommand::Push {
            name,
            reference,
            username,
            password_stdin,
        } => {
            let mut body = json!({ "name": name, "reference": reference });
            if let (Some(user), true) = (username, password_stdin) {
                let mut password = String::new();
                std::io::stdin().read_line(&mut password)?;
                body["username"] = json!(user);
                body["password"] = json!(password.trim_end_matches(['\r', '\n']));
            }
            let pushed: Value = client
                .json(Method::POST, "/v1/images/push", Some(&body))
                .await?;
            if json {
                output::json(&pushed);
            } else {
                println!("{}", output::field(&pushed, "reference"));
            }
            Ok(0)
        }
        ImageCommand::FromSnapshot { snapshot, name } => {
            let body = json!({ "name": name, "snapshot_id": snapshot });
            let image: Value = client
                .json(Method::POST, "/v1/images/from-snapshot", Some(&body))
                .await?;
            if json {
                output::json(&image);
            } else {
                println!("{} ({})", output::field(&image, "name"), size_of(&image));
            }
            Ok(0)
        }
        ImageCommand::Ls => list(client, json).await,
        ImageCommand::Inspect { name } => inspect(client, &name, json).await,
        ImageCommand::Rm { names } => remove(client, &names).await,
    }
}

/// Progress on a stderr that is no terminal (a spinner there draws nothing): a line when
/// the stage changes, else at most one a second, so a long build is never silent and a
/// chatty step (apt's percentages) is not hundreds of lines.
struct PlainProgress {
    on: bool,
    stage: String,
    shown: Option<std::time::Instant>,
}

impl PlainProgress {
    fn new() -> Self {
        PlainProgress {
            on: !std::io::IsTerminal::is_terminal(&std::io::stderr()),
            stage: String::new(),
            shown: None,
        }
    }

    fn show(&mut self, msg: &str) {
        if !self.on || msg.is_empty() {
            return;
        }
        let stage = msg.split(':').next().unwrap_or_default();
        let due = self
            .shown
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if stage != self.stage || due {
            eprintln!("{msg}");
            self.stage = stage.to_string();
            self.shown = Some(std::time::Instant::now());
        }
    }
}

fn spinner(json: bool) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

async fn build(client: &Client, body: &Value, json: bool) -> Result<i32> {
    let resp = client
        .call(
            Method::POST,
            "/v1/images",
            "application/json",
            full(serde_json::to_vec(body)?),
        )
        .await?;
    let image = follow_build(resp, spinner(json)).await?;
    if json {
        output::json(&image);
    } else {
        println!("{} ({})", output::field(&image, "name"), size_of(&image));
    }
    Ok(0)
}

async fn build_dockerfile(
    client: &Client,
    name: &str,
    dir: &std::path::Path,
    file: &std::path::Path,
    build_args: &[String],
    json: bool,
) -> Result<i32> {
    let (tar, dockerfile) = crate::context::tar_context(dir, file)?;
    let args = super::parse_env(build_args)?;
    let query = format!(
        "/v1/images/build?name={}&dockerfile={}&build_args={}",
        crate::client::encode(name),
        crate::client::encode(&dockerfile),
        crate::client::encode(&serde_json::to_string(&args)?)
    );
    let body = tokio::fs::read(tar.path()).await?;
    let resp = client
        .call(Method::POST, &query, "application/x-tar", full(body))
        .await?;
    let bar = spinner(json);
    let image = follow_build_printing(resp, bar, json).await?;
    if json {
        output::json(&image);
    } else {
        println!("{} ({})", output::field(&image, "name"), size_of(&image));
    }
    Ok(0)
}

/// Like [`follow_build`], and each step's line printed as it comes (the build's log).
async fn follow_build_printing(
    resp: hyper::Response<hyper::body::Incoming>,
    bar: ProgressBar,
    json: bool,
) -> Result<Value> {
    let mut lines = Lines::new(resp);
    while let Some(ev) = lines.next().await? {
        match ev["type"].as_str() {
            Some("progress") => {
                let msg = output::field(&ev, "message");
                if !json {
                    bar.suspend(|| eprintln!("{msg}"));
                }
                bar.set_message(msg);
            }
            Some("done") => {
                bar.finish_and_clear();
                return Ok(ev["image"].clone());
            }
            Some("error") => {
                bar.finish_and_clear();
                return Err(anyhow!("{}", output::field(&ev, "message")));
            }
            _ => {}
        }
    }
    bar.finish_and_clear();
    bail!("the build stream ended without a result")
}

/// Downloads the archive; an OCI layout directory is the oci-archive unpacked into a new
/// directory.
async fn export(client: &Client, name: &str, output: &str, format: &str) -> Result<i32> {
    let wire = if format == "docker-archive" {
        "docker-archive"
    } else {
        "oci-archive"
    };
    let path = format!("/v1/images/{}/export?format={wire}", encode_segment(name));
    if format != "oci" {
        return super::snapshot::download(client, Method::GET, &path, output).await;
    }
    let dir = std::path::Path::new(output);
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!("{output} exists and is not empty");
    }
    let archive = tempfile::NamedTempFile::new()?;
    let tmp = archive.path().to_string_lossy().into_owned();
    super::snapshot::download(client, Method::GET, &path, &tmp).await?;
    std::fs::create_dir_all(dir)?;
    tar::Archive::new(std::fs::File::open(&tmp)?).unpack(dir)?;
    Ok(0)
}

async fn import(client: &Client, source: &str, tag: Option<&str>, json: bool) -> Result<i32> {
    let body = if source == "-" {
        let mut buf = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut buf).await?;
        buf
    } else if std::path::Path::new(source).is_dir() {
        // An OCI layout directory travels as an oci-archive.
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(false);
        tar.append_dir_all(".", source)?;
        tar.into_inner()?
    } else {
        tokio::fs::read(source).await?
    };
    let path = match tag {
        Some(t) => format!("/v1/images/import?name={}", crate::client::encode(t)),
        None => "/v1/images/import".to_string(),
    };
    let resp = client
        .call(Method::POST, &path, "application/x-tar", full(body))
        .await?;
    let image: Value = crate::client::json_body(resp).await?;
    if json {
        output::json(&image);
    } else {
        println!("{} ({})", output::field(&image, "name"), size_of(&image));
    }
    Ok(0)
}

async fn pull(client: &Client, body: &Value, json: bool) -> Result<i32> {
    let resp = client
        .call(
            Method::POST,
            "/v1/images/pull",
            "application/json",
            full(serde_json::to_vec(body)?),
        )
        .await?;
    let image = follow_build(resp, spinner(json)).await?;
    if json {
        output::json(&image);
    } else {
        println!("{} ({})", output::field(&image, "name"), size_of(&image));
    }
    Ok(0)
}

/// Makes sure the image a new sandbox will boot from exists: a built-in image not built
/// yet is built now (or the build in flight joined), with its progress on a spinner.
/// `None` is the daemon's default image.
pub async fn ensure(client: &Client, name: Option<&str>, json: bool) -> Result<()> {
    let name = match name {
        Some(n) => n.to_string(),
        None => {
            let health: Value = client.json(Method::GET, "/v1/health", None::<&()>).await?;
            output::field(&health, "default_image")
        }
    };
    let images: Value = client.json(Method::GET, "/v1/images", None::<&()>).await?;
    let present = images["images"]
        .as_array()
        .is_some_and(|all| all.iter().any(|i| i["name"] == name.as_str()));
    if present || name.is_empty() {
        return Ok(());
    }
    let path = format!("/v1/images/{}/ensure", encode_segment(&name));
    let resp = client.call(Method::POST, &path, "", full("")).await?;
    follow_build(resp, spinner(json)).await.map(drop)
}

/// Shows a build's progress on `bar` and returns its image.
async fn follow_build(
    resp: hyper::Response<hyper::body::Incoming>,
    bar: ProgressBar,
) -> Result<Value> {
    let mut lines = Lines::new(resp);
    let mut plain = PlainProgress::new();
    while let Some(ev) = lines.next().await? {
        match ev["type"].as_str() {
            Some("progress") => {
                let msg = output::field(&ev, "message");
                plain.show(&msg);
                bar.set_message(msg);
            }
            Some("done") => {
                bar.finish_and_clear();
                return Ok(ev["image"].clone());
            }
            Some("error") => {
                bar.finish_and_clear();
                return Err(anyhow!("{}", output::field(&ev, "message")));
            }
            _ => {}
        }
    }
    bar.finish_and_clear();
    bail!("the build stream ended without a result")
}

fn size_of(image: &Value) -> String {
    output::size(image["size_bytes"].as_u64().unwrap_or(0))
}

async fn inspect(client: &Client, name: &str, json: bool) -> Result<i32> {
    let path = format!("/v1/images/{}", encode_segment(name));
    let image: Value = client.json(Method::GET, &path, None::<&()>).await?;
    if json {
        output::json(&image);
        return Ok(0);
    }
    let rows = [
        ("name", output::field(&image, "name")),
        ("source", output::field(&image, "source")),
        ("digest", output::field(&image, "digest")),
        ("size", size_of(&image)),
        ("layer", output::field(&image, "layer_id")),
        ("created", output::field(&image, "created_at")),
        ("working dir", output::field(&image, "working_dir")),
        ("user", output::field(&image, "user")),
        ("entrypoint", output::joined(&image["entrypoint"])),
        ("cmd", output::joined(&image["cmd"])),
        ("ports", output::joined(&image["exposed_ports"])),
        ("env", output::pairs(&image["env"])),
        ("labels", output::pairs(&image["labels"])),
    ];
    for (k, v) in rows {
        println!("{k:<12} {v}");
    }
    Ok(0)
}

async fn list(client: &Client, json: bool) -> Result<i32> {
    let reply: Value = client.json(Method::GET, "/v1/images", None::<&()>).await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = reply["images"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|i| {
            let f = |k| output::field(i, k);
            vec![
                f("name"),
                f("builder"),
                size_of(i),
                f("layer_id"),
                f("created_at"),
            ]
        })
        .collect();
    // DISK: the root disk its sandboxes get (room, not bytes stored).
    output::table(&["NAME", "BUILDER", "DISK", "LAYER", "CREATED"], &rows);
    Ok(0)
}

async fn remove(client: &Client, names: &[String]) -> Result<i32> {
    let mut code = 0;
    for n in names {
        let path = format!("/v1/images/{}", encode_segment(n));
        match client
            .json::<Value>(Method::DELETE, &path, None::<&()>)
            .await
        {
            Ok(_) => println!("{n}"),
            Err(e) => {
                eprintln!("error: {n}: {e}");
                code = 1;
            }
        }
    }
    Ok(code)
}
