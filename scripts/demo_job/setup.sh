#!/bin/sh
# The demo job's setup, as a project would script it: install the packages while the raw
# features are prepared, then train a model in a worker that keeps data and model in
# memory. Runs inside a sandbox; the wheels are in /job/wheels.
set -eu
cd /job
# OpenMP threads that spin while they wait only burn CPU when several jobs share a host.
export OMP_WAIT_POLICY=PASSIVE
python3 -m pip install --quiet --no-index --find-links /job/wheels --break-system-packages \
  -r requirements.txt &
pip=$!
OPENBLAS_NUM_THREADS=1 python3 make_data.py /job/data.npz &
data=$!
wait $pip
wait $data
exec python3 worker.py "$@"
