"""A job in the store: its record (`records`), what the API does to it (`api_side`: create under
the quota, read, list, cancel) and what the worker holding it does (`worker_side`: claim,
publish, finish, requeue), its steering (`steering`), its event stream (`events`), and the outbox
that makes sure a queued job has a task (`outbox`)."""
