"""The report's inline stylesheet and script (no CDN: the file must open offline).

The script is the page's only one, and the page's Content-Security-Policy allows exactly
it (by its SHA-256), so even text that slipped through escaping could not run.
"""

from __future__ import annotations

import base64
import hashlib

__all__ = ["CSS", "SCRIPT", "content_security_policy"]

CSS = """
:root { --fg:#1d2230; --muted:#5d6678; --line:#dde1ea; --bg:#f6f7fa; --card:#fff;
  --pass:#1a7f37; --fail:#c62828; --warn:#9a6700; --err:#8250df; --accent:#2f6feb; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; }
.sub { color: var(--muted); margin: 0 0 16px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 10px 14px; min-width: 120px; }
.card .v { font-size: 20px; font-weight: 600; } .card .k { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; background: var(--card);
  border: 1px solid var(--line); }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: right;
  white-space: nowrap; }
th:first-child, td:first-child { text-align: left; white-space: normal; }
th { background: #eef1f6; font-weight: 600; }
tr.task-row { cursor: pointer; } tr.task-row:hover { background: #f0f4ff; }
.worse, .bad { color: var(--fail); } .better, .good { color: var(--pass); }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr)); gap: 12px; }
.plot { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 8px; } .plot figcaption { font-weight: 600; margin-bottom: 4px; }
.plot svg { width: 100%; height: auto; } .plot .empty, .note { color: var(--muted); }
svg .bar { fill: #8fb0f0; } svg .bar-part { fill: #e06666; }
svg .axis { stroke: #9aa3b5; } svg text { font-size: 11px; fill: var(--muted); }
svg .label { fill: var(--fg); }
.filters { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; margin-bottom: 10px; }
select { font: inherit; padding: 3px 6px; }
details.episode { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  margin: 6px 0; } details.episode > summary { padding: 7px 10px; cursor: pointer; }
details.episode[open] > summary { border-bottom: 1px solid var(--line); }
.episode-body { padding: 8px 12px 12px; }
.badge { display: inline-block; min-width: 64px; text-align: center; border-radius: 10px;
  padding: 0 8px; margin-right: 8px; color: #fff; font-size: 12px; }
.badge.passed { background: var(--pass); } .badge.failed { background: var(--fail); }
.badge.ungraded { background: var(--warn); } .badge.error { background: var(--err); }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0 0 8px; }
.meta dt { color: var(--muted); } .meta dd { margin: 0; overflow-wrap: anywhere; }
.msg { border-left: 3px solid var(--line); margin: 6px 0; padding: 2px 10px; }
.msg .role { font-size: 12px; font-weight: 600; color: var(--muted); }
.msg.user { border-color: #8fb0f0; } .msg.assistant { border-color: #7cc48d; }
.msg.tool { border-color: #d8b46a; } .msg.system { border-color: #b7a4e0; }
.msg.tool-error { border-color: var(--fail); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0; max-height: 420px;
  overflow: auto; background: #f8f9fb; border: 1px solid var(--line); border-radius: 4px;
  padding: 6px 8px; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.call { margin: 4px 0; } .call code { font-weight: 600; }
img.shot { max-width: 100%; max-height: 480px; border: 1px solid var(--line); display: block;
  margin: 4px 0; }
.verifier h4 { margin: 10px 0 2px; font-size: 13px; }
.error-box { color: var(--fail); }
"""

SCRIPT = """
(function () {
  "use strict";
  var task = document.getElementById("filter-task");
  var outcome = document.getElementById("filter-outcome");
  var shown = document.getElementById("shown-count");
  var episodes = Array.prototype.slice.call(document.querySelectorAll("details.episode"));
  if (!task || !outcome || !shown) { return; }
  function apply() {
    var count = 0;
    episodes.forEach(function (el) {
      var ok = (!task.value || el.dataset.task === task.value) &&
               (!outcome.value || el.dataset.outcome === outcome.value);
      el.hidden = !ok;
      if (ok) { count += 1; }
    });
    shown.textContent = String(count);
  }
  task.addEventListener("change", apply);
  outcome.addEventListener("change", apply);
  Array.prototype.forEach.call(document.querySelectorAll("tr.task-row"), function (row) {
    row.addEventListener("click", function () {
      task.value = row.dataset.task;
      apply();
      document.getElementById("episodes").scrollIntoView();
    });
  });
  window.fleetenvReport = { apply: apply };
  apply();
})();
"""


def content_security_policy(script: str = SCRIPT) -> str:
    """Nothing is fetched (``default-src 'none'``), images only inline (``data:``), and
    only ``script`` runs."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
            f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")
