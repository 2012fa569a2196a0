"""What wraps every request: the HTTP limits uvicorn lacks, and the metrics the API serves.

`http_limits`: how long a request's head and body may take, and a 431 that arrives; `limits`:
413 for an oversized body before it is read; `observability`: the gateway's Prometheus metrics;
`service_metrics`: the service's state (jobs, queues, workers, leases) in `/metrics`.

Imports: `pdppo` (settings, the store); nothing else from `api` (the app and the routes use it).
"""
