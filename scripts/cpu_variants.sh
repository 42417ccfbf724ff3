#!/usr/bin/env bash
# Runs the tests that assert on figures ONNX Runtime measures (tests/quality_figures.h) on three CPUs
# from one machine, and prints each figure side by side with its bound and the least headroom:
#   native  - this CPU as it is (on an Intel Xeon with AMX: MLAS's AMX and AVX-512 VNNI kernels);
#   no-amx  - the same CPU with the AMX tile state refused to the process (tests/cpu_variants/
#             no_amx_preload.c), so MLAS keeps to AVX-512, as on a CPU without AMX;
#   avx2    - an AVX2-only CPU, emulated by qemu-user (Debian's qemu-user, installed on first use):
#             no AVX-512 at all, so MLAS dispatches its AVX2 kernels. About 100x slower than native.
# A test that passes on all three with headroom > 1.5 on each figure is not sitting on a threshold.
#
#   bash scripts/cpu_variants.sh [--no-avx2] [GTEST_FILTER]
# Needs a build (scripts/build.sh). Writes the logs and the table to build/cpu_variants/.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

run_avx2=1
filter=""
for arg in "$@"; do
  case "$arg" in
    --no-avx2) run_avx2=0 ;;
    -*) echo "cpu_variants.sh: unknown option '$arg' (known: --no-avx2)" >&2; exit 2 ;;
    *) filter="$arg" ;;
  esac
done
# The suites whose tests print figures (grep -l quality_figures.h tests/optimizer), the 2 GiB one left out.
filter="${filter:-Int4QualityTest.*:PrecisionTest.*:ModelLargerThanMemoryTest.*:SuppliedPerplexityTest.*}"

test_binary=build/tests/optimizer_test
[ -x "$test_binary" ] || { echo "cpu_variants.sh: $test_binary is missing: run scripts/build.sh first" >&2; exit 1; }
out=build/cpu_variants
mkdir -p "$out"
cc -O2 -shared -fPIC -o "$out/no_amx.so" tests/cpu_variants/no_amx_preload.c -ldl

if ((run_avx2)) && ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "cpu_variants: installing qemu-user for the AVX2-only run"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends qemu-user >/dev/null
fi

status=0
run_variant() {
  local name="$1"
  shift
  echo "cpu_variants: $name ..."
  if ! "$@" "$test_binary" --gtest_filter="$filter" >"$out/$name.log" 2>&1; then
    echo "cpu_variants: $name: tests failed (see $out/$name.log)"
    status=1
  fi
}
run_variant native env
run_variant no-amx env LD_PRELOAD="$repo_root/$out/no_amx.so"
variants=(native no-amx)
if ((run_avx2)); then
  run_variant avx2 qemu-x86_64 -cpu max
  variants+=(avx2)
fi

/usr/bin/python3 - "$out" "${variants[@]}" <<'EOF' | tee "$out/figures.md"
import re, sys
out, variants = sys.argv[1], sys.argv[2:]
line_re = re.compile(r"^\[ figure \] (\S+): (.*) (\S+) (<=|>=) (\S+) \((\S+)x\)$")
rows, order = {}, []
for variant in variants:
    for line in open(f"{out}/{variant}.log", errors="replace"):
        m = line_re.match(line.rstrip("\n"))
        if not m:
            continue
        key = (m.group(1), m.group(2), m.group(4), m.group(5))
        if key not in rows:
            rows[key] = {}
            order.append(key)
        rows[key].setdefault(variant, []).append((m.group(3), float(m.group(6))))
print("| test | figure | bound | " + " | ".join(variants) + " | least headroom |")
print("|---|---|---|" + "---|" * len(variants) + "---|")
for key in order:
    test, what, relation, bound = key
    cells, least = [], float("inf")
    for variant in variants:
        values = rows[key].get(variant, [])
        cells.append(", ".join(v for v, _ in values) or "-")
        least = min([least] + [h for _, h in values])
    print(f"| {test} | {what} | {relation} {bound} | " + " | ".join(cells) + f" | {least:.2f}x |")
EOF
exit $status
