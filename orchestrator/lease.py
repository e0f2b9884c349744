"""A lock every autotune, calibrate and nightly share, held in the tracking server itself.

Two pods (or two processes) that calibrate and promote the same hardware's models at once would
race read-compare-set on the champion alias. The lock must live where all of them look: MLflow.
Creating a registered model is atomic (a unique key in the server's database), so "the model
`autotune-lock-<scope>` exists" is the lock; its tags say who holds it and until when.

The holder renews its lease from a heartbeat thread every `ttl_s / 3` for at most
`max_hold_s`; a holder that dies, hangs or is stopped (SIGSTOP) stops renewing, and once its
lease has expired the next process takes the lock over. So a lock never outlives its run by
more than `ttl_s`. Before promoting, a holder checks it still holds the lock (`held()`): one
whose lease ran out promotes nothing.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from orchestrator.registry import RegistryUnavailable, is_not_found, with_retries

PREFIX = "autotune-lock-"
DEFAULT_TTL_S = 120.0


class LeaseTimeout(RuntimeError):
    """Waited `timeout_s` for a lock another live process holds."""


def lock_name(scope: str) -> str:
    return PREFIX + re.sub(r"[^A-Za-z0-9_.-]+", "_", scope).strip("_")[-120:]


@dataclass
class Lease:
    """`with Lease("calibrate-<hardware_id>").hold(timeout_s): ...` (see the module doc)."""

    scope: str
    ttl_s: float = DEFAULT_TTL_S
    max_hold_s: float = 6 * 3600.0
    holder: str = field(default_factory=lambda: f"pid {os.getpid()} on {socket.gethostname()} [{uuid.uuid4().hex[:8]}]")
    client: MlflowClient = field(default_factory=MlflowClient)

    def __post_init__(self) -> None:
        self.name = lock_name(self.scope)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._acquired_at = 0.0

    # -- the lock ---------------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the lock if free or expired; False when a live holder has it."""
        if self._create():
            return True
        current = self.current()
        if current is None:
            return self._create()  # released meanwhile
        if current[1] > time.time():
            return False
        # Expired: its holder died, hung or was stopped. Take it over (re-read first, so a
        # holder that renewed meanwhile keeps it).
        latest = self.current()
        if latest is not None and latest[1] <= time.time() and latest[0] == current[0]:
            try:
                with_retries(lambda: self.client.delete_registered_model(self.name), f"expiring {self.name}")
            except MlflowException as gone:
                if not is_not_found(gone):
                    raise
        return self._create()

    def _create(self) -> bool:
        now = time.time()
        tags = {"holder": self.holder, "expires_at": f"{now + self.ttl_s:.3f}", "acquired_at": f"{now:.3f}"}
        try:
            with_retries(lambda: self.client.create_registered_model(self.name, tags=tags), f"taking {self.name}")
        except MlflowException as exc:
            if getattr(exc, "error_code", "") == "RESOURCE_ALREADY_EXISTS":
                return False
            raise
        self._start_heartbeat()
        return True

    def acquire(self, timeout_s: float, poll_s: float = 2.0, on_wait: Callable[[str], None] | None = None) -> None:
        """Wait up to `timeout_s` for the lock; `LeaseTimeout` names the holder otherwise."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        told = False
        while not self.try_acquire():
            holder = self.current()
            if time.monotonic() >= deadline:
                raise LeaseTimeout(
                    f"{self.scope}: held by {holder[0] if holder else 'unknown'}; waited {timeout_s:.0f}s"
                )
            if on_wait is not None and not told and holder is not None:
                on_wait(holder[0])
                told = True
            time.sleep(min(poll_s, max(0.05, deadline - time.monotonic())))

    def current(self) -> tuple[str, float] | None:
        """(holder, expires_at epoch seconds) of the lock as stored, None when free."""
        try:
            model = with_retries(lambda: self.client.get_registered_model(self.name), f"reading {self.name}")
        except MlflowException as exc:
            if is_not_found(exc):
                return None
            raise
        tags = dict(model.tags)
        return tags.get("holder", "unknown"), float(tags.get("expires_at", "0") or 0)

    def held(self) -> bool:
        """Whether this process still holds an unexpired lease (checked before promoting)."""
        try:
            current = self.current()
        except RegistryUnavailable:
            return False
        return current is not None and current[0] == self.holder and current[1] > time.time()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self.held():
                with_retries(lambda: self.client.delete_registered_model(self.name), f"releasing {self.name}")
        except (MlflowException, RegistryUnavailable):
            pass  # it expires by itself

    def hold(self, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> "_Held":
        return _Held(self, timeout_s, on_wait)

    # -- the heartbeat ----------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._acquired_at = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            if time.monotonic() - self._acquired_at > self.max_hold_s:
                return  # held too long: let it expire, whatever this process is doing
            try:
                self.client.set_registered_model_tag(self.name, "expires_at", f"{time.time() + self.ttl_s:.3f}")
            except Exception:  # noqa: BLE001  (a missed renewal is retried at the next beat)
                continue


class _Held:
    def __init__(self, lease: Lease, timeout_s: float, on_wait: Callable[[str], None] | None):
        self.lease, self.timeout_s, self.on_wait = lease, timeout_s, on_wait

    def __enter__(self) -> Lease:
        self.lease.acquire(self.timeout_s, on_wait=self.on_wait)
        return self.lease

    def __exit__(self, *exc: object) -> None:
        self.lease.release()
