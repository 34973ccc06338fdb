#!/usr/bin/python3
"""bench/bench_launch_slurm.py — submit -> first step through hpd --launcher slurm, and its peer
hpd --launcher local, in one run.

Starts a real single-node Slurm cluster on 127.0.0.1 (tests/daemon/slurm_cluster.sh: munged,
slurmctld, slurmd; root and Debian's Slurm packages needed), two real hpd (BUILD/daemon/hpd,
one per launcher, ports 0, temp state dirs), writes a world-2 FSDP llama3:debugmodel job with
hpctl (--batch 2 --seq 128 --steps 3 --log-interval 1) and REPEAT times, interleaved: SubmitJob
over gRPC, WatchJob(from_step=1), the time from the SubmitJob call to the first StepMetrics
event. Each job runs to SUCCEEDED before the next submit. Slurm's breakdown from hpd's log:
  sbatch     launched -> launch_ref (sbatch's answer: the job is queued)
  schedule   launch_ref -> first worker_hello (slurmctld schedules it, slurmd starts the
             batch script, srun starts the step and its tasks, hp-worker connects)
  to step 1  first hello -> the first StepMetrics on the client
usage: /usr/bin/python3 bench/bench_launch_slurm.py [--build DIR] [--repeat N]
"""
import argparse
import datetime
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SVC = "/hp.v1.Coordinator/"

try:
    import grpc
except ImportError as e:
    print(f"bench_launch_slurm: python3-grpcio missing ({e})", file=sys.stderr)
    sys.exit(1)
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from grpc_client import Msgs  # noqa: E402

LOG_RE = re.compile(r"^time=(\S+)Z level=\S+ (.*)$")


def start_hpd(hpd, state, log, launcher):
    p = subprocess.Popen([hpd, "--listen", "127.0.0.1:0", "--http", "off", "--worker-listen",
                          "127.0.0.1:0", "--state-dir", state, "--slots", "2", "--launcher",
                          launcher, "--slurm-poll-ms", "200"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if line.startswith("hpd listening"):
                return p, line.split("grpc=")[1].split()[0]
        if p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("hpd did not start")


def log_times(path, jid):
    out = {}
    with open(path) as f:
        for line in f:
            m = LOG_RE.match(line.strip())
            if not m or f"job={jid} " not in m.group(2) + " ":
                continue
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            body = m.group(2)
            for key, pre in (("launched", "event=launched"), ("ref", "event=launch_ref"),
                             ("hello", "event=worker_hello")):
                if body.startswith(pre) and key not in out:
                    out[key] = t
    return out


def run_once(chan, M, token, job_bytes, log_path):
    req = M.SubmitJobRequest(job=M.Job.FromString(job_bytes)).SerializeToString()
    t0 = time.time()
    resp = M.SubmitJobResponse.FromString(chan.unary_unary(SVC + "SubmitJob")(
        req, metadata=[("authorization", "Bearer " + token)], timeout=30))
    jid = resp.job.id
    first, last = None, None
    for raw in chan.unary_stream(SVC + "WatchJob")(
            M.WatchJobRequest(job_id=jid, from_step=1).SerializeToString(), timeout=300):
        ev = M.JobEvent.FromString(raw)
        kind = ev.WhichOneof("event")
        if kind == "metrics" and first is None:
            first = time.time()
        elif kind == "state":
            last = ev.state
    if first is None or last != M.state("SUCCEEDED"):
        raise RuntimeError(f"job {jid}: not SUCCEEDED ({last})")
    r = {"total": first - t0}
    lt = log_times(log_path, jid)
    if all(k in lt for k in ("launched", "ref", "hello")):
        r["sbatch"] = lt["ref"] - lt["launched"]
        r["schedule"] = lt["hello"] - lt["ref"]
        r["to_step1"] = first - lt["hello"]
    return r


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    cluster = os.path.join(ROOT, "tests", "daemon", "slurm_cluster.sh")
    chk = subprocess.run([cluster, "check"], capture_output=True, text=True)
    if chk.returncode != 0:
        print("bench_launch_slurm: no Slurm here: " + chk.stdout.strip(), file=sys.stderr)
        return 1
    hpd = os.path.join(a.build, "daemon", "hpd")
    hpctl = os.path.join(a.build, "client", "hpctl")
    M = Msgs(os.path.join(a.build, "proto", "hp.desc"))
    tmp = tempfile.mkdtemp(prefix="hp-bench-slurm-")
    os.chmod(tmp, 0o755)
    procs = []
    try:
        out = subprocess.run([cluster, "start", os.path.join(tmp, "slurm"), "17900"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("slurm did not start: " + out.stderr)
        os.environ["SLURM_CONF"] = os.path.join(tmp, "slurm", "slurm.conf")
        os.environ.pop("SLURM_JOB_ID", None)
        job = os.path.join(tmp, "job.pb")
        subprocess.run([hpctl, "new", "--model", "llama3:debugmodel", "--batch", "2", "--seq",
                        "128", "--steps", "3", "--log-interval", "1", "--fsdp", "layers.*",
                        "--mesh", "dp=2", "-o", job], check=True, capture_output=True)
        with open(job, "rb") as f:
            job_bytes = f.read()
        runs = {}
        chans = {}
        for launcher in ("local", "slurm"):
            state = os.path.join(tmp, "state-" + launcher)
            log_path = os.path.join(tmp, launcher + ".log")
            with open(log_path, "w") as log:
                p, addr = start_hpd(hpd, state, log, launcher)
            procs.append(p)
            with open(os.path.join(state, "token")) as f:
                chans[launcher] = (grpc.insecure_channel(addr), f.read().strip(), log_path)
            runs[launcher] = []
        for i in range(a.repeat):
            for launcher in ("local", "slurm"):
                chan, token, log_path = chans[launcher]
                runs[launcher].append(run_once(chan, M, token, job_bytes, log_path))
            print("run %d: local %.3f s   slurm %.3f s" % (
                i + 1, runs["local"][-1]["total"], runs["slurm"][-1]["total"]), flush=True)
        for chan, _, _ in chans.values():
            chan.close()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
        subprocess.run([cluster, "stop", os.path.join(tmp, "slurm")], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    lo = [r["total"] for r in runs["local"]]
    sl = [r["total"] for r in runs["slurm"]]
    print("job: llama3:debugmodel world 2 (FSDP), batch 2 x seq 128, CPU, %d runs each "
          "(interleaved), one single-node Slurm 22.05 on 127.0.0.1" % a.repeat)
    print("local  submit -> first StepMetrics: median %.3f s  min %.3f s  max %.3f s"
          % (med(lo), min(lo), max(lo)))
    print("slurm  submit -> first StepMetrics: median %.3f s  min %.3f s  max %.3f s"
          % (med(sl), min(sl), max(sl)))
    print("ratio slurm / local (median): %.2f; Slurm adds %.0f ms"
          % (med(sl) / med(lo), (med(sl) - med(lo)) * 1e3))
    keys = ["sbatch", "schedule", "to_step1"]
    if all(k in r for r in runs["slurm"] for k in keys):
        parts = {k: med([r[k] for r in runs["slurm"]]) for k in keys}
        print("slurm breakdown (median ms): " + "  ".join(
            "%s %.0f" % (k, v * 1e3) for k, v in parts.items()))
        print("  Slurm's own part (sbatch + scheduling + step launch): %.0f ms = %.0f%% of the "
              "slurm total" % ((parts["sbatch"] + parts["schedule"]) * 1e3,
                               100 * (parts["sbatch"] + parts["schedule"]) / med(sl)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
