//! run (ephemeral sandbox) and exec.

use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use hyper::Method;
use serde_json::{json, Value};

use super::parse_env;
use super::sandbox::create_body;
use crate::args::{ExecArgs, RunArgs};
use crate::client::{encode, full, Client, Lines};
use crate::output;

/// The exit code a shell would report: the code, 128 + signal, or 124 on timeout.
pub fn exit_code(ev: &Value) -> i32 {
    if let Some(c) = ev["exit_code"].as_i64() {
        return c as i32;
    }
    if let Some(s) = ev["signal"].as_i64() {
        return 128 + s as i32;
    }
    if ev["timed_out"].as_bool() == Some(true) {
        return 124;
    }
    1
}

fn exec_body(
    command: &[String],
    env: &[String],
    workdir: Option<String>,
    timeout: Option<f64>,
) -> Result<Value> {
    let Some((cmd, args)) = command.split_first() else {
        bail!("no command given")
    };
    let mut body = json!({ "command": cmd, "args": args, "env": parse_env(env)? });
    if let Some(w) = workdir {
        body["working_dir"] = w.into();
    }
    if let Some(t) = timeout {
        body["timeout_secs"] = t.into();
    }
    Ok(body)
}

fn write_chunk(ev: &Value, out: &mut impl Write) -> Result<()> {
    if let Some(d) = ev["data"].as_str() {
        out.write_all(d.as_bytes())?;
    } else if let Some(b) = ev["data_b64"].as_str() {
        out.write_all(&base64::engine::general_purpose::STANDARD.decode(b)?)?;
    }
    out.flush()?;
    Ok(())
}

/// Streams an exec to our stdout/stderr and returns its exit code.
async fn stream_exec(client: &Client, id: &str, mut body: Value) -> Result<i32> {
    body["stream"] = true.into();
    let path = format!("/v1/sandboxes/{}/exec", encode(id));
    let resp = client
        .call(
            Method::POST,
            &path,
            "application/json",
            full(serde_json::to_vec(&body)?),
        )
        .await?;
    let mut lines = Lines::new(resp);
    while let Some(ev) = lines.next().await? {
        match ev["type"].as_str() {
            Some("stdout") => write_chunk(&ev, &mut std::io::stdout())?,
            Some("stderr") => write_chunk(&ev, &mut std::io::stderr())?,
            Some("exit") => return Ok(exit_code(&ev)),
            Some("error") => return Err(anyhow!("{}", output::field(&ev, "message"))),
            _ => {}
        }
    }
    bail!("the output stream ended before the command exited")
}

/// Runs to completion and prints the collected result as JSON.
async fn json_exec(client: &Client, id: &str, body: Value) -> Result<i32> {
    let path = format!("/v1/sandboxes/{}/exec", encode(id));
    let result: Value = client.json(Method::POST, &path, Some(&body)).await?;
    output::json(&result);
    Ok(exit_code(&result))
}

async fn exec_in(client: &Client, id: &str, body: Value, json: bool) -> Result<i32> {
    if json {
        json_exec(client, id, body).await
    } else {
        stream_exec(client, id, body).await
    }
}

pub async fn exec(client: &Client, e: ExecArgs, json: bool) -> Result<i32> {
    let body = exec_body(&e.command, &e.env, e.workdir, e.timeout)?;
    if e.detach {
        return spawn(client, &e.id, &body, json).await;
    }
    exec_in(client, &e.id, body, json).await
}

/// Starts a background process; prints its pid (or, with `--json`, its record).
async fn spawn(client: &Client, id: &str, body: &Value, json: bool) -> Result<i32> {
    let path = format!(
        "/v1/sandboxes/{}/processes",
        crate::client::encode_segment(id)
    );
    let proc: Value = client.json(Method::POST, &path, Some(body)).await?;
    if json {
        crate::output::json(&proc);
    } else {
        println!("{}", crate::output::field(&proc, "pid"));
    }
    Ok(0)
}

/// What an image starts when given no command: its entrypoint, then its command.
async fn image_command(client: &Client, image: Option<&str>) -> Result<Vec<String>> {
    let name = match image {
        Some(n) => n.to_string(),
        None => {
            let health: Value = client.json(Method::GET, "/v1/health", None::<&()>).await?;
            output::field(&health, "default_image")
        }
    };
    let path = format!("/v1/images/{}", crate::client::encode_segment(&name));
    let image: Value = client.json(Method::GET, &path, None::<&()>).await?;
    let list = |k: &str| -> Vec<String> {
        image[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let argv: Vec<String> = list("entrypoint").into_iter().chain(list("cmd")).collect();
    if argv.is_empty() {
        bail!("no command given, and image {name} has no entrypoint or command");
    }
    Ok(argv)
}

pub async fn run(client: &Client, r: RunArgs, json: bool) -> Result<i32> {
    let create = create_body(&r.opts)?;
    super::image::ensure(client, r.opts.image.as_deref(), json).await?;
    let command = if r.command.is_empty() {
        image_command(client, r.opts.image.as_deref()).await?
    } else {
        r.command
    };
    let body = exec_body(&command, &[], None, None)?;
    let sb: Value = client
        .json(Method::POST, "/v1/sandboxes", Some(&create))
        .await?;
    let id = sb["id"]
        .as_str()
        .context("the daemon returned no sandbox id")?
        .to_string();
    let result = tokio::select! {
        r = exec_in(client, &id, body, json) => r,
        _ = tokio::signal::ctrl_c() => Ok(130),
    };
    let path = format!("/v1/sandboxes/{}", encode(&id));
    let cleanup = client
        .json::<Value>(Method::DELETE, &path, None::<&()>)
        .await;
    let code = result?;
    cleanup.with_context(|| format!("cannot remove sandbox {id}"))?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_shell_conventions() {
        assert_eq!(exit_code(&json!({"exit_code": 3})), 3);
        assert_eq!(exit_code(&json!({"exit_code": null, "signal": 9})), 137);
        assert_eq!(
            exit_code(&json!({"exit_code": null, "signal": null, "timed_out": true})),
            124
        );
    }
}
