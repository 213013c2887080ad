# SPDX-License-Identifier: GPL-2.0 OR MIT
"""What the benchmark scripts share for their JSON lines: printed, and appended to --out."""
import datetime
import json


def emitter(path):
    """A function that prints one record as a JSON line and, where `path` is set, appends it
    there too (flushed at once: a run cut short keeps what it measured)."""
    out = open(path, "a") if path else None

    def emit(rec):
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    return emit


def now():
    """The time of a run's meta line: UTC, to the minute."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
