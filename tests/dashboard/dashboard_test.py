#!/usr/bin/python3
"""tests/dashboard/dashboard_test.py — the live dashboard (share/hp/dashboard/) in a real
browser against a real hpd: headless Chromium loads http://HTTP/#job=ID from hpd's own HTTP
server and the test reads what the page rendered.

It starts hpd on 127.0.0.1 (port 0 for gRPC, workers and --http) with a temp state dir and
--slots 2, parses the "hpd listening grpc=... http=HOST:PORT" line, submits a small 2-rank
job with the real hpctl, and waits through the JSON API until the job has several steps of
metrics. Then:
  1. live: chromium --dump-dom; the #jobs table has the job's row with a [data-field=state]
     cell showing a state the API reported around the dump, the row is selected, the page
     says data-ready="1" with no error in its status line, and #loss-chart has
     data-loss-points >= the steps seen before the dump and data-last-step within the steps
     seen before/after it, with exactly one plotted point per step up to it;
  2. finished: after the job SUCCEEDED, the row shows SUCCEEDED and the loss chart has one
     point per step of the job with data-last-step = its last step;
  3. a screenshot (1280x900) saved as a test artifact, BUILD/test-artifacts/dashboard.png,
     checked to be a PNG of that size.
With --auth, hpd runs with --auth all: the API without the header is 401, and the live page
is loaded as http://HTTP/#token=T&job=ID (the token in the fragment, never sent in a URL);
only the live checks run.
hpd (and every Chromium this test started) is stopped on every path.

Run by tests/dashboard/test_dashboard.c with /usr/bin/python3. Exit 0: all passed; 1: a check
failed; 2: usage; 77: skipped (chromium not installed).

  dashboard_test.py --hpd BUILD/daemon/hpd --hpctl BUILD/client/hpctl --artifacts DIR
"""
import argparse
import html.parser
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

FAILS = []
STEPS = 200  # ~40 ms a step (release): seen running by the first dump, done in ~10 s
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--virtual-time-budget=8000"]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


class Fatal(Exception):
    """A failure after which nothing else can be checked."""


# ---- hpd -------------------------------------------------------------------------------------

AUTH = {}  # --auth: {"token": T}; every API GET sends it as a bearer header


def start_hpd(hpd, state_dir, extra=()):
    p = subprocess.Popen([hpd, "--listen", "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                          "--http", "127.0.0.1:0", "--state-dir", state_dir, "--slots", "2",
                          *extra],
                         stdout=subprocess.PIPE, stderr=None, text=True)
    seen = []
    deadline = time.time() + 30
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("hpd listening"):
                f = dict(t.split("=", 1) for t in line.split() if "=" in t)
                if not f.get("grpc") or not f.get("http") or f["http"] == "off":
                    stop_hpd(p)
                    raise Fatal("hpd's listening line has no grpc=/http= address: " + line)
                return p, f["grpc"], f["http"]
        if p.poll() is not None:
            break
    stop_hpd(p)
    raise Fatal("hpd did not print its 'hpd listening ... http=...' line; got: %r" % seen)


def stop_hpd(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            check(False, "hpd exits within 30 s of SIGTERM")
    if p.stdout:
        p.stdout.close()
    return p.returncode


# ---- the JSON API ----------------------------------------------------------------------------

def get(base, path, timeout=10, auth=True):
    req = urllib.request.Request(base + path)
    if auth and AUTH:
        req.add_header("Authorization", "Bearer " + AUTH["token"])
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def api(base, path):
    try:
        _, _, body = get(base, path)
    except urllib.error.HTTPError as e:
        raise Fatal("GET %s: HTTP %d %s" % (path, e.code, e.read()[:300]))
    return json.loads(body)


def loss_steps(base, job_id):
    """The steps with a loss in the lowest rank's records (what the page plots)."""
    recs, since = [], 0
    for _ in range(1000):
        j = api(base, "/api/v1/jobs/%s/metrics?since=%d" % (job_id, since))
        recs += j.get("records", [])
        if not j.get("more") or j.get("next_since", since) <= since:
            break
        since = j["next_since"]
    ranks = sorted({r["rank"] for r in recs if isinstance(r.get("loss"), (int, float))})
    if not ranks:
        return []
    return sorted({r["step"] for r in recs if r["rank"] == ranks[0]
                   and isinstance(r.get("loss"), (int, float))})


def job_state(base, job_id):
    return api(base, "/api/v1/jobs/" + job_id)["job"]["state"]


# ---- Chromium --------------------------------------------------------------------------------

def chromium(exe, profile, args, timeout=120):
    """Runs headless Chromium in its own process group; kills that group on a timeout."""
    cmd = [exe, *CHROMIUM_FLAGS, "--user-data-dir=" + profile, *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise Fatal("chromium did not finish in %d s: %s" % (timeout, " ".join(cmd)))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if p.returncode != 0:
        raise Fatal("chromium exit %d: %s\n%s" % (p.returncode, " ".join(cmd),
                                                  err.decode(errors="replace")[-2000:]))
    return out.decode(errors="replace")


class Dom(html.parser.HTMLParser):
    """What the test reads from a dumped DOM: body's attributes, #status, the #jobs rows (with
    their [data-field=state] text) and #loss-chart's attributes."""

    def __init__(self):
        super().__init__()
        self.body, self.loss, self.status_attrs = {}, None, None
        self.status_text, self.rows = "", {}
        self._stack = []   # (tag, what) for text capture
        self._row = None   # the job id of the <tr> being read
        self._in_jobs = False

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        what = None
        if tag == "body":
            self.body = a
        elif tag == "table" and a.get("id") == "jobs":
            self._in_jobs = True
        elif tag == "tr" and self._in_jobs and "data-job-id" in a:
            self._row = a["data-job-id"]
            self.rows[self._row] = {"class": a.get("class", ""), "state": ""}
        elif tag == "td" and self._row and a.get("data-field") == "state":
            what = "state"
        elif a.get("id") == "status":
            self.status_attrs, what = a, "status"
        elif tag == "canvas" and a.get("id") == "loss-chart":
            self.loss = a
        if tag not in ("br", "img", "input", "meta", "link", "canvas", "col", "hr", "source"):
            self._stack.append((tag, what))

    def handle_endtag(self, tag):
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break
        if tag == "tr":
            self._row = None
        elif tag == "table":
            self._in_jobs = False

    def handle_data(self, data):
        whats = [w for _, w in self._stack if w]
        if not whats:
            return
        if whats[-1] == "state" and self._row:
            self.rows[self._row]["state"] += data.strip()
        elif whats[-1] == "status":
            self.status_text += data


def dump(exe, profile, url):
    d = Dom()
    d.feed(chromium(exe, profile, ["--dump-dom", url]))
    return d


def int_attr(attrs, name):
    try:
        return int((attrs or {}).get(name, ""))
    except ValueError:
        return None


def check_page(d, job_id, what):
    check(d.body.get("data-ready") == "1", what + ": body has data-ready=\"1\"")
    check(d.status_attrs is not None and "error" not in d.status_attrs.get("class", "").split(),
          what + ": no error in the status line (%r)" % d.status_text.strip())
    check(job_id in d.rows, what + ": #jobs has tr[data-job-id=%s] (rows: %s)"
          % (job_id, sorted(d.rows)))
    check(d.loss is not None, what + ": the page has canvas#loss-chart")


# ---- main ------------------------------------------------------------------------------------

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    raise Fatal("timed out after %d s waiting for %s" % (timeout, what))


def run(a, exe, tmp):
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    job_path = os.path.join(tmp, "job.pb")
    subprocess.run([a.hpctl, "new", "--model", "llama3:debugmodel", "--dim", "128", "--layers",
                    "2", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "256", "--vocab",
                    "512", "--batch", "8", "--seq", "128", "--steps", str(STEPS),
                    "--log-interval", "1", "--mesh", "dp=2", "--fsdp", "layers.*",
                    "--name", "dash-test", "-o", job_path], check=True,
                   stdout=subprocess.DEVNULL)
    proc, grpc_addr, http_addr = start_hpd(a.hpd, state, ("--auth", "all") if a.auth else ())
    try:
        base = "http://" + http_addr
        if a.auth:
            with open(os.path.join(state, "token")) as f:
                AUTH["token"] = f.read().strip()
            for p in ("/api/v1/jobs", "/metrics", "/api/v1/jobs?token=" + AUTH["token"]):
                try:
                    st = get(base, p, auth=False)[0]
                except urllib.error.HTTPError as e:
                    st = e.code
                shown = p.split("?")[0] + ("?token=..." if "?" in p else "")
                check(st in (400, 401), "--auth all: GET %s without the header: %d (want 401, "
                      "or 400 for a token in the query)" % (shown, st))
        env = dict(os.environ, HP_SERVER=grpc_addr, HP_STATE_DIR=state)
        env.pop("HP_TOKEN", None)
        out = subprocess.run([a.hpctl, "submit", job_path], env=env, check=True,
                             stdout=subprocess.PIPE, text=True, timeout=60).stdout
        job_id = out.splitlines()[0].strip() if out.strip() else ""
        if not check(job_id.startswith("j-"), "hpctl submit printed a job id (%r)" % out):
            raise Fatal("no job id")

        # The page and Chart.js are served (else every later check fails for a plain reason).
        st, ctype, body = get(base, "/")
        check(st == 200 and b'id="loss-chart"' in body and "html" in ctype,
              "GET / serves the dashboard (%d %s)" % (st, ctype))
        st, _, body = get(base, "/static/chart.min.js")
        check(st == 200 and len(body) > 100000, "GET /static/chart.min.js serves Chart.js")

        # 1. live: several steps of metrics, then the page while the job runs. The API reads a
        # snapshot at most 250 ms old, so a job just submitted may be a 404 for that long.
        def enough_steps():
            try:
                s = loss_steps(base, job_id)
            except Fatal:
                return None
            return s if len(s) >= 5 else None
        before = wait_for(enough_steps, 240, "5 steps of metrics from /api/v1/jobs/%s/metrics"
                          % job_id)
        state_before = job_state(base, job_id)
        url = base + "/#job=" + job_id
        if a.auth:  # the token in the fragment: the browser never sends it
            url = base + "/#token=" + AUTH["token"] + "&job=" + job_id
        profile = os.path.join(tmp, "chromium")
        d = dump(exe, profile, url)
        after = loss_steps(base, job_id)
        state_after = job_state(base, job_id)
        check_page(d, job_id, "live")
        row = d.rows.get(job_id, {})
        check(row.get("state") in (state_before, state_after),
              "live: the row's state %r is the API's (%s before the dump, %s after)"
              % (row.get("state"), state_before, state_after))
        check("selected" in row.get("class", "").split(), "live: the #job= row is selected")
        if a.auth:  # what --auth adds is checked: the page read the API with the fragment token
            return
        pts, last = int_attr(d.loss, "data-loss-points"), int_attr(d.loss, "data-last-step")
        check(pts is not None and pts >= len(before),
              "live: data-loss-points %r >= %d steps seen before the dump" % (pts, len(before)))
        check(last is not None and before[-1] <= last <= after[-1],
              "live: data-last-step %r within the API's last step before (%d) and after (%d)"
              % (last, before[-1], after[-1]))
        if last is not None:
            want = len([s for s in after if s <= last])
            check(pts == want, "live: one loss point per step up to %d (%r, want %d)"
                  % (last, pts, want))

        # 2. finished: every step plotted, the last one the job's last.
        wait_for(lambda: job_state(base, job_id) in ("SUCCEEDED", "FAILED", "CANCELLED"), 300,
                 "the job to finish")
        final = job_state(base, job_id)
        check(final == "SUCCEEDED", "the job SUCCEEDED (%s)" % final)
        steps = loss_steps(base, job_id)
        d = dump(exe, profile, url)
        check_page(d, job_id, "finished")
        check(d.rows.get(job_id, {}).get("state") == final,
              "finished: the row's state is %s (%r)" % (final, d.rows.get(job_id, {}).get("state")))
        pts, last = int_attr(d.loss, "data-loss-points"), int_attr(d.loss, "data-last-step")
        check(pts == len(steps), "finished: data-loss-points %r = %d steps" % (pts, len(steps)))
        check(bool(steps) and last == steps[-1],
              "finished: data-last-step %r = the last step %s" % (last, steps[-1:]))

        # 3. the screenshot, kept as an artifact.
        os.makedirs(a.artifacts, exist_ok=True)
        shot = os.path.join(a.artifacts, "dashboard.png")
        if os.path.exists(shot):
            os.unlink(shot)
        chromium(exe, profile, ["--screenshot=" + shot, "--window-size=1280,900", url])
        size = png_size(shot) if os.path.exists(shot) else None
        check(size == (1280, 900) and os.path.getsize(shot) > 10000,
              "screenshot %s is a non-empty 1280x900 PNG (%s, %d bytes)"
              % (shot, size, os.path.getsize(shot) if os.path.exists(shot) else 0))
    finally:
        rc = stop_hpd(proc)
        check(rc == 0, "hpd exits 0 on SIGTERM (got %s)" % rc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    ap.add_argument("--artifacts", required=True, help="where dashboard.png goes")
    ap.add_argument("--auth", action="store_true",
                    help="hpd --auth all: the page gets the token from #token=, the live "
                    "checks only")
    a = ap.parse_args()
    exe = shutil.which("chromium")
    if not exe:
        print("SKIP: chromium is not installed (scripts/install-deps.sh installs it)")
        return 77
    # ctest's timeout sends SIGTERM: turn it into an exception so hpd is still stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("dashboard_test.py: terminated"))
    tmp = tempfile.mkdtemp(prefix="hp-dashboard-")
    try:
        run(a, exe, tmp)
    except Fatal as e:
        check(False, str(e))
    except subprocess.CalledProcessError as e:
        check(False, "%s exited %d" % (" ".join(map(str, e.cmd)), e.returncode))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS), file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
