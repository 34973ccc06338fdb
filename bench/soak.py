#!/usr/bin/python3
"""bench/soak.py — hpd under churn (run by bench/soak.sh; see there for the flags).

One hpd (local launcher, fixed ports so that clients reconnect across restarts) on a temp state
dir. For the chaos phase (--minutes, at most 10): a burst of submits every --burst-s seconds,
50 WatchJob streams (each follows a random job to its end, or to a restart of hpd, then
takes another), one hp-worker SIGKILLed every 30 s (the job restarts from its last
checkpoint), and hpd itself SIGKILLed and restarted every 2 minutes (recovery restarts its jobs).
Then a drain: no more chaos, until every job is final (bounded). At the end, read from the store
(hpd.db, after hpd stopped): every job is final and SUCCEEDED, and for every job and rank the
metrics hold each step 1..total exactly once, nothing outside. hpd's RSS is sampled every
second; per hpd incarnation the RSS after warm-up (the first 20 s) and at its end is printed.
Exit 0: every check held; 1: one did not.
"""
import argparse
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "daemon"))
from grpc_client import Msgs  # noqa: E402
import grpc  # noqa: E402

SVC = "/hp.v1.Coordinator/"
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def children(pid, name):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            comm = st[st.index("(") + 1:st.rindex(")")]
            ppid = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid and comm == name:
            out.append(int(d))
    return out


class Soak:
    def __init__(self, a):
        self.a = a
        self.M = Msgs(a.desc)
        self.tmp = tempfile.mkdtemp(prefix="hp-soak-")
        self.state = os.path.join(self.tmp, "state")
        os.mkdir(self.state)
        self.gport, self.hport = free_port(), free_port()
        self.addr = f"127.0.0.1:{self.gport}"
        self.proc = None
        self.lock = threading.Lock()
        self.jobs = []
        self.stop = threading.Event()
        self.incarnations = []  # [start time, [(t, rss)]]
        self.counts = {"submits": 0, "worker_kills": 0, "hpd_restarts": 0, "watch_events": 0,
                       "watch_reconnects": 0, "submit_errors": 0}
        self.log = open(os.path.join(self.tmp, "hpd.log"), "a")
        self.job_pb = os.path.join(self.tmp, "job.pb")
        subprocess.run([a.hpctl, "new", "--model", "llama3:debugmodel", "--dim", "32",
                        "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn-hidden", "64",
                        "--vocab", "128", "--batch", "2", "--seq", "16", "--steps",
                        str(a.steps), "--log-interval", "1", "--checkpoint-interval", "5",
                        "--max-restarts", "1000", "--name", "soak", "-o", self.job_pb],
                       check=True, stdout=subprocess.DEVNULL)
        with open(self.job_pb, "rb") as f:
            self.job = self.M.Job.FromString(f.read())

    def start_hpd(self):
        self.proc = subprocess.Popen(
            [self.a.hpd, "--listen", self.addr, "--worker-listen", "127.0.0.1:0", "--http",
             f"127.0.0.1:{self.hport}", "--state-dir", self.state, "--slots", str(self.a.slots)],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("hpd listening"):
            raise RuntimeError(f"hpd did not start: {line!r}")
        with open(os.path.join(self.state, "token")) as f:
            self.token = f.read().strip()
        self.incarnations.append([time.time(), []])

    def kill_hpd(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()

    def chan(self):
        return grpc.insecure_channel(self.addr, options=[("grpc.enable_http_proxy", 0)])

    def submit_burst(self, ch):
        for _ in range(self.a.burst):
            try:
                r = self.M.SubmitJobResponse.FromString(ch.unary_unary(SVC + "SubmitJob")(
                    self.M.SubmitJobRequest(job=self.job).SerializeToString(),
                    metadata=[("authorization", "Bearer " + self.token)], timeout=30))
                with self.lock:
                    self.jobs.append(r.job.id)
                    self.counts["submits"] += 1
            except grpc.RpcError:
                with self.lock:
                    self.counts["submit_errors"] += 1

    def watcher(self, i):
        rnd = random.Random(i)
        ch = self.chan()
        while not self.stop.is_set():
            with self.lock:
                jid = rnd.choice(self.jobs) if self.jobs else None
            if not jid:
                time.sleep(0.2)
                continue
            try:
                for raw in ch.unary_stream(SVC + "WatchJob")(
                        self.M.WatchJobRequest(job_id=jid, batch=True)
                        .SerializeToString(), timeout=60):
                    ev = self.M.JobEvent.FromString(raw)
                    evs = ev.batch.events if ev.WhichOneof("event") == "batch" else [ev]
                    with self.lock:
                        self.counts["watch_events"] += len(evs)
                    if self.stop.is_set():
                        break
            except grpc.RpcError:
                with self.lock:
                    self.counts["watch_reconnects"] += 1
                time.sleep(0.2)
        ch.close()

    def sampler(self):
        while not self.stop.is_set():
            p = self.proc
            r = rss_kb(p.pid) if p else None
            if r:
                self.incarnations[-1][1].append((time.time(), r))
            time.sleep(1)

    def states(self, ch):
        out, tok = {}, ""
        while True:
            r = self.M.ListJobsResponse.FromString(ch.unary_unary(SVC + "ListJobs")(
                self.M.ListJobsRequest(page_size=1000, page_token=tok).SerializeToString(),
                timeout=30))
            for j in r.jobs:
                out[j.id] = self.M.pool.FindEnumTypeByName("hp.v1.JobState").values_by_number[
                    j.state].name.replace("JOB_STATE_", "")
            tok = r.next_page_token
            if not tok:
                return out

    def run(self):
        a = self.a
        t0 = time.time()
        self.start_hpd()
        threads = [threading.Thread(target=self.sampler, daemon=True)]
        threads += [threading.Thread(target=self.watcher, args=(i,), daemon=True)
                    for i in range(a.watchers)]
        for t in threads:
            t.start()
        ch = self.chan()
        end = t0 + a.minutes * 60
        next_burst, next_kill, next_restart = t0, t0 + 30, t0 + 120
        while time.time() < end:
            now = time.time()
            if now >= next_burst:
                self.submit_burst(ch)
                next_burst = now + a.burst_s
            if now >= next_kill:  # due: the next running worker found (none between jobs)
                ws = children(self.proc.pid, "hp-worker")
                if ws:
                    os.kill(random.choice(ws), signal.SIGKILL)
                    self.counts["worker_kills"] += 1
                    next_kill = now + 30
            if now >= next_restart:
                self.kill_hpd()
                ch.close()
                self.start_hpd()
                ch = self.chan()
                self.counts["hpd_restarts"] += 1
                next_restart = now + 120
            time.sleep(0.05)
        chaos_s = time.time() - t0
        # Drain: no chaos; wait for every job to be final.
        deadline = time.time() + a.drain_s
        st = {}
        while time.time() < deadline:
            try:
                st = self.states(ch)
            except grpc.RpcError:
                st = {}
            if st and all(v in FINAL for v in st.values()):
                break
            time.sleep(1)
        drain_s = time.time() - t0 - chaos_s
        self.stop.set()
        ch.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill_hpd()
        return self.report(chaos_s, drain_s)

    def report(self, chaos_s, drain_s):
        ok = True

        def check(c, what):
            nonlocal ok
            print(("ok   " if c else "FAIL ") + what, flush=True)
            ok = ok and c

        db = sqlite3.connect(os.path.join(self.state, "hpd.db"))
        rows = db.execute("SELECT id, state, step, total_steps, world, restarts FROM jobs"
                          " ORDER BY seq").fetchall()
        enum = self.M.pool.FindEnumTypeByName("hp.v1.JobState").values_by_number
        names = {r[0]: enum[r[1]].name.replace("JOB_STATE_", "") for r in rows}
        final = sum(1 for v in names.values() if v in FINAL)
        succeeded = sum(1 for v in names.values() if v == "SUCCEEDED")
        restarts = sum(r[5] for r in rows)
        records, bad = 0, []
        for jid, _, _, total, world, _ in rows:
            for rank in range(world):
                steps = [s for (s,) in db.execute(
                    "SELECT step FROM metrics WHERE job_id = ? AND rank = ? ORDER BY step",
                    (jid, rank))]
                records += len(steps)
                if names[jid] == "SUCCEEDED" and steps != list(range(1, total + 1)):
                    missing = sorted(set(range(1, total + 1)) - set(steps))
                    extra = [s for s in steps if s < 1 or s > total]
                    dup = len(steps) - len(set(steps))
                    bad.append(f"{jid} rank {rank}: {len(steps)} steps of {total} (missing "
                               f"{missing[:5]}, outside {extra[:5]}, duplicates {dup})")
        db.close()
        print(f"figure soak: {chaos_s / 60:.1f} min of churn + {drain_s:.0f} s drain; "
              f"{len(rows)} jobs ({succeeded} SUCCEEDED, {final} final), "
              f"{self.counts['submits']} submits ({self.counts['submit_errors']} refused while "
              f"hpd restarted), {self.counts['worker_kills']} workers SIGKILLed, "
              f"{self.counts['hpd_restarts']} hpd SIGKILL+restarts, {restarts} job restarts, "
              f"{self.a.watchers} watch streams ({self.counts['watch_events']} events, "
              f"{self.counts['watch_reconnects']} reconnects), {records} metrics records checked")
        for i, (start, samples) in enumerate(self.incarnations):
            warm = [r for t, r in samples if t - start >= 20]
            if not warm:
                print(f"figure hpd #{i}: {len(samples)} s, no sample after the 20 s warm-up")
                continue
            print(f"figure hpd #{i}: RSS {warm[0] / 1024:.1f} MiB after warm-up, "
                  f"{warm[-1] / 1024:.1f} MiB at its end, peak {max(warm) / 1024:.1f} MiB "
                  f"({(warm[-1] - warm[0]) * 100 / warm[0]:+.1f}% over {len(warm)} s)")
        check(len(rows) > 0, f"jobs were submitted ({len(rows)})")
        check(final == len(rows), f"every job is final ({final} of {len(rows)})")
        check(succeeded == len(rows), f"every job SUCCEEDED ({succeeded} of {len(rows)}: "
              f"{sorted(set(names.values()))})")
        check(not bad, "every step of every SUCCEEDED job is in the store exactly once"
              + ("" if not bad else ": " + "; ".join(bad[:5])))
        return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    ap.add_argument("--desc", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--watchers", type=int, default=50)
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--burst-s", type=float, default=20)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--drain-s", type=float, default=300)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if not 0 < a.minutes <= 10:
        print("soak: --minutes must be in (0, 10]", file=sys.stderr)
        return 2
    s = Soak(a)
    try:
        ok = s.run()
    finally:
        if s.proc and s.proc.poll() is None:
            s.kill_hpd()
        for pid in children(os.getpid(), "hp-worker"):
            os.kill(pid, signal.SIGKILL)
        if not a.keep:
            shutil.rmtree(s.tmp, ignore_errors=True)
        else:
            print(f"kept {s.tmp}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
