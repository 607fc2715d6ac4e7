// Drives Debian's chromium (playwright-core, no downloaded browser) against talboot's
// dashboard while `talboot demo --stay` runs; tests/dashboard.rs starts the demo and runs
// this with: node dashboard.mjs <dashboard URL> <screenshot.png> <timeline node> <rebuild node>
// [<power node> <wol port file>]. Exits non-zero, naming the check, when one fails.
import { check, launchChromium } from "./common.mjs";

const [url, shot, timelineNode, rebuildNode, powerNode] = process.argv.slice(2);
const origin = new URL(url).origin;
const LONG = 120_000;

const browser = await launchChromium();
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  // Eight helpers' builds share two cores: no step is timed, only bounded.
  page.setDefaultTimeout(LONG);
  const foreign = [];
  const posts = [];
  const problems = [];
  page.on("request", (r) => {
    if (new URL(r.url()).origin !== origin) foreign.push(r.url());
    if (r.method() === "POST") posts.push(new URL(r.url()).pathname);
  });
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));

  await page.goto(url);
  await page.evaluate(() => (window.__sameDocument = true));
  await page.waitForSelector("#live.on", { timeout: LONG });
  check(true, "the event stream (/api/events) is open");

  // The demo runs to hand-off while the page watches.
  await page.waitForSelector('#steps li[data-step="handed-off"].done', { timeout: LONG });
  const steps = await page.$$eval("#steps li", (ls) => ls.map((l) => [l.dataset.step, l.className]));
  check(
    JSON.stringify(steps) ===
      JSON.stringify([
        ["bootstrapped", "done"],
        ["api-ready", "done"],
        ["cni-installed", "done"],
        ["nodes-ready", "done"],
        ["argocd-installed", "done"],
        ["handed-off", "done"],
      ]),
    `every cluster step is shown done, in order: ${JSON.stringify(steps)}`,
  );
  const roles = await page.$$eval(".role", (rs) =>
    rs.map((r) => [r.dataset.role, r.querySelectorAll(".node").length]),
  );
  check(
    JSON.stringify(roles) ===
      JSON.stringify([
        ["controlplane", 3],
        ["worker", 4],
        ["storage", 3],
        ["monitoring", 3],
      ]),
    `the rack is drawn by role: ${JSON.stringify(roles)}`,
  );
  // Every node Ready and joined: all eight milestones reached.
  await page.waitForFunction(
    () =>
      [...document.querySelectorAll(".node")].every(
        (n) => n.dataset.phase === "ready" && n.querySelectorAll(".progress span.reached").length === 8,
      ),
    null,
    { timeout: LONG },
  );
  const milestones = await page.$$eval(`#node-${timelineNode} .progress span`, (s) =>
    s.map((x) => x.dataset.milestone),
  );
  check(
    milestones.join(",") === "DHCP,iPXE,kernel,maintenance,config applied,installing,ready,joined",
    `each node shows how far it got: ${milestones.join(", ")}`,
  );

  // A node's timeline, with timestamps.
  await page.click(`#node-${timelineNode} .name`);
  await page.waitForSelector("#detail:not([hidden])");
  const rows = await page.$$eval("#timeline tr", (trs) =>
    trs.map((tr) => [...tr.children].map((td) => td.textContent)),
  );
  check(rows.length > 5, `the timeline of ${timelineNode} has ${rows.length} rows`);
  check(
    rows.every(([t]) => /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$/.test(t)),
    "every timeline row has a timestamp",
  );
  const kinds = rows.map((r) => r[1]);
  for (const k of ["dhcp.ack", "tftp.file", "http.script", "http.kernel", "config.released", "node.phase"]) {
    check(kinds.includes(k), `the timeline shows ${k}`);
  }
  await page.screenshot({ path: shot, fullPage: true });
  check(true, `screenshot written to ${shot}`);

  // An action asks first; cancelling sends nothing.
  const card = `#node-${rebuildNode}`;
  await page.click(`${card} button[data-action="rebuild"]`);
  await page.waitForSelector("#confirm[open]");
  const question = await page.textContent("#confirm-text");
  check(question.includes(`Rebuild ${rebuildNode}?`), `the rebuild asks first: "${question}"`);
  await page.click("#confirm-cancel");
  await page.waitForSelector("#confirm[open]", { state: "detached" });
  check(posts.length === 0, "cancelling sends no request");
  check((await page.getAttribute(card, "data-phase")) === "ready", "the node is untouched");

  // Confirming rebuilds it; what follows arrives over the event stream, without a reload.
  const eventsBefore = Number((await page.getAttribute("body", "data-events")) || 0);
  await page.click(`${card} .name`);
  await page.click(`${card} button[data-action="rebuild"]`);
  await page.waitForSelector("#confirm[open]");
  await page.click("#confirm-ok");
  await page.waitForFunction(() => /marked for rebuild/.test(document.getElementById("notice").textContent), null, {
    timeout: LONG,
  });
  check(
    posts.length === 1 && posts[0] === `/api/nodes/${rebuildNode}/rebuild`,
    `confirming posts the rebuild: ${JSON.stringify(posts)}`,
  );
  // The node leaves `rebuilding` (an event published after the POST was answered) and comes
  // back Ready, and the page shows it as it happens.
  await page.waitForFunction(
    () => [...document.querySelectorAll("#timeline tr td:nth-child(3)")].some((td) => /^rebuilding -> /.test(td.textContent)),
    null,
    { timeout: LONG },
  );
  check(true, `the timeline of ${rebuildNode} shows it leave rebuilding`);
  await page.waitForFunction(
    (sel) => {
      const n = document.querySelector(sel);
      return n && n.dataset.phase === "ready" && n.querySelectorAll(".progress span.reached").length === 8;
    },
    card,
    { timeout: LONG },
  );
  const eventsAfter = Number(await page.getAttribute("body", "data-events"));
  check(eventsAfter > eventsBefore, `events arrived live (${eventsAfter - eventsBefore} during the rebuild)`);
  check(await page.evaluate(() => window.__sameDocument === true), "the page was never reloaded");

  if (powerNode) {
    const pcard = `#node-${powerNode}`;
    await page.click(`${pcard} button[data-action="on"]`);
    await page.waitForSelector("#confirm[open]");
    check((await page.textContent("#confirm-text")).includes(`Power on ${powerNode}?`), "power asks first");
    await page.click("#confirm-ok");
    await page.waitForFunction(() => document.getElementById("notice").textContent.length > 0 && !/marked for rebuild/.test(document.getElementById("notice").textContent), null, {
      timeout: LONG,
    });
    console.log(`power notice: ${await page.textContent("#notice")}`);
    check(posts.includes(`/api/nodes/${powerNode}/power/on`), "confirming posts the power request");
  }

  check(foreign.length === 0, `nothing is fetched from another origin: ${JSON.stringify(foreign)}`);
  check(problems.length === 0, `no script or policy errors: ${JSON.stringify(problems)}`);
} catch (e) {
  failed = true;
  console.error(e.stack || String(e));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
