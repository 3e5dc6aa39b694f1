"""The `http` runtime: MinerU2.5 on an OpenAI-compatible server (vLLM, SGLang, LMDeploy,
llama.cpp's llama-server, MinerU's own server).

mineru-vl-utils' http client builds the requests (MinerU's prompts, sampling parameters
including vLLM's `no_repeat_ngram_size` extra, `skip_special_tokens: false`) and reads
the answers (finish reasons, the `<|im_end|>` strip). What this module adds around it:

- our own httpx transport: a CA bundle for https servers with a private CA, an API key
  header that never reaches a log, and a retry policy that outlasts a server restart
  (connection errors, 429 and 5xx retried with exponential back-off, `Retry-After`
  honoured; httpx-retries, which mineru-vl-utils already depends on, does the retrying);
- the generated-token count from the answer's `usage`, for truncation checks and
  throughput figures (the library's `predict` returns only the text);
- a semaphore so that all pages and blocks in flight together never exceed
  `max_in_flight` requests;
- `probe_server`: `/health` and `/v1/models` with a short timeout, for load, for the
  daemon's re-probing while it runs the fallback engine, and for `docinbox model info`.
  It imports httpx only: the daemon process can call it.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from daemon.common.errors import DocumentError, EngineUnavailable, FailureKind
from daemon.config.settings import EngineHttpConfig
from daemon.document.page import Json
from daemon.engines.mineru.runtimes.base import (
    ClientOptions,
    GenRequest,
    Prediction,
    RequestRuntime,
    RuntimeInfo,
    open_client,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("docinbox.http_runtime")

# Statuses a healthy server returns while it is overloaded or restarting.
RETRY_STATUSES = (429, 500, 502, 503, 504)
PROBE_TIMEOUT_SECONDS = 5.0

_VERSION_RE = re.compile(r"^(.*)/(v\d+)$")


class ServerUnavailable(EngineUnavailable):
    """The server stopped answering mid-document, after every retry.

    Not the document's fault: the worker hands the page back and the daemon treats the
    runtime as unavailable (fallback engine, re-probing) instead of failing the document.
    """


def display_url(url: str | None) -> str:
    """The server URL without credentials (`https://user:pw@host` is valid in httpx)."""
    if not url:
        return "(engine.http.server_url not set)"
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def api_base(server_url: str | None) -> str:
    """`http://host:8000` -> `http://host:8000/v1`; a URL ending in /v1 (or /v2) is kept."""
    url = (server_url or "").rstrip("/")
    return url if _VERSION_RE.match(url) else f"{url}/v1"


def root_url(server_url: str | None) -> str:
    """Where `/health` lives: the server URL without its API version suffix."""
    url = (server_url or "").rstrip("/")
    match = _VERSION_RE.match(url)
    return match.group(1) if match else url


def _ssl_context(settings: EngineHttpConfig) -> ssl.SSLContext | bool:
    if settings.ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(settings.ca_bundle))
    except (OSError, ssl.SSLError) as exc:
        raise EngineUnavailable(
            f"cannot read engine.http.ca_bundle {settings.ca_bundle}: {exc}",
            hint="point engine.http.ca_bundle at a PEM file with the CA certificate(s)",
        ) from exc


def _retry_policy(settings: EngineHttpConfig, retries: int) -> Any:
    import httpx
    from httpx_retries import Retry

    class LoggedRetry(Retry):
        """Retry that says in the log why it waits: a restart should be visible."""

        def sleep(self, response: httpx.Response | Exception) -> None:
            what = (
                f"HTTP {response.status_code}"
                if isinstance(response, httpx.Response)
                else type(response).__name__
            )
            log.warning(
                "MinerU server %s: %s; retry %d of %d",
                display_url(settings.server_url),
                what,
                self.attempts_made,
                self.total,
            )
            super().sleep(response)

    return LoggedRetry(
        total=retries,
        allowed_methods=["GET", "POST"],
        status_forcelist=RETRY_STATUSES,
        # A hung generation is not retried: it would hang again, for timeout_seconds each
        # time. Connection-level failures (server restarting, connection reset) are.
        retry_on_exceptions=(
            httpx.ConnectError,
            httpx.ConnectTimeout,
            httpx.PoolTimeout,
            httpx.ReadError,
            httpx.WriteError,
            httpx.RemoteProtocolError,
        ),
        # urllib3-style: wait = factor * 2**attempt; the first wait is retry_backoff_seconds.
        backoff_factor=settings.retry_backoff_seconds / 2,
        max_backoff_wait=settings.retry_backoff_max_seconds,
        backoff_jitter=0.5,  # spread several daemons' retries after a server restart
        respect_retry_after_header=True,
    )


def make_http_client(
    settings: EngineHttpConfig, *, timeout: float | None = None, retries: int | None = None
) -> httpx.Client:
    """An httpx client for the server: CA bundle, API key, retry policy, pool size."""
    import httpx
    from httpx_retries import RetryTransport

    # httpx logs every request at INFO: one journal line per block (and per re-probe), with
    # the full URL, a user:password@ in server_url included. Retries are logged by
    # LoggedRetry; failures by whoever handles them.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    read = settings.timeout_seconds if timeout is None else timeout
    connect = min(settings.connect_timeout_seconds, read)
    transport = httpx.HTTPTransport(
        verify=_ssl_context(settings),
        limits=httpx.Limits(
            max_connections=settings.max_in_flight + 2, max_keepalive_connections=None
        ),
    )
    return httpx.Client(
        headers=headers,
        timeout=httpx.Timeout(read, connect=connect, pool=None),
        transport=RetryTransport(
            retry=_retry_policy(settings, settings.retries if retries is None else retries),
            transport=transport,
        ),
    )


@dataclass(frozen=True)
class ServerProbe:
    """One look at the server: does it answer, which models does it serve."""

    server: str  # display URL
    reachable: bool
    healthy: bool | None = None  # /health: None when the server has no such endpoint
    models: tuple[str, ...] = ()
    error: str | None = None
    details: dict[str, Json] = field(default_factory=dict)


def probe_server(settings: EngineHttpConfig, timeout: float = PROBE_TIMEOUT_SECONDS) -> ServerProbe:
    """GET /health and /v1/models once, without retries. Never raises for network errors."""
    import httpx

    server = display_url(settings.server_url)
    if not settings.server_url:
        return ServerProbe(server, False, error="engine.http.server_url is not set")
    try:
        client = make_http_client(settings, timeout=timeout, retries=0)
    except EngineUnavailable as exc:
        return ServerProbe(server, False, error=exc.message)
    with client:
        healthy: bool | None = None
        try:
            health = client.get(f"{root_url(settings.server_url)}/health")
            # llama-server answers 503 while it loads the model: reachable, not ready.
            healthy = None if health.status_code == 404 else health.status_code == 200
            models_response = client.get(f"{api_base(settings.server_url)}/models")
        except httpx.HTTPError as exc:
            return ServerProbe(server, False, error=_describe(exc, settings))
        if models_response.status_code in (401, 403):
            return ServerProbe(
                server,
                True,
                healthy,
                error=f"the server refused the request (HTTP {models_response.status_code}); "
                "check engine.http.api_key",
            )
        if models_response.status_code != 200:
            return ServerProbe(
                server,
                True,
                healthy,
                error=f"GET /v1/models answered HTTP {models_response.status_code}",
            )
        try:
            data = models_response.json().get("data", [])
            models = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
        except (ValueError, AttributeError, TypeError):
            return ServerProbe(server, True, healthy, error="/v1/models did not return JSON")
        if healthy is False:
            return ServerProbe(server, True, False, models, error="/health is not OK yet")
        return ServerProbe(server, True, healthy, models)


def _describe(exc: Exception, settings: EngineHttpConfig) -> str:
    import httpx

    server = display_url(settings.server_url)
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, httpx.ConnectError) and (
        isinstance(cause, ssl.SSLError) or "SSL" in str(exc)
    ):
        return (
            f"TLS handshake with {server} failed ({exc}); for a server certificate from a "
            "private CA set engine.http.ca_bundle to the CA's PEM file"
        )
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {server} ({exc or type(exc).__name__})"
    if isinstance(exc, httpx.TimeoutException):
        return f"{server} did not answer in time ({type(exc).__name__})"
    return f"{server}: {type(exc).__name__}: {exc}"


def choose_model(settings: EngineHttpConfig, probe: ServerProbe) -> str:
    """The configured model if the server has it, else the server's only model."""
    served = ", ".join(probe.models) or "none"
    if settings.model_name:
        if settings.model_name in probe.models:
            return settings.model_name
        raise EngineUnavailable(
            f"the MinerU server {probe.server} has no model {settings.model_name!r}; "
            f"it serves: {served}",
            hint="set engine.http.model_name to one of the served models "
            "(or leave it empty when the server serves exactly one)",
        )
    if len(probe.models) == 1:
        return probe.models[0]
    raise EngineUnavailable(
        f"the MinerU server {probe.server} serves "
        + ("no model" if not probe.models else f"several models ({served})"),
        hint="set engine.http.model_name to the MinerU2.5 model's name",
    )


class HttpRuntime(RequestRuntime):
    """Generation on a server. `predict` is thread-safe; requests are bounded by
    `max_in_flight` across all pages and blocks."""

    def __init__(self, settings: EngineHttpConfig, client_options: ClientOptions) -> None:
        if settings.max_in_flight < 1:
            raise ValueError("engine.http.max_in_flight must be at least 1")
        if not settings.server_url:
            raise EngineUnavailable(
                "engine.runtime is http but engine.http.server_url is not set",
                hint="set engine.http.server_url to the MinerU server (docs/scale-out.md)",
            )
        probe = probe_server(settings)
        if not probe.reachable or probe.error:
            raise EngineUnavailable(
                f"MinerU server not usable: {probe.error}",
                hint=f"start the server at {probe.server} (see docs/scale-out.md) or fix "
                "engine.http.server_url; the daemon re-probes it every minute",
            )
        model = choose_model(settings, probe)
        self.settings = settings
        client = open_client(
            "http-client",
            client_options,
            server_url=settings.server_url,
            model_name=model,
            skip_model_name_checking=True,  # done above, with a better error
            max_concurrency=settings.max_in_flight,
            http_timeout=int(settings.timeout_seconds),
        )
        # Any: mineru-vl-utils' HttpVlmClient, whose request and answer helpers we call.
        self._vlm: Any = client.client
        # Requests go through our client (CA bundle, key, retries); the library's own
        # connection pool is never used.
        self._vlm._client.close()
        self._http = make_http_client(settings)
        self._slots = threading.BoundedSemaphore(settings.max_in_flight)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.max_pages_in_flight = settings.max_in_flight
        self.info = RuntimeInfo(
            runtime="http",
            model=model,
            server=probe.server,
            details={"max_in_flight": settings.max_in_flight, "served_models": list(probe.models)},
        )
        super().__init__(client, max_blocks_in_flight=settings.max_in_flight)

    def predict_one(self, request: GenRequest) -> Prediction:
        import httpx
        from mineru_vl_utils.vlm_client import HttpResponseError
        from mineru_vl_utils.vlm_client.utils import image_to_bytes_list_and_format

        images, image_format = image_to_bytes_list_and_format(request.image)
        body = self._vlm.build_request_body(
            system_prompt=self._vlm.system_prompt,
            image=images,
            prompt=request.prompt,
            sampling_params=request.capped_params(),
            image_format=image_format,
            priority=None,
        )
        with self._slots:
            with self._lock:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                response = self._http.post(self._vlm.chat_url, json=body)
            except httpx.TimeoutException as exc:
                raise DocumentError(
                    FailureKind.ENGINE,
                    f"the MinerU server {self.info.server} did not answer within "
                    f"{self.settings.timeout_seconds:.0f} s (engine.http.timeout_seconds)",
                ) from exc
            except httpx.HTTPError as exc:
                raise ServerUnavailable(
                    f"lost the MinerU server after {self.settings.retries} retries: "
                    f"{_describe(exc, self.settings)}",
                    hint="the daemon re-probes it every minute and resumes the document",
                ) from exc
            finally:
                with self._lock:
                    self.in_flight -= 1
        try:
            data = self._vlm.get_response_data(response)
        except HttpResponseError as exc:
            raise self._status_error(response) from exc
        text = str(self._vlm.get_response_content(data))
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return Prediction(text=text, tokens=int(usage.get("completion_tokens") or 0))

    def _status_error(self, response: httpx.Response) -> Exception:
        status = response.status_code
        body = response.text[:300]
        if status in RETRY_STATUSES:
            return ServerUnavailable(
                f"the MinerU server {self.info.server} kept answering HTTP {status} after "
                f"{self.settings.retries} retries: {body}",
                hint="check the server's log; the daemon re-probes it every minute",
            )
        if status in (401, 403):
            return EngineUnavailable(
                f"the MinerU server {self.info.server} refused the request (HTTP {status})",
                hint="check engine.http.api_key",
            )
        if status == 404:
            return ServerUnavailable(
                f"the MinerU server {self.info.server} no longer serves {self.info.model!r} "
                f"(HTTP 404: {body})",
                hint="set engine.http.model_name to a model the server serves",
            )
        # 400 and friends: this request (this page's image) was refused.
        return DocumentError(
            FailureKind.ENGINE, f"the MinerU server refused a request (HTTP {status}): {body}"
        )

    def close(self) -> None:
        super().close()
        self._http.close()
