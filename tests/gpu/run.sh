#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# The GPU checks, on a CUDA machine, from what tests/gpu/pack built (DIR, default .h200):
# `gdirect check` as the node reports it, what the driver says of each allocator's memory
# (tests/gpu/rdma_facts.py), the library's GPU tests, the CLI's (cli.sh) and the
# Python package's (userspace/gdirect-py/tests_gpu), with the package and pytest installed from
# DIR's wheels into a private directory. Prints each part's output under a "== " heading and,
# last, "N passed, N failed" over the parts.
#
# Usage: tests/gpu/run.sh [DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.h200}
site=$(mktemp -d)
pass=0 fail=0
part() {
	local name=$1
	shift
	echo "== $name"
	if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "== $name FAILED"; fi
}
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dir"/whl/*.whl || exit 1
export PYTHONPATH=$site PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
echo "== node: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null), kernel $(uname -r)"
# Its exit status says whether the direct path is possible here (1 on a node without the
# module): what is checked is that it runs and reports.
node_check() { "$dir/gdirect" check; echo "exit=$?"; }
part "gdirect check" node_check
# Which allocators give memory the module may register (a record, not a verdict).
part "rdma facts" python3 tests/gpu/rdma_facts.py
part "the library's GPU tests" "$dir/gdirect-lib-tests" --ignored --test-threads 1
part "cli.sh" tests/gpu/cli.sh "$dir/gdirect"
part "python tests_gpu" python3 -m pytest -q -p no:cacheprovider userspace/gdirect-py/tests_gpu
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
