// Shared helpers: every string is inserted with textContent, never as markup.
const DATA = JSON.parse(document.getElementById('data').textContent);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? '' : String(c)));
  return node;
}
function fmt(x, digits) {
  if (x === null || x === undefined) return '–';
  if (typeof x === 'number') return Number.isInteger(x) ? String(x) : x.toPrecision(digits || 3);
  return String(x);
}
function esc(s) {  // Plotly renders a subset of HTML in labels
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}
function chart(parent, traces, layout) {
  const div = el('div', {class: 'chart'});
  parent.append(div);
  Plotly.newPlot(div, traces, Object.assign({margin: {t: 36, l: 50, r: 10, b: 70}, font: {size: 11}}, layout), {displaylogo: false, responsive: true});
  return div;
}
function table(headers, rows, rowClass) {
  const t = el('table', {}, el('tr', {}, ...headers.map(h => el('th', {}, h))));
  rows.forEach((r, i) => {
    const tr = el('tr', {class: rowClass ? rowClass(i) : ''});
    r.forEach(c => tr.append(c instanceof Node ? c : el('td', {}, c)));
    t.append(tr);
  });
  return t;
}
