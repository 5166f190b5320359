// A minimal Chrome DevTools protocol client over --remote-debugging-pipe, with no packages:
// the browser reads commands from its fd 3 and writes replies and events to its fd 4, each
// message one JSON object followed by '\0'.
//
//   const b = await Browser.launch({ userDataDir });
//   const page = await b.newPage();              // a tab, attached with a flat session
//   await page.send('Page.navigate', { url });
//   page.on('Runtime.exceptionThrown', (p) => ...);
//   const v = await page.eval('document.title');
//   await b.close();
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const CANDIDATES = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];

export function findChromium() {
  if (process.env.CHROMIUM) return fs.existsSync(process.env.CHROMIUM) ? process.env.CHROMIUM : null;
  return CANDIDATES.find((p) => fs.existsSync(p)) ?? null;
}

// One attached target: commands go out with its sessionId, its events come back to on().
class Session {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    this.handlers = new Map();
  }
  send(method, params = {}) { return this.browser.send(method, params, this.sessionId); }
  on(method, fn) { this.handlers.set(method, [...(this.handlers.get(method) ?? []), fn]); }
  emit(method, params) { for (const fn of this.handlers.get(method) ?? []) fn(params); }

  // The value of a page expression (awaited when it is a promise); a thrown one rejects.
  async eval(expression) {
    const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) {
      const d = r.exceptionDetails;
      throw new Error('page expression failed: ' + (d.exception?.description ?? d.text) + '\n  ' + expression);
    }
    return r.result.value;
  }
}

export class Browser {
  // Starts chromium headless with a fresh profile. `log` receives its stderr lines.
  static async launch({ executable, userDataDir, width = 1400, height = 1000, log = () => {} }) {
    const args = ['--headless=new', '--no-sandbox', '--disable-gpu', '--remote-debugging-pipe',
                  `--user-data-dir=${userDataDir}`, `--window-size=${width},${height}`,
                  '--no-first-run', '--no-default-browser-check', '--disable-extensions',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--disable-dev-shm-usage', '--hide-scrollbars', '--mute-audio', 'about:blank'];
    const child = spawn(executable, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
    const b = new Browser(child);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (t) => { for (const line of t.split('\n')) if (line.trim()) log(line); });
    await new Promise((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    await b.send('Target.setDiscoverTargets', { discover: true });
    return b;
  }

  constructor(child) {
    this.child = child;
    this.nextId = 1;
    this.pending = new Map();
    this.sessions = new Map();
    this.exited = false;
    this.out = child.stdio[3];
    let buf = '';
    child.stdio[4].setEncoding('utf8');
    child.stdio[4].on('data', (chunk) => {
      buf += chunk;
      for (let end; (end = buf.indexOf('\0')) >= 0;) {
        const text = buf.slice(0, end);
        buf = buf.slice(end + 1);
        this.dispatch(JSON.parse(text));
      }
    });
    child.on('exit', (code, signal) => {
      this.exited = true;
      for (const { reject, method } of this.pending.values())
        reject(new Error(`chromium exited (${signal ?? code}) before answering ${method}`));
      this.pending.clear();
    });
  }

  dispatch(msg) {
    if (msg.id !== undefined) {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}${msg.error.data ? ' (' + msg.error.data + ')' : ''}`));
      else p.resolve(msg.result);
      return;
    }
    const s = msg.sessionId ? this.sessions.get(msg.sessionId) : null;
    if (s) s.emit(msg.method, msg.params);
  }

  // Every command gets an answer or an error within timeoutMs: a browser that hangs fails the
  // caller, it never stalls it.
  send(method, params = {}, sessionId = undefined, timeoutMs = 60000) {
    if (this.exited) return Promise.reject(new Error(`chromium is gone (sending ${method})`));
    const id = this.nextId++;
    const msg = { id, method, params };
    if (sessionId) msg.sessionId = sessionId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method}: no answer from chromium in ${timeoutMs / 1000} s`));
      }, timeoutMs);
      this.pending.set(id, {
        method,
        resolve: (v) => { clearTimeout(timer); resolve(v); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.out.write(JSON.stringify(msg) + '\0');
    });
  }

  // The first tab, attached; Page, Runtime and Log events enabled.
  async newPage() {
    const { targetInfos } = await this.send('Target.getTargets');
    let target = targetInfos.find((t) => t.type === 'page');
    if (!target) target = { targetId: (await this.send('Target.createTarget', { url: 'about:blank' })).targetId };
    const { sessionId } = await this.send('Target.attachToTarget', { targetId: target.targetId, flatten: true });
    const s = new Session(this, sessionId);
    this.sessions.set(sessionId, s);
    await s.send('Page.enable');
    await s.send('Runtime.enable');
    await s.send('Log.enable');
    return s;
  }

  // Asks the browser to close, then kills it if it has not gone within 5 s.
  async close() {
    if (this.exited) return;
    const gone = new Promise((resolve) => this.child.once('exit', resolve));
    this.send('Browser.close', {}, undefined, 5000).catch(() => {});
    const timer = setTimeout(() => this.kill(), 5000);
    await gone;
    clearTimeout(timer);
  }
  kill() { if (!this.exited) this.child.kill('SIGKILL'); }
}
