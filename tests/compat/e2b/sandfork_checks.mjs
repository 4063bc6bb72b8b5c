#!/usr/bin/env node
// What the recorded scenarios cannot show against sandfork, driven through the unmodified
// E2B JS SDK (same environment and output as scenarios.mjs): the steps of create_options
// and files after the feature sandfork lacks (and that lack as the SDK's error), and the
// fork pattern: a memory snapshot of a sandbox holding warm in-memory state, 5 sandboxes
// restored from it and 5 forks, each proven warm.
//
// Usage:  node sandfork_checks.mjs [SCENARIO ...]   (none: all)

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

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}

const excInfo = (e) => ({ type: e?.constructor?.name, message: String(e?.message ?? e).slice(0, 500) })

async function expectError(fn, ...types) {
  let res
  try {
    res = await fn()
  } catch (e) {
    if (types.length && !types.some((t) => e instanceof t)) throw new Error(`expected ${types.map((t) => t.name)}, got ${e?.constructor?.name}: ${e?.message}`)
    return excInfo(e)
  }
  throw new Error(`expected ${types.map((t) => t.name)}, got ${JSON.stringify(res)}`)
}

const WARM = [
  'import os, random, signal, time',
  "v = '%016x' % random.getrandbits(64)",
  'def dump(*_):',
  "    open('/tmp/warm.out', 'w').write(v)",
  'signal.signal(signal.SIGUSR1, dump)',
  "open('/tmp/warm.pid', 'w').write(str(os.getpid()))",
  'while True:',
  '    time.sleep(0.05)',
  '',
].join('\n')

async function warmValue(sb) {
  await sb.commands.run('rm -f /tmp/warm.out; kill -USR1 $(cat /tmp/warm.pid)')
  for (let i = 0; i < 100; i++) {
    const r = await sb.commands.run('cat /tmp/warm.out 2>/dev/null || true')
    if (r.stdout) return r.stdout
    await sleep(50)
  }
  return null
}

async function create_options_rest() {
  const obs = {}
  obs.maskRequestHost = await expectError(() => Sandbox.create(TEMPLATE, { timeoutMs: 60_000, network: { maskRequestHost: 'localhost:${PORT}' } }), e2b.SandboxError)
  check(obs.maskRequestHost.message.includes('maskRequestHost'), 'the error names the feature')
  const a = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000, allowInternetAccess: false, metadata: { case: 'create_options' } })
  const b = await Sandbox.create(TEMPLATE, {
    timeoutMs: 60_000,
    network: { allowOut: ['1.1.1.1', 'example.com'], denyOut: ['0.0.0.0/0'], allowPublicTraffic: false },
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  try {
    const ai = await a.getInfo()
    const bi = await b.getInfo()
    obs.aInfo = { allowInternetAccess: ai.allowInternetAccess, network: ai.network }
    obs.bInfo = { network: bi.network, lifecycle: bi.lifecycle }
    check(ai.allowInternetAccess === false, 'allowInternetAccess false is reported')
    check(bi.lifecycle?.onTimeout === 'pause', `lifecycle onTimeout pause: ${JSON.stringify(bi.lifecycle)}`)
    await b.updateNetwork({ allowOut: ['8.8.8.8'], denyOut: ['10.0.0.0/8'] })
    await Sandbox.updateNetwork(a.sandboxId, { allowInternetAccess: true })
    check((await a.getInfo()).allowInternetAccess === true, 'updateNetwork opened a')
    obs.downloadUrl = await b.downloadUrl('/home/user/x.txt')
    check((await b.commands.run('echo ok')).stdout === 'ok\n', 'commands run')
  } finally {
    await a.kill()
    await b.kill()
  }
  return obs
}

async function files_rest() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    await sb.files.write('/home/user/hello.txt', 'Hello, world\n')
    await sb.files.write('/home/user/blob.txt', new Blob(['from a blob']))
    await sb.files.write('/home/user/stream.txt', new Blob(['from a stream']).stream())
    await sb.files.write('/home/user/gz.txt', 'compressed upload', { gzip: true })
    obs.metadata = await expectError(() => sb.files.write('/home/user/meta.txt', 'x', { metadata: { owner: 'compat' } }), e2b.SandboxError)
    check(obs.metadata.message.includes('metadata'), 'the error names upload metadata')
    check((await new Response(await sb.files.read('/home/user/stream.txt', { format: 'stream' })).text()) === 'from a stream', 'stream')
    check((await sb.files.read('/home/user/gz.txt', { gzip: true })) === 'compressed upload', 'gzip')
    check((await sb.files.read('/home/user/blob.txt')) === 'from a blob', 'blob')
    const info = await sb.files.getInfo('/home/user/hello.txt')
    obs.owner = [info.owner, info.group, info.permissions]
    check(info.owner === 'user', `uploads belong to the default user: ${info.owner}`)
    check((await sb.files.makeDir('/home/user/d/e')) === true && (await sb.files.makeDir('/home/user/d/e')) === false, 'makeDir')
    const moved = await sb.files.rename('/home/user/hello.txt', '/home/user/d/h.txt')
    check(moved.path === '/home/user/d/h.txt', 'rename')
    await sb.files.remove('/home/user/d')
    check(!(await sb.files.exists('/home/user/d')), 'remove')
    await expectError(() => sb.files.read('/home/user/missing.txt'), e2b.NotFoundError)
    const res = await fetch(await sb.downloadUrl('/home/user/blob.txt'), { headers: { 'E2b-Sandbox-Id': sb.sandboxId } })
    check(res.status === 200 && (await res.text()) === 'from a blob', 'signed download URL')
  } finally {
    await sb.kill()
  }
  return obs
}

async function fork_pattern() {
  const obs = {}
  const sb = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000 })
  const made = []
  try {
    await sb.files.write('/tmp/warm.py', WARM)
    const h = await sb.commands.run('python3 /tmp/warm.py', { background: true })
    for (let i = 0; i < 200; i++) {
      if ((await sb.commands.run('cat /tmp/warm.pid 2>/dev/null || true')).stdout) break
      await sleep(50)
    }
    const value = await warmValue(sb)
    check(value && value.length === 16, `the warm process started: ${value}`)
    let t0 = Date.now()
    const snap = await sb.createSnapshot({ name: 'e2b-fork-pattern-js' })
    obs.snapshotMs = Date.now() - t0
    t0 = Date.now()
    for (let i = 0; i < 5; i++) made.push(await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 }))
    obs.restoreMs = Date.now() - t0
    t0 = Date.now()
    const forks = await sb.fork({ count: 5, timeoutMs: 120_000 })
    obs.forkMs = Date.now() - t0
    made.push(...forks.filter((f) => f instanceof Sandbox))
    check(forks.every((f) => f instanceof Sandbox), `5 forks: ${JSON.stringify(forks.filter((f) => !(f instanceof Sandbox)).map(excInfo))}`)
    check(new Set(made.map((s) => s.sandboxId)).size === 10, '10 distinct children')
    const values = []
    for (const s of made) values.push(await warmValue(s))
    obs.warmValues = values
    check(values.every((v) => v === value), `every child holds the parent's in-memory value: ${values} vs ${value}`)
    for (const s of made) check((await s.commands.list()).some((p) => p.pid === h.pid), 'the warm process runs in every child')
    check((await warmValue(sb)) === value, 'the parent is still warm')
    obs.deleteSnapshot = await Sandbox.deleteSnapshot(snap.snapshotId)
  } finally {
    for (const m of made) await m.kill()
    await sb.kill()
  }
  return obs
}

const SCENARIOS = { create_options_rest, files_rest, fork_pattern }

async function main(argv) {
  const names = argv.filter((a) => !a.startsWith('-'))
  const run = names.length ? names : Object.keys(SCENARIOS)
  let failed = 0
  for (const name of run) {
    const rec = { scenario: name, sdk: 'js' }
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
    console.log(JSON.stringify(rec))
  }
  console.log(`${run.length - failed} passed, ${failed} failed`)
  return failed ? 1 : 0
}

process.exitCode = await main(process.argv.slice(2))
