#!/usr/bin/env bash
# Bring up / tear down a real single-node Slurm cluster on localhost, with
# accounting (slurmdbd + a private MariaDB bound to 127.0.0.1) so that sacct
# (and therefore submitit's job.state) works.
#
# Usage: scripts/slurm-local.sh {start|stop|status|clean|optuna-db}
#
# `start` also gives Optuna a database of its own on that MariaDB (database and
# user `optuna`, reachable over 127.0.0.1 and the unix socket), so that `ablate
# tune` can run parallel trials against a server instead of SQLite.
# `optuna-db` (idempotent; needs the MariaDB of `start`) makes sure it exists and
# prints its storage URL, also kept in $ABLATE_SLURM_DIR/etc/optuna.url.
#
# Must run as root (the daemons run as root; munged runs as the munge user).
# No systemd needed: every daemon is started directly.  All config, state and
# logs live under one directory (ABLATE_SLURM_DIR, default /tmp/ablate-slurm).
# Clients (sbatch, squeue, sacct, submitit) find the cluster through
#   export SLURM_CONF="$ABLATE_SLURM_DIR/etc/slurm.conf"
# which `start` prints at the end (also written to $ABLATE_SLURM_DIR/env.sh).
#
# Environment (all optional):
#   ABLATE_SLURM_DIR            state directory            [/tmp/ablate-slurm]
#   ABLATE_SLURM_CLUSTER        ClusterName                [ablate]
#   ABLATE_SLURM_PORT_BASE      slurmctld port; slurmd=+1, slurmdbd=+2  [6817]
#   ABLATE_SLURM_DB_PORT        private MariaDB TCP port (127.0.0.1)    [3307]
#   ABLATE_OPTUNA_DB            Optuna's database and user name         [optuna]
#   ABLATE_SLURM_CPUS           node CPUs                  [$(nproc)]
#   ABLATE_SLURM_MEM_MB         node RealMemory (MB)       [95% of `slurmd -C`]
#   ABLATE_SLURM_TIMEOUT        seconds to wait for readiness/shutdown  [60]
#   ABLATE_SLURM_CRED_EXPIRE    AuthInfo cred_expire (s); also the delay
#                               before a requeued job may start again   [10]
#   ABLATE_SLURM_GRACE_TIME     seconds a preempted job gets before SIGKILL  [30]
#   ABLATE_SLURM_KEEP_JOBS=1    `stop` does not cancel queued/running jobs
set -euo pipefail
umask 022 # clients (any user) must be able to read $DIR/etc/slurm.conf

DIR="${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}"
CLUSTER="${ABLATE_SLURM_CLUSTER:-ablate}"
PORT_BASE="${ABLATE_SLURM_PORT_BASE:-6817}"
CTLD_PORT="$PORT_BASE"
SLURMD_PORT=$((PORT_BASE + 1))
DBD_PORT=$((PORT_BASE + 2))
DB_PORT="${ABLATE_SLURM_DB_PORT:-3307}"
OPTUNA_DB="${ABLATE_OPTUNA_DB:-optuna}"
TIMEOUT="${ABLATE_SLURM_TIMEOUT:-60}"
CRED_EXPIRE="${ABLATE_SLURM_CRED_EXPIRE:-10}"
GRACE_TIME="${ABLATE_SLURM_GRACE_TIME:-30}"
NODE=localhost
PARTITION=cpu

ETC="$DIR/etc"
RUN="$DIR/run"
LOG="$DIR/log"
STATE="$DIR/state"
DB="$DIR/mysql"
DB_SOCK="$DB/mysqld.sock"
MARKER="$DIR/.ablate-slurm"
MUNGE_OURS="$RUN/munged.ours"   # exists iff this script started munged

export SLURM_CONF="$ETC/slurm.conf"

log() { printf '[slurm-local] %s\n' "$*" >&2; }
die() { printf '[slurm-local] ERROR: %s\n' "$*" >&2; exit 1; }

need_root() {
    [[ "$(id -u)" -eq 0 ]] || die "must run as root (daemons are started directly, no systemd)"
}

# ---------------------------------------------------------------- processes

# read_pid PIDFILE: print the pid stored in PIDFILE (empty if none).
read_pid() { tr -dc '0-9' 2>/dev/null <"$1" || true; }

# proc_alive PID NAME: true if PID is a live (non-zombie) process named NAME.
# Zombies matter: without a reaping init (containers), dead daemons linger as Z.
proc_alive() {
    local pid=$1 name=$2 stat
    [[ -n "$pid" ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }          # drop "pid (comm) "; first field is now the state
    [[ "${stat%% *}" != Z ]]
}

# pid_alive PIDFILE NAME: true if PIDFILE names a live process called NAME.
pid_alive() { proc_alive "$(read_pid "$1")" "$2"; }

# stop_pid PIDFILE NAME: SIGTERM, wait, then SIGKILL the process named by PIDFILE.
stop_pid() {
    local pidfile=$1 name=$2 pid i
    pid=$(read_pid "$pidfile")
    if ! proc_alive "$pid" "$name"; then
        rm -f "$pidfile"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < TIMEOUT * 10; i++)); do
        proc_alive "$pid" "$name" || break
        sleep 0.1
    done
    if proc_alive "$pid" "$name"; then
        log "$name did not exit after ${TIMEOUT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$pidfile"
}

# wait_for DESCRIPTION LOGFILE COMMAND...: poll COMMAND until it succeeds;
# after TIMEOUT show its last output and the tail of LOGFILE, and fail.
wait_for() {
    local what=$1 logfile=$2 i out=""
    shift 2
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        if out=$("$@" 2>&1); then
            return 0
        fi
        sleep 0.2
    done
    printf '%s\n' "--- last output of: $*" "$out" >&2
    if [[ -f "$logfile" ]]; then
        printf '%s\n' "--- tail of $logfile" >&2
        tail -n 15 "$logfile" >&2
    fi
    die "timed out after ${TIMEOUT}s waiting for $what"
}

# port_free PORT NAME: fail early if something already listens on 127.0.0.1:PORT.
port_free() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
        die "port $1 (for $2) is already in use on 127.0.0.1; pick others with ABLATE_SLURM_PORT_BASE / ABLATE_SLURM_DB_PORT"
    fi
}

# ---------------------------------------------------------------- munge

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then
        log "munged already running (reusing it)"
        return 0
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m 0700 /etc/munge
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    # munged refuses to run as root ("Logfile is insecure"), and checks that
    # its directories are owned by munge and not writable by others.
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 0700 /etc/munge
    chmod 0600 /etc/munge/munge.key
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    touch "$MUNGE_OURS"
    wait_for "munged" /var/log/munge/munged.log munge_ok
}

stop_munge() {
    if [[ -e "$MUNGE_OURS" ]]; then
        stop_pid /run/munge/munged.pid munged
        rm -f "$MUNGE_OURS"
    fi
}

# ---------------------------------------------------------------- mariadb

db_sql() { mariadb --no-defaults --protocol=socket --socket="$DB_SOCK" -uroot; }
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCK" -uroot ping; }

start_mariadb() {
    if pid_alive "$RUN/mariadbd.pid" mariadbd && db_ok >/dev/null 2>&1; then
        log "mariadbd already running"
    else
        port_free "$DB_PORT" mariadbd
        if [[ ! -d "$DB/data/mysql" ]]; then
            log "initialising MariaDB datadir $DB/data"
            rm -rf "$DB/data"
            mkdir -p "$DB/data"
            mariadb-install-db --no-defaults --user=root --datadir="$DB/data" \
                --auth-root-authentication-method=socket --skip-test-db \
                >"$LOG/mariadb-install-db.log" 2>&1 ||
                die "mariadb-install-db failed, see $LOG/mariadb-install-db.log"
        fi
        log "starting mariadbd on 127.0.0.1:$DB_PORT"
        # --no-defaults: ignore /etc/mysql (a system MariaDB may be configured there).
        setsid -f mariadbd --no-defaults --user=root \
            --datadir="$DB/data" --socket="$DB_SOCK" --pid-file="$RUN/mariadbd.pid" \
            --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
            --log-error="$LOG/mariadb.log" \
            --innodb-buffer-pool-size=1G --innodb-lock-wait-timeout=900 \
            --innodb-log-file-size=64M --innodb-flush-log-at-trx-commit=2 \
            </dev/null >>"$LOG/mariadb.log" 2>&1
        wait_for "mariadbd" "$LOG/mariadb.log" db_ok
    fi
    local pass
    pass=$(cat "$ETC/dbpass")
    # Idempotent: the slurm DB user, reachable over TCP from 127.0.0.1.
    db_sql <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
}

stop_mariadb() { stop_pid "$RUN/mariadbd.pid" mariadbd; }

# ---------------------------------------------------------------- optuna's database

OPTUNA_URL_FILE="$ETC/optuna.url"

# setup_optuna_db: idempotent; database + user $OPTUNA_DB for Optuna studies, its
# URL (TCP on 127.0.0.1, PyMySQL) in $OPTUNA_URL_FILE.  The file is readable by
# local users (their tunes and jobs need it): the user can reach only this
# database, and the server listens on loopback only.
setup_optuna_db() {
    [[ "$OPTUNA_DB" =~ ^[A-Za-z0-9_]+$ ]] || die "ABLATE_OPTUNA_DB must be letters, digits, _ (got '$OPTUNA_DB')"
    if [[ ! -s "$ETC/optuna-dbpass" ]]; then
        (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ETC/optuna-dbpass")
    fi
    local pass
    pass=$(cat "$ETC/optuna-dbpass")
    db_sql <<SQL
CREATE DATABASE IF NOT EXISTS \`$OPTUNA_DB\`;
CREATE USER IF NOT EXISTS '$OPTUNA_DB'@'localhost' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS '$OPTUNA_DB'@'127.0.0.1' IDENTIFIED BY '$pass';
ALTER USER '$OPTUNA_DB'@'localhost' IDENTIFIED BY '$pass';
ALTER USER '$OPTUNA_DB'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON \`$OPTUNA_DB\`.* TO '$OPTUNA_DB'@'localhost';
GRANT ALL ON \`$OPTUNA_DB\`.* TO '$OPTUNA_DB'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
    printf 'mysql+pymysql://%s:%s@127.0.0.1:%s/%s\n' "$OPTUNA_DB" "$pass" "$DB_PORT" "$OPTUNA_DB" \
        >"$OPTUNA_URL_FILE.new"
    install_if_changed "$OPTUNA_URL_FILE.new" "$OPTUNA_URL_FILE" 0644
}

cmd_optuna_db() {
    need_root
    [[ -f "$MARKER" ]] && db_ok >/dev/null 2>&1 ||
        die "no MariaDB of this script answers on $DB_SOCK: run '$0 start' first"
    setup_optuna_db
    log "Optuna storage (TCP; over the socket: mysql+pymysql://$OPTUNA_DB:PASS@localhost/$OPTUNA_DB?unix_socket=$DB_SOCK):"
    cat "$OPTUNA_URL_FILE"
}

# ---------------------------------------------------------------- config

node_mem_mb() {
    if [[ -n "${ABLATE_SLURM_MEM_MB:-}" ]]; then
        echo "$ABLATE_SLURM_MEM_MB"
        return
    fi
    local real
    real=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]\+\).*/\1/p' | head -n1)
    [[ -n "$real" ]] || die "could not read RealMemory from 'slurmd -C'"
    # A bit below what slurmd reports, else the node registers INVALID.
    echo $((real * 95 / 100))
}

# install_if_changed SRC DEST MODE: replace DEST by SRC only if content differs.
install_if_changed() {
    local src=$1 dest=$2 mode=$3
    if [[ -f "$dest" ]] && cmp -s "$src" "$dest"; then
        rm -f "$src"
    else
        mv -f "$src" "$dest"
    fi
    chmod "$mode" "$dest"
}

write_config() {
    local cpus mem defmem pass send_user_signal
    cpus="${ABLATE_SLURM_CPUS:-$(nproc)}"
    mem=$(node_mem_mb)
    defmem=$((mem / cpus))
    if [[ ! -s "$ETC/dbpass" ]]; then
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ETC/dbpass")
    fi
    pass=$(cat "$ETC/dbpass")
    # Slurm >= 23.02 moved this option to PreemptParameters.
    if (($(slurmd -V | sed -n 's/^slurm[^ ]* \([0-9]\+\)\..*/\1/p') >= 23)); then
        send_user_signal=PreemptParameters=send_user_signal
    else
        send_user_signal=SlurmctldParameters=preempt_send_user_signal
    fi

    cat >"$ETC/slurm.conf.new" <<EOF
# Generated by scripts/slurm-local.sh -- edits are overwritten by 'start'.
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start
# again (Slurm default 120 s); keep it short for tests.
AuthInfo=cred_expire=$CRED_EXPIRE
MailProg=/bin/true

StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups (containers / CI): plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# Trust this file's node description even if the hardware looks smaller
# (avoids the node being drained/INVALID on odd CI machines).
SlurmdParameters=config_overrides
# A DOWN node comes back by itself once slurmd registers again.
ReturnToService=2

# Requeue / preemption: batch jobs are requeueable by default (JobRequeue=1),
# so 'scontrol requeue JOBID' works.  Jobs in QOS "high" (sbatch --qos=high)
# preempt jobs in QOS "normal" by requeueing them; the victim first gets its
# --signal (submitit: USR2, so it can checkpoint and requeue itself) and is
# killed after the QOS GraceTime.
JobRequeue=1
PreemptType=preempt/qos
PreemptMode=REQUEUE
PriorityType=priority/multifactor
PriorityWeightQOS=10000

MaxArraySize=1001
MaxJobCount=100000
MinJobAge=300
KillWait=5
# Scan pending jobs often (defaults 60 s / 30 s): a requeued job becomes
# eligible cred_expire seconds later without any event waking the scheduler.
SchedulerParameters=sched_interval=5,bf_interval=5
# See "Requeue / preemption" above.
$send_user_signal
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60

AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$NODE
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=2-00:00:00 DefaultTime=01:00:00 DefMemPerCPU=$defmem State=UP
EOF

    cat >"$ETC/slurmdbd.conf.new" <<EOF
# Generated by scripts/slurm-local.sh -- edits are overwritten by 'start'.
AuthType=auth/munge
DbdHost=$NODE
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    install_if_changed "$ETC/slurm.conf.new" "$ETC/slurm.conf" 0644
    # slurmdbd insists on mode 600 and ownership by SlurmUser.
    install_if_changed "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf" 0600

    cat >"$DIR/env.sh" <<EOF
export SLURM_CONF=$ETC/slurm.conf
EOF
}

# ---------------------------------------------------------------- slurm

dbd_ok() { sacctmgr -n -P show cluster format=cluster; }
node_state() { sinfo -h -n "$NODE" -o '%t' 2>/dev/null | head -n1; }
sacct_ok() { sacct -n -X -o JobID -S now-1minute; }

hms() { printf '%02d:%02d:%02d' $(($1 / 3600)) $(($1 % 3600 / 60)) $(($1 % 60)); }

start_slurmdbd() {
    if pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
        log "slurmdbd already running"
    else
        port_free "$DBD_PORT" slurmdbd
        log "starting slurmdbd on port $DBD_PORT"
        slurmdbd
    fi
    wait_for "slurmdbd" "$LOG/slurmdbd.log" dbd_ok
    # The cluster must exist in the database before slurmctld first starts.
    if ! dbd_ok | grep -qx "$CLUSTER"; then
        log "registering cluster '$CLUSTER' in accounting"
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
    if ! sacctmgr -n -P show qos format=name | grep -qx high; then
        log "adding QOS 'high' (preempts 'normal' by requeue)"
        sacctmgr -i add qos high >/dev/null
    fi
    # GraceTime belongs to the *victim's* QOS: a preempted "normal" job gets
    # its --signal right away (send_user_signal) and SIGKILL GraceTime later.
    if [[ "$(sacctmgr -n -P show qos normal,high format=name,priority,preempt,preemptmode,gracetime | sort)" \
        != "$(printf 'high|100|normal|requeue|00:00:00\nnormal|0||cluster|%s' "$(hms "$GRACE_TIME")")" ]]; then
        sacctmgr -i modify qos high set Priority=100 Preempt=normal PreemptMode=requeue GraceTime=0 >/dev/null
        sacctmgr -i modify qos normal set GraceTime="$GRACE_TIME" >/dev/null
    fi
}

start_slurmctld() {
    if pid_alive "$RUN/slurmctld.pid" slurmctld; then
        log "slurmctld already running"
    else
        port_free "$CTLD_PORT" slurmctld
        log "starting slurmctld on port $CTLD_PORT"
        slurmctld
    fi
    wait_for "slurmctld" "$LOG/slurmctld.log" scontrol ping
}

start_slurmd() {
    if pid_alive "$RUN/slurmd.pid" slurmd; then
        log "slurmd already running"
    else
        port_free "$SLURMD_PORT" slurmd
        log "starting slurmd (node $NODE)"
        # -N: the machine's hostname need not match NodeName.
        slurmd -N "$NODE"
    fi
}

wait_node_idle() {
    local i st
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        st=$(node_state)
        case "$st" in
        idle | mix | alloc) return 0 ;;
        drain* | down* | inval* | fail*)
            # Left over from an unclean stop, or a "Node unexpectedly rebooted".
            if ((i % 10 == 5)); then
                log "node is '$st', resuming it"
                scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
            fi
            ;;
        esac
        sleep 0.2
    done
    scontrol show node "$NODE" >&2 || true
    die "timed out after ${TIMEOUT}s waiting for node $NODE to be idle (state '${st:-?}'; logs: $LOG/)"
}

all_running() {
    munge_ok &&
        pid_alive "$RUN/mariadbd.pid" mariadbd &&
        pid_alive "$RUN/slurmdbd.pid" slurmdbd &&
        pid_alive "$RUN/slurmctld.pid" slurmctld &&
        pid_alive "$RUN/slurmd.pid" slurmd
}

# ---------------------------------------------------------------- commands

cmd_start() {
    need_root
    local t0=$SECONDS
    if [[ -f "$MARKER" ]] && all_running; then
        # Config is not rewritten here: 'stop' then 'start' to apply new settings.
        log "already running (state in $DIR)"
        setup_optuna_db
        wait_node_idle
        wait_for "sacct" "$LOG/slurmdbd.log" sacct_ok
        echo "export SLURM_CONF=$ETC/slurm.conf"
        return 0
    fi
    if [[ -d "$DIR" && ! -f "$MARKER" && -n "$(ls -A "$DIR")" ]]; then
        die "$DIR exists, is not empty and was not created by this script"
    fi
    mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$STATE/slurmd" "$DB"
    touch "$MARKER"
    write_config
    start_munge
    start_mariadb
    setup_optuna_db
    start_slurmdbd
    start_slurmctld
    start_slurmd
    wait_node_idle
    wait_for "sacct" "$LOG/slurmdbd.log" sacct_ok
    log "cluster '$CLUSTER' up in $((SECONDS - t0))s: partition '$PARTITION', $(sinfo -h -o '%c CPUs, %m MB' | head -n1)"
    log "to use it:"
    echo "export SLURM_CONF=$ETC/slurm.conf"
}

cmd_stop() {
    need_root
    if [[ ! -f "$MARKER" ]]; then
        log "nothing to stop ($DIR was not set up by this script)"
        return 0
    fi
    if [[ "${ABLATE_SLURM_KEEP_JOBS:-0}" != 1 ]] && pid_alive "$RUN/slurmctld.pid" slurmctld; then
        local jobs i
        jobs=$(squeue -h -o '%A' 2>/dev/null || true)
        if [[ -n "$jobs" ]]; then
            log "cancelling $(wc -w <<<"$jobs") job(s) (set ABLATE_SLURM_KEEP_JOBS=1 to keep them)"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for ((i = 0; i < TIMEOUT * 5; i++)); do
                [[ -z "$(squeue -h -t R,CG -o '%A' 2>/dev/null)" ]] && break
                sleep 0.2
            done
        fi
    fi
    stop_pid "$RUN/slurmd.pid" slurmd
    stop_pid "$RUN/slurmctld.pid" slurmctld
    stop_pid "$RUN/slurmdbd.pid" slurmdbd
    stop_mariadb
    stop_munge
    log "stopped (state kept in $DIR; 'clean' removes it)"
}

cmd_status() {
    local rc=0 name
    if [[ ! -f "$MARKER" ]]; then
        echo "not set up ($DIR)"
        return 3
    fi
    if munge_ok; then echo "munged:    running"; else echo "munged:    NOT running"; rc=3; fi
    for name in mariadbd slurmdbd slurmctld slurmd; do
        if pid_alive "$RUN/$name.pid" "$name"; then
            printf '%-10s running (pid %s)\n' "$name:" "$(read_pid "$RUN/$name.pid")"
        else
            printf '%-10s NOT running\n' "$name:"
            rc=3
        fi
    done
    if pid_alive "$RUN/slurmctld.pid" slurmctld; then
        sinfo || true
    fi
    echo "export SLURM_CONF=$ETC/slurm.conf"
    return "$rc"
}

cmd_clean() {
    cmd_stop
    if [[ -f "$MARKER" ]]; then
        log "removing $DIR"
        rm -rf -- "$DIR"
    fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
clean) cmd_clean ;;
optuna-db) cmd_optuna_db ;;
*)
    echo "usage: $0 {start|stop|status|clean|optuna-db}" >&2
    exit 2
    ;;
esac
