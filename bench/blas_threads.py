"""The BLAS thread count of a PyTorch CPU run (bench/torch_block.py, bench/decode_vs_torch.py)."""

import os


def pin_blas_threads(argv, default=None):
    """--threads N (CPU): the BLAS that torch calls gets N threads too, set
    before torch loads. Debian's torch calls the system libblas (OpenBLAS by
    default), whose own thread pool torch.set_num_threads does not reach: a
    "1-thread" run otherwise spins OpenBLAS threads on every core (measured
    here: an 8 x 128 x 384 addmm 6.5 ms instead of 0.08 ms on a busy 2-core
    machine)."""
    n = default
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = argv[i + 1]
        elif a.startswith("--threads="):
            n = a.split("=", 1)[1]
    if n is not None and str(n).isdigit() and int(n) > 0:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS"):
            os.environ[var] = str(n)
