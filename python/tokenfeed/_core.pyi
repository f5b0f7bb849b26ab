# Type stubs for the tokenfeed._core extension module (csrc/python/*.c).
# The binding is thin and private: the public API is in tokenfeed/__init__.py.
# Keep in step with the C method tables; tests/project/test_typing.py runs mypy.stubtest
# on this file against the built module.
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, TypedDict, Union, overload

import numpy as np
import numpy.typing as npt

from os import PathLike

__version__: str

PACK_CONCAT: int
PACK_BEST_FIT: int
PACK_DOCUMENT: int
SHUFFLE_NONE: int
SHUFFLE_FULL: int
SHUFFLE_BLOCK: int
WANT_POSITION_IDS: int
WANT_CU_SEQLENS: int
WANT_LOSS_MASK: int
MAX_THREADS: int
MAX_PREFETCH: int
BALANCE_NONE: int
BALANCE_TOKENS: int
BALANCE_ATTENTION: int
BALANCE_STRIDED: int

_DTypeArg = Union[str, np.dtype[Any], type, None]
_UIntArray = npt.NDArray[np.uint64]

class FormatError(ValueError):
    """A token file is malformed, truncated, fails its checksum or holds ids outside the vocabulary."""

class _FeatureInfo(TypedDict):
    compiled: bool
    usable: bool

class _DetailedFeatureInfo(TypedDict):
    compiled: bool
    usable: bool
    detail: str

class _BuildInfo(TypedDict):
    version: str
    zstd: _FeatureInfo
    io_uring: _DetailedFeatureInfo
    cuda: _DetailedFeatureInfo
    build: str

def build_info() -> Dict[str, Any]: ...  # the keys and types of _BuildInfo

STATE_FORMAT_VERSION: int

class _Setting(TypedDict):
    name: str
    scope: str  # "order", "engine" or "device"
    type: str  # "int", "bool", "enum" or "path" (a str; no integer value)
    default: int
    min: int
    max: int
    nullable: bool
    none_value: int
    names: Optional[List[str]]  # an enum's names, by value
    stream: str  # when it changes the stream: "always", "never" or a condition
    description: str

# The C settings table, one row per setting (tokenfeed.h, "Settings"). The keywords of Order,
# Loader and DeviceLoader below are its rows (tests/order/test_settings.py checks they agree).
def settings() -> List[_Setting]: ...

def build_doc_index(path: Union[str, bytes, PathLike[str], PathLike[bytes]], dtype: _DTypeArg, eos_id: int,
                    ends: Optional[npt.NDArray[np.uint64]] = None,
                    index_dir: Union[str, bytes, PathLike[str], PathLike[bytes], None] = None) -> str: ...

def seq_len_warmup(seq_len: int, min_seq_len: int, warmup_steps: int, step: int, /) -> int: ...
# the input positions [first_k, first_k + chunk) a context-parallel rank takes of a sample
def cp_chunks(seq_len: int, cp_size: int, cp_rank: int, /) -> Tuple[int, int, int]: ...
def cp_thd_positions(seg_lengths: Sequence[int], cp_size: int, cp_rank: int, /) -> bytes: ...
def merge(path: Union[str, bytes, PathLike[str], PathLike[bytes]],
          parts: Sequence[Union[str, bytes, PathLike[str], PathLike[bytes]]], overwrite: bool = False) -> None: ...

def parse_size(text: str, what: str, /) -> int: ...
# What an open of a local path reads, by the C core's rules: ("dataset", directory),
# ("pair", prefix) or ("file", path).
def resolve_path(path: Union[str, bytes, PathLike[str], PathLike[bytes]],
                 format: Optional[str] = None) -> Tuple[Literal["dataset", "pair", "file"], str]: ...

class _DatasetInfo(TypedDict):
    num_tokens: int
    num_documents: int
    vocab_size: int  # 0 when the format does not record it
    dtype: str
    format: str
    num_files: int
    fingerprint: int

class _FileInfo(TypedDict):
    path: str
    format: str
    dtype: str
    first_token: int
    num_tokens: int
    first_document: int
    num_documents: int
    compressed: bool

class Dataset:
    def __new__(cls, paths: Sequence[Union[str, bytes, PathLike[str], PathLike[bytes]]], dtype: _DTypeArg = ...,
                format: Optional[str] = ..., remote: Optional["Remote"] = ..., eos_id: Optional[int] = ...,
                index_dir: Optional[str] = ..., shard_set: int = ..., set_prefix: Optional[str] = ...,
                set_pattern: Optional[str] = ...,
                listing: Optional[Sequence[Tuple[str, int, str]]] = ..., immutable: bool = ...,
                set_catalog: bool = ...) -> "Dataset": ...
    @staticmethod
    def formats() -> Tuple[str, ...]: ...
    @staticmethod
    def recorded(remote: "Remote", urls: Sequence[str], dtype: _DTypeArg = ..., format: Optional[str] = ...,
                 eos_id: Optional[int] = ..., index_dir: Optional[str] = ..., set_prefix: Optional[str] = ...,
                 set_pattern: Optional[str] = ...) -> bool: ...
    @staticmethod
    def set_catalog_name(pattern: str, dtype: _DTypeArg = ..., format: Optional[str] = ...,
                         eos_id: Optional[int] = ...) -> str: ...
    def remote_set_catalog(self, prefix: str, pattern: str, dtype: _DTypeArg = ..., format: Optional[str] = ...,
                           eos_id: Optional[int] = ...) -> bytes: ...
    def write_data_catalog(self, prefix: str, pattern: str, dtype: _DTypeArg = ..., format: Optional[str] = ...,
                           eos_id: Optional[int] = ..., index_dir: Optional[str] = ...) -> str: ...
    def write_dataset_catalog(self, dataset_dir: str) -> str: ...
    def catalog_set(self, spec: Sequence[str], dirs: Sequence[str], ids: Sequence[Tuple[int, int, int, int]],
                    dtype: _DTypeArg = ..., format: Optional[str] = ..., eos_id: Optional[int] = ...,
                    index_dir: Optional[str] = ...) -> bool: ...
    @property
    def info(self) -> Dict[str, Any]: ...  # _DatasetInfo
    @property
    def paths(self) -> Tuple[str, ...]: ...
    def files(self) -> List[Dict[str, Any]]: ...  # _FileInfo each
    def read(self, start: int, count: int, dtype: _DTypeArg = None) -> npt.NDArray[Any]: ...
    def view(self, start: int, count: int, /) -> Optional[npt.NDArray[Any]]: ...
    def document(self, i: int, /) -> Tuple[int, int]: ...
    def find_document(self, pos: int, /) -> int: ...
    def check_documents(self) -> None: ...
    def verify(self, threads: int = 0, progress: Optional[Callable[[int, int], object]] = None) -> None: ...
    # views (columns_obj.c): the documents ids (ascending, distinct) of this dataset
    def select(self, ids: npt.ArrayLike, /) -> "Dataset": ...
    def selection(self) -> Optional[Tuple[int, int]]: ...
    def document_id(self, i: Any, /) -> Any: ...

class _RemoteStats(TypedDict):
    requests: int
    bytes_fetched: int
    retries: int
    chunks_fetched: int
    chunk_hits: int
    chunk_waits: int
    refetches: int
    evictions: int
    bytes_evicted: int
    wait_s: float
    cache_bytes: int
    cache_limit: int
    chunk_bytes: int
    small_reads: int

class _CacheInfo(TypedDict):
    bytes: int
    chunks: int
    fetching: int
    objects: int
    processes: int
    temp_bytes: int

class Remote:
    # transport: an object with stat(url) -> (size, version), read_into(url, version, size, offset,
    # buffer) -> int and optionally list(prefix) -> iterable of (url, size, version)
    def __new__(cls, transport: Any, cache_dir: Union[str, PathLike[str]], cache_limit: int = ...,
                chunk_bytes: int = ..., prefetch_bytes: int = ..., fetch_threads: int = ..., max_attempts: int = ...,
                backoff_ms: int = ..., backoff_max_ms: int = ..., deadline_ms: int = ...) -> "Remote": ...
    @property
    def cache_dir(self) -> str: ...
    @property
    def transport(self) -> Any: ...
    def stat(self, url: str, /) -> Tuple[int, str]: ...
    def read(self, url: str, size: int, version: str, offset: int, length: int, /) -> bytes: ...
    def stats(self) -> Dict[str, Any]: ...  # the keys and types of _RemoteStats
    # every object under prefix, from the node's recorded listing when trusted, else listed once per node
    def list(self, prefix: str, immutable: bool = ...) -> List[Tuple[str, int, str]]: ...

def shutdown_transports(timeout: float, /) -> int: ...
def cache_info(dir: Union[str, PathLike[str]], /) -> Dict[str, int]: ...  # _CacheInfo
def cache_prune(dir: Union[str, PathLike[str]], keep_bytes: int, /) -> None: ...

class Writer:
    def __new__(cls, path: Union[str, bytes, PathLike[str], PathLike[bytes]], dtype: _DTypeArg = ...,
                vocab_size: int = ..., shard_tokens: int = ..., compression: Optional[str] = ..., level: int = ...,
                block_tokens: int = ..., overwrite: bool = ..., chunk_checksum_bytes: Optional[int] = ...) -> "Writer": ...
    @property
    def counts(self) -> Optional[Tuple[int, int]]: ...
    def add_document(self, tokens: npt.ArrayLike, /) -> None: ...
    def finish(self) -> None: ...
    def abort(self) -> None: ...

class Permutation:
    def __new__(cls, n: int, key: int = ...) -> "Permutation": ...
    @property
    def n(self) -> int: ...
    @overload
    def apply(self, i: int, /) -> int: ...
    @overload
    def apply(self, i: npt.ArrayLike, /) -> _UIntArray: ...
    @overload
    def inverse(self, j: int, /) -> int: ...
    @overload
    def inverse(self, j: npt.ArrayLike, /) -> _UIntArray: ...

class Order:
    # `dataset` is a Dataset or, for a mixture, a list of them (with weights). None means the
    # C default (tf_order_config_init); an unknown keyword is a TypeError. shuffle and packing:
    # a name or SHUFFLE_* / PACK_*, epochs: None or 0 = endless, separator_id: None = no separator.
    def __new__(cls, dataset: Union[Dataset, Sequence[Dataset]], /, *, seq_len: Optional[int] = None,
                seed: Optional[int] = None, shuffle: Union[int, str, None] = None, block_size: Optional[int] = None,
                window_blocks: Optional[int] = None, global_batch: Optional[int] = None,
                epochs: Optional[int] = None, separator_id: Optional[int] = None,
                packing: Union[int, str, None] = None,
                pad_id: Optional[int] = None, pack_window: Optional[int] = None, mix_window: Optional[int] = None,
                weights: Optional[Sequence[Any]] = None, schedule_steps: Optional[Sequence[int]] = None,
                interpolation: Optional[int] = None, anchor_position: Optional[int] = None,
                anchor_counts: Optional[Sequence[int]] = None, order: Union[int, str, None] = None,
                llmc_processes: Optional[int] = None, olmo_chunk: Optional[int] = None,
                megatron_cache: Optional[str] = None, megatron_split: Union[int, str, None] = None,
                megatron_add_extra_token: Optional[bool] = None,
                ) -> "Order": ...
    # order: "tokenfeed" (default), "llmc" (llm.c's loader, llmc_processes of them), "olmo"
    # (OLMo-core's NumpyFSLDataset instances in NumpyFSLDataLoader's order) or "megatron"
    # (Megatron-core's GPTDataset, read from the index cache megatron_cache names: its
    # path_to_cache, where megatron_split's cache is, or one of the cache's files)
    # with schedule_steps: weights holds one list per step; interpolation 0 = constant, 1 = linear
    @property
    def num_samples(self) -> int: ...
    @property
    def epoch_positions(self) -> int: ...
    @property
    def num_positions(self) -> int: ...  # 2**64 - 1 when infinite
    @property
    def fingerprint(self) -> int: ...
    @property
    def dataset_fingerprint(self) -> int: ...  # of the data read (a mixture: of its sources, in order)
    def packing_stats(self) -> Dict[str, Any]: ...  # samples, documents, pad_tokens, documents_split, ...
    def mix_schedule(self) -> Tuple[int, List[int]]: ...  # (window, count per source) at position 0
    def mix_counts_at(self, pos: int, /) -> Tuple[int, List[int]]: ...  # (window, count per source) in force at pos
    # (source, document, start, stop, offset) of each piece of the sample at pos; reads no tokens
    def segments_at(self, pos: int, /) -> List[Tuple[int, int, int, int, int]]: ...
    # positions in [begin, end) whose sample holds tokens of the document
    def find_document(self, source: int, document: int, begin: int, end: int, /) -> List[int]: ...
    def mix_source_at(self, pos: int, /) -> Tuple[int, int]: ...  # (source, index in its own stream)
    def mix_source_count(self, source: int, pos: int, /) -> int: ...  # positions of source in [0, pos)
    @overload
    def sample_at(self, pos: int, /) -> int: ...
    @overload
    def sample_at(self, pos: npt.ArrayLike, /) -> _UIntArray: ...
    def fill(self, sample: int, dtype: _DTypeArg = None, want: int = 0) -> Dict[str, npt.NDArray[Any]]: ...
    # the loader state (JSON) at a global position, saved by world_size data-parallel ranks
    def state_save(self, position: int, world_size: int, /) -> str: ...
    # (position, the order to read instead when a mixture hands over, or None); RuntimeError
    # (TF_ESTATE) naming what differs
    def state_load(self, state: str, lenient: bool = False, /) -> Tuple[int, Optional["Order"]]: ...
    def balance(self, start: int, world_size: int, micro_batches: int, mode: int, /) -> _UIntArray: ...
    # which rows a rank reads of a global batch, and who reads a position (balanced or not)
    def rank_rows(self, batch: int, world_size: int, micro_batches: int, mode: int, rank: int, /) -> List[int]: ...
    def row_of(self, position: int, world_size: int, micro_batches: int, mode: int, /) -> Tuple[int, int, int]: ...
    def row_costs(self, start: int, count: int, mode: int, /) -> _UIntArray: ...
    def mix_set_weights(self, position: int, weights: Sequence[float], /) -> "Order": ...
    def skip(self, start: int, stop: int, /) -> None: ...
    def skips(self) -> List[Tuple[int, int]]: ...
    def skip_to(self, pos: int, /) -> int: ...
    def exclude(self, position: int, source: int, ids: Sequence[int], /) -> None: ...
    def excluded(self) -> List[Tuple[int, int, List[int]]]: ...
    # every order row of settings() by name, as the order holds it (None, an enum's name, a bool, an int)
    def settings(self) -> Dict[str, Any]: ...

class _ZstdStats(TypedDict):
    cache_bytes: int
    cache_allocated: int
    blocks_decoded: int
    tokens_decoded: int
    tokens_used: int
    cache_hits: int
    cache_misses: int
    cache_waits: int
    decode_ratio: float
    decode_model: float
    note: str

class _LoaderStats(TypedDict):
    batches: int
    tokens: int
    bytes_read: int
    wait_seconds: float
    ring_ready: int
    ring_slots: int
    backend: str
    num_threads: int
    backend_note: str
    zstd: Optional[_ZstdStats]

class Loader:
    # The engine over an Order built once (its global_batch is batch_size * dp_size);
    # want: WANT_* bits; backend: "auto", "mmap", "pread" or "io_uring"; cp_size > 1: this
    # rank's context-parallel share of every sample. An unknown keyword is a TypeError.
    def __new__(cls, order: Order, /, *, batch_size: int = 8, dp_rank: int = 0, dp_size: int = 1,
                dtype: _DTypeArg = None, want: int = 0, num_threads: Optional[int] = None,
                prefetch_batches: Optional[int] = None, backend: Optional[str] = None, direct_io: bool = False,
                zstd_cache_bytes: Optional[int] = None, cp_rank: int = 0, cp_size: Optional[int] = 1,
                balance: Optional[str] = None, balance_micro_batches: int = 1, warmup_steps: int = 0,
                warmup_min_seq_len: Optional[int] = None) -> "Loader": ...
    @property
    def position(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    # arrays; a THD batch (context parallelism with cu_seqlens) also has max_seqlen and num_seqs (ints)
    def next(self) -> Dict[str, Any]: ...
    # per source of a mixture: samples, tokens, documents received; None for one dataset
    def source_stats(self) -> Optional[List[Dict[str, int]]]: ...
    def meter(self, window: Optional[int] = None, /) -> Dict[str, Union[int, float]]: ...
    def seek(self, position: int, /) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> Dict[str, Any]: ...  # _LoaderStats
    # every engine row of settings() by name, as the engine holds it (None, an enum's name, a bool, an int)
    def settings(self) -> Dict[str, Any]: ...

class Batch:
    """Owner of one batch's buffers; they return to the loader when the last array is gone."""

class DeviceTensor:
    """A batch array in device memory, exported with DLPack (torch.from_dlpack, cupy.from_dlpack, jax.dlpack)."""
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Tuple[int, ...]: ...  # in elements
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def device(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def synchronize(self) -> None: ...
    def _view(self, offset: int, shape: Sequence[int], strides: Sequence[int], /) -> "DeviceTensor": ...

class DeviceLoader:
    def __new__(cls, loader: Loader, /, *, device: int = 0, device_prefetch_batches: Optional[int] = None,
                device_slots: Optional[int] = None, static: bool = False) -> "DeviceLoader": ...
    @property
    def position(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def next(self, stream: Optional[int] = None) -> Dict[str, Union[DeviceTensor, int]]: ...
    def seek(self, position: int, /) -> None: ...
    def start(self) -> None: ...
    def close(self) -> None: ...
    def meter(self, window: Optional[int] = None, /) -> Dict[str, Union[int, float]]: ...
    # the meter on the GPU's clock; also "pending" (int) and "stopped" (str)
    def gpu_meter(self, window: Optional[int] = None, /) -> Dict[str, Union[int, float, str]]: ...
    # the GPU-clock meter's marks around the caller's own work for a batch (a stream handle)
    def gpu_request(self, stream: int, /) -> None: ...
    def gpu_handoff(self, stream: int, /) -> None: ...
    def stats(self) -> Dict[str, Any]: ...

class DeviceRing:
    def __new__(cls, device: int, slot_bytes: int, slots: int) -> "DeviceRing": ...
    @property
    def closed(self) -> bool: ...
    def upload(self, arrays: Sequence[npt.NDArray[Any]], wait: bool = True) -> List[DeviceTensor]: ...
    def close(self) -> None: ...
    def info(self) -> Dict[str, Any]: ...
    @staticmethod
    def cuda_available() -> Tuple[bool, str]: ...
    @staticmethod
    def device_count() -> int: ...


# ---- views: metadata column files (columns_obj.c; docs/views.md) ----
class _ColumnsHandle: ...
def columns_open(path: Union[str, PathLike[str]], /) -> _ColumnsHandle: ...
def columns_from_bytes(data: bytes, /) -> _ColumnsHandle: ...
def columns_info(columns: _ColumnsHandle, /) -> Dict[str, Any]: ...
def columns_eval(columns: _ColumnsHandle, where: str, /) -> npt.NDArray[np.bool_]: ...
def columns_match(columns: _ColumnsHandle, column: str, values: Sequence[str], /) -> npt.NDArray[np.bool_]: ...
def columns_values(columns: _ColumnsHandle, column: str, ids: npt.ArrayLike, /) -> List[Any]: ...
def hash64(data: bytes, seed: int = 0, /) -> int: ...
