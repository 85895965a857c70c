"""The server's Prometheus metrics, in the text exposition format (version 0.0.4).

Served at TensorFlow Serving's ``/monitoring/prometheus/metrics``:

* ``malinn_serve_requests_total{model,api,code}``: requests answered, by HTTP status;
* ``malinn_serve_request_errors_total{model,api,error}``: requests refused or failed, by
  TensorFlow Serving's error code (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, DEADLINE_EXCEEDED,
  CANCELLED, INTERNAL, RESOURCE_EXHAUSTED; METHOD_NOT_ALLOWED for a 405);
* ``malinn_serve_request_latency_seconds{model,api}``: a histogram of the time from a request's
  arrival to its answer;
* ``malinn_serve_queue_latency_seconds{model}``: a histogram of the time predict requests waited
  for their batch;
* ``malinn_serve_run_latency_seconds{model}``: a histogram of the time from a parsed predict
  request's hand-over to the model until its outputs came back: its queue, its predict call and,
  with ``--http-workers``, the pipes to the process that owns the device and back and the front's
  event-loop turns before its message leaves and after its answer arrives (a request's latency
  beyond it is the HTTP and JSON work around it: reading, parsing, writing the answer);
* ``malinn_serve_compute_latency_seconds{model,version}``: a histogram of the time of each predict
  call (a batch), its samples on the device and back;
* ``malinn_serve_batch_size{model,version}``: a histogram of the samples per predict call, and
  ``malinn_serve_padded_samples_total``: the zero samples added to reach an allowed size;
* ``malinn_serve_worker_parses_total`` and ``malinn_serve_worker_encodes_total``: request bodies
  sent to a parse worker and answers written there, and
  ``malinn_serve_parse_worker_restarts_total``: parse pools replaced after a worker died;
* ``malinn_serve_front_restarts_total``: HTTP front processes started again after one exited;
* ``malinn_serve_queue_depth{model,version}``: requests waiting now; ``malinn_serve_in_flight``:
  requests being answered now; ``malinn_serve_model_versions{model,state}``: versions by state.

With HTTP front processes (``--http-workers``) each front counts its requests and the process that
owns the device its batches; a scrape of any front merges them all (:meth:`Metrics.snapshot`,
:meth:`Metrics.merge`), so the metrics are the whole server's.

Label values are model names and fixed words only (never a request's path), so the number of
series stays bounded.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

__all__ = ["Metrics", "LATENCY_BUCKETS", "BATCH_BUCKETS"]

#: seconds: 0.5 ms to 60 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: samples per predict call
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

#: a counter's (kind, help, label names), or a histogram's (kind, help, label names, bucket bounds)
_Meta = tuple[str, str, tuple[str, ...]] | tuple[str, str, tuple[str, ...], tuple[float, ...]]


def _labels(names: tuple, values: tuple) -> str:
    if not names:
        return ""
    escaped = (str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in values)
    return "{" + ",".join(f'{n}="{v}"' for n, v in zip(names, escaped)) + "}"


class _Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self, buckets: int):
        self.counts, self.sum, self.count = [0] * buckets, 0.0, 0


class Metrics:
    """Counters and histograms, updated from any thread, and gauges read when scraped.

    Args:
        gauges: called at each scrape; returns ``[(name, help, label names, {label values: value})]``.
    """

    def __init__(self, gauges: Callable[[], list] | None = None):
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = {}  # name -> {label values: value}
        self._histograms: dict[str, dict[tuple, _Histogram]] = {}  # name -> {label values: _Histogram}
        self._meta: dict[str, _Meta] = {
            "malinn_serve_requests_total": ("counter", "Requests answered, by HTTP status.", ("model", "api", "code")),
            "malinn_serve_request_errors_total": (
                "counter",
                "Requests refused or failed, by TensorFlow Serving's error code.",
                ("model", "api", "error"),
            ),
            "malinn_serve_padded_samples_total": (
                "counter",
                "Zero samples added to predict calls to reach an allowed batch size.",
                ("model", "version"),
            ),
            "malinn_serve_worker_parses_total": (
                "counter",
                "Request bodies sent to a parse worker process.",
                (),
            ),
            "malinn_serve_worker_encodes_total": (
                "counter",
                "Answers written as JSON in a parse worker process.",
                (),
            ),
            "malinn_serve_parse_worker_restarts_total": (
                "counter",
                "Parse worker pools replaced after a worker exited.",
                (),
            ),
            "malinn_serve_front_restarts_total": (
                "counter",
                "HTTP front processes (--http-workers) started again after one exited.",
                (),
            ),
            "malinn_serve_request_latency_seconds": (
                "histogram",
                "Seconds from a request's arrival to its answer.",
                ("model", "api"),
                LATENCY_BUCKETS,
            ),
            "malinn_serve_queue_latency_seconds": (
                "histogram",
                "Seconds predict requests waited for their batch.",
                ("model",),
                LATENCY_BUCKETS,
            ),
            "malinn_serve_run_latency_seconds": (
                "histogram",
                "Seconds from a parsed predict request's hand-over to the model until its outputs came back.",
                ("model",),
                LATENCY_BUCKETS,
            ),
            "malinn_serve_compute_latency_seconds": (
                "histogram",
                "Seconds of each predict call (a batch).",
                ("model", "version"),
                LATENCY_BUCKETS,
            ),
            "malinn_serve_batch_size": (
                "histogram",
                "Samples per predict call (before padding).",
                ("model", "version"),
                BATCH_BUCKETS,
            ),
        }
        self.gauges = gauges

    def count(self, name: str, labels: tuple, amount: float = 1) -> None:
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[labels] = series.get(labels, 0) + amount

    def observe(self, name: str, labels: tuple, value: float) -> None:
        meta = self._meta[name]
        if len(meta) != 4:
            raise ValueError(f"{name} is a counter: count() adds to it, observe() is for histograms")
        with self._lock:
            self._observe(name, meta[3], labels, value)

    def ran(self, model: str, queued: float, run: float) -> None:
        """A predict request's outputs came back: its wait for a batch (``queued`` seconds) and its run
        (``run`` seconds) observed, as :meth:`observe` would, under one hold of the lock."""
        with self._lock:
            self._observe("malinn_serve_queue_latency_seconds", LATENCY_BUCKETS, (model,), queued)
            self._observe("malinn_serve_run_latency_seconds", LATENCY_BUCKETS, (model,), run)

    def answered(self, model: str, api: str, status: int, code: str | None, seconds: float) -> None:
        """One request answered: ``malinn_serve_requests_total`` by its status, where it failed
        ``malinn_serve_request_errors_total`` by its error code, and its latency observed (as
        :meth:`count` and :meth:`observe` would, under one hold of the lock)."""
        with self._lock:
            series = self._counters.setdefault("malinn_serve_requests_total", {})
            labels = (model, api, str(status))
            series[labels] = series.get(labels, 0) + 1
            if code is not None:
                series = self._counters.setdefault("malinn_serve_request_errors_total", {})
                labels = (model, api, code)
                series[labels] = series.get(labels, 0) + 1
            self._observe("malinn_serve_request_latency_seconds", LATENCY_BUCKETS, (model, api), seconds)

    def _observe(self, name: str, buckets: tuple, labels: tuple, value: float) -> None:
        series = self._histograms.setdefault(name, {})
        hist = series.get(labels)
        if hist is None:
            hist = series[labels] = _Histogram(len(buckets))
        i = bisect.bisect_left(buckets, value)
        if i < len(buckets):
            hist.counts[i] += 1
        hist.sum += value
        hist.count += 1

    def value(self, name: str, labels: tuple) -> float:
        """A counter's value (0 where it was never counted)."""
        with self._lock:
            return self._counters.get(name, {}).get(labels, 0)

    def snapshot(self) -> tuple:
        """The counters and histograms as plain data (another process's :meth:`merge` takes it)."""
        with self._lock:
            counters = {name: dict(series) for name, series in self._counters.items()}
            histograms = {
                name: {labels: (list(h.counts), h.sum, h.count) for labels, h in series.items()}
                for name, series in self._histograms.items()
            }
        return counters, histograms

    def merge(self, snapshot: tuple) -> None:
        """Adds another process's :meth:`snapshot` to these metrics (the server's whole count)."""
        counters, histograms = snapshot
        with self._lock:
            for name, series in counters.items():
                amounts = self._counters.setdefault(name, {})
                for labels, amount in series.items():
                    amounts[labels] = amounts.get(labels, 0) + amount
            for name, series in histograms.items():
                hists = self._histograms.setdefault(name, {})
                for labels, (counts, total, count) in series.items():
                    hist = hists.get(labels)
                    if hist is None:
                        hist = hists[labels] = _Histogram(len(counts))
                    hist.counts = [a + b for a, b in zip(hist.counts, counts)]
                    hist.sum += total
                    hist.count += count

    def render(self) -> str:
        """Every metric in Prometheus's text format."""
        lines = []
        with self._lock:
            for name, (kind, text, label_names, *rest) in self._meta.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                if kind == "counter":
                    for values, amount in sorted(self._counters.get(name, {}).items()):
                        lines.append(f"{name}{_labels(label_names, values)} {_number(amount)}")
                    continue
                buckets = rest[0]
                for values, hist in sorted(self._histograms.get(name, {}).items()):
                    cumulative = 0
                    for bound, n in zip(buckets, hist.counts):
                        cumulative += n
                        lines.append(
                            f"{name}_bucket{_labels(label_names + ('le',), values + (_number(bound),))} {cumulative}"
                        )
                    lines.append(f"{name}_bucket{_labels(label_names + ('le',), values + ('+Inf',))} {hist.count}")
                    lines.append(f"{name}_sum{_labels(label_names, values)} {_number(hist.sum)}")
                    lines.append(f"{name}_count{_labels(label_names, values)} {hist.count}")
        for name, text, label_names, series in self.gauges() if self.gauges else []:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
            for values, amount in sorted(series.items()):
                lines.append(f"{name}{_labels(label_names, values)} {_number(amount)}")
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
