#!/usr/bin/env bash
# tests/daemon/slurm_cluster.sh — a real single-node Slurm cluster on 127.0.0.1 for the tests:
# munged, slurmctld and slurmd with every file (config, state, spool, logs, pids, the munge
# socket) under DIR, no cgroups, no accounting, its own ports (BASE..BASE+100).
#
#   slurm_cluster.sh check            exit 0 when it can run here, else 77 and why on stdout
#   slurm_cluster.sh start DIR BASE   start it; prints SLURM_CONF=DIR/slurm.conf once the node
#                                     is idle (60 s at most; exit 1 with the logs otherwise)
#   slurm_cluster.sh stop DIR         cancel its jobs, stop the three daemons (by their pid files)
#
# Needs root (slurmd runs jobs as their users) and Debian's slurmctld slurmd slurm-client
# munge (scripts/install-deps.sh). Slurm 22.05's notes: ../shared/notes/operations.md.
set -euo pipefail

cmd=${1:-}
case "$cmd" in
check)
    for b in munged slurmctld slurmd sbatch squeue scancel srun sinfo; do
        if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
            echo "no $b (apt-get install slurmctld slurmd slurm-client munge)"
            exit 77
        fi
    done
    if [ "$(id -u)" -ne 0 ]; then
        echo "not root: slurmd must run as root to start jobs"
        exit 77
    fi
    if [ ! -r /etc/munge/munge.key ]; then
        echo "no /etc/munge/munge.key (the munge package creates it)"
        exit 77
    fi
    exit 0
    ;;
start)
    dir=$2
    base=$3
    mkdir -p "$dir"/{state,spool,munge,log}
    chown munge:munge "$dir/munge"
    chmod 0755 "$dir/munge"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=hptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 10))-$((base + 100))
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
MpiDefault=none
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed" --key-file=/etc/munge/munge.key
    export SLURM_CONF=$dir/slurm.conf
    /usr/sbin/slurmctld -f "$SLURM_CONF"
    /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost
    # 60 s in all: a controller that died (a port taken) fails at once, and sinfo, which
    # blocks while no controller answers, gets 3 s per call
    deadline=$((SECONDS + 60))
    st=
    while [ "$SECONDS" -lt "$deadline" ]; do
        if [ -f "$dir/slurmctld.pid" ] && ! kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
            st="slurmctld exited"
            break
        fi
        st=$(timeout 3 sinfo -h -n localhost -o %T 2>/dev/null || true)
        if [ "$st" = "idle" ]; then
            echo "SLURM_CONF=$SLURM_CONF"
            exit 0
        fi
        sleep 0.5
    done
    echo "slurm did not come up (node state '${st:-}')" >&2
    tail -n 20 "$dir"/log/*.log "$dir/munge/munged.log" >&2 || true
    exit 1
    ;;
stop)
    dir=$2
    # the jobs first: slurmstepd (and the ranks) outlive slurmd
    export SLURM_CONF=$dir/slurm.conf
    if [ -f "$dir/slurmctld.pid" ]; then
        scancel --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 1 150); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    pids=()
    for p in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        if [ -f "$p" ]; then
            pid=$(cat "$p")
            kill "$pid" 2>/dev/null && pids+=("$pid")
        fi
    done
    for _ in $(seq 1 50); do
        alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
    done
    ;;
*)
    echo "usage: $0 check | start DIR BASEPORT | stop DIR" >&2
    exit 2
    ;;
esac
