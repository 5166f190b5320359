// troupe's dashboard: one page, three hash routes, each polling the coordinator once a second.
//
//   #/                  jobs, agents, free devices, queue           GET /api/jobs
//   #/job/<id>          header, charts, worker grid, events, ckpts  GET /api/jobs/<id>?after=<seq>
//   #/job/<id>/trace    the merged trace on a canvas (trace.js)     GET /api/jobs/<id>/trace
//
// The coordinator serves this file under a Content-Security-Policy that allows only its own
// files: no inline script or style, no eval. Every string from the JSON reaches the DOM as
// text (textContent, text nodes, attribute values), never as markup, so a job named
// "<img src=x onerror=...>" shows as just that text. trace.js, loaded before this file, shares
// its global scope (a top-level name is declared in one of the two only).
'use strict';

// Off loopback the coordinator wants the API token on every /api request, and the page is
// opened as /?token=T#/... . The token moves from the address into this tab's sessionStorage at
// once, so that it does not stay in the address bar, the history or a screenshot, and is sent
// as "Authorization: Bearer T" from then on. A page opened without one uses the stored one.
const TOKEN_KEY = 'troupe.token';
const TOKEN = (() => {
  const query = new URLSearchParams(location.search), fromUrl = query.get('token');
  let stored = null;
  try {
    if (fromUrl) sessionStorage.setItem(TOKEN_KEY, fromUrl);
    stored = sessionStorage.getItem(TOKEN_KEY);
  } catch (_) { /* storage disabled: the token lives as long as this page */ }
  if (fromUrl !== null) {
    query.delete('token');
    const rest = query.toString();
    history.replaceState(history.state, '', location.pathname + (rest ? '?' + rest : '') + location.hash);
  }
  return fromUrl || stored;
})();
const POLL_MS = 1000;
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const dash = '–';

// ---------------------------------------------------------------- DOM and formatting

// el('td', {class: 'num', text: '12'}, child...): strings among the children become text nodes.
function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, String(v));
  }
  for (const k of kids.flat()) if (k !== undefined && k !== null && k !== false) e.append(k);
  return e;
}
function svgEl(tag, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}
const isNum = (x) => typeof x === 'number' && Number.isFinite(x);
const num = (x, digits) => (isNum(x) ? x.toFixed(digits) : dash);
const int = (x) => (isNum(x) ? Math.round(x).toLocaleString('en-US') : dash);
const jobHref = (id) => '#/job/' + encodeURIComponent(id);
function duration(s) {
  if (!isNum(s) || s < 0) return dash;
  const r = Math.round(s), h = Math.floor(r / 3600), m = Math.floor((r % 3600) / 60);
  return h ? h + ' h ' + m + ' m' : m ? m + ' m ' + (r % 60) + ' s' : r + ' s';
}
function clock(iso) {
  const d = new Date(iso);
  return isNaN(d) ? String(iso ?? '') : d.toLocaleTimeString('en-GB', { hour12: false });
}
function setState(chip, state) {
  chip.className = 'state state-' + state;
  chip.textContent = String(state ?? dash);
}
// Ticks at 1, 2 or 5 times a power of ten, about `count` of them across [lo, hi].
function ticks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
  const step = (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p, out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
  return out;
}
function shortNum(x) {
  const a = Math.abs(x);
  if (a >= 1e6) return +(x / 1e6).toPrecision(3) + 'M';
  if (a >= 1e4) return +(x / 1e3).toPrecision(3) + 'k';
  return String(+x.toPrecision(4));
}
function table(id, heads, tbody) {
  return el('table', { id, class: 'grid' },
            el('thead', {}, el('tr', {}, heads.map(([t, cls]) => el('th', { class: cls, text: t })))), tbody);
}
const emptyRow = (cols, text) => el('tr', {}, el('td', { class: 'empty', colspan: cols, text }));

// ---------------------------------------------------------------- the coordinator's API

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
// The parsed JSON of GET path, or an ApiError: status 0 when the coordinator cannot be reached.
async function api(path, signal) {
  let r;
  try {
    r = await fetch(path, { headers: TOKEN ? { Authorization: 'Bearer ' + TOKEN } : {}, cache: 'no-store', signal });
  } catch (e) {
    throw new ApiError(0, e.message);
  }
  if (!r.ok) {
    let text = r.status + ' ' + r.statusText;
    try { const j = await r.json(); if (j && j.message) text += ': ' + j.message; } catch (_) { /* no JSON */ }
    throw new ApiError(r.status, text);
  }
  try { return await r.json(); } catch (e) { throw new ApiError(r.status, 'the answer is not JSON: ' + e.message); }
}

function showBanner(err) {
  const b = document.getElementById('banner');
  b.hidden = !err;
  if (!err) b.textContent = '';
  else if (err.status === 0)
    b.textContent = 'Cannot reach the coordinator at ' + location.host + ' (has it stopped?): retrying every second.';
  else if (err.status === 401)
    b.textContent = (TOKEN ? 'The coordinator refused the API token this page has. ' : '') +
                    'This dashboard needs the API token: open it as ' + location.origin +
                    '/?token=<token>, see `troupe secret api-token FILE`.';
  else if (err.status === 403)
    b.textContent = 'The coordinator refused this page (' + err.message + '): open it as ' + location.origin +
                    '/?token=TOKEN with a valid API token.';
  else if (err instanceof ApiError) b.textContent = 'The coordinator answered ' + err.message;
  else b.textContent = 'The page failed: ' + err.message;
}

// Runs tick() now and everyMs after each run ends (never two at once) until tick returns false
// or the returned stop function is called. A failed fetch shows the banner; the next tick that
// succeeds hides it. Anything else thrown is a bug of this page: logged, shown, polled on.
function poll(tick, everyMs = POLL_MS) {
  let timer = null, stopped = false;
  const run = async () => {
    let again = true;
    try {
      again = (await tick(() => stopped)) !== false;
      if (!stopped) showBanner(null);
    } catch (e) {
      if (stopped) return;
      if (!(e instanceof ApiError)) console.error(e);
      showBanner(e);
    }
    if (!stopped && again) timer = setTimeout(run, everyMs);
  };
  run();
  return () => { stopped = true; clearTimeout(timer); };
}
function updated(iso) {
  document.getElementById('updated').textContent = 'updated ' + clock(iso || new Date().toISOString());
}

// ---------------------------------------------------------------- #/ jobs

// A row per job, kept across polls (only its texts change), so that a click on its link is
// never lost to a row drawn anew between the press and the release.
function jobRow(id) {
  const c = { chip: el('span'), bar: el('progress', { max: 1, value: 0 }), steps: el('span', { class: 'muted' }) };
  const td = (k, cls) => (c[k] = el('td', { class: cls }));
  const tr = el('tr', { 'data-job': id }, el('td', {}, el('a', { href: jobHref(id), text: id })), td('name'),
                el('td', {}, c.chip), td('layout'), el('td', {}, c.bar, c.steps), td('eta', 'num'), td('tps', 'num'),
                td('loss', 'num'), td('restarts', 'num'), td('generation', 'num'));
  tr.update = (j) => {
    c.name.textContent = j.name ?? '';
    setState(c.chip, j.state);
    c.chip.title = j.reason || '';
    c.layout.textContent = j.layout || dash;
    c.bar.max = Math.max(1, j.total_steps || 1);
    c.bar.value = Math.min(j.steps_done || 0, c.bar.max);
    c.steps.textContent = int(j.steps_done) + ' / ' + int(j.total_steps);
    c.eta.textContent = TERMINAL.has(j.state) ? dash : duration(j.eta_s);
    c.tps.textContent = int(j.tokens_per_s);
    c.loss.textContent = num(j.loss, 3);
    c.restarts.textContent = int(j.restarts);
    c.generation.textContent = int(j.generation);
  };
  return tr;
}

function jobsView(root) {
  const summary = el('div', { class: 'summary' }), jobs = el('tbody'), agents = el('tbody');
  root.append(el('h1', { text: 'Jobs' }), summary,
              table('jobs-table', [['id'], ['name'], ['state'], ['layout'], ['progress'], ['ETA', 'num'],
                                   ['tokens/s', 'num'], ['loss', 'num'], ['restarts', 'num'], ['generation', 'num']], jobs),
              el('h2', { text: 'Agents' }), table('agents-table', [['agent'], ['host'], ['pid'], ['devices']], agents));
  const rows = new Map();
  return poll(async () => {
    const d = await api('/api/jobs');
    updated(d.time);
    const fact = (n, label) => el('span', {}, el('b', { text: String(n) }), label);
    const devices = Object.entries(d.devices || {}).map(([kind, v]) => fact(int(v.free) + ' / ' + int(v.total),
                                                                              kind + ' free'));
    summary.replaceChildren(fact(int(d.queue), 'queued'), fact(d.agents_total ?? (d.agents || []).length, 'agents'),
                            ...devices);
    const seen = new Set();
    for (const j of d.jobs || []) {
      const id = String(j.id), at = jobs.children[seen.size] || null;
      seen.add(id);
      if (!rows.has(id)) rows.set(id, jobRow(id));
      const tr = rows.get(id);
      tr.update(j);
      if (tr !== at) jobs.insertBefore(tr, at);  // the server's order; a row in place is not touched
    }
    for (const [id, tr] of rows) if (!seen.has(id)) { tr.remove(); rows.delete(id); }
    for (const tr of [...jobs.children]) if (!tr.dataset.job) tr.remove();
    if (!rows.size) jobs.append(emptyRow(10, 'No jobs yet: troupe submit SPEC'));
    agents.replaceChildren(...(d.agents || []).map((a) => el('tr', {},
        el('td', { class: 'mono', text: a.id }), el('td', { text: a.host }), el('td', { text: a.pid }),
        el('td', { class: 'devices' }, (a.devices || []).map((x) =>
            el('span', { class: x.job ? 'mono busy' : 'mono', text: x.device + (x.job ? ' → ' + x.job : ' free') }))))));
    if (!(d.agents || []).length) agents.append(emptyRow(4, 'No agent yet: troupe agent --coordinator HOST:PORT'));
    else if (d.agents.length < (d.agents_total ?? 0))
      agents.append(emptyRow(4, 'The first ' + d.agents.length + ' of ' + d.agents_total + ' agents'));
  });
}

// ---------------------------------------------------------------- #/job/<id>: charts

// The points of one metric split by generation, oldest first: [{gen, cls, pts: [[step, y]...]}].
function seriesOf(points, key, cls) {
  const byGen = new Map();
  for (const p of points) {
    if (!isNum(p[key]) || !isNum(p.step)) continue;
    const g = p.generation ?? 0;
    if (!byGen.has(g)) byGen.set(g, { gen: g, cls, pts: [] });
    byGen.get(g).pts.push([p.step, p[key]]);
  }
  return [...byGen.values()];
}
const countPts = (series) => series.reduce((n, s) => n + s.pts.length, 0);

// About how wide a chart's label is, in the chart's units: in 11px DejaVu Sans (app.css) a digit
// is 7 units wide, and most letters less.
const textWidth = (text) => 7 * text.length;

// Draws series on an SVG by step. A generation that resumed from a checkpoint repeats steps the
// one before it reached, so each generation has its own line (older ones faded) and a marked start.
function drawChart(svg, series) {
  const W = 640, H = 230, L = 52, R = 12, T = 12, B = 28;
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  const all = series.flatMap((s) => s.pts);
  if (!all.length) {
    svg.replaceChildren(svgEl('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no steps yet'));
    return;
  }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [x, y] of all) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  if (x1 === x0) x1 = x0 + 1;
  const pad = (y1 - y0) * 0.06 || Math.abs(y1) * 0.05 || 1;
  y0 -= pad; y1 += pad;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const kids = [];
  for (const t of ticks(y0, y1, 5))
    kids.push(svgEl('line', { class: 'gridline', x1: L, x2: W - R, y1: Y(t), y2: Y(t) }),
              svgEl('text', { x: L - 6, y: Y(t) + 4, 'text-anchor': 'end' }, shortNum(t)));
  // Step labels centred on their ticks, and "step" ending at the axis's right end: a label that
  // would reach into "step" is left out (on 0..206 the tick at 200 would sit on top of it).
  const titleLeft = W - R - textWidth('step') - 6;
  for (const t of ticks(x0, x1, 6)) {
    const label = shortNum(t);
    if (t === Math.round(t) && X(t) + textWidth(label) / 2 <= titleLeft)
      kids.push(svgEl('text', { x: X(t), y: H - 10, 'text-anchor': 'middle' }, label));
  }
  kids.push(svgEl('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }),
            svgEl('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }),
            svgEl('text', { x: W - R, y: H - 10, 'text-anchor': 'end' }, 'step'));
  const gens = series.map((s) => s.gen), oldest = Math.min(...gens), newest = Math.max(...gens);
  const marked = new Set([oldest]);
  for (const s of series) {
    if (!marked.has(s.gen)) {
      marked.add(s.gen);
      const x = X(s.pts[0][0]);
      kids.push(svgEl('line', { class: 'gen-mark', x1: x, x2: x, y1: T, y2: H - B }),
                svgEl('text', { class: 'gen-label', x: x + 3, y: T + 10 }, 'gen ' + s.gen));
    }
    const old = s.gen !== newest ? ' old' : '';
    const [lx, ly] = s.pts[s.pts.length - 1];
    kids.push(svgEl('polyline', { class: 'line ' + s.cls + old,
                                  points: s.pts.map(([x, y]) => X(x).toFixed(1) + ',' + Y(y).toFixed(1)).join(' ') }),
              svgEl('circle', { class: 'dot-' + s.cls + old, cx: X(lx), cy: Y(ly), r: 2.5 }));
  }
  svg.replaceChildren(...kids);
}

// ---------------------------------------------------------------- #/job/<id>: workers, events

// The worker grid of a "DxPxT" layout: D blocks (data-parallel replicas) of P rows (pipeline
// stages) by T columns (tensor ranks). Workers without a place (no plan yet) sit in one row.
function renderWorkers(box, job) {
  const workers = job.workers || [];
  const [D, P, T] = String(job.layout || '').split('x').map(Number);
  const cell = (w) => {
    const hb = w.heartbeat_age_s, beat = isNum(hb) ? 'heartbeat ' + hb.toFixed(1) + ' s ago' : 'no heartbeat yet';
    const status = w.exited ? 'exited' : w.done ? 'done' : !w.registered ? 'waiting' : hb > 5 ? 'stale' : '';
    return el('div', { class: 'worker ' + status, 'data-rank': w.rank, 'data-pid': w.pid ?? '' },
              el('div', {}, el('b', { text: 'rank ' + w.rank }), ' ', el('span', { class: 'muted', text: status })),
              el('div', { text: (w.host ?? '?') + ' · ' + (w.device ?? '?') + ' · pid ' + (w.pid ?? '?') }),
              el('div', { class: 'where', text: w.where || dash }),
              el('div', { class: 'muted', text: (w.layers ? w.layers + ' · ' : '') + beat }));
  };
  // A big job's status lists one page of its workers (the first ranks): say so.
  const total = isNum(job.workers_total) ? job.workers_total : workers.length;
  const paged = workers.length < total
    ? [el('p', { class: 'muted', text: 'Ranks ' + (job.workers_from ?? 0) + '–' +
                 ((job.workers_from ?? 0) + workers.length - 1) + ' of ' + total + ' shown' })]
    : [];
  const fits = (w) => isNum(w.dp) && isNum(w.pp) && isNum(w.tp) && w.dp < D && w.pp < P && w.tp < T;
  if (!(D > 0 && P > 0 && T > 0 && workers.length && workers.every(fits))) {
    box.replaceChildren(workers.length ? el('div', { class: 'flat-workers' }, workers.map(cell))
                                       : el('p', { class: 'muted', text: 'No workers yet' }), ...paged);
    return;
  }
  const blocks = [];
  for (const d of [...new Set(workers.map((w) => w.dp))].sort((a, b) => a - b)) {
    const stages = [];
    for (let p = 0; p < P; p++) {
      const row = workers.filter((w) => w.dp === d && w.pp === p).sort((a, b) => a.tp - b.tp);
      stages.push(el('div', { class: 'stage' }, el('span', { class: 'stage-label', text: 'stage ' + p }),
                     row.map(cell)));
    }
    blocks.push(el('div', { class: 'dp-block' }, el('h3', { text: 'data-parallel replica ' + d }), stages));
  }
  box.replaceChildren(el('div', { class: 'dp-blocks' }, blocks), ...paged);
}

// Runs of checkpoint events (one every few steps) fold into one line each, newest first, so that
// failures and relaunches stay in sight: [{e, more: how many earlier ones the line stands for}].
function foldEvents(events) {
  const out = [];
  for (const e of events.slice().reverse()) {
    const top = out[out.length - 1];
    if (top && e.event === 'checkpoint' && top.e.event === 'checkpoint') top.more++;
    else out.push({ e, more: 0 });
  }
  return out;
}
function eventItem({ e, more }) {
  const kind = String(e.event ?? 'log');
  const li = el('li', { class: 'event ev-' + kind, 'data-event': kind },
                el('span', { class: 'when', text: clock(e.time) }),
                isNum(e.generation) && el('span', { class: 'gen', text: 'gen ' + e.generation }),
                el('span', { class: 'kind', text: kind }), el('span', { text: e.message ?? '' }));
  if (kind === 'failure') {
    const at = [isNum(e.rank) && 'rank ' + e.rank, e.host && 'on ' + e.host, isNum(e.pid) && 'pid ' + e.pid];
    const where = at.filter(Boolean).join(' ');
    li.append(el('span', { class: 'cause', text: (e.cause ?? 'unknown cause') + (where ? ' (' + where + ')' : '') }));
  }
  if (more) li.append(el('span', { class: 'muted', text: ' and ' + more + ' earlier' }));
  return li;
}
function checkpointItem(c) {
  return el('li', {}, el('span', { class: 'when', text: clock(c.time) }), el('b', { text: 'step ' + c.step }),
            el('span', { class: 'muted', text: ' · gen ' + (c.generation ?? dash) }),
            el('span', { class: 'dir', text: c.dir ?? '' }));
}
// Redraws a list (newest first) only when its last item or its count changed since the last call.
function renderList(list, items, make, none, order = (xs) => xs.slice().reverse()) {
  const key = items.length + ':' + JSON.stringify(items[items.length - 1] ?? null);
  if (list.dataset.key === key) return;
  list.dataset.key = key;
  list.replaceChildren(...order(items).map(make));
  if (!items.length) list.append(el('li', { class: 'muted', text: none }));
}

// ---------------------------------------------------------------- #/job/<id>

const MAX_POINTS = 10000;  // past this, every other point of the older half goes
// The job page's header: label and text of each fact (state and generation have their own ids).
const planned = (j) => (j.planned_layout && j.planned_layout !== j.layout ? ' (planned ' + j.planned_layout + ')' : '');
const FACTS = [
  ['layout', (j) => (j.layout || dash) + planned(j)],
  ['world', (j) => int(j.world)], ['restarts / max', (j) => int(j.restarts) + ' / ' + int(j.max_restarts)],
  ['steps', (j) => int(j.steps_done) + ' / ' + int(j.total_steps)], ['loss', (j) => num(j.loss, 4)],
  ['tokens/s', (j) => int(j.tokens_per_s)], ['ETA', (j) => (TERMINAL.has(j.state) ? dash : duration(j.eta_s))],
  ['run dir', (j) => j.run_dir || dash], ['reason', (j) => j.reason || dash]];

function jobView(root, id) {
  const base = '/api/jobs/' + encodeURIComponent(id);
  const fact = (label, dd) => el('div', {}, el('dt', { text: label }), dd);
  const chip = el('span', { id: 'job-state' }), gen = el('dd', { id: 'job-generation' }), dds = FACTS.map(() => el('dd'));
  const title = el('h1', { text: 'Job ' + id }), failure = el('div', { class: 'failure-text' });
  const traceLink = el('a', { id: 'trace-link', href: jobHref(id) + '/trace', hidden: true, text: 'merged trace →' });
  const lossSvg = svgEl('svg', { id: 'loss-chart', class: 'chart', 'data-points': 0 });
  const tpsSvg = svgEl('svg', { id: 'tps-chart', class: 'chart', 'data-points': 0 });
  const lossNote = el('span', { class: 'muted' }), tpsNote = el('span', { class: 'muted' });
  const workers = el('div'), events = el('ol', { id: 'events', class: 'timeline' });
  const ckpts = el('ol', { id: 'checkpoints', class: 'ckpts' });
  root.append(el('p', {}, el('a', { href: '#/', text: '← all jobs' })),
      el('section', { id: 'job-header' }, title,
         el('dl', { class: 'facts' }, fact('state', el('dd', {}, chip)), fact('generation', gen),
            FACTS.map(([label], i) => fact(label, dds[i]))),
         failure, el('p', {}, traceLink)),
      el('div', { class: 'charts' },
         el('figure', {}, el('figcaption', {}, el('h3', { text: 'loss' }),
                             el('span', { class: 'key-loss', text: '— loss' }),
                             el('span', { class: 'key-val', text: '- - val_loss' }), lossNote), lossSvg),
         el('figure', {}, el('figcaption', {}, el('h3', { text: 'tokens/s' }), tpsNote), tpsSvg)),
      el('section', { id: 'workers' }, el('h2', { text: 'Workers' }), workers),
      el('div', { class: 'lists' }, el('section', {}, el('h2', { text: 'Events and failures' }), events),
         el('section', {}, el('h2', { text: 'Checkpoints' }), ckpts)));

  let points = [];
  const drawCharts = () => {
    const loss = seriesOf(points, 'loss', 'loss'), tps = seriesOf(points, 'tokens_per_s', 'tps');
    drawChart(lossSvg, [...loss, ...seriesOf(points, 'val_loss', 'val')]);
    drawChart(tpsSvg, tps);
    lossSvg.setAttribute('data-points', countPts(loss));
    tpsSvg.setAttribute('data-points', countPts(tps));
    // The generation of the newest loss point: says which generation the chart last grew by.
    const newest = points.filter((p) => isNum(p.loss) && isNum(p.step)).pop();
    lossSvg.setAttribute('data-generation', newest ? (newest.generation ?? 0) : '');
    const last = points[points.length - 1];
    lossNote.textContent = last ? 'step ' + last.step + ': ' + num(last.loss, 4) : '';
    tpsNote.textContent = last ? int(last.tokens_per_s) + ' tokens/s, ' + num(last.step_ms, 1) + ' ms a step' : '';
  };
  // The job's JSON (GET base + query), or null once the coordinator says it has no such job.
  const fetchJob = async (query) => {
    try {
      return await api(base + query);
    } catch (e) {
      if (e.status !== 404) throw e;
      title.textContent = 'Job ' + id + ': unknown to the coordinator';
      return null;
    }
  };
  return poll(async (stopped) => {
    // The coordinator numbers a job's points as they come ("seq": a new generation resumes from
    // a checkpoint at steps already seen, so steps would not do). Its numbers grow for as long
    // as it runs and start above any earlier coordinator's (they are based on its start time),
    // so the page asks for the points after the last one it has, or for all of them (thinned by
    // the server) at first.
    const last = points[points.length - 1], after = last && isNum(last.seq) ? last.seq : null;
    let d = await fetchJob(after === null ? '' : '?after=' + after);
    if (!d || stopped()) return false;
    // "last_seq" is the newest seq the coordinator has. Below `after`, it is one whose clock
    // was behind the one the page's points came from, and it would send no point for a long
    // while: ask it again at once for all its points, which replace the page's. Asking in the
    // same tick means the chart goes from the old points to the new ones, never blank between.
    let reset = after === null;
    if (!reset && isNum(d.last_seq) && d.last_seq < after) {
      d = await fetchJob('');
      if (!d || stopped()) return false;
      reset = true;
    }
    const j = d.job || {}, metrics = d.metrics || [];
    updated();
    title.textContent = 'Job ' + id + (j.name ? ' · ' + j.name : '');
    setState(chip, j.state);
    gen.textContent = String(j.generation ?? dash);
    FACTS.forEach(([, text], i) => (dds[i].textContent = text(j)));
    const why = typeof j.failure === 'string' ? j.failure : j.failure ? JSON.stringify(j.failure) : '';
    failure.textContent = why ? 'failure: ' + why : '';
    renderWorkers(workers, j);

    if (reset) points = metrics.slice();
    else points.push(...metrics);
    if (points.length > MAX_POINTS) {
      const half = points.length >> 1;
      points = points.slice(0, half).filter((_, i) => i % 2 === 0).concat(points.slice(half));
    }
    if (reset || metrics.length) drawCharts();
    renderList(events, d.events || [], eventItem, 'No events yet', foldEvents);
    renderList(ckpts, d.checkpoints || [], checkpointItem, 'No checkpoints yet');
    traceLink.hidden = j.has_trace !== true;
  });
}

// ---------------------------------------------------------------- routes

let stopView = null;
function route() {
  if (stopView) stopView();
  stopView = null;
  showBanner(null);
  const root = el('div'), h = location.hash.replace(/^#/, '') || '/';
  document.getElementById('view').replaceChildren(root);
  let m;
  try {
    if ((m = h.match(/^\/job\/([^/]+)\/trace$/))) stopView = traceView(root, decodeURIComponent(m[1]));
    else if ((m = h.match(/^\/job\/([^/]+)$/))) stopView = jobView(root, decodeURIComponent(m[1]));
    else stopView = jobsView(root);
  } catch (e) {
    if (!(e instanceof URIError)) throw e;
    root.append(el('p', { text: 'No such page: ' + h }));  // a malformed %-escape in the address
  }
}
window.addEventListener('hashchange', route);
route();
