// Drives Debian's chromium against the dashboard of an appliance serving on etcd
// (tests/ha_status.rs starts it): node ha.mjs <dashboard URL> <leader name> <endpoints>.
// The Appliances section, drawn from /api/ha, must show the leader and etcd healthy with one
// row per endpoint. Exits non-zero, naming the check, when one fails.
import { check, launchChromium } from "./common.mjs";

const [url, leader, endpoints] = process.argv.slice(2);
const origin = new URL(url).origin;
const LONG = 120_000;

const browser = await launchChromium();
let failed = false;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(LONG);
  const foreign = [];
  const problems = [];
  page.on("request", (r) => {
    if (new URL(r.url()).origin !== origin) foreign.push(r.url());
  });
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));

  await page.goto(url);
  await page.waitForSelector("#ha-section:not([hidden])", { timeout: LONG });
  check(true, "the Appliances section is shown on etcd");
  // The first probe and the election may land after the first read: it is re-read every 5 s.
  await page.waitForFunction(
    (name) => document.getElementById("ha-leader").textContent.startsWith(`leader: ${name} `),
    leader,
    { timeout: LONG },
  );
  check(true, `the leader (${leader}) is named`);
  await page.waitForFunction(
    () => document.getElementById("ha-etcd").textContent.startsWith("etcd healthy"),
    null,
    { timeout: LONG },
  );
  const rows = await page.$$eval("#ha-endpoints tr", (rs) => rs.map((r) => r.cells[0].textContent));
  check(JSON.stringify(rows) === JSON.stringify(endpoints.split(",")), `one row per endpoint: ${rows}`);
  check(foreign.length === 0, `nothing fetched from elsewhere: ${foreign}`);
  check(problems.length === 0, `no script errors: ${problems}`);
} catch (e) {
  console.error(e.message);
  failed = true;
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
