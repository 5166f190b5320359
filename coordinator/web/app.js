// troupe's dashboard: one page, three hash routes, each polling the coordinator once a second.
//
//   #/                  jobs, agents, free devices, queue           GET /api/jobs
//   #/job/<id>          header, charts, worker grid, events, ckpts  GET /api/jobs/<id>?after=<step>
//   #/job/<id>/trace    the merged trace on a canvas                GET /api/jobs/<id>/trace
//
// The coordinator serves this file under a Content-Security-Policy that allows only its own
// files: no inline script or style, no eval. Every string from the JSON reaches the DOM as
// text (textContent, text nodes, attribute values), never as markup, so a job named
// "<img src=x onerror=...>" shows as just that text. Off loopback the coordinator wants the
// API token: the page takes it from its own address (/?token=T) and sends it on every fetch.
'use strict';

const TOKEN = new URLSearchParams(location.search).get('token');
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
  else if (err.status === 401 || err.status === 403)
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
    summary.replaceChildren(fact(int(d.queue), 'queued'), fact((d.agents || []).length, 'agents'), ...devices);
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
  for (const t of ticks(x0, x1, 6))
    if (t === Math.round(t)) kids.push(svgEl('text', { x: X(t), y: H - 10, 'text-anchor': 'middle' }, shortNum(t)));
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
  const fits = (w) => isNum(w.dp) && isNum(w.pp) && isNum(w.tp) && w.dp < D && w.pp < P && w.tp < T;
  if (!(D > 0 && P > 0 && T > 0 && workers.length && workers.every(fits))) {
    box.replaceChildren(workers.length ? el('div', { class: 'flat-workers' }, workers.map(cell))
                                       : el('p', { class: 'muted', text: 'No workers yet' }));
    return;
  }
  const blocks = [];
  for (let d = 0; d < D; d++) {
    const stages = [];
    for (let p = 0; p < P; p++) {
      const row = workers.filter((w) => w.dp === d && w.pp === p).sort((a, b) => a.tp - b.tp);
      stages.push(el('div', { class: 'stage' }, el('span', { class: 'stage-label', text: 'stage ' + p }),
                     row.map(cell)));
    }
    blocks.push(el('div', { class: 'dp-block' }, el('h3', { text: 'data-parallel replica ' + d }), stages));
  }
  box.replaceChildren(el('div', { class: 'dp-blocks' }, blocks));
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
    const last = points[points.length - 1];
    lossNote.textContent = last ? 'step ' + last.step + ': ' + num(last.loss, 4) : '';
    tpsNote.textContent = last ? int(last.tokens_per_s) + ' tokens/s, ' + num(last.step_ms, 1) + ' ms a step' : '';
  };
  return poll(async (stopped) => {
    // The coordinator numbers a job's points as they come ("seq", never reused: a new generation
    // resumes from a checkpoint at steps already seen, so steps would not do): the page asks for
    // the points after the last one it has, or for all of them (thinned by the server) at first.
    const last = points[points.length - 1], after = last && isNum(last.seq) ? last.seq : null;
    let d;
    try {
      d = await api(base + (after === null ? '' : '?after=' + after));
    } catch (e) {
      if (e.status !== 404) throw e;
      title.textContent = 'Job ' + id + ': unknown to the coordinator';
      return false;
    }
    if (stopped()) return false;
    const j = d.job || {}, metrics = d.metrics || [];
    updated();
    title.textContent = 'Job ' + id + (j.name ? ' · ' + j.name : '');
    setState(chip, j.state);
    gen.textContent = String(j.generation ?? dash);
    FACTS.forEach(([, text], i) => (dds[i].textContent = text(j)));
    const why = typeof j.failure === 'string' ? j.failure : j.failure ? JSON.stringify(j.failure) : '';
    failure.textContent = why ? 'failure: ' + why : '';
    renderWorkers(workers, j);

    // A coordinator restarted since numbers from 1 again: start over from its points.
    const reset = after === null || (isNum(d.last_seq) && d.last_seq < after);
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

// ---------------------------------------------------------------- #/job/<id>/trace

const MAX_SPANS = 20000;  // drawn at most: the earliest ones; the page says how many it left out
const CATS = ['compute', 'comm', 'optimizer', 'data', 'checkpoint', 'eval', 'other'];
const FRAME = new Set(['step', 'schedule']);  // the engine's frames: thin bands above the work
const GUTTER = 190, AXIS_H = 26, BAND_H = 5, ROW_H = 18, LANE_GAP = 8;

// Chrome trace-event JSON -> lanes, one per (rank, track), in rank and track order:
//   {label, sub, y, h, bands: 0|2, rows, spans: [{ts, dur, name, cat, args, band, row}]}
// Frames take band row 0 (step) or 1 (schedule); the other spans nest below them by depth.
function layoutTrace(doc) {
  const procName = new Map(), trackName = new Map(), trackSort = new Map(), spans = [];
  for (const e of doc.traceEvents || []) {
    if (e.ph === 'M' && e.args) {
      if (e.name === 'process_name') procName.set(e.pid, String(e.args.name ?? ''));
      else if (e.name === 'thread_name') trackName.set(e.pid + ':' + e.tid, String(e.args.name ?? ''));
      else if (e.name === 'thread_sort_index') trackSort.set(e.pid + ':' + e.tid, e.args.sort_index);
    } else if (e.ph === 'X' && isNum(e.ts)) {
      spans.push({ ts: e.ts, dur: isNum(e.dur) ? Math.max(0, e.dur) : 0, name: String(e.name ?? ''),
                   cat: String(e.cat ?? ''), args: e.args, pid: e.pid, tid: e.tid });
    }
  }
  spans.sort((a, b) => a.ts - b.ts || b.dur - a.dur);
  const drawn = spans.slice(0, MAX_SPANS), lanes = new Map();
  for (const s of drawn) {
    const key = s.pid + ':' + s.tid;
    if (!lanes.has(key)) {
      const [rank, place] = (procName.get(s.pid) ?? 'rank ' + s.pid).split(/:\s*/, 2);
      lanes.set(key, { pid: s.pid, sort: trackSort.get(key) ?? s.tid, spans: [], bands: 0, rows: 0,
                       label: rank + ' · ' + (trackName.get(key) ?? 'track ' + s.tid), sub: place || '' });
    }
    lanes.get(key).spans.push(s);
  }
  const ordered = [...lanes.values()].sort((a, b) => a.pid - b.pid || a.sort - b.sort);
  let y = AXIS_H, t0 = Infinity, t1 = -Infinity;
  for (const lane of ordered) {
    const open = [];  // end times of the spans that enclose the next one
    for (const s of lane.spans) {
      t0 = Math.min(t0, s.ts);
      t1 = Math.max(t1, s.ts + s.dur);
      if (FRAME.has(s.cat)) { s.band = true; s.row = s.cat === 'step' ? 0 : 1; lane.bands = 2; continue; }
      while (open.length && open[open.length - 1] <= s.ts) open.pop();
      s.row = open.length;
      open.push(s.ts + s.dur);
      lane.rows = Math.max(lane.rows, s.row + 1);
    }
    lane.y = y;
    lane.h = Math.max(32, lane.bands * BAND_H + Math.max(1, lane.rows) * ROW_H) + LANE_GAP;  // room for 2 label lines
    y += lane.h;
  }
  return { lanes: ordered, total: spans.length, drawn: drawn.length, t0, t1, height: y + 4 };
}

function traceView(root, id) {
  const note = el('p', { class: 'note muted', text: 'Loading the merged trace…' });
  const canvas = el('canvas', { id: 'trace-view', 'data-spans': 0 }), tip = el('div', { class: 'tip', hidden: true });
  const shares = el('div'), css = getComputedStyle(document.documentElement), colour = {};
  for (const c of [...CATS, 'frame']) colour[c] = css.getPropertyValue('--cat-' + c).trim() || '#888';
  root.append(el('p', {}, el('a', { href: jobHref(id), text: '← job ' + id })),
              el('h1', { text: 'Trace of job ' + id }), note, el('div', { class: 'legend' }, [...CATS, 'frame'].map((c) =>
                  el('span', {}, el('span', { class: 'swatch cat-' + c }), c === 'frame' ? 'step / schedule' : c))),
              el('div', { class: 'trace-wrap' }, canvas, tip), shares,
              el('p', { class: 'muted', text: 'Wheel to zoom, drag to pan, double-click to see it all.' }));
  let t = null, v0 = 0, v1 = 1, drag = null;  // [v0, v1): the microseconds in view
  const plotW = () => canvas.clientWidth - GUTTER - 10;
  const X = (ts) => GUTTER + ((ts - v0) / (v1 - v0)) * plotW();
  const timeAt = (mx) => v0 + ((mx - GUTTER) / plotW()) * (v1 - v0);

  const draw = () => {
    const w = canvas.parentElement.clientWidth, h = t.height, dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = w + 'px';  // CSSOM, which the policy allows (a style="" attribute it would not)
    canvas.style.height = h + 'px';
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.font = '11px "DejaVu Sans", sans-serif';
    g.textBaseline = 'middle';
    g.fillStyle = '#f7f8fa';
    t.lanes.forEach((lane, i) => i % 2 && g.fillRect(0, lane.y, w, lane.h));
    g.fillStyle = '#6b7385';
    g.strokeStyle = '#e3e6ec';
    for (const ms of ticks((v0 - t.t0) / 1000, (v1 - t.t0) / 1000, 10)) {  // ms from the first span
      const x = X(t.t0 + ms * 1000);
      if (x < GUTTER) continue;
      g.beginPath(); g.moveTo(x, AXIS_H - 4); g.lineTo(x, h); g.stroke();
      if (x < w - 50) g.fillText(shortNum(ms) + ' ms', x + 3, 10);
    }
    t.lanes.forEach((lane, i) => {
      g.fillStyle = '#1d2330';
      g.fillText(lane.label, 8, lane.y + 10, GUTTER - 14);
      g.fillStyle = '#6b7385';
      if (i === 0 || t.lanes[i - 1].pid !== lane.pid) g.fillText(lane.sub, 8, lane.y + 24, GUTTER - 14);
      for (const s of lane.spans) {
        const x0 = Math.max(GUTTER, X(s.ts)), x1 = Math.min(w, X(s.ts + s.dur));
        if (x1 < GUTTER || x0 > w) continue;
        const y = lane.y + (s.band ? s.row * BAND_H : lane.bands * BAND_H + s.row * ROW_H + 1);
        const hh = s.band ? BAND_H - 1 : ROW_H - 2, ww = Math.max(1, x1 - x0 - (x1 - x0 > 3 ? 1 : 0));
        g.fillStyle = s.band ? colour.frame : colour[CATS.includes(s.cat) ? s.cat : 'other'];
        g.fillRect(x0, y, ww, hh);
        const fit = Math.floor((ww - 6) / 6.5);  // characters of 11px text
        if (s.band || fit < 3) continue;
        g.fillStyle = '#fff';
        g.fillText(s.name.length > fit ? s.name.slice(0, fit - 1) + '…' : s.name, x0 + 3, y + hh / 2 + 0.5);
      }
    });
  };

  // The span under the mouse (the shortest of those within 2 px), with its lane.
  const spanAt = (mx, my) => {
    const lane = t.lanes.find((l) => my >= l.y && my < l.y + l.h);
    if (!lane || mx < GUTTER) return null;
    const dy = my - lane.y, band = dy < lane.bands * BAND_H;
    const row = band ? Math.floor(dy / BAND_H) : Math.floor((dy - lane.bands * BAND_H) / ROW_H);
    const at = timeAt(mx), slack = ((v1 - v0) / plotW()) * 2;
    let best = null;
    for (const s of lane.spans)
      if (!!s.band === band && s.row === row && s.ts - slack <= at && at <= s.ts + s.dur + slack &&
          (!best || s.dur < best.dur)) best = s;
    return best && { lane, s: best };
  };
  const showTip = (ev) => {
    const r = canvas.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
    const hit = t && spanAt(mx, my);
    tip.hidden = !hit;
    if (!hit) return;
    const { s, lane } = hit, ms = (us) => (us / 1000).toFixed(3) + ' ms';
    const args = Object.entries(s.args || {}).map(([k, v]) => k + ': ' + (typeof v === 'object' ? JSON.stringify(v) : v));
    const when = 'at ' + ms(s.ts - t.t0) + ', for ' + ms(s.dur);
    tip.textContent = [s.name, s.cat + ' · ' + lane.label, when, ...args].join('\n');
    tip.style.left = Math.max(0, Math.min(mx + 14, canvas.clientWidth - 370)) + 'px';
    const below = my + 16 + tip.offsetHeight <= canvas.clientHeight;  // else above the mouse
    tip.style.top = (below ? my + 16 : Math.max(0, my - 8 - tip.offsetHeight)) + 'px';
  };
  canvas.addEventListener('mousemove', (ev) => {
    if (!drag || !t) return showTip(ev);
    const d = ((ev.clientX - drag.x) / plotW()) * (drag.v1 - drag.v0);
    v0 = drag.v0 - d;
    v1 = drag.v1 - d;
    draw();
  });
  canvas.addEventListener('mousedown', (ev) => { drag = { x: ev.clientX, v0, v1 }; });
  const onUp = () => { drag = null; }, onResize = () => t && draw();
  window.addEventListener('mouseup', onUp);
  window.addEventListener('resize', onResize);
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  canvas.addEventListener('dblclick', () => { if (t) { v0 = t.t0; v1 = t.t1; draw(); } });
  canvas.addEventListener('wheel', (ev) => {
    if (!t) return;
    ev.preventDefault();
    const at = timeAt(ev.clientX - canvas.getBoundingClientRect().left), k = Math.exp(Math.sign(ev.deltaY) * 0.2);
    v0 = at - (at - v0) * k;
    v1 = Math.max(v0 + 10, at + (v1 - at) * k);  // 10 µs across at the closest
    draw();
  }, { passive: false });

  const stop = poll(async (stopped) => {
    let doc;
    try {
      doc = await api('/api/jobs/' + encodeURIComponent(id) + '/trace');
    } catch (e) {
      if (e.status !== 404) throw e;
      note.textContent = 'No merged trace for this job yet: trace some steps (train.trace) and run ' +
                         '`troupe trace merge RUN_DIR`. This page looks again every 5 s.';
      return true;
    }
    if (stopped()) return false;
    t = layoutTrace(doc);
    if (!t.drawn) { note.textContent = 'The merged trace has no spans.'; return false; }
    v0 = t.t0;
    v1 = t.t1;
    canvas.setAttribute('data-spans', t.drawn);
    note.textContent = t.drawn + ' spans on ' + t.lanes.length + ' lanes over ' + ((t.t1 - t.t0) / 1000).toFixed(1) +
                       ' ms' + (t.drawn < t.total ? ': only the first ' + t.drawn + ' of ' + t.total +
                                                    ' spans are drawn, a cap that keeps the page responsive' : '');
    // The per-step shares that `troupe trace merge` printed, kept in the file's "troupe" section.
    const keys = ['compute', 'comm', 'other', 'idle', 'bubble'], td = (text) => el('td', { class: 'num', text });
    const pct = (x) => (isNum(x) ? (x * 100).toFixed(1) + '%' : dash);
    const rows = ((doc.troupe && doc.troupe.shares) || [])
                     .map((s) => el('tr', {}, td(s.step), td(num(s.wall_ms, 1)), keys.map((k) => td(pct(s[k])))));
    const heads = [['step', 'num'], ['wall ms', 'num'], ...keys.map((k) => [k, 'num'])];
    if (rows.length)
      shares.replaceChildren(el('h2', { text: 'Where each step went' }), table('shares', heads, el('tbody', {}, rows)));
    draw();
    return false;
  }, 5000);
  return () => { stop(); window.removeEventListener('mouseup', onUp); window.removeEventListener('resize', onResize); };
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
