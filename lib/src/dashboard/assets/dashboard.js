// The queue dashboard: one page, hash routes, plain DOM. No framework, no build step, no
// dependency, nothing fetched from elsewhere (the page's Content-Security-Policy allows only
// this origin).
//
// Every value shown comes from the database and may hold markup (payloads, errors, keys): it is
// only ever set with textContent / setAttribute, never parsed as HTML.

const CSRF_TOKEN = metaContent('sqlqueue-csrf');
const READ_ONLY = metaContent('sqlqueue-read-only') === 'true';
const REFRESH_MS = clamp(Number(metaContent('sqlqueue-refresh-ms')) || 2000, 500, 60_000);
const DONE_REFRESH_MS = 15_000;
const REQUEST_TIMEOUT_MS = 30_000;
/** Throughput is counted per minute and cached by the server: fresher reads would show nothing new. */
const THROUGHPUT_REFRESH_MS = 30_000;
const CHART_MINUTES = 60;
const PAGE_SIZE = 50;
const NOTICE_MS = 6000;
const STATES = ['ready', 'delayed', 'leased', 'done', 'dead'];
const FINISHED_STATES = new Set(['done', 'dead']);
const JOB_ID = /^\d{1,19}$/;
const SVG_NS = 'http://www.w3.org/2000/svg';

// ---- DOM building ---------------------------------------------------------------------------

/**
 * Builds an element. `props` come from this file, never from data: `on*` keys are listeners,
 * `testid` is the test hook, booleans set or omit an attribute, anything else is an attribute.
 * Children are nodes or text (strings and numbers become text nodes).
 */
function h(tag, props, ...children) {
  const element = document.createElement(tag);
  setProps(element, props);
  appendChildren(element, children);
  return element;
}

/** The same for SVG elements. */
function svg(tag, props, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  setProps(element, props);
  appendChildren(element, children);
  return element;
}

function setProps(element, props) {
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'testid') element.setAttribute('data-testid', value);
    else if (key.startsWith('on') && typeof value === 'function') element.addEventListener(key.slice(2), value);
    else element.setAttribute(key, value === true ? '' : String(value));
  }
}

function appendChildren(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

function metaContent(name) {
  return document.querySelector(`meta[name="${name}"]`)?.getAttribute('content') ?? '';
}

function clamp(value, min, max) {
  return Math.min(max, Math.max(min, value));
}

// ---- Formatting -----------------------------------------------------------------------------

const integerFormat = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

function formatCount(value) {
  return integerFormat.format(value ?? 0);
}

function pad(value, width = 2) {
  return String(value).padStart(width, '0');
}

function clockTime(date, seconds = true) {
  const text = `${pad(date.getHours())}:${pad(date.getMinutes())}`;
  return seconds ? `${text}:${pad(date.getSeconds())}` : text;
}

/** Local time; the date too unless it is today. */
function formatDate(iso) {
  if (!iso) return '—';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  const today = new Date();
  const sameDay = date.toDateString() === today.toDateString();
  const day = `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
  return sameDay ? clockTime(date) : `${day} ${clockTime(date)}`;
}

/** A <time> with the exact instant on hover. */
function timeCell(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: iso, title: iso }, formatDate(iso));
}

/** 850 ms, 12 s, 3 min 4 s, 2 h 5 min, 3 d 4 h. */
function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '—';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const seconds = Math.floor(ms / 1000);
  if (seconds < 60) return `${(ms / 1000).toFixed(seconds < 10 ? 1 : 0)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return joinUnits(minutes, 'min', seconds % 60, 's');
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return joinUnits(hours, 'h', minutes % 60, 'min');
  return joinUnits(Math.floor(hours / 24), 'd', hours % 24, 'h');
}

function joinUnits(major, majorUnit, minor, minorUnit) {
  return minor === 0 ? `${major} ${majorUnit}` : `${major} ${majorUnit} ${minor} ${minorUnit}`;
}

function durationBetween(startIso, endIso) {
  if (!startIso || !endIso) return null;
  return Date.parse(endIso) - Date.parse(startIso);
}

function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2) ?? 'undefined';
  } catch {
    return String(value);
  }
}

function plural(count, one, many = `${one}s`) {
  return `${formatCount(count)} ${count === 1 ? one : many}`;
}

// ---- Routes ---------------------------------------------------------------------------------

const href = {
  overview: () => '#/',
  schedules: () => '#/schedules',
  queue: (queue, state = 'ready') => `#/queues/${encodeURIComponent(queue)}/${state}`,
  groups: (queue) => `#/queues/${encodeURIComponent(queue)}/groups`,
  job: (id) => `#/jobs/${encodeURIComponent(id)}`,
};

function parseRoute(hash) {
  let parts;
  try {
    parts = hash
      .replace(/^#\/?/, '')
      .split('/')
      .filter(Boolean)
      .map((part) => decodeURIComponent(part));
  } catch {
    return { view: 'not-found' };
  }
  const [head, second, third] = parts;
  if (parts.length === 0) return { view: 'overview' };
  if (head === 'schedules' && parts.length === 1) return { view: 'schedules' };
  if (head === 'jobs' && parts.length === 2) return { view: 'job', id: second };
  if (head === 'queues' && parts.length >= 2 && parts.length <= 3) {
    const tab = third ?? 'ready';
    if (tab === 'groups') return { view: 'groups', queue: second };
    if (STATES.includes(tab)) return { view: 'jobs', queue: second, state: tab };
  }
  return { view: 'not-found' };
}

// ---- Talking to the server ------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Relative paths resolve against <base href>, the dashboard's mount path. */
async function request(path, init = {}) {
  let response;
  try {
    response = await fetch(path, {
      credentials: 'same-origin',
      cache: 'no-store',
      // A request that never ends would stall the refresh loop with no error shown.
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      ...init,
      headers: { accept: 'application/json', ...init.headers },
    });
  } catch (error) {
    throw new ApiError(0, `the server did not answer (${error instanceof Error ? error.message : String(error)})`);
  }
  const body = parseJson(await response.text());
  if (!response.ok) throw new ApiError(response.status, errorMessage(response, body));
  return body;
}

/** A proxy or a crashed server may answer with HTML or nothing: no body then. */
function parseJson(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

function errorMessage(response, body) {
  const message = body && body.message;
  const text = Array.isArray(message) ? message.join('; ') : typeof message === 'string' ? message : '';
  if (response.status === 401 || (response.status === 403 && !text)) {
    return `not allowed (${response.status}): reload the page to sign in again`;
  }
  return text ? `${text} (${response.status})` : `the server answered ${response.status} ${response.statusText}`;
}

function getJson(path) {
  return request(path);
}

function postJson(path, body) {
  return request(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sqlqueue-csrf': CSRF_TOKEN },
    body: JSON.stringify(body ?? {}),
  });
}

const api = {
  overview: () => getJson('api/overview'),
  throughput: (minutes) => getJson(`api/throughput?minutes=${minutes}`),
  jobs: (queue, state, cursor) =>
    getJson(
      `api/queues/${encodeURIComponent(queue)}/jobs?state=${state}&limit=${PAGE_SIZE}` +
        (cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''),
    ),
  job: (id) => getJson(`api/jobs/${encodeURIComponent(id)}`),
  groups: (queue, after) =>
    getJson(
      `api/queues/${encodeURIComponent(queue)}/groups?limit=${PAGE_SIZE}` +
        (after ? `&after=${encodeURIComponent(after)}` : ''),
    ),
  schedules: () => getJson('api/schedules'),
  flow: (queue) => getJson(`api/queues/${encodeURIComponent(queue)}/flow?limit=10`),
  retryDead: (queue, selection) => postJson(`api/queues/${encodeURIComponent(queue)}/dead/retry`, selection),
  purgeDead: (queue, selection) => postJson(`api/queues/${encodeURIComponent(queue)}/dead/purge`, selection),
  schedule: (id, action) => postJson(`api/schedules/${encodeURIComponent(id)}/${action}`, {}),
  queueControl: (queue, action) => postJson(`api/queues/${encodeURIComponent(queue)}/${action}`, {}),
  cancelJob: (id) => postJson(`api/jobs/${encodeURIComponent(id)}/cancel`, {}),
};

/** The overview feeds the overview page and the state tabs' counts; the last reading is kept. */
let lastOverview = null;

async function loadOverview() {
  lastOverview = await api.overview();
  return lastOverview;
}

// ---- Page chrome: banners, last update, navigation ------------------------------------------

const chrome = {
  app: document.getElementById('app'),
  errorBanner: document.getElementById('error-banner'),
  notice: document.getElementById('notice'),
  lastUpdated: document.getElementById('last-updated'),
  readOnlyBadge: document.getElementById('read-only-badge'),
  openJob: document.getElementById('open-job'),
  noticeTimer: null,
};

/**
 * A failed refresh shows until the next successful one; a failed action until it is dismissed,
 * another action succeeds or the reader moves to another page.
 */
function showBanner(kind, title, message, hint) {
  const dismiss = h('button', { type: 'button', class: 'banner-close', 'aria-label': 'Dismiss' }, '×');
  dismiss.addEventListener('click', clearError);
  chrome.errorBanner.replaceChildren(
    h(
      'div',
      { class: 'banner-text' },
      h('strong', null, title),
      ' ',
      message,
      hint ? h('span', { class: 'banner-hint' }, hint) : null,
    ),
    dismiss,
  );
  chrome.errorBanner.dataset.kind = kind;
  chrome.errorBanner.hidden = false;
}

function messageOf(error) {
  return error instanceof Error ? error.message : String(error);
}

function showError(error) {
  showBanner('refresh', 'Refresh failed:', messageOf(error), ' — showing the last data received.');
}

function showActionError(what, error) {
  showBanner('action', `${what} failed:`, messageOf(error));
}

function clearError() {
  chrome.errorBanner.hidden = true;
  chrome.errorBanner.replaceChildren();
  delete chrome.errorBanner.dataset.kind;
}

function showNotice(text) {
  chrome.notice.textContent = text;
  chrome.notice.hidden = false;
  clearTimeout(chrome.noticeTimer);
  chrome.noticeTimer = setTimeout(() => {
    chrome.notice.hidden = true;
  }, NOTICE_MS);
}

function markUpdated() {
  chrome.lastUpdated.replaceChildren(h('span', { class: 'live-dot' }), `Updated ${clockTime(new Date())}`);
  chrome.lastUpdated.setAttribute('title', new Date().toISOString());
}

function highlightNav(route) {
  const section = route.view === 'schedules' ? 'schedules' : 'overview';
  for (const link of document.querySelectorAll('[data-nav]')) {
    if (link.getAttribute('data-nav') === section) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

function pageHead(crumbs, title, ...extra) {
  return h(
    'div',
    { class: 'page-head' },
    crumbs.length
      ? h(
          'nav',
          { class: 'crumbs', 'aria-label': 'Breadcrumb' },
          crumbs.map(([label, link], index) => [
            index > 0 ? h('span', { class: 'crumb-sep' }, '/') : null,
            h('a', { href: link }, label),
          ]),
        )
      : null,
    h('div', { class: 'page-title' }, h('h1', null, title), ...extra),
  );
}

function panel(title, props, ...children) {
  return h(
    'section',
    { class: 'panel', ...props },
    title ? h('div', { class: 'panel-head' }, typeof title === 'string' ? h('h2', null, title) : title) : null,
    ...children,
  );
}

/**
 * A table in a panel. `headers` are labels or <th> elements (null for a column left out),
 * `rows` the <tr> elements; with none, one row says `empty`.
 */
function tablePanel({ title = null, testid, className = 'table', headers, rows, empty }) {
  const cells = headers
    .filter((cell) => cell !== null)
    .map((cell) => (cell instanceof Node ? cell : h('th', null, cell)));
  return panel(
    title,
    null,
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        { class: className, testid },
        h('thead', null, h('tr', null, cells)),
        h('tbody', null, rows.length ? rows : h('tr', { class: 'empty' }, h('td', { colspan: cells.length }, empty))),
      ),
    ),
  );
}

/** One line of a long value, cut with an ellipsis; all of it on hover (and on the job's page). */
function clipped(text, className) {
  if (text === null || text === undefined || text === '') return h('span', { class: 'muted' }, '—');
  return h('div', { class: `clip ${className}`, title: text }, text);
}

function stateBadge(state, props = {}) {
  return h('span', { class: `pill pill-${state}`, ...props }, state);
}

function button(label, props = {}) {
  return h('button', { type: 'button', class: 'button', ...props }, label);
}

/**
 * Runs an action button's request: the button is disabled meanwhile, a failure shows in the
 * banner, success in the notice, and the view refreshes at once.
 */
async function runAction(view, control, what, action, describeResult) {
  if (control) control.disabled = true;
  try {
    const result = await action();
    showNotice(describeResult(result));
    clearError();
  } catch (error) {
    showActionError(what, error);
  } finally {
    if (control) control.disabled = false;
  }
  await refreshNow(view);
}

// ---- Throughput chart -----------------------------------------------------------------------

/**
 * Per-minute sums over the last `minutes` up to the server's now, oldest first; `queue` null
 * sums every queue. Minutes without a bucket count zero.
 */
function minuteSeries(throughput, minutes, queue = null) {
  const now = throughput ? Date.parse(throughput.now) : Date.now();
  const currentMinute = Math.floor(now / 60_000) * 60_000;
  const series = Array.from({ length: minutes }, (_, index) => ({
    index,
    minute: new Date(currentMinute - (minutes - 1 - index) * 60_000),
    completed: 0,
    failed: 0,
    dead: 0,
  }));
  for (const bucket of throughput?.buckets ?? []) {
    if (queue !== null && bucket.queue !== queue) continue;
    const age = Math.round((currentMinute - Date.parse(bucket.minute)) / 60_000);
    const point = series[minutes - 1 - age];
    if (!point) continue;
    point.completed += bucket.completed;
    point.failed += bucket.failed;
    point.dead += bucket.dead;
  }
  return series;
}

/** 1, 2, 5 × 10^k at or above `value`. */
function niceCeiling(value) {
  if (value <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function throughputChart(series) {
  const width = 960;
  const height = 180;
  const left = 48;
  const right = 8;
  const top = 14;
  const bottom = 26;
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const peak = Math.max(0, ...series.map((p) => p.completed + p.failed + p.dead));
  const max = niceCeiling(peak);
  const slot = plotWidth / series.length;
  const barWidth = Math.max(1, slot * 0.72);
  const y = (value) => top + plotHeight - (value / max) * plotHeight;

  const grid = [0, 0.5, 1].map((fraction) => {
    const value = max * fraction;
    return svg(
      'g',
      { class: 'chart-grid' },
      svg('line', { x1: left, x2: width - right, y1: y(value), y2: y(value) }),
      svg('text', { x: left - 8, y: y(value) + 4, 'text-anchor': 'end' }, formatCount(value)),
    );
  });

  const columns = series.map((point) => {
    const x = left + point.index * slot + (slot - barWidth) / 2;
    const failures = point.failed + point.dead;
    const label =
      `${clockTime(point.minute, false)} · ${plural(point.completed, 'completed', 'completed')}` +
      ` · ${formatCount(point.failed)} failed · ${formatCount(point.dead)} dead`;
    return svg(
      'g',
      { class: 'chart-column' },
      svg('title', null, label),
      svg('rect', { class: 'chart-hit', x: left + point.index * slot, y: top, width: slot, height: plotHeight }),
      point.completed > 0
        ? svg('rect', {
            class: 'bar bar-completed',
            x,
            y: y(point.completed),
            width: barWidth,
            height: Math.max(1, y(0) - y(point.completed)),
            rx: 1.5,
          })
        : null,
      failures > 0
        ? svg('rect', {
            class: 'bar bar-failed',
            x,
            y: y(point.completed + failures),
            width: barWidth,
            height: Math.max(1, y(point.completed) - y(point.completed + failures)),
            rx: 1.5,
          })
        : null,
    );
  });

  const ticks = [0, 15, 30, 45].map((index) =>
    svg(
      'text',
      { class: 'chart-axis', x: left + index * slot + slot / 2, y: height - 8, 'text-anchor': 'middle' },
      clockTime(series[index].minute, false),
    ),
  );
  ticks.push(svg('text', { class: 'chart-axis', x: width - right, y: height - 8, 'text-anchor': 'end' }, 'now'));

  const empty =
    peak === 0
      ? svg(
          'text',
          { class: 'chart-empty', x: left + plotWidth / 2, y: top + plotHeight / 2, 'text-anchor': 'middle' },
          'No job finished in the last hour',
        )
      : null;

  return svg(
    'svg',
    {
      class: 'chart',
      testid: 'throughput-chart',
      viewBox: `0 0 ${width} ${height}`,
      role: 'img',
      'aria-label': 'Jobs completed and failed per minute over the last hour',
      preserveAspectRatio: 'xMidYMid meet',
    },
    grid,
    columns,
    ticks,
    empty,
  );
}

/** A queue's last hour in 120×24: completions, failures stacked on top in red. */
function sparkline(series, queue) {
  const width = 120;
  const height = 24;
  const peak = Math.max(1, ...series.map((p) => p.completed + p.failed + p.dead));
  const slot = width / series.length;
  const scale = (value) => (value / peak) * (height - 2);
  const bars = [];
  for (const point of series) {
    const failures = point.failed + point.dead;
    const x = point.index * slot;
    if (point.completed > 0) {
      const barHeight = Math.max(1, scale(point.completed));
      bars.push(
        svg('rect', { class: 'spark-completed', x, y: height - barHeight, width: slot * 0.8, height: barHeight }),
      );
    }
    if (failures > 0) {
      const base = scale(point.completed);
      const barHeight = Math.max(1, scale(failures));
      bars.push(
        svg('rect', { class: 'spark-failed', x, y: height - base - barHeight, width: slot * 0.8, height: barHeight }),
      );
    }
  }
  return svg(
    'svg',
    { class: 'sparkline', testid: `sparkline-${queue}`, viewBox: `0 0 ${width} ${height}`, 'aria-hidden': 'true' },
    svg('line', { class: 'spark-base', x1: 0, x2: width, y1: height - 0.5, y2: height - 0.5 }),
    bars,
  );
}

function totalsOf(series) {
  return series.reduce(
    (sum, p) => ({ completed: sum.completed + p.completed, failed: sum.failed + p.failed, dead: sum.dead + p.dead }),
    { completed: 0, failed: 0, dead: 0 },
  );
}

// ---- Views ----------------------------------------------------------------------------------
//
// A view renders into its root and exposes refresh() (fetch, then render) and live() (whether
// the periodic refresh applies now). Renders are skipped when the data did not change, so the
// DOM under the reader's pointer (open stacks, checkboxes, focus) stays put.

class View {
  constructor(root) {
    this.root = root;
    this.busy = false;
    this.again = false;
    this.signature = null;
  }

  live() {
    return true;
  }

  /** How often the periodic refresh runs for this view. */
  refreshEveryMs() {
    return REFRESH_MS;
  }

  /** Renders `build()` unless `data` is what was rendered last. */
  render(data, build) {
    const signature = JSON.stringify(data);
    if (signature === this.signature) return;
    this.signature = signature;
    this.root.replaceChildren();
    appendChildren(this.root, [build()]);
  }

  /** Forces the next render (after an action changed what the page shows). */
  invalidate() {
    this.signature = null;
  }

  /** Fetches and renders again now (another page of the list). */
  reload() {
    this.invalidate();
    void refreshNow(this);
  }
}

const OVERVIEW_COLUMNS = [
  ['ready', 'Ready', 'Due now, waiting for a worker'],
  ['delayed', 'Delayed', 'Waiting for their run time (delayed enqueues and retries backing off)'],
  ['leased', 'Leased', 'Held by a worker now'],
  ['expiredLeases', 'Expired leases', 'Leased past the lease end: the reaper will return them'],
  ['dead', 'Dead', 'Out of attempts: retry or purge them'],
  ['retrying', 'Retrying', 'Waiting jobs that already failed at least once'],
  ['blockedGroups', 'Blocked groups', 'Ordered groups stopped by a dead job'],
];

class OverviewView extends View {
  constructor(root) {
    super(root);
    this.overview = null;
    this.throughput = null;
    this.throughputAt = 0;
  }

  async refresh() {
    const wantThroughput = Date.now() - this.throughputAt >= THROUGHPUT_REFRESH_MS;
    const [overview, throughput] = await Promise.all([
      loadOverview(),
      wantThroughput ? api.throughput(CHART_MINUTES) : Promise.resolve(this.throughput),
    ]);
    this.overview = overview;
    if (wantThroughput) {
      this.throughput = throughput;
      this.throughputAt = Date.now();
    }
    this.render({ overview: { ...overview, now: null }, throughput }, () => this.build());
  }

  build() {
    const { overview, throughput } = this;
    const series = minuteSeries(throughput, CHART_MINUTES);
    const totals = totalsOf(series);
    const sum = (field) => overview.queues.reduce((total, queue) => total + (queue[field] ?? 0), 0);
    const failuresLabel = `Failures (${formatDuration(overview.failureWindowMs)})`;
    return [
      pageHead([], 'Queues', h('span', { class: 'subtitle' }, plural(overview.queues.length, 'queue'))),
      overview.databaseError
        ? h(
            'div',
            { class: 'callout callout-warn', testid: 'database-error' },
            h('strong', null, 'The database could not be read: '),
            overview.databaseError,
          )
        : null,
      h(
        'div',
        { class: 'cards' },
        statCard('Ready', sum('ready'), 'ready'),
        statCard('Delayed', sum('delayed'), 'delayed'),
        statCard('Leased', sum('leased'), 'leased'),
        statCard('Dead', sum('dead'), sum('dead') > 0 ? 'dead' : 'neutral'),
        statCard('Completed · 1 h', totals.completed, 'done', `${formatCount(Math.round(totals.completed / 60))}/min`),
        statCard(
          'Failed · 1 h',
          totals.failed + totals.dead,
          totals.failed + totals.dead > 0 ? 'dead' : 'neutral',
          `${formatCount(totals.dead)} went dead`,
        ),
      ),
      panel(
        h(
          'div',
          { class: 'panel-head-row' },
          h('h2', null, 'Throughput, last hour'),
          h(
            'div',
            { class: 'legend' },
            h('span', { class: 'legend-item' }, h('span', { class: 'swatch swatch-completed' }), 'completed'),
            h('span', { class: 'legend-item' }, h('span', { class: 'swatch swatch-failed' }), 'failed + dead'),
            h('span', { class: 'legend-note' }, 'all queues, per minute'),
          ),
        ),
        null,
        h('div', { class: 'chart-wrap' }, throughputChart(series)),
      ),
      tablePanel({
        testid: 'overview-table',
        headers: [
          'Queue',
          ...OVERVIEW_COLUMNS.map(([, label, hint]) => h('th', { class: 'num', title: hint }, label)),
          h('th', { class: 'num', title: 'How long the oldest ready job has waited' }, 'Oldest ready'),
          h('th', { class: 'num', title: 'Attempts that failed within the failure window' }, failuresLabel),
          h('th', { class: 'spark-col' }, 'Last hour'),
        ],
        rows: overview.queues.map((queue) =>
          this.queueRow(queue, minuteSeries(throughput, CHART_MINUTES, queue.queue)),
        ),
        empty: 'No queue yet: a queue shows here once a handler, the queues option or a job names it.',
      }),
    ];
  }

  queueRow(queue, series) {
    const name = queue.queue;
    const totals = totalsOf(series);
    const countCell = ([field]) => {
      const value = queue[field] ?? 0;
      const tone =
        value === 0
          ? 'zero'
          : field === 'dead' || field === 'blockedGroups'
            ? 'bad'
            : field === 'expiredLeases'
              ? 'warn'
              : '';
      const text = formatCount(value);
      const target =
        value === 0
          ? null
          : field === 'blockedGroups'
            ? href.groups(name)
            : STATES.includes(field)
              ? href.queue(name, field)
              : null;
      return h(
        'td',
        { class: `num ${tone}`, testid: `count-${name}-${field}` },
        target ? h('a', { href: target }, text) : text,
      );
    };
    return h(
      'tr',
      { testid: `queue-row-${name}` },
      h(
        'td',
        { class: 'queue-name' },
        h('a', { href: href.queue(name) }, name),
        queue.paused ? h('span', { class: 'pill pill-paused', testid: `paused-${name}` }, 'paused') : null,
      ),
      OVERVIEW_COLUMNS.map(countCell),
      h(
        'td',
        { class: `num ${queue.oldestReadyAgeMs > 0 ? '' : 'zero'}`, testid: `count-${name}-oldestReadyAgeMs` },
        queue.oldestReadyAgeMs > 0 ? formatDuration(queue.oldestReadyAgeMs) : '—',
      ),
      h(
        'td',
        { class: `num ${queue.recentFailures > 0 ? 'warn' : 'zero'}`, testid: `count-${name}-recentFailures` },
        formatCount(queue.recentFailures),
      ),
      h(
        'td',
        {
          class: 'spark-col',
          title: `${formatCount(totals.completed)} completed, ${formatCount(totals.failed)} failed, ${formatCount(totals.dead)} dead in the last hour`,
        },
        h(
          'div',
          { class: 'spark-cell' },
          sparkline(series, name),
          h('span', { class: 'spark-total', testid: `count-${name}-completedLastHour` }, formatCount(totals.completed)),
        ),
      ),
    );
  }
}

function statCard(label, value, tone, note) {
  return h(
    'div',
    { class: `card card-${tone}` },
    h('div', { class: 'card-label' }, label),
    h('div', { class: 'card-value' }, formatCount(value)),
    note ? h('div', { class: 'card-note' }, note) : null,
  );
}

/** A queue's figures in the last overview reading, if any. */
function queueCounts(queue) {
  return lastOverview?.queues.find((q) => q.queue === queue) ?? null;
}

/** The state tabs of a queue, counts from the last overview reading. */
function queueTabs(queue, active) {
  const counts = queueCounts(queue);
  const tab = (key, label, link, count) =>
    h(
      'a',
      {
        class: `tab ${key === active ? 'tab-active' : ''}`,
        href: link,
        testid: `tab-${key}`,
        'aria-current': key === active ? 'page' : null,
      },
      label,
      count === undefined
        ? null
        : h('span', { class: `tab-count ${count > 0 && key === 'dead' ? 'bad' : ''}` }, formatCount(count)),
    );
  return h(
    'nav',
    { class: 'tabs', 'aria-label': 'Job states' },
    STATES.map((state) =>
      tab(state, state[0].toUpperCase() + state.slice(1), href.queue(queue, state), counts?.[state]),
    ),
    tab('groups', 'Blocked groups', href.groups(queue), counts?.blockedGroups),
  );
}

/** A queue page's title: its name, whether it is paused, and (unless read-only) the pause or resume button. */
function queueHead(queue, section, view) {
  const paused = queueCounts(queue)?.paused === true;
  const action = paused ? 'resume' : 'pause';
  return pageHead(
    [['Overview', href.overview()]],
    queue,
    h('span', { class: 'subtitle' }, section),
    paused ? h('span', { class: 'pill pill-paused', testid: 'queue-paused' }, 'paused') : null,
    READ_ONLY
      ? null
      : button(paused ? 'Resume queue' : 'Pause queue', {
          testid: `queue-${action}`,
          title: paused
            ? 'Let every instance claim from this queue again'
            : 'Stop every instance claiming from this queue; running jobs finish',
          onclick: (event) =>
            runAction(
              view,
              event.currentTarget,
              `${paused ? 'Resume' : 'Pause'} ${queue}`,
              () => api.queueControl(queue, action),
              () => (paused ? `Queue ${queue} resumed` : `Queue ${queue} paused: no instance claims from it`),
            ),
        }),
  );
}

/**
 * Forward paging through an index: the positions (cursor or key) each page seen so far starts
 * at, so "First page" and "Next page" need nothing more from the server.
 */
class Pages {
  constructor(onChange) {
    this.starts = [null];
    this.onChange = onChange;
  }

  get current() {
    return this.starts.at(-1);
  }

  get onFirst() {
    return this.starts.length === 1;
  }

  /** The buttons, or nothing when everything fits on the first page. */
  controls(next) {
    if (this.onFirst && !next) return null;
    const go = (starts) => {
      this.starts = starts;
      this.onChange();
    };
    return h(
      'div',
      { class: 'pager' },
      button('First page', { testid: 'first-page', disabled: this.onFirst, onclick: () => go([null]) }),
      h('span', { class: 'muted' }, `Page ${this.starts.length}`),
      button('Next page', { testid: 'next-page', disabled: !next, onclick: () => go([...this.starts, next]) }),
    );
  }
}

/** A rate limit as "50 per 1 s". */
function rateText(rate) {
  return `${formatCount(rate.max)} per ${formatDuration(rate.perMs)}`;
}

/**
 * A queue's flow limits and what they hold back (docs/flow-control.md): nothing for a queue with
 * neither limits nor keyed jobs.
 */
function flowPanel(flow) {
  if (!flow || (flow.limits === null && flow.keys.length === 0)) return null;
  const limits = flow.limits ?? {};
  const facts = [
    ['Running', limits.globalConcurrency ? `${flow.running} of ${limits.globalConcurrency}` : String(flow.running)],
    limits.concurrencyPerKey ? ['Per key', `${limits.concurrencyPerKey} at once`] : null,
    limits.concurrencyPerKey ? ['Keys at their limit', String(flow.keysAtLimit ?? 0)] : null,
    limits.rateLimit ? ['Rate', `${flow.windowStarts ?? 0} started of ${rateText(limits.rateLimit)}`] : null,
    limits.rateLimitPerKey ? ['Rate per key', rateText(limits.rateLimitPerKey)] : null,
  ].filter((fact) => fact !== null);
  return h(
    'div',
    { testid: 'flow-panel' },
    panel(
      'Flow control',
      null,
      h(
        'dl',
        { class: 'fields', testid: 'flow-facts' },
        ...facts.map(([label, value]) => h('div', { class: 'field' }, h('dt', null, label), h('dd', null, value))),
      ),
    ),
    tablePanel({
      testid: 'flow-keys',
      headers: ['Busiest keys', h('th', { class: 'num' }, 'Running'), h('th', { class: 'num' }, 'Waiting')],
      rows: flow.keys.map((key) =>
        h(
          'tr',
          { testid: `flow-key-${key.key}` },
          h('td', null, clipped(key.key, 'mono clip-key')),
          h('td', { class: 'num' }, formatCount(key.running)),
          h('td', { class: 'num' }, formatCount(key.waiting)),
        ),
      ),
      empty: 'No keyed job running or waiting.',
    }),
  );
}

class JobsView extends View {
  constructor(root, route) {
    super(root);
    this.queue = route.queue;
    this.state = route.state;
    this.page = null;
    this.selected = new Set();
    this.pages = new Pages(() => {
      this.selected.clear();
      this.reload();
    });
  }

  /** Only the first page follows the queue: a deeper page would shift under the reader. */
  live() {
    return this.pages.onFirst;
  }

  /** Done jobs are looked up among thousands of recent completions: not on every tick. */
  refreshEveryMs() {
    return this.state === 'done' ? Math.max(REFRESH_MS, DONE_REFRESH_MS) : REFRESH_MS;
  }

  async refresh() {
    const [page, , flow] = await Promise.all([
      api.jobs(this.queue, this.state, this.pages.current),
      loadOverview().catch(() => lastOverview),
      api.flow(this.queue).catch(() => null),
    ]);
    this.page = page;
    this.flow = flow;
    const shown = new Set(page.jobs.map((job) => job.id));
    for (const id of this.selected) if (!shown.has(id)) this.selected.delete(id);
    this.render({ page, counts: queueCounts(this.queue), flow }, () => this.build());
  }

  build() {
    const { page, state } = this;
    const selectable = state === 'dead' && !READ_ONLY;
    const timeLabel = { ready: 'Run at', delayed: 'Run at', leased: 'Lease until', done: 'Finished', dead: 'Died' };
    const timeOf = (job) =>
      state === 'leased' ? job.leaseUntil : FINISHED_STATES.has(state) ? job.finishedAt : job.runAt;
    this.boxes = new Map();
    this.pageBox = selectable ? this.selectAllBox() : null;
    const rows = page.jobs.map((job) =>
      h(
        'tr',
        { testid: `job-row-${job.id}` },
        selectable ? h('td', { class: 'check' }, this.selectBox(job.id)) : null,
        h('td', { class: 'id' }, h('a', { href: href.job(job.id) }, job.id)),
        h('td', null, timeCell(job.createdAt)),
        h('td', null, timeCell(timeOf(job))),
        h('td', { class: 'num' }, `${job.attempts}/${job.maxAttempts}`),
        h('td', null, clipped(job.groupKey, 'mono clip-key')),
        h('td', null, clipped(job.idempotencyKey, 'mono clip-key')),
        h('td', null, clipped(job.payloadPreview, 'mono preview')),
        h('td', null, clipped(job.lastErrorPreview, 'error-text')),
      ),
    );
    const result = [
      queueHead(this.queue, 'jobs', this),
      queueTabs(this.queue, state),
      flowPanel(this.flow),
      selectable ? this.toolbar() : null,
      state === 'done' && page.scanLimited
        ? h(
            'div',
            { class: 'callout', testid: 'scan-limited' },
            'Done jobs are looked up among the most recent completions of all queues: older done jobs of this queue are not listed.',
          )
        : null,
      // Grouped jobs are read a bounded stretch at a time: a short page may still have a next one.
      page.nextCursor && page.jobs.length < PAGE_SIZE
        ? h(
            'div',
            { class: 'callout', testid: 'page-short' },
            'This page stops where the look-up did, to keep each read short: more may follow on the next page.',
          )
        : null,
      tablePanel({
        testid: 'jobs-table',
        headers: [
          selectable ? h('th', { class: 'check' }, this.pageBox) : null,
          'Id',
          'Created',
          timeLabel[state],
          h('th', { class: 'num' }, 'Attempts'),
          'Group',
          'Key',
          'Payload',
          'Last error',
        ],
        rows,
        empty: `No ${state} job${this.pages.onFirst && !page.nextCursor ? '' : ' on this page'}.`,
      }),
      this.pages.controls(page.nextCursor),
    ];
    this.syncSelection();
    return result;
  }

  selectBox(id) {
    const box = h('input', { type: 'checkbox', testid: `select-${id}`, 'aria-label': `Select job ${id}` });
    box.checked = this.selected.has(id);
    box.addEventListener('change', () => {
      if (box.checked) this.selected.add(id);
      else this.selected.delete(id);
      this.syncSelection();
    });
    this.boxes.set(id, box);
    return box;
  }

  selectAllBox() {
    const pageBox = h('input', {
      type: 'checkbox',
      testid: 'select-page',
      'aria-label': 'Select the jobs of this page',
    });
    pageBox.addEventListener('change', () => {
      for (const [id, box] of this.boxes) {
        box.checked = pageBox.checked;
        if (box.checked) this.selected.add(id);
        else this.selected.delete(id);
      }
      this.syncSelection();
    });
    return pageBox;
  }

  toolbar() {
    this.retrySelected = button('Retry selected', {
      testid: 'retry-selected',
      onclick: () => this.act('retry', [...this.selected], this.retrySelected),
    });
    this.purgeSelected = button('Purge selected', {
      class: 'button button-danger',
      testid: 'purge-selected',
      onclick: () => this.act('purge', [...this.selected], this.purgeSelected),
    });
    const retryAll = button('Retry all', { testid: 'retry-all', onclick: () => this.act('retry', 'all', retryAll) });
    const purgeAll = button('Purge all', {
      class: 'button button-danger',
      testid: 'purge-all',
      onclick: () => this.act('purge', 'all', purgeAll),
    });
    this.selectionLabel = h('span', { class: 'muted selection-label' });
    return h(
      'div',
      { class: 'toolbar' },
      this.selectionLabel,
      h(
        'div',
        { class: 'toolbar-actions' },
        this.retrySelected,
        this.purgeSelected,
        h('span', { class: 'toolbar-sep' }),
        retryAll,
        purgeAll,
      ),
    );
  }

  syncSelection() {
    if (!this.retrySelected) return;
    const count = this.selected.size;
    this.retrySelected.disabled = count === 0;
    this.purgeSelected.disabled = count === 0;
    this.selectionLabel.textContent = count ? `${plural(count, 'job')} selected` : 'Select jobs to retry or purge them';
    if (this.pageBox) {
      const boxes = [...this.boxes.values()];
      this.pageBox.checked = boxes.length > 0 && boxes.every((box) => box.checked);
      this.pageBox.indeterminate = !this.pageBox.checked && boxes.some((box) => box.checked);
    }
  }

  async act(kind, ids, control) {
    const all = ids === 'all';
    if (!all && ids.length === 0) return;
    const target = all ? `every dead job of ${this.queue}` : plural(ids.length, 'selected job');
    if (
      (kind === 'purge' || all) &&
      !confirm(
        `${kind === 'purge' ? 'Purge' : 'Retry'} ${target}?${kind === 'purge' ? ' Purged jobs are deleted.' : ''}`,
      )
    ) {
      return;
    }
    const selection = all ? { all: true } : { ids };
    await runAction(
      this,
      control,
      kind === 'purge' ? 'Purge' : 'Retry',
      async () => {
        const result = await (kind === 'purge'
          ? api.purgeDead(this.queue, selection)
          : api.retryDead(this.queue, selection));
        this.selected.clear();
        this.invalidate();
        return result;
      },
      (result) =>
        kind === 'purge'
          ? `Purged ${plural(result.purged, 'dead job')}.`
          : `Retried ${plural(result.retried.length, 'job')}.`,
    );
  }
}

class GroupsView extends View {
  constructor(root, route) {
    super(root);
    this.queue = route.queue;
    this.pages = new Pages(() => this.reload());
  }

  live() {
    return this.pages.onFirst;
  }

  async refresh() {
    const [page] = await Promise.all([
      api.groups(this.queue, this.pages.current),
      loadOverview().catch(() => lastOverview),
    ]);
    this.render({ page, counts: queueCounts(this.queue) }, () => this.build(page));
  }

  build(page) {
    const rows = page.groups.map((group) =>
      h(
        'tr',
        { testid: `group-row-${group.groupKey}` },
        h('td', { class: 'mono' }, group.groupKey),
        h('td', { class: 'id' }, h('a', { href: href.job(group.jobId) }, group.jobId)),
        h('td', null, clipped(group.error, 'error-text')),
        h('td', null, timeCell(group.diedAt)),
      ),
    );
    return [
      queueHead(this.queue, 'blocked groups', this),
      queueTabs(this.queue, 'groups'),
      h(
        'p',
        { class: 'hint' },
        'An ordered group stops at a dead job when the queue runs with groupOnDead: "block". Retry or purge that job to release the group.',
      ),
      tablePanel({
        testid: 'groups-table',
        headers: ['Group key', 'Blocking job', 'Error', 'Died at'],
        rows,
        empty: 'No blocked group.',
      }),
      this.pages.controls(page.nextAfterKey),
    ];
  }
}

class JobView extends View {
  constructor(root, route) {
    super(root);
    this.id = route.id;
    this.detail = null;
    this.missing = false;
  }

  /** A finished job changes only through an action here, which refreshes by itself. */
  live() {
    return !this.missing && !(this.detail && FINISHED_STATES.has(this.detail.job.state));
  }

  async refresh() {
    if (!JOB_ID.test(this.id)) {
      this.missing = true;
      this.render({ invalid: this.id }, () => this.notFound(`“${this.id}” is not a job id: job ids are numbers.`));
      return;
    }
    try {
      this.detail = await api.job(this.id);
      this.missing = false;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 404) throw error;
      this.missing = true;
      this.detail = null;
      this.render({ missing: this.id }, () =>
        this.notFound(`No job ${this.id}: it was purged, or cleaned up after its retention, or never existed.`),
      );
      return;
    }
    // Keep the stacks the reader opened across re-renders.
    const open = new Set(
      [...this.root.querySelectorAll('details[open][data-attempt]')].map((d) => d.getAttribute('data-attempt')),
    );
    this.render(this.detail, () => this.build(open));
  }

  notFound(text) {
    return [
      pageHead([['Overview', href.overview()]], `Job ${this.id}`),
      h('div', { class: 'callout callout-warn', testid: 'job-missing' }, text),
    ];
  }

  build(openStacks) {
    const { job, attempts } = this.detail;
    const dead = job.state === 'dead';
    const field = (label, value, name) =>
      h('div', { class: 'field' }, h('dt', null, label), h('dd', { testid: `job-field-${name}` }, value));
    const text = (value, mono = false) =>
      value === null || value === undefined || value === ''
        ? h('span', { class: 'muted' }, '—')
        : h('span', { class: mono ? 'mono' : null }, String(value));
    const cancelable = ['ready', 'delayed', 'leased'].includes(job.state) && job.cancelRequestedAt === null;
    const actions =
      cancelable && !READ_ONLY
        ? h(
            'div',
            { class: 'page-actions' },
            button(job.state === 'leased' ? 'Cancel (running)' : 'Cancel', {
              class: 'button button-danger',
              testid: 'job-cancel',
              onclick: (event) => this.act('cancel', event.currentTarget),
            }),
          )
        : dead && !READ_ONLY
          ? h(
              'div',
              { class: 'page-actions' },
              button('Retry', {
                class: 'button button-primary',
                testid: 'job-retry',
                onclick: (event) => this.act('retry', event.currentTarget),
              }),
              button('Purge', {
                class: 'button button-danger',
                testid: 'job-purge',
                onclick: (event) => this.act('purge', event.currentTarget),
              }),
            )
          : null;
    const sorted = [...attempts].sort((a, b) => a.attempt - b.attempt);
    return [
      pageHead(
        [
          ['Overview', href.overview()],
          [job.queue, href.queue(job.queue)],
          [job.state, href.queue(job.queue, job.state)],
        ],
        `Job ${job.id}`,
        stateBadge(job.state, { testid: 'job-state' }),
        actions,
      ),
      panel(
        null,
        { class: 'panel fields-panel' },
        h(
          'dl',
          { class: 'fields' },
          field('State', job.state, 'state'),
          field('Queue', h('a', { href: href.queue(job.queue) }, job.queue), 'queue'),
          field('Priority', String(job.priority), 'priority'),
          field('Attempts', `${job.attempts} of ${job.maxAttempts}`, 'attempts'),
          field('Run at', timeCell(job.runAt), 'runAt'),
          field('Created', timeCell(job.createdAt), 'createdAt'),
          field('Claimed', timeCell(job.claimedAt), 'claimedAt'),
          job.state === 'leased' ? field('Lease until', timeCell(job.leaseUntil), 'leaseUntil') : null,
          field('Finished', timeCell(job.finishedAt), 'finishedAt'),
          field('Worker', text(job.workerId, true), 'workerId'),
          field('Group', text(job.groupKey, true), 'groupKey'),
          job.concurrencyKey ? field('Concurrency key', text(job.concurrencyKey, true), 'concurrencyKey') : null,
          field('Idempotency key', text(job.idempotencyKey, true), 'idempotencyKey'),
          job.progress === null || job.progress === undefined
            ? null
            : field(
                'Progress',
                typeof job.progress === 'number' ? `${job.progress}%` : text(JSON.stringify(job.progress), true),
                'progress',
              ),
          job.cancelRequestedAt
            ? field(
                'Cancel asked',
                h('span', null, timeCell(job.cancelRequestedAt), ' ', text(job.cancelReason)),
                'cancel',
              )
            : null,
        ),
      ),
      h(
        'div',
        { class: job.lastError ? 'job-grid' : 'job-grid job-grid-single' },
        panel(
          'Payload',
          { class: 'panel payload-panel' },
          h('pre', { class: 'code', testid: 'job-payload' }, prettyJson(job.payload)),
        ),
        job.result === null || job.result === undefined
          ? null
          : panel(
              'Result',
              { class: 'panel payload-panel' },
              h('pre', { class: 'code', testid: 'job-result' }, prettyJson(job.result)),
            ),
        job.lastError
          ? panel(
              'Last error',
              { class: 'panel error-panel' },
              h('pre', { class: 'code code-error', testid: 'job-last-error' }, job.lastError),
            )
          : null,
      ),
      tablePanel({
        title: `Attempts (${attempts.length})`,
        testid: 'attempts-table',
        className: 'table attempts',
        headers: [
          h('th', { class: 'num' }, '#'),
          'Outcome',
          'Error',
          'Worker',
          'Started',
          'Finished',
          h('th', { class: 'num' }, 'Duration'),
        ],
        rows: sorted.map((attempt) => this.attemptRow(attempt, openStacks)),
        empty: 'No attempt finished yet.',
      }),
    ];
  }

  attemptRow(attempt, openStacks) {
    const key = String(attempt.attempt);
    const stack = attempt.stack
      ? h(
          'details',
          { class: 'stack', 'data-attempt': key, open: openStacks.has(key) },
          h('summary', null, 'Stack'),
          h('pre', { class: 'code', testid: `attempt-stack-${key}` }, attempt.stack),
        )
      : null;
    return h(
      'tr',
      { testid: `attempt-row-${key}` },
      h('td', { class: 'num' }, key),
      h('td', null, h('span', { class: `pill pill-${attempt.outcome}` }, attempt.outcome)),
      h(
        'td',
        { class: 'attempt-error' },
        attempt.error
          ? h('div', { class: 'error-text', testid: `attempt-error-${key}` }, attempt.error)
          : h('span', { class: 'muted' }, '—'),
        stack,
      ),
      h('td', { class: 'mono' }, attempt.workerId ?? h('span', { class: 'muted' }, '—')),
      h('td', null, timeCell(attempt.startedAt)),
      h('td', null, timeCell(attempt.finishedAt)),
      h('td', { class: 'num' }, formatDuration(durationBetween(attempt.startedAt, attempt.finishedAt))),
    );
  }

  async act(kind, control) {
    const queue = this.detail.job.queue;
    if (kind === 'cancel') {
      if (!confirm(`Cancel job ${this.id}? It will not run (a running one is aborted by its worker).`)) return;
      await runAction(
        this,
        control,
        'Cancel',
        () => api.cancelJob(this.id),
        (result) =>
          result.outcome === 'canceled'
            ? `Job ${this.id} canceled: it will not run.`
            : result.outcome === 'canceling'
              ? `Job ${this.id} is running: its worker is told to stop it.`
              : `Job ${this.id} had already finished: nothing changed.`,
      );
      return;
    }
    if (kind === 'purge' && !confirm(`Purge job ${this.id}? It is deleted with its attempts.`)) return;
    await runAction(
      this,
      control,
      kind === 'purge' ? 'Purge' : 'Retry',
      () => (kind === 'purge' ? api.purgeDead(queue, { ids: [this.id] }) : api.retryDead(queue, { ids: [this.id] })),
      (result) =>
        kind === 'purge'
          ? result.purged > 0
            ? `Purged job ${this.id}.`
            : `Job ${this.id} was not dead any more: nothing purged.`
          : result.retried.length > 0
            ? `Job ${this.id} is ready to run again.`
            : `Job ${this.id} was not dead any more: nothing retried.`,
    );
  }
}

class SchedulesView extends View {
  async refresh() {
    const { schedules } = await api.schedules();
    this.render(schedules, () => this.build(schedules));
  }

  build(schedules) {
    const rows = schedules.map((schedule) => {
      const id = schedule.id;
      const actions = READ_ONLY
        ? null
        : h(
            'td',
            { class: 'row-actions' },
            schedule.paused
              ? button('Resume', {
                  testid: `schedule-resume-${id}`,
                  onclick: (event) => this.act(id, 'resume', event.currentTarget),
                })
              : button('Pause', {
                  testid: `schedule-pause-${id}`,
                  onclick: (event) => this.act(id, 'pause', event.currentTarget),
                }),
            button('Trigger', {
              testid: `schedule-trigger-${id}`,
              onclick: (event) => this.act(id, 'trigger', event.currentTarget),
            }),
          );
      const payload = prettyJson(schedule.payload);
      return h(
        'tr',
        { testid: `schedule-row-${id}` },
        h('td', { class: 'mono' }, id),
        h('td', null, h('a', { href: href.queue(schedule.queue) }, schedule.queue)),
        h('td', null, h('code', null, schedule.cron)),
        h('td', null, schedule.timezone),
        h('td', null, schedule.paused ? h('span', { class: 'muted' }, 'paused') : timeCell(schedule.nextRunAt)),
        h('td', null, timeCell(schedule.lastRunAt)),
        h(
          'td',
          null,
          schedule.paused
            ? h('span', { class: 'pill pill-paused' }, 'paused')
            : h('span', { class: 'pill pill-active' }, 'active'),
        ),
        h('td', null, schedule.source),
        h('td', null, clipped(payload, 'mono preview')),
        actions,
      );
    });
    return [
      pageHead(
        [['Overview', href.overview()]],
        'Schedules',
        h('span', { class: 'subtitle' }, plural(schedules.length, 'schedule')),
      ),
      tablePanel({
        testid: 'schedules-table',
        headers: [
          ...['Id', 'Queue', 'Cron', 'Time zone', 'Next run', 'Last run', 'Status', 'Source', 'Payload'],
          READ_ONLY ? null : '',
        ],
        rows,
        empty: 'No recurring schedule.',
      }),
    ];
  }

  async act(id, action, control) {
    await runAction(
      this,
      control,
      `${action[0].toUpperCase()}${action.slice(1)} ${id}`,
      async () => {
        const result = await api.schedule(id, action);
        this.invalidate();
        return result;
      },
      (result) =>
        action === 'trigger'
          ? `Schedule ${id} enqueued job ${result.jobId}${result.created ? '' : ' (already enqueued for this tick)'}.`
          : `Schedule ${id} ${action === 'pause' ? 'paused' : 'resumed'}.`,
    );
  }
}

class NotFoundView extends View {
  live() {
    return false;
  }

  async refresh() {
    this.render('not-found', () => [
      pageHead([['Overview', href.overview()]], 'Not found'),
      h('div', { class: 'callout' }, 'No dashboard page at this address.'),
    ]);
  }
}

function createView(route, root) {
  switch (route.view) {
    case 'overview':
      return new OverviewView(root);
    case 'jobs':
      return new JobsView(root, route);
    case 'groups':
      return new GroupsView(root, route);
    case 'job':
      return new JobView(root, route);
    case 'schedules':
      return new SchedulesView(root);
    default:
      return new NotFoundView(root);
  }
}

// ---- Refresh loop ---------------------------------------------------------------------------

let current = null;
let timer = null;

/**
 * Refreshes `view`, one refresh at a time: asked during one (after an action, say), it runs
 * again once that one ends, since the running one may have read the data before the change.
 * Errors of a view left meanwhile are dropped.
 */
async function refreshNow(view) {
  if (view.busy) {
    view.again = true;
    return;
  }
  view.busy = true;
  try {
    do {
      view.again = false;
      try {
        await view.refresh();
        if (view === current) {
          markUpdated();
          if (chrome.errorBanner.dataset.kind === 'refresh') clearError();
        }
      } catch (error) {
        if (view === current) showError(error);
      }
    } while (view.again && view === current);
  } finally {
    view.busy = false;
  }
}

/** Every REFRESH_MS while the tab is visible: a hidden tab costs the database nothing. */
function schedule(view) {
  clearTimeout(timer);
  timer = setTimeout(async () => {
    if (view !== current) return;
    if (document.visibilityState === 'visible' && view.live()) await refreshNow(view);
    schedule(view);
  }, view.refreshEveryMs());
}

function navigate() {
  const route = parseRoute(location.hash);
  highlightNav(route);
  clearError();
  chrome.notice.hidden = true;
  const view = createView(route, chrome.app);
  current = view;
  chrome.app.replaceChildren(h('div', { class: 'loading' }, 'Loading…'));
  window.scrollTo(0, 0);
  void refreshNow(view);
  schedule(view);
}

function start() {
  // <base href> ends with '/': served at '/queues', the hash links would leave the page for
  // '/queues/#/…'. Show the base path instead, so they stay in-page.
  const base = new URL(document.baseURI);
  if (location.pathname !== base.pathname) {
    history.replaceState(null, '', `${base.pathname}${location.search}${location.hash}`);
  }
  chrome.readOnlyBadge.hidden = !READ_ONLY;
  chrome.openJob.addEventListener('submit', (event) => {
    event.preventDefault();
    const input = chrome.openJob.elements.namedItem('id');
    const id = input.value.trim();
    if (!JOB_ID.test(id)) {
      showActionError('Open job', new Error(`“${id}” is not a job id: job ids are numbers`));
      return;
    }
    input.value = '';
    location.hash = href.job(id);
  });
  window.addEventListener('hashchange', navigate);
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible' && current) {
      void refreshNow(current);
      schedule(current);
    }
  });
  navigate();
}

start();
