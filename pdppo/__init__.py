"""pdppo: the shared pieces of the service (job spec, settings, client, CLI).

The trainer itself lives in `core`, the HTTP gateway in `api`, the Celery workers in `workers`.
"""

__version__ = "0.1.0"
