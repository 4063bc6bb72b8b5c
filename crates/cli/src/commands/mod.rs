//! One module per group of verbs; each returns the process exit code.

mod cp;
mod image;
mod run;
mod sandbox;
mod shell;
mod snapshot;
mod volume;

use anyhow::{bail, Result};

use crate::args::{ClientArgs, Command};
use crate::client::Client;

/// Parses `K=V` pairs.
pub fn parse_env(pairs: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    parse_pairs("--env", pairs)
}

/// `K=V` arguments of `flag` as a map.
pub fn parse_pairs(
    flag: &str,
    pairs: &[String],
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut map = std::collections::BTreeMap::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("invalid {flag} {p:?}: use K=V")
        };
        map.insert(k.to_string(), v.into());
    }
    Ok(map)
}

/// Runs one client verb; returns the process exit code.
pub async fn run(args: ClientArgs, command: Command) -> Result<i32> {
    let client = Client::from_url(args.url.as_deref(), args.token.clone())?;
    let json = args.json;
    match command {
        Command::Create(c) => sandbox::create(&client, c, json).await,
        Command::Ls { state, filters } => sandbox::list(&client, state, &filters, json).await,
        Command::Stats { ids } => sandbox::stats(&client, ids, json).await,
        Command::Url {
            id,
            port,
            expires_in,
        } => sandbox::port_url(&client, &id, port, expires_in, json).await,
        Command::Shell {
            id,
            attach,
            command,
        } => shell::shell(&client, &id, attach, command).await,
        Command::Logs {
            id,
            follow,
            tail,
            process,
        } => sandbox::logs(&client, &id, follow, tail, process, json).await,
        Command::Watch {
            id,
            path,
            recursive,
        } => sandbox::watch(&client, &id, &path, recursive, json).await,
        Command::Events {
            sandbox,
            since,
            no_follow,
        } => sandbox::events(&client, sandbox, since, no_follow, json).await,
        Command::Timeout {
            id,
            secs,
            on_timeout,
        } => sandbox::set_timeout(&client, &id, secs, on_timeout, json).await,
        Command::Network {
            id,
            allow_out,
            deny_out,
            clear_allow,
            clear_deny,
        } => {
            let allow = (clear_allow || !allow_out.is_empty()).then_some(allow_out);
            let deny = (clear_deny || !deny_out.is_empty()).then_some(deny_out);
            sandbox::network(&client, &id, allow, deny, json).await
        }
        Command::Label { id, set, remove } => {
            sandbox::label(&client, &id, &set, remove, json).await
        }
        Command::Inspect { id } => sandbox::inspect(&client, &id, json).await,
        Command::Rm { ids } => sandbox::remove(&client, &ids, json).await,
        Command::Run(r) => run::run(&client, r, json).await,
        Command::Exec(e) => run::exec(&client, e, json).await,
        Command::Cp { src, dst } => cp::copy(&client, &src, &dst).await,
        Command::Image(i) => image::image(&client, i, json).await,
        Command::Volume(v) => volume::volume(&client, v, json).await,
        Command::Checkpoint { id, memory, name } => {
            snapshot::checkpoint(&client, &id, memory, name, json).await
        }
        Command::Fork(f) => snapshot::fork(&client, f, json).await,
        Command::Suspend { ids } => snapshot::suspend_resume(&client, &ids, "suspend", json).await,
        Command::Resume { ids } => snapshot::suspend_resume(&client, &ids, "resume", json).await,
        Command::Snapshot(c) => snapshot::snapshot(&client, c, json).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs_parse() {
        let env = parse_env(&["A=1".into(), "B=x=y".into()]).unwrap();
        assert_eq!(env["B"], "x=y");
        assert!(parse_env(&["nope".into()]).is_err());
    }
}
