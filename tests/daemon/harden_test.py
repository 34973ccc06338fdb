#!/usr/bin/python3
"""tests/daemon/harden_test.py — hostile peers against a real hpd (issue #14, the daemon side).

Starts hpd on 127.0.0.1 port 0 (gRPC, HTTP, workers; --launcher external, so that this script
plays the workers) with a temp state dir and runs one case:
  bomb   a GetPlan / SubmitJob of millions of empty graph nodes is refused RESOURCE_EXHAUSTED
         quickly, and hpd's peak RSS (VmHWM) grows by a bounded amount;
  plan   GetPlan needs the token; a slow GetPlan does not delay a ListJobs sent meanwhile;
  nul    ids with an embedded NUL (GetJob/CancelJob/WatchJob/GetPlan), a job name that is not
         UTF-8, HTTP paths with %00 and a worker Hello for "j-...\\0x" are refused;
  step   a rank reporting step INT64_MAX (metrics, Done) does not move its job past the end;
  decode large requests (GetPlan/SubmitJob bombs, sent 6 at once) are decoded off the loop: a
         ListJobs poller running meanwhile never waits 40% of the decodes' time (or 1 s);
  auth   --auth all (flag and config key): every RPC and HTTP path but /healthz (and the static
         dashboard files) needs the token, a token in the query string is refused, hpctl reads
         still work; a bad value is refused; listening beyond loopback without TLS warns;
  args   HTTP requests with 33 to 16000 query arguments all get a prompt 400 (JSON, naming the
         limit) or 414/431, never a held or silently closed connection.
Exit 0: passed; 1: a check failed.

  harden_test.py --hpd BUILD/daemon/hpd --hpctl BUILD/client/hpctl --desc BUILD/proto/hp.desc --case C
"""
import argparse
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_client import FAILS, Msgs, check, expect_code, unary  # noqa: E402
import grpc  # noqa: E402

SC = grpc.StatusCode


def start_hpd(hpd, state_dir, extra=(), stderr=None):
    p = subprocess.Popen([hpd, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--worker-listen", "127.0.0.1:0", "--state-dir", state_dir,
                          "--slots", "4", *extra],
                         stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            if line.startswith("hpd listening"):
                kv = dict(t.split("=", 1) for t in line.split() if "=" in t)
                return p, kv
        if p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("hpd did not print its listening line")


def proc_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def ld(field, payload):
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def new_job(hpctl, path, layers=2, steps=10):
    subprocess.run([hpctl, "new", "--model", "llama3:debugmodel", "--dim", "64", "--layers",
                    str(layers), "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "96",
                    "--vocab", "256", "--batch", "2", "--seq", "32", "--steps", str(steps),
                    "-o", path],
                   check=True, stdout=subprocess.DEVNULL)


def worker_token(M, chan, token, jid):
    wtok = None
    deadline = time.time() + 30
    while time.time() < deadline and not wtok:
        try:
            r = M.GetJobResponse.FromString(unary(chan, "GetJob", M.GetJobRequest(
                job_id=jid, worker_commands=True).SerializeToString(), token=token))
        except grpc.RpcError:  # still compiling: no attempt accepts workers yet
            r = M.GetJobResponse()
        for cmd in r.worker_commands:
            for t in cmd.split():
                if t.startswith("HP_TOKEN="):
                    wtok = t[len("HP_TOKEN="):]
        if not wtok:
            time.sleep(0.05)
    check(bool(wtok), "the external launcher's worker command carries a token")
    return wtok


def connect_rank(kv, M):
    host, port = kv["workers"].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)

    def send(fr):
        b = fr.SerializeToString()
        s.sendall(struct.pack("<I", len(b)) + b)

    def recv():
        hdr = b""
        while len(hdr) < 4:
            c = s.recv(4 - len(hdr))
            if not c:
                return None
            hdr += c
        n = struct.unpack("<I", hdr)[0]
        body = b""
        while len(body) < n:
            c = s.recv(n - len(body))
            if not c:
                return None
            body += c
        return M.Frame.FromString(body)
    return s, send, recv


def case_bomb(a, M, chan, token, proc, kv, tmp):
    n = 10_000_000  # 20 MB of empty nodes: GetPlanRequest.job(2).graph(3).nodes(2)
    job = ld(3, b"\x12\x00" * n)
    for method, field, tok in (("GetPlan", 2, token), ("SubmitJob", 1, token)):
        req = ld(field, job)
        unary(chan, "ListJobs", b"", timeout=10)  # warm
        rss0 = proc_kb(proc.pid, "VmRSS")
        hwm0 = proc_kb(proc.pid, "VmHWM")
        t0 = time.time()
        expect_code(lambda: unary(chan, method, req, token=tok, timeout=60),
                    SC.RESOURCE_EXHAUSTED, f"{method} of {n} empty nodes", "decode budget")
        dt = time.time() - t0
        hwm1 = proc_kb(proc.pid, "VmHWM")
        rss1 = proc_kb(proc.pid, "VmRSS")
        grow = max(hwm1, hwm0) - rss0
        print(f"figure {method}: {len(req) >> 20} MiB request: RSS {rss0 >> 10} MiB before, "
              f"peak {hwm1 >> 10} MiB, {rss1 >> 10} MiB after; refused in {dt:.2f} s")
        check(hwm1 - rss0 < 256 << 10, f"{method}: peak RSS grew {grow >> 10} MiB (< 256)")
        check(dt < 10, f"{method}: refused in {dt:.2f} s (< 10)")
    # Still serving, and a normal job still goes through.
    path = os.path.join(tmp, "job.pb")
    new_job(a.hpctl, path)
    with open(path, "rb") as f:
        j = M.Job.FromString(f.read())
    r = M.SubmitJobResponse.FromString(unary(chan, "SubmitJob", M.SubmitJobRequest(job=j)
                                             .SerializeToString(), token=token))
    check(r.job.id != "", "a normal SubmitJob after the bombs")


def case_decode(a, M, chan, token, proc, kv, tmp):
    """Six 20 MB requests at once: decoded on the pool, ListJobs meanwhile answers promptly."""
    import threading
    n = 10_000_000
    job = ld(3, b"\x12\x00" * n)
    reqs = [("GetPlan", ld(2, job)), ("SubmitJob", ld(1, job))] * 3
    # The poller has a connection of its own: on the bombs' connection a ListJobs would queue
    # behind their 120 MB in HTTP/2's flow control, timing the transport instead of the loop.
    pchan = grpc.insecure_channel(kv["grpc"], options=[
        ("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)])
    unary(pchan, "ListJobs", b"", timeout=10)
    lat, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            t = time.time()
            try:
                unary(pchan, "ListJobs", b"", timeout=30)
            except grpc.RpcError as e:
                print(f"ListJobs: {e.code()}")
            lat.append((t, time.time() - t))
    th = threading.Thread(target=poll)
    th.start()
    t0 = time.time()
    futs = [chan.unary_unary(f"/hp.v1.Coordinator/{m}").future(
        r, metadata=[("authorization", "Bearer " + token)], timeout=120) for m, r in reqs]
    codes = []
    for f in futs:
        try:
            f.result()
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)
    t1 = time.time()
    stop.set()
    th.join()
    pchan.close()
    during = [d for t, d in lat if t0 <= t <= t1]
    worst = max(during) if during else float("inf")
    print(f"figure {len(reqs)} requests of {len(job) >> 20} MiB at once: all answered in "
          f"{t1 - t0:.2f} s; {len(during)} ListJobs meanwhile, the slowest {worst * 1000:.0f} ms")
    check(all(c == "RESOURCE_EXHAUSTED" for c in codes), f"every bomb refused: {codes}")
    check(len(during) >= 2, f"ListJobs answered meanwhile ({len(during)} calls)")
    # Decoded on the loop, a ListJobs waits for the decodes queued before it: ≈ their sum, most
    # of the whole (3.8 s of 4.75 s measured). Off the loop it waits for CPU and for the gRPC
    # transport taking in the bombs' bytes (up to 1.7 s of 11.5 s under TSan): bound it
    # by a share of the whole, so that a loaded machine (both slower) does not fail it.
    bound = max(1.0, 0.4 * (t1 - t0))
    check(worst < bound, f"the slowest ListJobs during the decodes took {worst:.3f} s "
          f"(< {bound:.2f} s: 40% of the {t1 - t0:.2f} s the decodes took, or 1 s)")


def case_plan(a, M, chan, token, proc, kv, tmp):
    path = os.path.join(tmp, "big.pb")
    new_job(a.hpctl, path, layers=int(os.environ.get("HP_HARDEN_LAYERS", "512")))
    with open(path, "rb") as f:
        job = M.Job.FromString(f.read())
    req = M.GetPlanRequest(job=job).SerializeToString()
    expect_code(lambda: unary(chan, "GetPlan", req, timeout=60), SC.UNAUTHENTICATED,
                "GetPlan without a token")
    planm = chan.unary_unary("/hp.v1.Coordinator/GetPlan")
    t0 = time.time()
    fut = planm.future(req, metadata=[("authorization", "Bearer " + token)], timeout=300)
    # Give the call time to reach hpd: wait for a first ListJobs to come back.
    unary(chan, "ListJobs", b"", timeout=30)
    t1 = time.time()
    lst = chan.unary_unary("/hp.v1.Coordinator/ListJobs")
    try:
        lst(b"", timeout=1.0)
        ok = True
    except grpc.RpcError as e:
        ok = False
        print(f"ListJobs: {e.code()}")
    t2 = time.time()
    pending = not fut.done()
    resp = M.GetPlanResponse.FromString(fut.result())
    t3 = time.time()
    print(f"figure GetPlan of a large job: {t3 - t0:.2f} s; ListJobs sent meanwhile: "
          f"{(t2 - t1) * 1000:.0f} ms (GetPlan still running then: {pending})")
    check(resp.plan.graph_nodes > 0, "GetPlan with the token answers a plan")
    check(ok, f"ListJobs during a GetPlan answers within its 1 s deadline ({t2 - t1:.3f} s)")
    check(pending or t3 - t0 < 1.0, "the GetPlan was still running while ListJobs answered")


def case_nul(a, M, chan, token, proc, kv, tmp):
    path = os.path.join(tmp, "job.pb")
    new_job(a.hpctl, path)
    with open(path, "rb") as f:
        job = M.Job.FromString(f.read())
    jid = M.SubmitJobResponse.FromString(unary(chan, "SubmitJob", M.SubmitJobRequest(job=job)
                                               .SerializeToString(), token=token)).job.id
    bad = jid + "\x00junk"
    expect_code(lambda: unary(chan, "GetJob", M.GetJobRequest(job_id=bad).SerializeToString()),
                SC.INVALID_ARGUMENT, "GetJob of id\\0junk", "job_id")
    expect_code(lambda: unary(chan, "CancelJob", M.CancelJobRequest(job_id=bad)
                              .SerializeToString(), token=token),
                SC.INVALID_ARGUMENT, "CancelJob of id\\0junk", "job_id")
    expect_code(lambda: unary(chan, "GetPlan", M.GetPlanRequest(job_id=bad).SerializeToString(),
                              token=token), SC.INVALID_ARGUMENT, "GetPlan of id\\0junk", "job_id")
    try:
        list(chan.unary_stream("/hp.v1.Coordinator/WatchJob")(
            M.WatchJobRequest(job_id=bad).SerializeToString(), timeout=10))
        check(False, "WatchJob of id\\0junk: succeeded")
    except grpc.RpcError as e:
        check(e.code() == SC.INVALID_ARGUMENT and "job_id" in e.details(),
              f"WatchJob of id\\0junk: {e.code()} {e.details()!r}")
    got = M.GetJobResponse.FromString(unary(chan, "GetJob", M.GetJobRequest(job_id=jid)
                                            .SerializeToString()))
    check(got.job.state != M.state("CANCELLED"), "the job was not cancelled")
    # A job name that is not UTF-8: raw bytes (Python refuses to build such a str).
    raw = M.SubmitJobRequest(job=job).SerializeToString()
    name = job.name.encode()
    if name:
        evil = raw.replace(varint(2 << 3 | 2) + varint(len(name)) + name,
                           varint(2 << 3 | 2) + varint(len(name)) + b"\xff" + name[1:], 1)
        expect_code(lambda: unary(chan, "SubmitJob", evil, token=token), SC.INVALID_ARGUMENT,
                    "SubmitJob with a job name that is not UTF-8", "name")
    # HTTP paths with %00.
    base = "http://" + kv["http"]
    for p in (f"/api/v1/jobs/{jid}%00x", "/metrics%00", "/static/chart.min.js%00.html"):
        try:
            with urllib.request.urlopen(base + p, timeout=10) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        check(code == 400, f"HTTP GET {p}: {code} (want 400)")
    # A worker Hello for "id\0x" with the right token is dropped, not welcomed as id.
    wtok = worker_token(M, chan, token, jid)
    s, send, recv = connect_rank(kv, M)
    send(M.Frame(seq=1, hello=M.Hello(protocol_version=1, job_id=bad, rank=0, token=wtok,
                                      pid=os.getpid(), hostname="test", device="cpu")))
    try:
        w = recv()
    except (ConnectionResetError, socket.timeout):
        w = None
    check(w is None, f"a Hello for id\\0junk is dropped (got {w and w.WhichOneof('body')})")
    s.close()


def case_step(a, M, chan, token, proc, kv, tmp):
    path = os.path.join(tmp, "job.pb")
    new_job(a.hpctl, path, steps=3)
    with open(path, "rb") as f:
        job = M.Job.FromString(f.read())
    jid = M.SubmitJobResponse.FromString(unary(chan, "SubmitJob", M.SubmitJobRequest(job=job)
                                               .SerializeToString(), token=token)).job.id
    wtok = worker_token(M, chan, token, jid)
    s, send, recv = connect_rank(kv, M)
    send(M.Frame(seq=1, hello=M.Hello(protocol_version=1, job_id=jid, rank=0, token=wtok,
                                      pid=os.getpid(), hostname="test", device="cpu")))
    w = recv()
    check(w is not None and w.WhichOneof("body") == "welcome", "the fake rank is welcomed")
    big = 2**63 - 1
    send(M.Frame(seq=2, metrics=M.StepMetrics(step=big, rank=0, loss=1.0)))
    send(M.Frame(seq=3, metrics=M.StepMetrics(step=1, rank=0, loss=1.0)))
    send(M.Frame(seq=4, done=M.Done(ok=True, final_step=big)))
    # The frames are handled in order: once the Done (the last) is refused in the log, all
    # three were handled. A condition with a deadline, not a sleep.
    deadline = time.time() + 10
    done_seen = False
    while time.time() < deadline and not done_seen:
        with open(os.path.join(tmp, "hpd.log")) as f:
            done_seen = f"what=\"done step {big} outside" in f.read()
        if not done_seen:
            time.sleep(0.05)
    check(done_seen, "hpd logged the refused Done (step INT64_MAX) within 10 s")
    st = M.GetJobResponse.FromString(unary(chan, "GetJob", M.GetJobRequest(job_id=jid)
                                           .SerializeToString())).job
    check(st.step <= st.total_steps, f"job step {st.step} of {st.total_steps} after a rank "
          "reported INT64_MAX")
    check(st.step == 1, f"the in-range metrics step 1 was taken: step {st.step}")
    s.close()


def case_quote(a, M, chan, token, proc, kv, tmp):
    """A peer's id with a newline is escaped in the error and in the log: no forged line."""
    forged = "level=error event=fake"
    bad = "j-000001\n" + forged
    try:
        unary(chan, "GetJob", M.GetJobRequest(job_id=bad).SerializeToString())
        check(False, "GetJob of an id with a newline: succeeded")
    except grpc.RpcError as e:
        d = e.details()
        check(e.code() == SC.NOT_FOUND, f"GetJob of id\\n...: {e.code()}")
        check("\n" not in d and "\r" not in d, f"GetJob error has no raw newline: {d!r}")
        check('"j-000001\\nlevel=error event=fake"' in d, f"GetJob error shows the escaped id: {d!r}")
    try:
        unary(chan, "CancelJob", M.CancelJobRequest(job_id=bad).SerializeToString(), token=token)
    except grpc.RpcError as e:
        check("\n" not in e.details(), f"CancelJob error has no raw newline: {e.details()!r}")
    # the log: every line is the daemon's own (none starts with what the peer sent)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    with open(os.path.join(tmp, "hpd.log")) as f:
        lines = f.read().splitlines()
    check(not any(ln.startswith(forged) for ln in lines),
          "the log has no line the peer forged")


def http_raw(addr, target, timeout=20):
    """(status, body, seconds) of a raw GET; status 0: no answer (closed or timed out)."""
    host, port = addr.rsplit(":", 1)
    t0 = time.time()
    buf = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
        except (ConnectionResetError, socket.timeout):
            pass
    try:
        status = int(buf.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, buf.partition(b"\r\n\r\n")[2], time.time() - t0


def http_status(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def case_auth(a, M, chan, token, proc, kv, tmp):
    # The default: reads need no token (the server the harness started).
    M.ListJobsResponse.FromString(unary(chan, "ListJobs", b""))
    check(http_status("http://" + kv["http"] + "/api/v1/jobs")[0] == 200,
          "default --auth mutating: HTTP reads need no token")
    # A bad value, as a flag and as a config key.
    bad = subprocess.run([a.hpd, "--auth", "some"], capture_output=True, text=True, timeout=30)
    check(bad.returncode == 2 and "auth" in bad.stderr and "mutating|all" in bad.stderr,
          f"--auth some is refused: {bad.returncode} {bad.stderr.strip()!r}")
    conf = os.path.join(tmp, "hpd.conf")
    with open(conf, "w") as f:
        f.write("auth = everything\n")
    bad = subprocess.run([a.hpd, "--config", conf], capture_output=True, text=True, timeout=30)
    check(bad.returncode == 2 and "hpd.conf:1" in bad.stderr and "mutating|all" in bad.stderr,
          f"auth = everything in the config is refused: {bad.stderr.strip()!r}")
    # --auth all, once as a flag, once from the config file.
    for how in ("flag", "config"):
        st2 = os.path.join(tmp, "state-" + how)
        os.mkdir(st2)
        if how == "flag":
            extra = ("--auth", "all", "--launcher", "external")
        else:
            with open(conf, "w") as f:
                f.write("auth = all\nlauncher = external\n")
            extra = ("--config", conf)
        logp = os.path.join(tmp, f"hpd-{how}.log")
        with open(logp, "w") as lf:
            p2, kv2 = start_hpd(a.hpd, st2, extra, stderr=lf)
        try:
            with open(os.path.join(st2, "token")) as f:
                tok2 = f.read().strip()
            ch = grpc.insecure_channel(kv2["grpc"], options=[("grpc.enable_http_proxy", 0)])
            grpc.channel_ready_future(ch).result(timeout=10)
            reads = (("ListJobs", b""),
                     ("GetJob", M.GetJobRequest(job_id="j-000001").SerializeToString()),
                     ("GetTrace", M.GetTraceRequest(job_id="j-000001", step=1)
                      .SerializeToString()))
            for meth, req in reads:
                expect_code(lambda: unary(ch, meth, req), SC.UNAUTHENTICATED,
                            f"{how}: {meth} without the token")
            try:
                list(ch.unary_stream("/hp.v1.Coordinator/WatchJob")(
                    M.WatchJobRequest(job_id="j-000001").SerializeToString(), timeout=10))
                check(False, f"{how}: WatchJob without the token succeeded")
            except grpc.RpcError as e:
                check(e.code() == SC.UNAUTHENTICATED, f"{how}: WatchJob without the token: "
                      f"{e.code()}")
            M.ListJobsResponse.FromString(unary(ch, "ListJobs", b"", token=tok2))
            expect_code(lambda: unary(ch, "GetJob", reads[1][1], token=tok2), SC.NOT_FOUND,
                        f"{how}: GetJob with the token gets past auth")
            ch.close()
            env = dict(os.environ, HP_SERVER=kv2["grpc"], HP_STATE_DIR=st2)
            env.pop("HP_TOKEN", None)
            r = subprocess.run([a.hpctl, "list"], env=env, capture_output=True, text=True,
                               timeout=60)
            check(r.returncode == 0, f"{how}: hpctl list sends the token: {r.returncode} "
                  f"{r.stderr.strip()!r}")
            base = "http://" + kv2["http"]
            for path in ("/api/v1/jobs", "/api/v1/jobs/j-000001", "/metrics", "/api/v1"):
                st, hdrs = http_status(base + path)
                check(st == 401 and "Bearer" in hdrs.get("WWW-Authenticate", ""),
                      f"{how}: GET {path} without the token: {st} (want 401 + WWW-Authenticate)")
                st, _ = http_status(base + path, "0" * 64)
                check(st == 401, f"{how}: GET {path} with a wrong token: {st}")
            check(http_status(base + "/api/v1/jobs", tok2)[0] == 200,
                  f"{how}: GET /api/v1/jobs with the token: 200")
            check(http_status(base + "/metrics", tok2)[0] == 200, f"{how}: /metrics with it: 200")
            st, _ = http_status(base + "/api/v1/jobs?token=" + tok2, tok2)
            check(st == 400, f"{how}: a token in the query string is refused even with the "
                  f"header: {st}")
            check(http_status(base + "/healthz")[0] == 200, f"{how}: /healthz needs no token")
            check(http_status(base + "/")[0] == 200, f"{how}: the dashboard page loads without "
                  "it (it sends the fragment's token itself)")
        finally:
            p2.send_signal(signal.SIGTERM)
            p2.wait(timeout=30)
        with open(logp) as f:
            log = f.read()
        check("exposed_without_tls" not in log, f"{how}: loopback only: no exposure warning")
    # Beyond loopback without TLS: warned, for gRPC and for HTTP.
    st3 = os.path.join(tmp, "state-exposed")
    os.mkdir(st3)
    logp = os.path.join(tmp, "hpd-exposed.log")
    with open(logp, "w") as lf:
        p3 = subprocess.Popen([a.hpd, "--listen", "0.0.0.0:0", "--http", "0.0.0.0:0",
                               "--worker-listen", "127.0.0.1:0", "--state-dir", st3],
                              stdout=subprocess.PIPE, stderr=lf, text=True)
        try:
            line = p3.stdout.readline()
            check(line.startswith("hpd listening"), f"hpd on 0.0.0.0 starts: {line!r}")
        finally:
            p3.send_signal(signal.SIGTERM)
            p3.wait(timeout=30)
    with open(logp) as f:
        log = f.read()
    for what in ("grpc", "http"):
        check(f"event=exposed_without_tls listener={what}" in log,
              f"listening on 0.0.0.0 without TLS warns for {what}")
    check("reads need no token (--auth all)" in log, "the warning points at --auth all")


def case_args(a, M, chan, token, proc, kv, tmp):
    """Every count of query arguments gets a prompt answer (MHD held ≈ 500+ for 30 s)."""
    shapes = {"k=v": lambda i: f"a{i}=1", "bare": lambda i: "a"}
    for shape, arg in shapes.items():
        for n in (33, 400, 500, 600, 1000, 2000, 3000, 4000, 6000, 10000, 16000):
            q = "&".join(arg(i) for i in range(n))
            for path in ("/api/v1/jobs", "/metrics", "/healthz"):
                st, body, dt = http_raw(kv["http"], f"{path}?{q}")
                ok = st in (414, 431) or (st == 400 and b"more than 32 query arguments" in body)
                check(ok and dt < 10, f"GET {path} with {n} '{shape}' arguments ({len(q)} bytes): "
                      f"{st} in {dt:.2f} s (want a 400 naming the limit, or 414/431, < 10 s)")
    st, body, _ = http_raw(kv["http"], "/api/v1/jobs?" + "&".join(f"a{i}=1" for i in range(32)))
    check(st == 200, f"32 arguments (the limit) are not refused for their count: {st}")
    st, _, _ = http_raw(kv["http"], "/api/v1/jobs?page_size=5")
    check(st == 200, f"a normal request afterwards: {st}")


CASES = {"args": case_args, "auth": case_auth, "bomb": case_bomb, "decode": case_decode, "plan": case_plan, "nul": case_nul, "step": case_step,
         "quote": case_quote}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    ap.add_argument("--desc", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    a = ap.parse_args()
    M = Msgs(a.desc)
    tmp = tempfile.mkdtemp(prefix="hp-harden-")
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    log = open(os.path.join(tmp, "hpd.log"), "w")
    proc, kv = start_hpd(a.hpd, state, ("--launcher", "external"), stderr=log)
    try:
        with open(os.path.join(state, "token")) as f:
            token = f.read().strip()
        chan = grpc.insecure_channel(kv["grpc"], options=[
            ("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 64 << 20)])
        grpc.channel_ready_future(chan).result(timeout=10)
        CASES[a.case](a, M, chan, token, proc, kv, tmp)
        chan.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if FAILS:
            with open(os.path.join(tmp, "hpd.log")) as f:
                sys.stderr.write(f.read())
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
