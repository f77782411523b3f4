// The drift page: the release matrix (what Python's analyse computed: verdicts per release,
// changes, drift), then regressions, failures, API drift, shifts and TV trends across runs.
// It renders DATA only: no statistic is computed here.
// The records as Python packed them (drift.pack_records): one table, repeated strings once.
const REC = (p => {
  const interned = new Set(p.interned);
  return p.rows.map(row => {
    const r = {};
    p.fields.forEach((f, k) => { r[f] = (interned.has(f) && row[k] != null) ? p.strings[row[k]] : row[k]; });
    return r;
  });
})(DATA.records);
const M = DATA.matrix;
const RELS = M.releases;
const SYMBOL = {pass: '✓', fail: '✗', error: '!', skipped: '–', drift: '⚡'};
const WORD = {pass: 'pass', fail: 'fail', error: 'error', skipped: 'skipped', drift: 'api drift'};
const SHORT = {pass: '', fail: 'fail', error: 'err', skipped: 'skip'};
const ci = c => (c && c[0] != null) ? `[${fmt(c[0], 3)}, ${fmt(c[1], 3)}]` : '–';
const rowName = row => `${row.scenario}[${row.template}] ${row.check}`;
const relName = j => RELS[j].key;

document.body.append(el('h1', {}, 'Distribution drift across vLLM releases and runs'),
  el('p', {class: 'note'}, `History ${DATA.history}: ${DATA.runs.length} runs, ${RELS.length} releases, ` +
    `${M.rows.length} matrix rows over ${M.implementations.length} implementations.`));

// ---- Release matrix --------------------------------------------------------------------
const legend = el('p', {class: 'legend'}, 'Cells: ',
  ...['pass', 'fail', 'error', 'skipped', 'drift'].map(s => el('span', {class: 'c ' + s}, s === 'drift' ? 'drift' : `${SYMBOL[s]} ${WORD[s]}`)),
  el('span', {class: 'c none'}, '· no record'), el('span', {class: 'c pass first'}, 'first change'), el('span', {class: 'c pass change'}, 'later change'),
  ' The number is the TV estimate (hover for its 95% interval and the detectable TV; click for the record).');
document.body.append(el('h2', {id: 'release-matrix'}, 'Release matrix'),
  el('p', {class: 'note'}, 'One column per vLLM release (ordered by version; a source tree such as main is one column per label; ' +
    'runs without a version last), one row per implementation × scenario[template] × check. Each cell is the latest run of that ' +
    'release for that implementation; a change is a verdict unlike the nearest earlier release with one (drift cells are passed over).'),
  legend);

// Summary per implementation: releases bound / api drift, checks passed and failed per release.
function counts(p) {
  if (p.state === 'absent') return el('td', {class: 'sum none', title: 'no run of this release verified it'}, '—');
  if (p.state === 'drift' || p.state === 'error') {
    const td = el('td', {class: `sum ${p.state} unbound`, title: p.r != null ? (REC[p.r].message || '') : 'every scenario gave api drift'},
      p.state === 'drift' ? 'drift' : '! error', el('br'), el('small', {}, 'not bound'));
    if (p.r != null) td.dataset.rec = p.r;
    return td;
  }
  const c = p.counts;
  const td = el('td', {class: 'sum ' + (c.fail ? 'fail' : c.error ? 'error' : 'pass'),
    title: `run ${p.run}` + (p.runs > 1 ? ` (latest of ${p.runs} runs of this release)` : '')},
    el('b', {}, `✓${c.pass} ✗${c.fail}`));
  const extra = [c.error ? `!${c.error}` : '', c.skipped ? `–${c.skipped}` : '', c.drift ? `drift ${c.drift}` : ''].filter(Boolean).join(' ');
  if (extra) td.append(el('br'), el('small', {}, extra));
  return td;
}
const sumTable = el('table', {id: 'release-summary', class: 'summary'},
  el('tr', {}, el('th', {}, 'implementation'), el('th', {}, 'bound'), el('th', {}, 'api drift'), ...RELS.map(relHeader)));
for (const impl of M.implementations) {
  const s = M.summary[impl];
  sumTable.append(el('tr', {'data-impl': impl}, el('th', {}, impl), el('td', {}, `${s.bound} of ${RELS.length - s.absent}`),
    el('td', {class: s.drift ? 'drift-note' : ''}, s.drift ? `${s.drift}: ${s.drift_releases.join(', ')}` : '0'),
    ...s.releases.map(counts)));
}
document.body.append(el('div', {class: 'scroll-x'}, sumTable));

function relHeader(r) {
  const th = el('th', {class: 'rel', title: `runs ${r.runs.join(', ')}` + (r.version && r.version !== r.key ? ` · vLLM ${r.version}` : '')}, r.key);
  if (r.version && r.version !== r.key) th.append(el('br'), el('small', {}, r.version.length > 14 ? r.version.slice(0, 13) + '…' : r.version));
  return th;
}

// Controls: text filter, failures-and-changes toggle, implementation.
const nFailing = M.rows.filter(r => r.failing).length, nChanged = M.rows.filter(r => r.changes.length).length;
const search = el('input', {id: 'matrix-filter', type: 'search', placeholder: 'filter scenario / check (words)', size: '34'});
const onlyBad = el('input', {id: 'only-interesting', type: 'checkbox'});
const implPick = el('select', {id: 'matrix-impl'}, el('option', {value: ''}, 'all implementations'),
  ...M.implementations.map(i => el('option', {value: i}, i)));
const shownCount = el('span', {id: 'matrix-count', class: 'note'});
document.body.append(el('p', {class: 'filters controls'}, search, ' ',
  el('label', {}, onlyBad, ` failures and changes only (${nFailing} rows failing, ${nChanged} changing)`), ' ', implPick, ' ', shownCount));

// The matrix itself: one table, built once; filters only toggle rows.
const matrix = el('table', {id: 'matrix', class: 'matrix'});
matrix.append(el('thead', {}, el('tr', {}, el('th', {class: 'lab'}, 'scenario[template]'), el('th', {class: 'lab'}, 'check'), ...RELS.map(relHeader))));
const tbody = el('tbody');
const trs = [], groups = {};
let lastImpl = null;
M.rows.forEach((row, i) => {
  if (row.impl !== lastImpl) {
    lastImpl = row.impl;
    const g = el('tr', {class: 'group', 'data-impl': row.impl}, el('th', {colspan: '2'}, row.impl));
    M.summary[row.impl].releases.forEach(p => g.append(el('td', {class: 'g ' + (p.state === 'bound' ? (p.counts.fail ? 'fail' : '') : p.state)},
      p.state === 'drift' ? 'drift' : p.state === 'absent' ? '' : p.state === 'error' ? '!' : p.counts.fail ? `✗${p.counts.fail}` : '✓')));
    groups[row.impl] = {tr: g, rows: []};
    tbody.append(g);
  }
  const firstAt = row.first_change, changed = new Set(row.changes.map(c => c.at));
  const tr = el('tr', {class: 'row' + (row.failing ? ' failing' : '') + (row.changes.length ? ' changing' : ''), 'data-i': String(i)},
    el('td', {class: 'lab'}, `${row.scenario}[${row.template}]`), el('td', {class: 'lab'}, row.check));
  row.cells.forEach((cell, j) => {
    if (!cell) { tr.append(el('td', {class: 'c none', 'data-j': String(j)}, '·')); return; }
    const r = REC[cell.r];
    const cls = ['c', cell.s];
    if (j === firstAt) cls.push('first'); else if (changed.has(j)) cls.push('change');
    if (cell.w) cls.push('wide');
    const text = cell.s === 'drift' ? 'drift' : (r.tv_estimate != null && typeof r.tv_estimate === 'number' ? `${SYMBOL[cell.s]} ${fmt(r.tv_estimate, 2)}` : `${SYMBOL[cell.s] || '?'} ${SHORT[cell.s] ?? cell.s}`);
    tr.append(el('td', {class: cls.join(' '), 'data-j': String(j)}, text));
  });
  tr._text = `${row.impl} ${rowName(row)}`.toLowerCase();
  tr._row = row;
  trs.push(tr);
  groups[row.impl].rows.push(tr);
  tbody.append(tr);
});
matrix.append(tbody);
const wrap = el('div', {class: 'matrix-wrap'}, matrix);
document.body.append(wrap);
if (!M.rows.length) wrap.replaceChildren(el('p', {}, 'No records.'));

function applyFilters() {
  const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
  const impl = implPick.value, bad = onlyBad.checked;
  let shown = 0;
  for (const tr of trs) {
    const row = tr._row;
    const ok = (!impl || row.impl === impl) && (!bad || row.failing || row.changes.length) && words.every(w => tr._text.includes(w));
    tr.hidden = !ok;
    if (ok) shown++;
  }
  for (const g of Object.values(groups)) g.tr.hidden = g.rows.every(tr => tr.hidden);
  shownCount.textContent = `${shown} of ${trs.length} rows shown`;
}
search.addEventListener('input', applyFilters);
onlyBad.addEventListener('change', applyFilters);
implPick.addEventListener('change', applyFilters);
applyFilters();

// Tooltips, written when first hovered (thousands of cells stay cheap).
function cellTitle(row, j) {
  const cell = row.cells[j];
  if (!cell) return `${row.impl} ${rowName(row)} @ ${relName(j)}: no record`;
  const r = REC[cell.r];
  const lines = [`${row.impl} ${rowName(row)} @ ${relName(j)}: ${WORD[cell.s] || cell.s}`];
  if (r.tv_estimate != null) lines.push(`TV ${fmt(r.tv_estimate, 3)} (95% ${ci(r.tv_ci)}), detectable TV ${fmt(r.detectable_tv, 3)}`);
  if (r.p_value != null) lines.push(`p = ${fmt(r.p_value, 3)}`);
  const ch = row.changes.find(c => c.at === j);
  if (ch) lines.push(`${j === row.first_change ? 'first change' : 'changed'}: ${ch.from} → ${ch.to}`);
  if (cell.w) lines.push(cell.w === 'backend' ? 'the adapter could not load for this release' : 'the whole scenario could not be sampled');
  if (r.message) lines.push(String(r.message).slice(0, 300));
  lines.push(`run ${r.run_id} · click for the record`);
  return lines.join('\n');
}
matrix.addEventListener('mouseover', e => {
  const td = e.target.closest('td.c');
  if (!td || td.title) return;
  td.title = cellTitle(td.parentNode._row, Number(td.dataset.j));
});

// ---- Detail panel ----------------------------------------------------------------------
const panel = el('aside', {id: 'detail', class: 'detail', hidden: ''});
document.body.append(panel);
let selected = null;
function closePanel() {
  panel.hidden = true;
  document.body.classList.remove('panel-open');
  if (selected) selected.classList.remove('selected');
  selected = null;
}
document.addEventListener('keydown', e => { if (e.key === 'Escape') closePanel(); });
matrix.addEventListener('click', e => {
  const td = e.target.closest('td.c');
  if (!td || td.classList.contains('none')) return;
  if (selected) selected.classList.remove('selected');
  selected = td;
  td.classList.add('selected');
  showCell(td.parentNode._row, Number(td.dataset.j));
});
sumTable.addEventListener('click', e => {
  const td = e.target.closest('td[data-rec]');
  if (td) showRecord(REC[Number(td.dataset.rec)], `${td.parentNode.dataset.impl}: could not bind`);
});

function runLine(r) {
  const run = DATA.runs.find(x => x.id === r.run_id) || {};
  return `run ${r.run_id}` + (run.label ? ` "${run.label}"` : '') + (run.created ? ` · ${run.created}` : '') +
    (run.vllm_version ? ` · vLLM ${run.vllm_version}` : '') + (run.vllm_commit ? ` (${run.vllm_commit})` : '');
}

function showCell(row, j) {
  const cell = row.cells[j], r = REC[cell.r];
  const sum = M.summary[row.impl].releases[j];
  const notes = [];
  if (sum.runs > 1) notes.push(`${sum.runs} runs of ${relName(j)} verified ${row.impl}; this is the latest (the others are in the series over runs).`);
  if (cell.w === 'backend') notes.push(`${row.impl} could not load for ${relName(j)}: this record covers every check of it.`);
  if (cell.w === 'scenario') notes.push(`Scenario ${row.scenario} could not be sampled for ${relName(j)}: this record covers every check of it.`);
  const ch = row.changes.find(c => c.at === j);
  if (ch) notes.push(`Verdict changed here: ${ch.from} → ${ch.to}${j === row.first_change ? ' (the first change of this row)' : ''}.`);
  else if (row.first_change != null) notes.push(`This row first changed at ${relName(row.first_change)}.`);
  showRecord(r, `${row.impl} · ${rowName(row)} @ ${relName(j)}`, notes, row, j);
}

function showRecord(r, title, notes, row, j) {
  const s = r.kind === 'api-drift' ? 'drift' : (r.verdict || 'error');
  const close = el('button', {class: 'close', title: 'close (Esc)'}, '×');
  close.addEventListener('click', closePanel);
  panel.replaceChildren(close, el('h3', {}, title),
    el('p', {}, el('span', {class: 'badge ' + s}, `${SYMBOL[s] || ''} ${WORD[s] || s}`), ' ', el('span', {class: 'note'}, r.kind || '')),
    el('p', {class: 'note'}, runLine(r), el('br'), `backend ${r.backend || ''}`));
  for (const n of notes || []) panel.append(el('p', {class: 'note'}, n));
  panel.append(el('h4', {}, 'Message'), el('pre', {class: 'message'}, r.message || '(none)'));
  const stats = [['statistic', fmt(r.statistic, 6)], ['df', fmt(r.df)], ['p-value', fmt(r.p_value, 4)], ['α (this check)', fmt(r.alpha)],
    ['Holm threshold', fmt(r.holm_threshold, 4)], ['trials', fmt(r.trials)], ['TV estimate', fmt(r.tv_estimate, 4)],
    ['TV 95% interval', ci(r.tv_ci)], ['detectable TV', fmt(r.detectable_tv, 4)], ['method', r.method || '–']];
  panel.append(el('table', {class: 'stats'}, ...stats.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v)))));
  if (r.cells && r.cells.length) {
    panel.append(el('h4', {}, 'Observed vs expected (largest pooled cells)'),
      table(['cell', 'observed', 'expected'], r.cells.map(c => [String(c[0]), fmt(c[1]), fmt(c[2], 6)])));
    panel.lastChild.classList.add('cells');
  }
  const repro = el('pre', {class: 'repro'}, r.reproducer || '(none)');
  const pick = el('button', {}, 'select');
  pick.addEventListener('click', () => window.getSelection().selectAllChildren(repro));
  panel.append(el('h4', {}, 'Reproduce ', pick), repro);
  if (row) {
    const pts = row.cells.map((c, k) => [c, k]).filter(([c]) => c && typeof REC[c.r].tv_estimate === 'number');
    if (pts.length) {
      const box = el('div', {class: 'panel-chart'});
      panel.append(el('h4', {}, 'TV across releases'), box);
      const xs = pts.map(([, k]) => esc(relName(k)));
      const rs = pts.map(([c]) => REC[c.r]);
      Plotly.newPlot(box, [
        {type: 'scatter', mode: 'markers', name: 'TV estimate', x: xs, y: rs.map(x => x.tv_estimate),
          marker: {color: pts.map(([c]) => c.s === 'fail' ? '#c00' : '#2a7')},
          error_y: {type: 'data', symmetric: false, color: '#555', array: rs.map(x => (x.tv_ci?.[1] ?? x.tv_estimate) - x.tv_estimate),
            arrayminus: rs.map(x => x.tv_estimate - (x.tv_ci?.[0] ?? x.tv_estimate))}},
        {type: 'scatter', mode: 'lines', name: 'detectable TV', x: xs, y: rs.map(x => x.detectable_tv)},
      ], {margin: {t: 10, l: 45, r: 10, b: 60}, font: {size: 10}, showlegend: false, yaxis: {rangemode: 'tozero'},
        xaxis: {type: 'category', categoryorder: 'array', categoryarray: RELS.map(x => esc(x.key))}},
      {displaylogo: false, responsive: true});
    }
    const key = `${r.backend} | ${r.scenario}[${r.template}] ${r.check}`;
    if (DATA.series[key] && DATA.series[key].length > 1) {
      const go = el('button', {}, `plot this backend's check over its ${DATA.series[key].length} runs`);
      go.addEventListener('click', () => { seriesPick.value = key; drawSeries(); seriesPick.scrollIntoView(); });
      panel.append(el('p', {}, go));
    }
  }
  panel.hidden = false;
  document.body.classList.add('panel-open');
  panel.scrollTop = 0;
}

// ---- The sections over runs ------------------------------------------------------------
const versionOf = run => DATA.versions[run] ? ` (vLLM ${DATA.versions[run]})` : '';
document.body.append(el('h2', {}, `Regressions (${DATA.regressions.length}): failing now, passing in the previous run of the same backend`));
if (DATA.regressions.length) document.body.append(table(['check', 'run', 'message', 'reproducer'],
  DATA.regressions.map(r => [r.key, `${r.run}${versionOf(r.run)}`, r.message, el('td', {}, el('code', {}, r.reproducer || ''))])));
document.body.append(el('h2', {}, `Failing in the latest run (${DATA.latest_failures.length})`));
if (DATA.latest_failures.length) document.body.append(table(['check', 'message', 'reproducer'],
  DATA.latest_failures.map(r => [r.key, r.message, el('td', {}, el('code', {}, r.reproducer || ''))])));
document.body.append(el('h2', {id: 'api-drift'}, `API drift (${DATA.api_drift.length})`),
  el('p', {class: 'note'}, 'An adapter could not bind to the vLLM it found: the API changed. Not a distribution verdict.'));
if (DATA.api_drift.length) {
  const t = table(['run', 'vLLM', 'backend', 'what changed'], DATA.api_drift.map(a => [a.run, DATA.versions[a.run] || '–', a.backend, a.message]));
  document.body.append(DATA.api_drift.length > 12 ? el('details', {}, el('summary', {}, `show all ${DATA.api_drift.length}`), t) : t);
}
document.body.append(el('h2', {}, `Shifts beyond the confidence intervals (${DATA.shifts.length})`));
if (DATA.shifts.length) {
  const t = table(['check', 'from run', 'to run', 'TV before', 'TV after'],
    DATA.shifts.map(s => [s.key, `${s.from_run}${versionOf(s.from_run)}`, `${s.to_run}${versionOf(s.to_run)}`, fmt(s.from_tv, 4), fmt(s.to_tv, 4)]));
  document.body.append(DATA.shifts.length > 12 ? el('details', {}, el('summary', {}, `show all ${DATA.shifts.length}`), t) : t);
}

document.body.append(el('h2', {id: 'series-over-runs'}, 'TV estimates per check across runs'));
const seriesPick = el('select', {id: 'series'});
const keys = Object.keys(DATA.series).sort();
keys.forEach(k => seriesPick.append(el('option', {value: k}, k)));
const box = el('div', {class: 'charts'});
document.body.append(el('p', {class: 'filters'}, seriesPick), box);
function drawSeries() {
  const pts = (DATA.series[seriesPick.value] || []).map(i => REC[i]);
  const label = p => `run ${p.run_id}` + (DATA.versions[p.run_id] ? ` (vLLM ${DATA.versions[p.run_id]})` : '');
  box.replaceChildren();
  chart(box, [{
    type: 'scatter', mode: 'lines+markers', name: 'TV estimate', x: pts.map(label).map(esc), y: pts.map(p => p.tv_estimate),
    error_y: {type: 'data', symmetric: false, array: pts.map(p => (p.tv_ci?.[1] ?? p.tv_estimate) - p.tv_estimate), arrayminus: pts.map(p => p.tv_estimate - (p.tv_ci?.[0] ?? p.tv_estimate))},
  }, {type: 'scatter', mode: 'lines', name: 'detectable TV', x: pts.map(label).map(esc), y: pts.map(p => p.detectable_tv)}],
  {title: {text: esc(seriesPick.value)}, yaxis: {title: {text: 'TV'}, rangemode: 'tozero'}});
}
seriesPick.addEventListener('change', drawSeries);
// Drawn once the page has painted: the matrix first (Plotly's first chart takes a while).
if (keys.length) setTimeout(() => { if (!box.firstChild) drawSeries(); }, 0);

const runsTable = table(['run', 'created', 'label', 'profile', 'seed', 'vLLM', 'vLLM commit'],
  DATA.runs.map(r => [r.id, r.created, r.label, r.profile, r.seed, r.vllm_version, r.vllm_commit]));
document.body.append(el('h2', {}, `Runs (${DATA.runs.length})`),
  DATA.runs.length > 20 ? el('details', {}, el('summary', {}, 'show all runs'), runsTable) : runsTable);
