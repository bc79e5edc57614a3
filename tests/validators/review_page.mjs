// Open the reviewer's page (`fleet-retire policy report`) from disk in
// Debian's Chromium, headless, and report what the rendered DOM shows, as
// JSON on stdout: the verdict and its reasons (each with the element it
// links to), the change against the base (the diff's <del> and <ins>
// lines, the counterexamples' cases), the failing proofs, each policy's
// marks, the lines marked as a survivor or a failing proof, the grants
// matrix, every request that was not for the page itself, elements a
// policy's text must not have made, and how the page lays out at a
// phone's width (390 px). Keeps a screenshot of the first screen at a
// desktop's width and at the phone's.
//
//   node review_page.mjs PAGE.html SCREENSHOT-PREFIX
//   (writes SCREENSHOT-PREFIX-desktop.png and SCREENSHOT-PREFIX-phone.png)
import puppeteer from 'puppeteer-core';
import { pathToFileURL } from 'node:url';

const [page_path, screenshot] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
});

// What the page shows, read from the DOM.
function read() {
  const data = (e, k) => e.getAttribute('data-' + k);
  const number = (e, k) => (data(e, k) === null ? null : Number(data(e, k)));
  const target = (href) => document.getElementById(href.slice(1));
  const policies = [...document.querySelectorAll('#policies tr[data-policy]')].map((tr) => ({
    id: data(tr, 'policy'),
    change: data(tr, 'change'),
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
  const reasons = [...document.querySelectorAll('#reasons a')].map((a) => {
    const t = target(a.getAttribute('href'));
    return {
      kind: a.parentElement.getAttribute('data-kind'),
      text: a.innerText,
      target: t ? t.id : null,
      line: t && t.hasAttribute('data-line') ? Number(t.getAttribute('data-line')) : null,
    };
  });
  const lines = (tag) => [...document.querySelectorAll(`section.file ${tag}`)].map((e) => ({
    file: e.closest('section').getAttribute('data-file'),
    line: Number(e.closest('tr').getAttribute('data-line')),
    text: e.innerText,
  }));
  return {
    title: document.title,
    first: document.body.firstElementChild.id,
    verdict: document.querySelector('#verdict-text')?.innerText ?? null,
    reasons,
    fingerprint: document.querySelector('#fingerprint')?.innerText ?? null,
    base: document.querySelector('#base-overall')?.innerText ?? null,
    base_problem: document.querySelector('#base-problem')?.innerText ?? null,
    removed: lines('del'),
    added: lines('ins'),
    // As copied: the text itself (a survivor's case is in a closed
    // <details>, which innerText would give as nothing).
    cases: [...document.querySelectorAll('pre.case')].map((pre) => ({
      text: pre.textContent,
      marked: [...pre.querySelectorAll('mark')].map((m) => m.textContent),
      sentence: pre.closest('.cex').querySelector('.sentence').textContent,
      save: pre.closest('.cex').querySelector('.save').textContent,
      section: pre.closest('section')?.id ?? null,
    })),
    moved: [...document.querySelectorAll('#moved tr')].slice(1).map((tr) => tr.innerText),
    changed_policies: [...document.querySelectorAll('#changed-policies li')].map((li) => li.innerText),
    failing_proofs: [...document.querySelectorAll('#failing-proofs .failing')].map((d) => ({
      id: d.getAttribute('data-property'),
      blamed: [...d.querySelectorAll('a.blamed')].map((a) => a.innerText),
    })),
    policies,
    survivors: marked('survivor'),
    failing: marked('failing'),
    grants: {
      profiles: document.querySelectorAll('#grants tr:has(td[data-profile])').length,
      proved_by: [...document.querySelectorAll('#grants tr.proved-by td')].map((td) => td.innerText),
      operations: document.querySelectorAll('#grants tr:first-child th').length - 1,
      cells,
    },
    files: [...document.querySelectorAll('section.file')].map((s) => s.getAttribute('data-file')),
    scripts: document.querySelectorAll('script').length,
    // Markup a policy's text or description may hold must stay text.
    made_from_text: document.querySelectorAll('section.file b, #policies b, section.file script, #policies script').length,
    text: document.body.innerText,
  };
}

// How the page lays out in the current viewport: whether anything runs
// past its right edge (the page scrolls sideways), and what does.
function layout() {
  const width = document.documentElement.clientWidth;
  const past = [...document.querySelectorAll('body *')]
    .filter((e) => e.getBoundingClientRect().right > width + 1)
    .slice(0, 10)
    .map((e) => `${e.tagName.toLowerCase()}#${e.id}.${e.className}: ${Math.round(e.getBoundingClientRect().right)}`);
  return { width, scroll_width: document.documentElement.scrollWidth, past };
}

try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const url = pathToFileURL(page_path).href;
  const elsewhere = [];
  page.on('request', (r) => { if (r.url() !== url) elsewhere.push(r.url()); });
  await page.goto(url, { waitUntil: 'load' });
  const seen = await page.evaluate(read);
  const desktop = await page.evaluate(layout);
  await page.screenshot({ path: `${screenshot}-desktop.png` });
  await page.setViewport({ width: 390, height: 844, isMobile: true, deviceScaleFactor: 1 });
  const phone = await page.evaluate(layout);
  await page.screenshot({ path: `${screenshot}-phone.png` });
  console.log(JSON.stringify({ ...seen, desktop, phone, requests: elsewhere }));
} finally {
  await browser.close();
}
