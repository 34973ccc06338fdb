#!/usr/bin/python3
"""tests/daemon/restart_test.py — hpd SIGKILLed and restarted under a running job (issue #14).

A real hpd (local launcher, so real hp-worker ranks) on 127.0.0.1 port 0 with a temp state dir,
one case:
  restart  a world-2 FSDP job logging every step: hpd is SIGKILLed while the ranks train and
           started again on the same state dir, --kills times; the job must end SUCCEEDED and
           the store (read back through WatchJob from step 1) must hold every step 1..N of
           every rank exactly once, nothing outside. Before the fix the ranks that lost hpd
           checkpointed the step they were on, whose metrics never reached the store, and the
           next attempt resumed after it: steps went missing. Rank 0's metrics.jsonl in the
           run dir holds each step once too.
  full     the disk is full under a real hpd (HPD_STORE_MAX_PAGES caps its store at the pages it
           has): SubmitJob answers RESOURCE_EXHAUSTED naming the database file, twice, hpd
           keeps serving every job as it was, and after a restart (room again) every job is
           as it was and a submit is taken.
Every wait is on a condition with a deadline. Exit 0: passed; 1: a check failed.

  restart_test.py --hpd BUILD/daemon/hpd --hpctl BUILD/client/hpctl --desc BUILD/proto/hp.desc
                  --case restart
"""
import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_client import FAILS, Msgs, check, flatten, unary  # noqa: E402
from harden_test import start_hpd  # noqa: E402
import grpc  # noqa: E402

SVC = "/hp.v1.Coordinator/"


class Hpd:
    """One hpd incarnation after another on the same state dir."""

    def __init__(self, a, state, log):
        self.a, self.state, self.log = a, state, log
        self.proc = self.chan = None

    def start(self, extra=()):
        self.proc, self.kv = start_hpd(self.a.hpd, self.state, extra, stderr=self.log)
        with open(os.path.join(self.state, "token")) as f:
            self.token = f.read().strip()
        self.chan = grpc.insecure_channel(self.kv["grpc"], options=[("grpc.enable_http_proxy", 0)])
        grpc.channel_ready_future(self.chan).result(timeout=10)

    def kill(self):
        self.chan.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()

    def stop(self):
        if not self.proc or self.proc.poll() is not None:
            return
        self.chan.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()

    def job(self, M, jid):
        return M.GetJobResponse.FromString(unary(self.chan, "GetJob", M.GetJobRequest(
            job_id=jid).SerializeToString(), token=self.token)).job


def wait_for(what, cond, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    check(False, f"{what} within {timeout_s} s")
    return None


def stored_records(M, h, jid):
    """(step, rank) of every metrics record in the store: WatchJob replays them from step 1."""
    raws = h.chan.unary_stream(SVC + "WatchJob")(
        M.WatchJobRequest(job_id=jid, from_step=1).SerializeToString(),
        metadata=[("authorization", "Bearer " + h.token)], timeout=60)
    evs, _, _ = flatten(M, raws)
    return [(e.metrics.step, e.metrics.rank) for e in evs if e.WhichOneof("event") == "metrics"]


def check_every_step_once(recs, steps, world, what):
    want = {(s, r) for s in range(1, steps + 1) for r in range(world)}
    seen = {}
    for k in recs:
        seen[k] = seen.get(k, 0) + 1
    missing = sorted(want - set(seen))
    extra = sorted(set(seen) - want)
    dup = sorted(k for k, n in seen.items() if n > 1)
    check(not missing and not extra and not dup,
          f"{what}: {len(recs)} records, every (step, rank) of {steps} x {world} exactly once "
          f"(missing {missing[:20]}{'...' if len(missing) > 20 else ''}, outside {extra[:10]}, "
          f"repeated {dup[:10]})")


def case_restart(a, M, tmp, state, log):
    steps, world = a.steps, 2
    job_pb = os.path.join(tmp, "job.pb")
    subprocess.run([a.hpctl, "new", "--model", "llama3:debugmodel", "--dim", "32", "--layers", "1",
                    "--heads", "2", "--kv-heads", "1", "--ffn-hidden", "64", "--vocab", "128",
                    "--batch", "2", "--seq", "16", "--steps", str(steps), "--log-interval", "1",
                    "--checkpoint-interval", "5", "--max-restarts", "100", "--fsdp", "layers.*",
                    "--mesh", "dp=2", "--name", "restart", "-o", job_pb],
                   check=True, stdout=subprocess.DEVNULL)
    with open(job_pb, "rb") as f:
        job = M.Job.FromString(f.read())
    h = Hpd(a, state, log)
    h.start()
    try:
        jid = M.SubmitJobResponse.FromString(unary(h.chan, "SubmitJob", M.SubmitJobRequest(
            job=job).SerializeToString(), token=h.token)).job.id
        running = M.state("RUNNING")
        last = 0
        for k in range(a.kills):
            # a few steps into this attempt, the ranks training: kill hpd under them
            j = wait_for(f"kill {k + 1}: job {jid} RUNNING past step {last + 3}",
                         lambda: (lambda j: j if j.state == running and j.step >= last + 3
                                  else None)(h.job(M, jid)), 120)
            if not j:
                return
            check(j.step < steps, f"kill {k + 1} at step {j.step} of {steps} (before the end)")
            last = j.step
            h.kill()
            h.start()
        final = wait_for(f"job {jid} final", lambda: (lambda j: j if j.state in (
            M.state("SUCCEEDED"), M.state("FAILED"), M.state("CANCELLED")) else None)(
                h.job(M, jid)), 300)
        if not final:
            return
        check(final.state == M.state("SUCCEEDED"),
              f"job {jid} SUCCEEDED after {a.kills} hpd kills (state {final.state}, restarts "
              f"{final.restarts}, error {final.error!r})")
        check(final.step == steps, f"the job's step {final.step} == {steps}")
        check_every_step_once(stored_records(M, h, jid), steps, world, "the store after the run")
        # rank 0's metrics.jsonl in the run dir: a resume drops the records after its step
        with open(os.path.join(state, "jobs", jid, "run", "metrics.jsonl")) as f:
            recs = [(json.loads(line)["step"], 0) for line in f]
        check_every_step_once(recs, steps, 1, "the run dir's metrics.jsonl")
        bounded = 0
        for root, _, files in os.walk(os.path.join(state, "jobs", jid)):
            for name in files:
                if name.startswith("rank-") and name.endswith(".log"):
                    with open(os.path.join(root, name), errors="replace") as f:
                        bounded += sum("the coordinator's store has no record" in ln for ln in f)
        print(f"info {bounded} rank resume(s) below the newest checkpoint (the bound at work)")
        # and once more from a fresh hpd: what was stored is what a restart finds
        h.stop()
        h.start()
        check_every_step_once(stored_records(M, h, jid), steps, world, "the store after a restart")
    finally:
        h.stop()


def snapshot(M, h):
    r = M.ListJobsResponse.FromString(unary(h.chan, "ListJobs", M.ListJobsRequest(
        page_size=1000).SerializeToString(), token=h.token))
    return sorted((j.id, j.name, j.state, j.step, j.total_steps, j.restarts, j.error)
                  for j in r.jobs)


def case_full(a, M, tmp, state, log):
    job_pb = os.path.join(tmp, "job.pb")
    subprocess.run([a.hpctl, "new", "--model", "llama3:debugmodel", "--dim", "32", "--layers", "2",
                    "--heads", "2", "--kv-heads", "1", "--ffn-hidden", "64", "--vocab", "128",
                    "--batch", "2", "--seq", "16", "--steps", "4", "--name", "full", "-o", job_pb],
                   check=True, stdout=subprocess.DEVNULL)
    with open(job_pb, "rb") as f:
        job = M.Job.FromString(f.read())
    check(job.ByteSize() > 8192, f"the job ({job.ByteSize()} bytes) needs new pages to store")
    submit = M.SubmitJobRequest(job=job).SerializeToString()
    h = Hpd(a, state, log)
    h.start()
    db = os.path.join(state, "hpd.db")
    try:
        done = unary(h.chan, "SubmitJob", submit, token=h.token)
        jid = M.SubmitJobResponse.FromString(done).job.id
        final = (M.state("SUCCEEDED"), M.state("FAILED"), M.state("CANCELLED"))
        j = wait_for(f"job {jid} final", lambda: (lambda j: j if j.state in final else None)(
            h.job(M, jid)), 120)
        check(j is not None and j.state == M.state("SUCCEEDED"), f"job {jid} SUCCEEDED")
        before = snapshot(M, h)
        h.stop()  # a clean exit checkpoints the WAL into hpd.db: its page count is the store's
        con = sqlite3.connect(db)
        con.execute("VACUUM")  # no free page left: a new row's overflow pages must grow the file
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.close()
        # the disk is full: the store may not grow by a page
        os.environ["HPD_STORE_MAX_PAGES"] = str(pages)
        try:
            h.start()
        finally:
            del os.environ["HPD_STORE_MAX_PAGES"]
        for k in range(2):
            try:
                unary(h.chan, "SubmitJob", submit, token=h.token)
                check(False, f"submit {k + 1} on a full store: succeeded, want RESOURCE_EXHAUSTED")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and db in (e.details() or ""),
                      f"submit {k + 1} on a full store: {e.code()} {e.details()!r} (want "
                      f"RESOURCE_EXHAUSTED naming {db})")
        check(h.proc.poll() is None, "hpd still runs after refusing what it cannot store")
        check(snapshot(M, h) == before, "hpd still serves: ListJobs lists every job as it was")
        check(h.job(M, jid).state == M.state("SUCCEEDED"), f"GetJob {jid}: still SUCCEEDED")
        h.kill()
        h.start()  # room again
        check(snapshot(M, h) == before, "after a restart every job is as it was (none half-added)")
        nid = M.SubmitJobResponse.FromString(unary(h.chan, "SubmitJob", submit,
                                                   token=h.token)).job.id
        check(nid != jid, f"with room again a submit is taken ({nid})")
        h.stop()
        bad = subprocess.run([a.hpd, "--listen", "127.0.0.1:0", "--http", "off", "--worker-listen",
                              "127.0.0.1:0", "--state-dir", state],
                             env=dict(os.environ, HPD_STORE_MAX_PAGES="12x"),
                             capture_output=True, text=True, timeout=60)
        check(bad.returncode != 0 and "HPD_STORE_MAX_PAGES '12x'" in bad.stderr,
              f"a bad HPD_STORE_MAX_PAGES is refused naming it (exit {bad.returncode}: "
              f"{bad.stderr.strip()[-200:]!r})")
    finally:
        h.stop()


CASES = {"restart": case_restart, "full": case_full}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    ap.add_argument("--desc", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kills", type=int, default=3)
    a = ap.parse_args()
    M = Msgs(a.desc)
    tmp = tempfile.mkdtemp(prefix="hp-restart-")
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    log = open(os.path.join(tmp, "hpd.log"), "w")
    try:
        CASES[a.case](a, M, tmp, state, log)
    finally:
        log.close()
        if FAILS:
            with open(os.path.join(tmp, "hpd.log")) as f:
                sys.stderr.write(f.read()[-20000:])
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
