// The drift page: runs, API drift apart from regressions, shifts, and TV trends per check.
document.body.append(el('h1', {}, 'Distribution drift across runs'),
  el('p', {class: 'note'}, `History ${DATA.history}: ${DATA.runs.length} runs.`));
document.body.append(el('h2', {}, 'Runs'), table(['run', 'created', 'label', 'profile', 'seed', 'vLLM', 'vLLM commit'],
  DATA.runs.map(r => [r.id, r.created, r.label, r.profile, r.seed, r.vllm_version, r.vllm_commit])));
document.body.append(el('h2', {}, `API drift (${DATA.api_drift.length})`),
  el('p', {class: 'note'}, 'An adapter could not bind to the vLLM it found: the API changed. Not a distribution verdict.'));
if (DATA.api_drift.length) document.body.append(table(['run', 'backend', 'what changed'], DATA.api_drift.map(a => [a.run, a.backend, a.message])));
document.body.append(el('h2', {}, `Regressions (${DATA.regressions.length}): failing now, passing in the previous run`));
if (DATA.regressions.length) document.body.append(table(['check', 'run', 'message', 'reproducer'],
  DATA.regressions.map(r => [r.key, r.run, r.message, el('td', {}, el('code', {}, r.reproducer || ''))])));
document.body.append(el('h2', {}, `Failing in the latest run (${DATA.latest_failures.length})`));
if (DATA.latest_failures.length) document.body.append(table(['check', 'message', 'reproducer'],
  DATA.latest_failures.map(r => [r.key, r.message, el('td', {}, el('code', {}, r.reproducer || ''))])));
document.body.append(el('h2', {}, `Shifts beyond the confidence intervals (${DATA.shifts.length})`));
if (DATA.shifts.length) document.body.append(table(['check', 'from run', 'to run', 'TV before', 'TV after'],
  DATA.shifts.map(s => [s.key, s.from_run, s.to_run, fmt(s.from_tv, 4), fmt(s.to_tv, 4)])));

document.body.append(el('h2', {}, 'TV estimates per check across runs'));
const pick = el('select', {id: 'series'});
const keys = Object.keys(DATA.series).sort();
keys.forEach(k => pick.append(el('option', {value: k}, k)));
const box = el('div', {class: 'charts'});
document.body.append(el('p', {class: 'filters'}, pick), box);
function draw() {
  const pts = DATA.series[pick.value] || [];
  const label = p => `run ${p.run_id}` + (DATA.versions[p.run_id] ? ` (vLLM ${DATA.versions[p.run_id]})` : '');
  box.replaceChildren();
  chart(box, [{
    type: 'scatter', mode: 'lines+markers', name: 'TV estimate', x: pts.map(label).map(esc), y: pts.map(p => p.tv_estimate),
    error_y: {type: 'data', symmetric: false, array: pts.map(p => (p.tv_ci?.[1] ?? p.tv_estimate) - p.tv_estimate), arrayminus: pts.map(p => p.tv_estimate - (p.tv_ci?.[0] ?? p.tv_estimate))},
  }, {type: 'scatter', mode: 'lines', name: 'detectable TV', x: pts.map(label).map(esc), y: pts.map(p => p.detectable_tv)}],
  {title: {text: esc(pick.value)}, yaxis: {title: {text: 'TV'}, rangemode: 'tozero'}});
}
pick.addEventListener('change', draw);
if (keys.length) draw();
