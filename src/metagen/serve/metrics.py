"""/metrics in the Prometheus text exposition format (version 0.0.4).

    metagen_requests_total{endpoint, status}  HTTP requests answered, by route (its path; "other" for
                                              a path no route matches) and status code
    metagen_prompt_tokens_total               prompt tokens prefilled
    metagen_generation_tokens_total           tokens generated
    metagen_requests_finished_total{outcome}  engine requests: finished / failed / cancelled / timed_out
    metagen_queue_depth                       requests waiting for rows
    metagen_batch_rows                        rows in the running batch now
    metagen_running_requests                  requests in the running batch now
    metagen_batch_rows_max                    most rows decoded in one step so far
    metagen_decode_steps_total                decode forwards
    metagen_decode_step_rows_total            rows over all decode forwards (/ steps = mean batch)
    metagen_prefix_cache_hits_total           requests that reused a cached prefix
    metagen_prefix_cache_reused_tokens_total  prompt tokens taken from the prefix cache (not prefilled)
    metagen_prefix_cache_evicted_tokens_total tokens evicted from the prefix cache
    metagen_prefix_cache_tokens               tokens the prefix cache holds now

With speculative decoding (`metagen serve --speculative`), as vLLM's spec_decode counters:

    metagen_spec_decode_num_drafts_total            rows given a draft, over all steps
    metagen_spec_decode_num_draft_tokens_total      draft tokens scored (tree nodes included)
    metagen_spec_decode_num_accepted_tokens_total   draft tokens taken (accepted / draft = acceptance rate)

In proxy mode (`render_proxy`) the engine's gauges give way to the backends':

    metagen_requests_total{endpoint, status}  as above
    metagen_prompt_tokens_total, metagen_generation_tokens_total   as the backends reported them
    metagen_requests_finished_total{outcome}  proxied requests (plain ones) by outcome
    metagen_backend_requests_total            requests sent to the backends (strategies send several)
    metagen_backend_answered_total{backend}   requests a backend answered
    metagen_backend_errors_total{backend}     requests that failed on a backend (after its retries)
    metagen_backend_outstanding{backend}      requests in flight on a backend
    metagen_backend_up{backend}               1 while a backend takes requests, 0 while it is out
"""

from __future__ import annotations

import threading
from collections import Counter



class RequestCounter:
    """HTTP requests by (endpoint, status); safe to bump from any thread. The caller labels by
    route, not by the path asked, so the series are at most routes x statuses."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()

    def add(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._counts[endpoint, status] += 1

    def items(self) -> list[tuple[tuple[str, int], int]]:
        with self._lock:
            return sorted(self._counts.items())


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}")


def _shared(lines: list[str], stats, requests: RequestCounter, what: str) -> None:
    """The metrics of both modes: HTTP requests, tokens and request outcomes."""
    _metric(lines, "metagen_requests_total", "counter", "HTTP requests answered, by endpoint and status code.",
            [(f'{{endpoint="{endpoint}",status="{status}"}}', count) for (endpoint, status), count in requests.items()])
    _metric(lines, "metagen_prompt_tokens_total", "counter", "Prompt tokens prefilled.", [("", stats.prompt_tokens)])
    _metric(lines, "metagen_generation_tokens_total", "counter", "Tokens generated.", [("", stats.generated_tokens)])
    _metric(lines, "metagen_requests_finished_total", "counter", f"{what} by outcome.",
            [('{outcome="finished"}', stats.requests_finished), ('{outcome="failed"}', stats.requests_failed),
             ('{outcome="cancelled"}', stats.requests_cancelled),
             ('{outcome="timed_out"}', stats.requests_timed_out)])


def render_proxy(proxy, requests: RequestCounter) -> str:
    """/metrics of a `ProxyBackend`: shared counts plus each backend's."""
    lines: list[str] = []
    _shared(lines, proxy.stats, requests, "Proxied requests")
    _metric(lines, "metagen_backend_requests_total", "counter", "Requests sent to the backends.",
            [("", proxy.backend_requests)])
    endpoints = proxy.remote.stats()
    for name, key, kind, help_text in (
            ("metagen_backend_answered_total", "requests", "counter", "Requests a backend answered."),
            ("metagen_backend_errors_total", "failures", "counter", "Requests that failed on a backend."),
            ("metagen_backend_outstanding", "outstanding", "gauge", "Requests in flight on a backend."),
            ("metagen_backend_up", "up", "gauge", "1 while a backend takes requests.")):
        _metric(lines, name, kind, help_text,
                [(f'{{backend="{url}"}}', int(stats[key])) for url, stats in endpoints.items()])
    return "\n".join(lines) + "\n"


def render(engine, requests: RequestCounter) -> str:
    """/metrics of the local engine."""
    stats = engine.stats
    lines: list[str] = []
    _shared(lines, stats, requests, "Engine requests")
    _metric(lines, "metagen_queue_depth", "gauge", "Requests waiting for rows.", [("", engine.queue_depth)])
    _metric(lines, "metagen_batch_rows", "gauge", "Rows in the running batch.", [("", stats.batch_rows)])
    _metric(lines, "metagen_running_requests", "gauge", "Requests in the running batch.",
            [("", stats.running_requests)])
    _metric(lines, "metagen_batch_rows_max", "gauge", "Most rows decoded in one step so far.",
            [("", stats.max_batch_rows)])
    _metric(lines, "metagen_decode_steps_total", "counter", "Decode forwards.", [("", stats.steps)])
    _metric(lines, "metagen_decode_step_rows_total", "counter", "Rows over all decode forwards.",
            [("", stats.step_rows)])
    _metric(lines, "metagen_prefix_cache_hits_total", "counter", "Requests that reused a cached prefix.",
            [("", stats.prefix_hits)])
    _metric(lines, "metagen_prefix_cache_reused_tokens_total", "counter",
            "Prompt tokens taken from the prefix cache instead of prefilled.", [("", stats.prefix_tokens_reused)])
    _metric(lines, "metagen_prefix_cache_evicted_tokens_total", "counter", "Tokens evicted from the prefix cache.",
            [("", stats.prefix_tokens_evicted)])
    _metric(lines, "metagen_prefix_cache_tokens", "gauge", "Tokens the prefix cache holds.",
            [("", stats.prefix_tokens_cached)])
    if engine.speculation is not None:
        _metric(lines, "metagen_spec_decode_num_drafts_total", "counter", "Rows given a draft, over all steps.",
                [("", stats.drafts)])
        _metric(lines, "metagen_spec_decode_num_draft_tokens_total", "counter", "Draft tokens scored.",
                [("", stats.draft_tokens)])
        _metric(lines, "metagen_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
                [("", stats.accepted_tokens)])
    return "\n".join(lines) + "\n"
