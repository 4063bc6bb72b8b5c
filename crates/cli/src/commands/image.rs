//! image build | ls | rm.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::args::ImageCommand;
use crate::client::{encode, full, Client, Lines};
use crate::output;

pub async fn image(client: &Client, cmd: ImageCommand, json: bool) -> Result<i32> {
    match cmd {
        ImageCommand::Build {
            name,
            builder,
            apt,
            pip,
        } => {
            let body = json!({ "name": name, "builder": builder, "apt": apt, "pip": pip });
            build(client, &body, json).await
        }
        ImageCommand::Ls => list(client, json).await,
        ImageCommand::Rm { names } => remove(client, &names).await,
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
    let bar = spinner(json);
    let mut lines = Lines::new(resp);
    while let Some(ev) = lines.next().await? {
        match ev["type"].as_str() {
            Some("progress") => bar.set_message(output::field(&ev, "message")),
            Some("done") => {
                bar.finish_and_clear();
                let image = &ev["image"];
                if json {
                    output::json(image);
                } else {
                    println!("{} ({})", output::field(image, "name"), size_of(image));
                }
                return Ok(0);
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
    output::table(&["NAME", "BUILDER", "SIZE", "LAYER", "CREATED"], &rows);
    Ok(0)
}

async fn remove(client: &Client, names: &[String]) -> Result<i32> {
    let mut code = 0;
    for n in names {
        let path = format!("/v1/images/{}", encode(n));
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
