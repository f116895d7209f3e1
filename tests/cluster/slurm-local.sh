#!/usr/bin/env bash
# A real single-node SLURM on this machine, for the `slurm` tests.
#   tests/cluster/slurm-local.sh install   # Debian's slurmctld, slurmd, munge (root, apt)
#   tests/cluster/slurm-local.sh start     # write slurm.conf, start munged, slurmctld, slurmd
#   tests/cluster/slurm-local.sh stop
# One node with the machine's CPUs and memory, partitions `cpu` (default) and `gpu` on the
# same node, no GRES (GPU rules run with GRADLEAK_SLURM_GPUS=0), no accounting database:
# `sacct` answers from slurmctld, which keeps finished jobs for MinJobAge = 1 hour.
set -euo pipefail
conf=/etc/slurm/slurm.conf
state=/var/lib/gradleak-slurm

install() {
    [ "$(id -u)" = 0 ] || { echo "slurm-local: installing needs root" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge \
        >/dev/null
}

start() {
    command -v slurmctld >/dev/null || { echo "slurm-local: slurmctld not installed" >&2; exit 1; }
    stop >/dev/null 2>&1 || true
    mkdir -p "$state/ctld" "$state/d" /etc/slurm /run/munge
    chown munge:munge /run/munge
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    runuser -u munge -- munged
    local node mem
    node=$(hostname -s)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$conf" <<CONF
ClusterName=gradleak
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
MpiDefault=none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$node MaxTime=INFINITE State=UP
CONF
    slurmctld -c  # a clean state: no node left drained by an earlier run
    slurmd
    for _ in $(seq 30); do
        sinfo -h -o %T 2>/dev/null | grep -q idle && { sinfo; return 0; }
        sleep 1
    done
    echo "slurm-local: the node did not come up; see $state/slurmctld.log and $state/slurmd.log" >&2
    exit 1
}

stop() {
    pkill -x slurmd || true
    pkill -x slurmctld || true
    pkill -x munged || true
}

"${1:?usage: slurm-local.sh install|start|stop}"
