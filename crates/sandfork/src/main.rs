//! The `sandfork` binary: one file carries the whole host side.
//!
//! - `sandfork serve` runs the daemon (crate `server`);
//! - started as `sandfork-disk` (the daemon does, for each disk server) it is the disk
//!   server (crate `disk`);
//! - every other verb is the command line, a client of the daemon's `/v1` API (crate `cli`,
//!   which knows nothing of the daemon but its API types).

mod gateway_cmd;
mod serve;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Isolated Linux sandboxes: snapshot once, fork many.
#[derive(Debug, Parser)]
#[command(name = "sandfork", version, about)]
struct Args {
    #[command(flatten)]
    client: cli::ClientArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(serve::ServeArgs),
    /// Run the cluster's gateway: one API in front of many nodes, placed by Ray.
    Gateway(gateway_cmd::GatewayArgs),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
    /// A cluster's authority, tokens and node certificates (docs/scale-out.md).
    #[command(subcommand)]
    Cluster(gateway_cmd::ClusterCommand),
    /// Serve the Model Context Protocol (stdio, or streamable HTTP with --http): tools and
    /// resources for sandboxes, through the daemon's API (docs/mcp.md).
    Mcp(mcp::McpArgs),
    #[command(flatten)]
    Client(cli::Command),
}

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let exe = std::env::args_os().next().map(std::path::PathBuf::from);
    if exe.as_deref().and_then(|p| p.file_name()) == Some("sandfork-disk".as_ref()) {
        return disk::cli::main();
    }
    // This very binary (even once an upgrade replaced its file): disk servers are always
    // the daemon's own build.
    disk::use_server_binary("/proc/self/exe".into());
    let args = parse_args();
    let command = match args.command {
        Command::Openapi => {
            cli::quiet_on_closed_stdout();
            print!("{}", server::api::openapi_json());
            return 0;
        }
        Command::Cluster(c) => {
            return match gateway_cmd::cluster(c) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {}", cli::one_line(&e));
                    1
                }
            };
        }
        Command::Serve(s) => Run::Serve(s),
        Command::Gateway(g) => Run::Gateway(g),
        Command::Mcp(m) => Run::Mcp(args.client, m),
        Command::Client(c) => {
            cli::quiet_on_closed_stdout();
            Run::Client(args.client, c)
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = rt.block_on(async {
        match command {
            Run::Serve(s) => serve::serve(s).await,
            Run::Gateway(g) => gateway_cmd::run(g).await,
            Run::Client(a, c) => cli::run(a, c).await,
            Run::Mcp(a, m) => mcp::run(a.url, a.token, m).await.map_err(Into::into),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::one_line(&e));
            1
        }
    }
}

/// The command line, with the client flags (`--url`, `--token`, `--json`: global, so they
/// may follow any client verb) left out of the help of the verbs that are not clients.
fn parse_args() -> Args {
    let mut command = Args::command();
    // A verb that already has an argument of a global's id gets no copy of it: give these
    // verbs hidden copies of their own.
    let hidden: Vec<clap::Arg> = command
        .get_arguments()
        .filter(|arg| arg.is_global_set())
        .map(|arg| arg.clone().hide(true))
        .collect();
    for verb in ["serve", "gateway", "openapi", "cluster"] {
        command = command.mut_subcommand(verb, |sub| sub.args(hidden.clone()));
    }
    let matches = command.get_matches();
    Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

enum Run {
    Serve(serve::ServeArgs),
    Gateway(gateway_cmd::GatewayArgs),
    Client(cli::ClientArgs, cli::Command),
    Mcp(cli::ClientArgs, mcp::McpArgs),
}
