# SPDX-License-Identifier: GPL-2.0
"""The pass/fail count of a host-side test script: prints "ok - WHAT" or "not ok - WHAT: DETAIL"
for each check and, last, "LABEL: N passed, N failed", the line scripts/test's counted_suite
reads."""


class Tally:
    def __init__(self, label):
        self.label, self.passed, self.failed = label, 0, 0

    def check(self, what, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok - {what}")
        else:
            self.failed += 1
            print(f"not ok - {what}: {detail}")
        return ok

    def summary(self):
        """Prints the count; the script's exit status (1 when a check failed)."""
        print(f"{self.label}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
