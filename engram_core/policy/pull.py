"""Bundles from an OPA-compatible bundle server (``engram serve --bundle-url URL``).

``HttpBundleSource`` GETs the bundle tarball with ``If-None-Match`` (the ETag of the last one
downloaded): ``304 Not Modified`` costs nothing, ``200`` brings a new archive (the same bytes
again, from a server without ETags, count as not modified), anything else is
SourceUnavailable. ``BundlePuller`` polls it every ``min_delay``..``max_delay`` seconds
(random in between, as OPA's ``polling.min_delay_seconds``/``max_delay_seconds``, so replicas
do not poll in step) and, when a new archive arrived, reloads the core's policy engine, which
verifies and compiles it exactly like a bundle read from disk: a refused bundle leaves the
previous revision active and is logged with the file that failed. Failures back off
exponentially from ``min_delay`` up to ``max_delay`` (OPA's downloader does the same).
Every replica pointed at the same URL converges on the revision the server serves, unless it
is signed before the one a replica accepted last (``ordering.py``: refused as a rollback; the
accepted archive is kept, so a restart does not fall back to the server's older one).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import requests

from engram_core.contract.errors import EngramError
from engram_core.observability.logs import log_event
from engram_core.policy.bundle import MAX_BUNDLE_BYTES, Bundle, read_bundle_archive
from engram_core.policy.sources import SourceUnavailable

log = logging.getLogger("engram.policy")


class HttpBundleSource:
    """A BundleSource over ``url`` (a bundle server's resource, e.g.
    ``https://bundles.example/engram/bundle.tar.gz``)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, bearer_token: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--bundle-url must be http:// or https://, got {url!r}")
        self.url = url
        self._timeout_s = timeout_s
        self._session = requests.Session()
        self._session.headers["User-Agent"] = "engram-bundle-client"
        self._session.headers["Accept"] = "application/gzip, application/octet-stream"
        if bearer_token:
            self._session.headers["Authorization"] = f"Bearer {bearer_token}"
        self._lock = threading.Lock()
        self._blob: bytes | None = None
        self.etag = ""
        self._fresh = False  # a download the next load() uses without asking again
        self.downloads = self.not_modified = self.failures = 0
        self.last_error = ""

    def describe(self) -> str:
        return self.url

    def fetch(self) -> bool:
        """Ask the server once; True when a new archive arrived. SourceUnavailable otherwise
        than 200 or 304."""
        with self._lock:
            return self._fetch_locked()

    def _fetch_locked(self) -> bool:
        headers = {"If-None-Match": self.etag} if self.etag and self._blob is not None else {}
        try:
            with self._session.get(self.url, headers=headers, timeout=self._timeout_s, stream=True) as response:
                if response.status_code == 304 and self._blob is not None:
                    self.not_modified += 1
                    return False
                if response.status_code != 200:
                    raise SourceUnavailable(f"bundle server answered HTTP {response.status_code}")
                blob = _read_bounded(response)
                etag = response.headers.get("ETag", "")
        except requests.RequestException as exc:
            self._failed(f"bundle server unreachable ({type(exc).__name__})")
        except SourceUnavailable as exc:
            self._failed(str(exc))
        if blob == self._blob:  # a server without ETags (a plain static server) sent the same archive
            self.etag = etag
            self.not_modified += 1
            return False
        self._blob, self.etag, self._fresh = blob, etag, True
        self.downloads += 1
        self.last_error = ""
        log_event("policy_bundle_downloaded", url=self.url, etag=etag or "-", bytes=len(blob))
        return True

    def _failed(self, message: str) -> None:
        self.failures += 1
        self.last_error = message
        raise SourceUnavailable(message)

    def load(self) -> Bundle:
        """The archive just downloaded, or (for an explicit reload) whatever the server has now."""
        with self._lock:
            if not self._fresh:
                self._fetch_locked()
            self._fresh = False
            if self._blob is None:  # pragma: no cover - _fetch_locked raised or set it
                raise SourceUnavailable("no bundle downloaded yet")
            return read_bundle_archive(self._blob, origin=self.url)

    def close(self) -> None:
        self._session.close()


def _read_bounded(response: requests.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(65536):
        size += len(chunk)
        if size > MAX_BUNDLE_BYTES:
            raise SourceUnavailable(f"bundle larger than {MAX_BUNDLE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class BundlePuller:
    """Polls a HttpBundleSource on its own thread and calls ``reload`` when a new archive
    arrived (the core's observed engine: the reload is logged and counted like any other)."""

    def __init__(self, source: HttpBundleSource, reload: Callable[[], str], *, min_delay_s: float = 10.0,
                 max_delay_s: float = 20.0) -> None:
        if min_delay_s <= 0 or max_delay_s < min_delay_s:
            raise ValueError("bundle polling needs 0 < min delay <= max delay")
        self.source = source
        self._reload = reload
        self.min_delay_s, self.max_delay_s = min_delay_s, max_delay_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-bundle-pull", daemon=True)
        self._failures = 0

    def start(self) -> None:
        self._thread.start()

    def next_delay(self) -> float:
        if self._failures:
            return min(self.max_delay_s, self.min_delay_s * 2 ** min(self._failures - 1, 16)) * random.uniform(0.8, 1.0)
        return random.uniform(self.min_delay_s, self.max_delay_s)

    def poll_once(self) -> bool:
        """One poll: True when a new archive arrived and was handed to ``reload``."""
        try:
            changed = self.source.fetch()
        except SourceUnavailable as exc:
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                log_event("policy_bundle_download_failed", logging.WARNING, url=self.source.url, error=str(exc),
                          failures=self._failures, next_try_s=round(self.next_delay(), 1))
            return False
        self._failures = 0
        if changed:
            try:
                self._reload()
            except EngramError:
                pass  # refused or failed: logged and counted by the engine's observer; the old revision answers
        return changed

    def _run(self) -> None:
        while not self._stop.wait(self.next_delay()):
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.source._timeout_s + 1)
