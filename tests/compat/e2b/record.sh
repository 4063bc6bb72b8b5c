#!/usr/bin/env bash
# Record the wire traffic of the unmodified E2B SDKs against recorder.py.
#
#   tests/compat/e2b/record.sh py  [scenario ...]   # Python SDK
#   tests/compat/e2b/record.sh js  [scenario ...]   # JS SDK
#
# Everything runs in a fresh network namespace that has only loopback
# (unshare -n; needs root), so no packet can leave the machine.  For each
# scenario a fresh recorder writes fixtures/<sdk>-<version>/<scenario>.jsonl
# and the driver's own view lands next to it as <scenario>.sdk.json.
#
# SDK installs (outside the repo), override with E2B_PY / E2B_JS_DIR:
#   python3 -m venv /var/cache/sandfork/compat/e2b-py
#   /var/cache/sandfork/compat/e2b-py/bin/pip install e2b==2.63.0
#   mkdir -p /var/cache/sandfork/compat/e2b-js && cd $_ && npm install e2b@2.51.0
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -z "${E2B_RECORD_IN_NETNS:-}" ]; then
  export E2B_RECORD_IN_NETNS=1
  exec unshare -n -- "$0" "$@"
fi
ip link set lo up
# belt and braces: nothing but lo may exist here
if ip -o link show | grep -v ': lo:' | grep -q .; then echo "unexpected interfaces in the namespace" >&2; exit 1; fi

sdk="${1:?py or js}"; shift || true
E2B_PY="${E2B_PY:-/var/cache/sandfork/compat/e2b-py/bin/python}"
E2B_JS_DIR="${E2B_JS_DIR:-/var/cache/sandfork/compat/e2b-js}"
case "$sdk" in
  py) ver=$("$E2B_PY" -c 'import importlib.metadata as m; print(m.version("e2b"))'); out="$here/fixtures/python-$ver"
      run() { "$E2B_PY" "$here/scenarios_py.py" "$@"; }
      list=$("$E2B_PY" "$here/scenarios_py.py" --list) ;;
  js) ver=$(node -p "require('$E2B_JS_DIR/node_modules/e2b/package.json').version"); out="$here/fixtures/js-$ver"
      export E2B_JS_DIR; run() { node "$here/scenarios.mjs" "$@"; }
      list=$(node "$here/scenarios.mjs" --list) ;;
  *) echo "first argument: py or js" >&2; exit 2 ;;
esac
mkdir -p "$out"
scenarios=("$@"); [ ${#scenarios[@]} -gt 0 ] || read -r -a scenarios <<<"$(echo $list)"

export E2B_API_URL=http://127.0.0.1:3000
export E2B_SANDBOX_URL=http://127.0.0.1:49983
export E2B_API_KEY=e2b_0000000000000000000000000000000000000000
export SCENARIO_OUT="$out"
export SCENARIO_RECORDING=1  # the recorder fakes template builds: drivers check only the wire
work=$(mktemp -d /tmp/e2b-record.XXXXXX)
status=0
for sc in "${scenarios[@]}"; do
  rm -f "$out/$sc.jsonl" "$work/ready"
  extra=(); [ "$sc" = keepalive ] && extra=(--keepalive 1)
  python3 "$here/recorder.py" --log "$out/$sc.jsonl" --root "$work/root-$sc" \
    --api-key "$E2B_API_KEY" --ready-file "$work/ready" "${extra[@]}" &
  rec=$!
  for _ in $(seq 100); do [ -f "$work/ready" ] && break; sleep 0.05; done
  run "$sc" || status=1
  kill "$rec"; wait "$rec" || true
  # order by arrival (lines are written when an exchange completes)
  python3 - "$out/$sc.jsonl" <<'PY'
import json, sys
p = sys.argv[1]
try:
    recs = [json.loads(l) for l in open(p)]
except FileNotFoundError:
    sys.exit(0)
recs.sort(key=lambda r: r["seq"])
with open(p, "w") as f:
    for r in recs:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
PY
done
rm -rf "$work"
exit $status
