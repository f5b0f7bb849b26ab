"""Remote datasets: URLs, byte sizes, the cache directory, and the object-store transport.

The C core reads remote bytes through a transport with two calls, ``stat(url)`` and
``read_into(url, version, size, offset, buffer)`` (see ``tokenfeed.h``, "Sources: remote
objects"); it retries, caches and schedules on top. This module provides the transport the
package uses, built on `obstore <https://developmentseed.org/obstore/>`_ (the optional extra
``tokenfeed[remote]``), imported only when a remote URL is opened.

Errors are raised as :class:`TransportError` (an ``OSError``) whose ``errno`` says what the
core does with them: ``EAGAIN`` (throttled), ``ETIMEDOUT``, ``ECONNRESET``, ``EPROTO`` (short
or malformed body) and ``EIO`` (server error) are retried with backoff; ``ENOENT``,
``EACCES`` and ``ESTALE`` (the object changed since open) are not. Credentials are read by the
client from the standard chains and never appear in messages or ``repr``s.
"""
from __future__ import annotations

import atexit
import errno
import os
import re
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

from .. import _core
from ..common._extras import pip_hint

__all__ = ["RemoteURL", "TransportError", "ObjectStoreTransport", "default_cache_dir", "is_url", "parse_size",
           "parse_url"]

#: URL schemes served by the obstore transport.
SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "http", "https")


def is_url(path: Any) -> bool:
    """Whether ``path`` is a remote URL (``scheme://...``, ``file://`` excluded)."""
    if not isinstance(path, str):
        return False
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", path)
    return m is not None and m.group(1).lower() != "file"


class RemoteURL(NamedTuple):
    scheme: str  #: lower-case scheme as given ("s3", "gs", "az", "https", ...)
    bucket: str  #: bucket or container; for http(s) the host (with port)
    key: str     #: object key (no leading "/"); "" for the bucket itself

    def join(self, name: str) -> str:
        """URL of ``name`` inside this URL taken as a directory."""
        base = self.key.rstrip("/")
        return f"{self.scheme}://{self.bucket}/{base + '/' if base else ''}{name}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


def parse_url(url: str) -> RemoteURL:
    """Split ``scheme://bucket/key``. Raises ``ValueError`` for a malformed or unsupported URL."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(/[^?#]*)?$", url)
    if not m:
        raise ValueError(f"{url!r}: expected a URL of the form scheme://bucket/key "
                         "(query strings and fragments are not supported)")
    scheme, bucket, path = m.group(1).lower(), m.group(2), m.group(3) or ""
    if scheme not in SCHEMES:
        raise ValueError(f"{url!r}: unsupported scheme {scheme!r}; expected one of "
                         + ", ".join(s + "://" for s in SCHEMES))
    if not bucket:
        raise ValueError(f"{url!r}: expected a bucket (or host) after {scheme}://")
    if "@" in bucket and scheme not in ("abfs", "abfss"):
        raise ValueError(f"{url!r}: credentials in URLs are not accepted; use the standard credential "
                         "chain (environment, profile files, instance metadata) instead")
    return RemoteURL(scheme, bucket, path.lstrip("/"))


def parse_size(value: Union[int, str, None], what: str = "cache_limit") -> Optional[int]:
    """Bytes from an int or a string such as ``"200GB"``, ``"1.5TiB"``, ``"500M"``.

    SI units (``KB``, ``MB``, ``GB``, ``TB``; also ``K``, ``M``, ``G``, ``T``) are powers of
    1000; ``KiB``, ``MiB``, ``GiB``, ``TiB`` powers of 1024. ``None`` stays ``None``. Strings
    are read by the C library's parser (``tf_parse_size``), the one every size setting uses,
    ``$TOKENFEED_CATALOG_MAX`` included.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of bytes or a string like '200GB', not bool")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, got {value}")
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a number of bytes or a string like '200GB', not {type(value).__name__}")
    n = _core.parse_size(value, what)
    if n <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return n


def default_cache_dir() -> str:
    """``$TOKENFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/tokenfeed/remote`` (``~/.cache/...``)."""
    d = os.environ.get("TOKENFEED_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tokenfeed", "remote")


class TransportError(OSError):
    """A failed request; ``errno`` tells the C core whether to retry (see the module docstring)."""


# Words that must never reach a message: credential values from the environment and options.
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_KEY",
               "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_SERVICE_ACCOUNT_KEY")


def _redact(msg: str, secrets: Tuple[str, ...]) -> str:
    msg = msg.split("\n\nDebug source", 1)[0]
    msg = re.sub(r"(https?://[^\s?]*)\?\S*", r"\1?<query redacted>", msg)  # presigned URLs, SAS tokens
    msg = re.sub(r"(?i)(signature|credential|x-amz-security-token|sig|token)=[^&\s]*", r"\1=<redacted>", msg)
    for s in secrets:
        if s and len(s) >= 4:
            msg = msg.replace(s, "<redacted>")
    msg = " ".join(msg.split())
    return msg[:400]


def _classify(exc: BaseException) -> int:
    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, FileNotFoundError) or name == "NotFoundError":
        return errno.ENOENT
    if name == "PreconditionError" or "412 Precondition" in text:
        return errno.ESTALE
    if name in ("PermissionDeniedError", "UnauthenticatedError") or re.search(r"status code: 40[13]\b", text):
        return errno.EACCES
    if re.search(r"status code: (503|429)\b", text) or "SlowDown" in text or "Throttl" in text:
        return errno.EAGAIN
    if re.search(r"status code: 5\d\d\b", text):
        return errno.EIO
    if "kind: Timeout" in text or "TimedOut" in text or "timed out" in text.lower():
        return errno.ETIMEDOUT
    if "IncompleteBody" in text or "UnexpectedEof" in text or "body error" in text:
        return errno.EPROTO
    if "error sending request" in text or "Connection reset" in text or "connection closed" in text.lower() \
            or "Interrupted" in text or "Connect" in text:
        return errno.ECONNRESET
    if re.search(r"status code: 4\d\d\b", text) or name in ("InvalidPathError", "NotSupportedError",
                                                             "UnknownConfigurationKeyError"):
        return errno.EINVAL
    return errno.EIO


# obstore runs its requests on a tokio runtime whose threads a fork() does not copy: a
# process forked after the runtime started cannot make requests (they would hang). The pid
# of the first process that made one is recorded so that a forked child fails clearly.
_obstore_pid: Optional[int] = None


def _check_fork() -> None:
    global _obstore_pid
    pid = os.getpid()
    if _obstore_pid is None:
        _obstore_pid = pid
    elif _obstore_pid != pid:
        raise TransportError(errno.ENOTSUP,
                             "this process was forked after the object-store client (obstore) had started, and it "
                             "cannot make requests in a forked child. Start DataLoader workers with "
                             "multiprocessing_context='spawn' or 'forkserver' (remote datasets pickle to them), "
                             "or open the dataset in each worker")


def _env_endpoint() -> Optional[str]:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class ObjectStoreTransport:
    """The transport the package plugs into the C core: obstore stores, one per bucket.

    ``endpoint_url`` (else ``$AWS_ENDPOINT_URL_S3``, ``$AWS_ENDPOINT_URL``) points ``s3://``
    URLs at an S3-compatible store; plain ``http://`` endpoints are allowed. ``storage_options``
    go to the store constructors (region, profile, ...); they are kept private and never
    printed. ``timeout`` bounds one request (seconds); retries belong to the C core.
    """

    def __init__(self, endpoint_url: Optional[str] = None, storage_options: Optional[Mapping[str, Any]] = None,
                 timeout: float = 20.0, connect_timeout: float = 10.0) -> None:
        try:
            import obstore  # noqa: F401
        except ImportError as e:
            raise ImportError(f"reading remote datasets needs obstore: {pip_hint('remote')}") from e
        if endpoint_url is not None and not re.match(r"^https?://[^/\s]+/?$", endpoint_url):
            raise ValueError(f"endpoint_url: expected http(s)://host[:port], got {endpoint_url!r}")
        self.endpoint_url = endpoint_url.rstrip("/") if endpoint_url else None
        self._options: Dict[str, Any] = dict(storage_options or {})
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self._stores: Dict[Tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._unversioned: list[str] = []  # objects seen without an ETag, not yet reported

    # never print credentials: only the endpoint and the option names
    def __repr__(self) -> str:
        opts = f", storage_options=<{', '.join(sorted(self._options))}>" if self._options else ""
        ep = self.endpoint_url or _env_endpoint()
        return f"ObjectStoreTransport(endpoint_url={ep!r}{opts})"

    __str__ = __repr__

    def __getstate__(self) -> Dict[str, Any]:
        # a spawned DataLoader worker re-creates the stores (and re-reads credentials)
        return {"endpoint_url": self.endpoint_url, "options": self._options, "timeout": self.timeout,
                "connect_timeout": self.connect_timeout}

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__init__(st["endpoint_url"], st["options"], st["timeout"], st["connect_timeout"])  # type: ignore[misc]

    def _secrets(self) -> Tuple[str, ...]:
        vals = [os.environ.get(k, "") for k in _SECRET_ENV]
        vals += [str(v) for v in self._options.values() if isinstance(v, str)]
        return tuple(v for v in vals if v)

    def _client_options(self, allow_http: bool) -> Any:
        return {"allow_http": allow_http, "timeout": timedelta(seconds=self.timeout),
                "connect_timeout": timedelta(seconds=self.connect_timeout)}

    def _make_store(self, u: RemoteURL) -> Any:
        from obstore import store as obs

        retry: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=max(self.timeout, 1.0))}
        if u.scheme in ("s3", "s3a"):
            ep = self.endpoint_url or _env_endpoint()
            kw: Dict[str, Any] = dict(self._options)
            if ep:
                kw["endpoint"] = ep
            if "region" not in kw and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
                kw["region"] = "us-east-1"
            provider = None
            if not os.environ.get("AWS_ACCESS_KEY_ID") and not kw.get("access_key_id") \
                    and not kw.get("skip_signature") and _has_aws_profile():
                provider = _boto3_provider()
            if provider is not None:
                kw["credential_provider"] = provider
            return obs.S3Store(u.bucket, client_options=self._client_options(bool(ep and ep.startswith("http://"))),
                               retry_config=retry, **kw)
        if u.scheme in ("http", "https"):
            return obs.HTTPStore.from_url(f"{u.scheme}://{u.bucket}",
                                          client_options=self._client_options(u.scheme == "http"),
                                          retry_config=retry)
        from_url: Any = obs.from_url
        return from_url(f"{u.scheme}://{u.bucket}", client_options=self._client_options(False),
                        retry_config=retry, **self._options)

    def _store(self, url: str) -> Tuple[Any, str]:
        u = parse_url(url)
        k = (u.scheme, u.bucket)
        with self._lock:
            st = self._stores.get(k)
        if st is None:
            try:
                st = self._make_store(u)
            except Exception as e:  # configuration errors: not retried
                raise TransportError(errno.EINVAL, f"cannot set up a client for {u.scheme}://{u.bucket}: "
                                                   f"{_redact(str(e), self._secrets())}") from None
            with self._lock:
                st = self._stores.setdefault(k, st)
        return st, u.key

    def _version(self, url: str, e_tag: Any) -> str:
        tag = str(e_tag or "")
        if not tag:
            with self._lock:
                self._unversioned.append(url)
        return tag

    def take_unversioned(self) -> list[str]:
        """Objects seen without an ETag since the last call: changes to them cannot be detected."""
        with self._lock:
            out, self._unversioned = self._unversioned, []
        return out

    def _error(self, exc: BaseException) -> TransportError:
        code = _classify(exc)
        return TransportError(code, _redact(f"{type(exc).__name__}: {exc}", self._secrets()))

    def stat(self, url: str) -> Tuple[int, str]:
        """``(size, version)`` of the object; version is its ETag ("" when the store has none)."""
        import obstore

        _check_fork()
        store, key = self._store(url)
        try:
            meta = obstore.head(store, key)
        except Exception as e:
            raise self._error(e) from None
        return int(meta["size"]), self._version(url, meta.get("e_tag"))

    def list(self, prefix_url: str) -> Iterator[Tuple[str, int, str]]:
        """``(url, size, version)`` of every object under ``prefix_url`` taken as a directory."""
        import obstore

        _check_fork()
        store, key = self._store(prefix_url)
        u = parse_url(prefix_url)
        try:
            for batch in obstore.list(store, prefix=key.rstrip("/") or None, chunk_size=1000):
                for m in batch:
                    url = f"{u.scheme}://{u.bucket}/{m['path']}"
                    yield url, int(m["size"]), self._version(url, m.get("e_tag"))
        except Exception as e:
            raise self._error(e) from None

    def put(self, url: str, data: bytes) -> None:
        """Store ``data`` as the object ``url`` (one request; the store replaces the object
        whole, so a reader sees the old object or the new one)."""
        import obstore

        _check_fork()
        store, key = self._store(url)
        try:
            obstore.put(store, key, data)
        except Exception as e:
            raise self._error(e) from None

    def read_into(self, url: str, version: str, size: int, offset: int, buf: Any) -> int:
        """Read ``len(buf)`` bytes at ``offset`` into ``buf`` (a writable buffer); returns the count.

        The request is conditional on ``version`` (``If-Match``): a changed object fails with
        ``ESTALE`` instead of returning bytes of another version. A weak ETag (``W/"..."``) is
        never sent in ``If-Match`` (servers compare it strongly and refuse every request with
        412): the ETag of the response is compared with it weakly instead. Without a version
        nothing is checked (open warns about such objects).
        """
        import obstore

        _check_fork()
        store, key = self._store(url)
        mv = memoryview(buf).cast("B")
        n = mv.nbytes
        if n == 0:
            return 0
        opts: Any = {"range": (int(offset), int(offset) + n)}
        weak = version.startswith("W/")
        if version and not weak:
            opts["if_match"] = version
        try:
            res = obstore.get(store, key, options=opts)
            if weak:
                now = str(res.meta.get("e_tag") or "")
                if _weak_tag(now) != _weak_tag(version):
                    raise TransportError(errno.ESTALE, f"the object changed since open (ETag {version}, now "
                                                       f"{now or 'none'})")
            data = res.bytes()
        except TransportError:
            raise
        except Exception as e:
            raise self._error(e) from None
        got = memoryview(data).cast("B")
        m = min(got.nbytes, n)
        if m == 0:
            raise TransportError(errno.EPROTO, f"empty response for bytes [{offset}, {offset + n})")
        mv[:m] = got[:m]
        return m


def interruptible(fn: Callable[[], Any], name: str) -> Any:
    """``fn()`` on a daemon thread while the calling thread waits in short slices: Ctrl-C
    raises ``KeyboardInterrupt`` at once instead of when the request in flight ends (a request
    runs in the client's code, which does not answer signals). An interrupted call is left to
    end on its own; its exception, if any, is raised here."""
    result: List[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001  (handed to the waiting thread)
            result.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    while not done.wait(0.05):
        pass
    out = result.pop()
    if isinstance(out, BaseException):
        try:
            raise out
        finally:
            del out  # no cycle through the traceback
    return out


def _weak_tag(tag: str) -> str:
    """An ETag for the weak comparison of RFC 7232: without its ``W/`` prefix."""
    return tag[2:] if tag.startswith("W/") else tag


def _has_aws_profile() -> bool:
    if os.environ.get("AWS_PROFILE"):
        return True
    home = os.path.expanduser("~")
    cfg = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials")
    return os.path.exists(cfg) or os.path.exists(os.environ.get("AWS_CONFIG_FILE")
                                                 or os.path.join(home, ".aws", "config"))


def _boto3_provider() -> Any:
    """boto3's credential chain (profiles, SSO, assume-role), when boto3 is installed."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    try:
        return Boto3CredentialProvider(boto3.Session())
    except Exception:
        return None


# ---------------------------------------------------------------------------------------
# remote stores: one per (cache directory, endpoint, options) in a process


#: Seconds one request may take (``request_timeout``): a whole 8 MiB chunk at 0.4 MB/s. With
#: the C core's 30 s deadline, a server that accepts and never answers is reported after
#: one or two attempts, by 30 s.
DEFAULT_REQUEST_TIMEOUT = 20.0


def store_options(cache_dir: Any = None, cache_limit: Union[int, str, None] = None,
                  endpoint_url: Optional[str] = None, chunk_size: Union[int, str, None] = None,
                  prefetch_bytes: Union[int, str, None] = None, fetch_threads: Optional[int] = None,
                  storage_options: Optional[Mapping[str, Any]] = None,
                  request_timeout: Optional[float] = None, max_attempts: Optional[int] = None,
                  deadline: Optional[float] = None) -> Dict[str, Any]:
    """Check and normalise the remote options of ``tokenfeed.open`` (sizes in bytes). Their
    defaults and bounds are the remote rows of the C settings table (``_core.settings()``)."""
    from .. import _core

    rows = {r["name"]: r for r in _core.settings() if r["scope"] == "remote"}
    for name, v in (("max_attempts", max_attempts), ("fetch_threads", fetch_threads)):
        lo, hi = rows[name]["min"], rows[name]["max"]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise ValueError(f"{name} must be an int from {lo} to {hi}, got {v!r}")
    longest = rows["deadline_ms"]["max"] / 1000
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not 0 < deadline <= longest):
        raise ValueError(f"deadline must be a number of seconds in (0, {longest:g}], got {deadline!r}")
    if request_timeout is not None and (isinstance(request_timeout, bool) or not isinstance(request_timeout, (int, float))
                                        or not request_timeout > 0):
        raise ValueError(f"request_timeout must be a positive number of seconds, got {request_timeout!r}")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError("storage_options must be a dict of client options")
    return {"cache_dir": os.path.abspath(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir(),
            "cache_limit": parse_size(cache_limit, "cache_limit"),
            "endpoint_url": endpoint_url,
            "chunk_size": parse_size(chunk_size, "chunk_size"),
            "prefetch_bytes": parse_size(prefetch_bytes, "prefetch_bytes"),
            "fetch_threads": fetch_threads,
            "storage_options": dict(storage_options) if storage_options else None,
            "request_timeout": float(request_timeout) if request_timeout is not None else None,
            "max_attempts": max_attempts,
            "deadline": float(deadline) if deadline is not None else None}


# By weak reference: a store (its fetch threads, descriptors and cache process slot) is freed
# with the last dataset that uses it, and made anew by a later open.
_stores: "weakref.WeakValueDictionary[Tuple[Any, ...], Any]" = weakref.WeakValueDictionary()
_stores_lock = threading.Lock()
_atexit_registered = False


def _shutdown_at_exit() -> None:
    """At exit, while the interpreter still runs: new remote requests are refused and those in
    flight get a moment to return. Threads still in a request after that are never waited
    for (a request that returns to a finalizing interpreter would park its thread for good)."""
    from .. import _core

    _core.shutdown_transports(2.0)


def get_store(cache_dir: str, cache_limit: Optional[int] = None, endpoint_url: Optional[str] = None,
              chunk_size: Optional[int] = None, prefetch_bytes: Optional[int] = None,
              fetch_threads: Optional[int] = None,
              storage_options: Optional[Dict[str, Any]] = None, request_timeout: Optional[float] = None,
              max_attempts: Optional[int] = None, deadline: Optional[float] = None) -> Any:
    """The process's remote store for these options (one fetch pool and cache slot each), shared by
    the datasets open with them and freed with the last of them."""
    from .. import _core

    so = tuple(sorted((k, repr(v)) for k, v in (storage_options or {}).items()))
    key = (os.getpid(), cache_dir, cache_limit, endpoint_url, chunk_size, prefetch_bytes, fetch_threads, so,
           request_timeout, max_attempts, deadline)
    global _atexit_registered
    with _stores_lock:
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        st = _stores.get(key)
        if st is None:
            transport = ObjectStoreTransport(endpoint_url=endpoint_url, storage_options=storage_options,
                                             timeout=request_timeout or DEFAULT_REQUEST_TIMEOUT)
            st = _core.Remote(transport, cache_dir, cache_limit=cache_limit or 0, chunk_bytes=chunk_size or 0,
                              prefetch_bytes=prefetch_bytes or 0, fetch_threads=fetch_threads or 0,
                              max_attempts=max_attempts or 0, deadline_ms=int(round((deadline or 0) * 1000)))
            _stores[key] = st
        return st
