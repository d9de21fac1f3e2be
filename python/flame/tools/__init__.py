"""flame.tools: the tooling around libflame, in pure Python (numpy and safetensors; torch only
for flame.tools.torch_ref). The binding (flame.Model, flame.Engine, the caches, ...) imports
none of it.

    flame.tools.layout      flame.config validation and the tensor list it implies (the Python
                            twin of src/model/config.c; tests/python/test_layout_matches_c.py
                            holds the two to the same answer)
    flame.tools.reference   the float64 numpy reference model: random weights, forward, save/load
    flame.tools.torch_ref   the flame architecture in PyTorch, for training
    flame.tools.exporter    export(model_or_state_dict, path): a trained model as a flame file
    flame.tools.quant       int8 row-wise quantization of tables
    flame.tools.st_io       safetensors reading and writing with the checks libflame makes
    flame.tools.convert     `python -m flame.tools.convert {iclrec,sasrec}`: other checkpoints
    flame.tools.evaluate    ranking metrics of a model over held-out sequences
"""
from .exporter import export


def __getattr__(name):
    # torch_ref imports torch: only when asked for
    if name == "torch_ref":
        import importlib
        return importlib.import_module(".torch_ref", __name__)
    raise AttributeError(f"module 'flame.tools' has no attribute {name!r}")


__all__ = ["export"]
