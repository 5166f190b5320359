// The dashboard in a real browser, against a real coordinator, agent and jobs:
//
//   node tests/browser/dashboard_test.mjs <troupe binary> <output dir>
//
//   1. a coordinator (--http) and an agent with cpu:2, in a fresh temp dir
//   2. a dp=2 job that checkpoints every 5 steps and may restart 3 times
//   3. the page, opened as /?token=T, keeps T in sessionStorage and drops it from the address;
//      the jobs table lists the job; its link opens the job page; the loss chart grows; an
//      answer whose last_seq is below the page's newest seq (a coordinator with an older clock)
//      has the page ask at once for all the points, and the chart never goes blank meanwhile
//   4. a worker, by the pid the page's grid shows, is SIGKILLed: the page shows the failure
//      (worker_killed), the next generation running, and the chart grows again by points of
//      that generation; no two labels of a chart's step axis overlap
//   5. a short traced 1x2x1 job succeeds, `troupe trace merge` merges it, the trace view draws it
//   6. everything stops; the screenshots of 3-5 go to the output dir
//
// Any console error of the page (console.error, an uncaught exception, a browser error log)
// fails the test. Every wait has a deadline only as a guard against a hang: no duration is
// asserted. On failure it prints the step, the page's console errors and the tails of the
// coordinator's and agent's output, kills every child and exits 1.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { Browser, findChromium } from './cdp.mjs';

if (process.argv.length !== 4) {
  console.error('usage: node dashboard_test.mjs <troupe binary> <output dir>');
  process.exit(2);
}
const [troupe, outDir] = process.argv.slice(2).map((p) => path.resolve(p));  // children run in the temp dir
const SOURCE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const DEADLINE_MS = 180000;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'troupe_browser_'));
const children = new Map();  // name -> {proc, out, err}
const consoleErrors = [];
let browser = null;
let step = 'start';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (msg) => console.log(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

// ---------------------------------------------------------------- processes

// A long-running troupe process; its stdout and stderr go to files in the temp dir.
function start(name, args) {
  const out = path.join(tmp, name + '.out'), err = path.join(tmp, name + '.err');
  const proc = spawn(troupe, args, { cwd: tmp, stdio: ['ignore', fs.openSync(out, 'w'), fs.openSync(err, 'w')] });
  proc.exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve(signal ?? code)));
  proc.once('exit', (code, signal) => { proc.gone = true; proc.status = signal ?? code; });
  children.set(name, { proc, out, err });
  return proc;
}

// A short troupe command: its stdout, or an Error with everything it printed.
function troupeCmd(args, timeoutMs = 120000) {
  return new Promise((resolve, reject) => {
    const p = spawn(troupe, args, { cwd: tmp, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('error', reject);
    p.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`troupe ${args.join(' ')} exited ${signal ?? code}\n${out}${err}`));
    });
  });
}

function tail(file, lines = 40) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch (e) {
    return `(${e.message})`;
  }
}

// Polls fn every 250 ms until it returns something truthy, which it returns. A child that
// died meanwhile, or the deadline, fails the wait with what fn last saw.
async function waitFor(what, fn, ms = DEADLINE_MS) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    for (const [name, c] of children)
      if (c.proc.gone) throw new Error(`${name} exited (${c.proc.status}) while waiting for ${what}`);
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e.message;
    }
    if (Date.now() > end) throw new Error(`no ${what} within ${ms / 1000} s (last seen: ${JSON.stringify(last)})`);
    await sleep(250);
  }
}

// ---------------------------------------------------------------- the page

function watchConsole(page) {
  page.on('Runtime.consoleAPICalled', (e) => {
    if (e.type === 'error' || e.type === 'assert')
      consoleErrors.push('console.' + e.type + ': ' + e.args.map((a) => a.value ?? a.description ?? a.type).join(' '));
  });
  page.on('Runtime.exceptionThrown', (e) => {
    const d = e.exceptionDetails;
    consoleErrors.push('uncaught: ' + (d.exception?.description ?? d.text) + ` (${d.url ?? ''}:${d.lineNumber})`);
  });
  page.on('Log.entryAdded', ({ entry }) => {
    if (entry.level === 'error')
      consoleErrors.push(`log (${entry.source}): ${entry.text} ${entry.url ?? ''}`);
  });
}
function checkConsole() {
  if (consoleErrors.length) throw new Error('the page logged errors:\n  ' + consoleErrors.join('\n  '));
}

// A real click (press and release) at the middle of the first element matching selector.
async function click(page, selector) {
  const box = await page.eval(`(() => {
    const e = document.querySelector(${JSON.stringify(selector)});
    if (!e) return null;
    e.scrollIntoView({ block: 'center' });
    const r = e.getBoundingClientRect();
    return { x: r.left + r.width / 2, y: r.top + r.height / 2 };
  })()`);
  if (!box) throw new Error('nothing to click at ' + selector);
  await page.send('Input.dispatchMouseEvent', { type: 'mouseMoved', x: box.x, y: box.y });
  for (const type of ['mousePressed', 'mouseReleased'])
    await page.send('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: 1 });
}

// Saves the whole page down to the end of its content (below the viewport too) as PNG.
async function screenshot(page, name) {
  const { cssContentSize: s } = await page.send('Page.getLayoutMetrics');
  const bottom = await page.eval(`Math.ceil(document.querySelector('main').getBoundingClientRect().bottom + scrollY)`);
  const clip = { x: 0, y: 0, width: Math.ceil(s.width), height: Math.min(Math.ceil(s.height), bottom + 8), scale: 1 };
  const { data } = await page.send('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true, clip });
  fs.writeFileSync(path.join(outDir, name), Buffer.from(data, 'base64'));
  log(`saved ${path.join(outDir, name)}`);
}

const points = (page, chart) =>
  page.eval(`Number(document.querySelector('#${chart}')?.getAttribute('data-points') ?? -1)`);
const text = (page, selector) =>
  page.eval(`document.querySelector(${JSON.stringify(selector)})?.textContent.trim() ?? null`);
const attr = (page, selector, name) =>
  page.eval(`document.querySelector(${JSON.stringify(selector)})?.getAttribute(${JSON.stringify(name)}) ?? null`);

// The labels along the bottom of a chart (the step axis) that overlap another, as "a/b" pairs.
const overlappingStepLabels = (page, chart) => page.eval(`(() => {
  const svg = document.querySelector('#${chart}'), H = svg.viewBox.baseVal.height;
  const boxes = [...svg.querySelectorAll('text')].filter((t) => Number(t.getAttribute('y')) > H - 20)
      .map((t) => ({ text: t.textContent, b: t.getBBox() })).sort((p, q) => p.b.x - q.b.x);
  const out = [];
  for (let i = 1; i < boxes.length; i++)
    if (boxes[i].b.x < boxes[i - 1].b.x + boxes[i - 1].b.width) out.push(boxes[i - 1].text + '/' + boxes[i].text);
  return out;
})()`);

// ---------------------------------------------------------------- the cluster

function spec(layoutFile, name, steps, extra) {
  let s = fs.readFileSync(path.join(SOURCE, 'configs/layouts', layoutFile), 'utf8');
  s = s.replace(/^name: .*$/m, 'name: ' + name).replace(/^ {2}steps: 10$/m, '  steps: ' + steps);
  const file = path.join(tmp, name + '.yaml');
  fs.writeFileSync(file, s + extra);
  return file;
}

async function main() {
  fs.mkdirSync(outDir, { recursive: true });
  const chromium = findChromium();
  if (!chromium) throw new Error('chromium not found: run scripts/setup.sh (it installs chromium and nodejs)');

  step = '1: start the coordinator';
  const secret = path.join(tmp, 'secret');
  await troupeCmd(['secret', 'init', secret]);
  const readyFile = path.join(tmp, 'ready.json');
  start('coordinator', ['coordinator', '--listen', '127.0.0.1:0', '--api', 'tcp://127.0.0.1:0', '--http', '127.0.0.1:0',
                        '--secret-file', secret, '--runs-dir', path.join(tmp, 'runs'), '--ready-file', readyFile]);
  const ready = await waitFor('ready file', () => fs.existsSync(readyFile) && JSON.parse(fs.readFileSync(readyFile, 'utf8')));
  if (!ready.http) throw new Error('the ready file has no "http": ' + JSON.stringify(ready));
  const base = 'http://' + ready.http;
  const apiArgs = ['--api', ready.api, '--secret-file', secret, '--json'];
  const getJson = async (p) => {
    const r = await fetch(base + p);
    if (!r.ok) throw new Error(`GET ${p}: ${r.status}`);
    return r.json();
  };
  log(`coordinator: agents ${ready.listen}, API ${ready.api}, dashboard ${base}`);

  step = '2: start an agent with cpu:2';
  start('agent', ['agent', '--coordinator', ready.listen, '--devices', 'cpu:2', '--secret-file', secret]);
  await waitFor('the agent in /api/jobs', async () => (await getJson('/api/jobs')).agents?.length > 0);

  step = '3: submit the dp=2 job';
  const trainSpec = spec('tiny_dp2_pp1_tp1.yaml', 'dash-train', 1000000,
                         '\ncheckpoint:\n  every: 5\n  keep: 3\nfault:\n  max_restarts: 3\n');
  const job = JSON.parse(await troupeCmd(['submit', trainSpec, ...apiArgs])).job;
  log(`submitted ${job}`);

  step = '4: the jobs table, the job page, a growing loss chart';
  browser = await Browser.launch({ executable: chromium, userDataDir: path.join(tmp, 'chromium'),
                                   log: (line) => { if (process.env.TROUPE_BROWSER_LOG) console.log('chromium: ' + line); } });
  const page = await browser.newPage();
  watchConsole(page);
  // On loopback the coordinator asks no token, but the page handles one the same way anywhere.
  const token = (await troupeCmd(['secret', 'api-token', secret])).trim();
  await page.send('Page.navigate', { url: base + '/?token=' + encodeURIComponent(token) + '#/' });
  const address = await waitFor('the token out of the address', () => page.eval(`(() => {
    const stored = sessionStorage.getItem('troupe.token');
    return stored && { href: location.href, stored };
  })()`));
  if (address.href !== base + '/#/' || address.stored !== token)
    throw new Error(`after /?token=T the page is at ${address.href}, keeping ${JSON.stringify(address.stored)}`);
  const row = `#jobs-table tr[data-job="${job}"]`;
  await waitFor('the job in the jobs table', () => page.eval(`!!document.querySelector(${JSON.stringify(row + ' a')})`));
  await click(page, row + ' a');
  await waitFor('the job page', () => page.eval(`location.hash === ${JSON.stringify('#/job/' + job)}`));
  const first = await waitFor('3 loss points', async () => { const n = await points(page, 'loss-chart'); return n >= 3 && n; });
  await waitFor(`more than ${first} loss points`, async () => (await points(page, 'loss-chart')) > first);
  await olderCoordinatorAnswers(page, base + '/api/jobs/' + job);
  checkConsole();

  step = '5: a worker killed, the job recovered';
  const workers = await waitFor('two workers with pids in the grid', async () => {
    const w = await page.eval(`[...document.querySelectorAll('#workers .worker[data-rank][data-pid]')]
        .map((e) => ({ rank: Number(e.dataset.rank), pid: Number(e.dataset.pid) })).filter((w) => w.pid > 0)`);
    return w.length === 2 && w;
  });
  const victim = workers.find((w) => w.rank === 1) ?? workers[0];
  const gen = Number(await text(page, '#job-generation')), next = String(gen + 1);
  log(`SIGKILL rank ${victim.rank}, pid ${victim.pid}`);
  process.kill(victim.pid, 'SIGKILL');
  await waitFor('the failure (worker_killed) in the events', () => page.eval(`[...document.querySelectorAll(
      '#events .event[data-event="failure"]')].some((e) => e.textContent.includes('worker_killed'))`));
  await waitFor(`generation ${next} running`, async () =>
      (await text(page, '#job-generation')) === next && (await text(page, '#job-state')) === 'running');
  const before = await points(page, 'loss-chart');
  await waitFor(`more than ${before} loss points, the newest of generation ${next}`, async () =>
      (await points(page, 'loss-chart')) > before && (await attr(page, '#loss-chart', 'data-generation')) === next);
  if ((await points(page, 'tps-chart')) < 3) throw new Error('the tokens/s chart has fewer than 3 points');
  await waitFor('a checkpoint in the list', () => page.eval(`document.querySelectorAll('#checkpoints li').length > 0`));
  for (const chart of ['loss-chart', 'tps-chart']) {
    const overlaps = await overlappingStepLabels(page, chart);
    if (overlaps.length) throw new Error(`labels overlap on the step axis of #${chart}: ${overlaps.join(', ')}`);
  }
  checkConsole();
  await screenshot(page, 'dashboard-job.png');
  await page.eval(`location.hash = '#/'`);
  await waitFor('the jobs table again', async () => (await text(page, row + ' td:nth-child(10)')) === next);
  await screenshot(page, 'dashboard-jobs.png');

  step = '6: a traced job, merged, drawn';
  await troupeCmd(['cancel', job, ...apiArgs]);
  const jobState = async (id) => (await getJson('/api/jobs')).jobs.find((j) => j.id === id);
  await waitFor(`${job} cancelled`, async () => (await jobState(job))?.state === 'cancelled');
  const traceSpec = spec('tiny_dp1_pp2_tp1_1f1b.yaml', 'dash-trace', 10, '');
  fs.writeFileSync(traceSpec, fs.readFileSync(traceSpec, 'utf8').replace(/^ {2}seed: 0$/m,
                   '  seed: 0\n  trace:\n    from_step: 1\n    steps: 3'));
  const traced = JSON.parse(await troupeCmd(['submit', traceSpec, ...apiArgs])).job;
  log(`submitted ${traced}`);
  await waitFor(`${traced} succeeded`, async () => {
    const j = await jobState(traced);
    if (j && (j.state === 'failed' || j.state === 'cancelled')) throw new Error(`${traced} ${j.state}: ${j.reason}`);
    return j?.state === 'succeeded';
  });
  const runDir = path.resolve(tmp, (await getJson('/api/jobs/' + traced)).job.run_dir);
  log(await troupeCmd(['trace', 'merge', runDir]));
  await page.send('Page.navigate', { url: `${base}/#/job/${traced}/trace` });
  const spans = await waitFor('spans on the trace view', async () => {
    const n = await page.eval(`Number(document.querySelector('#trace-view')?.getAttribute('data-spans') ?? 0)`);
    return n > 0 && n;
  });
  log(`the trace view drew ${spans} spans`);
  await hoverSomeSpan(page);
  await page.send('Input.dispatchMouseEvent', { type: 'mouseMoved', x: 1, y: 1 });  // no tooltip in the picture
  checkConsole();
  await screenshot(page, 'dashboard-trace.png');

  step = '7: stop';
  await browser.close();
  browser = null;
  for (const name of ['agent', 'coordinator']) {
    const { proc } = children.get(name);
    proc.kill('SIGTERM');
    let timer;
    const late = new Promise((resolve) => (timer = setTimeout(resolve, 60000, 'still running 60 s after SIGTERM')));
    const status = await Promise.race([proc.exited, late]);
    clearTimeout(timer);
    if (status !== 0) throw new Error(`${name} ended with ${status} after SIGTERM`);
  }
}

// Rewrites the page's next `?after=` answer for the job at jobUrl as a coordinator whose clock
// is behind would give it (last_seq 0, no points after the page's), and checks that the page's
// very next request asks for all the points, and that the loss chart never shows 0 points.
async function olderCoordinatorAnswers(page, jobUrl) {
  await page.eval(`(() => {
    const chart = document.querySelector('#loss-chart');
    window.lossPointsSeen = [];
    new MutationObserver(() => lossPointsSeen.push(Number(chart.getAttribute('data-points'))))
        .observe(chart, { attributes: true, attributeFilter: ['data-points'] });
  })()`);
  const asked = [], failures = [];  // 'after' or 'all', in the order the page asked
  page.on('Fetch.requestPaused', async (e) => {
    const after = new URL(e.request.url).searchParams.has('after');
    asked.push(after ? 'after' : 'all');
    try {
      if (asked.length > 1) return await page.send('Fetch.continueRequest', { requestId: e.requestId });
      const { body, base64Encoded } = await page.send('Fetch.getResponseBody', { requestId: e.requestId });
      const d = JSON.parse(base64Encoded ? Buffer.from(body, 'base64').toString('utf8') : body);
      d.last_seq = 0;
      d.metrics = [];
      const headers = e.responseHeaders.filter((h) => h.name.toLowerCase() !== 'content-length');
      await page.send('Fetch.fulfillRequest', { requestId: e.requestId, responseCode: e.responseStatusCode,
                                                responseHeaders: headers,
                                                body: Buffer.from(JSON.stringify(d)).toString('base64') });
    } catch (err) {
      failures.push(err.message);
    }
  });
  await page.send('Fetch.enable', { patterns: [{ urlPattern: jobUrl + '*', requestStage: 'Response' }] });
  await waitFor('two requests for the job', () => asked.length >= 2);
  await page.send('Fetch.disable');
  if (failures.length) throw new Error('rewriting an answer failed: ' + failures.join('; '));
  if (asked[0] !== 'after' || asked[1] !== 'all')
    throw new Error(`after an answer with a lower last_seq the page asked ${asked.join(', ')} (want after, all)`);
  const seen = await waitFor('the chart drawn after the new answer', () => page.eval(`lossPointsSeen.length && lossPointsSeen`));
  if (Math.min(...seen) < 1) throw new Error('the loss chart went blank after the older answer: ' + seen.join(', '));
  log(`an answer with last_seq 0: the page asked again for all points at once (loss points seen: ${seen.join(', ')})`);
}

// Moves the mouse along the first lane of the trace until the tooltip names a span.
async function hoverSomeSpan(page) {
  const box = await page.eval(`(() => { const r = document.querySelector('#trace-view').getBoundingClientRect();
                                       return { x: r.left, y: r.top, w: r.width }; })()`);
  for (let i = 1; i < 40; i++) {
    const x = box.x + 200 + ((box.w - 220) * i) / 40, y = box.y + 26 + 10 + 9;  // first lane, first row of work
    await page.send('Input.dispatchMouseEvent', { type: 'mouseMoved', x, y });
    const tip = await page.eval(`(() => { const t = document.querySelector('.tip'); return t.hidden ? '' : t.textContent; })()`);
    if (tip) { log('tooltip: ' + tip.split('\n').slice(0, 3).join(' | ')); return; }
  }
  throw new Error('no tooltip anywhere along the first lane of the trace');
}

function cleanup() {
  if (browser) browser.kill();
  for (const { proc } of children.values()) if (!proc.gone) proc.kill('SIGKILL');
}

for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {  // ctest's timeout, or a Ctrl-C: no coordinator, agent or browser outlives the test
    console.error(`browser_dashboard: ${sig} at step ${step}`);
    cleanup();
    process.exit(1);
  });
}

main().then(() => {
  cleanup();
  fs.rmSync(tmp, { recursive: true, force: true });
  log('browser_dashboard: passed');
}, (e) => {
  console.error(`\nbrowser_dashboard FAILED at step ${step}: ${e.message}`);
  if (consoleErrors.length) console.error('page console errors:\n  ' + consoleErrors.join('\n  '));
  for (const [name, c] of children) {
    console.error(`---- ${name} stdout (tail)\n${tail(c.out)}\n---- ${name} stderr (tail)\n${tail(c.err)}`);
  }
  cleanup();
  console.error(`(kept ${tmp})`);
  process.exit(1);
});
