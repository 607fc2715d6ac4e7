// Drives Debian's chromium (playwright-core) against talboot's dashboard on an admin listener
// off loopback (tests/admin_token.rs runs it in the client network namespace):
// node admin_token.mjs <admin base URL> <token> <rebuild node>. Without the token the page is
// refused; `/?token=` once gives the page, without the token left in the address bar or
// visible to scripts, its live stream and a confirmed action. Exits non-zero naming the check.
import { check, launchChromium } from "./common.mjs";

const [base, token, rebuildNode] = process.argv.slice(2);
const LONG = 120_000;

const browser = await launchChromium();
let failed = false;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(LONG);
  const problems = [];
  const posts = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("response", (r) => {
    if (r.request().method() === "POST") posts.push([new URL(r.url()).pathname, r.status()]);
  });

  const refused = await page.goto(`${base}/`);
  check(refused.status() === 401, `the page without the token is refused (${refused.status()})`);

  await page.goto(`${base}/?token=${token}`);
  check(page.url() === `${base}/`, `the token left the address bar: ${page.url()}`);
  const cookies = await page.context().cookies();
  const c = cookies.find((x) => x.name === "talboot_admin");
  check(c && c.httpOnly && c.sameSite === "Strict", `the cookie is HttpOnly, SameSite=Strict: ${JSON.stringify(c && { httpOnly: c.httpOnly, sameSite: c.sameSite })}`);
  check(!(await page.evaluate(() => document.cookie)).includes(token), "page scripts cannot read the token");
  await page.waitForSelector("#live.on", { timeout: LONG });
  check(true, "the event stream (/api/events) is open");
  const nodes = await page.$$eval(".node", (ns) => ns.length);
  check(nodes === 3, `the rack shows the inventory's nodes (${nodes})`);

  const card = `#node-${rebuildNode}`;
  await page.click(`${card} button[data-action="rebuild"]`);
  await page.waitForSelector("#confirm[open]");
  await page.click("#confirm-ok");
  await page.waitForFunction(() => document.getElementById("notice").textContent.length > 0, null, { timeout: LONG });
  check(
    posts.length === 1 && posts[0][0] === `/api/nodes/${rebuildNode}/rebuild` && posts[0][1] >= 200 && posts[0][1] < 300,
    `the confirmed rebuild went through with the cookie: ${JSON.stringify(posts)}`,
  );
  check(problems.length === 0, `no script errors: ${JSON.stringify(problems)}`);
} catch (e) {
  failed = true;
  console.error(e.stack || String(e));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
