// MemWAL page: sortable tables and "Merge now" (served by the plugin itself; no CDN).
(function () {
  "use strict";
  var base = document.body.dataset.base || "";
  var csrfHeader = document.body.dataset.csrfHeader;

  function cellValue(row, idx) {
    var cell = row.cells[idx];
    var v = cell && cell.dataset.value !== undefined ? cell.dataset.value : (cell ? cell.textContent : "");
    var n = parseFloat(v);
    return v !== "" && !isNaN(n) && String(n) === String(Number(v)) ? n : v;
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th[data-key]").forEach(function (th, idx) {
      th.classList.add("sort");
      th.addEventListener("click", function () {
        var asc = th.dataset.dir !== "asc";
        table.querySelectorAll("th").forEach(function (o) { delete o.dataset.dir; });
        th.dataset.dir = asc ? "asc" : "desc";
        var body = table.tBodies[0];
        var rows = Array.prototype.filter.call(body.rows, function (r) { return !r.classList.contains("region-error"); });
        rows.sort(function (a, b) {
          var x = cellValue(a, idx), y = cellValue(b, idx);
          if (x === "" && y !== "") return 1;
          if (y === "" && x !== "") return -1;
          var c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });

  function say(table, text, cls) {
    var el = document.querySelector('.merge-status[data-table="' + table + '"]');
    if (el) { el.textContent = text; el.className = "merge-status " + (cls || ""); }
    return el;
  }

  function poll(table, run) {
    fetch(base + "/api/runs/" + encodeURIComponent(run.dag_id) + "/" + encodeURIComponent(run.dag_run_id),
          {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json(); })
      .then(function (s) {
        var el = say(table, run.dag_id + " run " + run.dag_run_id + ": " + s.state, "state-" + s.state);
        if (el) el.dataset.runId = run.dag_run_id;
        if (el) el.dataset.state = s.state;
        if (s.state === "success" || s.state === "failed") {
          setTimeout(function () { window.location.reload(); }, 500);
        } else {
          setTimeout(function () { poll(table, run); }, 2000);
        }
      })
      .catch(function (e) { say(table, "lost track of the run: " + e, "error"); });
  }

  document.querySelectorAll("button.merge").forEach(function (btn) {
    btn.addEventListener("click", function () {
      var table = btn.dataset.table;
      var body = btn.dataset.region ? {regions: [btn.dataset.region]} : {};
      var headers = {"Content-Type": "application/json", "Accept": "application/json"};
      headers[csrfHeader] = "1";
      btn.disabled = true;
      say(table, "triggering memwal_merge" + (btn.dataset.region ? " for region " + btn.dataset.region : "") + "…");
      fetch(base + "/api/tables/" + encodeURIComponent(table) + "/merge",
            {method: "POST", credentials: "same-origin", headers: headers, body: JSON.stringify(body)})
        .then(function (r) { return r.json().then(function (j) { return {ok: r.ok, j: j}; }); })
        .then(function (res) {
          btn.disabled = false;
          if (!res.ok) { say(table, "refused: " + res.j.detail, "error"); return; }
          var el = say(table, res.j.dag_id + " run " + res.j.dag_run_id + ": " + res.j.state, "state-" + res.j.state);
          if (el) { el.dataset.runId = res.j.dag_run_id; el.dataset.state = res.j.state; }
          poll(table, res.j);
        })
        .catch(function (e) { btn.disabled = false; say(table, "failed: " + e, "error"); });
    });
  });
})();
