// Drives pyfleet's fleet page in Debian's Chromium through the DevTools protocol
// (puppeteer-core, from npm; scripts/setup-format-tools.sh installs it), for
// tests/it/fleet_page.rs. Prints one JSON object with what it saw; screenshots go to OUT_DIR.
//
//   node fleet_page.cjs CHROMIUM URL OUT_DIR PIDS FUNCTION HOSTILE_PID HOSTILE_TEXT BASE NEW NEW_FN
//     PIDS: comma-separated pids the table must list (the first is clicked);
//     FUNCTION: a function the clicked process's flamegraph must show;
//     HOSTILE_PID: a process whose flamegraph must show HOSTILE_TEXT (markup) as text;
//     BASE, NEW: two snapshots to compare on the page, for the first pid's service (their
//     frames' titles are returned); NEW_FN: a function the service's NEW window holds;
//     TOKEN: the daemon's token, given at its login form (after a wrong one).
"use strict";
const puppeteer = require("puppeteer-core");

// Waits until the flamegraph pane holds the flamegraph titled `title` (its start) and it shows
// `text`; a window (5 s) that happens not to hold it is taken again ("take again"), up to
// four windows. Returns the pane's frame.
async function shows(page, title, text) {
  for (let attempt = 0; ; attempt++) {
    const frame = await (await page.waitForSelector("#flamegraph")).contentFrame();
    try {
      await frame.waitForFunction(
        (head, t) => {
          const h = document.getElementById("title");
          return h !== null && h.textContent.startsWith(head)
            && document.documentElement.textContent.includes(t);
        },
        { timeout: 12000 },
        title,
        text
      );
      return frame;
    } catch (e) {
      if (attempt >= 3) throw e;
      await page.click("#refresh");
    }
  }
}

// Clicks the element `selector` finds, in the page in one task: the table is built again at
// every poll, and a click driven from here (find, scroll, then the mouse) can meet a row the
// poll has just replaced ("Node is detached from document").
async function clickNow(page, selector) {
  await page.$eval(selector, (el) => el.click());
}

// Every download the page offers for what it shows, fetched as the browser would: for each
// format, the answer's status and size, and whether it is what the format is (the folded text
// and the SVG holding `fn`, speedscope's schema, pprof's gzip).
async function downloads(page, fn) {
  return page.evaluate(async (fn) => {
    const out = {};
    for (const a of document.querySelectorAll("#downloads a")) {
      const r = await fetch(a.href, { cache: "no-store" });
      const bytes = new Uint8Array(await r.arrayBuffer());
      const text = new TextDecoder().decode(bytes);
      let schema = "";
      try { schema = JSON.parse(text).$schema || ""; } catch (e) { /* not JSON */ }
      out[a.textContent] = {
        status: r.status, size: bytes.length, file: a.download,
        gzip: bytes[0] === 0x1f && bytes[1] === 0x8b,
        has_function: text.includes(fn), svg: text.includes("<svg"), schema,
      };
    }
    return out;
  }, fn);
}

async function main() {
  const [chromium, url, outDir, pidList, fn, hostilePid, hostileText, base, next, newFn, token] =
    process.argv.slice(2);
  const pids = pidList.split(",");
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const seen = {
    rows: [], injected: -1, flamegraph_has_function: false, process_row_visible: false, title: "",
    hostile_shown_as_text: false, hostile_elements: -1, page_title: "", diff_titles: [],
    service_view: "", live_downloads: {}, past_downloads: {}, past_title: "",
    wrong_token_refused: false, cookie_hidden: false, views: {},
  };
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1300, height: 900 });
    await page.goto(url, { waitUntil: "domcontentloaded" });
    // The daemon wants its token: the page is the form that takes it. A wrong one first.
    await page.waitForSelector("#token", { timeout: 10000 });
    await page.type("#token", "not-the-token-0123456789");
    await Promise.all([page.waitForNavigation(), page.click("#sign-in")]);
    seen.wrong_token_refused = (await page.$("#token")) !== null
      && (await page.$eval("#why", (e) => e.textContent)).includes("not this daemon's token");
    await page.type("#token", token);
    await Promise.all([page.waitForNavigation(), page.click("#sign-in")]);
    seen.cookie_hidden = !(await page.evaluate(() => document.cookie)).includes("pyfleet_session");
    // Every pid listed, with a rate (the second poll).
    await page.waitForFunction(
      (want) => {
        const rows = [...document.querySelectorAll("#processes tr")];
        const have = rows.map((r) => r.dataset.pid);
        return want.every((p) => have.includes(p)) && rows.some((r) => r.children[6].textContent !== "0.0");
      },
      { timeout: 30000 },
      pids
    );
    await page.screenshot({ path: `${outDir}/table.png` });
    seen.rows = await page.$$eval("#processes tr", (rows) =>
      rows.map((r) => [...r.children].map((c) => c.textContent))
    );
    // Nothing but text in the table: a name that is markup stays text.
    seen.injected = await page.$$eval(
      "#processes *",
      (els) => els.filter((e) => !["TR", "TD"].includes(e.tagName)).length
    );
    await clickNow(page, `#processes tr[data-pid="${pids[0]}"]`);
    seen.title = await page.$eval("#pane-title", (e) => e.textContent);
    // The flamegraph of the clicked process, once its window is sampled, and that window in
    // every format.
    const pane = await shows(page, `gunicorn (pid ${pids[0]})`, fn);
    seen.flamegraph_has_function = true;
    // The process's row (its root frame, `NAME-PID`) shows in the pane without scrolling.
    seen.process_row_visible = await pane.evaluate((pid) => {
      const row = [...document.querySelectorAll("text")]
        .find((t) => t.textContent.trim().endsWith(`-${pid}`));
      if (!row) return false;
      const box = row.getBoundingClientRect();
      return box.top >= 0 && box.bottom <= window.innerHeight;
    }, pids[0]);
    seen.live_downloads = await downloads(page, fn);
    await page.screenshot({ path: `${outDir}/flamegraph.png` });
    // The same process in each view of the daemon's samples: its title says which; by entry,
    // the requests' stacks start at the app's handler (checked in the folded download).
    const described = { cpu: "on a CPU", gil: "holding the GIL", entry: "by entry into the program's code" };
    for (const view of ["cpu", "gil", "entry"]) {
      await page.select("#view", view);
      const f = await shows(page, `gunicorn (pid ${pids[0]}), ${described[view]}`, fn);
      const folded = await page.evaluate(async () => {
        const a = [...document.querySelectorAll("#downloads a")].find((x) => x.textContent === "folded");
        return a ? (await fetch(a.href, { cache: "no-store" })).text() : "";
      });
      // The app's handler (gunicorn's own is `SyncWorker.handle_request`).
      const lines = folded.split("\n").filter((l) => l.includes(";handle_request ("));
      seen.views[view] = {
        title: await f.$eval("#title", (t) => t.textContent).catch(() => ""),
        note: await page.$eval("#view-note", (e) => e.textContent),
        handler_lines: lines.length,
        rooted_at_handler: lines.filter((l) => (l.split(";")[1] || "").startsWith("handle_request (")).length,
        // The first frames of a few that are not, to say why.
        others: lines.filter((l) => !(l.split(";")[1] || "").startsWith("handle_request ("))
          .slice(0, 2),
      };
      await page.screenshot({ path: `${outDir}/view-${view}.png` });
    }
    await page.select("#view", "all");
    // The clicked process's service: every process of it together.
    await clickNow(page, `#processes tr[data-pid="${pids[0]}"] td.service`);
    const byService = await shows(page, "service ", fn);
    seen.service_view = await byService.$eval("#title", (t) => t.textContent).catch(() => "");
    await page.screenshot({ path: `${outDir}/service.png` });
    // A process whose function is named with markup: its flamegraph shows the text, and no
    // element the markup would make exists, nor did its script run.
    await clickNow(page, `#processes tr[data-pid="${hostilePid}"]`);
    const hostile = await shows(page, `hostile_names (pid ${hostilePid})`, hostileText);
    seen.hostile_shown_as_text = true;
    seen.hostile_elements = await hostile.$$eval("img", (els) => els.length);
    seen.page_title = await page.title();
    await page.screenshot({ path: `${outDir}/hostile.png` });
    // The service again, for its past windows: the newer one shown and downloaded, then the
    // two compared (every frame's title says how it changed).
    await clickNow(page, `#processes tr[data-pid="${pids[0]}"] td.service`);
    await page.waitForFunction(
      (b, n) => {
        const names = [...document.querySelectorAll("#base option")].map((o) => o.value);
        return names.includes(b) && names.includes(n);
      },
      { timeout: 30000 },
      base,
      next
    );
    await page.select("#base", base);
    await page.select("#new", next);
    await page.click("#show");
    const shown = await (await page.waitForSelector("#flamegraph")).contentFrame();
    await shown.waitForFunction(
      (name) => location.pathname === `/snapshots/${name}/window.svg`
        && document.documentElement.textContent.length > 0,
      { timeout: 30000 },
      next
    );
    seen.past_title = await shown.$eval("#title", (t) => t.textContent).catch(() => "");
    seen.past_downloads = await downloads(page, newFn);
    await page.screenshot({ path: `${outDir}/past.png` });
    await page.click("#compare");
    await page.waitForFunction(
      () => document.getElementById("flamegraph").src.includes("/diff.svg"),
      { timeout: 5000 }
    );
    // The pane still holds the hostile process's flamegraph until the comparison arrives:
    // wait for the comparison's own document, not for any flamegraph's titles.
    const diff = await (await page.waitForSelector("#flamegraph")).contentFrame();
    await diff.waitForFunction(
      () => location.pathname === "/diff.svg" && document.querySelectorAll("title").length > 2,
      { timeout: 30000 }
    );
    seen.diff_titles = await diff.$$eval("title", (ts) => ts.map((t) => t.textContent));
    await page.screenshot({ path: `${outDir}/diff.png` });
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(seen) + "\n");
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
