"""The user side of kperf: the typed HTTP client, the ``kperf`` command line and ``kperf sweep``.

Everything here talks to the service over HTTP (or to an in-process instance, built lazily);
``app/`` is the server alone.
"""
