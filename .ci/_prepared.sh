# Sourced by .ci/accelerator-compile, .ci/vllm-cpu and .ci/ray-image: where the step's
# virtual environment lives, and whether its bulk (every requirement but rlctl itself)
# is already installed.
#
# Alone, a step installs into a fresh temporary folder, removed at exit. Under .ci/run,
# RLCTL_CI_PREPARED names a folder that outlives each step: .ci/run starts every step
# with --prepare beside the tests, which installs the bulk only (pip's downloads and
# unpacking overlap pytest's CPU work; nothing is written in the source tree, where
# several editable installs at once would each write rlctl.egg-info), then runs the step
# where it stands: its own install commands, unchanged, find the bulk there and add
# rlctl. A --prepare that fails fails CI where the step stands, as its install did.
#
#   prepared_work NAME "$@"   # sets work (the folder), prepare (true: bulk, then exit)
#   bulk_installed            # true when $work/venv has the bulk
#   mark_bulk                 # after the bulk's install commands
prepared_work() {
  local name=$1
  shift
  prepare=false
  if [ "${1:-}" = "--prepare" ]; then prepare=true; fi
  if [ -n "${RLCTL_CI_PREPARED:-}" ]; then
    work="$RLCTL_CI_PREPARED/$name"
    mkdir -p "$work"
  else
    work=$(mktemp -d "${TMPDIR:-/tmp}/rlctl-$name.XXXXXX")
    # shellcheck disable=SC2064  # this run's folder, fixed now
    trap "rm -rf '$work'" EXIT
  fi
}
bulk_installed() { [ -e "$work/venv/.bulk-installed" ]; }
mark_bulk() { touch "$work/venv/.bulk-installed"; }
