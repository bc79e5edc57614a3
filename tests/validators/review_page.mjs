// Open the reviewer's page (`fleet-retire policy report`) from disk in
// Debian's Chromium, headless, and report what the rendered DOM shows, as
// JSON on stdout: each policy's marks, the lines marked as a survivor or a
// failing proof, the grants matrix, every request that was not for the page
// itself, and elements a policy's text must not have made. Keeps a
// screenshot of the first screen.
//
//   node review_page.mjs PAGE.html SCREENSHOT.png
import puppeteer from 'puppeteer-core';
import { pathToFileURL } from 'node:url';

const [page_path, screenshot] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const url = pathToFileURL(page_path).href;
  const elsewhere = [];
  page.on('request', (r) => { if (r.url() !== url) elsewhere.push(r.url()); });
  await page.goto(url, { waitUntil: 'load' });
  const seen = await page.evaluate(() => {
    const data = (e, k) => e.getAttribute('data-' + k);
    const number = (e, k) => (data(e, k) === null ? null : Number(data(e, k)));
    const policies = [...document.querySelectorAll('#policies tr[data-policy]')].map((tr) => ({
      id: data(tr, 'policy'),
      proved: number(tr, 'proved'),
      failed: number(tr, 'failed'),
      fired: number(tr, 'fired'),
      decided: number(tr, 'decided'),
      killed: number(tr, 'killed'),
      equivalent: number(tr, 'equivalent'),
      survived: number(tr, 'survived'),
      shown: tr.innerText,
      visible: tr.getBoundingClientRect().height > 0,
    }));
    const marked = (kind) => [...document.querySelectorAll(`section.file tr.${kind}`)].map((tr) => ({
      file: tr.closest('section').getAttribute('data-file'),
      line: Number(tr.getAttribute('data-line')),
      text: tr.querySelector('td.t').innerText,
      note: tr.querySelector('td.note').innerText,
    }));
    const cells = [...document.querySelectorAll('#grants td[data-profile]')].map((td) => ({
      profile: td.getAttribute('data-profile'),
      operation: td.getAttribute('data-operation'),
      allowed: td.getAttribute('data-allowed') === 'true',
      change: td.className,
    }));
    const sources = [...document.querySelectorAll('section.file')].map((s) => s.getAttribute('data-file'));
    return {
      title: document.title,
      fingerprint: document.querySelector('#fingerprint')?.innerText ?? null,
      base: document.querySelector('#base-overall')?.innerText ?? null,
      policies,
      survivors: marked('survivor'),
      failing: marked('failing'),
      grants: {
        profiles: document.querySelectorAll('#grants tr:has(td[data-profile])').length,
        proved_by: [...document.querySelectorAll('#grants tr.proved-by td')].map((td) => td.innerText),
        operations: document.querySelectorAll('#grants tr:first-child th').length - 1,
        cells,
      },
      files: sources,
      attention: [...document.querySelectorAll('#attention a')].map((a) => {
        const target = document.getElementById(a.getAttribute('href').slice(1));
        return { text: a.innerText, target: target ? Number(target.getAttribute('data-line')) : null };
      }),
      scripts: document.querySelectorAll('script').length,
      // Markup a policy's text or description may hold must stay text.
      made_from_text: document.querySelectorAll('section.file b, #policies b, section.file script, #policies script').length,
      text: document.body.innerText,
    };
  });
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ ...seen, requests: elsewhere }));
} finally {
  await browser.close();
}
