"""Python side of libflame: the model format, converters, a numpy reference and ctypes bindings.

Importing the package needs only numpy and safetensors; the C library is loaded lazily by
flame._native when first used.
"""
__version__ = "0.1.0"
