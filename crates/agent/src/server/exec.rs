//! Foreground exec: the process's output streams on the request's connection, which also
//! carries streamed stdin. If the host goes away, the process group is killed.

use proto::agent::{ExecRequest, ExitInfo, Message, OutputStream, StdinMode};
use tokio::io::AsyncWriteExt;

use super::group::Group;
use super::pump::{pump, OutputSink};
use super::spawn::Input;
use super::wire::{Reader, Writer};
use super::Agent;

struct SocketSink<'a> {
    writer: &'a mut Writer,
    offsets: [u64; 2],
}

impl OutputSink for SocketSink<'_> {
    async fn output(&mut self, stream: OutputStream, data: &[u8]) -> Result<(), ()> {
        let offset = &mut self.offsets[stream as usize];
        let msg = Message::Output {
            stream,
            offset: *offset,
            data: data.to_vec(),
        };
        *offset += data.len() as u64;
        self.writer.send(&msg).await.map_err(drop)
    }
}

pub async fn exec(agent: &Agent, req: ExecRequest, reader: Reader, mut writer: Writer) {
    let child = match super::spawn::spawn(&agent.reaper, &req, &agent.base()) {
        Ok(c) => c,
        Err(e) => return super::wire::send_error(&mut writer, e).await,
    };
    let group = Group::new(child.pid, child.exit.clone());
    // Pids are positive.
    if writer
        .send(&Message::Started {
            pid: child.pid as u32,
        })
        .await
        .is_err()
    {
        return group.kill();
    }
    let stdin_task = tokio::spawn(feed_stdin(reader, child.stdin, req.stdin, group.clone()));
    let timer = group.arm_timeout(req.timeout_ms);
    let mut sink = SocketSink {
        writer: &mut writer,
        offsets: [0, 0],
    };
    let result = pump(child.stdout, child.stderr, child.exit, &mut sink).await;
    timer.inspect(|t| t.abort());
    stdin_task.abort();
    match result {
        Ok(status) => {
            let exit = ExitInfo {
                status,
                timed_out: group.timed_out(),
            };
            let _ = writer.send(&Message::Exit(exit)).await;
        }
        Err(()) => group.kill(),
    }
}

/// Feeds stdin from the request or the connection, then watches the connection: when the
/// host disconnects (or breaks the protocol) the process group is killed.
async fn feed_stdin(mut reader: Reader, mut pipe: Option<Input>, mode: StdinMode, group: Group) {
    if let (StdinMode::Bytes(bytes), Some(p)) = (&mode, &mut pipe) {
        let _ = p.write_all(bytes).await;
        pipe = None;
    }
    loop {
        match reader.read().await {
            Ok(Some(Message::Data(data))) => {
                if let Some(p) = &mut pipe {
                    if p.write_all(&data).await.is_err() {
                        pipe = None;
                    }
                }
            }
            Ok(Some(Message::Eof)) => pipe = None,
            _ => return group.kill(),
        }
    }
}
