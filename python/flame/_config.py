"""flame_config (the engine's configuration) from keyword arguments: a table of
(flame_option value, Python type), checked here for type, by the library for range (its
message names the option and the bounds)."""
from __future__ import annotations

import ctypes as C
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from . import _lib
from ._arrays import c_int, c_str
from .errors import DTypeError

Table = Mapping[str, Tuple[int, type]]


def build(table: Table, options: Dict[str, Any], what: str) -> C.c_void_p:
    """A new flame_config holding `options` (the caller destroys it: flame_config_destroy)."""
    L = _lib.lib()
    cfg = C.c_void_p()
    _lib.check(L.flame_config_create(C.byref(cfg)))
    try:
        for key, value in options.items():
            if key not in table:
                raise TypeError(f"unknown {what} option {key!r}; known: {sorted(table)}")
            opt, typ = table[key]
            if typ is str:
                _lib.check(L.flame_config_set_string(cfg, opt, c_str(value, f"option {key}")))
            elif typ is bool:
                if not isinstance(value, (bool, np.bool_)):
                    raise DTypeError(f"option {key} must be True or False, got {type(value).__name__}")
                _lib.check(L.flame_config_set_int(cfg, opt, int(value)))
            else:
                _lib.check(L.flame_config_set_int(cfg, opt, c_int(value, f"option {key}", 64)))
    except BaseException:
        L.flame_config_destroy(cfg)
        raise
    return cfg
