# SPDX-License-Identifier: GPL-2.0 OR MIT
"""The path GPU memory takes from Python is the Rust library's: the module where it serves,
the compat engine otherwise, with the library's reasons. The GPU machines we have run no
module, so what is checked here is that the reports and stats name why (never a package-only
reason), that GDIRECT_COMPAT_MODE=off makes that an error, not a silent fallback, and that =on
is reported as asked. (The module's side, the registrations kept per allocation, runs in the
rig on the emulated GPU: direct_cache.sh.)"""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import gdirect

LIBRARY_REASONS = {"no_module", "no_access", "incompatible", "unavailable", "no_provider"}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("route") / "data.bin"
    data = np.random.default_rng(9).integers(0, 256, 4 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return str(path), torch.from_numpy(data)


def test_reads_and_writes_say_why_the_compat_engine_moved_them(data_file, tmp_path):
    path, data = data_file
    dest = torch.full((4 << 20,), 0xA5, dtype=torch.uint8, device="cuda:0")
    r = gdirect.File(path).read(dest)
    assert torch.equal(dest.cpu(), data)
    module = gdirect.stats()["module"]
    if module == "available":
        pytest.skip("a module serves this machine: its own reports are the rig's to check")
    assert module in LIBRARY_REASONS
    assert (r.engine, r.reason, r.module_bytes) == ("compat", module, 0)
    out = tmp_path / "out.bin"
    w = gdirect.File(str(out), "w").write(dest)
    assert (w.engine, w.reason) == ("compat", module)
    assert out.read_bytes() == data.numpy().tobytes()
    # Host memory: the compat engine's by design; its reason is the same where no module is.
    h = gdirect.File(path).read(bytearray(4096))
    assert h.reason == module


def child(code, **env):
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


READ = """
import torch, gdirect
dest = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda:0")
try:
    r = gdirect.File({path!r}).read(dest)
    print("read", r.engine, r.reason)
except OSError as e:
    print("OSError", e.errno, e)
"""


def test_compat_mode_off_is_an_error_that_names_the_reason(data_file):
    path, _ = data_file
    r = child(READ.format(path=path), GDIRECT_COMPAT_MODE="off")
    assert r.returncode == 0, r.stderr
    got = r.stdout.split()
    if got[:2] == ["read", "module"]:
        pytest.skip("a module serves this machine")
    assert got[:2] == ["OSError", str(errno.EOPNOTSUPP)], r.stdout
    assert "GDIRECT_COMPAT_MODE=off" in r.stdout and "gdirect module" in r.stdout, r.stdout


def test_compat_mode_on_is_reported_as_asked(data_file):
    path, _ = data_file
    r = child(READ.format(path=path), GDIRECT_COMPAT_MODE="on")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["read", "compat", "requested"], r.stdout
