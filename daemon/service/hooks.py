"""Hooks: each recorded event delivered to its webhooks and commands, at least once, in order.

The transactional outbox: the store writes an event (and one delivery row per receiver) in
the same transaction that records the document's outcome (the event is built just before
by `HookService.event_for`, called by the publisher and the ingestor), so a crash between
"done" and "delivered" loses nothing. This module works the rows off:

- One `Lane` per receiver, each in its own thread with its own database connection: a slow,
  hanging or unreachable receiver delays nobody, neither the main loop (watching,
  ingesting, the worker) nor the other receivers.
- A lane sends its receiver's oldest pending event, and the next only after that one is
  delivered or dead: per receiver, events arrive in the order they happened.
- A failed attempt is retried after an exponential back-off with jitter (at least what a
  `Retry-After` asks for), until the event is `hooks.max_age_seconds` old; then it is dead,
  logged as an error and listed by `docinbox hooks` (`docinbox hooks retry --dead`).
- While a receiver fails, one warning per minute (a `Reminder`), not one per attempt.
- 410 Gone: the receiver said it does not want events any more. Its lane stops (the event
  is dead, its later ones wait), and stays stopped across restarts (the store keeps it),
  until `docinbox hooks retry` or a change of that receiver's configuration.
- On stop, an attempt in flight is abandoned and its event stays pending: it is delivered
  again after the next start, with the same id (receivers deduplicate by `webhook-id`).

Webhooks are signed as the Standard Webhooks specification says: `webhook-id`,
`webhook-timestamp` (the attempt's), `webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body">`. Command hooks run without a shell, the body on stdin and the common
fields as `DOCINBOX_*` variables; their output goes to the log, bounded; a non-zero exit or
the timeout (the process group is killed) is a failed attempt.

Every time is passed in (`step(now)`), and so is the randomness of the jitter: tests tick.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import email.utils
import hashlib
import hmac
import json
import logging
import os
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from daemon import __version__
from daemon.common.child import SessionChild
from daemon.common.display import safe_display
from daemon.config.settings import (
    CommandHookConfig,
    Config,
    HooksConfig,
    WebhookConfig,
    hook_secret,
)
from daemon.jobs.store import NewEvent, Outcome, Store, StoreBusy
from daemon.output.events import build_event, event_env, iso, new_event_id
from daemon.service.reminder import Reminder

log = logging.getLogger("docinbox.hooks")

# A lane with nothing due looks at the database again this often even when not woken (an
# event re-queued by `docinbox hooks retry` from another process is seen this way).
IDLE_SECONDS = 2.0
# What a command hook may put into the log per run; the rest is counted, not kept.
OUTPUT_LIMIT = 4096
# Of a webhook's answer, what the log and `docinbox hooks` quote.
ANSWER_LIMIT = 200


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt came to."""

    ok: bool
    message: str  # "HTTP 200", "connection refused", "exit status 3", ...
    retry_after: float | None = None  # seconds the receiver asked us to wait
    gone: bool = False  # 410 Gone: the receiver does not want events any more


class Sender(Protocol):
    """A receiver: sends one event body; never raises for the receiver's faults."""

    name: str
    events: tuple[str, ...]
    # What the receiver is, as configured (a digest): a change enables it again after 410.
    identity: str

    def send(self, event_id: str, body: str) -> Attempt: ...

    def cancel(self) -> None:
        """Abandon an attempt in flight (called from another thread at stop)."""

    def close(self) -> None: ...


# -- retry timing -------------------------------------------------------------------------


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A `Retry-After` header (seconds, or an HTTP date) as seconds from `now`."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, when.timestamp() - now)


def backoff(
    attempts: int, first: float, cap: float, retry_after: float | None, rand: float
) -> float:
    """Seconds to wait after the `attempts`-th failed attempt: doubling from `first` up
    to `cap`, with "equal jitter" (half fixed, half random by `rand` in [0, 1)) so that
    receivers coming back are not hit by every sender at the same instant; never less than
    a `Retry-After` asked for."""
    base = min(cap, first * 2 ** max(0, attempts - 1))
    delay = base / 2 + base / 2 * rand
    if retry_after is not None:
        delay = max(delay, retry_after)
    return float(delay)


# -- senders ------------------------------------------------------------------------------


def identity_of(cfg: WebhookConfig | CommandHookConfig) -> str:
    """A digest of a receiver's configuration (secrets stay out of the database)."""
    return hashlib.sha256(repr(cfg).encode("utf-8")).hexdigest()[:16]


def sign(secret: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature of one attempt."""
    mac = hmac.new(secret, f"{event_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode("ascii")


class WebhookSender:
    def __init__(
        self, cfg: WebhookConfig, secret: bytes | None, wall: Callable[[], float] = time.time
    ) -> None:
        self.cfg = cfg
        self.name = cfg.receiver
        self.events = cfg.events
        self.identity = identity_of(cfg)
        self.secret = secret
        self.wall = wall
        # One client per receiver: its connection is kept alive between events. No
        # redirects: a signed POST is not re-sent to wherever a 3xx points.
        self.client = httpx.Client(
            timeout=httpx.Timeout(cfg.timeout_seconds), follow_redirects=False
        )

    def headers(self, event_id: str, body: bytes) -> dict[str, str]:
        ts = int(self.wall())
        headers = {
            **self.cfg.headers,
            "content-type": "application/json",
            "user-agent": f"docinbox/{__version__}",
            "webhook-id": event_id,
            "webhook-timestamp": str(ts),
        }
        if self.secret is not None:
            headers["webhook-signature"] = sign(self.secret, event_id, ts, body)
        return headers

    def send(self, event_id: str, body: str) -> Attempt:
        data = body.encode("utf-8")
        try:
            r = self.client.post(self.cfg.url, content=data, headers=self.headers(event_id, data))
        except httpx.TimeoutException:
            return Attempt(False, f"no answer within {self.cfg.timeout_seconds:g} s")
        except httpx.HTTPError as exc:
            return Attempt(False, _http_error(exc))
        if 200 <= r.status_code < 300:
            return Attempt(True, f"HTTP {r.status_code}")
        answer = safe_display(r.text[:ANSWER_LIMIT].strip()) if r.content else ""
        message = f"HTTP {r.status_code}" + (f": {answer}" if answer else "")
        if 300 <= r.status_code < 400:
            message += " (redirects are not followed: configure the final URL)"
        return Attempt(
            False,
            message,
            retry_after=retry_after_seconds(r.headers.get("retry-after"), self.wall()),
            gone=r.status_code == 410,
        )

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()

    def close(self) -> None:
        self.client.close()


def _http_error(exc: httpx.HTTPError) -> str:
    # The root cause in a few words ("Connection refused"), not httpx's chain.
    cause: BaseException = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return str(exc) or type(exc).__name__


class CommandSender:
    def __init__(self, cfg: CommandHookConfig, outbox: Path) -> None:
        self.cfg = cfg
        self.name = cfg.receiver
        self.events = cfg.events
        self.identity = identity_of(cfg)
        self.outbox = outbox
        self.child: SessionChild | None = None
        self._lock = threading.Lock()

    def send(self, event_id: str, body: str) -> Attempt:
        try:
            payload = json.loads(body)
        except ValueError:
            payload = {}
        env = {**os.environ, **event_env(payload if isinstance(payload, dict) else {},
                                          self.outbox)}
        argv = list(self.cfg.command)
        try:
            # Its own session: a timeout or a stop kills what it started too.
            child = SessionChild(argv, env=env, stdin=body.encode("utf-8"), keep=OUTPUT_LIMIT)
        except OSError as exc:
            return Attempt(False, f"cannot run {argv[0]}: {exc.strerror or exc}")
        with self._lock:
            self.child = child
        try:
            code = child.wait(self.cfg.timeout_seconds)
        finally:
            with self._lock:
                self.child = None
        # A child it left running may hold the pipe open: do not wait for it long.
        out, dropped = child.output(grace=1.0)
        self._log_output(event_id, out, dropped)
        if code is None:
            return Attempt(
                False, f"still running after {self.cfg.timeout_seconds:g} s: killed"
            )
        if code != 0:
            if code < 0:
                return Attempt(False, f"killed by {signal.Signals(-code).name}")
            return Attempt(False, f"exit status {code}")
        return Attempt(True, "exit status 0")

    def _log_output(self, event_id: str, out: bytes, dropped: int) -> None:
        if not out:
            return
        text = out.decode("utf-8", errors="replace").rstrip()
        for line in text.splitlines():
            log.info("hook %s (%s): %s", self.name, event_id, safe_display(line))
        if dropped:
            log.info("hook %s (%s): ... %d more bytes of output not logged", self.name,
                     event_id, dropped)

    def cancel(self) -> None:
        with self._lock:
            child = self.child
        if child is not None:
            child.kill()

    def close(self) -> None:
        self.cancel()


def senders_for(cfg: Config) -> list[Sender]:
    """Every configured receiver. Secrets were checked at load; one unreadable now
    (a file since removed) makes that webhook unsigned-never: it is skipped, loudly."""
    out: list[Sender] = []
    for hook in cfg.hooks.webhooks:
        try:
            secret = hook_secret(hook)
        except (OSError, ValueError) as exc:
            log.error("hook %s: its secret_file cannot be used (%s); its events wait",
                      hook.receiver, exc)
            continue
        out.append(WebhookSender(hook, secret))
    out.extend(CommandSender(hook, cfg.outbox) for hook in cfg.hooks.commands)
    return out


# -- lanes --------------------------------------------------------------------------------


class Lane:
    """One receiver's deliveries, oldest first, one at a time."""

    def __init__(
        self,
        sender: Sender,
        open_store: Callable[[], Store],
        policy: HooksConfig,
        *,
        wall: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        predecessor: Lane | None = None,
    ) -> None:
        self.sender = sender
        self.name = sender.name
        self.open_store = open_store
        self.store: Store | None = None
        self.policy = policy
        self.wall = wall
        self.rand = rand
        self.failing = Reminder(log)
        self.disabled: str | None = None  # why (410), when the lane stopped sending
        self.stop_event = threading.Event()  # finish the attempt in flight, then end
        self.abandon = threading.Event()  # stopping the daemon: do not wait for it
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.predecessor = predecessor

    def step(self, now: float) -> float:
        """Deliver what is due at `now`; return the seconds until something may be due."""
        if self.store is None:
            self.store = self.open_store()
        store = self.store
        # Read each time: `docinbox hooks retry` (another process) enables it again.
        was = self.disabled
        self.disabled = store.receiver_disabled(self.name, self.sender.identity)
        if self.disabled is not None:
            if was is None:
                log.warning("hook %s stays disabled: it answered %s; `docinbox hooks retry` "
                            "or a change of its configuration enables it", self.name,
                            self.disabled)
            return IDLE_SECONDS * 30
        if was is not None:
            log.info("hook %s: enabled again; its waiting events go out", self.name)
        d = store.next_delivery(self.name)
        if d is None:
            self.failing.resolved(now, f"hook {self.name}: delivering again")
            return IDLE_SECONDS
        if d.next_at > now:
            return d.next_at - now
        attempt = self.sender.send(d.event_id, d.body)
        if self.abandon.is_set():
            return 0.0  # abandoned at stop: it stays pending for the next start
        if attempt.ok:
            store.delivery_succeeded(d, now)
            log.debug("hook %s: event %s delivered (%s)", self.name, d.event_id, attempt.message)
            self.failing.resolved(now, f"hook {self.name}: delivering again")
            return 0.0
        if attempt.gone:
            store.delivery_failed(d, now, attempt.message, None)
            store.disable_receiver(self.name, self.sender.identity, attempt.message, now)
            self.disabled = attempt.message
            log.warning("hook %s answered %s: it is disabled, also after a restart, until "
                        "`docinbox hooks retry` or a change of its configuration; its events "
                        "wait (`docinbox hooks`)", self.name, attempt.message)
            return IDLE_SECONDS * 30
        if now - d.since >= self.policy.max_age_seconds:
            # Given up only after one more try: an event that waited out a week-long stop
            # of the daemon still gets its attempt.
            why = (f"{attempt.message}; not delivered within "
                   f"{self.policy.max_age_seconds:g} s: given up")
            store.delivery_failed(d, now, why, None)
            log.error("hook %s: gave up on event %s (%s, job %s): %s; "
                      "`docinbox hooks retry %s` sends it again",
                      self.name, d.event_id, d.type, d.job_id, why, d.seq)
            return 0.0
        delay = backoff(d.attempts + 1, self.policy.retry_backoff_seconds,
                        self.policy.retry_backoff_max_seconds, attempt.retry_after, self.rand())
        store.delivery_failed(d, now, attempt.message, now + delay)
        self.failing.problem(
            now, f"hook {self.name}: delivery failed ({attempt.message}); event {d.event_id} "
            f"is tried again in {delay:.3g} s, the receiver's later events wait behind it")
        return delay

    # -- the thread ------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"hook-{self.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.predecessor is not None:
            # A reload replaced this receiver's lane: never two attempts at once.
            self.predecessor.join(None)
            self.predecessor = None
        while not self.stop_event.is_set():
            self.wake.clear()
            try:
                wait = self.step(self.wall())
            except (StoreBusy, sqlite3.OperationalError) as exc:
                self.failing.problem(self.wall(), f"hook {self.name}: database busy ({exc})")
                wait = IDLE_SECONDS
            except Exception:
                log.exception("hook %s: internal error; trying again shortly", self.name)
                wait = IDLE_SECONDS * 5
            if wait > 0:
                self.wake.wait(wait)
        self.sender.close()
        if self.store is not None:
            self.store.close()

    def stop(self, *, abandon: bool) -> None:
        """End the thread after the attempt in flight; with `abandon`, cut that attempt
        short (kill the command, drop the connection) and leave its event pending."""
        if abandon:
            self.abandon.set()
        self.stop_event.set()
        self.wake.set()
        if abandon:
            self.sender.cancel()

    def join(self, timeout: float | None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


class HookService:
    """The configured receivers, their lanes, and the events the store records for them."""

    def __init__(
        self,
        cfg: Config,
        *,
        wall: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        senders: Callable[[Config], Sequence[Sender]] = senders_for,
    ) -> None:
        self.cfg = cfg
        self.wall = wall
        self.rand = rand
        self.make_senders = senders
        self.lanes: dict[str, Lane] = {}
        self.recorded = False  # an event was handed to the store since the last wake
        # name -> event types, swapped whole on reload (read by the main thread).
        self.subscriptions: dict[str, tuple[str, ...]] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.hooks.webhooks or self.cfg.hooks.commands)

    def event_for(
        self, outcome: Outcome, files: Sequence[str] | None = None
    ) -> NewEvent | None:
        """The event of an outcome and who wants it (an `EventMaker`: called before the
        store's transaction that records both; `files`: see `build_event`)."""
        receivers = tuple(n for n, ev in self.subscriptions.items() if outcome.event in ev)
        if not receivers:
            return None
        self.recorded = True
        now = self.wall()
        event_id = new_event_id()
        try:
            body = build_event(self.cfg, outcome, now=now, event_id=event_id,
                               files=files).body()
        except Exception:
            # A bug here must neither fail the document (its outcome is recorded next,
            # with this event) nor drop the event: it goes out with what is sure.
            log.exception("hooks: the body of the %s event of job %s could not be built",
                          outcome.event, outcome.job.id)
            body = json.dumps({
                "id": event_id, "type": outcome.event, "timestamp": iso(now),
                "data": {"job_id": outcome.job.id, "incomplete": True},
            }, separators=(",", ":"))
        return NewEvent(event_id, outcome.event, outcome.job.id, now, body, receivers)

    def start(self, store: Store) -> None:
        self._apply(self.cfg, store)

    def reload(self, cfg: Config, store: Store) -> None:
        """SIGHUP: receivers added, changed or removed; a disabled one is tried again."""
        self.cfg = cfg
        self._apply(cfg, store)

    def _apply(self, cfg: Config, store: Store) -> None:
        senders = {s.name: s for s in self.make_senders(cfg)}
        self.subscriptions = {n: s.events for n, s in senders.items()}
        configured = [h.receiver for h in cfg.hooks.webhooks]
        configured += [h.receiver for h in cfg.hooks.commands]
        gone = store.expire_deliveries_of_others(configured, self.wall())
        if gone:
            log.warning("%d pending event(s) for hooks no longer configured are dead now "
                        "(`docinbox hooks` lists them, `docinbox hooks retry --dead`)", gone)
        old = self.lanes
        self.lanes = {}
        for name, sender in senders.items():
            prev = old.pop(name, None)
            if prev is not None:
                prev.stop(abandon=False)
            lane = Lane(sender, lambda: Store.of(cfg), cfg.hooks, wall=self.wall,
                        rand=self.rand, predecessor=prev)
            self.lanes[name] = lane
            lane.start()
        for lane in old.values():
            lane.stop(abandon=False)
        if senders:
            log.info("hooks: %s", ", ".join(
                f"{n} ({', '.join(e.removeprefix('document.') for e in s.events)})"
                for n, s in senders.items()))

    def wake(self) -> None:
        for lane in self.lanes.values():
            lane.wake.set()

    def wake_if_new(self) -> None:
        """After a main-loop tick: lanes look at once when an event was recorded (its
        transaction has committed by now), instead of at their next idle look."""
        if self.recorded:
            self.recorded = False
            self.wake()

    def disabled(self) -> dict[str, str]:
        return {n: lane.disabled for n, lane in self.lanes.items() if lane.disabled}

    def stop(self, timeout: float = 2.0) -> None:
        """Stop every lane; an attempt in flight is abandoned and stays pending."""
        for lane in self.lanes.values():
            lane.stop(abandon=True)
        deadline = time.monotonic() + timeout
        for lane in self.lanes.values():
            lane.join(max(0.0, deadline - time.monotonic()))
