#!/usr/bin/python3
"""tests/daemon/grpc_client.py — an independent client for hp.v1.Coordinator: Python's grpcio
(Debian python3-grpcio) with messages built at run time from the project's descriptor set
(build/proto/hp.desc) and generic stubs carrying raw bytes; no generated Python code.

It starts a real hpd on 127.0.0.1 port 0 with a temp state dir, parses its
"hpd listening grpc=127.0.0.1:PORT ..." line, reads STATE_DIR/token, and checks: submit with
the token, get, list, watch to completion (loss falling), batched watches (WatchJobRequest.batch:
events in order, no gaps, no nested batches; plain watches never see a batch), GetPlan, GetTrace
and CheckpointJob errors, a missing / wrong / doubled token (UNAUTHENTICATED), a garbage payload
(INVALID_ARGUMENT), an unknown id (NOT_FOUND), an unknown method (UNIMPLEMENTED); then SIGTERM
and a clean exit.

Run by tests/daemon/test_rpc_python.c with /usr/bin/python3. Exit 0: all passed; 1: a check
failed (including grpcio missing: that is a failure, never a skip); 2: usage.

  grpc_client.py --hpd BUILD/daemon/hpd --hpctl BUILD/client/hpctl --desc BUILD/proto/hp.desc
"""
import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import grpc
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as e:  # a failure, not a skip: the test must not pass without grpcio
    print(f"FAIL: python3-grpcio / python3-protobuf missing ({e}); "
          "install them (scripts/install-deps.sh)", file=sys.stderr)
    sys.exit(1)

SVC = "/hp.v1.Coordinator/"
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


class Msgs:
    """Message classes from a FileDescriptorSet."""

    def __init__(self, path):
        fds = descriptor_pb2.FileDescriptorSet()
        with open(path, "rb") as f:
            fds.ParseFromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.Add(fd)
        self.factory = None if hasattr(message_factory, "GetMessageClass") else \
            message_factory.MessageFactory(self.pool)

    def __getattr__(self, name):
        d = self.pool.FindMessageTypeByName("hp.v1." + name)
        if self.factory is None:
            return message_factory.GetMessageClass(d)
        return self.factory.GetPrototype(d)

    def state(self, name):
        return self.pool.FindEnumTypeByName("hp.v1.JobState").values_by_name[
            "JOB_STATE_" + name].number


def unary(chan, method, req_bytes, token=None, metadata=None, timeout=30):
    md = list(metadata or [])
    if token is not None:
        md.append(("authorization", "Bearer " + token))
    return chan.unary_unary(SVC + method)(req_bytes, metadata=md, timeout=timeout)


def expect_code(fn, code, what, detail=None):
    try:
        fn()
    except grpc.RpcError as e:
        ok = e.code() == code and (detail is None or detail in (e.details() or ""))
        return check(ok, f"{what}: {e.code()} {e.details()!r}")
    return check(False, f"{what}: succeeded, want {code}")


def flatten(M, raws):
    """Stream messages -> (events, number of batch messages, whether a batch nested one)."""
    evs, batches, nested = [], 0, False
    for raw in raws:
        ev = M.JobEvent.FromString(raw)
        if ev.WhichOneof("event") == "batch":
            batches += 1
            for e in ev.batch.events:
                nested = nested or e.WhichOneof("event") == "batch"
                evs.append(e)
        else:
            evs.append(ev)
    return evs, batches, nested


def metric_steps(evs):
    return [e.metrics.step for e in evs if e.WhichOneof("event") == "metrics"]


def start_hpd(hpd, state_dir, extra=()):
    p = subprocess.Popen([hpd, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                          "--state-dir", state_dir, "--slots", "4", *extra],
                         stdout=subprocess.PIPE, stderr=None, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            if line.startswith("hpd listening"):
                for tok in line.split():
                    if tok.startswith("grpc="):
                        return p, tok[5:]
        if p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("hpd did not print its 'hpd listening grpc=...' line")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd", required=True)
    ap.add_argument("--hpctl", required=True)
    ap.add_argument("--desc", required=True)
    a = ap.parse_args()
    M = Msgs(a.desc)
    tmp = tempfile.mkdtemp(prefix="hp-grpcpy-")
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    job_path = os.path.join(tmp, "job.pb")
    subprocess.run([a.hpctl, "new", "--model", "llama3:debugmodel", "--dim", "64", "--layers",
                    "2", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "96", "--vocab",
                    "256", "--batch", "2", "--seq", "32", "--steps", "10", "-o", job_path],
                   check=True, stdout=subprocess.DEVNULL)
    proc, addr = start_hpd(a.hpd, state)
    try:
        with open(os.path.join(state, "token")) as f:
            token = f.read().strip()
        check(len(token) >= 16, "STATE_DIR/token holds a token")
        mode = os.stat(os.path.join(state, "token")).st_mode & 0o777
        check(mode == 0o600, f"STATE_DIR/token has mode 0600 (got {oct(mode)})")
        chan = grpc.insecure_channel(addr, options=[("grpc.enable_http_proxy", 0)])
        grpc.channel_ready_future(chan).result(timeout=10)
        run_checks(chan, M, token, job_path)
        chan.close()
        tls_checks(a, M, job_path)
    finally:
        stop_hpd(proc, "plaintext")
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


def stop_hpd(proc, what):
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
        check(rc == 0, f"{what}: hpd exits 0 on SIGTERM (got {rc})")
    except subprocess.TimeoutExpired:
        proc.kill()
        check(False, f"{what}: hpd exits within 30 s of SIGTERM")


def tls_checks(a, M, job_path):
    """--tls-cert/--tls-key: a TLS client with the CA works (Python and hpctl --tls-ca); a
    plaintext client does not. Needs the openssl command to make a certificate."""
    openssl = shutil.which("openssl")
    if not openssl:
        print("note: no openssl command; TLS checks not run")
        return
    tmp = tempfile.mkdtemp(prefix="hp-grpctls-")
    try:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state = os.path.join(tmp, "state")
        os.mkdir(state)
        proc, addr = start_hpd(a.hpd, state, ("--tls-cert", cert, "--tls-key", key))
        try:
            with open(os.path.join(state, "token")) as f:
                token = f.read().strip()
            with open(cert, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            chan = grpc.secure_channel(addr, creds, options=[("grpc.enable_http_proxy", 0)])
            with open(job_path, "rb") as f:
                req = M.SubmitJobRequest(job=M.Job.FromString(f.read())).SerializeToString()
            resp = M.SubmitJobResponse.FromString(unary(chan, "SubmitJob", req, token=token))
            check(bool(resp.job.id), "TLS: submit with the CA and the token")
            chan.close()
            plain = grpc.insecure_channel(addr, options=[("grpc.enable_http_proxy", 0)])
            expect_code(lambda: unary(plain, "GetJob", M.GetJobRequest(job_id=resp.job.id)
                                      .SerializeToString(), timeout=5), grpc.StatusCode.UNAVAILABLE,
                        "TLS: a plaintext client is refused")
            plain.close()
            r = subprocess.run([a.hpctl, "status", resp.job.id, "--server", addr, "--tls-ca",
                                cert, "--json"], capture_output=True, text=True, timeout=60)
            check(r.returncode == 0 and resp.job.id in r.stdout,
                  f"TLS: hpctl status --tls-ca ({r.returncode}: {r.stderr.strip()})")
        finally:
            stop_hpd(proc, "TLS")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_checks(chan, M, token, job_path):
    SC = grpc.StatusCode
    with open(job_path, "rb") as f:
        job = M.Job.FromString(f.read())
    req = M.SubmitJobRequest(job=job).SerializeToString()

    # Auth: mutating calls need exactly one correct bearer token.
    expect_code(lambda: unary(chan, "SubmitJob", req), SC.UNAUTHENTICATED, "submit without token")
    expect_code(lambda: unary(chan, "SubmitJob", req, token="wrong" + token),
                SC.UNAUTHENTICATED, "submit with a wrong token")
    expect_code(lambda: unary(chan, "SubmitJob", req, token=token[:-1]), SC.UNAUTHENTICATED,
                "submit with a token prefix")
    expect_code(lambda: unary(chan, "SubmitJob", req, token=token,
                              metadata=[("authorization", "Bearer " + token)]),
                SC.UNAUTHENTICATED, "submit with two authorization headers")
    expect_code(lambda: unary(chan, "CancelJob", M.CancelJobRequest(job_id="x")
                              .SerializeToString()), SC.UNAUTHENTICATED, "cancel without token")
    # Bad payloads.
    expect_code(lambda: unary(chan, "SubmitJob", b"\xff\xff\xff\xff garbage", token=token),
                SC.INVALID_ARGUMENT, "garbage SubmitJobRequest", "malformed SubmitJobRequest")
    bad = M.SubmitJobRequest(job=M.Job(format_version=0, name="bad")).SerializeToString()
    expect_code(lambda: unary(chan, "SubmitJob", bad, token=token), SC.INVALID_ARGUMENT,
                "invalid job (format_version 0)")
    expect_code(lambda: unary(chan, "GetJob", b"\x0a\x05ab"), SC.INVALID_ARGUMENT,
                "truncated GetJobRequest")
    expect_code(lambda: unary(chan, "SubmitJob", b"\x0a" + b"\x80" * 3 + b"\x01" + b"\0" *
                              (65 << 20), token=token), SC.RESOURCE_EXHAUSTED,
                "a request over the 64 MiB limit")
    # Unknown things.
    expect_code(lambda: unary(chan, "GetJob", M.GetJobRequest(job_id="j-nope")
                              .SerializeToString()), SC.NOT_FOUND, "get an unknown id")
    expect_code(lambda: chan.unary_unary("/hp.v1.Coordinator/Nope")(b"", timeout=5),
                SC.UNIMPLEMENTED, "unknown method")
    expect_code(lambda: chan.unary_unary("/other.Service/Get")(b"", timeout=5),
                SC.UNIMPLEMENTED, "unknown service")

    # Submit, get, list.
    resp = M.SubmitJobResponse.FromString(unary(chan, "SubmitJob", req, token=token))
    jid = resp.job.id
    check(bool(jid), f"submit returns a job id ({jid})")
    again = M.SubmitJobResponse.FromString(unary(
        chan, "SubmitJob", M.SubmitJobRequest(job=job, request_id="rq-1").SerializeToString(),
        token=token))
    again2 = M.SubmitJobResponse.FromString(unary(
        chan, "SubmitJob", M.SubmitJobRequest(job=job, request_id="rq-1").SerializeToString(),
        token=token))
    check(again.job.id == again2.job.id, "a retried submit with one request_id is one job")
    got = M.GetJobResponse.FromString(unary(chan, "GetJob", M.GetJobRequest(job_id=jid)
                                            .SerializeToString()))
    check(got.job.id == jid and got.job.total_steps == 10, "get returns the job")
    lst = M.ListJobsResponse.FromString(unary(chan, "ListJobs", M.ListJobsRequest()
                                              .SerializeToString()))
    check(jid in [j.id for j in lst.jobs], "list contains the job")
    page = M.ListJobsResponse.FromString(unary(chan, "ListJobs", M.ListJobsRequest(page_size=1)
                                               .SerializeToString()))
    check(len(page.jobs) == 1 and page.next_page_token != "", "list pages (page_size 1)")
    plan = M.GetPlanResponse.FromString(unary(chan, "GetPlan", M.GetPlanRequest(job_id=jid)
                                              .SerializeToString(), token=token))
    check(plan.plan.world_size >= 1, "GetPlan of the submitted job")

    # Many calls in flight at once (more than the armed request slots).
    getm = chan.unary_unary(SVC + "GetJob")
    greq = M.GetJobRequest(job_id=jid).SerializeToString()
    futs = [getm.future(greq, timeout=30) for _ in range(200)]
    ids = [M.GetJobResponse.FromString(f.result()).job.id for f in futs]
    check(ids == [jid] * 200, "200 concurrent GetJob calls")
    watches = [chan.unary_stream(SVC + "WatchJob")(M.WatchJobRequest(job_id=jid)
                                                   .SerializeToString(), timeout=300)
               for _ in range(50)]
    # Batched live watches: the same events in the same order, however they are grouped.
    bwatches = [chan.unary_stream(SVC + "WatchJob")(M.WatchJobRequest(
        job_id=jid, from_step=1, batch=True).SerializeToString(), timeout=300) for _ in range(10)]

    # Watch to completion.
    stream = chan.unary_stream(SVC + "WatchJob")(
        M.WatchJobRequest(job_id=jid, from_step=1).SerializeToString(), timeout=300)
    states, losses, kinds = [], [], set()
    for raw in stream:
        ev = M.JobEvent.FromString(raw)
        kind = ev.WhichOneof("event")
        kinds.add(kind)
        if kind == "state":
            states.append(ev.state)
        elif kind == "metrics":
            losses.append(ev.metrics.loss)
    check("batch" not in kinds, f"a watch without batch gets no batch messages ({kinds})")
    check(states and states[-1] == M.state("SUCCEEDED"), f"watch ends SUCCEEDED ({states})")
    # Noisy at this size: compare the means of the first and the last three steps.
    check(len(losses) >= 6 and sum(losses[-3:]) < sum(losses[:3]), f"loss falls ({losses})")
    ends = []
    for w in watches:
        evs = [M.JobEvent.FromString(raw) for raw in w]
        ends.append(evs[-1].state if evs and evs[-1].WhichOneof("event") == "state" else None)
    check(all(e == M.state("SUCCEEDED") for e in ends), "50 concurrent watches end SUCCEEDED")
    for i, w in enumerate(bwatches):
        evs, _, nested = flatten(M, w)
        steps = metric_steps(evs)
        last = evs[-1].state if evs and evs[-1].WhichOneof("event") == "state" else None
        check(not nested and steps == list(range(1, 11)) and last == M.state("SUCCEEDED"),
              f"batched live watch {i}: steps 1..10 in order, no nesting, ends SUCCEEDED "
              f"({steps}, nested={nested}, last={last})")
    # Replay of a finished job: the stored steps queue at once, so they coalesce.
    evs, batches, nested = flatten(M, chan.unary_stream(SVC + "WatchJob")(
        M.WatchJobRequest(job_id=jid, from_step=1, batch=True).SerializeToString(), timeout=60))
    steps = metric_steps(evs)
    check(batches >= 1 and not nested and steps == list(range(1, 11)),
          f"batched replay: {batches} batch message(s), steps in order without gaps ({steps})")
    evs, batches, _ = flatten(M, chan.unary_stream(SVC + "WatchJob")(
        M.WatchJobRequest(job_id=jid, from_step=1).SerializeToString(), timeout=60))
    check(batches == 0 and metric_steps(evs) == list(range(1, 11)),
          "the same replay without batch: one message per event")
    expect_code(lambda: list(chan.unary_stream(SVC + "WatchJob")(
        M.WatchJobRequest(job_id="j-nope").SerializeToString(), timeout=10)),
        SC.NOT_FOUND, "watch an unknown id")
    # A cancelled stream leaves the daemon serving.
    it = chan.unary_stream(SVC + "WatchJob")(M.WatchJobRequest(job_id=jid).SerializeToString(),
                                             timeout=30)
    next(it)
    it.cancel()
    got = M.GetJobResponse.FromString(unary(chan, "GetJob", M.GetJobRequest(job_id=jid)
                                            .SerializeToString()))
    check(got.job.state == M.state("SUCCEEDED"), "get after watch: SUCCEEDED")

    # GetTrace: read-only; NOT_FOUND for an unknown job and for a step without a trace.
    def trace(job_id, step, ranks=()):
        return unary(chan, "GetTrace", M.GetTraceRequest(job_id=job_id, step=step,
                                                         ranks=list(ranks)).SerializeToString())
    expect_code(lambda: trace("j-nope", 1), SC.NOT_FOUND, "GetTrace of an unknown job")
    expect_code(lambda: trace(jid, 5), SC.NOT_FOUND, "GetTrace of a step without a trace")
    expect_code(lambda: trace("", 1), SC.INVALID_ARGUMENT, "GetTrace without job_id")
    expect_code(lambda: trace(jid, 1, [-1]), SC.INVALID_ARGUMENT, "GetTrace of rank -1")
    # CheckpointJob: mutating (token); FAILED_PRECONDITION when the job is not running.
    ck = M.CheckpointJobRequest(job_id=jid).SerializeToString()
    expect_code(lambda: unary(chan, "CheckpointJob", ck), SC.UNAUTHENTICATED,
                "CheckpointJob without token")
    expect_code(lambda: unary(chan, "CheckpointJob", ck, token="wrong" + token),
                SC.UNAUTHENTICATED, "CheckpointJob with a wrong token")
    expect_code(lambda: unary(chan, "CheckpointJob", ck, token=token), SC.FAILED_PRECONDITION,
                "CheckpointJob of a finished job")
    expect_code(lambda: unary(chan, "CheckpointJob", M.CheckpointJobRequest(job_id="j-nope")
                              .SerializeToString(), token=token), SC.NOT_FOUND,
                "CheckpointJob of an unknown job")
    expect_code(lambda: unary(chan, "CheckpointJob", M.CheckpointJobRequest()
                              .SerializeToString(), token=token), SC.INVALID_ARGUMENT,
                "CheckpointJob without job_id")


if __name__ == "__main__":
    sys.exit(main())
