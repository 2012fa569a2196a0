"""Server-sent events: each job's event stream, from the store to every subscriber.

`events`: the hub, one reader per job feeding every subscriber, with the backlog in shared pages;
`sse_frames`: frames encoded once and cut into writes; `sse_stream`: one client's stream, backlog
then live, with no gap and no duplicate; `cancel`: cancelling a task that may be inside a Redis
call, so that it ends.

Imports: `pdppo` (settings, the store), `api.http` (its metrics); nothing else from `api` (the
routes use it).
"""
