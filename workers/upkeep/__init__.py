"""What every worker does beside its jobs, in threads of its own: repair what dead processes left
(`reaper`, which also dispatches the outbox), delete what ended jobs no longer need
(`retention`), and prove it is alive to its container's healthcheck (`heartbeat`)."""
