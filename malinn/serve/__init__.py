"""``malinn serve``: TensorFlow Serving's REST API for malinn models, with dynamic batching.

``config.py``: what is served and how (models, versions, batching, limits); ``signature.py``: a
model's named inputs and outputs; ``payload.py``: predict requests and answers as JSON;
``parse_workers.py`` (with ``worker_process.py``): large request bodies parsed in worker
processes, in parallel; ``batcher.py``: concurrent requests merged into one predict call;
``version_table.py``: which version answers a request, and the versions' statuses;
``servables.py``: versions loaded, switched and unloaded; ``metrics.py``: Prometheus metrics;
``app.py``: the REST API (Starlette); ``server.py``: the process (signals); ``front_process.py``:
uvicorn with graceful signals, and an HTTP front process's main (``--http-workers``);
``front_link.py``: a front's pipe to the process that owns the device; ``fronts.py``: that
process's side (the fronts started and restarted, their requests run, their metrics merged). Starlette and
uvicorn (the ``serve`` extra) are imported only when a server starts. docs/SERVING.md describes it.
"""
