'use strict';
// keel's page: the plugin graph live, the sessions and their timelines, the approvals inbox.
// Every word shown came from plugins, models or tools: it is only ever set as text
// (textContent), never as markup.

// The page's token: never in a link. keel's link carries a one-time code (`?code=…`), which
// the first load exchanges at once and which is useless from then on; the token is kept in this
// tab's sessionStorage, which is per origin (port included), so a page on another localhost
// port cannot read it.
let token = '';
const TOKEN_KEY = 'keel-token';
const ROW = 26;
const state = {
  live: null, graph: { plugins: [], edges: [] }, figures: {}, changed: new Map(),
  rows: [], selected: -1, shown: null, approvals: new Map(), streaming: -1, drawPending: false,
};

function api(path, options = {}) {
  const headers = Object.assign({ 'x-keel-token': token }, options.headers || {});
  return fetch(path, Object.assign({}, options, { headers })).then(async (r) => {
    const body = await r.text();
    if (!r.ok) {
      let message = body;
      try { message = JSON.parse(body).error || body; } catch (_) { /* plain text */ }
      throw new Error(message);
    }
    return JSON.parse(body);
  });
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'text') node.textContent = v;
    else if (k === 'class') node.className = v;
    // Through the CSSOM: the content security policy refuses style attributes.
    else if (k === 'style') Object.assign(node.style, v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

const short = (s, n = 160) => (s.length > n ? s.slice(0, n - 1) + '…' : s);
const oneLine = (s) => String(s).replace(/\s+/g, ' ').trim();
const ms = (us) => (us / 1000).toFixed(us < 10000 ? 2 : 0) + ' ms';

// ---- views ---------------------------------------------------------------------------

function show(view) {
  for (const name of ['plugins', 'sessions', 'approvals']) {
    const on = name === view;
    document.getElementById('tab-' + name).setAttribute('aria-selected', String(on));
    document.getElementById('view-' + name).hidden = !on;
  }
  // A hidden list has no height: draw the rows in view now that it has one.
  if (view === 'sessions') drawRows();
}

for (const name of ['plugins', 'sessions', 'approvals']) {
  document.getElementById('tab-' + name).addEventListener('click', () => show(name));
}
document.querySelector('nav').addEventListener('keydown', (e) => {
  const tabs = [...document.querySelectorAll('nav button')];
  const at = tabs.indexOf(document.activeElement);
  if (at < 0 || !['ArrowLeft', 'ArrowRight'].includes(e.key)) return;
  const next = tabs[(at + (e.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
  next.focus();
  next.click();
});

// ---- the plugin graph ----------------------------------------------------------------

function layers(plugins, edges) {
  const layer = new Map(plugins.map((p) => [p.name, 0]));
  // A plugin stands one column right of every provider it requires (the graph is acyclic).
  for (let i = 0; i < plugins.length; i++) {
    for (const e of edges) {
      const want = (layer.get(e.to) ?? 0) + 1;
      if ((layer.get(e.from) ?? 0) < want) layer.set(e.from, want);
    }
  }
  return layer;
}

function drawGraph() {
  const { plugins, edges } = state.graph;
  const root = document.getElementById('graph');
  root.replaceChildren();
  const layer = layers(plugins, edges);
  const columns = new Map();
  const at = new Map();
  const W = 190, H = 44, GX = 60, GY = 14;
  for (const p of plugins) {
    const l = layer.get(p.name) || 0;
    const row = columns.get(l) || 0;
    columns.set(l, row + 1);
    at.set(p.name, { x: 10 + l * (W + GX), y: 10 + row * (H + GY) });
  }
  const width = 20 + Math.max(1, columns.size) * (W + GX);
  const height = 20 + Math.max(1, ...columns.values()) * (H + GY);
  root.setAttribute('viewBox', `0 0 ${width} ${height}`);
  root.style.height = Math.min(height, 900) + 'px';
  const defs = svg('defs');
  const marker = svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: '10', refY: '5', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' });
  marker.append(svg('path', { d: 'M 0 0 L 10 5 L 0 10 z' }));
  defs.append(marker);
  root.append(defs);
  for (const e of edges) {
    const a = at.get(e.from), b = at.get(e.to);
    if (!a || !b) continue;
    const path = svg('path', { d: `M ${a.x} ${a.y + H / 2} C ${a.x - GX / 2} ${a.y + H / 2}, ${b.x + W + GX / 2} ${b.y + H / 2}, ${b.x + W} ${b.y + H / 2}`, 'marker-end': 'url(#arrow)' });
    const title = svg('title');
    title.textContent = `${e.from} requires ${e.service} from ${e.to}`;
    path.append(title);
    root.append(path);
  }
  for (const p of plugins) {
    const { x, y } = at.get(p.name);
    const changed = (state.changed.get(p.name) || 0) > Date.now();
    const g = svg('g', { class: `node ${p.state}${changed ? ' changed' : ''}`, 'data-plugin': p.name, 'data-state': p.state, 'data-version': p.version, tabindex: '0' });
    g.append(svg('rect', { x, y, width: W, height: H, rx: 4 }));
    const name = svg('text', { x: x + 8, y: y + 17, 'font-weight': 'bold' });
    name.textContent = short(p.name, 26);
    const line = svg('text', { x: x + 8, y: y + 35 });
    const mark = { active: '●', pending: '◌', failed: '✗', loading: '…', unloading: '…' }[p.state] || '?';
    line.textContent = `${mark} ${p.state} · ${p.version} · ${p.kind}`;
    const title = svg('title');
    title.textContent = `${p.name} ${p.version} (${p.state})${p.reason ? ': ' + p.reason : ''}`;
    g.append(name, line, title);
    root.append(g);
  }
  drawTable();
}

function drawTable() {
  const body = document.querySelector('#plugins tbody');
  body.replaceChildren();
  for (const p of state.graph.plugins) {
    const f = state.figures[p.name] || p.figures || { calls: 0, failed: 0, wall_us: 0, cpu_us: 0 };
    const limits = p.limits ? Object.entries(p.limits).filter(([, v]) => v != null).map(([k, v]) => `${k} ${v}`).join(', ') : '';
    const stateText = p.state + (p.reason ? `: ${p.reason}` : '') + (p.waiting_for ? ` (waiting for ${p.waiting_for.join('; ')})` : '');
    body.append(el('tr', { 'data-plugin': p.name, 'data-calls': String(f.calls), 'data-cpu-us': String(f.cpu_us) },
      el('th', { scope: 'row', text: p.name }),
      el('td', { text: stateText }),
      el('td', { text: p.version }),
      el('td', { text: p.kind }),
      el('td', { text: (p.provides || []).join(', ') }),
      el('td', { text: (p.requires || []).join(', ') }),
      el('td', { text: limits || 'defaults' }),
      el('td', { text: (p.capabilities || []).join('; ') || 'nothing beyond its own calls' }),
      el('td', { class: 'num', text: String(f.calls) }),
      el('td', { class: 'num', text: String(f.failed) }),
      el('td', { class: 'num', text: ms(f.wall_us) }),
      el('td', { class: 'num', text: ms(f.cpu_us) })));
  }
}

function noteChange(change) {
  let words;
  switch (change.change) {
    case 'loaded': words = 'loaded'; break;
    case 'reloaded': words = `reloaded: ${change.from} → ${change.status.version}`; break;
    case 'restarted': words = 'restarted with a fresh instance'; break;
    case 'state': words = `${change.from} → ${change.status.state}`; break;
    case 'unloaded': words = 'unloaded'; break;
    default: words = change.change;
  }
  if (change.status && change.status.reason) words += ` (${change.status.reason})`;
  state.changed.set(change.plugin, Date.now() + 3000);
  setTimeout(drawGraph, 3100);
  const list = document.getElementById('changes');
  list.prepend(el('li', { 'data-change': change.change, text: `${new Date().toLocaleTimeString()} ${change.plugin} ${words}` }));
  while (list.children.length > 50) list.lastChild.remove();
}

// ---- sessions and the timeline -------------------------------------------------------

function rowsOf(event, time, depth, out, label = '') {
  const pad = '  '.repeat(depth) + (label ? `[${label}] ` : '');
  const push = (text, detail, meta = '') => out.push({ text: pad + oneLine(text), detail, meta, time, kind: event.kind });
  switch (event.kind) {
    case 'session_started':
      push(`── session started · ${event.model} · ${event.workspace}`, JSON.stringify(event, null, 2));
      break;
    case 'context':
      push(`context: ${event.tools.length} tools offered`, event.system + '\n\ntools: ' + event.tools.map((t) => t.name).join(', '));
      break;
    case 'message': {
      const m = event.message;
      const usage = event.usage ? `${event.usage.input_tokens} in · ${event.usage.output_tokens} out tokens` : '';
      for (const b of m.content) {
        if (b.type === 'text' && m.role === 'user') push(`› ${b.text}`, b.text);
        else if (b.type === 'text') push(`model: ${b.text}`, b.text, usage);
        else if (b.type === 'thinking') push(`thinking: ${b.text}`, b.text);
        else if (b.type === 'tool_call') push(`→ ${b.name} ${b.arguments}`, callDetail(b), usage);
      }
      break;
    }
    case 'tool_outcome': {
      const o = event.outcome;
      const exec = (o.exec || []).map((x) => `$ ${x.command}  → ${x.timed_out ? 'timed out' : 'exit ' + x.exit_code}\n  ran in: ${x.sandbox || 'not recorded (an older log)'}`).join('\n');
      const detail = `${o.tool} ${o.status} (call ${o.call_id})\n` + (exec ? `\n${exec}\n` : '') + `\n${o.content}` + (o.spill ? `\n\nfull output: ${o.spill}` : '');
      push(`← ${o.tool} ${o.status}: ${o.content}`, detail, exec ? `${o.exec.length} command(s)` : '');
      break;
    }
    case 'verdict': {
      const v = event.verdict;
      push(`verdict ${v.status}: ${v.claim}`, JSON.stringify(v, null, 2));
      break;
    }
    case 'compacted':
      push(`⇢ compacted ${event.replaced} messages (${event.reason}): ${event.tokens_before} → ${event.tokens_after} tokens`, event.summary);
      break;
    case 'subagent':
      rowsOf(event.event, time, depth + 1, out, event.label || `child ${event.child}`);
      break;
    case 'rewound':
      push(`↺ rewound to turn ${event.turn}, ${event.keep} messages kept`, JSON.stringify(event, null, 2));
      break;
    case 'turn_ended':
      push(`■ turn ended: ${event.end}${event.detail ? ' — ' + event.detail : ''}`, event.detail || event.end);
      break;
    default:
      break;
  }
}

// A write's content, or an edit's change as removed and added lines.
function callDetail(call) {
  let args;
  try { args = JSON.parse(call.arguments); } catch (_) { return `${call.name} (call ${call.id})\n\n${call.arguments}`; }
  let text = `${call.name} (call ${call.id})\n\n`;
  if (args && typeof args.path === 'string' && typeof args.old_string === 'string' && typeof args.new_string === 'string') {
    text += `edit ${args.path}\n` + args.old_string.split('\n').map((l) => '- ' + l).join('\n') + '\n' + args.new_string.split('\n').map((l) => '+ ' + l).join('\n');
  } else if (args && typeof args.path === 'string' && typeof args.content === 'string') {
    text += `write ${args.path}\n` + args.content.split('\n').map((l) => '+ ' + l).join('\n');
  } else {
    text += JSON.stringify(args, null, 2);
  }
  return text;
}

function addLines(lines) {
  for (const line of lines) {
    const before = state.rows.length;
    rowsOf(line, line.time_ms, 0, state.rows);
    for (let i = before; i < state.rows.length; i++) {
      const prev = i > 0 ? state.rows[i - 1].time : null;
      if (prev != null && state.rows[i].time != null) {
        const gap = state.rows[i].time - prev;
        state.rows[i].meta = [state.rows[i].meta, `+${gap} ms`].filter(Boolean).join(' · ');
      }
    }
  }
  const space = document.getElementById('timeline-space');
  space.style.height = state.rows.length * ROW + 'px';
  drawRows();
}

function drawRows() {
  const box = document.getElementById('timeline');
  const space = document.getElementById('timeline-space');
  const first = Math.max(0, Math.floor(box.scrollTop / ROW) - 10);
  const last = Math.min(state.rows.length, Math.ceil((box.scrollTop + box.clientHeight) / ROW) + 10);
  const kids = [];
  for (let i = first; i < last; i++) {
    const r = state.rows[i];
    kids.push(el('div', { class: 'row', role: 'option', id: 'row-' + i, 'data-kind': r.kind, 'aria-selected': String(i === state.selected), style: { top: `${i * ROW}px` }, onclick: () => select(i, true) },
      el('span', { class: 'meta', text: r.meta || '' }), short(r.text, 400)));
  }
  space.replaceChildren(...kids);
  box.dataset.rows = String(state.rows.length);
}

function select(i, open) {
  if (!state.rows.length) return;
  state.selected = Math.max(0, Math.min(state.rows.length - 1, i));
  const box = document.getElementById('timeline');
  const top = state.selected * ROW;
  if (top < box.scrollTop) box.scrollTop = top;
  else if (top + ROW > box.scrollTop + box.clientHeight) box.scrollTop = top + ROW - box.clientHeight;
  box.setAttribute('aria-activedescendant', 'row-' + state.selected);
  drawRows();
  if (open) document.getElementById('detail').textContent = state.rows[state.selected].detail || state.rows[state.selected].text;
}

document.getElementById('timeline').addEventListener('scroll', drawRows);
document.getElementById('timeline').addEventListener('keydown', (e) => {
  const page = Math.max(1, Math.floor(document.getElementById('timeline').clientHeight / ROW));
  const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page };
  if (e.key in moves) select(state.selected + moves[e.key], false);
  else if (e.key === 'Home') select(0, false);
  else if (e.key === 'End') select(state.rows.length - 1, false);
  else if (e.key === 'Enter') select(state.selected, true);
  else return;
  e.preventDefault();
});

async function loadSessions() {
  const list = document.getElementById('sessions');
  let sessions;
  try { sessions = await api('/api/sessions'); } catch (e) { list.replaceChildren(el('li', { text: `cannot list sessions: ${e.message}` })); return; }
  list.replaceChildren(...sessions.map((s) => el('li', {},
    el('button', { 'data-session': s.id, 'aria-current': String(s.id === state.shown), onclick: () => openSession(s.id) },
      `${s.id === state.live ? '● live · ' : ''}${s.id} · ${s.entries} entries\n`, el('br'), short(oneLine(s.preview || ''), 80)))));
}

function startTimeline(id) {
  state.shown = id;
  state.rows = [];
  state.streaming = -1;
  state.selected = -1;
  document.getElementById('detail').textContent = '';
  document.getElementById('timeline-title').textContent = `Timeline of ${id}${id === state.live ? ' (live)' : ''}`;
  for (const b of document.querySelectorAll('#sessions button')) b.setAttribute('aria-current', String(b.dataset.session === id));
  addLines([]);
}

async function openSession(id) {
  startTimeline(id);
  try {
    const read = await api('/api/sessions/' + encodeURIComponent(id));
    if (state.shown === id) addLines(read.lines);
  } catch (e) {
    // A live session that has logged nothing yet has no log to read.
    if (id !== state.live) document.getElementById('detail').textContent = `cannot read this session: ${e.message}`;
  }
}

// The live session's entries as they arrive; the list follows the end unless the person
// moved up in it.
function liveLine(event) {
  const following = state.selected < 0 || state.selected >= state.rows.length - 2;
  const streaming = state.streaming >= 0 ? state.rows.splice(state.streaming, 1)[0] : null;
  addLines([Object.assign({ time_ms: Date.now() }, event)]);
  if (streaming) {
    state.streaming = state.rows.length;
    state.rows.push(streaming);
    addLines([]);
  }
  if (following) {
    const box = document.getElementById('timeline');
    box.scrollTop = box.scrollHeight;
  }
}

// The model's text as it streams, in one row at the end until its message arrives.
function stream(text) {
  if (state.streaming < 0) {
    state.streaming = state.rows.length;
    state.rows.push({ text: 'model (writing): ', detail: '', meta: '', time: Date.now(), kind: 'streaming' });
  }
  const row = state.rows[state.streaming];
  row.detail += text;
  const box = document.getElementById('timeline');
  box.dataset.streamed = String(Number(box.dataset.streamed || 0) + 1);
  row.text = 'model (writing): ' + oneLine(row.detail.slice(-400));
  if (!state.drawPending) {
    state.drawPending = true;
    requestAnimationFrame(() => { state.drawPending = false; addLines([]); });
  }
}

function endStreaming() {
  if (state.streaming < 0) return;
  state.rows.splice(state.streaming, 1);
  state.streaming = -1;
  addLines([]);
}

// A session's log read again: its rows rebuilt, the selection and scroll kept.
async function reread(id) {
  const box = document.getElementById('timeline');
  const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - ROW;
  let read;
  try { read = await api('/api/sessions/' + encodeURIComponent(id)); } catch (_) { return; }
  if (state.shown !== id) return;
  // The selection as it is now: the person may have moved while the log was read.
  const { selected } = state;
  state.rows = [];
  addLines(read.lines);
  state.selected = Math.min(selected, state.rows.length - 1);
  if (atEnd) box.scrollTop = box.scrollHeight;
  drawRows();
}

// ---- approvals -----------------------------------------------------------------------

function drawApprovalCount() {
  const open = [...state.approvals.values()].filter((a) => !a.answered).length;
  document.getElementById('approval-count').textContent = `(${open})`;
  // Seen from another tab of the browser too.
  document.title = open ? `(${open}) keel: approval waiting` : 'keel';
}

function addApproval(q) {
  if (state.approvals.has(q.id)) return;
  const card = el('div', { class: 'approval', 'data-approval': String(q.id), role: 'group', 'aria-label': `approval ${q.id}: ${q.tool}` },
    el('pre', { text: q.wording }));
  const buttons = el('div', { class: 'choices' });
  for (const c of q.choices) {
    buttons.append(el('button', { 'data-key': c.key, onclick: () => answer(q.id, c.key) }, `[${c.key}] ${c.label}`));
  }
  const instead = el('input', { type: 'text', 'aria-label': 'no, and do this instead', placeholder: 'no — and do this instead…' });
  buttons.append(el('br'), instead, el('button', { 'data-key': 'instead', onclick: () => answer(q.id, instead.value.trim().includes(' ') ? instead.value : 'n') }, 'say no'));
  card.append(buttons, el('p', { class: 'outcome', 'aria-live': 'polite' }));
  document.getElementById('approvals').prepend(card);
  state.approvals.set(q.id, { card, answered: false });
  drawApprovalCount();
}

function answered(id, by, words) {
  const a = state.approvals.get(id);
  if (!a) return;
  a.answered = true;
  a.card.classList.add('answered');
  a.card.dataset.answeredBy = by;
  a.card.querySelector('.choices').remove();
  const where = { page: 'on this page', terminal: 'in the terminal', nobody: '' }[by] ?? by;
  a.card.querySelector('.outcome').textContent = `answered ${where}: ${words}`.replace('answered : ', '');
  drawApprovalCount();
}

async function answer(id, line) {
  try {
    await api('/api/approvals/' + id, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ answer: line }) });
  } catch (e) {
    const a = state.approvals.get(id);
    if (a) a.card.querySelector('.outcome').textContent = e.message;
  }
}

// ---- the live feed -------------------------------------------------------------------

async function loadAll() {
  const overview = await api('/api/overview');
  state.live = overview.live;
  state.sandbox = overview.sandbox;
  document.getElementById('where').textContent = `${overview.version} · sandbox: ${overview.sandbox}` + (overview.live ? ` · live session ${overview.live}` : '');
  state.graph = await api('/api/graph');
  drawGraph();
  await loadSessions();
  if (state.live) {
    state.approvals.clear();
    document.getElementById('approvals').replaceChildren();
    for (const q of await api('/api/approvals')) addApproval(q);
  }
  const want = state.shown || state.live;
  if (want) await openSession(want);
  document.body.dataset.ready = '1';
}

function connect() {
  const link = document.getElementById('link');
  const feed = new EventSource('/api/events?token=' + encodeURIComponent(token));
  feed.addEventListener('open', () => { link.textContent = 'connected'; document.body.dataset.feed = 'open'; });
  feed.addEventListener('error', () => { link.textContent = 'reconnecting…'; document.body.dataset.feed = 'closed'; });
  feed.addEventListener('plugin', (e) => {
    const data = JSON.parse(e.data);
    state.graph = data.graph;
    noteChange(data.change);
    drawGraph();
  });
  feed.addEventListener('figures', (e) => { state.figures = JSON.parse(e.data); drawTable(); });
  feed.addEventListener('session', (e) => {
    const event = JSON.parse(e.data);
    // `/clear` goes on as a new session: the page follows it.
    if (event.kind === 'session_started' && event.session !== state.live) {
      const following = state.shown === state.live;
      state.live = event.session;
      if (following) startTimeline(event.session);
      loadSessions();
    }
    if (event.session !== state.live || state.shown !== state.live) return;
    if (event.kind === 'message' && event.message.role === 'assistant') endStreaming();
    liveLine(event);
    if (event.kind === 'turn_ended') { endStreaming(); loadSessions(); }
  });
  feed.addEventListener('subagent', (e) => {
    const child = JSON.parse(e.data);
    if (state.shown !== state.live) return;
    liveLine({ kind: 'subagent', session: state.live, parent_call: child.parent_call, child: child.child, label: child.label, event: child.event });
  });
  feed.addEventListener('delta', (e) => {
    const delta = JSON.parse(e.data);
    if (delta.type !== 'text' || state.shown !== state.live) return;
    stream(delta.text);
  });
  feed.addEventListener('approval', (e) => {
    const data = JSON.parse(e.data);
    if (data.kind === 'asked') addApproval(data);
    else answered(data.id, data.by, data.answer);
  });
  feed.addEventListener('resync', () => { loadAll(); });
  // Another keel process wrote to a session's log: the list, and the session shown if it is
  // one of them, are read again (at most once a second).
  feed.addEventListener('logs', (e) => {
    const ids = JSON.parse(e.data);
    if (state.shown && (ids.length === 0 || ids.includes(state.shown))) state.reread = true;
    state.relist = true;
    if (state.rereadTimer) return;
    state.rereadTimer = setTimeout(async () => {
      state.rereadTimer = null;
      if (state.relist) { state.relist = false; await loadSessions(); }
      if (state.reread && state.shown && state.shown !== state.live) { state.reread = false; await reread(state.shown); }
    }, 1000);
  });
}

async function obtainToken() {
  const code = new URLSearchParams(location.search).get('code');
  if (code) {
    // Out of the address bar and the history at once: spent either way.
    history.replaceState(null, '', location.pathname);
    const r = await fetch('/api/session', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code }),
    });
    const body = await r.text();
    if (!r.ok) throw new Error(body);
    sessionStorage.setItem(TOKEN_KEY, JSON.parse(body).token);
  }
  const kept = sessionStorage.getItem(TOKEN_KEY);
  if (!kept) throw new Error('refused: this page opens only from the link keel printed; type /web in `keel run`, or start `keel web` again, for a new one');
  return kept;
}

obtainToken().then((kept) => {
  token = kept;
  loadAll().catch((e) => { document.getElementById('link').textContent = `cannot reach keel: ${e.message}`; });
  connect();
}).catch((e) => {
  document.querySelector('main').replaceChildren(el('p', { id: 'refused', text: e.message }));
  document.getElementById('link').textContent = 'not connected';
});
