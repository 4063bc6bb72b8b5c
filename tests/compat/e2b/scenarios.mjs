#!/usr/bin/env node
// Scenarios that drive the unmodified E2B JS SDK (npm `e2b` 2.51.0).
//
// Usage:  node scenarios.mjs [SCENARIO ...]     (none: all of them)
//         node scenarios.mjs --list
//
// Environment (nothing hard-wired: point it at the recorder or at the daemon):
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   as for the SDK itself
//   E2B_TEMPLATE   template to create sandboxes from (default "base")
//   E2B_JS_DIR     a directory whose node_modules holds e2b, when `import 'e2b'`
//                  does not resolve from here (default /var/cache/sandfork/compat/e2b-js)
//   SCENARIO_OUT   if set, a directory: <scenario>.sdk.json observations go there
//
// Each scenario prints one JSON line {scenario, ok, observations, error}; the
// checks hold for any correct server. Exit status 0 when all passed.

import fs from 'node:fs'
import path from 'node:path'
import { pathToFileURL } from 'node:url'

async function loadSdk() {
  try {
    return await import('e2b')
  } catch {
    const dir = process.env.E2B_JS_DIR || '/var/cache/sandfork/compat/e2b-js'
    return await import(pathToFileURL(path.join(dir, 'node_modules/e2b/dist/index.mjs')).href)
  }
}

const e2b = await loadSdk()
const { Sandbox } = e2b
const TEMPLATE = process.env.E2B_TEMPLATE || 'base'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

class CheckFailed extends Error {}
function check(cond, what) {
  if (!cond) throw new CheckFailed(what)
}

function chain(e) {
  const out = []
  let p = Object.getPrototypeOf(e)
  while (p && p.constructor && p.constructor !== Object) {
    out.push(p.constructor.name)
    p = Object.getPrototypeOf(p)
  }
  return out
}

function excInfo(e) {
  return {
    type: e?.constructor?.name,
    chain: chain(e),
    name: e?.name,
    message: String(e?.message ?? e).slice(0, 500),
    statusCode: e?.statusCode,
  }
}

async function expectError(fn, ...types) {
  let res
  try {
    res = await fn()
  } catch (e) {
    if (types.length && !types.some((t) => e instanceof t)) {
      throw new CheckFailed(`expected ${types.map((t) => t.name)}, got ${e?.constructor?.name}: ${e?.message}`)
    }
    return excInfo(e)
  }
  throw new CheckFailed(`expected ${types.map((t) => t.name)}, got a result: ${JSON.stringify(res)}`)
}

const entry = (e) => ({
  name: e.name,
  type: e.type,
  path: e.path,
  size: e.size,
  mode: e.mode,
  permissions: e.permissions,
  owner: e.owner,
  group: e.group,
  modifiedTime: e.modifiedTime?.toISOString?.() ?? e.modifiedTime,
  symlinkTarget: e.symlinkTarget,
})
const info = (i) => ({ ...i, startedAt: i.startedAt?.toISOString?.(), endAt: i.endAt?.toISOString?.() })

// ---------------------------------------------------------------------------

async function lifecycle() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000, metadata: { suite: 'e2b-compat', case: 'lifecycle' }, envs: { GREETING: 'hello' } })
  obs.sandboxId = sb.sandboxId
  obs.envdApiUrl = sb.envdApiUrl
  obs.getHost8080 = sb.getHost(8080)
  obs.sandboxDomain = sb.sandboxDomain
  try {
    obs.isRunning = await sb.isRunning()
    check(obs.isRunning === true, 'isRunning after create')
    const i = await sb.getInfo()
    obs.getInfo = info(i)
    check(i.sandboxId === sb.sandboxId, 'getInfo id')
    check(i.metadata?.case === 'lifecycle', 'metadata round trip')
    check(i.state === 'running', 'state running')
    const r = await sb.commands.run('echo $GREETING')
    check(r.stdout === 'hello\n', `envs reach commands: ${JSON.stringify(r.stdout)}`)
    await sb.setTimeout(300_000)
    const i2 = await Sandbox.getInfo(sb.sandboxId)
    obs.endAtAfterSetTimeout = i2.endAt.toISOString()
    check(i2.endAt > i.endAt, 'setTimeout moved endAt')
    const same = await Sandbox.connect(sb.sandboxId)
    check(same.sandboxId === sb.sandboxId, 'connect returns the same sandbox')
    check((await same.commands.run('echo again')).stdout === 'again\n', 'connected instance runs commands')
    const same2 = await sb.connect({ timeoutMs: 200_000 })
    check(same2.sandboxId === sb.sandboxId, 'instance connect')
    obs.metricsCount = (await sb.getMetrics()).length
    const listed = await Sandbox.list({ query: { metadata: { case: 'lifecycle' } } }).nextItems()
    obs.listIds = listed.map((s) => s.sandboxId)
    check(obs.listIds.includes(sb.sandboxId), 'list finds it by metadata')
  } finally {
    obs.kill = await sb.kill()
  }
  check(obs.kill === true, 'kill returns true')
  obs.killAgain = await Sandbox.kill(sb.sandboxId)
  check(obs.killAgain === false, 'kill of a gone sandbox returns false')
  obs.getInfoAfterKill = await expectError(() => Sandbox.getInfo(sb.sandboxId), e2b.SandboxNotFoundError, e2b.NotFoundError)
  obs.isRunningAfterKill = await sb.isRunning()
  check(obs.isRunningAfterKill === false, 'isRunning after kill is false')
  return obs
}

async function create_options() {
  const obs = {}
  const a = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000, allowInternetAccess: false, metadata: { case: 'create_options' } })
  const b = await Sandbox.create(TEMPLATE, {
    timeoutMs: 60_000,
    network: { allowOut: ['1.1.1.1', 'example.com'], denyOut: ['0.0.0.0/0'], allowPublicTraffic: false, maskRequestHost: 'localhost:${PORT}' },
    lifecycle: { onTimeout: 'pause', autoResume: true },
    secure: true,
  })
  try {
    obs.aInfo = info(await a.getInfo())
    obs.bInfo = info(await b.getInfo())
    await b.updateNetwork({ allowOut: ['8.8.8.8'], denyOut: ['10.0.0.0/8'] })
    await Sandbox.updateNetwork(a.sandboxId, { allowInternetAccess: true })
    obs.bInfoAfterUpdate = info(await b.getInfo())
    obs.bGetHost3000 = b.getHost(3000)
    obs.downloadUrl = await b.downloadUrl('/home/user/x.txt')
    obs.uploadUrl = await b.uploadUrl('/home/user/x.txt', { useSignatureExpiration: 60 })
  } finally {
    await a.kill()
    await b.kill()
  }
  return obs
}

async function list_pagination() {
  const obs = {}
  const sbs = []
  for (let i = 0; i < 3; i++) sbs.push(await Sandbox.create(TEMPLATE, { timeoutMs: 60_000, metadata: { case: 'list', n: String(i), 'odd key': 'a&b=c' } }))
  try {
    const pager = Sandbox.list({ query: { metadata: { case: 'list' }, state: ['running'] }, limit: 2 })
    const pages = []
    obs.nextTokens = []
    while (pager.hasNext) {
      const items = await pager.nextItems()
      pages.push(items.map((s) => s.sandboxId))
      obs.nextTokens.push(pager.nextToken ?? null)
    }
    obs.pages = pages
    const seen = pages.flat().sort()
    check(JSON.stringify(seen) === JSON.stringify(sbs.map((s) => s.sandboxId).sort()), 'pagination saw each sandbox once')
    check(pages.length === 2 && pages[0].length === 2, 'two pages of limit 2')
    const odd = await Sandbox.list({ query: { metadata: { 'odd key': 'a&b=c', n: '1' } } }).nextItems()
    obs.oddMetadataIds = odd.map((s) => s.sandboxId)
    check(JSON.stringify(obs.oddMetadataIds) === JSON.stringify([sbs[1].sandboxId]), 'metadata filter with reserved characters')
    const desc = await Sandbox.list({ query: { metadata: { case: 'list' } }, order: 'desc' }).nextItems()
    obs.descIds = desc.map((s) => s.sandboxId)
    obs.firstListed = desc[0] ? info(desc[0]) : null
    const pausedNone = await Sandbox.list({ query: { state: ['paused'], metadata: { case: 'list' } } }).nextItems()
    check(pausedNone.length === 0, 'no paused ones')
    const both = await Sandbox.list({
      query: { state: ['running', 'paused'], startedAfter: new Date(Date.now() - 3600_000), template: TEMPLATE, metadata: { case: 'list' } },
    }).nextItems()
    obs.bothStatesStartedAfterTemplate = both.map((s) => s.sandboxId).sort()
    check(both.length === 3, 'state list, startedAfter and template filters')
  } finally {
    for (const s of sbs) await s.kill()
  }
  return obs
}

async function pause_resume() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000, metadata: { case: 'pause_resume' } })
  try {
    await sb.files.write('/home/user/state.txt', 'kept across pause')
    const h = await sb.commands.run('sleep 600', { background: true })
    obs.bgPid = h.pid
    obs.pause = await sb.pause()
    check(obs.pause === true, 'pause returns true')
    const i = await Sandbox.getInfo(sb.sandboxId)
    obs.stateAfterPause = i.state
    check(i.state === 'paused', 'state paused')
    const listed = await Sandbox.list({ query: { state: ['paused'], metadata: { case: 'pause_resume' } } }).nextItems()
    obs.listedPaused = listed.map((s) => s.sandboxId)
    check(obs.listedPaused.includes(sb.sandboxId), 'listed as paused')
    obs.pauseAgain = await Sandbox.pause(sb.sandboxId)
    check(obs.pauseAgain === false, 'pausing a paused sandbox returns false')
    obs.runWhilePaused = await expectError(() => sb.commands.run('true'), e2b.SandboxError)
    obs.readWhilePaused = await expectError(() => sb.files.read('/home/user/state.txt'), e2b.SandboxError)
    obs.isRunningWhilePaused = await sb.isRunning()
    const resumed = await Sandbox.connect(sb.sandboxId, { timeoutMs: 120_000 })
    check(resumed.sandboxId === sb.sandboxId, 'resume keeps the id')
    check((await resumed.files.read('/home/user/state.txt')) === 'kept across pause', 'file survives pause')
    obs.betaPause = await resumed.betaPause()
    const resumed2 = await resumed.connect()
    check((await resumed2.commands.run('echo back')).stdout === 'back\n', 'commands after second resume')
    obs.pauseNoMemory = await Sandbox.pause(sb.sandboxId, { keepMemory: false })
    const resumed3 = await Sandbox.connect(sb.sandboxId, { onResume: 'reboot' })
    check((await resumed3.files.read('/home/user/state.txt')) === 'kept across pause', 'file survives a filesystem pause')
  } finally {
    await sb.kill()
  }
  return obs
}

async function snapshot_fork() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000, metadata: { case: 'snapshot_fork' } })
  const made = []
  try {
    await sb.files.write('/home/user/origin.txt', 'from the parent')
    const snap = await sb.createSnapshot({ name: 'compat-snap' })
    obs.snapshot = snap
    const snap2 = await Sandbox.createSnapshot(sb.sandboxId)
    obs.snapshotUnnamed = snap2
    check((await sb.commands.run('echo still')).stdout === 'still\n', 'source keeps running after snapshot')
    const mine = await sb.listSnapshots().nextItems()
    obs.listSnapshotsOfSandbox = mine.map((s) => s.snapshotId)
    check(obs.listSnapshotsOfSandbox.includes(snap.snapshotId), 'snapshot listed for its sandbox')
    const all = Sandbox.listSnapshots({ limit: 1 })
    const first = await all.nextItems()
    obs.listSnapshotsLimit1 = { items: first.map((s) => s.snapshotId), hasNext: all.hasNext, nextToken: all.nextToken ?? null }
    const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
    made.push(child)
    check((await child.files.read('/home/user/origin.txt')) === 'from the parent', 'sandbox from snapshot has the file')
    const forks = await sb.fork({ count: 2, timeoutMs: 60_000 })
    obs.forkResults = forks.map((f) => (f instanceof Sandbox ? f.sandboxId : excInfo(f)))
    for (const f of forks) {
      check(f instanceof Sandbox, 'fork succeeded')
      made.push(f)
      check((await f.files.read('/home/user/origin.txt')) === 'from the parent', 'fork has the file')
    }
    const f2 = await Sandbox.fork(sb.sandboxId)
    obs.forkStaticDefault = f2.map((f) => (f instanceof Sandbox ? f.sandboxId : excInfo(f)))
    made.push(...f2.filter((f) => f instanceof Sandbox))
    obs.deleteSnapshot = await Sandbox.deleteSnapshot(snap.snapshotId)
    obs.deleteSnapshotUnnamed = await Sandbox.deleteSnapshot(snap2.snapshotId)
    obs.deleteSnapshotAgain = await Sandbox.deleteSnapshot(snap.snapshotId)
    check(obs.deleteSnapshot === true && obs.deleteSnapshotAgain === false, 'deleteSnapshot true then false')
  } finally {
    for (const m of made) await m.kill()
    await sb.kill()
  }
  return obs
}

async function commands() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    const out = []
    const err = []
    let r = await sb.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    })
    obs.streamed = { stdoutChunks: out, stderrChunks: err, result: r }
    check(r.stdout === 'out1\nout2\nout3\n' && r.stderr === 'err1\nerr2\nerr3\n', 'stdout/stderr collected')
    check(out.length === 3, 'stdout arrives as it is written (3 chunks)')
    r = await sb.commands.run('pwd; echo $A $B; whoami', { envs: { A: '1', B: 'two words' }, cwd: '/tmp', user: 'root' })
    obs.envCwdUser = r
    check(r.stdout.split('\n').slice(0, 2).join('|') === '/tmp|1 two words', 'cwd and envs')
    obs.exit3 = await expectError(() => sb.commands.run('echo partial; exit 3'), e2b.CommandExitError)
    try {
      await sb.commands.run('echo partial; exit 3')
    } catch (e) {
      obs.exit3Fields = { exitCode: e.exitCode, stdout: e.stdout, stderr: e.stderr, error: e.error }
      check(e.exitCode === 3 && e.stdout === 'partial\n', 'exit code and output on failure')
    }
    obs.timeout = await expectError(() => sb.commands.run('sleep 5', { timeoutMs: 1000 }), e2b.TimeoutError)
    r = await sb.commands.run("head -c 100000 /dev/zero | tr '\\0' x")
    obs.largeOutputLen = r.stdout.length
    check(r.stdout.length === 100000, 'large output complete')
    r = await sb.commands.run("printf '\\xff\\xfe text'")
    obs.nonUtf8Stdout = r.stdout
    obs.badCwd = await expectError(() => sb.commands.run('true', { cwd: '/nonexistent/dir' }), e2b.SandboxError)
  } finally {
    await sb.kill()
  }
  return obs
}

async function background() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    const h = await sb.commands.run('cat', { background: true, stdin: true })
    obs.catPid = h.pid
    const procs = await sb.commands.list()
    obs.list = procs
    check(procs.some((p) => p.pid === h.pid), 'background process listed')
    await sb.commands.sendStdin(h.pid, 'line one\n')
    await h.sendStdin(new TextEncoder().encode('line two\n'))
    await sb.commands.closeStdin(h.pid)
    const r = await h.wait()
    obs.catResult = { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
    check(r.stdout === 'line one\nline two\n', 'stdin reached the process in order')

    const h2 = await sb.commands.run('for i in $(seq 1 30); do echo tick$i; sleep 0.1; done', { background: true })
    await sleep(350)
    await h2.disconnect()
    const h3 = await sb.commands.connect(h2.pid)
    const r3 = await h3.wait()
    obs.reconnectedStdoutTail = r3.stdout.trim().split('\n').slice(-1)
    check(obs.reconnectedStdoutTail[0] === 'tick30', 'reconnected stream reaches the end')

    const h4 = await sb.commands.run('sleep 300', { background: true })
    obs.kill = await sb.commands.kill(h4.pid)
    check(obs.kill === true, 'kill running process')
    obs.killedWait = await expectError(() => h4.wait(), e2b.CommandExitError)
    obs.killMissing = await sb.commands.kill(999999)
    check(obs.killMissing === false, 'kill of unknown pid is false')
    obs.sendStdinMissing = await expectError(() => sb.commands.sendStdin(999999, 'x'), e2b.SandboxError)
    obs.connectMissing = await expectError(() => sb.commands.connect(999999), e2b.SandboxError)
    const h5 = await sb.commands.run('sleep 300', { background: true })
    obs.handleKill = await h5.kill()
  } finally {
    await sb.kill()
  }
  return obs
}

async function files() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    obs.writeText = await sb.files.write('/home/user/hello.txt', 'Hello, world\n')
    obs.writeBytesRelative = await sb.files.write('notes/relative.bin', new Uint8Array([0, 1, 2, 255]).buffer)
    obs.writeFiles = await sb.files.write([
      { path: '/home/user/multi/a.txt', data: 'A' },
      { path: '/home/user/multi/b.txt', data: new Uint8Array([66]).buffer },
    ])
    obs.writeMultipart = await sb.files.write('/home/user/multipart.txt', 'via multipart', { useOctetStream: false })
    obs.writeGzip = await sb.files.write('/home/user/gz.txt', 'compressed upload', { gzip: true })
    obs.writeBlob = await sb.files.write('/home/user/blob.txt', new Blob(['from a blob']))
    obs.writeStream = await sb.files.write('/home/user/stream.txt', new Blob(['from a stream']).stream())
    obs.writeMetadata = await sb.files.write('/home/user/meta.txt', 'with metadata', { metadata: { owner: 'compat' } })
    obs.readText = await sb.files.read('/home/user/hello.txt')
    check(obs.readText === 'Hello, world\n', 'read text')
    obs.readBytes = Array.from(await sb.files.read('/home/user/notes/relative.bin', { format: 'bytes' }))
    check(JSON.stringify(obs.readBytes) === '[0,1,2,255]', 'read bytes of a relative path')
    obs.readBlob = await (await sb.files.read('/home/user/multi/a.txt', { format: 'blob' })).text()
    const stream = await sb.files.read('/home/user/stream.txt', { format: 'stream' })
    obs.readStream = await new Response(stream).text()
    check(obs.readStream === 'from a stream', 'stream upload and download')
    obs.readGzip = await sb.files.read('/home/user/gz.txt', { gzip: true })
    check(obs.readGzip === 'compressed upload', 'gzip upload+download')
    obs.list = (await sb.files.list('/home/user')).map(entry)
    obs.listDepth2Paths = (await sb.files.list('/home/user', { depth: 2 })).map((e) => e.path)
    check(obs.listDepth2Paths.includes('/home/user/multi/a.txt'), 'depth 2 lists nested files')
    obs.existsYes = await sb.files.exists('/home/user/hello.txt')
    obs.existsNo = await sb.files.exists('/home/user/nope.txt')
    check(obs.existsYes === true && obs.existsNo === false, 'exists')
    obs.getInfo = entry(await sb.files.getInfo('/home/user/hello.txt'))
    obs.getInfoDir = entry(await sb.files.getInfo('/home/user/multi'))
    obs.getInfoMetadata = (await sb.files.getInfo('/home/user/meta.txt')).metadata
    check(JSON.stringify(obs.getInfoMetadata) === '{"owner":"compat"}', 'upload metadata comes back on getInfo')
    obs.makeDirNew = await sb.files.makeDir('/home/user/newdir/sub')
    obs.makeDirExisting = await sb.files.makeDir('/home/user/newdir/sub')
    check(obs.makeDirNew === true && obs.makeDirExisting === false, 'makeDir true then false')
    obs.rename = entry(await sb.files.rename('/home/user/hello.txt', '/home/user/newdir/hello2.txt'))
    check((await sb.files.read('/home/user/newdir/hello2.txt')) === 'Hello, world\n', 'renamed file readable')
    await sb.commands.run('ln -s /home/user/newdir/hello2.txt /home/user/link.txt')
    obs.symlinkInfo = entry(await sb.files.getInfo('/home/user/link.txt'))
    await sb.files.remove('/home/user/newdir')
    check(!(await sb.files.exists('/home/user/newdir')), 'remove dir recursively')
    obs.readMissing = await expectError(() => sb.files.read('/home/user/missing.txt'), e2b.FileNotFoundError, e2b.NotFoundError)
    obs.readDir = await expectError(() => sb.files.read('/home/user/multi'), e2b.SandboxError)
    obs.listMissing = await expectError(() => sb.files.list('/home/user/missing'), e2b.NotFoundError)
    obs.getInfoMissing = await expectError(() => sb.files.getInfo('/home/user/missing'), e2b.NotFoundError)
    obs.renameMissing = await expectError(() => sb.files.rename('/home/user/missing', '/home/user/x'), e2b.NotFoundError)
    obs.removeMissing = await expectError(() => sb.files.remove('/home/user/missing'), e2b.NotFoundError)
    const url = await sb.downloadUrl('/home/user/multi/a.txt')
    obs.downloadUrl = url
    const res = await fetch(url, { headers: { 'E2b-Sandbox-Id': sb.sandboxId } })
    obs.downloadUrlFetch = { status: res.status, body: await res.text() }
    check(obs.downloadUrlFetch.status === 200 && obs.downloadUrlFetch.body === 'A', 'signed download URL works')
  } finally {
    await sb.kill()
  }
  return obs
}

async function watch() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    await sb.files.makeDir('/home/user/watched')
    const events = []
    const wh = await sb.files.watchDir('/home/user/watched', (e) => events.push(e))
    await sb.files.write('/home/user/watched/f.txt', '1')
    await sb.commands.run('echo more >> /home/user/watched/f.txt; chmod 600 /home/user/watched/f.txt')
    await sb.files.rename('/home/user/watched/f.txt', '/home/user/watched/g.txt')
    await sb.files.remove('/home/user/watched/g.txt')
    await sleep(400)
    await wh.stop()
    obs.events = events.map((e) => ({ name: e.name, type: e.type }))
    const kinds = new Set(events.map((e) => e.type))
    check(['create', 'write', 'rename', 'remove'].every((k) => kinds.has(k)), `watch saw create/write/rename/remove: ${[...kinds]}`)
    const evs2 = []
    let exitErr = 'not called'
    const wr = await sb.files.watchDir('/home/user/watched', (e) => evs2.push(e), {
      recursive: true,
      includeEntry: true,
      onExit: (err) => {
        exitErr = err ? excInfo(err) : null
      },
    })
    await sb.files.write('/home/user/watched/sub/deep.txt', 'x')
    await sleep(400)
    await wr.stop()
    obs.recursiveEvents = evs2.map((e) => ({ name: e.name, type: e.type, entry: e.entry ? entry(e.entry) : undefined }))
    obs.onExitAfterStop = exitErr
    obs.watchMissing = await expectError(() => sb.files.watchDir('/home/user/nope', () => {}), e2b.SandboxError)
    const evs3 = []
    let timeoutExit = 'not called'
    await sb.files.watchDir('/home/user/watched', (e) => evs3.push(e), {
      timeoutMs: 1000,
      onExit: (err) => {
        timeoutExit = err ? excInfo(err) : null
      },
    })
    await sleep(1600)
    obs.watchTimeoutOnExit = timeoutExit
  } finally {
    await sb.kill()
  }
  return obs
}

async function pty() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    const chunks = []
    const h = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(Buffer.from(d)), envs: { PS1: '$ ' } })
    obs.pid = h.pid
    await sb.pty.resize(h.pid, { cols: 100, rows: 40 })
    await sb.pty.sendInput(h.pid, new TextEncoder().encode('stty size; exit 7\n'))
    try {
      await h.wait()
    } catch (e) {
      obs.exitCode = e.exitCode
    }
    const out = Buffer.concat(chunks).toString()
    obs.ptyOutput = out.slice(-400)
    check(out.includes('40 100'), 'resize reached the terminal')
    const h2 = await sb.pty.create({ cols: 80, rows: 24, onData: () => {} })
    obs.ptyKill = await sb.pty.kill(h2.pid)
  } finally {
    await sb.kill()
  }
  return obs
}

async function errors() {
  const obs = {}
  obs.badKeyCreate = await expectError(() => Sandbox.create(TEMPLATE, { apiKey: 'e2b_wrong' }), e2b.AuthenticationError)
  obs.badKeyList = await expectError(() => Sandbox.list({ apiKey: 'e2b_wrong' }).nextItems(), e2b.AuthenticationError)
  obs.connectUnknown = await expectError(() => Sandbox.connect('doesnotexist0000'), e2b.NotFoundError)
  obs.getInfoUnknown = await expectError(() => Sandbox.getInfo('doesnotexist0000'), e2b.NotFoundError)
  obs.setTimeoutUnknown = await expectError(() => Sandbox.setTimeout('doesnotexist0000', 30_000), e2b.NotFoundError)
  obs.pauseUnknown = await expectError(() => Sandbox.pause('doesnotexist0000'), e2b.NotFoundError)
  obs.forkUnknown = await expectError(() => Sandbox.fork('doesnotexist0000'), e2b.NotFoundError)
  obs.createUnknownTemplate = await expectError(() => Sandbox.create('missing-template'), e2b.SandboxError)
  obs.killUnknown = await Sandbox.kill('doesnotexist0000')
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 2_000 })
  obs.alive = (await sb.commands.run('echo alive')).stdout
  await sleep(3500)
  obs.runAfterTimeout = await expectError(() => sb.commands.run('true'), e2b.SandboxError)
  obs.readAfterTimeout = await expectError(() => sb.files.read('/etc/hostname'), e2b.TimeoutError)
  obs.writeAfterTimeout = await expectError(() => sb.files.write('/tmp/x', 'x'), e2b.TimeoutError)
  obs.listAfterTimeout = await expectError(() => sb.files.list('/'), e2b.TimeoutError)
  obs.isRunningAfterTimeout = await sb.isRunning()
  const sb2 = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000 })
  try {
    const h = await sb2.commands.run('sleep 30', { background: true })
    await Sandbox.kill(sb2.sandboxId)
    obs.waitWhenKilled = await expectError(() => h.wait(), e2b.SandboxError)
  } finally {
    await sb2.kill()
  }
  return obs
}

// Long quiet streams: envd sends keepalive events (every Keepalive-Ping-Interval
// seconds, 50 by default; the recorder is started with --keepalive 1 for this one).
async function keepalive() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000 })
  try {
    const r = await sb.commands.run('sleep 2.5; echo done')
    obs.stdout = r.stdout
    check(r.stdout === 'done\n', 'output after a quiet spell')
    const events = []
    const wh = await sb.files.watchDir('/home/user', (e) => events.push(e))
    await sleep(2500)
    await sb.files.write('/home/user/after-quiet.txt', 'x')
    await sleep(300)
    await wh.stop()
    obs.watchEvents = events.map((e) => ({ name: e.name, type: e.type }))
    check(events.some((e) => e.name === 'after-quiet.txt'), 'watch event after a quiet spell')
  } finally {
    await sb.kill()
  }
  return obs
}

// Templates ------------------------------------------------------------------------------

// Set by record.sh: the recorder fakes builds (it runs no step), so only the wire is
// checked there, not what a step did inside the sandbox.
const RECORDING = process.env.SCENARIO_RECORDING === '1'

function templateContext() {
  const dir = fs.mkdtempSync(path.join(process.env.TMPDIR || '/tmp', 'e2b-tpl-'))
  fs.mkdirSync(path.join(dir, 'data', 'sub'), { recursive: true })
  fs.writeFileSync(path.join(dir, 'data', 'hello.txt'), 'hello from the context\n')
  fs.writeFileSync(path.join(dir, 'data', 'sub', 'deep.txt'), 'deep\n')
  return dir
}

const asRoot = async (sb, cmd) => (await sb.commands.run(cmd, { user: 'root' })).stdout

async function templates() {
  const { Template, BuildError, waitForFile } = e2b
  const obs = {}
  const ctx = templateContext()
  const name = 'compat-js-builder'
  const builder = Template({ fileContextPath: ctx })
    .fromTemplate(TEMPLATE)
    .copy('data/hello.txt', '/home/user/hello.txt')
    .copy('data/sub', '/opt/sub/')
    .setEnvs({ GREETING: 'hi there' })
    .runCmd('echo built-$GREETING > /opt/built.txt')
    .setWorkdir('/opt')
    .setUser('user')
    .setStartCmd('echo started > /tmp/started; sleep infinity', waitForFile('/tmp/started'))
  const logs = []
  const info = await Template.build(builder, name, { cpuCount: 1, memoryMB: 1024, onBuildLogs: (e) => logs.push(e) })
  obs.build = { templateId: info.templateId, name: info.name, logCount: logs.length }
  check(info.name === name, 'the build answers the template name')
  check((await Template.exists(name)) === true, 'the built template exists')
  check((await Template.exists('compat-js-never-built')) === false, 'an unknown template does not')
  let sb = await Sandbox.create(name, { timeoutMs: 120_000 })
  try {
    if (!RECORDING) {
      check((await asRoot(sb, 'cat /home/user/hello.txt')) === 'hello from the context\n', 'the COPY of a file')
      check((await asRoot(sb, 'cat /opt/sub/deep.txt')) === 'deep\n', 'the COPY of a directory')
      check((await sb.commands.run('echo $GREETING')).stdout === 'hi there\n', 'the ENV reaches commands')
      check((await asRoot(sb, 'cat /opt/built.txt')) === 'built-hi there\n', "the RUN's effect, with the ENV")
      check((await asRoot(sb, 'cat /tmp/started')) === 'started\n', 'the start command ran before create answered')
      const sinfo = await sb.getInfo()
      check(sinfo.memoryMB === 1024, `the template's memoryMB: ${sinfo.memoryMB}`)
    }
  } finally {
    await sb.kill()
  }
  const again = []
  await Template.build(builder, name, { onBuildLogs: (e) => again.push(e) })
  const messages = again.map((e) => String(e.message))
  obs.secondBuildLogs = messages.slice(0, 30)
  check(messages.some((m) => m.includes('already cached')), 'the second build skips the upload')
  if (!RECORDING) check(messages.some((m) => m.includes('(cached)')), 'the second build reuses cached steps')

  const dockerfile = `FROM ${TEMPLATE}\nCOPY data/hello.txt /srv/hello.txt\nENV MODE=dockerfile\nRUN echo $MODE > /srv/mode.txt\n`
  await Template.build(Template({ fileContextPath: ctx }).fromDockerfile(dockerfile), 'compat-js-dockerfile')
  sb = await Sandbox.create('compat-js-dockerfile', { timeoutMs: 120_000 })
  try {
    if (!RECORDING) {
      check((await asRoot(sb, 'cat /srv/hello.txt')) === 'hello from the context\n', 'Dockerfile COPY')
      check((await asRoot(sb, 'cat /srv/mode.txt')) === 'dockerfile\n', 'Dockerfile RUN with its ENV')
      check((await sb.commands.run('echo $MODE')).stdout === 'dockerfile\n', 'Dockerfile ENV')
    }
  } finally {
    await sb.kill()
  }

  const failing = Template().fromTemplate(TEMPLATE).runCmd('echo fine').runCmd('echo about to fail; exit 3')
  obs.failing = await expectError(() => Template.build(failing, 'compat-js-fails'), BuildError)
  check(obs.failing.message.includes('step 2'), `the error names the failing step: ${obs.failing.message}`)
  if (!RECORDING) {
    // sandfork has no template tags: a name:tag build is refused, naming them.
    obs.tags = await expectError(() => Template.build(failing, 'compat-js-fails:v1'), BuildError)
    check(obs.tags.message.includes('template tags'), 'tags are refused by name')
  }
  return obs
}

const SCENARIOS = { lifecycle, create_options, list_pagination, pause_resume, snapshot_fork, commands, background, files, watch, pty, errors, keepalive, templates }

async function main(argv) {
  if (argv.includes('--list')) {
    console.log(Object.keys(SCENARIOS).join('\n'))
    return 0
  }
  const names = argv.filter((a) => !a.startsWith('-'))
  const run = names.length ? names : Object.keys(SCENARIOS)
  let failed = 0
  const outDir = process.env.SCENARIO_OUT
  let version = null
  try {
    const dir = process.env.E2B_JS_DIR || '/var/cache/sandfork/compat/e2b-js'
    version = JSON.parse(fs.readFileSync(path.join(dir, 'node_modules/e2b/package.json'))).version
  } catch {}
  for (const name of run) {
    const rec = { scenario: name, sdk: 'js', sdkVersion: version }
    const t0 = Date.now()
    try {
      rec.observations = await SCENARIOS[name]()
      rec.ok = true
    } catch (e) {
      failed++
      rec.ok = false
      rec.error = excInfo(e)
      rec.stack = e?.stack
    }
    rec.seconds = (Date.now() - t0) / 1000
    const line = JSON.stringify(rec, (k, v) => (typeof v === 'bigint' ? v.toString() : v))
    console.log(line)
    if (outDir) fs.writeFileSync(path.join(outDir, `${name}.sdk.json`), JSON.stringify(JSON.parse(line), null, 1) + '\n')
  }
  console.log(`${run.length - failed} passed, ${failed} failed`)
  return failed ? 1 : 0
}

process.exitCode = await main(process.argv.slice(2))
