// Drives the approval inbox in headless Chromium: submits a refund through the JSON API, signs in
// with the demo approver key, sees the pending refund in the inbox, approves it with a reason, and
// watches the automation complete on its page. Screenshots go to $BROWSER_ARTIFACTS (default
// target/browser-artifacts): inbox-pending.png, inbox-approved.png, and inbox-failure.png when a
// step fails.
//
// Usage: node tests/browser/inbox.mjs http://127.0.0.1:PORT   (a `resumable serve --demo` server)
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const base = process.argv[2];
if (!base) {
  console.error('usage: node tests/browser/inbox.mjs BASE_URL');
  process.exit(2);
}
const artifacts = resolve(process.env.BROWSER_ARTIFACTS || 'target/browser-artifacts');
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const KEY = 'demo-acme';
const SCRIPT = 'const o = await orders.get("A-1002"); return await orders.refund(o.id, 1500)';
const TIMEOUT_MS = 60_000;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function api(path, body) {
  const response = await fetch(base + path, {
    method: body ? 'POST' : 'GET',
    headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = await response.json();
  check(response.ok, `${path}: HTTP ${response.status} ${JSON.stringify(json)}`);
  return json;
}

async function waitFor(what, probe) {
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    const value = await probe();
    if (value) return value;
    check(Date.now() < deadline, `timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

mkdirSync(artifacts, { recursive: true });
const { id } = await api('/v1/automations', { source: SCRIPT });
await waitFor('the refund waits for approval', async () => {
  const view = await api('/v1/automations/' + id);
  return view.status === 'waiting' && view.pendingApproval;
});

const userDataDir = mkdtempSync(join(tmpdir(), 'resumable-chromium-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
  viewport: { width: 412, height: 915 },
  timeout: TIMEOUT_MS,
});
const page = context.pages()[0] || (await context.newPage());
page.setDefaultTimeout(TIMEOUT_MS);
const problems = [];
page.on('pageerror', (e) => problems.push('page error: ' + e.message));
page.on('console', (m) => m.type() === 'error' && problems.push('console error: ' + m.text()));
page.on('response', (r) => r.status() >= 400 && problems.push(`HTTP ${r.status()} for ${r.url()}`));
page.on('dialog', (d) => {
  problems.push('unexpected dialog: ' + d.message());
  d.dismiss();
});

let failed = false;
try {
  await page.goto(base + '/');
  await page.fill('#key', KEY);
  await Promise.all([page.waitForURL(base + '/'), page.click('form[action="/login"] button[type=submit]')]);
  const cookies = await context.cookies(base);
  const session = cookies.find((c) => c.name === 'resumable_inbox');
  check(session && session.httpOnly && session.sameSite === 'Strict', 'an HttpOnly, SameSite=Strict session cookie');
  check((await page.evaluate(() => document.cookie)) === '', 'page scripts cannot read the cookie');

  const card = page.locator(`#approval-${id}`);
  await card.waitFor();
  const text = await card.innerText();
  for (const expected of ['orders.refund', 'A-1002', '15.00', 'Round 1']) {
    check(text.includes(expected), `the inbox shows ${expected}: ${text}`);
  }
  await page.screenshot({ path: join(artifacts, 'inbox-pending.png'), fullPage: true });

  await card.locator('textarea[name=reason]').fill('customer called');
  await Promise.all([
    page.waitForURL(`${base}/automations/${id}`),
    card.locator('button[value=approve]').click(),
  ]);
  await page.locator('#status[data-status=completed]').waitFor();
  const result = await page.locator('#result').innerText();
  check(result.includes('"refunded": 1500') && result.includes('"approved": true'), 'the result shows the refund: ' + result);
  await page.locator('#events li[data-type=completed]').waitFor();
  await page.locator('#live', { hasText: 'The automation has ended.' }).waitFor();
  const live = await page.locator('#events li[data-type=decided]').innerText();
  check(live.includes('approved') && live.includes('customer called'), 'the decision is listed live: ' + live);
  await page.screenshot({ path: join(artifacts, 'inbox-approved.png'), fullPage: true });
  // Loaded again, the page shows the decision server-side.
  await page.reload();
  const decided = await page.locator('.decisions').innerText();
  check(decided.includes('approved') && decided.includes('customer called'), 'the decision is shown: ' + decided);
  check((await page.locator('#status').innerText()) === 'completed', 'the reloaded page says completed');

  const view = await api('/v1/automations/' + id);
  check(view.status === 'completed' && view.result.refunded === 1500, 'the API agrees: ' + JSON.stringify(view));
  check(problems.length === 0, 'no page problems: ' + problems.join('; '));
  console.log(JSON.stringify({ ok: true, automation: id, artifacts }));
} catch (e) {
  failed = true;
  console.error('browser test failed:', e && e.stack ? e.stack : e);
  if (problems.length) console.error('page problems:', problems.join('; '));
  await page.screenshot({ path: join(artifacts, 'inbox-failure.png'), fullPage: true }).catch(() => {});
} finally {
  await context.close().catch(() => {});
  rmSync(userDataDir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
