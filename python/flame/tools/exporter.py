"""flame.export: writes a trained model (a flame.torch_ref module or a state_dict) as a
flame model file, checked against the format before anything is written."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from . import layout, quant, st_io


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor, without importing torch here
        v = v.detach().to("cpu").float().numpy()
    return np.ascontiguousarray(v, dtype=np.float32)


def export(module_or_state_dict: Any, path: Union[str, os.PathLike], config: Optional[Mapping[str, Any]] = None,
           dtype: str = "F32", int8_tables: Union[bool, Sequence[str]] = ()) -> dict:
    """Writes a flame model file (docs/model-format.md) and returns its config.

    module_or_state_dict: a flame.torch_ref.FlameModel (its config is used when `config` is
    None), any torch module whose state_dict uses the canonical tensor names, or a
    {name: tensor or array} mapping.
    config: the flame.config dict; required unless the module carries one.
    dtype: storage dtype, "F32" (default), "F16" or "BF16".
    int8_tables: table names (or True for every table) stored int8 row-wise quantized:
    tables.{name}.weight as I8 plus tables.{name}.qparams (scale, bias per row), made by
    flame.quant.quantize_rows (docs/model-format.md, "int8 tables"); 4x smaller than F32.
    Raises ValueError naming the first missing, misshapen or unexpected tensor.
    """
    obj = module_or_state_dict
    if config is None:
        config = getattr(obj, "config", None)
        if config is None:
            raise ValueError("export: no config given and the object carries none")
    config = json.loads(json.dumps(config))  # a plain JSON-able copy
    layout.check(config)
    sd = obj.state_dict() if hasattr(obj, "state_dict") else obj
    tensors = {k: _to_numpy(v) for k, v in sd.items()}
    layout.check_tensors(config, tensors)
    bad = [k for k, v in tensors.items() if not np.all(np.isfinite(v))]
    if bad:
        raise ValueError(f"export: tensor '{bad[0]}' has non-finite values")
    dtypes: Any = dtype
    if int8_tables:
        tensors, dtypes = quant.pack(config, tensors, int8_tables, dtype)
    st_io.write(path, tensors, {"flame.config": json.dumps(config)}, dtypes)
    return config
