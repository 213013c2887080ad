#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""scripts/reliability's choice of logs, on made-up kept logs in a temporary cache: the newest
full run of a kernel, whole or every part of one scripts/test run (run=), never a newer
incomplete run, a hand run without an id, a run of a few tests, or parts of two runs; and
take() then parse(), which must give back each part as a run of its own, named, without
splitting on a test's own output. Prints "ok - ..." / "not ok - ..." lines and
"reliability_select: N passed, N failed"."""

import importlib.machinery
import importlib.util
import lzma
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "reliability")
sys.path.insert(0, os.path.dirname(HERE))
from tally import Tally  # noqa: E402

tally = Tally("reliability_select")
expect = tally.check


def load(cache):
    os.environ["GDIRECT_CACHE"] = cache
    loader = importlib.machinery.SourceFileLoader("reliability", SCRIPT)
    spec = importlib.util.spec_from_loader("reliability", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def log(cache, variant, stamp, full=1, part="1/1", run="none", tests=("a.sh",), extra=""):
    """A kept console log as scripts/vm writes it: its head, the tests' lines, its verdict."""
    name = f"console-{variant}-{stamp}-4242.log"  # scripts/vm's name: its time, then its pid
    lines = [f"# gdirect-vm variant={variant} commit=abc1234 date=2026-12-07T00:00:00Z "
             f"tests={len(tests)} omitted=0 full={full} nv_driver=580 part={part} run={run} "
             "intel_cpu=0"]
    for i, t in enumerate(tests, 1):
        lines += [f"# selftests: gdirect: {t}", extra, f"ok {i} selftests: gdirect: {t}",
                  f"# {t} took 3s"]
    lines.append(f"# gdirect-vm-result passed={len(tests)} failed=0 skipped=0 host_checks=0 "
                 "kernel_reports=0 problems=0 seconds=9")
    path = os.path.join(cache, "logs", name)
    with open(path, "w") as f:
        f.write("\n".join(ln for ln in lines if ln) + "\n")
    return path


def exits(fn, *args):
    try:
        fn(*args)
    except SystemExit as e:
        return str(e.code)
    return None


def main():
    with tempfile.TemporaryDirectory() as cache:
        os.makedirs(os.path.join(cache, "logs"))
        rel = load(cache)
        expect("no kept log: a clear refusal", "run scripts/test first" in (exits(rel.newest, "debug") or ""))

        a1 = log(cache, "debug", "20261207-100000", part="1/2", run="A", tests=("a.sh", "b.sh"))
        a2 = log(cache, "debug", "20261207-100100", part="2/2", run="A", tests=("c.sh",))
        got = rel.newest("debug")
        expect("both parts of one run, in part order", got == [a1, a2], got)

        # A newer run of which one part was kept (the other still running, or failed early).
        log(cache, "debug", "20261207-110000", part="2/2", run="B")
        got = rel.newest("debug")
        expect("a newer incomplete run is passed over", got == [a1, a2], got)

        # A newer hand run of one part (no run id), and a newer run of a few tests.
        log(cache, "debug", "20261207-120000", part="1/2", run="none")
        log(cache, "debug", "20261207-120100", part="2/2", run="none")
        log(cache, "debug", "20261207-130000", full=0)
        got = rel.newest("debug")
        expect("hand-run parts without an id and a --run of a few are passed over", got == [a1, a2], got)

        b1 = log(cache, "debug", "20261207-140000", part="1/2", run="C")
        got = rel.newest("debug")
        expect("a part of another run never completes an older one", got == [a1, a2], got)
        b2 = log(cache, "debug", "20261207-140100", part="2/2", run="C")
        got = rel.newest("debug")
        expect("the newest complete run wins", got == [b1, b2], got)

        whole = log(cache, "debug", "20261207-150000")
        got = rel.newest("debug")
        expect("a newer whole run (part 1/1) stands alone", got == [whole], got)
        t = log(cache, "test", "20261207-150000", tests=("a.sh",))

        results = os.path.join(cache, "results")
        rel.RESULTS = results
        why = exits(rel.take, t, [a1, b2])
        expect("take refuses parts of two runs", why is not None and "is not part 2/2" in why, why)
        why = exits(rel.take, t, [a2, a1])
        expect("take refuses parts out of order", why is not None and "is not part 1/2" in why, why)
        why = exits(rel.take, whole, [b1, b2])
        expect("take refuses a debug log as the test kernel's", why is not None and "full test run" in why, why)
        few = log(cache, "test", "20261207-150100", full=0)
        why = exits(rel.take, few, [b1, b2])
        expect("take refuses a run of a few tests", why is not None and "full test run" in why, why)

        # A test whose own output is a "# kept as" line: printed inside a part, never above a
        # run's first line, so it must not split the part.
        c1 = log(cache, "debug", "20261207-160000", part="1/2", run="D", tests=("a.sh", "b.sh"),
                 extra="# kept as console-debug-x.log")
        c2 = log(cache, "debug", "20261207-160100", part="2/2", run="D", tests=("c.sh",))
        why = exits(rel.take, t, [c1, c2])
        expect("take keeps one run's parts", why is None, why)
        runs = rel.parse(rel.committed("debug"))
        expect("parse gives back two parts", len(runs) == 2, len(runs))
        if len(runs) == 2:
            expect("each part named by its log", [r["kept"] for r in runs]
                   == [os.path.basename(c1), os.path.basename(c2)], [r["kept"] for r in runs])
            expect("each part's own tests and head", runs[0]["order"] == ["a.sh", "b.sh"]
                   and runs[1]["order"] == ["c.sh"] and runs[1]["head"].get("part") == "2/2",
                   [(r["order"], r["head"]) for r in runs])
        expect("each test's seconds read", runs[0]["tests"].get("b.sh", {}).get("seconds") == 3,
               runs[0]["tests"])
        with lzma.open(rel.committed("test"), "rt") as f:
            text = f.read()
        expect("the test kernel's log kept whole under its name",
               text.startswith(f"# kept as {os.path.basename(t)}\n# gdirect-vm variant=test"), text[:80])

    return tally.summary()


if __name__ == "__main__":
    sys.exit(main())
