// The run report: verdict table with filters, failures with reproducers, per-scenario charts.
const R = DATA.records;
const P = DATA.profile;
const family = c => String(c).split('[')[0];
document.body.append(
  el('h1', {}, 'Rejection-sampler verification'),
  el('p', {}, `Profile ${P.name}: each check has false-alarm rate α = ${P.alpha} and detects TV ≥ ${P.tv} with power ${P.power}; ` +
    `the run's family-wise α (Holm over ${R.filter(r => r.kind === 'gof' || r.kind === 'binomial').length} statistical checks) is ${fmt(DATA.family_alpha)}. ` +
    `Seed ${DATA.seed}. ${fmt(DATA.seconds)} s.`),
  el('p', {}, ...Object.entries(DATA.counts).map(([k, v]) => el('span', {class: 'badge ' + k}, `${k}: ${v}`))),
  el('p', {class: 'env'}, ...Object.entries(DATA.environment).filter(([, v]) => v).map(([k, v]) => el('span', {}, `${k}: ${v}`))),
);
if (DATA.command) document.body.append(el('p', {class: 'note'}, 'Command: ', el('code', {}, DATA.command)));

// Failures first, each with its reproducer.
const bad = R.filter(r => r.verdict === 'fail' || r.verdict === 'error');
document.body.append(el('h2', {}, `Failures (${bad.length})`));
if (!bad.length) document.body.append(el('p', {}, 'None.'));
for (const r of bad) {
  const d = el('details', {open: ''}, el('summary', {}, `${r.backend} · ${r.scenario}[${r.template}] · ${r.check}: ${r.verdict}`),
    el('p', {}, r.message), el('p', {}, 'Reproduce: ', el('code', {}, r.reproducer || '')));
  if (r.cells) d.append(table(['cells (pooled)', 'observed', 'expected'], r.cells.map(c => [c[0], fmt(c[1]), fmt(c[2], 4)])));
  document.body.append(d);
}

// Verdict table, filterable.
document.body.append(el('h2', {}, 'All checks'));
const keys = {backend: r => r.backend, method: r => r.method, check: r => family(r.check), verdict: r => r.verdict};
const filters = el('p', {class: 'filters'});
const selects = {};
for (const [name, key] of Object.entries(keys)) {
  const s = el('select', {id: 'filter-' + name}, el('option', {value: ''}, `all ${name}s`));
  [...new Set(R.map(key))].sort().forEach(v => s.append(el('option', {value: v}, v)));
  s.addEventListener('change', render);
  selects[name] = s;
  filters.append(s);
}
const holder = el('div', {});
document.body.append(filters, holder);
function render() {
  const shown = R.filter(r => Object.entries(keys).every(([n, k]) => !selects[n].value || k(r) === selects[n].value));
  holder.replaceChildren(table(
    ['backend', 'scenario', 'tpl', 'check', 'verdict', 'kind', 'p-value', 'α', 'Holm thr.', 'trials', 'detectable TV', 'TV est.', 'TV 95% CI'],
    shown.map(r => [r.backend, r.scenario, r.template, r.check, el('td', {class: 'verdict'}, r.verdict), r.kind, fmt(r.p_value), fmt(r.alpha),
      fmt(r.holm_threshold), r.trials, fmt(r.detectable_tv, 4), fmt(r.tv_estimate, 4), r.tv_ci ? `[${fmt(r.tv_ci[0], 3)}, ${fmt(r.tv_ci[1], 3)}]` : '–']),
    i => shown[i].verdict));
}
render();

// Per scenario and template: outcome law, per-step acceptance with CIs, acceptance length.
document.body.append(el('h2', {}, 'Scenarios'));
const groups = {};
for (const r of R) (groups[`${r.backend} · ${r.scenario}`] ||= []).push(r);
for (const [title, recs] of Object.entries(groups)) {
  const verdicts = [...new Set(recs.map(r => r.verdict))].join(', ');
  const d = el('details', {}, el('summary', {}, `${title} (${verdicts})`));
  const scenario = DATA.scenarios[recs[0].scenario];
  if (scenario) d.append(el('p', {class: 'note'}, el('code', {}, JSON.stringify(scenario))));
  document.body.append(d);
  let drawn = false;
  d.addEventListener('toggle', () => {  // draw on first open: pages with many scenarios stay fast
    if (drawn || !d.open) return;
    drawn = true;
    for (const tpl of [...new Set(recs.map(r => r.template))].filter(t => t >= 0)) {
      const box = el('div', {class: 'charts'});
      d.append(el('h3', {}, `template ${tpl}`), box);
      const law = recs.find(r => r.template === tpl && (r.check === 'outcome-law' || r.check === 'position-law') && r.cells);
      if (law) {
        chart(box, [
          {type: 'bar', name: 'observed', x: law.cells.map(c => esc(c[0])), y: law.cells.map(c => c[1])},
          {type: 'bar', name: 'expected', x: law.cells.map(c => esc(c[0])), y: law.cells.map(c => c[2])},
        ], {title: {text: esc(`${law.check}: observed vs expected`)}, barmode: 'group'});
      }
      const len = recs.find(r => r.template === tpl && r.check === 'acceptance-length' && r.acceptance);
      if (len) {
        const a = len.acceptance.steps;
        chart(box, [
          {type: 'scatter', mode: 'markers', name: 'observed (95% CI)', x: a.map(s => s.step), y: a.map(s => s.observed),
            error_y: {type: 'data', symmetric: false, array: a.map(s => s.hi - s.observed), arrayminus: a.map(s => s.observed - s.lo)}},
          {type: 'scatter', mode: 'lines+markers', name: 'closed form', x: a.map(s => s.step), y: a.map(s => s.expected)},
        ], {title: {text: 'acceptance per step: P(accept j | reached j)'}, xaxis: {title: {text: 'step'}, dtick: 1}, yaxis: {range: [0, 1.05]}});
        const n = len.acceptance.length_observed.reduce((x, y) => x + y, 0);
        const xs = len.acceptance.length_observed.map((_, i) => i);
        chart(box, [
          {type: 'bar', name: 'observed', x: xs, y: len.acceptance.length_observed},
          {type: 'bar', name: 'expected', x: xs, y: len.acceptance.length_expected.map(p => p * n)},
        ], {title: {text: 'accepted drafts per trial'}, barmode: 'group', xaxis: {dtick: 1}});
      }
    }
  });
}
