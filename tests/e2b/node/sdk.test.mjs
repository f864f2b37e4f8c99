// The unchanged E2B Node SDKs (`e2b`, `@e2b/code-interpreter` from npm)
// against a live forkbox server. tests/e2b/test_node.py starts the server
// and runs this file with E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and
// E2B_API_KEY pointing at it; nothing here is faked.
import assert from 'node:assert/strict'
import http from 'node:http'
import { test } from 'node:test'
import { CommandExitError, NotFoundError, Sandbox } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

// GET http://{host}{path} with the name {host} kept in the Host header but
// dialled on loopback, as a resolver that maps *.localhost there would
// (glibc here does not).
function getByHost(host, path) {
  const [name, port] = host.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ host: name, port, path, lookup: (_h, opts, cb) => (opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)) }, (res) => {
      let data = ''
      res.on('data', (c) => { data += c })
      res.on('end', () => (res.statusCode === 200 ? resolve(data) : reject(new Error(`${res.statusCode} ${data}`))))
    })
    req.on('error', reject)
  })
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function withSandbox(opts, body, Kind = Sandbox) {
  const sb = await Kind.create({ timeoutMs: 120_000, ...opts })
  try {
    await body(sb)
  } finally {
    await sb.kill()
  }
}

test('commands: output, exit codes, users, env, background, stdin, connect', () =>
  withSandbox({ envs: { FOO: 'bar' }, metadata: { suite: 'node' } }, async (sb) => {
    const r = await sb.commands.run('echo hi; echo err >&2; echo $FOO; whoami; pwd')
    assert.deepEqual([r.stdout, r.stderr, r.exitCode], ['hi\nbar\nuser\n/home/user\n', 'err\n', 0])
    assert.equal((await sb.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
    assert.equal((await sb.commands.run('echo $X; pwd', { envs: { X: 'y' }, cwd: '/tmp' })).stdout, 'y\n/tmp\n')
    await assert.rejects(sb.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)

    const lines = []
    await sb.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (l) => lines.push(l) })
    assert.equal(lines.join(''), '1\n2\n3\n')

    // A background command, found by list, reattached by pid, then killed.
    const bg = await sb.commands.run('echo started; sleep 60', { background: true })
    assert.ok((await sb.commands.list()).some((p) => p.pid === bg.pid))
    const seen = []
    const again = await sb.commands.connect(bg.pid, { onStdout: (l) => seen.push(l) })
    assert.equal(again.pid, bg.pid)
    assert.ok(await sb.commands.kill(bg.pid))
    await assert.rejects(again.wait(), (e) => e instanceof CommandExitError)
    assert.ok(!(await sb.commands.kill(bg.pid)), 'a second kill finds nothing')

    // stdin: what is sent reaches the process; closing it ends `cat`.
    const cat = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(cat.pid, 'fed through stdin\n')
    await sb.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'fed through stdin\n')

    // The call's deadline ends the process it started.
    await assert.rejects(sb.commands.run('sleep 30', { timeoutMs: 1000 }))
    const sleeping = async () => (await sb.commands.list()).some((p) => p.args.join(' ').includes('sleep 30'))
    for (let i = 0; i < 50 && (await sleeping()); i++) await sleep(100)
    assert.ok(!(await sleeping()), 'the deadline killed it')
  }))

test('pty: input, resize and kill', () =>
  withSandbox({}, async (sb) => {
    let out = ''
    const dec = new TextDecoder()
    const pty = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo marker-$((6*7))\n'))
    for (let i = 0; i < 100 && !out.includes('marker-42'); i++) await sleep(50)
    assert.match(out, /24 80/)
    assert.match(out, /marker-42/)
    await sb.pty.resize(pty.pid, { cols: 100, rows: 30 })
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
    for (let i = 0; i < 100 && !out.includes('30 100'); i++) await sleep(50)
    assert.match(out, /30 100/)
    assert.ok(await sb.pty.kill(pty.pid))
  }))

test('files: write, read, list, stat, rename, remove, gzip, watch, ownership', () =>
  withSandbox({}, async (sb) => {
    const info = await sb.files.write('notes/a.txt', 'alpha')
    assert.equal(info.path, '/home/user/notes/a.txt')
    assert.equal(await sb.files.read('notes/a.txt'), 'alpha')
    assert.equal((await sb.commands.run('stat -c %U /home/user/notes/a.txt')).stdout, 'user\n')
    await sb.files.write([{ path: '/tmp/m1', data: 'one' }, { path: '/tmp/m2', data: 'two' }])
    assert.equal((await sb.commands.run('cat /tmp/m1 /tmp/m2')).stdout, 'onetwo')

    // gzip both ways, with bytes that are not text.
    const blob = new Uint8Array(200_000).map((_, i) => (i * 7919) % 256)
    await sb.files.write('bin.dat', blob, { gzip: true })
    const back = await sb.files.read('bin.dat', { format: 'bytes', gzip: true })
    assert.deepEqual(Buffer.from(back), Buffer.from(blob))
    assert.equal((await sb.commands.run('stat -c %s bin.dat')).stdout, '200000\n')

    assert.ok(await sb.files.makeDir('deep/er'))
    assert.ok(!(await sb.files.makeDir('deep/er')), 'it already exists')
    await sb.files.write('deep/er/f', 'x')
    const names = (await sb.files.list('deep', { depth: 2 })).map((e) => e.path).sort()
    assert.deepEqual(names, ['/home/user/deep/er', '/home/user/deep/er/f'])
    const st = await sb.files.getInfo('deep/er/f')
    assert.deepEqual([st.type, st.size, st.owner], ['file', 1, 'user'])
    const moved = await sb.files.rename('deep/er/f', 'deep/g')
    assert.equal(moved.path, '/home/user/deep/g')
    await sb.files.remove('deep')
    assert.ok(!(await sb.files.exists('deep')))
    await assert.rejects(sb.files.read('no/such'), (e) => e instanceof NotFoundError)

    const events = []
    const w = await sb.files.watchDir('/tmp', (e) => events.push(e), { recursive: true })
    await sleep(300)
    await sb.files.write('/tmp/watched.txt', 'w')
    for (let i = 0; i < 100 && !events.some((e) => e.name === 'watched.txt'); i++) await sleep(50)
    await w.stop()
    assert.ok(events.some((e) => e.name === 'watched.txt'), JSON.stringify(events))
  }))

test('signed URLs on a secure sandbox', () =>
  withSandbox({ secure: true }, async (sb) => {
    const up = await sb.uploadUrl('/tmp/signed.txt', { useSignatureExpiration: 60_000 })
    const form = new FormData()
    form.append('file', new Blob(['signed upload']), 'signed.txt')
    assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200)
    const down = await sb.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60_000 })
    const r = await fetch(down)
    assert.equal(await r.text(), 'signed upload')
    // The signature is for that path and that sandbox only.
    assert.equal((await fetch(down.replace('signed.txt', 'other.txt'))).status, 401)
  }))

test('lifecycle: info, list, metrics, timeout, pause and connect, fork, snapshots', () =>
  withSandbox({ metadata: { suite: 'node-life' } }, async (sb) => {
    const info = await sb.getInfo()
    assert.equal(info.sandboxId, sb.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.deepEqual(info.metadata, { suite: 'node-life' })
    assert.equal(info.state, 'running')
    const found = await Sandbox.list({ query: { metadata: { suite: 'node-life' } } }).nextItems()
    assert.deepEqual(found.map((s) => s.sandboxId), [sb.sandboxId])

    await sb.setTimeout(600_000)
    const later = await sb.getInfo()
    assert.ok(later.endAt.getTime() - Date.now() > 500_000, `endAt ${later.endAt}`)
    const metrics = await sb.getMetrics()
    assert.ok(metrics.length >= 1 && metrics[0].memUsed > 0)

    await sb.commands.run('echo kept > /tmp/state')
    assert.ok(await sb.pause())
    assert.equal((await sb.getInfo()).state, 'paused')
    await sb.connect()
    assert.equal((await sb.commands.run('cat /tmp/state')).stdout, 'kept\n')

    const forks = await sb.fork({ count: 2 })
    try {
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, String(f))
        assert.notEqual(f.sandboxId, sb.sandboxId)
        assert.equal((await f.commands.run('cat /tmp/state')).stdout, 'kept\n')
      }
      await forks[0].commands.run('echo mine > /tmp/state')
      assert.equal((await forks[1].commands.run('cat /tmp/state')).stdout, 'kept\n', 'forks are isolated')
    } finally {
      for (const f of forks) if (f instanceof Sandbox) await f.kill()
    }

    const snap = await sb.createSnapshot()
    const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
    try {
      assert.equal((await fromSnap.commands.run('cat /tmp/state')).stdout, 'kept\n')
    } finally {
      await fromSnap.kill()
    }
    assert.ok(await Sandbox.deleteSnapshot(snap.snapshotId))
  }))

test('ports: getHost routes to a server inside the sandbox', () =>
  withSandbox({}, async (sb) => {
    await sb.files.write('/tmp/www/index.html', 'served from the sandbox')
    await sb.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
    const host = sb.getHost(8000)
    assert.equal(host, `8000-${sb.sandboxId}.${process.env.E2B_DOMAIN}`)
    let body = ''
    for (let i = 0; i < 100 && !body; i++) {
      body = await getByHost(host, '/index.html').catch(() => '')
      if (!body) await sleep(100)
    }
    assert.equal(body, 'served from the sandbox')
  }))

test('code interpreter: results, errors, streaming, env, contexts, charts', () =>
  withSandbox({}, async (sb) => {
    const out = []
    let ex = await sb.runCode("x = 41\nprint('out')\nx + 1", { onStdout: (m) => out.push(m.line) })
    assert.deepEqual([ex.text, ex.logs.stdout, out], ['42', ['out\n'], ['out\n']])
    assert.equal((await sb.runCode('x')).text, '41', 'state persists between calls')
    ex = await sb.runCode('1/0')
    assert.deepEqual([ex.error.name, ex.error.value], ['ZeroDivisionError', 'division by zero'])
    assert.equal((await sb.runCode("import os; os.environ['K']", { envs: { K: 'v' } })).text, "'v'")
    assert.equal((await sb.runCode("import os; os.environ.get('K')")).text, undefined)
    ex = await sb.runCode("class H:\n    def _repr_html_(self): return '<b>x</b>'\nH()")
    assert.equal(ex.results[0].html, '<b>x</b>')
    const ctx = await sb.createCodeContext({ cwd: '/tmp' })
    await sb.runCode('y = 5', { context: ctx })
    assert.equal((await sb.runCode('import os; (y, os.getcwd())', { context: ctx })).text, "(5, '/tmp')")
    assert.equal((await sb.runCode("'y' in globals()")).text, 'False', 'contexts do not share variables')
    assert.ok((await sb.listCodeContexts()).some((c) => c.id === ctx.id))
    await sb.restartCodeContext(ctx)
    assert.equal((await sb.runCode("'y' in globals()", { context: ctx })).text, 'False', 'a restart clears it')
    await sb.removeCodeContext(ctx)
    ex = await sb.runCode('import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()')
    assert.ok(ex.results.some((r) => r.png))
    assert.equal((await sb.runCode('echo $((2+3))', { language: 'bash' })).logs.stdout.join(''), '5\n')
  }, CodeSandbox))
