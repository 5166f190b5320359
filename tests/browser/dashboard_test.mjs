// The dashboard in a real browser, against a real coordinator, agent and jobs:
//
//   node tests/browser/dashboard_test.mjs <troupe binary> <output dir>
//
// playwright-core (tests/browser/package.json; `bash tests/browser/install.sh` installs it into
// tests/browser/node_modules) drives Debian's chromium, headless, with a fresh profile:
//
//   1. a coordinator (--http) and an agent with cpu:2, in a fresh temp dir
//   2. a dp=2 job that checkpoints every 5 steps and may restart 3 times
//   3. the page, opened as /?token=T, keeps T in sessionStorage and drops it from the address,
//      and sends it as "Authorization: Bearer T"; the jobs table lists the job; its link opens
//      the job page; the loss chart grows; an answer whose last_seq is below the page's newest
//      seq (a coordinator with an older clock) has the page ask at once for all the points, and
//      the chart never goes blank meanwhile
//   4. a worker, by the pid the page's grid shows, is SIGKILLed: the page shows the failure
//      (worker_killed), the next generation running, and the chart grows again by points of
//      that generation; no two labels of a chart's step axis overlap; the running job's page
//      has both charts drawn (each with the new generation's line, the older one's faded, and
//      the mark where the new one starts) and its worker grid holds one cell per rank, in its
//      data-parallel replica, with the new generation's pids; then its screenshot is taken
//   5. a short traced 1x2x1 job succeeds, `troupe trace merge` merges it, the trace view draws
//      it and names a span under the mouse
//   6. everything stops; the screenshots of 4-5 (dashboard-job.png, dashboard-jobs.png,
//      dashboard-trace.png) are in the output dir
//
// Any console error of the page (console.error or console.assert, an uncaught exception, a
// browser log entry of level error, a crash) fails the test. Every wait has a deadline only as
// a guard against a hang: no duration is asserted. On failure it prints the step, the page's
// console errors and the tails of the coordinator's and agent's output, kills every child and
// exits 1.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

if (process.argv.length !== 4) {
  console.error('usage: node dashboard_test.mjs <troupe binary> <output dir>');
  process.exit(2);
}
const [troupe, outDir] = process.argv.slice(2).map((p) => path.resolve(p));  // children run in the temp dir
const SOURCE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const INSTALL = 'bash tests/browser/install.sh';
const CHROMIUM_CANDIDATES = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];
const DEADLINE_MS = 180000;
const ACTION_MS = 60000;  // the guard on one browser action (a click, a navigation, a screenshot)
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'troupe_browser_'));
const children = new Map();  // name -> {proc, out, err}
const consoleErrors = [];
let step = 'start';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (msg) => console.log(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

// ---------------------------------------------------------------- the browser

// playwright-core's chromium launcher, from tests/browser/node_modules. Never skipped: without
// it the test fails, naming the command that installs it.
async function playwrightChromium() {
  try {
    return (await import('playwright-core')).chromium;
  } catch (e) {
    throw new Error(`playwright-core cannot be loaded (${e.message.split('\n')[0]}): run ${INSTALL} ` +
                    '(scripts/setup.sh --test runs it)');
  }
}

function findChromium() {
  if (process.env.CHROMIUM) return fs.existsSync(process.env.CHROMIUM) ? process.env.CHROMIUM : null;
  return CHROMIUM_CANDIDATES.find((p) => fs.existsSync(p)) ?? null;
}

// Debian's chromium, headless, with a fresh profile in the temp dir. Playwright's own handlers
// of SIGINT/SIGTERM/SIGHUP stay off (this file's kill the troupe children too); its handler of
// the process's exit, always on, SIGKILLs the browser's process group, so the browser goes
// whenever this process exits (on failure, or by this file's handlers of SIGINT and SIGTERM).
// TROUPE_BROWSER_LOG=1 prints the browser's output.
async function launchBrowser() {
  const chromium = await playwrightChromium();
  const executablePath = findChromium();
  if (!executablePath) throw new Error('chromium not found: run scripts/setup.sh --test (it installs chromium and nodejs)');
  const logger = { isEnabled: (name) => name === 'browser' && !!process.env.TROUPE_BROWSER_LOG,
                   log: (name, severity, message) => console.log('chromium: ' + message) };
  return chromium.launchPersistentContext(path.join(tmp, 'chromium'), {
    executablePath, headless: true, logger, timeout: ACTION_MS,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 1000 }, deviceScaleFactor: 1,
    handleSIGINT: false, handleSIGTERM: false, handleSIGHUP: false,
  });
}

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
  // A browser log entry of level error (a refused resource, a policy violation) comes as a
  // console message of type 'error' too.
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'assert') {
      const at = m.location();
      consoleErrors.push(`console.${m.type()}: ${m.text()} (${at.url}:${at.lineNumber})`);
    }
  });
  page.on('pageerror', (e) => consoleErrors.push('uncaught: ' + (e.stack ?? e.message)));
  page.on('crash', () => consoleErrors.push('the page crashed'));
}
function checkConsole() {
  if (consoleErrors.length) throw new Error('the page logged errors:\n  ' + consoleErrors.join('\n  '));
}

// The width and height of a PNG file, from its IHDR chunk.
function pngSize(file) {
  const b = fs.readFileSync(file);
  if (b.length < 24 || b.toString('latin1', 1, 4) !== 'PNG' || b.toString('latin1', 12, 16) !== 'IHDR')
    throw new Error(`${file} is not a PNG`);
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
}

// Saves the whole page down to the end of its content (below the viewport too) as PNG, and
// checks that every element of `shows` (selectors) lies within the picture, visible and not
// empty.
async function screenshot(page, name, shows = []) {
  const { width, height } = await page.evaluate(() => ({
    width: document.documentElement.scrollWidth,
    height: Math.min(document.documentElement.scrollHeight,
                     Math.ceil(document.querySelector('main').getBoundingClientRect().bottom + scrollY) + 8),
  }));
  for (const selector of shows) {
    const r = await page.evaluate((sel) => {
      const e = document.querySelector(sel);
      if (!e) return null;
      const b = e.getBoundingClientRect();
      return { top: b.top + scrollY, bottom: b.bottom + scrollY, width: b.width, height: b.height,
               visible: e.checkVisibility() };
    }, selector);
    if (!r || !r.visible || r.width < 50 || r.height < 20 || r.top < 0 || r.bottom > height)
      throw new Error(`${name} would not show ${selector} (page ${width}x${height}, element ${JSON.stringify(r)})`);
  }
  const file = path.join(outDir, name);
  await page.screenshot({ path: file, fullPage: true, clip: { x: 0, y: 0, width, height }, timeout: ACTION_MS });
  const png = pngSize(file);
  if (png.width !== width || png.height !== height)
    throw new Error(`${file} is ${png.width}x${png.height}, not the ${width}x${height} asked for`);
  log(`saved ${file} (${width}x${height})`);
}

const points = (page, chart) =>
  page.evaluate((id) => Number(document.getElementById(id)?.getAttribute('data-points') ?? -1), chart);
const text = (page, selector) =>
  page.evaluate((sel) => document.querySelector(sel)?.textContent.trim() ?? null, selector);
const attr = (page, selector, name) =>
  page.evaluate(([sel, n]) => document.querySelector(sel)?.getAttribute(n) ?? null, [selector, name]);

// The labels along the bottom of a chart (the step axis) that overlap another, as "a/b" pairs.
const overlappingStepLabels = (page, chart) => page.evaluate((id) => {
  const svg = document.getElementById(id), H = svg.viewBox.baseVal.height;
  const boxes = [...svg.querySelectorAll('text')].filter((t) => Number(t.getAttribute('y')) > H - 20)
      .map((t) => ({ text: t.textContent, b: t.getBBox() })).sort((p, q) => p.b.x - q.b.x);
  const out = [];
  for (let i = 1; i < boxes.length; i++)
    if (boxes[i].b.x < boxes[i - 1].b.x + boxes[i - 1].b.width) out.push(boxes[i - 1].text + '/' + boxes[i].text);
  return out;
}, chart);

// What a chart draws: its lines (class and number of points) and its generation marks.
const chartDrawing = (page, chart) => page.evaluate((id) => {
  const svg = document.getElementById(id);
  return {
    points: Number(svg.getAttribute('data-points')),
    lines: [...svg.querySelectorAll('polyline')].map((l) => ({
      cls: l.getAttribute('class'), n: l.getAttribute('points').trim().split(/\s+/).filter(Boolean).length })),
    marks: [...svg.querySelectorAll('text.gen-label')].map((t) => t.textContent),
  };
}, chart);

// The worker grid: its replica blocks (title, stages, cells) and every cell.
const workerGrid = (page) => page.evaluate(() => {
  const cell = (e) => ({ rank: Number(e.dataset.rank), pid: Number(e.dataset.pid), cls: e.className,
                         text: e.textContent });
  return {
    blocks: [...document.querySelectorAll('#workers .dp-block')].map((b) => ({
      title: b.querySelector('h3')?.textContent, stages: b.querySelectorAll('.stage').length,
      ranks: [...b.querySelectorAll('.worker')].map((e) => Number(e.dataset.rank)) })),
    cells: [...document.querySelectorAll('#workers .worker')].map(cell),
  };
});

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
  await playwrightChromium();  // before any process starts: a missing package fails at once

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
  const context = await launchBrowser();
  context.setDefaultTimeout(ACTION_MS);
  const page = context.pages()[0] ?? await context.newPage();
  watchConsole(page);
  // On loopback the coordinator asks no token, but the page handles one the same way anywhere.
  const token = (await troupeCmd(['secret', 'api-token', secret])).trim();
  await page.goto(base + '/?token=' + encodeURIComponent(token) + '#/');
  const address = await waitFor('the token out of the address', () => page.evaluate(() => {
    const stored = sessionStorage.getItem('troupe.token');
    return stored && { href: location.href, stored };
  }));
  if (address.href !== base + '/#/' || address.stored !== token)
    throw new Error(`after /?token=T the page is at ${address.href}, keeping ${JSON.stringify(address.stored)}`);
  const row = `#jobs-table tr[data-job="${job}"]`;
  await waitFor('the job in the jobs table', () => page.evaluate((sel) => !!document.querySelector(sel), row + ' a'));
  await page.locator(row + ' a').click();
  await waitFor('the job page', () => page.evaluate((h) => location.hash === h, '#/job/' + job));
  const first = await waitFor('3 loss points', async () => { const n = await points(page, 'loss-chart'); return n >= 3 && n; });
  await waitFor(`more than ${first} loss points`, async () => (await points(page, 'loss-chart')) > first);
  await olderCoordinatorAnswers(page, '/api/jobs/' + job, token);
  checkConsole();

  step = '5: a worker killed, the job recovered';
  const workers = await waitFor('two workers with pids in the grid', async () => {
    const w = (await workerGrid(page)).cells.filter((c) => c.pid > 0);
    return w.length === 2 && w;
  });
  const victim = workers.find((w) => w.rank === 1) ?? workers[0];
  const gen = Number(await text(page, '#job-generation')), next = String(gen + 1);
  log(`SIGKILL rank ${victim.rank}, pid ${victim.pid}`);
  process.kill(victim.pid, 'SIGKILL');
  await waitFor('the failure (worker_killed) in the events', () => page.evaluate(() => [...document.querySelectorAll(
      '#events .event[data-event="failure"]')].some((e) => e.textContent.includes('worker_killed'))));
  await waitFor(`generation ${next} running`, async () =>
      (await text(page, '#job-generation')) === next && (await text(page, '#job-state')) === 'running');
  const before = await points(page, 'loss-chart');
  await waitFor(`more than ${before} loss points, the newest of generation ${next}`, async () =>
      (await points(page, 'loss-chart')) > before && (await attr(page, '#loss-chart', 'data-generation')) === next);
  if ((await points(page, 'tps-chart')) < 3) throw new Error('the tokens/s chart has fewer than 3 points');
  await waitFor('a checkpoint in the list', () => page.evaluate(() => document.querySelectorAll('#checkpoints li').length > 0));
  for (const chart of ['loss-chart', 'tps-chart']) {
    const overlaps = await overlappingStepLabels(page, chart);
    if (overlaps.length) throw new Error(`labels overlap on the step axis of #${chart}: ${overlaps.join(', ')}`);
  }
  await runningJobPage(page, next, victim.pid, workers.filter((w) => w !== victim).map((w) => w.pid));
  checkConsole();
  await screenshot(page, 'dashboard-job.png', ['#job-header', '#loss-chart', '#tps-chart', '#workers']);
  await page.evaluate(() => (location.hash = '#/'));
  await waitFor('the jobs table again', async () => (await text(page, row + ' td:nth-child(10)')) === next);
  await screenshot(page, 'dashboard-jobs.png', ['#jobs-table']);

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
  await page.goto(`${base}/#/job/${traced}/trace`);
  const spans = await waitFor('spans on the trace view', async () => {
    const n = await page.evaluate(() => Number(document.querySelector('#trace-view')?.getAttribute('data-spans') ?? 0));
    return n > 0 && n;
  });
  log(`the trace view drew ${spans} spans`);
  await hoverSomeSpan(page);
  await page.mouse.move(1, 1);  // no tooltip in the picture
  await waitFor('the tooltip hidden', () => page.evaluate(() => document.querySelector('.tip').hidden));
  checkConsole();
  await screenshot(page, 'dashboard-trace.png', ['#trace-view']);

  step = '7: stop';
  await context.close();
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

// Rewrites the page's next `?after=` answer for the job at jobPath as a coordinator whose clock
// is behind would give it (last_seq 0, no points after the page's), and checks that the page's
// very next request asks for all the points, and that the loss chart never shows 0 points.
// Both requests carry the token the page keeps.
async function olderCoordinatorAnswers(page, jobPath, token) {
  await page.evaluate(() => {
    const chart = document.querySelector('#loss-chart');
    window.lossPointsSeen = [];
    new MutationObserver(() => window.lossPointsSeen.push(Number(chart.getAttribute('data-points'))))
        .observe(chart, { attributes: true, attributeFilter: ['data-points'] });
  });
  const asked = [], failures = [];  // 'after' or 'all', in the order the page asked
  let handled = 0;  // requests whose answer the handler has given
  const isJob = (url) => url.pathname === jobPath;
  const handler = async (route) => {
    const request = route.request(), after = new URL(request.url()).searchParams.has('after');
    asked.push(after ? 'after' : 'all');
    try {
      const auth = await request.headerValue('authorization');
      if (auth !== 'Bearer ' + token) failures.push(`request ${asked.length} carried Authorization ${JSON.stringify(auth)}`);
      if (asked.length > 1) return await route.continue();
      const response = await route.fetch();  // the coordinator's real answer
      if (!response.ok()) throw new Error(`GET ${request.url()}: ${response.status()}`);
      const d = await response.json();
      d.last_seq = 0;
      d.metrics = [];
      const headers = Object.fromEntries(Object.entries(response.headers()).filter(([k]) => k !== 'content-length'));
      await route.fulfill({ status: response.status(), headers, body: JSON.stringify(d) });
    } catch (err) {
      failures.push(err.message);
    } finally {
      ++handled;
    }
  };
  await page.route(isJob, handler);
  try {
    // Unrouting while a request is still in the handler would answer it from under the handler.
    await waitFor('two requests for the job answered', () => handled >= 2);
  } finally {
    await page.unrouteAll({ behavior: 'wait' });  // the only route; a request in its handler finishes there
  }
  if (failures.length) throw new Error('rewriting an answer failed: ' + failures.join('; '));
  if (asked[0] !== 'after' || asked[1] !== 'all')
    throw new Error(`after an answer with a lower last_seq the page asked ${asked.join(', ')} (want after, all)`);
  const seen = await waitFor('the chart drawn after the new answer', () =>
      page.evaluate(() => window.lossPointsSeen.length && window.lossPointsSeen));
  if (Math.min(...seen) < 1) throw new Error('the loss chart went blank after the older answer: ' + seen.join(', '));
  log(`an answer with last_seq 0: the page asked again for all points at once (loss points seen: ${seen.join(', ')})`);
}

// The running job's page after the relaunch as generation `gen`: both charts drawn, each with
// the new generation's line (and the older one's, faded) and a mark where the new one starts;
// the worker grid (layout 2x1x1) holds one block per data-parallel replica, each with one stage
// and one cell, for ranks 0 and 1, live, by pids that none of the killed generation had.
// The page of a 2x1x1 job whose generation `gen` replaced the killed `victimPid`: the other
// rank kept its process (`keptPids`).
async function runningJobPage(page, gen, victimPid, keptPids) {
  for (const [chart, series] of [['loss-chart', 'loss'], ['tps-chart', 'tps']]) {
    const d = await waitFor(`#${chart} with a line of generation ${gen} after the earlier one's`, async () => {
      const c = await chartDrawing(page, chart);
      const older = c.lines.filter((l) => l.cls.split(' ').includes(series) && l.cls.split(' ').includes('old'));
      const current = c.lines.filter((l) => l.cls.split(' ').includes(series) && !l.cls.split(' ').includes('old'));
      if (c.points >= 3 && older.length > 0 && older.every((l) => l.n >= 2) && current.length === 1 &&
          current[0].n >= 2 && c.marks.includes('gen ' + gen))
        return c;
      throw new Error(JSON.stringify(c));  // what the failure says it last saw
    });
    log(`#${chart}: ${d.points} points, lines ${d.lines.map((l) => `${l.cls} (${l.n})`).join(', ')}, marks ${d.marks.join(', ')}`);
  }
  const grid = await waitFor(`worker grid of generation ${gen}`, async () => {
    const g = await workerGrid(page);
    const live = g.cells.filter((c) => c.pid > 0 && c.pid !== victimPid &&
                                       !/\b(exited|done|waiting)\b/.test(c.cls) &&
                                       c.text.includes('rank ' + c.rank) && c.text.includes('pid ' + c.pid));
    if (live.length === 2 && g.cells.length === 2 && keptPids.every((p) => live.some((c) => c.pid === p))) return g;
    throw new Error(JSON.stringify(g.cells));
  });
  const ranks = grid.cells.map((c) => c.rank).sort().join(',');
  const blocks = grid.blocks.map((b) => `${b.title}: ${b.stages} stage, ranks ${b.ranks.join(',')}`);
  if (ranks !== '0,1' || blocks.length !== 2 || grid.blocks.some((b, d) => b.title !== 'data-parallel replica ' + d ||
                                                                     b.stages !== 1 || b.ranks.length !== 1))
    throw new Error(`the worker grid of a 2x1x1 job: ${JSON.stringify(grid)}`);
  log(`generation ${gen}: ${blocks.join('; ')}; pids ${grid.cells.map((c) => c.pid).join(', ')} (killed: ${victimPid}, kept: ${keptPids.join(', ')})`);
  if ((await text(page, '#job-state')) !== 'running') throw new Error('the job is no longer running');
}

// Moves the mouse along the first lane of the trace until the tooltip names a span.
async function hoverSomeSpan(page) {
  await page.locator('#trace-view').scrollIntoViewIfNeeded();
  const box = await page.locator('#trace-view').boundingBox();  // in the viewport's coordinates
  for (let i = 1; i < 40; i++) {
    const x = box.x + 200 + ((box.width - 220) * i) / 40, y = box.y + 26 + 10 + 9;  // first lane, first row of work
    await page.mouse.move(x, y);
    const tip = await page.evaluate(() => { const t = document.querySelector('.tip'); return t.hidden ? '' : t.textContent; });
    if (tip) { log('tooltip: ' + tip.split('\n').slice(0, 3).join(' | ')); return; }
  }
  throw new Error('no tooltip anywhere along the first lane of the trace');
}

function cleanup() {  // the browser goes with the process (see launchBrowser)
  for (const { proc } of children.values()) if (!proc.gone) proc.kill('SIGKILL');
}

for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {  // ctest's timeout, or a Ctrl-C: no coordinator, agent or browser outlives the test
    console.error(`browser_dashboard: ${sig} at step ${step} (kept ${tmp})`);
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
  if (children.size) console.error(`(kept ${tmp})`);
  else fs.rmSync(tmp, { recursive: true, force: true });
  process.exit(1);
});
