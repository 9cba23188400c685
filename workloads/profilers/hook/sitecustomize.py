"""cloudprof's hook in a --command's Python: PyTorch's CUDA allocator peak, the heap's census.

Loaded because cloudprof put this folder first on PYTHONPATH: on machines with
an NVIDIA driver, and for ``--profile memory`` trials, whose processes each
write what is on their heap at their high-water mark to $CLOUDPROF_HEAP_FILE.<pid>
(``cloudprof_heap.py``, beside this file). It never imports torch: a thread looks twice a second
whether the job did and initialised CUDA, and then writes
``torch.cuda.max_memory_allocated`` (all devices) to $CLOUDPROF_TORCH_PEAK_FILE,
atomically, when it changed, and once more at exit. A sitecustomize the job
had itself is then imported as usual.
"""

import atexit
import json
import os
import sys
import threading


def _peak():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        devices = range(torch.cuda.device_count())
        return sum(int(torch.cuda.max_memory_allocated(d)) for d in devices)
    except Exception:
        return None


def _install(path):
    last = [None]

    def write():
        peak = _peak()
        if peak is None or peak == last[0]:
            return
        last[0] = peak
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"max_memory_allocated_bytes": peak, "pid": os.getpid()}, f)
            os.replace(tmp, path)
        except OSError:
            pass

    def loop():
        while not done.wait(0.5):
            write()

    done = threading.Event()
    threading.Thread(target=loop, name="cloudprof-torch-peak", daemon=True).start()
    atexit.register(write)


def _chain():
    """Import the sitecustomize this one shadows, if the job's environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError:  # none: the import machinery expects this module back in its place
        if me is not None:
            sys.modules["sitecustomize"] = me
    finally:
        sys.path[:] = saved


if os.environ.get("CLOUDPROF_TORCH_PEAK_FILE"):
    _install(os.environ["CLOUDPROF_TORCH_PEAK_FILE"])
if os.environ.get("CLOUDPROF_HEAP_FILE"):
    import cloudprof_heap

    cloudprof_heap.install(os.environ["CLOUDPROF_HEAP_FILE"])
_chain()
