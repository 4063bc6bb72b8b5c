//! One connection: preamble, one request, and the exchange that request defines.

use std::sync::Arc;
use std::time::Duration;

use proto::agent::{AgentError, ErrorKind, Message, Request};
use tokio::net::UnixStream;

use proto::codec::{FrameReader, FrameWriter};

use super::wire::{send_error, Reader, Writer};
use super::{exec, files, identity, supervise, Agent};

/// How long a client may take to send its preamble and request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(agent: Arc<Agent>, stream: UnixStream) {
    let (r, w) = stream.into_split();
    let (mut reader, mut writer) = (FrameReader::new(r), FrameWriter::new(w));
    if writer.write_preamble().await.is_err() {
        return;
    }
    let first = tokio::time::timeout(REQUEST_TIMEOUT, async {
        reader.read_preamble().await?;
        reader.read().await
    });
    match first.await {
        Ok(Ok(Some(Message::Request(req)))) => dispatch(&agent, req, reader, writer).await,
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::debug!("bad frame from client: {e}");
            send_error(
                &mut writer,
                AgentError::new(ErrorKind::InvalidInput, e.to_string()),
            )
            .await;
        }
        Ok(Ok(Some(_))) => {
            send_error(
                &mut writer,
                AgentError::new(ErrorKind::InvalidInput, "expected a request"),
            )
            .await;
        }
        Err(_) => {
            send_error(
                &mut writer,
                AgentError::new(ErrorKind::TimedOut, "no request received"),
            )
            .await
        }
    }
}

async fn dispatch(agent: &Arc<Agent>, req: Request, mut reader: Reader, mut writer: Writer) {
    let max = agent.config.max_transfer;
    let reply = match req {
        Request::Exec(req) => return exec::exec(agent, req, reader, writer).await,
        Request::Attach {
            id,
            stdout_offset,
            stderr_offset,
            follow,
        } => {
            return attach(
                agent,
                id,
                [stdout_offset, stderr_offset],
                follow,
                reader,
                writer,
            )
            .await;
        }
        Request::WriteFile {
            path,
            mode,
            create_parents,
        } => {
            let how = files::WriteHow {
                mode,
                create_parents,
                owner: None,
            };
            return files::write_file(path, how, max, &mut reader, &mut writer).await;
        }
        Request::WriteFileAs {
            path,
            mode,
            create_parents,
            uid,
            gid,
        } => {
            let how = files::WriteHow {
                mode,
                create_parents,
                owner: Some((uid, gid)),
            };
            return files::write_file(path, how, max, &mut reader, &mut writer).await;
        }
        Request::ReadFile {
            path,
            offset,
            limit,
        } => files::read_file(path, offset, limit, max, &mut writer)
            .await
            .map(|()| None),
        Request::ListDir { path } => files::list_dir(path, &mut writer).await.map(|()| None),
        Request::Logs { since, follow } => {
            let logs = agent.procs.logs.clone();
            return drop(logs.serve(since, follow, &mut reader, &mut writer).await);
        }
        Request::PtyConnect { id, offset } => {
            return match agent.procs.get(id) {
                Ok(proc) => drop(proc.pty_session(offset, reader, &mut writer).await),
                Err(e) => send_error(&mut writer, e).await,
            };
        }
        Request::SpawnPty { spawn, size } => agent
            .procs
            .start_pty(&agent.reaper, spawn, &agent.base(), size)
            .map(|p| Some(spawned(&p))),
        Request::WatchDir { path, recursive } => {
            files::watch_dir(path, recursive, &mut reader, &mut writer)
                .await
                .map(|()| None)
        }
        Request::Hello => Ok(Some(Message::Hello(agent.hello()))),
        Request::Spawn(req) => supervise::spawn(agent, req).map(|p| Some(spawned(&p))),
        Request::Restart { id } => match agent.procs.get(id) {
            Ok(proc) => supervise::restart(agent, &proc)
                .await
                .map(|p| Some(spawned(&p))),
            Err(e) => Err(e),
        },
        Request::ListProcesses => Ok(Some(Message::Processes(agent.procs.list()))),
        other => process_or_file(agent, other).await.map(Some),
    };
    match reply {
        Ok(Some(msg)) => {
            let _ = writer.send(&msg).await;
        }
        Ok(None) => {}
        Err(e) => send_error(&mut writer, e).await,
    }
}

/// Requests answered by exactly one frame.
async fn process_or_file(agent: &Agent, req: Request) -> Result<Message, AgentError> {
    match req {
        Request::WriteStdin { id, data } => agent
            .procs
            .get(id)?
            .write_stdin(&data)
            .await
            .map(|()| Message::Done),
        Request::CloseStdin { id } => {
            agent.procs.get(id)?.close_stdin().await;
            Ok(Message::Done)
        }
        Request::Signal { id, signal, group } => agent
            .procs
            .get(id)?
            .signal(signal, group)
            .map(|()| Message::Done),
        Request::Wait { id, timeout_ms } => {
            let proc = agent.procs.get(id)?;
            proc.wait(timeout_ms).await.map(Message::Exit)
        }
        Request::Stop { id } => {
            supervise::stop(&*agent.procs.get(id)?).await;
            Ok(Message::Done)
        }
        Request::ResizePty { id, size } => agent
            .procs
            .get(id)?
            .resize(size)
            .await
            .map(|()| Message::Done),
        Request::Stat { path } => files::stat(path).await,
        Request::Remove { path, recursive } => files::remove(path, recursive).await,
        Request::Mkdir {
            path,
            parents,
            mode,
        } => files::mkdir(path, parents, mode).await,
        Request::SetIdentity(id) => {
            identity::apply(&id, &agent.config.identity_dir)?;
            agent.set_identity(id);
            Ok(Message::Done)
        }
        _ => Err(AgentError::new(
            ErrorKind::InvalidInput,
            "unexpected request",
        )),
    }
}

fn spawned(p: &super::procs::Proc) -> Message {
    Message::Spawned {
        id: p.id(),
        pid: p.pid(),
    }
}

async fn attach(
    agent: &Agent,
    id: u64,
    offsets: [u64; 2],
    follow: bool,
    mut reader: Reader,
    mut writer: Writer,
) {
    match agent.procs.get(id) {
        Ok(proc) => drop(proc.attach(offsets, follow, &mut reader, &mut writer).await),
        Err(e) => send_error(&mut writer, e).await,
    }
}
