#!/usr/bin/python3
"""tests/daemon/http_test.py — hpd's HTTP interface against the real things.

Starts a real hpd on 127.0.0.1 (port 0 for gRPC, workers and HTTP) with a temp state dir,
submits a 2-rank debugmodel job with the real hpctl, and checks while it runs and after:
  * the JSON API (docs/http-api.md): the schema of every endpoint, paging of the job list with
    page_token and of metrics with since/next_since (no gap, no duplicate), logs with tail,
    404 / 400 / 405 cases and hostile query strings, all answered with a JSON error;
  * GET /metrics passes `promtool check metrics` (Debian's prometheus package) and holds the
    job's series;
  * a real Prometheus server on 127.0.0.1 scrapes hpd, and the loss series read back through
    its query API matches the losses hpd reported;
  * the trace of a profiled step over HTTP is Chrome trace JSON with both ranks, compute and
    comm slices.
Exit 0: all passed; 1: a check failed (a missing promtool/prometheus is a failure, not a skip).

  http_test.py --hpd BUILD/daemon/hpd --hpctl BUILD/client/hpctl
"""
import argparse
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def get(base, path, timeout=10):
    """(status, headers, body bytes) of GET base+path; never raises on HTTP errors."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(base, path):
    st, _, body = get(base, path)
    return st, json.loads(body)


def raw_request(port, data, timeout=10):
    """Sends raw bytes, returns the status code of the answer (0: none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    try:
        return int(buf.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def start_hpd(hpd, state, conf):
    p = subprocess.Popen([hpd, "--listen", "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                          "--http", "127.0.0.1:0", "--state-dir", state, "--slots", "2",
                          "--config", conf],
                         stdout=subprocess.PIPE, stderr=open(os.path.join(state, "hpd.log"), "w"),
                         text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if line.startswith("hpd listening"):
                kv = dict(t.split("=", 1) for t in line.split()[2:])
                return p, kv["grpc"], kv["http"]
        if p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("hpd did not print its 'hpd listening' line")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


JOB_KEYS = {"id": str, "name": str, "state": str, "created_unix_s": float,
            "updated_unix_s": float, "world_size": int, "step": int, "total_steps": int,
            "progress": (int, float), "restarts": int, "error": str}
REC_KEYS = {"step": int, "rank": int, "loss": float, "loss_max": float, "grad_norm": float,
            "lr": float, "tokens_per_s": float, "tflops": float, "mfu_pct": float,
            "peak_memory_bytes": int, "peak_memory_pct": float, "step_time_s": float,
            "data_time_s": float, "exposed_comm_s": float, "tokens": int, "time_unix_s": float}
STATES = {"QUEUED", "COMPILING", "LAUNCHING", "RUNNING", "RESTARTING", "SUCCEEDED", "FAILED",
          "CANCELLED"}


def has_schema(obj, keys, what):
    ok = isinstance(obj, dict)
    for k, t in keys.items():
        if not ok:
            break
        v = obj.get(k)
        ok = k in obj and (isinstance(v, t) or (t is float and isinstance(v, int))) and \
            not isinstance(v, bool)
        if not ok:
            print(f"     {what}: key {k!r} = {v!r} is not {t}")
    return check(ok, f"{what} has the documented keys and types")


def check_job_obj(j, what):
    has_schema(j, JOB_KEYS, what)
    check(j.get("state") in STATES, f"{what}: state {j.get('state')!r} is a job state")
    check("eta_s" in j and (j["eta_s"] is None or isinstance(j["eta_s"], (int, float))),
          f"{what}: eta_s is a number or null")
    if j.get("last") is not None:
        has_schema(j["last"], REC_KEYS, f"{what}.last")


def is_error(st, body, code, what):
    try:
        doc = json.loads(body)
        ok = st == code and doc["error"]["code"] == code and isinstance(doc["error"]["message"],
                                                                         str)
        msg = doc["error"]["message"]
    except (ValueError, KeyError, TypeError):
        ok, msg = False, body[:200]
    return check(ok, f"{what} -> {st} {msg!r} (want {code} with a JSON error)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    a = ap.parse_args()
    for tool in ("promtool", "prometheus"):
        if not shutil.which(tool):
            check(False, f"{tool} is installed (scripts/install-deps.sh installs prometheus)")
            return 1
    tmp = tempfile.mkdtemp(prefix="hp-http-")
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    job = os.path.join(tmp, "job.pb")
    small = os.path.join(tmp, "small.pb")
    common = ["--model", "llama3:debugmodel", "--dim", "64", "--layers", "2", "--heads", "4",
              "--kv-heads", "2", "--ffn-hidden", "96", "--vocab", "256", "--batch", "2",
              "--seq", "32", "--log-interval", "1", "--fsdp", "layers.*", "--mesh", "dp=2"]
    subprocess.run([a.hpctl, "new", *common, "--steps", "400", "--profile-steps", "3,4", "-o",
                    job], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([a.hpctl, "new", *common, "--steps", "3", "--name", "small", "-o", small],
                   check=True, stdout=subprocess.DEVNULL)
    conf = os.path.join(tmp, "hpd.conf")
    with open(conf, "w") as f:
        f.write("metrics-retention = 600\n")
    proc, grpc_addr, http_addr = start_hpd(a.hpd, state, conf)
    prom = None
    env = dict(os.environ, HP_STATE_DIR=state)
    try:
        base = "http://" + http_addr
        port = int(http_addr.rsplit(":", 1)[1])
        st, doc = get_json(base, "/api/v1/jobs")
        check(st == 200 and doc == {"jobs": [], "next_page_token": ""},
              f"empty list before any submit: {doc}")

        def submit(path):
            r = subprocess.run([a.hpctl, "submit", path, "--server", grpc_addr], env=env,
                               capture_output=True, text=True, timeout=60)
            check(r.returncode == 0, f"hpctl submit {os.path.basename(path)}: {r.stderr.strip()}")
            return r.stdout.strip().split()[-1]

        jid = submit(job)
        s1, s2 = submit(small), submit(small)

        # A poller like the dashboard's, from the first step to the end: passing next_since
        # back, it must see every record exactly once even though the ranks report apart.
        polled, poll_err = [], []

        def poller():
            since = 0
            while True:
                try:
                    st, d = get_json(base, f"/api/v1/jobs/{jid}/metrics?since={since}&limit=50")
                    st2, j = get_json(base, f"/api/v1/jobs/{jid}")
                except (OSError, ValueError) as e:
                    poll_err.append(str(e))
                    return
                if st != 200:
                    poll_err.append(f"status {st}")
                    return
                polled.extend((r["step"], r["rank"]) for r in d["records"])
                since = d["next_since"]
                if j["job"]["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and not d["more"]:
                    st, d = get_json(base, f"/api/v1/jobs/{jid}/metrics?since={since}")
                    polled.extend((r["step"], r["rank"]) for r in d["records"])
                    return
                time.sleep(0.02)

        pt = threading.Thread(target=poller, daemon=True)
        pt.start()

        # ---- while the job runs ---------------------------------------------------------
        deadline = time.time() + 120
        recs = []
        while time.time() < deadline:
            st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics")
            recs = doc.get("records", []) if st == 200 else []
            if len(recs) >= 8:
                break
            time.sleep(0.3)
        check(len(recs) >= 8, f"metrics records arrive over HTTP while the job runs ({len(recs)})")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}")
        check(st == 200, f"GET /api/v1/jobs/{jid} -> {st}")
        check_job_obj(doc.get("job"), "job detail")
        ranks = doc.get("ranks", [])
        check(doc["job"]["state"] == "RUNNING" and len(ranks) == 2,
              f"a running 2-rank job shows 2 ranks ({doc['job']['state']}, {len(ranks)})")
        for rk in ranks:
            check(isinstance(rk.get("rank"), int) and isinstance(rk.get("up"), bool) and
                  isinstance(rk.get("step"), int) and
                  (rk.get("heartbeat_age_s") is None or 0 <= rk["heartbeat_age_s"] < 30),
                  f"rank object {rk}")
        check(all(r["up"] for r in ranks), "both ranks are up")
        tr = doc.get("transitions", [])
        check([t["to"] for t in tr][:4] == ["QUEUED", "COMPILING", "LAUNCHING", "RUNNING"],
              f"transitions in order: {[t['to'] for t in tr]}")
        check(isinstance(doc["job"]["eta_s"], (int, float)) and doc["job"]["eta_s"] >= 0,
              f"a running job has an ETA ({doc['job']['eta_s']})")

        st, _, text = get(base, "/metrics")
        check(st == 200, "GET /metrics -> 200")
        p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
        check(p.returncode == 0,
              f"promtool check metrics passes on a running job's exposition "
              f"({p.stdout.decode().strip()} {p.stderr.decode().strip()})")
        t = text.decode()
        for series in (f'hp_job_loss{{job_id="{jid}"}}', f'hp_job_steps_total{{job_id="{jid}"}}',
                       f'hp_rank_up{{job_id="{jid}",rank="1"}} 1',
                       f'hp_job_step_seconds_bucket{{job_id="{jid}",le="+Inf"}}',
                       f'hp_rank_heartbeat_age_seconds{{job_id="{jid}",rank="0"}}',
                       f'hp_rank_tokens_per_second{{job_id="{jid}",rank="1"}}',
                       f'hp_rank_peak_memory_bytes{{job_id="{jid}",rank="1"}}'):
            check(series in t, f"/metrics has {series}")
        check("job=" not in t.replace("job_id=", ""), "no label named `job` in /metrics")

        # ---- a real Prometheus scraping hpd ---------------------------------------------
        pport = free_port()
        pdir = os.path.join(tmp, "prom")
        os.mkdir(pdir)
        with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: hpd\n    static_configs:\n"
                    f"      - targets: ['{http_addr}']\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={pdir}/prometheus.yml",
                                 f"--storage.tsdb.path={pdir}/data",
                                 f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(pdir, "log"), "w"))
        pbase = f"http://127.0.0.1:{pport}"
        up = False
        deadline = time.time() + 60
        while time.time() < deadline and not up:
            try:
                st, doc = get_json(pbase, "/api/v1/targets")
                up = st == 200 and any(t.get("health") == "up"
                                       for t in doc["data"]["activeTargets"])
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        check(up, "Prometheus reports the hpd target up")
        q = urllib.parse.quote(f'hp_job_loss{{job_id="{jid}"}}')
        values = []
        deadline = time.time() + 60
        while time.time() < deadline:
            end = time.time()
            st, doc = get_json(pbase, f"/api/v1/query_range?query={q}&start={end - 120}"
                                      f"&end={end}&step=1")
            res = doc.get("data", {}).get("result", []) if st == 200 else []
            values = [float(v[1]) for v in res[0]["values"]] if res else []
            if len(values) >= 3:
                break
            time.sleep(1)
        check(len(values) >= 3, f"Prometheus holds the loss series ({len(values)} points)")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?limit=10000")
        losses = {r["loss"] for r in doc["records"]}
        check(values and all(any(abs(v - l) <= 1e-9 * max(1, abs(l)) for l in losses)
                             for v in values),
              "every loss Prometheus scraped is a loss hpd reported")
        st, doc = get_json(pbase, "/api/v1/query?query=" +
                           urllib.parse.quote(f'hp_job_steps_total{{job_id="{jid}"}}'))
        res = doc.get("data", {}).get("result", [])
        check(res and float(res[0]["value"][1]) >= 1, f"steps counter through Prometheus {res}")

        # ---- after the jobs finish ------------------------------------------------------
        deadline = time.time() + 180
        states = {}
        while time.time() < deadline:
            st, doc = get_json(base, "/api/v1/jobs")
            states = {j["id"]: j["state"] for j in doc["jobs"]}
            if all(states.get(i) in ("SUCCEEDED", "FAILED", "CANCELLED") for i in (jid, s1, s2)):
                break
            time.sleep(0.5)
        check(all(states.get(i) == "SUCCEEDED" for i in (jid, s1, s2)), f"jobs succeeded {states}")
        # the snapshot that shows them final also has progress 1 (published every 250 ms)
        deadline = time.time() + 10
        while time.time() < deadline:
            st, doc = get_json(base, "/api/v1/jobs")
            if st == 200 and len(doc["jobs"]) == 3 and doc["jobs"][2]["progress"] == 1:
                break
            time.sleep(0.05)
        check(st == 200 and [j["id"] for j in doc["jobs"]] == [s2, s1, jid],
              "the list is newest first")
        for j in doc["jobs"]:
            check_job_obj(j, f"list entry {j['id']}")
        check(doc["jobs"][2]["progress"] == 1 and doc["jobs"][2]["eta_s"] is None,
              "a finished job: progress 1, no ETA")
        # paging
        seen, tok, pages = [], "", 0
        while pages < 10:
            st, doc = get_json(base, "/api/v1/jobs?limit=1" + (f"&page_token={tok}" if tok else ""))
            if st != 200:
                break
            seen += [j["id"] for j in doc["jobs"]]
            tok = doc["next_page_token"]
            pages += 1
            if not tok:
                break
        check(seen == [s2, s1, jid], f"paging with limit=1 walks every job once: {seen}")
        st, doc = get_json(base, "/api/v1/jobs?state=SUCCEEDED&state=RUNNING,QUEUED&limit=2")
        check(st == 200 and len(doc["jobs"]) == 2 and doc["next_page_token"] == s1,
              f"state filter + limit: {[j['id'] for j in doc['jobs']]} next {doc.get('next_page_token')}")
        st, doc = get_json(base, "/api/v1/jobs?state=failed")
        check(st == 200 and doc["jobs"] == [], "state filter (case-insensitive) with no match")
        # metrics paging: since/next_since walks every record once, in order
        st, full = get_json(base, f"/api/v1/jobs/{jid}/metrics?limit=10000")
        allrecs = full["records"]
        pt.join(timeout=60)
        check(not poll_err and polled == [(r["step"], r["rank"]) for r in allrecs],
              f"a live poller passing next_since back saw every record once "
              f"({len(polled)} of {len(allrecs)}, {len(set(polled))} distinct) {poll_err}")
        for r in allrecs[:3]:
            has_schema(r, REC_KEYS, f"metrics record step {r.get('step')}")
        steps = [r["step"] for r in allrecs if r["rank"] == 0]
        check(steps == list(range(1, 401)), f"rank 0 reported steps 1..400 ({steps[:3]}..{steps[-3:]})")
        got, since, rounds = [], 0, 0
        while rounds < 200:
            st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?since={since}&limit=7")
            got += [(r["step"], r["rank"]) for r in doc["records"]]
            rounds += 1
            if not doc["more"]:
                break
            check(doc["next_since"] > since, "next_since advances")
            since = doc["next_since"]
        check(got == [(r["step"], r["rank"]) for r in allrecs],
              f"paging metrics by since/next_since gives every record once ({len(got)} of "
              f"{len(allrecs)} in {rounds} pages)")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?since=395")
        check(st == 200 and min(r["step"] for r in doc["records"]) == 395 and
              doc["next_since"] == 401 and doc["more"] is False, "since=395 starts at step 395")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?since=1000")
        check(st == 200 and doc["records"] == [] and doc["next_since"] == 1000,
              "since past the end: no records, next_since unchanged")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?rank=0&limit=3")
        check(st == 200 and [r["rank"] for r in doc["records"]] == [0, 0, 0],
              "rank filter on metrics")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/metrics?rank=1&limit=3")
        check(st == 200 and [r["rank"] for r in doc["records"]] == [1, 1, 1],
              "every rank reports its own records (rank=1)")
        # logs
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/logs?rank=0&tail=5")
        check(st == 200 and doc["rank"] == 0 and len(doc["lines"]) == 5 and
              all(isinstance(l, str) for l in doc["lines"]), f"logs tail=5 -> {len(doc.get('lines', []))} lines")
        with open(os.path.join(state, "jobs", jid, "rank-0.log"), "rb") as f:
            want = f.read().decode("utf-8", "replace").rstrip("\n").split("\n")[-5:]
        check(doc["lines"] == want, "the tail is the log file's last 5 lines")
        st, doc = get_json(base, f"/api/v1/jobs/{jid}/logs?rank=1")
        with open(os.path.join(state, "jobs", jid, "rank-1.log"), "rb") as f:
            n1 = len([l for l in f.read().split(b"\n") if l][-100:])
        check(st == 200 and doc["rank"] == 1 and len(doc["lines"]) == n1,
              f"rank 1's log ({n1} lines)")
        # the trace of a profiled step
        st, _, body = get(base, f"/api/v1/jobs/{jid}/trace?step=3")
        try:
            tdoc = json.loads(body)
            evs = tdoc["traceEvents"]
        except (ValueError, KeyError, TypeError):
            tdoc, evs = None, []
        check(st == 200 and evs, f"GET trace?step=3 -> {st}, {len(evs)} events")
        xs = [e for e in evs if e.get("ph") == "X"]
        check({e["pid"] for e in xs} == {0, 1}, "the merged trace has both ranks as processes")
        check(any(e.get("tid") == 1 for e in xs) and any(e.get("tid") == 2 for e in xs),
              "compute (tid 1) and comm (tid 2) slices")
        # Too big to merge into one reply (2 x 31 MiB): 400 naming the way out; one rank fits.
        tdir = os.path.join(state, "jobs", jid, "traces")
        for r in (0, 1):
            with open(os.path.join(tdir, f"step-99-rank-{r}.json"), "w") as f:
                f.write('{"traceEvents":[{"ph":"X","name":"' + "x" * (31 << 20) +
                        '","ts":0,"dur":1,"pid":0,"tid":1}]}')
        st, _, body = get(base, f"/api/v1/jobs/{jid}/trace?step=99", timeout=60)
        is_error(st, body, 400, "a 62 MiB merged trace")
        check(b"fewer ranks" in body, "the error says to ask for fewer ranks")
        st, _, body = get(base, f"/api/v1/jobs/{jid}/trace?step=99&rank=0", timeout=60)
        check(st == 200 and len(body) > (31 << 20), f"one rank of it: {st}, {len(body)} bytes")
        st, _, body = get(base, f"/api/v1/jobs/{jid}/trace?step=9")
        is_error(st, body, 404, "trace of an unprofiled step")
        check(b"3, 4" in body, "the 404 lists the traced steps")

        # ---- bad requests: each a JSON error, the daemon still serving ------------------
        for path, code in [
            ("/api/v1/jobs/j-999999", 404), ("/api/v1/jobs/nope/metrics", 404),
            (f"/api/v1/jobs/{jid}/nope", 404), ("/api/v2/jobs", 404), ("/nope", 404),
            ("/api/v1/jobs?limit=0", 400), ("/api/v1/jobs?limit=1001", 400),
            ("/api/v1/jobs?limit=1e3", 400), ("/api/v1/jobs?limit=", 400),
            ("/api/v1/jobs?state=DONE", 400), ("/api/v1/jobs?state=%FF%FE", 400),
            ("/api/v1/jobs?page_token=../../etc/passwd", 400),
            (f"/api/v1/jobs/{jid}/metrics?since=-1", 400),
            (f"/api/v1/jobs/{jid}/metrics?since=99999999999999999999999", 400),
            (f"/api/v1/jobs/{jid}/metrics?since=%00", 400),
            (f"/api/v1/jobs/{jid}/metrics?rank=2", 400),
            (f"/api/v1/jobs/{jid}/metrics?limit=10001", 400),
            (f"/api/v1/jobs/{jid}/logs?rank=-1", 400), (f"/api/v1/jobs/{jid}/logs?tail=0", 400),
            (f"/api/v1/jobs/{jid}/logs?rank=abc", 400), (f"/api/v1/jobs/{jid}/trace", 400),
            (f"/api/v1/jobs/{jid}/trace?step=3&rank=7", 400),
            ("/api/v1/jobs?" + "&".join(f"a{i}=1" for i in range(40)), 400),
            ("/static/..%2Fhpd.db", 404), ("/static/.hidden", 404),
            ("/api/v1/jobs/" + "x" * 300, 404),
        ]:
            st, _, body = get(base, path)
            is_error(st, body, code, path[:80])
        req = urllib.request.Request(base + "/api/v1/jobs", data=b"{}", method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
            check(False, "POST /api/v1/jobs is refused")
        except urllib.error.HTTPError as e:
            is_error(e.code, e.read(), 405, "POST /api/v1/jobs")
        for m in ("DELETE", "PUT"):
            req = urllib.request.Request(base + f"/api/v1/jobs/{jid}", method=m)
            try:
                urllib.request.urlopen(req, timeout=10)
                check(False, f"{m} is refused")
            except urllib.error.HTTPError as e:
                is_error(e.code, e.read(), 405, f"{m} /api/v1/jobs/{jid}")
        code = raw_request(port, b"GET /api/v1/jobs?" + b"a" * 100000 + b" HTTP/1.1\r\n"
                           b"Host: x\r\n\r\n")
        check(code in (400, 413, 414, 431), f"a 100 KB request line -> {code}")
        code = raw_request(port, b"GARBAGE\r\n\r\n")
        check(code in (0, 400, 405, 501), f"a garbage request line -> {code}")
        code = raw_request(port, b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 70000 +
                           b"\r\n\r\n")
        check(code in (0, 400, 413, 431), f"a 70 KB header -> {code}")
        st, doc = get_json(base, "/api/v1/jobs")
        check(st == 200 and len(doc["jobs"]) == 3, "still serving after the hostile requests")

        # ---- cardinality: finished jobs leave /metrics after the retention (SIGHUP) ----
        with open(conf, "w") as f:
            f.write("metrics-retention = 0\n")
        proc.send_signal(signal.SIGHUP)
        t = ""
        deadline = time.time() + 10
        while time.time() < deadline:
            time.sleep(0.3)
            t = get(base, "/metrics")[2].decode()
            if "job_id=" not in t:
                break
        check("job_id=" not in t and "hp_jobs_submitted_total 3" in t and
              'hp_jobs_finished_total{state="SUCCEEDED"} 3' in t,
              "metrics-retention 0 by SIGHUP: finished jobs left /metrics, the totals stayed")
        st, _, body = get(base, "/")
        check(st in (200, 404), f"GET / -> {st}")
        st, hdr, body = get(base, "/static/chart.min.js")
        check(st == 200 and len(body) > 100000 and "javascript" in hdr.get("Content-Type", ""),
              f"/static/chart.min.js is Debian's Chart.js ({st}, {len(body)} bytes)")
    finally:
        if prom:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
        check(rc == 0, f"hpd exits 0 on SIGTERM (got {rc})")
        if FAILS:
            with open(os.path.join(state, "hpd.log")) as f:
                sys.stderr.write("---- hpd log (tail) ----\n" + "".join(f.readlines()[-40:]))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAILS)} failure(s)" if FAILS else "all passed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
