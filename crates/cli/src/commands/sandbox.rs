//! create, ls, inspect, rm.

use anyhow::Result;
use hyper::Method;
use serde_json::{json, Value};

use super::parse_env;
use crate::args::{CreateArgs, SandboxOpts};
use crate::client::{encode, Client};
use crate::output;

/// The create request body for `opts`.
pub fn create_body(opts: &SandboxOpts) -> Result<Value> {
    let mut body = json!({ "env": parse_env(&opts.env)? });
    let fields = [
        ("image", opts.image.clone().map(Value::from)),
        ("cpus", opts.cpus.map(Value::from)),
        ("memory_mb", opts.memory_mb.map(Value::from)),
        ("disk_mb", opts.disk_mb.map(Value::from)),
        ("network", network_request(opts)),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            body[k] = v;
        }
    }
    if !opts.volumes.is_empty() {
        let mounts = opts
            .volumes
            .iter()
            .map(|v| volume_mount(v))
            .collect::<Result<Vec<_>>>()?;
        body["volumes"] = Value::from(mounts);
    }
    Ok(body)
}

/// `NAME:PATH` or `NAME:PATH:ro` as a volume mount.
fn volume_mount(spec: &str) -> Result<Value> {
    let (name, rest) = spec
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("--volume {spec:?}: expected NAME:PATH[:ro]"))?;
    let (path, read_only) = match rest.strip_suffix(":ro") {
        Some(p) => (p, true),
        None => (rest.strip_suffix(":rw").unwrap_or(rest), false),
    };
    Ok(json!({ "name": name, "path": path, "read_only": read_only }))
}

pub async fn create(client: &Client, c: CreateArgs, json: bool) -> Result<i32> {
    let mut body = create_body(&c.opts)?;
    if let Some(n) = c.name {
        body["name"] = n.into();
    }
    if let Some(t) = c.timeout {
        body["timeout_secs"] = t.into();
    }
    if let Some(a) = c.on_timeout {
        body["on_timeout"] = a.into();
    }
    if !c.labels.is_empty() {
        body["labels"] = json!(super::parse_pairs("--label", &c.labels)?);
    }
    super::image::ensure(client, c.opts.image.as_deref(), json).await?;
    let sb: Value = client
        .json(Method::POST, "/v1/sandboxes", Some(&body))
        .await?;
    if json {
        output::json(&sb);
    } else {
        println!("{}", output::field(&sb, "id"));
    }
    Ok(0)
}

pub async fn list(
    client: &Client,
    state: Option<String>,
    filters: &[String],
    json: bool,
) -> Result<i32> {
    let mut query = Vec::new();
    if let Some(s) = state {
        query.push(format!("state={}", encode(&s)));
    }
    let labels = label_filters(filters)?;
    if !labels.is_empty() {
        query.push(format!(
            "labels={}",
            encode(&serde_json::to_string(&labels)?)
        ));
    }
    let path = if query.is_empty() {
        "/v1/sandboxes".to_string()
    } else {
        format!("/v1/sandboxes?{}", query.join("&"))
    };
    let reply: Value = client.json(Method::GET, &path, None::<&()>).await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = reply["sandboxes"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let mem = format!("{} MiB", output::field(s, "memory_mb"));
            let f = |k| output::field(s, k);
            vec![
                f("id"),
                f("name"),
                f("state"),
                f("image"),
                f("cpus"),
                mem,
                f("created_at"),
            ]
        })
        .collect();
    output::table(
        &["ID", "NAME", "STATE", "IMAGE", "CPUS", "MEMORY", "CREATED"],
        &rows,
    );
    Ok(0)
}

/// `label=K=V` filters as the labels every listed sandbox must have.
fn label_filters(filters: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    let pairs: Vec<String> = filters
        .iter()
        .map(|f| {
            f.strip_prefix("label=")
                .map(str::to_string)
                .ok_or_else(|| anyhow::anyhow!("--filter {f:?}: only label=K=V filters are known"))
        })
        .collect::<Result<_>>()?;
    super::parse_pairs("--filter label=", &pairs)
}

/// `sandfork stats [ID…]`: two readings half a second apart give the CPU use.
/// Prints how to reach `port` of sandbox `id` through the gateway.
pub async fn port_url(
    client: &Client,
    id: &str,
    port: u16,
    expires_in: u64,
    json: bool,
) -> Result<i32> {
    let route = format!("/v1/sandboxes/{}/port-urls", encode(id));
    let body = serde_json::json!({"port": port, "expires_in_secs": expires_in});
    let v: Value = client.json(Method::POST, &route, Some(&body)).await?;
    if json {
        println!("{v}");
    } else {
        for key in ["signed_path", "host", "access_token", "expires_at"] {
            println!("{key:<13} {}", output::field(&v, key));
        }
    }
    Ok(0)
}

pub async fn stats(client: &Client, mut ids: Vec<String>, json: bool) -> Result<i32> {
    if ids.is_empty() {
        let listed: Value = client
            .json(Method::GET, "/v1/sandboxes?state=running", None::<&()>)
            .await?;
        ids = listed["sandboxes"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|s| output::field(s, "id"))
            .collect();
    }
    let read = |id: String| async move {
        let path = format!("/v1/sandboxes/{}/stats", encode(&id));
        client.json::<Value>(Method::GET, &path, None::<&()>).await
    };
    let mut first = Vec::new();
    for id in &ids {
        first.push((read(id.clone()).await?, std::time::Instant::now()));
    }
    if json {
        let stats: Vec<&Value> = first.iter().map(|(v, _)| v).collect();
        output::json(&json!({ "stats": stats }));
        return Ok(0);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut rows = Vec::new();
    for (id, (a, at)) in ids.iter().zip(&first) {
        let b = read(id.clone()).await?;
        rows.push(stats_row(a, &b, at.elapsed().as_secs_f64()));
    }
    output::table(
        &[
            "ID", "CPU %", "MEMORY", "LIMIT", "PIDS", "DISK", "NET RX", "NET TX",
        ],
        &rows,
    );
    Ok(0)
}

/// One table row from two readings of a sandbox's stats taken `secs` apart.
fn stats_row(a: &Value, b: &Value, secs: f64) -> Vec<String> {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let u = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let cpu = if secs > 0.0 {
        100.0 * (f(b, "cpu_seconds") - f(a, "cpu_seconds")).max(0.0) / secs
    } else {
        0.0
    };
    vec![
        output::field(b, "id"),
        format!("{cpu:.1}"),
        output::size(u(b, "memory_bytes")),
        output::size(u(b, "memory_limit_bytes")),
        u(b, "pids").to_string(),
        format!(
            "{} / {}",
            output::size(u(b, "disk_used_bytes")),
            output::size(u(b, "disk_total_bytes"))
        ),
        output::size(u(b, "net_rx_bytes")),
        output::size(u(b, "net_tx_bytes")),
    ]
}

/// `sandfork events`: one line per event (`--json`: the events as JSON lines).
pub async fn events(
    client: &Client,
    sandbox: Option<String>,
    since: Option<u64>,
    no_follow: bool,
    json: bool,
) -> Result<i32> {
    // Without following, "only new events" would be nothing at all: replay what is kept.
    let since = since.or(no_follow.then_some(0));
    let query = query(&[
        ("sandbox", sandbox),
        ("since", since.map(|n| n.to_string())),
        ("no_follow", no_follow.then(|| "true".into())),
    ]);
    print_lines(client, &format!("/v1/events{query}"), json, |e| {
        let opt = |k: &str| e[k].as_str().map(|s| format!(" {s}")).unwrap_or_default();
        format!(
            "{} {} {:<12} {}{}{}{}",
            output::field(e, "seq"),
            output::field(e, "at"),
            output::field(e, "type"),
            output::field(e, "sandbox_id"),
            opt("name"),
            opt("snapshot_id"),
            opt("message"),
        )
    })
    .await
}

/// `?k=v&…` of the pairs that have a value (values encoded), or nothing.
fn query(pairs: &[(&str, Option<String>)]) -> String {
    let set: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if set.is_empty() {
        String::new()
    } else {
        format!("?{}", set.join("&"))
    }
}

/// Prints each line of the NDJSON stream `GET route` (as is with `--json`, else as `line`
/// renders it) until the daemon ends it.
async fn print_lines(
    client: &Client,
    route: &str,
    json: bool,
    line: impl Fn(&Value) -> String,
) -> Result<i32> {
    let resp = client
        .call(
            Method::GET,
            route,
            "application/json",
            crate::client::full(Vec::new()),
        )
        .await?;
    let mut lines = crate::client::Lines::new(resp);
    while let Some(e) = lines.next().await? {
        if json {
            println!("{e}");
        } else {
            println!("{}", line(&e));
        }
    }
    Ok(0)
}

/// `sandfork watch ID PATH [-r]`: one line per change (`--json`: JSON lines).
/// Prints the sandbox log (`--json`: one entry per line).
pub async fn logs(
    client: &Client,
    id: &str,
    follow: bool,
    tail: Option<usize>,
    process: Option<String>,
    json: bool,
) -> Result<i32> {
    let query = query(&[
        ("follow", follow.then(|| "true".into())),
        ("tail", tail.map(|n| n.to_string())),
        ("process", process),
    ]);
    let route = format!("/v1/sandboxes/{}/logs{query}", encode(id));
    print_lines(client, &route, json, |e| {
        format!(
            "{} {:<6} {} {}",
            output::field(e, "timestamp"),
            output::field(e, "stream"),
            output::field(e, "process"),
            output::field(e, "message")
        )
    })
    .await
}

pub async fn watch(
    client: &Client,
    id: &str,
    path: &str,
    recursive: bool,
    json: bool,
) -> Result<i32> {
    let query = query(&[
        ("path", Some(path.to_string())),
        ("recursive", recursive.then(|| "true".into())),
    ]);
    let route = format!("/v1/sandboxes/{}/files/watch{query}", encode(id));
    print_lines(client, &route, json, |e| {
        let (kind, path) = (output::field(e, "type"), output::field(e, "path"));
        match e["old_path"].as_str() {
            Some(old) => format!("{kind:<8} {old} -> {path}"),
            None => format!("{kind:<8} {path}"),
        }
    })
    .await
}

/// `sandfork timeout ID SECS [--on-timeout A]`.
pub async fn set_timeout(
    client: &Client,
    id: &str,
    secs: u64,
    on_timeout: Option<String>,
    json: bool,
) -> Result<i32> {
    let mut body = json!({ "timeout_secs": secs });
    if let Some(a) = on_timeout {
        body["on_timeout"] = a.into();
    }
    let sb: Value = client
        .json(
            Method::PATCH,
            &format!("/v1/sandboxes/{}", encode(id)),
            Some(&body),
        )
        .await?;
    if json {
        output::json(&sb);
    } else {
        let expires = sb
            .get("expires_at")
            .and_then(Value::as_str)
            .unwrap_or("never");
        println!(
            "{} {} expires {expires}",
            output::field(&sb, "id"),
            output::field(&sb, "on_timeout")
        );
    }
    Ok(0)
}

/// The `network` object of a create: the mode, with egress lists implying `internet`.
fn network_request(opts: &SandboxOpts) -> Option<Value> {
    let lists = !(opts.allow_out.is_empty() && opts.deny_out.is_empty());
    let mode = match (&opts.network, lists) {
        (Some(m), _) => m.clone(),
        (None, true) => "internet".into(),
        (None, false) => return None,
    };
    let mut net = json!({ "mode": mode });
    if lists {
        net["allow_out"] = json!(opts.allow_out);
        net["deny_out"] = json!(opts.deny_out);
    }
    Some(net)
}

/// `sandfork network ID [--allow-out D…|--clear-allow] [--deny-out D…|--clear-deny]`:
/// replaces the lists given (none given: shows them).
pub async fn network(
    client: &Client,
    id: &str,
    allow: Option<Vec<String>>,
    deny: Option<Vec<String>>,
    json: bool,
) -> Result<i32> {
    let route = format!("/v1/sandboxes/{}", encode(id));
    let sb: Value = if allow.is_none() && deny.is_none() {
        client.json(Method::GET, &route, None::<&()>).await?
    } else {
        let mut body = json!({});
        if let Some(a) = allow {
            body["allow_out"] = json!(a);
        }
        if let Some(d) = deny {
            body["deny_out"] = json!(d);
        }
        client.json(Method::PATCH, &route, Some(&body)).await?
    };
    let net = &sb["network"];
    if json {
        output::json(net);
        return Ok(0);
    }
    let list = |k: &str| {
        let v: Vec<&str> = net[k]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    println!("mode      {}", output::field(net, "mode"));
    println!("allow_out {}", list("allow_out"));
    println!("deny_out  {}", list("deny_out"));
    Ok(0)
}

/// `sandfork label ID K=V… [--rm K…]`.
pub async fn label(
    client: &Client,
    id: &str,
    set: &[String],
    remove: Vec<String>,
    json: bool,
) -> Result<i32> {
    let body = json!({ "set": super::parse_pairs("label", set)?, "remove": remove });
    let reply: Value = client
        .json(
            Method::PATCH,
            &format!("/v1/sandboxes/{}/labels", encode(id)),
            Some(&body),
        )
        .await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    if let Some(labels) = reply["labels"].as_object() {
        for (k, v) in labels {
            println!("{k}={}", v.as_str().unwrap_or_default());
        }
    }
    Ok(0)
}

/// `inspect`: one row per field, as `image inspect` prints (`--json`: the document).
pub async fn inspect(client: &Client, id: &str, json: bool) -> Result<i32> {
    let sb: Value = client
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{}", encode(id)),
            None::<&()>,
        )
        .await?;
    if json {
        output::json(&sb);
        return Ok(0);
    }
    let f = |k: &str| output::field(&sb, k);
    let net = &sb["network"];
    let fork = sb["fork"]
        .as_object()
        .map(|o| {
            format!(
                "#{} of {}",
                o["index"],
                o["parent_snapshot_id"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let rows = [
        ("id", f("id")),
        ("name", f("name")),
        ("state", f("state")),
        ("error", f("error")),
        ("image", f("image")),
        ("snapshot", f("snapshot_id")),
        ("fork", fork),
        ("cpus", f("cpus")),
        ("memory", format!("{} MiB", f("memory_mb"))),
        ("disk", format!("{} MiB", f("disk_mb"))),
        ("disk full", f("disk_full")),
        ("network", output::field(net, "mode")),
        ("address", output::field(net, "address")),
        ("allow out", output::joined(&net["allow_out"])),
        ("deny out", output::joined(&net["deny_out"])),
        ("labels", output::pairs(&sb["labels"])),
        (
            "timeout",
            format!("{} s ({})", f("timeout_secs"), f("on_timeout")),
        ),
        ("expires", f("expires_at")),
        ("created", f("created_at")),
        ("last active", f("last_active_at")),
    ];
    for (k, v) in rows.iter().filter(|(_, v)| !v.is_empty() && v != "-") {
        println!("{k:<12} {v}");
    }
    Ok(0)
}

pub async fn remove(client: &Client, ids: &[String], json: bool) -> Result<i32> {
    let mut code = 0;
    let mut done = Vec::new();
    for id in ids {
        let path = format!("/v1/sandboxes/{}", encode(id));
        match client
            .json::<Value>(Method::DELETE, &path, None::<&()>)
            .await
        {
            Ok(sb) if json => done.push(sb),
            Ok(_) => println!("{id}"),
            Err(e) => {
                eprintln!("error: {id}: {e}");
                code = 1;
            }
        }
    }
    if json {
        output::json(&Value::Array(done));
    }
    Ok(code)
}
