/*
 * cinder's web page: a single-page app with hash routing, no dependencies besides uPlot.
 *
 * Views:
 *   #/            Runs: a table of the runs and checkpoints the server knows (GET /api/runs),
 *                 refreshed every 3 s.
 *   #/run/ID      Run page: the loss curves (train and val against iteration) drawn with uPlot
 *                 and fed by polling GET /api/metrics every 2 s from the offset the last answer
 *                 gave; the summary, samples and config (GET /api/run every 5 s); and attention
 *                 maps of a text (POST /api/attention) drawn as a heatmap on a canvas.
 *   #/play[/ID]   Playground: a completion form streaming POST /v1/completions (server-sent
 *                 events read with fetch), with live tokens/s (every chunk carries the
 *                 tokens written so far) and the finish reason. Each token is shaded by the
 *                 probability the model gave it (logprobs), and hovering or tapping it shows the
 *                 5 most likely tokens there. "Score a text" asks for the log-probabilities of a
 *                 pasted text (echo, max_tokens 0) and shades each token by its surprise, with
 *                 evaluate's figures; "Tokens" shows the model's pieces of it (POST /tokenize).
 *
 * Every request goes through api(). When the server answers 401 it shows a small form asking
 * for the API key, keeps the key in localStorage ("cinder-api-key") and retries.
 */
'use strict';

const KEY_STORE = 'cinder-api-key';
const ACCENT = [37, 99, 235]; // the accent colour (#2563eb), also the heatmap's top
const VAL_COLOUR = '#e8590c';

// ---------------------------------------------------------------- helpers

const $ = (sel, root = document) => root.querySelector(sel);

/** Escapes text for use inside HTML templates. */
function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

/** A model id (which may contain '/') as it goes in a hash route: each segment URI-encoded. */
const encId = (id) => id.split('/').map(encodeURIComponent).join('/');
const decId = (s) => s.split('/').map((part) => {
  try { return decodeURIComponent(part); } catch (e) { return part; } // a hand-typed '%'
}).join('/');

/** Parameter counts as e.g. 0.8M or 45.2K. */
function fmtParams(p) {
  if (p == null) return '?';
  if (p >= 1e9) return `${(p / 1e9).toFixed(1)}B`;
  if (p >= 1e5) return `${(p / 1e6).toFixed(1)}M`;
  return `${(p / 1e3).toFixed(1)}K`;
}

/** "4L 4H 128C ctx 64, 0.8M params", or "–" when the checkpoint could not be read. */
function fmtArch(a) {
  if (!a) return '–';
  return `${a.n_layer}L ${a.n_head}H ${a.n_embd}C ctx ${a.block_size}, ${fmtParams(a.params)} params`;
}

const fmtLoss = (v) => (v == null ? '–' : Number(v).toFixed(3));
const fmtIter = (v) => (v == null ? '–' : String(v));
const badge = (training) =>
  training ? '<span class="badge training">training</span>' : '<span class="badge idle">idle</span>';

/** Shows an error in a slot element (a `.error` inside it), or clears it when msg is empty. */
function setError(slot, msg) {
  if (!slot) return;
  slot.innerHTML = msg ? `<div class="error" role="alert">${esc(msg)}</div>` : '';
}

/** Shows a token readably: newline as ⏎, space as ␣, tab as ⇥. */
const showToken = (t) => t.replace(/\n/g, '⏎').replace(/ /g, '␣').replace(/\t/g, '⇥');

// ---------------------------------------------------------------- API and the key form

class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

let keyPrompt = null; // a promise while the key form is shown, shared by all waiting requests

/** Shows the key form; resolves when a key has been saved. */
function askForKey(message) {
  if (keyPrompt) return keyPrompt;
  const form = $('#auth');
  $('#auth-message').textContent = message || '';
  form.hidden = false;
  $('#api-key').value = '';
  $('#api-key').focus();
  keyPrompt = new Promise((resolve) => {
    form.onsubmit = (e) => {
      e.preventDefault();
      const key = $('#api-key').value.trim();
      if (!key) return;
      localStorage.setItem(KEY_STORE, key);
      form.hidden = true;
      keyPrompt = null;
      updateForgetButton();
      resolve();
    };
  });
  return keyPrompt;
}

function updateForgetButton() {
  $('#api-key-forget').hidden = !localStorage.getItem(KEY_STORE);
}

/** The message of an error answer: {"error":{"message":...}}, or the body, or the status. */
async function errorMessage(res) {
  const text = await res.text().catch(() => '');
  try {
    const j = JSON.parse(text);
    if (j && j.error) return typeof j.error === 'string' ? j.error : j.error.message || JSON.stringify(j.error);
  } catch (_) { /* not JSON */ }
  return text.trim() || `HTTP ${res.status} ${res.statusText}`;
}

/**
 * Every request to the server. `body` (an object) is sent as JSON; the answer is parsed as JSON,
 * or returned as the Response when `raw` is set (for streams). Throws ApiError on non-2xx.
 */
async function api(path, { method = 'GET', body, signal, raw = false } = {}) {
  for (;;) {
    const key = localStorage.getItem(KEY_STORE);
    const headers = {};
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method, headers, signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (res.status === 401) {
      const message = await errorMessage(res);
      const now = localStorage.getItem(KEY_STORE);
      if (now && now !== key) continue; // a new key was saved meanwhile: try it
      if (now) localStorage.removeItem(KEY_STORE); // the stored key is wrong
      updateForgetButton();
      await askForKey(key ? `That key was refused: ${message}` : '');
      continue;
    }
    if (!res.ok) throw new ApiError(await errorMessage(res), res.status);
    return raw ? res : res.json();
  }
}

// ---------------------------------------------------------------- routing and view lifetime

let viewGen = 0;      // bumped on each route change; async work checks it before touching the page
let leaving = [];     // what to undo when the view changes (timers, charts, streams)

const onLeave = (fn) => leaving.push(fn);

/** Runs fn now and then every ms milliseconds after it finishes, while this view is shown. */
function every(ms, fn) {
  const gen = viewGen;
  let timer = null;
  const tick = async () => {
    if (gen !== viewGen) return;
    try { await fn(); } catch (e) { console.error(e); }
    if (gen === viewGen) timer = setTimeout(tick, ms);
  };
  onLeave(() => clearTimeout(timer));
  tick();
}

function route() {
  leaving.forEach((fn) => { try { fn(); } catch (e) { console.error(e); } });
  leaving = [];
  viewGen += 1;
  const hash = location.hash.replace(/^#/, '') || '/';
  const view = $('#view');
  let m;
  if ((m = hash.match(/^\/run\/(.+)$/))) {
    setNav('');
    runView(view, decId(m[1]));
  } else if ((m = hash.match(/^\/play(?:\/(.*))?$/))) {
    setNav('play');
    playView(view, m[1] ? decId(m[1]) : null);
  } else {
    setNav('runs');
    runsView(view);
  }
}

function setNav(which) {
  $('#nav-runs').classList.toggle('active', which === 'runs');
  $('#nav-play').classList.toggle('active', which === 'play');
}

// ---------------------------------------------------------------- #/ Runs

function runsView(view) {
  view.innerHTML = `
    <h1>Runs</h1>
    <div class="error-slot"></div>
    <table id="runs">
      <thead><tr><th>Name</th><th>Architecture</th><th class="num">Iteration</th>
        <th class="num">Best val</th><th>Status</th></tr></thead>
      <tbody><tr class="empty"><td colspan="5" class="muted">Loading…</td></tr></tbody>
    </table>`;
  const gen = viewGen;
  every(3000, async () => {
    let runs;
    try {
      runs = (await api('/api/runs')).runs || [];
    } catch (e) {
      if (gen === viewGen) setError($('.error-slot', view), `Could not list the runs: ${e.message}`);
      return;
    }
    if (gen !== viewGen) return;
    setError($('.error-slot', view), '');
    $('#runs tbody').innerHTML = runs.length
      ? runs.map((r) => `
        <tr data-run="${esc(r.id)}">
          <td><a href="#/run/${esc(encId(r.id))}">${esc(r.id)}</a>${r.kind === 'checkpoint' ? ' <span class="tag">checkpoint</span>' : ''}</td>
          <td>${esc(fmtArch(r.arch))}</td>
          <td class="num">${fmtIter(r.iter)}</td>
          <td class="num">${fmtLoss(r.best_val)}</td>
          <td>${badge(r.training)}</td>
        </tr>`).join('')
      : '<tr class="empty"><td colspan="5" class="muted">No runs found.</td></tr>';
  });
}

// ---------------------------------------------------------------- #/run/ID Run page

function runView(view, id) {
  const gen = viewGen;
  const alive = () => gen === viewGen;
  view.innerHTML = `
    <p class="crumbs"><a href="#/">Runs</a> /</p>
    <div class="run-head">
      <div>
        <h1 id="run-id">${esc(id)}</h1>
        <p id="summary" class="muted">Loading…</p>
      </div>
      <a id="open-playground" class="button" href="#/play/${esc(encId(id))}">Open in playground</a>
    </div>
    <div class="error-slot" id="run-error"></div>
    <section class="card">
      <h2>Loss</h2>
      <div id="curve"></div>
      <div class="error-slot" id="curve-error"></div>
    </section>
    <section class="card">
      <h2>Attention</h2>
      <div class="controls">
        <input id="attention-text" value="To be, or not to be" spellcheck="false">
        <button id="attention-go" type="button">Show attention</button>
        <label>Layer <select id="layer"></select></label>
        <label>Head <select id="head"></select></label>
      </div>
      <div class="error-slot" id="attention-error"></div>
      <div class="heatmap"><canvas id="attention-map" width="0" height="0"></canvas>
        <div id="attention-tip" class="tooltip" hidden></div></div>
    </section>
    <div class="two">
      <section class="card"><h2>Samples</h2><div id="samples"><p class="muted">Loading…</p></div></section>
      <section class="card"><h2>Config</h2><pre id="config">Loading…</pre></section>
    </div>`;

  // The loss chart: created once, then fed with setData.
  const curve = $('#curve');
  const cols = { iter: [], train: [], val: [] };
  const chart = new uPlot({
    width: curve.clientWidth || 800,
    height: 300,
    scales: { x: { time: false } },
    axes: [{ label: 'iteration' }, { label: 'loss' }],
    series: [
      { label: 'iter' },
      { label: 'train', stroke: `rgb(${ACCENT})`, width: 1.5, points: { show: false } },
      { label: 'val', stroke: VAL_COLOUR, width: 2, spanGaps: true,
        points: { show: true, size: 6, fill: VAL_COLOUR } },
    ],
  }, [[], [], []], curve);
  const resize = () => chart.setSize({ width: curve.clientWidth, height: 300 });
  window.addEventListener('resize', resize);
  onLeave(() => { window.removeEventListener('resize', resize); chart.destroy(); });

  let offset = 0;
  every(2000, async () => {
    let m;
    try {
      m = await api(`/api/metrics?id=${encodeURIComponent(id)}&offset=${offset}`);
    } catch (e) {
      if (alive()) setError($('#curve-error'), `Could not read the metrics: ${e.message}`);
      return;
    }
    if (!alive()) return;
    setError($('#curve-error'), '');
    if (m.reset) { cols.iter = []; cols.train = []; cols.val = []; }
    offset = m.offset;
    const c = m.columns || [];
    const [ii, ti, vi] = ['iter', 'train_loss', 'val_loss'].map((n) => c.indexOf(n));
    for (const row of m.rows || []) {
      cols.iter.push(row[ii]);
      cols.train.push(ti < 0 ? null : row[ti]);
      cols.val.push(vi < 0 ? null : row[vi]);
    }
    if (m.reset || (m.rows && m.rows.length)) chart.setData([cols.iter, cols.train, cols.val]);
    curve.dataset.rows = String(cols.iter.length); // rows drawn: what a test can watch grow
  });

  // Summary, samples and config.
  let shownSamples = '';
  every(5000, async () => {
    let r;
    try {
      r = await api(`/api/run?id=${encodeURIComponent(id)}`);
    } catch (e) {
      if (alive()) setError($('#run-error'), `Could not read the run: ${e.message}`);
      return;
    }
    if (!alive()) return;
    setError($('#run-error'), '');
    $('#summary').innerHTML = `${esc(r.kind || 'run')} · ${esc(fmtArch(r.arch))} · iteration ${fmtIter(r.iter)}`
      + ` · best val ${fmtLoss(r.best_val)} · ${badge(r.training)}`;
    const config = r.config == null ? 'no config.toml' : r.config;
    if ($('#config').textContent !== config) $('#config').textContent = config;
    const samples = r.samples || [];
    const key = samples.map((s) => `${s.iter}:${s.text.length}`).join(',');
    if (key === shownSamples) return; // unchanged: keep the reader's scroll position
    shownSamples = key;
    $('#samples').innerHTML = samples.length
      ? samples.slice().reverse().map((s) => `
        <div class="sample" data-iter="${esc(s.iter)}"><h4>iteration ${esc(s.iter)}</h4><pre>${esc(s.text)}</pre></div>`).join('')
      : '<p class="muted">No samples yet.</p>';
  });

  attentionPanel(id, alive);
}

/** The attention maps of the run page: fetch, choose layer and head, draw, hover. */
function attentionPanel(id, alive) {
  const layerSel = $('#layer');
  const headSel = $('#head');
  const canvas = $('#attention-map');
  const tip = $('#attention-tip');
  let data = null;   // {tokens, weights}
  let geom = null;   // where the last drawing put its cells

  const fill = (sel, n) => {
    const keep = Math.min(Number(sel.value) || 0, n - 1);
    sel.innerHTML = Array.from({ length: n }, (_, i) => `<option value="${i}">${i}</option>`).join('');
    sel.value = String(keep);
  };

  async function load() {
    const go = $('#attention-go');
    go.disabled = true;
    try {
      const d = await api('/api/attention', { method: 'POST', body: { model: id, text: $('#attention-text').value } });
      if (!alive()) return;
      setError($('#attention-error'), '');
      data = d;
      fill(layerSel, d.weights.length);
      fill(headSel, d.weights.length ? d.weights[0].length : 0);
      draw();
    } catch (e) {
      if (alive()) setError($('#attention-error'), e.message);
    } finally {
      go.disabled = false;
    }
  }

  function draw() {
    if (!data || !data.weights.length) return;
    const w = data.weights[Number(layerSel.value)][Number(headSel.value)];
    const labels = data.tokens.map(showToken);
    const n = labels.length;
    const cell = Math.max(8, Math.min(28, Math.floor(640 / Math.max(n, 1))));
    const fontPx = Math.max(7, Math.min(12, cell - 2));
    const ctx = canvas.getContext('2d');
    ctx.font = `${fontPx}px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    const labelW = Math.ceil(Math.max(10, ...labels.map((l) => ctx.measureText(l).width))) + 8;
    const left = labelW;
    const top = labelW;
    const width = left + n * cell + 4;
    const height = top + n * cell + 4;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    // Cells: white at 0, the accent at 1.
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) {
        const v = Math.max(0, Math.min(1, (w[q] && w[q][k]) || 0));
        const [r, g, b] = ACCENT.map((c) => Math.round(255 + (c - 255) * v));
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
      }
    }
    ctx.strokeStyle = '#d0d4db';
    ctx.strokeRect(left + 0.5, top + 0.5, n * cell - 1, n * cell - 1);
    // Labels: queries down the left, keys along the top (rotated).
    ctx.font = `${fontPx}px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    ctx.fillStyle = '#333';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'right';
    labels.forEach((l, i) => ctx.fillText(l, left - 4, top + i * cell + cell / 2));
    ctx.textAlign = 'left';
    labels.forEach((l, i) => {
      ctx.save();
      ctx.translate(left + i * cell + cell / 2, top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(l, 0, 0);
      ctx.restore();
    });
    geom = { left, top, cell, n, w, labels };
  }

  canvas.addEventListener('mousemove', (e) => {
    if (!geom) return;
    const rect = canvas.getBoundingClientRect();
    const x = e.clientX - rect.left;
    const y = e.clientY - rect.top;
    const k = Math.floor((x - geom.left) / geom.cell);
    const q = Math.floor((y - geom.top) / geom.cell);
    if (k < 0 || q < 0 || k >= geom.n || q >= geom.n) { tip.hidden = true; return; }
    const v = (geom.w[q] && geom.w[q][k]) || 0;
    tip.textContent = `query ${q} “${geom.labels[q]}” → key ${k} “${geom.labels[k]}”: ${v.toFixed(3)}`;
    tip.style.left = `${x + 14}px`;
    tip.style.top = `${y + 14}px`;
    tip.hidden = false;
  });
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  layerSel.addEventListener('change', draw);
  headSel.addEventListener('change', draw);
  $('#attention-go').addEventListener('click', load);
  $('#attention-text').addEventListener('keydown', (e) => { if (e.key === 'Enter') load(); });
}

// ---------------------------------------------------------------- token probabilities

/** What each shaded token span holds: its probability and the most likely tokens there. */
const tokenInfo = new WeakMap();

/** A token as shown in a list: its whitespace made visible. */
const visible = (t) => t.replace(/ /g, '·').replace(/\n/g, '↵').replace(/\t/g, '→');

/** The shading of a token of probability p: clear when the model was sure, red when surprised. */
const shade = (p) => `rgba(220, 38, 38, ${(0.55 * (1 - p)).toFixed(3)})`;

/**
 * Appends `piece` to `root` as a token span shaded by its probability, with its alternatives
 * (`top`: OpenAI's top_logprobs object, token to log-probability) for the hover box. A token
 * without a log-probability (a text's first) is plain text.
 */
function appendToken(root, piece, logprob, top) {
  if (logprob == null) {
    root.appendChild(document.createTextNode(piece));
    return;
  }
  const span = document.createElement('span');
  span.className = 'tok';
  span.textContent = piece;
  const p = Math.exp(logprob);
  span.style.background = shade(p);
  span.dataset.p = p.toFixed(4);
  tokenInfo.set(span, { piece, logprob, top: top || {} });
  root.appendChild(span);
}

/**
 * Appends a choice's text to `root`, token by token: `logprobs` are the chunk's (tokens,
 * token_logprobs, top_logprobs, text_offset), and `base` is where the chunk's text starts in
 * the choice's text, in characters. Returns the characters appended.
 */
function appendChunk(root, text, logprobs, base) {
  const chars = Array.from(text);
  if (!logprobs || !logprobs.tokens.length) {
    root.appendChild(document.createTextNode(text));
    return chars.length;
  }
  // A token whose text began in an earlier chunk (held back there while it might start a stop
  // string) starts this one.
  const starts = logprobs.text_offset.map((o) => Math.max(0, o - base));
  if (starts[0] > 0) root.appendChild(document.createTextNode(chars.slice(0, starts[0]).join('')));
  starts.forEach((start, i) => {
    const end = i + 1 < starts.length ? starts[i + 1] : chars.length;
    // A token holding part of a character has no text of its own: the next one shows it.
    if (end > start) {
      appendToken(root, chars.slice(start, end).join(''), logprobs.token_logprobs[i],
        logprobs.top_logprobs[i]);
    }
  });
  return chars.length;
}

/** The box that shows a token's alternatives, on hover or tap, for every token span. */
function alternativesBox() {
  let box = $('#alts');
  if (box) return box;
  box = document.createElement('div');
  box.id = 'alts';
  box.className = 'alts';
  box.hidden = true;
  document.body.appendChild(box);
  const show = (span) => {
    const info = tokenInfo.get(span);
    if (!info) return;
    const rows = Object.entries(info.top).sort((a, b) => b[1] - a[1]).map(([t, lp]) =>
      `<tr${t === info.piece ? ' class="chosen"' : ''}><td class="t">${esc(visible(t))}</td>` +
      `<td class="p">${(100 * Math.exp(lp)).toFixed(1)}%</td></tr>`).join('');
    box.innerHTML = `<div class="head"><b>${esc(visible(info.piece))}</b> ` +
      `${(100 * Math.exp(info.logprob)).toFixed(1)}% · surprise ${(-info.logprob).toFixed(2)} nats</div>` +
      `<table>${rows}</table>`;
    const r = span.getBoundingClientRect();
    box.style.left = `${Math.round(r.left + window.scrollX)}px`;
    box.style.top = `${Math.round(r.bottom + window.scrollY + 4)}px`;
    box.hidden = false;
  };
  document.addEventListener('mouseover', (e) => {
    const span = e.target.closest && e.target.closest('.tok');
    if (span) show(span); else box.hidden = true;
  });
  document.addEventListener('click', (e) => {
    const span = e.target.closest && e.target.closest('.tok');
    if (span) show(span); else if (!box.contains(e.target)) box.hidden = true;
  });
  return box;
}

// ---------------------------------------------------------------- #/play Playground

function playView(view, wanted) {
  const gen = viewGen;
  view.innerHTML = `
    <h1>Playground</h1>
    <div class="play">
      <form id="play-form" class="card">
        <label>Model <select id="model"><option value="">Loading…</option></select></label>
        <label>Prompt <textarea id="prompt" rows="6" spellcheck="false">ROMEO:</textarea></label>
        <div class="params">
          <label>Temperature <input id="temperature" type="number" value="0.8" step="0.05" min="0"></label>
          <label>Top k <input id="top_k" type="number" value="200" step="1" min="1" placeholder="none"></label>
          <label>Top p <input id="top_p" type="number" value="1" step="0.05" min="0" max="1"></label>
          <label>Max tokens <input id="max_tokens" type="number" value="300" step="1" min="1"></label>
          <label>Seed <input id="seed" type="number" step="1" min="0" placeholder="random"></label>
        </div>
        <button id="generate" type="submit">Generate</button>
      </form>
      <section class="card out">
        <div class="out-head"><span id="speed" class="muted"></span><span id="finish" class="muted"></span></div>
        <div class="error-slot" id="play-error"></div>
        <pre id="output"></pre>
        <p class="muted legend">Each token is shaded by the probability the model gave it (its own,
          before temperature and the cuts): clear when it was sure, red when it was surprised.
          Hover or tap a token for the 5 most likely tokens there.</p>
      </section>
    </div>
    <section class="card score">
      <h2>Score a text</h2>
      <p class="muted">Paste a text (up to the model's context): each token is shaded by its
        surprise (−log p), and the figures are the ones <code>evaluate --data</code> prints for
        the same text.</p>
      <textarea id="score-text" rows="4" spellcheck="false">ROMEO:
But soft, what light through yonder window breaks?</textarea>
      <div class="score-actions">
        <button id="score" type="button">Score</button>
        <button id="tokenize" type="button" class="secondary">Tokens</button>
        <span id="score-figures" class="figures"></span>
      </div>
      <div class="error-slot" id="score-error"></div>
      <pre id="scored"></pre>
      <div id="pieces" class="pieces"></div>
    </section>`;
  alternativesBox();

  const modelSel = $('#model');
  modelSel.addEventListener('change', () => history.replaceState(null, '', `#/play/${encId(modelSel.value)}`));
  api('/v1/models').then((m) => {
    if (gen !== viewGen) return;
    const ids = (m.data || []).map((d) => d.id);
    modelSel.innerHTML = ids.map((i) => `<option value="${esc(i)}">${esc(i)}</option>`).join('');
    if (wanted && ids.includes(wanted)) modelSel.value = wanted;
    else if (wanted) setError($('#play-error'), `The server does not serve the model “${wanted}”.`);
    if (!ids.length) setError($('#play-error'), 'The server serves no models.');
  }).catch((e) => {
    if (gen === viewGen) setError($('#play-error'), `Could not list the models: ${e.message}`);
  });

  let controller = null; // set while a completion streams
  onLeave(() => controller && controller.abort());

  $('#play-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    if (controller) { controller.abort(); return; }
    const num = (sel) => $(sel).value.trim();
    const body = {
      model: modelSel.value,
      prompt: $('#prompt').value,
      stream: true,
      // Every chunk carries the tokens written so far (vLLM's extension): under load a chunk
      // may hold several tokens.
      stream_options: { include_usage: true, continuous_usage_stats: true },
      // Each token's probability and the 5 most likely tokens there, for the shading.
      logprobs: 5,
    };
    // A field left empty is left out: the server's default applies.
    const fields = [['max_tokens', parseInt], ['temperature', parseFloat], ['top_p', parseFloat],
      ['top_k', parseInt], ['seed', parseInt]];
    for (const [name, parse] of fields) {
      if (num(`#${name}`) !== '') body[name] = parse(num(`#${name}`), 10);
    }

    const out = $('#output');
    out.innerHTML = '<span class="prompt"></span><span class="completion"></span>';
    $('.prompt', out).textContent = body.prompt;
    const completion = $('.completion', out);
    let shown = 0; // characters of the completion shown
    setError($('#play-error'), '');
    $('#finish').textContent = '';
    $('#speed').textContent = '';
    const button = $('#generate');
    button.textContent = 'Stop';
    button.classList.add('stop');
    controller = new AbortController();

    let tokens = 0;
    let atFirst = 0; // tokens when the first text came
    let first = 0;
    let last = 0;
    const showSpeed = () => {
      // Tokens after the first text's, over the time from the first text to the last.
      const secs = (last - first) / 1000;
      const rate = secs > 0 ? `${((tokens - atFirst) / secs).toFixed(1)} tokens/s` : '– tokens/s';
      $('#speed').textContent = `${tokens} tokens · ${rate}`;
    };
    // One server-sent event: returns false when the stream is over.
    const handle = (data) => {
      if (data === '[DONE]') return false;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.message || JSON.stringify(chunk.error), 200);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      for (const choice of chunk.choices || []) {
        if (choice.text) {
          const now = performance.now();
          if (!first) [first, atFirst] = [now, tokens];
          last = now;
          shown += appendChunk(completion, choice.text, choice.logprobs, shown);
          if (out.scrollHeight > out.clientHeight) out.scrollTop = out.scrollHeight;
        }
        if (choice.finish_reason) $('#finish').textContent = `stopped: ${choice.finish_reason}`;
      }
      showSpeed();
      return true;
    };

    try {
      const res = await api('/v1/completions', { method: 'POST', body, signal: controller.signal, raw: true });
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      let going = true;
      while (going) {
        const { value, done } = await reader.read();
        buf += decoder.decode(value || new Uint8Array(), { stream: !done }).replace(/\r\n?/g, '\n');
        const events = buf.split('\n\n');
        buf = done ? '' : events.pop();
        for (const ev of events) {
          const data = ev.split('\n').filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
          if (data && !(going = handle(data))) break;
        }
        if (done) break;
      }
    } catch (err) {
      if (gen !== viewGen) return;
      if (err.name === 'AbortError') $('#finish').textContent = 'stopped: cancelled';
      else setError($('#play-error'), err.message);
    } finally {
      controller.abort(); // a no-op when the stream ran to its end; closes it otherwise
      controller = null;
      if (gen === viewGen) {
        button.textContent = 'Generate';
        button.classList.remove('stop');
      }
    }
  });

  // Score a text: its tokens' log-probabilities in one forward pass (echo, max_tokens 0).
  const archs = {};
  api('/api/runs').then((answer) => {
    for (const r of answer.runs || []) archs[r.id] = r.arch;
  }).catch(() => {});
  $('#score').addEventListener('click', async () => {
    const slot = $('#score-error');
    setError(slot, '');
    $('#score-figures').textContent = '';
    $('#pieces').innerHTML = '';
    const scored = $('#scored');
    scored.textContent = '';
    try {
      const res = await api('/v1/completions', { method: 'POST', body: {
        model: modelSel.value, prompt: $('#score-text').value, max_tokens: 0, echo: true, logprobs: 5,
      } });
      if (gen !== viewGen) return;
      const choice = res.choices[0];
      const lp = choice.logprobs;
      appendChunk(scored, choice.text, lp, 0);
      // evaluate's figures: the mean surprise of every token but the first, which nothing
      // predicts, in nats and bits per token, and bits per byte of the text they stand for.
      const surprise = lp.token_logprobs.slice(1).map((l) => -l);
      if (!surprise.length) {
        setError(slot, 'The text needs at least 2 tokens to be scored.');
        return;
      }
      const loss = surprise.reduce((a, b) => a + b, 0) / surprise.length;
      // The bytes of the predicted tokens, as evaluate counts them: a token that is part of a
      // character is shown as `bytes:\xNN...`.
      const tokenBytes = (t) => (/^bytes:(\\x[0-9a-f]{2})+$/.test(t)
        ? (t.length - 6) / 4 : new TextEncoder().encode(t).length);
      const bytes = lp.tokens.slice(1).reduce((sum, t) => sum + tokenBytes(t), 0);
      const bits = loss / Math.LN2;
      const arch = archs[modelSel.value];
      const per = arch && arch.tokenizer === 'char' ? 'char' : 'token';
      $('#score-figures').textContent = `${surprise.length} ${per === 'char' ? 'characters' : 'tokens'} predicted: ` +
        `loss ${loss.toFixed(4)} nats/${per}, perplexity ${Math.exp(loss).toFixed(3)}, ` +
        `${bits.toFixed(4)} bits/${per}, ${(bits * surprise.length / Math.max(bytes, 1)).toFixed(4)} bits/byte`;
    } catch (err) {
      if (gen === viewGen) setError(slot, err.message);
    }
  });
  // The model's pieces of the text (POST /tokenize).
  $('#tokenize').addEventListener('click', async () => {
    const slot = $('#score-error');
    setError(slot, '');
    try {
      const res = await api('/tokenize', { method: 'POST', body: {
        model: modelSel.value, prompt: $('#score-text').value,
      } });
      if (gen !== viewGen) return;
      const pieces = res.token_strs.map((t, i) =>
        `<span class="piece" title="token ${res.tokens[i]}">${esc(visible(t))}</span>`).join('');
      $('#pieces').innerHTML = `<div class="muted">${res.count} tokens (context ${res.max_model_len})</div>${pieces}`;
    } catch (err) {
      if (gen === viewGen) setError(slot, err.message);
    }
  });
}

// ---------------------------------------------------------------- start

$('#api-key-forget').addEventListener('click', () => {
  localStorage.removeItem(KEY_STORE);
  updateForgetButton();
});
updateForgetButton();
window.addEventListener('hashchange', route);
route();
