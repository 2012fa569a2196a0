"""A job in the store: every change of its state, each a Lua script with the typed call that runs
it (`transitions`), and the front ends that choose the calls' values: what the API does to it
(`api_side`: create under the quota, read, list, cancel), what the worker holding it does
(`worker_side`: claim, publish, finish, requeue), its steering (`steering`: change, pause,
resume). Beside them: its record (`records`), its event stream (`events`), the outbox that makes
sure a queued job has a task (`outbox`), the fair order of the queued jobs (`fair`) and the
store's clock (`clock`)."""
