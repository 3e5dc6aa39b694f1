// Refreshes the status page from /status.json every few seconds: progress and numbers in
// place; when the document in progress or the per-state counts change, the page is
// reloaded so the server draws the tables and charts again. Read-only: it never posts.
"use strict";
(function () {
  const EVERY_MS = 3000;
  function signature(s) {
    const c = s.counts || {};
    const missing = (list) => (list || []).filter((x) => x.missing != null);
    return [s.current ? s.current.job_id : "", c.queued, c.running, c.done, c.failed,
            c.duplicate, s.fallback_reason ? 1 : 0, s.running ? 1 : 0,
            missing(s.inboxes).map((ib) => ib.path).join(","),
            missing(s.folders).map((f) => f.name).join(",")].join("|");
  }
  function set(field, text) {
    const el = document.querySelector('[data-field="' + field + '"]');
    if (el) { el.textContent = text; }
  }
  async function refresh() {
    try {
      const r = await fetch("/status.json", {credentials: "same-origin", cache: "no-store"});
      if (!r.ok) { return; }
      const s = await r.json();
      if (signature(s) !== document.body.dataset.signature) { location.reload(); return; }
      const cur = s.current;
      if (cur) {
        set("current.page", cur.page || 0);
        const pp = document.getElementById("page-progress");
        if (pp && cur.page) { pp.value = cur.page - 1; }
        const bp = document.getElementById("block-progress");
        if (cur.block) {
          set("current.block", cur.block[0] + "/" + cur.block[1]);
          if (bp) { bp.max = cur.block[1] || 1; bp.value = cur.block[0]; }
        }
      }
      if (cur && cur.eta_seconds != null) { set("current.eta", "~" + age(cur.eta_seconds)); }
      if (s.worker) {
        set("worker.phase", s.worker.phase);
        if (s.worker.rss != null) { set("worker.rss", Math.round(s.worker.rss / 1048576) + " MiB"); }
      }
      if (s.seconds_per_page != null) { set("seconds_per_page", s.seconds_per_page.toFixed(1) + " s/page"); }
      // how many in-place refreshes this page has had (the browser test reads it)
      document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
    } catch (e) {
      // the daemon restarting: try again at the next tick
    }
  }
  // daemon/common/units.py age(), as the server renders it: 90 s -> "1m", 2 h 5 m -> "2h05m"
  function age(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 90) { return s + "s"; }
    if (s < 5400) { return Math.floor(s / 60) + "m"; }
    if (s < 172800) { return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m"; }
    return Math.floor(s / 86400) + "d";
  }
  setInterval(refresh, EVERY_MS);
})();
