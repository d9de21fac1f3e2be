"""flame.Model: a loaded (or random) model, immutable and shareable across threads."""
from __future__ import annotations

import ctypes as C
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Union

from . import _arrays, _lib
from ._handle import Handle
from ._structs import ModelInfo as _ModelInfo, as_dict, new

HEAD_DOT, HEAD_SUMI = 0, 1


@dataclass(frozen=True)
class ModelInfo:
    """flame_model_info: sizes the engine derives from the model's config."""
    d_model: int
    num_blocks: int
    num_heads: int
    ffn_dim: int
    max_len: int            # history window: only the most recent max_len items are used
    num_tasks: int          # score columns per candidate
    num_side_features: int  # side-feature slots each token takes
    head: str               # "dot" or "sumi"
    num_items: int          # valid item ids are 0 .. num_items - 1
    weight_bytes: int       # weights held in memory: float32, int8 tables at 1 byte a value + 8 a row


class Model(Handle):
    """A flame model file (docs/model-format.md) loaded by libflame.

    Use as a context manager or call close(). Engines hold their own reference, so a model
    may be closed as soon as its engines exist.
    """

    _destroy, _what = "flame_model_destroy", "model"

    def __init__(self, path: Union[str, os.PathLike]):
        self._handle = C.c_void_p()
        _lib.check(_lib.lib().flame_model_load(_arrays.c_path(path, "path"), C.byref(self._handle)))

    @classmethod
    def random(cls, config: Union[str, Mapping[str, Any]], seed: int = 0) -> "Model":
        """A model of `config` (a flame.config dict or JSON text) with libflame's
        deterministic random weights (flame_model_create_random)."""
        text = _arrays.c_str(config if isinstance(config, str) else json.dumps(config), "config")
        seed = _arrays.c_int(seed, "seed", 64, signed=False)
        self = cls.__new__(cls)
        self._handle = C.c_void_p()
        _lib.check(_lib.lib().flame_model_create_random(text, seed, C.byref(self._handle)))
        return self

    @staticmethod
    def default_config() -> dict:
        """The embedded default configuration (flame_default_model_config) as a dict."""
        return json.loads(_lib.lib().flame_default_model_config())

    @property
    def info(self) -> ModelInfo:
        raw = new(_ModelInfo)
        with self._use() as h:
            _lib.check(_lib.lib().flame_model_get_info(h, C.byref(raw)))
        d = as_dict(raw)
        d["head"] = "sumi" if d["head"] == HEAD_SUMI else "dot"
        return ModelInfo(**d)

    def __repr__(self) -> str:
        if self.closed:
            return "<flame.Model closed>"
        i = self.info
        return f"<flame.Model {i.head} d_model={i.d_model} blocks={i.num_blocks} tasks={i.num_tasks} items={i.num_items}>"
