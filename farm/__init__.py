"""farm: device benchmarking and RPC farm orchestrator built on Apache TVM."""

import os

__version__ = "0.1.0"

# numpy's OpenBLAS starts a thread per core as numpy imports, and each spins before it sleeps: 0.09 s of CPU in
# every farm process on a 2-core host (each command, server, tracker, and TVM's workers, which inherit this). farm's
# own numpy work is small arrays (inputs, statistics); the runtimes it measures bring their own threads (TVM's pool,
# onnxruntime's, TFLite's), and no idle BLAS thread of farm's competes with them on a device host. A value the user
# set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
