//! volume create, ls, inspect, rm.

use anyhow::Result;
use hyper::Method;
use serde_json::{json, Value};

use crate::args::VolumeCommand;
use crate::client::{encode_segment, Client};
use crate::output;

pub async fn volume(client: &Client, cmd: VolumeCommand, json: bool) -> Result<i32> {
    match cmd {
        VolumeCommand::Create { name, size_mb } => {
            let mut body = json!({ "name": name });
            if let Some(s) = size_mb {
                body["size_mb"] = s.into();
            }
            let v: Value = client
                .json(Method::POST, "/v1/volumes", Some(&body))
                .await?;
            if json {
                output::json(&v);
            } else {
                println!("{}", output::field(&v, "name"));
            }
            Ok(0)
        }
        VolumeCommand::Ls => list(client, json).await,
        VolumeCommand::Inspect { name } => {
            let path = format!("/v1/volumes/{}", encode_segment(&name));
            let v: Value = client.json(Method::GET, &path, None::<&()>).await?;
            output::json(&v);
            Ok(0)
        }
        VolumeCommand::Rm { names } => {
            let mut code = 0;
            for n in names {
                let path = format!("/v1/volumes/{}", encode_segment(&n));
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
    }
}

async fn list(client: &Client, json: bool) -> Result<i32> {
    let reply: Value = client.json(Method::GET, "/v1/volumes", None::<&()>).await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = reply["volumes"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|v| {
            let users = v["mounted_by"].as_array().map_or(0, |a| a.len());
            vec![
                output::field(v, "name"),
                output::size(v["size_mb"].as_u64().unwrap_or(0) << 20),
                output::size(v["used_bytes"].as_u64().unwrap_or(0)),
                users.to_string(),
                output::field(v, "created_at"),
            ]
        })
        .collect();
    output::table(&["NAME", "SIZE", "USED", "MOUNTED BY", "CREATED"], &rows);
    Ok(0)
}
