"""libflame from Python: load flame models and score candidates (directly, or batched across
threads by a flame.Scheduler), fed from the feature caches (flame.ItemCache over a
flame.FeatureSource, the shared-memory flame.UserCache), or use the engine's embedding bag and
SUMI attention kernels in a pipeline of one's own (flame.kernels). This package is the binding;
the tooling (training in PyTorch, export, int8 quantization, converters, the float64 numpy
reference, evaluation) is flame.tools, which the binding does not import.

    import flame, numpy as np
    with flame.Model("model.flame") as m, flame.Engine(m) as engine:
        scores = engine.score(np.array([12, 7, 301]), np.array([5, 99, 1024]))  # float32 [3, tasks]

Importing needs only numpy and safetensors; libflame is loaded on first use (FLAME_LIBRARY,
else this package's build tree, else the system's), torch only by flame.tools.torch_ref.
"""
__version__ = "0.2.0"

from ._arrays import to_bags as bags
from ._lib import version as library_version
from .engine import Engine, Request
from .errors import (BufferTooSmallError, ClosedError, DTypeError, FlameError, FlameIOError, FormatError,
                     InternalError, InvalidArgumentError, LibraryNotFoundError, NoDeviceError, OutOfMemoryError,
                     UnavailableError, DeadlineExceededError, CancelledError,
                     ShapeError, UnsupportedError, VersionMismatchError)
from . import kernels
from .features import FeatureRecord, FeatureSource, ItemCache, load_redis
from .log import clear_log_handler, set_log_handler
from .memory import PinnedBuffer, PinnedPool, numa_info
from .metrics import latency, metrics_text
from .model import Model, ModelInfo
from .scheduler import Scheduler
from .user_cache import UserCache, UserRecord


# The tooling's modules were flame.<name> before flame.tools existed: `from flame import
# reference` and flame.export still resolve (lazily, so importing flame imports none of them).
_TOOLS = ("reference", "convert", "exporter", "quant", "st_io", "evaluate", "torch_ref", "layout")


def __getattr__(name):
    import importlib
    if name == "tools":
        return importlib.import_module(".tools", __name__)
    if name in _TOOLS:
        return importlib.import_module(f".tools.{name}", __name__)
    if name == "export":
        return importlib.import_module(".tools.exporter", __name__).export
    raise AttributeError(f"module 'flame' has no attribute {name!r}")


__all__ = ["kernels", "Model", "ModelInfo", "Engine", "Request", "bags", "library_version", "set_log_handler",
           "clear_log_handler", "FeatureRecord", "FeatureSource", "ItemCache", "load_redis", "UserCache", "UserRecord",
           "PinnedPool", "PinnedBuffer", "numa_info", "Scheduler", "latency", "metrics_text", "FlameError", "InvalidArgumentError", "OutOfMemoryError", "FlameIOError",
           "FormatError", "UnsupportedError", "NoDeviceError", "BufferTooSmallError", "InternalError", "UnavailableError",
           "DeadlineExceededError", "CancelledError",
           "DTypeError", "ShapeError", "ClosedError", "LibraryNotFoundError", "VersionMismatchError"]
