#!/usr/bin/env bash
# docs/deploy.md's sbatch script under a real Slurm on this host alone: munged,
# slurmctld and slurmd run as children of this script, with a slurm.conf, a
# munge key and state directories of their own in a temporary directory, so
# nothing of the host's Slurm (if any) is used or changed.
#
#   tests/slurm/test_slurm.sh TROUPE_BINARY SOURCE_DIR
#
# 1. The doc's script (the fenced block after the "tests/slurm runs this block"
#    marker, less its #SBATCH lines) trains a tiny job to the end: sbatch
#    succeeds, the job's events.log says succeeded.
# 2. The same script with an endless job is scancel'ed mid-job: afterwards no
#    troupe process of that Slurm job is left.
#
# Exit 77 (ctest: skipped) with the reason when Slurm or munge are missing, or
# the daemons do not come up within the bound (containers often lack what
# slurmd needs): printed with the tails of their logs.
set -uo pipefail

troupe=$(realpath "${1:?usage: test_slurm.sh TROUPE_BINARY SOURCE_DIR}")
src=$(realpath "${2:?usage: test_slurm.sh TROUPE_BINARY SOURCE_DIR}")

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  show_logs
  exit 1
}

for b in munged slurmctld slurmd sbatch srun scancel sinfo squeue scontrol; do
  command -v "$b" >/dev/null || skip "$b not found (apt-get install slurm-wlm munge)"
done
[ "$(id -u)" = 0 ] || skip "needs root: slurmd runs jobs as their user and this test keeps SlurmUser=root"

tmp=$(mktemp -d /tmp/troupe-slurm.XXXXXX)
chmod 755 "$tmp"
pids=()
# Marks every process the test's Slurm jobs start (sbatch hands the environment
# on, the agent hands it to its workers), so that leftovers are ours alone.
export TROUPE_SLURM_TEST="$tmp"

show_logs() {
  local f
  for f in "$tmp"/log/*.log "$tmp"/work/*.out; do
    [ -s "$f" ] || continue
    echo "---- tail of $f"
    tail -n 25 "$f"
  done
}

# Troupe processes started under our Slurm (coordinator, agents, workers): the
# binary under test, carrying the marker above. By /proc, not by name: an agent
# starts its workers through /proc/self/exe, so their name is "exe".
ours() {
  local d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$(readlink "$d/exe" 2>/dev/null)" = "$troupe" ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TROUPE_SLURM_TEST=$tmp" && echo "$p"
  done
}

cleanup() {
  local p
  if [ -s "$tmp/slurm.conf" ]; then
    SLURM_CONF="$tmp/slurm.conf" timeout 10 scancel --quiet --user=root 2>/dev/null
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  # What the daemons left (a job's slurmstepd outlives a killed slurmd), then $tmp.
  [ -f "$tmp/sweep.sh" ] && bash "$tmp/sweep.sh" $$
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The sweep: kills every process of this test but the one given, the daemons (pids in
# $tmp/daemons.pids) with all their descendants, whatever carries the marker (a job's
# script, srun, troupe) and whatever holds a file in $tmp open (slurmstepd, which
# daemonizes and drops the environment). A few rounds, for what was starting meanwhile.
write_sweep() {
  cat >"$tmp/sweep.sh" <<SWEEP
#!/usr/bin/env bash
spare=\$1
pid_of() { local d; while read -r d; do d=\${d#/proc/}; echo "\${d%%/*}"; done; }
children() { grep -l "^PPid:[[:space:]]*\$1\$" /proc/[0-9]*/status 2>/dev/null | pid_of; }
tree() { local c; echo "\$1"; for c in \$(children "\$1"); do tree "\$c"; done; }
victims=
for p in \$(cat "$tmp/daemons.pids" 2>/dev/null); do victims="\$victims \$(tree "\$p")"; done
for round in 1 2 3 4 5; do
  victims="\$victims \$(grep -lzx "TROUPE_SLURM_TEST=$tmp" /proc/[0-9]*/environ 2>/dev/null | pid_of)"
  victims="\$victims \$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$tmp/*" 2>/dev/null | pid_of)"
  for p in \$victims; do
    # Not the caller, this sweep (which reads this file from \$tmp) nor its children.
    case " \$spare \$\$ \$(children \$\$ | xargs) " in *" \$p "*) continue ;; esac
    kill -KILL "\$p" 2>/dev/null
  done
  victims=
  sleep 0.3
done
SWEEP
}

# A guard for what the trap cannot do: when this script is SIGKILLed (ctest's TIMEOUT), its
# daemons and jobs would stay behind. In a session of its own, the guard waits for this
# script to end; if $tmp is still there (no trap ran), it sweeps and removes it.
guard() {
  cat >"$tmp/guard.sh" <<GUARD
#!/usr/bin/env bash
while kill -0 $$ 2>/dev/null; do sleep 1; done
[ -d "$tmp" ] || exit 0
bash "$tmp/sweep.sh" \$\$
rm -rf "$tmp"
GUARD
  # Started from a subshell that exits at once: the guard is no child of this script (whose
  # trap waits for its children) nor of ctest (which kills the tree of its test on a timeout).
  (setsid bash "$tmp/guard.sh" </dev/null >/dev/null 2>&1 &)
}

# A daemon just started: stopped politely by cleanup, and swept (with its descendants) by
# the sweep, also the guard's.
daemon_started() {
  pids+=("$1")
  echo "$1" >>"$tmp/daemons.pids"
}

mkdir -p "$tmp"/{log,state,spool,munge,work}
write_sweep
guard

# ---- munge, with a key of its own and its socket in $tmp
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
socket="$tmp/munge/munge.socket"
# --force: the socket's directory lies under /tmp, which munged would otherwise refuse.
munged --foreground --force --key-file="$tmp/munge/munge.key" --socket="$socket" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munge.seed" \
  --log-file="$tmp/log/munged.log" >"$tmp/log/munged.out.log" 2>&1 &
daemon_started $!
for _ in $(seq 50); do
  [ -S "$socket" ] && break
  sleep 0.1
done
[ -S "$socket" ] || { show_logs; skip "munged did not come up within 5 s"; }

# ---- slurm.conf for this host alone. Ports: random, away from a host Slurm's 6817/6818.
port=$((20000 + RANDOM % 20000))
cat >"$tmp/slurm.conf" <<EOF
ClusterName=troupetest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Seconds between scancel's SIGTERM and SIGKILL.
KillWait=10
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out.log" 2>&1 &
daemon_started $!
slurmd -D -N localhost -f "$SLURM_CONF" >"$tmp/log/slurmd.out.log" 2>&1 &
daemon_started $!

# Bounded: the node idle within 30 s, or this host cannot run Slurm (skip).
up=0
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -n localhost -o %T 2>/dev/null)
  case "$state" in idle*) up=1; break ;; esac
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { show_logs; skip "a daemon exited while starting (pid $p)"; }; done
  sleep 0.2
done
[ "$up" = 1 ] || { show_logs; skip "node not idle within 30 s (sinfo: '${state:-no answer}')"; }
echo "slurm up: node localhost idle, $(nproc) CPUs"

# ---- the script of docs/deploy.md, as it stands there, less its #SBATCH lines
awk '/tests\/slurm runs this block/ {m = 1; next} m == 1 && /^```/ {m = 2; next} m == 2 && /^```/ {exit} m == 2' \
  "$src/docs/deploy.md" | grep -v '^#SBATCH' >"$tmp/troupe.sbatch"
grep -q 'srun .*troupe agent' "$tmp/troupe.sbatch" || fail "no sbatch script found in docs/deploy.md"

PATH="$(dirname "$troupe"):$PATH"
export PATH
export TROUPE_DEVICES=cpu:1
sed -e 's/^name: .*/name: slurm-tiny/' -e 's/^  steps: .*/  steps: 4/' \
  "$src/configs/layouts/tiny_dp1_pp1_tp1.yaml" >"$tmp/work/tiny.yaml"
sed -e 's/^name: .*/name: slurm-endless/' -e 's/^  steps: .*/  steps: 100000000/' \
  "$src/configs/layouts/tiny_dp1_pp1_tp1.yaml" >"$tmp/work/endless.yaml"
grep -q 'steps: 4$' "$tmp/work/tiny.yaml" || fail "could not shorten the tiny job spec"

cd "$tmp/work" || fail "cd $tmp/work"
submit() {  # submit NAME SPEC: prints the Slurm job id
  sbatch --parsable --job-name="$1" --nodes=1 --ntasks-per-node=1 --exclusive --time=10 \
    --output="$tmp/work/$1.out" "$tmp/troupe.sbatch" "$2"
}
slurm_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
exit_code() { scontrol show job "$1" 2>/dev/null | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p'; }

# ---- 1. a tiny job to the end
id=$(submit tiny "$tmp/work/tiny.yaml") || fail "sbatch refused the script"
echo "sbatch: job $id (tiny, 4 steps)"
st=
for _ in $(seq 600); do  # 120 s
  st=$(slurm_state "$id")
  case "$st" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;; esac
  sleep 0.2
done
[ "$st" = COMPLETED ] || fail "job $id ended $st (exit $(exit_code "$id")), not COMPLETED"
grep -q 'succeeded' "$tmp/work/tiny.out" || fail "the script's output does not say succeeded"
events=$(find "$tmp/work/runs" -path '*/slurm-tiny-*/events.log' 2>/dev/null | head -n1)
[ -n "$events" ] || fail "no runs/slurm-tiny-*/events.log"
grep -q 'succeeded' "$events" || fail "$events does not record succeeded"
echo "events.log: $(tail -n 1 "$events")"
echo "ok: job $id COMPLETED, $events records succeeded"
[ -z "$(ours)" ] || fail "troupe processes left after the tiny job: $(ours | xargs)"

# ---- 2. an endless job, scancel'ed mid-job
id=$(submit endless "$tmp/work/endless.yaml") || fail "sbatch refused the script"
echo "sbatch: job $id (endless)"
stepped=0
for _ in $(seq 300); do  # 60 s until its first steps
  if grep -q '^step ' "$tmp/work/endless.out" 2>/dev/null; then stepped=1; break; fi
  st=$(slurm_state "$id")
  case "$st" in PENDING | RUNNING | CONFIGURING | "") ;; *) fail "endless job $id ended $st before its first step" ;; esac
  sleep 0.2
done
[ "$stepped" = 1 ] || fail "endless job $id made no step within 60 s"
[ -n "$(ours)" ] || fail "no troupe process of job $id found while it runs"
echo "endless job $id is stepping; its troupe processes:"
for p in $(ours); do echo "  $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-100)"; done
[ "$(ours | wc -l)" -ge 3 ] || fail "expected a coordinator, an agent and a worker of job $id"
scancel "$id" || fail "scancel $id"
gone=0
for _ in $(seq 150); do  # 30 s: KillWait is 10 s
  st=$(slurm_state "$id")
  if [ -z "$(ours)" ] && [ "$st" != RUNNING ] && [ "$st" != COMPLETING ]; then gone=1; break; fi
  sleep 0.2
done
[ "$gone" = 1 ] || fail "after scancel $id (state $st): troupe processes left: $(ours | xargs)"
[ "$st" = CANCELLED ] || fail "job $id ended $st after scancel, not CANCELLED"
echo "ok: job $id CANCELLED, no troupe process left"
echo "---- the end of its output"
tail -n 6 "$tmp/work/endless.out"
echo "PASS"
