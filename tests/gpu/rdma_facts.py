# SPDX-License-Identifier: GPL-2.0 OR MIT
"""What the CUDA driver says of the memory each allocator hands out: from a stream-ordered
pool or not (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE), and whether a third-party device may reach
it (CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE). The module registers what is capable and
not pooled; the Python package passes PyTorch's and CuPy's memory, so this is the record of
which of their allocators give it memory it can use.

Usage: python3 tests/gpu/rdma_facts.py          (every allocator, each in a child process)
       python3 tests/gpu/rdma_facts.py NAME     (one: prints one line)
"""
import ctypes
import os
import subprocess
import sys

MEMPOOL_HANDLE = 17
IS_GPU_DIRECT_RDMA_CAPABLE = 15


def facts(ptr):
    cuda = ctypes.CDLL("libcuda.so.1")
    pool = ctypes.c_void_p()
    r1 = cuda.cuPointerGetAttribute(ctypes.byref(pool), MEMPOOL_HANDLE, ctypes.c_uint64(ptr))
    capable = ctypes.c_int()
    r2 = cuda.cuPointerGetAttribute(
        ctypes.byref(capable), IS_GPU_DIRECT_RDMA_CAPABLE, ctypes.c_uint64(ptr)
    )
    return (
        f"pool={bool(pool.value) if r1 == 0 else f'error {r1}'} "
        f"rdma_capable={bool(capable.value) if r2 == 0 else f'error {r2}'}"
    )


def torch_tensor():
    import torch

    t = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    return t, t.data_ptr()


def cupy_array():
    import cupy

    a = cupy.empty(64 << 20, dtype=cupy.uint8)
    return a, a.data.ptr


def cupy_async_pool():
    import cupy

    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    return cupy_array()


ALLOCATORS = {
    "torch (caching allocator, cudaMalloc)": (torch_tensor, {}),
    "torch (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)": (
        torch_tensor,
        {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    ),
    "cupy (default MemoryPool, cudaMalloc)": (cupy_array, {}),
    "cupy (MemoryAsyncPool, cudaMallocAsync)": (cupy_async_pool, {}),
}

if __name__ == "__main__":
    if len(sys.argv) > 1:
        make = ALLOCATORS[sys.argv[1]][0]
        keep, ptr = make()
        print(facts(ptr))
        sys.exit(0)
    for name, (_, env) in ALLOCATORS.items():
        r = subprocess.run(
            [sys.executable, __file__, name],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        out = r.stdout.strip() or f"failed: {r.stderr.strip().splitlines()[-1:]}"
        print(f"{name}: {out}")
