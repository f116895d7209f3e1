#!/usr/bin/env bash
# Every phase on the configured device (issue 32), checked on a GPU machine in ~5 minutes:
#   1. tests/test_device.py: each phase on the CPU and on CUDA (module calls on the device,
#      CPU tensors in every .pt file, a CUDA checkpoint loaded on the CPU, same seed on
#      the same device = the same weights, `device: cuda` refused without a GPU);
#   2. the CUDA cases of tests/test_vectorised.py (every attack stacked and one at a time);
#   3. benchmarks/fl_device.py: 200 rounds of LeNet FedAvg on random 3x32x32 data on the
#      CPU and on CUDA, the seconds and the CPU / CUDA ratio;
#   4. `gradleak estimate` of config/test.yaml and each paper configuration on this machine
#      (estimate.csv: a column `config` before estimate's own; the calibration's cache,
#      one JSON per device, in estimate_cache/).
# Needs python3 with torch, torchvision, pandas, scipy, scikit-learn, scikit-image,
# seaborn, pytest, tqdm and pyyaml; jsonschema and cma come from .whl/ when missing (no
# network). Without a GPU the CUDA parts are skipped. The log (and fl_device.csv) go to
# $OUT when it is set, else to results/device_check/. Exit status: the number of failed
# steps.
#
#   bash benchmarks/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/device_check}
mkdir -p "$out"
exec > >(tee "$out/device_check.log") 2>&1

if ! python3 -c "import jsonschema, cma" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 - <<'EOF'
import torch
cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA available: {cuda}"
      + (f", {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}" if cuda else
         " (the CUDA parts are skipped)"))
EOF

failed=0
step() {  # step <name> <seconds> <command...>
    local name=$1 limit=$2
    shift 2
    echo "=== $name (at most ${limit} s)"
    local start=$SECONDS
    timeout "$limit" "$@"
    local status=$?
    echo "=== $name: exit $status after $((SECONDS - start)) s"
    [ "$status" -eq 0 ] || failed=$((failed + 1))
}
# -o addopts= : pyproject's addopts name pytest-xdist's --dist, which may not be installed
pytest=(python3 -m pytest -q -p no:cacheprovider -o addopts= -ra --durations=10)
step "every phase on each device (tests/test_device.py)" 140 "${pytest[@]}" tests/test_device.py
if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    step "attacks on CUDA (tests/test_vectorised.py -k cuda)" 100 \
        "${pytest[@]}" tests/test_vectorised.py -k cuda
else
    echo "=== attacks on CUDA (tests/test_vectorised.py -k cuda): skipped, no GPU"
fi
step "FL on the CPU and on CUDA (benchmarks/fl_device.py)" 120 \
    python3 benchmarks/fl_device.py --rounds 200 --devices cpu auto --out "$out/fl_device.csv"
estimates() {
    for config in config/test.yaml config/paper/*.yaml; do
        GRADLEAK_CACHE="$out/estimate_cache" python3 -m gradleak.cli estimate --config "$config" \
            --format csv | sed "1s/^/config,/; 2,\$s|^|$config,|" > "$out/estimate.part" \
            || return 1
        header=1
        [ -s "$out/estimate.csv" ] && header=2  # one header line, the first file's
        tail -n +"$header" "$out/estimate.part" >> "$out/estimate.csv"
    done
    rm -f "$out/estimate.part"
    cat "$out/estimate.csv"
}
rm -f "$out/estimate.csv"
export out
export -f estimates
step "gradleak estimate of each configuration on this machine" 300 bash -c estimates
echo "device_check: $failed step(s) failed; log in $out/device_check.log"
exit "$failed"
