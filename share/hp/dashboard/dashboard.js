/* share/hp/dashboard/dashboard.js — hpd's live dashboard (docs/http-api.md).
 *
 * Polls the read-only JSON API every 2 s: the job list, and for the selected job its detail
 * (ranks, state history), its metrics (incrementally, through next_since) and a rank's log tail.
 * Plots loss (and the held-out eval loss of a job that evaluates), tokens/s, MFU and peak
 * memory against step with Chart.js (global `Chart`, 3.x,
 * linear x axis: there is no date adapter).
 *
 * Rules: every string from the API goes into the DOM through textContent (never innerHTML); an
 * API error is shown in the status line and the last good data stays on screen; one poll runs
 * at a time.
 *
 * The token (hpd --auth all): from the URL fragment, #token=T (with #job=ID: #token=T&job=ID),
 * which the browser never sends to a server; kept in sessionStorage for reloads, dropped from
 * the address bar, and sent as "Authorization: Bearer T" on every API call. Never a query
 * string (hpd refuses ?token=).
 *
 * Hooks for tests (tests/dashboard/dashboard_test.py): #jobs tr[data-job-id] with a
 * [data-field=state] cell; #loss-chart carries data-loss-points (points plotted) and
 * data-last-step; body[data-ready="1"] after the first successful poll.
 */
(function () {
    "use strict";

    var POLL_MS = 2000;
    var FETCH_TIMEOUT_MS = 10000;
    var JOBS_LIMIT = 100;
    var LOG_TAIL = 200;
    var METRICS_PAGES_PER_POLL = 20; /* 20 x 1000 records, then the next poll goes on */
    var SMOOTHING = 0.6;             /* loss EMA weight, as TensorBoard's default slider */
    var PALETTE = ["#2f6fde", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0c8599",
                   "#5f3dc4", "#e67700", "#364fc7", "#a61e4d"];

    var el = function (id) { return document.getElementById(id); };

    var TOKEN = (function () {
        var m = /(?:^#|&)token=([^&]*)/.exec(location.hash || "");
        var t = null;
        if (m) {
            try { t = decodeURIComponent(m[1]); } catch (e) { t = null; }
            var rest = location.hash.replace(/(^#|&)token=[^&]*/, "$1")
                .replace(/^#&/, "#").replace(/&$/, "");
            try {
                history.replaceState(null, "", location.pathname + location.search +
                                     (rest === "#" ? "" : rest));
            } catch (e) { /* the address bar keeps it */ }
        }
        try {
            if (t) sessionStorage.setItem("hp-token", t);
            else t = sessionStorage.getItem("hp-token");
        } catch (e) { /* no storage: this page load only */ }
        return t || null;
    })();

    var state = {
        jobs: [],
        selectedId: null,
        explicit: false,  /* chosen by a click or the URL hash, not by default */
        series: null,     /* metrics of the selected job, see newSeries() */
        detail: null,
        logRank: 0,
        logKey: "",
        timer: null,
        busy: false,
        again: false,
        ready: false
    };
    var charts = {loss: null, tps: null, mfu: null, mem: null};

    /* ---- formatting ------------------------------------------------------------------------ */

    function isNum(v) { return typeof v === "number" && isFinite(v); }

    function fmtDuration(s) {
        if (!isNum(s) || s < 0) return "—";
        if (s < 1) return "<1s";
        s = Math.round(s);
        var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600),
            m = Math.floor(s % 3600 / 60), sec = s % 60;
        if (d) return d + "d " + h + "h";
        if (h) return h + "h " + m + "m";
        if (m) return m + "m " + sec + "s";
        return sec + "s";
    }

    function fmtLoss(v) {
        if (!isNum(v)) return "—";
        return Math.abs(v) < 100 ? v.toFixed(4) : v.toPrecision(5);
    }

    function fmtRate(v) {
        if (!isNum(v)) return "—";
        if (v >= 1e9) return (v / 1e9).toFixed(2) + "G";
        if (v >= 1e6) return (v / 1e6).toFixed(2) + "M";
        if (v >= 1e4) return (v / 1e3).toFixed(1) + "k";
        return Math.round(v).toLocaleString("en-US");
    }

    function fmtPct(v) { return isNum(v) ? v.toFixed(v < 10 ? 2 : 1) + "%" : "—"; }

    function fmtBytes(b) {
        if (!isNum(b)) return "—";
        var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
        while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
        return (i === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + units[i];
    }

    function fmtMiB(mib) { /* axis ticks of the memory chart, which plots MiB */
        if (!isNum(mib)) return "";
        if (Math.abs(mib) >= 1024) return +(mib / 1024).toFixed(2) + " GiB";
        return +mib.toFixed(1) + " MiB";
    }

    function pad2(n) { return (n < 10 ? "0" : "") + n; }

    function fmtTime(unix) {
        if (!isNum(unix) || unix <= 0) return "—";
        var d = new Date(unix * 1000);
        if (d.toDateString() === new Date().toDateString()) return fmtClock(d);
        return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + " " +
               pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
    }

    function fmtClock(d) {
        return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
    }

    function str(v) { return v === null || v === undefined ? "" : String(v); }

    /* ---- DOM helpers (text only) ----------------------------------------------------------- */

    function h(tag, attrs, children) {
        var n = document.createElement(tag);
        if (attrs) {
            Object.keys(attrs).forEach(function (k) {
                if (k === "text") n.textContent = str(attrs[k]);
                else if (k === "class") n.className = attrs[k];
                else if (k.indexOf("data-") === 0) n.setAttribute(k, str(attrs[k]));
                else n[k] = attrs[k];
            });
        }
        (children || []).forEach(function (c) { if (c) n.appendChild(c); });
        return n;
    }

    function badge(text, cls) {
        /* The class is only ever a known state word or up/down, never free API text. */
        return h("span", {"class": "badge " + cls, text: text});
    }

    var STATES = ["QUEUED", "COMPILING", "LAUNCHING", "RUNNING", "RESTARTING", "SUCCEEDED",
                  "FAILED", "CANCELLED"];
    function stateClass(s) { return STATES.indexOf(s) >= 0 ? s : "UNKNOWN"; }

    function setStatus(text, kind) {
        var s = el("status");
        s.textContent = text;
        s.className = "status" + (kind ? " " + kind : "");
    }

    /* ---- API ------------------------------------------------------------------------------- */

    function api(path) {
        var ctl = typeof AbortController === "function" ? new AbortController() : null;
        var t = ctl ? setTimeout(function () { ctl.abort(); }, FETCH_TIMEOUT_MS) : null;
        var hdrs = TOKEN ? {"Authorization": "Bearer " + TOKEN} : {};
        return fetch(path, {cache: "no-store", headers: hdrs,
                            signal: ctl ? ctl.signal : undefined})
            .then(function (r) {
                return r.text().then(function (body) {
                    var j = null;
                    try { j = body ? JSON.parse(body) : null; } catch (e) { j = null; }
                    if (!r.ok) {
                        var msg = j && j.error && j.error.message ? j.error.message
                                                                  : (r.statusText || "error");
                        throw new Error(r.status + " " + msg);
                    }
                    if (j === null || typeof j !== "object")
                        throw new Error("not a JSON object");
                    return j;
                });
            }, function (e) {
                throw new Error(e && e.name === "AbortError" ? "timed out"
                                : "cannot reach hpd (" + (e && e.message || e) + ")");
            })
            .finally(function () { if (t) clearTimeout(t); });
    }

    /* ---- job list -------------------------------------------------------------------------- */

    function progressCell(job) {
        var total = isNum(job.total_steps) ? job.total_steps : 0;
        var step = isNum(job.step) ? job.step : 0;
        var frac = isNum(job.progress) ? job.progress : (total > 0 ? step / total : 0);
        frac = Math.max(0, Math.min(1, frac));
        var barCls = "bar" + (job.state === "SUCCEEDED" ? " done" :
                              job.state === "FAILED" ? " failed" : "");
        var fill = h("span");
        fill.style.width = (frac * 100).toFixed(1) + "%";
        var label = total > 0 ? step + " / " + total : String(step);
        return h("td", null, [h("div", {"class": "progress"}, [
            h("div", {"class": barCls, title: (frac * 100).toFixed(1) + "%"}, [fill]),
            h("span", {"class": "label", text: label})])]);
    }

    function renderJobs() {
        var tbody = el("jobs").tBodies[0];
        var rows = state.jobs.map(function (job) {
            var last = job.last && typeof job.last === "object" ? job.last : {};
            var tr = h("tr", {"data-job-id": job.id}, [
                h("td", {"class": "id", text: job.id}),
                h("td", {text: job.name}),
                h("td", {"data-field": "state"}, [badge(str(job.state), stateClass(job.state))]),
                progressCell(job),
                h("td", {"data-field": "eta", text: job.state === "RUNNING" ? fmtDuration(job.eta_s)
                                                                             : "—"}),
                h("td", {"class": "num", "data-field": "loss", text: fmtLoss(last.loss)}),
                h("td", {"class": "num", "data-field": "tokens_per_s",
                         text: fmtRate(last.tokens_per_s)}),
                h("td", {"class": "num", "data-field": "restarts", text: str(job.restarts)})
            ]);
            if (job.id === state.selectedId) tr.className = "selected";
            return tr;
        });
        tbody.replaceChildren.apply(tbody, rows);
        el("jobs-empty").hidden = state.jobs.length > 0;
        var running = state.jobs.filter(function (j) { return j.state === "RUNNING"; }).length;
        el("jobs-count").textContent = state.jobs.length ?
            state.jobs.length + (state.jobs.length >= JOBS_LIMIT ? "+" : "") +
            (state.jobs.length === 1 ? " job, " : " jobs, ") +
            running + " running" : "";
    }

    /* The URL hash (#job=ID) wins; otherwise the newest running job, else keep the current
     * one while it is listed, else the newest job. */
    function chooseSelection() {
        var fromHash = hashJob();
        if (fromHash) { state.explicit = true; return fromHash; }
        if (state.explicit && state.selectedId) return state.selectedId;
        for (var i = 0; i < state.jobs.length; i++)
            if (state.jobs[i].state === "RUNNING") return state.jobs[i].id;
        if (state.selectedId && state.jobs.some(function (j) { return j.id === state.selectedId; }))
            return state.selectedId;
        return state.jobs.length ? state.jobs[0].id : null;
    }

    function hashJob() {
        var m = /(?:^#|&)job=([^&]+)/.exec(location.hash || "");
        if (!m) return null;
        try { return decodeURIComponent(m[1]); } catch (e) { return null; }
    }

    function select(id) {
        if (id === state.selectedId) return;
        state.selectedId = id;
        state.series = id ? newSeries(id) : null;
        state.detail = null;
        state.logRank = 0;
        state.logKey = "";
        el("log").textContent = "";
        resetCharts();
        renderJobs();
    }

    /* ---- metrics series -------------------------------------------------------------------- */

    function newSeries(id) {
        /* Each map: rank -> [{x: step, y: value}] sorted by step, one point per step. */
        return {id: id, since: 0, restarts: null, loss: {}, evalLoss: {}, tps: {}, mfu: {},
                mem: {}};
    }

    function put(map, rank, step, v) {
        if (!isNum(v)) return;
        var a = map[rank] || (map[rank] = []);
        var n = a.length;
        if (!n || a[n - 1].x < step) { a.push({x: step, y: v}); return; }
        /* A step seen again (a restart re-ran it) or out of order: replace or insert. */
        var lo = 0, hi = n;
        while (lo < hi) {
            var mid = (lo + hi) >> 1;
            if (a[mid].x < step) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n && a[lo].x === step) a[lo].y = v;
        else a.splice(lo, 0, {x: step, y: v});
    }

    function addRecords(S, records) {
        records.forEach(function (r) {
            if (!r || !isNum(r.step)) return;
            var rank = isNum(r.rank) ? r.rank : 0;
            put(S.loss, rank, r.step, r.loss);
            put(S.evalLoss, rank, r.step, r.eval_loss); /* null unless evaluated after it */
            put(S.tps, rank, r.step, r.tokens_per_s);
            put(S.mfu, rank, r.step, r.mfu_pct);
            put(S.mem, rank, r.step, isNum(r.peak_memory_bytes) ? r.peak_memory_bytes / 1048576
                                                                 : null);
        });
    }

    function ranksOf(map) {
        return Object.keys(map).map(Number).sort(function (a, b) { return a - b; });
    }

    function fetchMetrics(S) {
        var pages = 0;
        function page() {
            var url = "/api/v1/jobs/" + encodeURIComponent(S.id) + "/metrics?since=" + S.since;
            return api(url).then(function (j) {
                if (state.series !== S) return; /* the selection changed meanwhile */
                addRecords(S, Array.isArray(j.records) ? j.records : []);
                if (isNum(j.next_since) && j.next_since > S.since) S.since = j.next_since;
                else if (Array.isArray(j.records) && j.records.length) {
                    var maxStep = Math.max.apply(null, j.records.map(function (r) {
                        return r.step;
                    }));
                    if (isNum(maxStep)) S.since = Math.max(S.since, maxStep + 1);
                }
                if (j.more === true && ++pages < METRICS_PAGES_PER_POLL) return page();
            });
        }
        return page();
    }

    /* ---- charts ---------------------------------------------------------------------------- */

    function cssVar(name, fallback) {
        var v = getComputedStyle(document.documentElement).getPropertyValue(name);
        return v && v.trim() ? v.trim() : fallback;
    }

    function haveChart() { return typeof window.Chart === "function"; }

    function makeChart(canvasId, yFormat, tooltipFormat, beginAtZero) {
        var canvas = el(canvasId);
        if (!haveChart()) {
            canvas.parentNode.appendChild(h("div", {"class": "no-chart",
                text: "Chart.js did not load (/static/chart.min.js)"}));
            return null;
        }
        return new window.Chart(canvas.getContext("2d"), {
            type: "line",
            data: {datasets: []},
            options: {
                animation: false,
                responsive: true,
                maintainAspectRatio: false,
                parsing: false,
                normalized: true,
                spanGaps: true,
                interaction: {mode: "nearest", axis: "x", intersect: false},
                elements: {point: {radius: 0, hitRadius: 6, hoverRadius: 3},
                           line: {borderWidth: 1.6, tension: 0}},
                scales: {
                    x: {type: "linear", title: {display: true, text: "step"},
                        ticks: {precision: 0, maxTicksLimit: 8}, grid: {color: cssVar("--grid")}},
                    y: {beginAtZero: !!beginAtZero, grid: {color: cssVar("--grid")},
                        ticks: {maxTicksLimit: 6, callback: function (v) { return yFormat(v); }}}
                },
                plugins: {
                    legend: {display: false, labels: {boxWidth: 10, boxHeight: 2}},
                    tooltip: {callbacks: {
                        title: function (items) {
                            return items.length ? "step " + items[0].parsed.x : "";
                        },
                        label: function (it) {
                            return it.dataset.label + ": " + tooltipFormat(it.parsed.y);
                        }
                    }}
                }
            }
        });
    }

    function initCharts() {
        if (haveChart()) {
            window.Chart.defaults.color = cssVar("--muted", "#6a737d");
            window.Chart.defaults.borderColor = cssVar("--grid", "rgba(0,0,0,0.08)");
            window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
        }
        var num = function (v) { return +(+v).toPrecision(4); };
        charts.loss = makeChart("loss-chart", num, fmtLoss, false);
        charts.tps = makeChart("tps-chart", fmtRate, fmtRate, true);
        var pct = function (v) { return +(+v).toFixed(2) + "%"; };
        charts.mfu = makeChart("mfu-chart", pct, fmtPct, true);
        charts.mem = makeChart("mem-chart", fmtMiB, fmtMiB, true);
    }

    function resetCharts() {
        Object.keys(charts).forEach(function (k) {
            if (charts[k]) { charts[k].data.datasets = []; charts[k].update("none"); }
        });
        publishLossHooks();
    }

    function color(rank) { return PALETTE[rank % PALETTE.length]; }

    function lineDataset(label, data, col, extra) {
        var d = {label: label, data: data, borderColor: col, backgroundColor: col,
                 pointRadius: data.length <= 40 ? 2 : 0};
        Object.keys(extra || {}).forEach(function (k) { d[k] = extra[k]; });
        return d;
    }

    function perRank(chart, map) {
        if (!chart) return;
        var ranks = ranksOf(map);
        chart.data.datasets = ranks.map(function (r) {
            return lineDataset("rank " + r, map[r], color(r));
        });
        chart.options.plugins.legend.display = ranks.length > 1;
        chart.update("none");
    }

    /* TensorBoard's smoothing: an exponential moving average, debiased so that it does not
     * start from zero. */
    function ema(points, w) {
        var out = [], last = 0;
        points.forEach(function (p, i) {
            last = last * w + p.y * (1 - w);
            out.push({x: p.x, y: last / (1 - Math.pow(w, i + 1))});
        });
        return out;
    }

    function lossPoints() {
        var S = state.series;
        if (!S) return [];
        var ranks = ranksOf(S.loss);
        return ranks.length ? S.loss[ranks[0]] : []; /* rank 0, or the lowest rank present */
    }

    function updateCharts() {
        var S = state.series;
        if (!S) return;
        if (charts.loss) {
            var pts = lossPoints();
            var ds = [lineDataset("loss", pts, color(0),
                                  pts.length >= 10 ? {borderColor: "rgba(47,111,222,0.35)"} : {})];
            if (pts.length >= 10)
                ds.push(lineDataset("smoothed", ema(pts, SMOOTHING), color(0),
                                    {pointRadius: 0, borderWidth: 2}));
            /* the held-out loss (train.eval_interval), where the job evaluates */
            var evRanks = ranksOf(S.evalLoss);
            if (evRanks.length)
                ds.push(lineDataset("eval", S.evalLoss[evRanks[0]], color(1), {pointRadius: 3}));
            charts.loss.data.datasets = ds;
            charts.loss.options.plugins.legend.display = ds.length > 1;
            charts.loss.update("none");
        }
        perRank(charts.tps, S.tps);
        perRank(charts.mfu, S.mfu);
        perRank(charts.mem, S.mem);
        publishLossHooks();
    }

    /* data-loss-points counts the raw loss points actually handed to Chart.js. */
    function publishLossHooks() {
        var c = el("loss-chart");
        var plotted = charts.loss && charts.loss.data.datasets.length ?
            charts.loss.data.datasets[0].data : [];
        c.setAttribute("data-loss-points", String(plotted.length));
        c.setAttribute("data-last-step",
                       plotted.length ? String(plotted[plotted.length - 1].x) : "");
    }

    /* ---- job detail ------------------------------------------------------------------------ */

    function summaryItem(label, value) {
        return h("div", null, [h("dt", {text: label}), h("dd", {text: value, title: value})]);
    }

    function renderDetail() {
        var d = state.detail;
        el("detail").hidden = !state.selectedId;
        if (!state.selectedId) return;
        var job = d && d.job ? d.job : state.jobs.filter(function (j) {
            return j.id === state.selectedId; })[0];
        el("d-id").textContent = state.selectedId;
        if (!job) return;
        var last = job.last && typeof job.last === "object" ? job.last : {};
        el("d-name").textContent = str(job.name);
        var b = el("d-state");
        b.textContent = str(job.state);
        b.className = "badge " + stateClass(job.state);
        var err = el("d-error");
        err.hidden = !job.error;
        err.textContent = str(job.error);
        var total = isNum(job.total_steps) && job.total_steps > 0 ? " / " + job.total_steps : "";
        el("d-summary").replaceChildren(
            summaryItem("Step", str(isNum(job.step) ? job.step : "—") + total),
            summaryItem("Loss", fmtLoss(last.loss)),
            summaryItem("Tokens/s", fmtRate(last.tokens_per_s)),
            summaryItem("MFU", fmtPct(last.mfu_pct)),
            summaryItem("Step time", isNum(last.step_time_s) ?
                        (last.step_time_s < 1 ? (last.step_time_s * 1000).toFixed(0) + " ms"
                                              : last.step_time_s.toFixed(2) + " s") : "—"),
            summaryItem("Peak memory", fmtBytes(last.peak_memory_bytes)),
            summaryItem("LR", isNum(last.lr) ? last.lr.toExponential(2) : "—"),
            summaryItem("Grad norm", isNum(last.grad_norm) ? last.grad_norm.toPrecision(4) : "—"),
            summaryItem("ETA", job.state === "RUNNING" ? fmtDuration(job.eta_s) : "—"),
            summaryItem("World size", str(job.world_size)),
            summaryItem("Launcher", str(job.launcher || "—") +
                        (job.launch_ref ? (job.launcher === "slurm" ? " · Slurm job " : " · ") +
                         job.launch_ref : "") +
                        (job.launch_state ? " (" + job.launch_state + ")" : "")),
            summaryItem("Created", fmtTime(job.created_unix_s)),
            summaryItem("Updated", fmtTime(job.updated_unix_s)));
        el("d-restarts").textContent = "· " + str(isNum(job.restarts) ? job.restarts : 0) +
            (job.restarts === 1 ? " restart" : " restarts");
        document.title = state.selectedId + " " + str(job.state) + " · hp";
        renderRanks(d && Array.isArray(d.ranks) ? d.ranks : []);
        renderTransitions(d && Array.isArray(d.transitions) ? d.transitions : []);
        renderRankSelect(job, d && Array.isArray(d.ranks) ? d.ranks : []);
    }

    function renderRanks(ranks) {
        var tbody = el("ranks").tBodies[0];
        tbody.replaceChildren.apply(tbody, ranks.map(function (r) {
            return h("tr", {"data-rank": r.rank}, [
                h("td", {"class": "num", text: r.rank}),
                h("td", null, [r.up ? badge("up", "up") : badge("down", "down")]),
                h("td", {"class": "num", text: isNum(r.heartbeat_age_s) ?
                         r.heartbeat_age_s.toFixed(1) + " s ago" : "—"}),
                h("td", {"class": "num", text: isNum(r.step) ? r.step : "—"}),
                h("td", {"class": "num", text: fmtRate(r.tokens_per_s)}),
                h("td", {"class": "num", text: fmtPct(r.mfu_pct)}),
                h("td", {"class": "num", text: fmtBytes(r.peak_memory_bytes)})
            ]);
        }));
        el("ranks-empty").hidden = ranks.length > 0;
    }

    function renderTransitions(ts) {
        var tbody = el("transitions").tBodies[0];
        tbody.replaceChildren.apply(tbody, ts.map(function (t) {
            return h("tr", null, [
                h("td", {text: fmtTime(t.time_unix_s)}),
                /* The first transition has no "from" (the submission). */
                h("td", null, [t.from ? badge(str(t.from), stateClass(t.from)) : null,
                               t.from ? h("span", {text: " → "}) : null,
                               badge(str(t.to), stateClass(t.to))]),
                h("td", {text: t.reason})
            ]);
        }));
    }

    function renderRankSelect(job, ranks) {
        var n = isNum(job.world_size) && job.world_size > 0 ? job.world_size : 1;
        ranks.forEach(function (r) { if (isNum(r.rank) && r.rank + 1 > n) n = r.rank + 1; });
        n = Math.min(n, 4096);
        var sel = el("log-rank");
        if (sel.options.length !== n) {
            var opts = [];
            for (var i = 0; i < n; i++) opts.push(h("option", {value: String(i), text: String(i)}));
            sel.replaceChildren.apply(sel, opts);
        }
        if (state.logRank >= n) state.logRank = 0;
        sel.value = String(state.logRank);
    }

    function fetchLog(id) {
        var rank = state.logRank;
        return api("/api/v1/jobs/" + encodeURIComponent(id) + "/logs?rank=" + rank + "&tail=" +
                   LOG_TAIL).then(function (j) {
            if (state.selectedId !== id || state.logRank !== rank) return;
            var lines = Array.isArray(j.lines) ? j.lines.map(str) : [];
            var text = lines.length ? lines.join("\n") : "(no log yet for rank " + rank + ")";
            var pre = el("log");
            var key = id + "/" + rank + "/" + text;
            if (key === state.logKey) return;
            state.logKey = key;
            pre.textContent = text;
            if (el("log-follow").checked) pre.scrollTop = pre.scrollHeight;
        });
    }

    /* ---- the poll -------------------------------------------------------------------------- */

    function poll() {
        var errors = [];
        var note = function (what) {
            return function (e) { errors.push(what + ": " + (e && e.message || e)); };
        };
        return api("/api/v1/jobs?limit=" + JOBS_LIMIT).then(function (j) {
            state.jobs = Array.isArray(j.jobs) ? j.jobs.filter(function (x) {
                return x && typeof x.id === "string"; }) : [];
            select(chooseSelection());
            renderJobs();
            var id = state.selectedId;
            if (!id) { renderDetail(); return true; }
            var S = state.series;
            var detail = api("/api/v1/jobs/" + encodeURIComponent(id)).then(function (d) {
                if (state.selectedId !== id) return;
                state.detail = d;
                /* A restart may re-run steps already plotted: read the metrics again. */
                var restarts = d.job && isNum(d.job.restarts) ? d.job.restarts : 0;
                if (S.restarts !== null && S.restarts !== restarts) S.since = 0;
                S.restarts = restarts;
            }, note("job " + id));
            return detail.then(function () {
                renderDetail();
                return Promise.all([
                    fetchMetrics(S).then(function () {
                        if (state.series === S) updateCharts();
                    }, note("metrics of " + id)),
                    fetchLog(id).catch(note("log of " + id))
                ]);
            }).then(function () { return true; });
        }, function (e) {
            errors.push("job list: " + e.message);
            return false;
        }).then(function (listOk) {
            if (listOk && !state.ready) {
                state.ready = true;
                document.body.dataset.ready = "1";
            }
            if (errors.length) setStatus(errors.join(" · ") + " — retrying", "error");
            else setStatus("live · updated " + fmtClock(new Date()), "");
        }).catch(function (e) { /* a bug in rendering: say so rather than go blank */
            setStatus("dashboard error: " + (e && e.message || e), "error");
        });
    }

    function schedule(ms) {
        if (state.timer) clearTimeout(state.timer);
        state.timer = setTimeout(tick, ms);
    }

    function tick() {
        state.timer = null;
        if (state.busy) { state.again = true; return; }
        state.busy = true;
        poll().then(function () {
            state.busy = false;
            if (state.again) { state.again = false; schedule(0); }
            else schedule(POLL_MS);
        });
    }

    /* ---- events ---------------------------------------------------------------------------- */

    function onJobClick(ev) {
        var tr = ev.target && ev.target.closest ? ev.target.closest("tr[data-job-id]") : null;
        if (!tr) return;
        var id = tr.getAttribute("data-job-id");
        state.explicit = true;
        if (hashJob() !== id) location.hash = "job=" + encodeURIComponent(id);
        else { select(id); schedule(0); }
    }

    function onHash() {
        var id = hashJob();
        if (!id) { state.explicit = false; schedule(0); return; }
        state.explicit = true;
        select(id);
        renderDetail();
        schedule(0);
    }

    function onLogRank() {
        var v = parseInt(el("log-rank").value, 10);
        state.logRank = isNum(v) ? v : 0;
        state.logKey = "";
        el("log").textContent = "";
        if (state.selectedId) fetchLog(state.selectedId).catch(function (e) {
            setStatus("log: " + e.message, "error");
        });
    }

    function start() {
        try { initCharts(); } catch (e) { setStatus("charts: " + e.message, "error"); }
        publishLossHooks();
        el("jobs").tBodies[0].addEventListener("click", onJobClick);
        el("log-rank").addEventListener("change", onLogRank);
        window.addEventListener("hashchange", onHash);
        setStatus("connecting…", "pending");
        tick();
    }

    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
})();
