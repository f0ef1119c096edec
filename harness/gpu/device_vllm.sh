#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, over calls made back to back while it stays warm
# (carried folders vanish between calls; /tmp stays):
#   bash harness/gpu/device_vllm.sh stage1a                     carry .gpuvllm/c1/FA3.so.xz: parked in /tmp/stage
#   bash harness/gpu/device_vllm.sh stage1                      carry .gpuvllm/c1/{C.so.xz,SHA256SUMS,stage1.sh}:
#                                                             native libraries -> /tmp/site (c1 whole and the
#                                                             repository no longer fit one call's 64 MiB)
#   bash harness/gpu/device_vllm.sh start SECONDS MODULE ARG... carry .gpuvllm/c2: unpack, start the driver
#                                                             (harness.gpu.real_vllm SCENARIO..., or
#                                                             bench.real_engine gil_ab|cost|bursts) in its own session, wait
#   bash harness/gpu/device_vllm.sh wait SECONDS                wait more; when done, the results go to $OUT
set -u
OUT=${OUT:-/tmp/out}; RUN=/tmp/realout; mkdir -p "$OUT"
mode=$1; shift
case $mode in
stage1a)
  mkdir -p /tmp/stage && cp .gpuvllm/c1/FA3.so.xz /tmp/stage/ ;;
stage1)
  [ -s .gpuvllm/c1/FA3.so.xz ] || cp /tmp/stage/FA3.so.xz .gpuvllm/c1/ || { echo "run stage1a first, in the call just before"; exit 4; }
  exec bash .gpuvllm/c1/stage1.sh ;;
start)
  budget=$1; module=$2; shift 2
  python3 -c "import tarfile; tarfile.open('.gpuvllm/c2/site.tar.xz').extractall('/tmp/site', filter='fully_trusted')" || { echo SITE_EXTRACT_FAILED; exit 3; }
  for pair in "C.so.xz:vllm/_C_stable_libtorch.abi3.so" "FA3.so.xz:vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"; do
    [ -s "/tmp/site/${pair#*:}" ] || { echo "MISSING /tmp/site/${pair#*:}: run stage1 first, in the call just before"; exit 4; }
  done
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .gpuvllm/c2/py_spy-*.whl || exit 5
  mkdir -p /tmp/staged-model && cp .gpuvllm/c2/model/* /tmp/staged-model/
  rm -rf "$RUN" && mkdir -p "$RUN"
  PATH=/tmp/pyspy/bin:$PATH PYTHONPATH=exporter:. PYTHONUNBUFFERED=1 setsid nohup python3 -m "$module" "$RUN" "$@" > "$RUN/driver.log" 2>&1 &
  echo $! > /tmp/realout.pid
  exec bash "$0" wait "$budget" ;;
wait)
  deadline=$(( $(date +%s) + $1 ))
  pid=$(cat /tmp/realout.pid)
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  tail -25 "$RUN/driver.log"
  if kill -0 "$pid" 2>/dev/null; then
    # the scenarios already recorded come back now: a machine given back before the next call loses only the one running
    tar -C "$RUN" --exclude='*.pt.trace.json.gz' -czf "$OUT/real-vllm-partial.tar.gz" . && cp "$RUN/driver.log" "$OUT/"
    echo "STILL RUNNING"; exit 0
  fi
  # raw torch traces travel on their own (the capture's tar stays small); the largest ones stay behind
  tar -C "$RUN" --exclude='*.pt.trace.json.gz' -czf "$OUT/real-vllm.tar.gz" . && cp "$RUN/driver.log" "$OUT/"
  find "$RUN" -name '*.pt.trace.json.gz' -size -15M | head -4 | while read -r f; do cp "$f" "$OUT/$(basename "$(dirname "$f")")-$(basename "$f")"; done
  echo "DONE"; ls -la "$RUN" ;;
esac
