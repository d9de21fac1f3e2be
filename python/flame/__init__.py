"""libflame from Python: load flame models and score candidates (directly, or batched across
threads by a flame.Scheduler), feed them from the feature caches (flame.ItemCache over a flame.FeatureSource, the shared-memory flame.UserCache), train
flame models in PyTorch (flame.torch_ref) and export them (flame.export), convert other
checkpoints (flame.convert), and check against a float64 numpy reference (flame.reference).

    import flame, numpy as np
    with flame.Model("model.flame") as m, flame.Engine(m) as engine:
        scores = engine.score(np.array([12, 7, 301]), np.array([5, 99, 1024]))  # float32 [3, tasks]

Importing needs only numpy and safetensors; libflame is loaded on first use (FLAME_LIBRARY,
else this package's build tree, else the system's), torch only by flame.torch_ref.
"""
__version__ = "0.2.0"

from ._arrays import to_bags as bags
from ._lib import version as library_version
from .engine import Engine, Request
from .errors import (BufferTooSmallError, ClosedError, DTypeError, FlameError, FlameIOError, FormatError,
                     InternalError, InvalidArgumentError, LibraryNotFoundError, NoDeviceError, OutOfMemoryError,
                     UnavailableError, DeadlineExceededError, CancelledError,
                     ShapeError, UnsupportedError, VersionMismatchError)
from .exporter import export
from .features import FeatureRecord, FeatureSource, ItemCache, load_redis
from .log import clear_log_handler, set_log_handler
from .memory import PinnedBuffer, PinnedPool, numa_info
from .metrics import latency, metrics_text
from .model import Model, ModelInfo
from .scheduler import Scheduler
from .user_cache import UserCache, UserRecord


def __getattr__(name):
    # torch_ref imports torch: only when asked for
    if name == "torch_ref":
        import importlib
        return importlib.import_module(".torch_ref", __name__)
    raise AttributeError(f"module 'flame' has no attribute {name!r}")


__all__ = ["Model", "ModelInfo", "Engine", "Request", "bags", "export", "library_version", "set_log_handler",
           "clear_log_handler", "FeatureRecord", "FeatureSource", "ItemCache", "load_redis", "UserCache", "UserRecord",
           "PinnedPool", "PinnedBuffer", "numa_info", "Scheduler", "latency", "metrics_text", "FlameError", "InvalidArgumentError", "OutOfMemoryError", "FlameIOError",
           "FormatError", "UnsupportedError", "NoDeviceError", "BufferTooSmallError", "InternalError", "UnavailableError",
           "DeadlineExceededError", "CancelledError",
           "DTypeError", "ShapeError", "ClosedError", "LibraryNotFoundError", "VersionMismatchError"]
