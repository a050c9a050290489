"""Talking to a server: `fetch_metrics` (one scrape of URL/metrics), `Scraper` (scrapes on an
interval, backing off while the server is down) and `stream_chat` (the OpenAI-compatible chat
stream, with the reply's own TTFT and tokens/s). Every failure is an `AttachError`: one line."""
from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.attach.exposition import MetricsError, Scrape, parse_metrics
from engine.attach.peak import GpuPeak
from engine.attach.series import ScrapeRecord, SeriesBuilder

SCRAPE_TIMEOUT_S = 3.0
MAX_BACKOFF_S = 8.0
CHAT_TIMEOUT_S = 120.0  # between two chunks of the stream (a long prefill on a busy server)


class AttachError(Exception):
    """The server could not be read; str() is one line for the user."""


def normalise_url(url: str) -> str:
    """'localhost:8000/' -> 'http://localhost:8000'; a pasted '…/metrics' or '…/v1' is the server's
    base too. ValueError (one line) for what is no http(s) address."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server address: {url!r} (expected e.g. http://localhost:8000)")
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = -1
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"not a server address: {url!r} (bad port)")
    path = parts.path.rstrip("/")
    for suffix in ("/metrics", "/v1/chat/completions", "/v1"):
        path = path.removesuffix(suffix)
    return f"{parts.scheme}://{parts.netloc}{path}"


def _connection(base_url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout_s), parts.path


def _why(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout_s:g} s"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (is the server running on that port?)"
    if isinstance(error, socket.gaierror):
        return "unknown host"
    if isinstance(error, (http.client.HTTPException, ConnectionError)):
        return f"the connection broke ({type(error).__name__})"
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _error_text(body: bytes) -> str:
    """A server's error body in one line: an OpenAI-style JSON error's message, else the text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else data
        text = error.get("message", text) if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    line = text.splitlines()[0] if text else ""
    return line[:200]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_metrics(base_url: str, *, timeout_s: float = SCRAPE_TIMEOUT_S, api_key: str | None = None,
                  clock=time.monotonic) -> Scrape:
    """One scrape of base_url/metrics. AttachError for no answer, an error status or an answer that
    is not Prometheus text."""
    connection, path = _connection(base_url, timeout_s)
    try:
        connection.request("GET", path + "/metrics", headers=_headers(api_key))
        response = connection.getresponse()
        body = response.read()
        t_s = clock()
        start = response.getheader("Process-Start-Time-Unix")  # llama.cpp's start (its own clock)
    except (OSError, http.client.HTTPException) as error:
        raise AttachError(f"{base_url}/metrics: {_why(error, timeout_s)}") from None
    finally:
        connection.close()
    if response.status != 200:
        hint = " (SGLang serves /metrics with --enable-metrics, llama.cpp's server with --metrics)" \
            if response.status == 404 else ""
        raise AttachError(f"{base_url}/metrics: HTTP {response.status} {response.reason}: {_error_text(body)}{hint}")
    try:
        return parse_metrics(body.decode("utf-8", "replace"), t_s, _float_or_none(start))
    except MetricsError as error:
        raise AttachError(f"{base_url}/metrics: {error}") from None


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class Scraper:
    """Scrapes a server and turns each answer (or failure) into a `ScrapeRecord`. After a failure
    it waits longer before the next try (doubling, up to MAX_BACKOFF_S); one answer resets that."""

    def __init__(self, url: str, *, interval_s: float = 1.0, peak: GpuPeak | None = None,
                 api_key: str | None = None, timeout_s: float = SCRAPE_TIMEOUT_S, clock=time.monotonic):
        self.url = normalise_url(url)
        self.interval_s = interval_s
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.clock = clock
        self.series = SeriesBuilder(peak)
        self.failures = 0
        self.kind = ""  # the last answer's server kind
        self.lock = threading.Lock()  # one poll at a time: `run`'s, or one asked for between (a reply's end)

    def poll(self) -> ScrapeRecord:
        with self.lock:
            try:
                scrape = fetch_metrics(self.url, timeout_s=self.timeout_s, api_key=self.api_key, clock=self.clock)
            except AttachError as error:
                self.failures += 1
                status = "bad answer" if ": HTTP " in str(error) or "not Prometheus" in str(error) else "down"
                return self.series.gap(self.clock(), status, str(error))
            record = self.series.add(scrape)
            self.failures = 0 if record.status != "bad answer" else self.failures + 1
            self.kind = scrape.kind
            return record

    @property
    def next_delay_s(self) -> float:
        if self.failures == 0:
            return self.interval_s
        return min(self.interval_s * 2 ** self.failures, MAX_BACKOFF_S)

    def run(self, seconds: float, on_record, stop: threading.Event | None = None) -> None:
        """Scrape for `seconds` (every interval_s, slower while failing), handing each record to
        on_record; `stop` ends it early."""
        stop = stop or threading.Event()
        end = self.clock() + seconds
        while not stop.is_set():
            started = self.clock()
            if started >= end:
                return
            on_record(self.poll())
            wait = min(started + self.next_delay_s, end) - self.clock()
            if wait > 0:
                stop.wait(wait)


# ---------------------------------------------------------------------------------------------
# Chat


@dataclass(frozen=True)
class ChatDone:
    """A finished streamed reply, measured at the client (network included)."""
    text: str
    n_tokens: int  # the server's completion token count (usage), else content chunks counted
    n_prompt_tokens: int | None
    ttft_s: float  # request sent -> first streamed token (reasoning or content)
    stream_s: float  # first streamed token -> last
    finish_reason: str
    counted_from: str  # "usage" | "chunks"
    reasoning_chunks: int = 0  # chunks of thinking (a reasoning model's), timed but not in `text`

    @property
    def tokens_per_s(self) -> float:
        """After the first token (as DoneEvent.decode_tokens_per_s): tokens 2..n over their time."""
        return (self.n_tokens - 1) / self.stream_s if self.stream_s > 0 and self.n_tokens > 1 else math.nan


def server_model(base_url: str, api_key: str | None = None, timeout_s: float = SCRAPE_TIMEOUT_S) -> str | None:
    """The first model id of GET /v1/models (vLLM and SGLang need it in a request), or None."""
    connection, path = _connection(base_url, timeout_s)
    try:
        connection.request("GET", path + "/v1/models", headers=_headers(api_key))
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        models = json.loads(body).get("data") or []
        return str(models[0]["id"]) if models else None
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, AttributeError):
        return None
    finally:
        connection.close()


def stream_chat(base_url: str, messages: list[dict], *, model: str | None = None, max_tokens: int = 256,
                temperature: float = 0.7, seed: int | None = None, api_key: str | None = None,
                timeout_s: float = CHAT_TIMEOUT_S, stop: threading.Event | None = None,
                extra: dict | None = None, clock=time.monotonic) -> Iterator[str | ChatDone]:
    """Yield the reply's text pieces as they stream, then one ChatDone. AttachError (one line) when
    the server is down, refuses, or streams something that is not the OpenAI format. `extra`: fields
    one server understands (llama.cpp's `ignore_eos`)."""
    body = {"messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if seed is not None:
        body["seed"] = seed
    body.update(extra or {})
    connection, path = _connection(base_url, timeout_s)
    where = f"{base_url}/v1/chat/completions"
    sent = clock()
    try:
        connection.request("POST", path + "/v1/chat/completions", body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                                    **_headers(api_key)})
        response = connection.getresponse()
        if response.status != 200:
            raise AttachError(f"{where}: HTTP {response.status} {response.reason}: {_error_text(response.read())}")
        pieces: list[str] = []
        chunks = thinking = 0  # streamed chunks, and those of them that were reasoning
        first = last = None
        usage: dict = {}
        finish = ""
        for raw in response:
            if stop is not None and stop.is_set():
                finish = "stopped"
                break
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            try:
                event = json.loads(payload)
            except ValueError:
                raise AttachError(f"{where}: the stream is not JSON events ({payload[:60]!r})") from None
            if not isinstance(event, dict):
                raise AttachError(f"{where}: unexpected stream event ({payload[:60]!r})")
            if "error" in event:
                raise AttachError(f"{where}: {_error_text(json.dumps(event).encode())}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                # a reasoning model streams its thinking first, as tokens of the reply: vLLM in
                # `reasoning` (older: `reasoning_content`), SGLang in `reasoning_content`
                thought = delta.get("reasoning") or delta.get("reasoning_content") or ""
                finish = choice.get("finish_reason") or finish
                if text or thought:
                    now = clock()
                    first = now if first is None else first
                    last = now
                    chunks += 1
                if thought:
                    thinking += 1
                if text:
                    pieces.append(text)
                    yield text
    except (OSError, http.client.HTTPException) as error:
        raise AttachError(f"{where}: {_why(error, timeout_s)}") from None
    finally:
        connection.close()
    counted = int(usage["completion_tokens"]) if finish != "stopped" and "completion_tokens" in usage else None
    yield ChatDone(text="".join(pieces), n_tokens=counted if counted is not None else chunks,
                   n_prompt_tokens=usage.get("prompt_tokens"),
                   ttft_s=(first - sent) if first is not None else math.nan,
                   stream_s=(last - first) if first is not None else 0.0, finish_reason=finish or "unknown",
                   counted_from="usage" if counted is not None else "chunks", reasoning_chunks=thinking)
