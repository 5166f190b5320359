// troupe's dashboard, the trace view (#/job/<id>/trace): the merged trace of a job on a canvas,
// one lane per (rank, track), with the per-step shares `troupe trace merge` computed below it.
//
//   GET /api/jobs/<id>/trace   Chrome trace-event JSON (troupe trace merge's output)
//
// A classic script like app.js, which it shares one global scope with: it uses app.js's helpers
// (el, table, isNum, num, dash, jobHref, ticks, shortNum, api, poll) and app.js's router calls
// its traceView. index.html loads it first, since app.js's last line draws the first view; the
// helpers are only looked up when traceView runs, by then both files have loaded.
'use strict';

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
