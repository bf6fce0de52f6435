# Sourced by every queue here: the repository root (found from the queue's own location), the python to run
# (${PYTHON:-python}, importing this clone's populora), the version that names the results folders, and lanes.
# Nothing here names a path outside the clone; logs, locks and run folders go under outputs/ (git-ignored).
set -u
QUEUE=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")  # the queue that sourced this file
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
REPO=$PWD
PY=${PYTHON:-python}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
VERSION=$("$PY" -c "import populora; print(populora.__version__)") || { echo "cannot import populora with $PY" >&2; exit 1; }
LOCKS=${LOCK_DIR:-$REPO/outputs/locks}
mkdir -p outputs/logs "$LOCKS"
# lane A: timings (one at a time on the machine); lane B: long runs whose results do not depend on load.
# Queues of one clone sharing a lane take turns; set LOCK_DIR to one folder to share lanes across clones.
lane() {  # lane a|b command...: run the command holding the lane's lock (or directly where flock is missing)
  local lock="$LOCKS/lane-$1.lock"
  shift
  if command -v flock > /dev/null; then flock "$lock" "$@"; else "$@"; fi
}
whole_queue_in_lane() {  # whole_queue_in_lane a|b "$@": run the calling queue itself again holding the lane's lock
  if [ -z "${QUEUE_IN_LANE:-}" ]; then
    QUEUE_IN_LANE=1 lane "$1" bash "$QUEUE" "${@:2}"
    exit $?
  fi
}
