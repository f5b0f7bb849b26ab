"""tokenfeed: feed pre-tokenized training data to GPUs from a C core.

::

    import tokenfeed
    ds = tokenfeed.open("data/train")                  # native, Megatron, llm.c, .npy, raw
    loader = tokenfeed.Loader(ds, seq_len=2048, batch_size=8, seed=0)
    for batch in loader:
        loss = model(batch["input_ids"], labels=batch["labels"])
        ...
        ckpt["loader"] = loader.state_dict()          # a few hundred bytes; exact resume
"""
from __future__ import annotations

from typing import Any, Dict

from . import _core
from .common import _build
from ._core import DeviceTensor, FormatError
from .sources._dataset import Dataset, DatasetView, DatasetWriter, build_catalog, build_index, open
from .device._device import DeviceFeeder
from .order._explain import Segment, meter_all_ranks, meter_verdict
from .engine._loader import Loader, StateError
from .common._warnings import DataWarning, PerformanceWarning
from .order._mesh import ParallelCoords, parallel_coords
from .sources._parts import PartWriter, merge_parts
from .order._schedule import WeightSchedule
from .sources._views import Columns

__version__: str = _core.__version__

_build.warn_if_missing()  # a source build without zstd or io_uring says so here: pip hides the build's output

__all__ = ["Columns", "DataWarning", "Dataset", "DatasetView", "DatasetWriter", "DeviceFeeder", "DeviceTensor", "FormatError", "Loader", "ParallelCoords",
           "PartWriter", "PerformanceWarning", "Segment", "StateError", "WeightSchedule", "build_catalog", "build_index", "build_info",
           "get_include", "get_library", "merge_parts", "meter_all_ranks", "meter_verdict", "open", "parallel_coords",
           "__version__"]

# Exceptions and warnings say where users import them from: a traceback prints
# "tokenfeed.StateError: ...", not the private module that defines it.
for _cls in (FormatError, StateError, PerformanceWarning, DataWarning):
    _cls.__module__ = __name__
del _cls


def build_info() -> Dict[str, Any]:
    """What the C core was compiled with and what is usable here.

    ``zstd``, ``io_uring``, ``cuda``: ``{"compiled", "usable", "detail"}``, where ``detail`` says why a
    feature is missing or unusable and how to get it (which package to install); ``test_hooks``: whether
    the fault-injection hooks of a test build are compiled in; ``sanitizers``; ``version``; ``build``: the
    build's own one-line record. ``tokenfeed build-info`` prints the same.
    """
    return _build.build_info()


def get_include() -> str:
    """Directory of ``tokenfeed.h`` for C programs that embed the library."""
    import os

    return os.path.join(os.path.dirname(__file__), "include")


def get_library() -> str:
    """Path of the shared library for C programs that embed it: ``libtokenfeed.so.MAJOR`` (its soname).

    Link with ``-L`` its directory and ``-ltokenfeed`` (``libtokenfeed.so`` there is a linker script
    that names it); load it with ``ctypes.CDLL`` by this path.
    """
    import os

    return os.path.join(os.path.dirname(__file__), "lib", "libtokenfeed.so." + __version__.split(".")[0])
