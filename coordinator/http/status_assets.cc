// The status page's HTML, script and style sheet (see status_assets.h).
#include "coordinator/http/status_assets.h"

namespace qlora::coordinator {

const char kStatusPageCsp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const char kStatusPageHtml[] = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>qlora-coordinator</title>
<link rel="stylesheet" href="/static/status.css">
<script src="/static/status.js" defer></script>
</head>
<body>
<header><a href="/">qlora-coordinator</a> <span id="status"></span></header>
<form id="login" class="hidden">
  <p>This coordinator asks for credentials. Paste your token (kept in this tab only, sent as an
  <code>Authorization: Bearer</code> header, never in a URL).</p>
  <input id="token" type="password" autocomplete="off" placeholder="token">
  <button type="submit">Use token</button>
</form>
<main id="list" class="hidden">
  <h1>Jobs</h1>
  <table id="jobs">
    <thead><tr><th>id</th><th>name</th><th>owner</th><th>state</th><th>step</th><th>loss</th><th>tokens/s</th></tr></thead>
    <tbody></tbody>
  </table>
</main>
<main id="job" class="hidden">
  <h1 id="job-title"></h1>
  <dl id="job-fields"></dl>
  <div id="charts">
    <figure><figcaption>loss</figcaption><svg id="chart-loss" class="chart" viewBox="0 0 600 200"></svg></figure>
    <figure><figcaption>eval loss</figcaption><svg id="chart-eval_loss" class="chart" viewBox="0 0 600 200"></svg></figure>
    <figure><figcaption>learning rate</figcaption><svg id="chart-learning_rate" class="chart" viewBox="0 0 600 200"></svg></figure>
    <figure><figcaption>tokens/s (rank 0)</figcaption><svg id="chart-tokens_per_second" class="chart" viewBox="0 0 600 200"></svg></figure>
  </div>
  <section id="samples" class="hidden">
    <h2>Samples at step <span id="samples-step"></span></h2>
    <div id="samples-list"></div>
  </section>
  <h2>Log of rank <span id="log-rank">0</span></h2>
  <pre id="log"></pre>
</main>
</body>
</html>
)html";

const char kStatusPageCss[] = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
header { padding: .6em 0; border-bottom: 1px solid #ddd; margin-bottom: 1em; }
header a { font-weight: 600; color: inherit; text-decoration: none; }
#status { color: #a00; margin-left: 1em; }
.hidden { display: none; }
table { border-collapse: collapse; }
th, td { padding: .25em .8em; border-bottom: 1px solid #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state-running, .state-starting { color: #06c; }
.state-succeeded { color: #080; }
.state-failed { color: #b00; }
.state-cancelled { color: #777; }
dl { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dt { color: #666; }
dd { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; }
#charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 1em; }
figure { margin: 0; }
figcaption { color: #666; }
svg.chart { width: 100%; height: auto; border: 1px solid #ddd; background: #fcfcfc; }
svg.chart path.curve { fill: none; stroke: #06c; stroke-width: 1.5; }
svg.chart text { font-size: 11px; fill: #666; }
#samples pre { background: #f6f6f6; padding: .4em; white-space: pre-wrap; overflow-wrap: anywhere; margin: .2em 0 .8em; }
pre#log { background: #f6f6f6; padding: .6em; max-height: 30em; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
)css";

// Everything from the server is put into the document with textContent or as an SVG attribute
// built from numbers: never as markup.
const char kStatusPageJs[] = R"js('use strict';
(function () {
  const TOKEN_KEY = 'qlora-token';
  const POLL_MS = 2000;
  const SVG = 'http://www.w3.org/2000/svg';
  const CURVES = ['loss', 'eval_loss', 'learning_rate', 'tokens_per_second'];

  const $ = (id) => document.getElementById(id);
  function show(id) { $(id).classList.remove('hidden'); }
  function status(text) { $('status').textContent = text; }

  function headers() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { 'Authorization': 'Bearer ' + token } : {};
  }

  async function getJson(url) {
    const response = await fetch(url, { headers: headers(), cache: 'no-store', credentials: 'omit' });
    if (response.status === 401) {
      show('login');
      throw new Error('a token is needed');
    }
    if (!response.ok) throw new Error(response.status + ': ' + (await response.text()));
    return response.json();
  }

  function cell(row, text, className) {
    const td = document.createElement('td');
    td.textContent = text === null || text === undefined ? '' : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined) return '';
    if (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3)) return v.toExponential(2);
    return v.toFixed(digits);
  }

  function stepText(job) {
    return job.step === null ? '' : job.step + ' / ' + job.total_steps;
  }

  // ---- the job list (/)
  async function refreshList() {
    const data = await getJson('/api/jobs');
    const body = $('jobs').tBodies[0];
    const rows = [];
    for (const job of data.jobs) {
      const row = document.createElement('tr');
      row.className = 'job-row';
      row.dataset.id = job.id;
      const link = document.createElement('a');
      link.href = '/jobs/' + encodeURIComponent(job.id);
      link.textContent = job.id;
      cell(row, '').appendChild(link);
      cell(row, job.name);
      cell(row, job.owner);
      cell(row, job.state, 'state-' + job.state);
      cell(row, stepText(job), 'num');
      cell(row, fmt(job.loss, 4), 'num');
      cell(row, fmt(job.tokens_per_second, 1), 'num');
      rows.push(row);
    }
    body.replaceChildren(...rows);
  }

  // ---- one job (/jobs/<id>)
  const points = [];
  let lastSequence = 0;

  function drawChart(name) {
    const svg = $('chart-' + name);
    const xs = [], ys = [];
    for (const p of points) {
      if (typeof p[name] === 'number' && isFinite(p[name])) { xs.push(p.step); ys.push(p[name]); }
    }
    const children = [];
    const W = 600, H = 200, L = 56, R = 8, T = 8, B = 22;
    if (xs.length > 0) {
      let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
      if (x1 === x0) x1 = x0 + 1;
      if (y1 === y0) { y0 -= Math.abs(y0) * 0.05 || 1; y1 += Math.abs(y1) * 0.05 || 1; }
      const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
      const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
      let d = '';
      for (let i = 0; i < xs.length; ++i) {
        d += (i === 0 ? 'M' : ' L') + px(xs[i]).toFixed(1) + ' ' + py(ys[i]).toFixed(1);
      }
      const path = document.createElementNS(SVG, 'path');
      path.setAttribute('class', 'curve');
      path.setAttribute('id', 'curve-' + name);
      path.setAttribute('d', d);
      path.setAttribute('data-points', String(xs.length));
      children.push(path);
      const label = (x, y, text, anchor) => {
        const t = document.createElementNS(SVG, 'text');
        t.setAttribute('x', String(x));
        t.setAttribute('y', String(y));
        t.setAttribute('text-anchor', anchor);
        t.textContent = text;
        children.push(t);
      };
      label(L - 4, T + 10, fmt(y1, 4), 'end');
      label(L - 4, H - B, fmt(y0, 4), 'end');
      label(L, H - 6, 'step ' + x0, 'start');
      label(W - R, H - 6, 'step ' + x1, 'end');
    }
    if (children.length === 0) {
      const t = document.createElementNS(SVG, 'text');
      t.setAttribute('x', '300');
      t.setAttribute('y', '100');
      t.setAttribute('text-anchor', 'middle');
      t.textContent = 'no points yet';
      children.push(t);
    }
    svg.replaceChildren(...children);
  }

  // "13 of 32 layers checkpointed, planned 22.0 of a 24.0 GiB budget" (rank 0), or ''.
  function checkpointingText(c) {
    if (!c) return '';
    const gib = (b) => (b / 1073741824).toFixed(1);
    let text = c.checkpointed_layers + ' of ' + c.layers + ' layers checkpointed';
    if (c.budget_bytes > 0) text += ', planned ' + gib(c.planned_peak_bytes) + ' of a ' + gib(c.budget_bytes) + ' GiB budget';
    if (c.measured_peak_bytes > 0) text += ', measured ' + gib(c.measured_peak_bytes) + ' GiB';
    if (c.offloaded_layers > 0) text += ', ' + c.offloaded_layers + ' offloaded to host memory';
    if (c.dequantized_layers > 0) text += ', ' + c.dequantized_layers + ' with dequantized weights';
    return text;
  }

  function showFields(job) {
    const fields = [
      ['name', job.name], ['owner', job.owner], ['state', job.state],
      ['step', stepText(job)], ['loss', fmt(job.loss, 4)], ['eval loss', fmt(job.eval_loss, 4)],
      ['learning rate', fmt(job.learning_rate, 6)], ['tokens/s', fmt(job.tokens_per_second, 1)],
      ['workers', job.num_workers], ['restarts', job.restarts], ['reason', job.reason_code],
      ['message', job.message], ['adapter', job.adapter_path],
      ['checkpointing', checkpointingText(job.checkpointing)],
    ];
    const out = [];
    for (const [k, v] of fields) {
      const dt = document.createElement('dt');
      dt.textContent = k;
      const dd = document.createElement('dd');
      dd.textContent = v === null || v === undefined ? '' : String(v);
      if (k === 'state') dd.className = 'state-' + job.state;
      out.push(dt, dd);
    }
    $('job-fields').replaceChildren(...out);
  }

  // The latest evaluation samples (trainer.eval_samples): each prompt and output as text.
  function showSamples(samples) {
    $('samples').classList.toggle('hidden', !samples);
    if (!samples) return;
    $('samples-step').textContent = String(samples.step);
    const out = [];
    for (const s of samples.samples) {
      const prompt = document.createElement('pre');
      prompt.textContent = s.prompt;
      const output = document.createElement('pre');
      output.className = 'sample-output';
      output.textContent = s.output;
      out.push(prompt, output);
    }
    $('samples-list').replaceChildren(...out);
  }

  async function refreshJob(id) {
    const data = await getJson('/api/jobs/' + encodeURIComponent(id) + '?after=' + lastSequence);
    $('job-title').textContent = data.job.id;
    showFields(data.job);
    for (const p of data.points) points.push(p);
    lastSequence = data.last_sequence;
    for (const name of CURVES) drawChart(name);
    showSamples(data.samples);
    $('log-rank').textContent = String(data.log_rank);
    const log = $('log');
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = data.log;
    if (atBottom) log.scrollTop = log.scrollHeight;
    return data.job.state;
  }

  function poll(refresh) {
    const tick = async () => {
      try {
        await refresh();
        status('');
      } catch (e) {
        status(String(e.message || e));
      }
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  function start() {
    $('login').addEventListener('submit', (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
      location.reload();
    });
    const match = location.pathname.match(/^\/jobs\/([^/]+)$/);
    if (match) {
      const id = decodeURIComponent(match[1]);
      document.title = id + ' - qlora-coordinator';
      show('job');
      poll(() => refreshJob(id));
    } else {
      show('list');
      poll(refreshList);
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
)js";

}  // namespace qlora::coordinator
