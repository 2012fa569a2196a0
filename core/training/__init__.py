"""The training loop and its parts, from a `TrainConfig` to a trained model on disk.

`trainer`: `train()`, the entry point (`pdppo train`, a worker's job); `run`: one run's state and
its steps; `update`: one optimizer step over a batch of rollouts; `warmup`: the steps before
training proper; `reference`: the reference policy of the KL penalty; `evaluation`: held-out
evaluations; `checkpoint`: saving and resuming; `schedule`: learning-rate and other schedules;
`steering`: what a user may change while a job runs; `silence`: telling early that a run learns
nothing; `callbacks`: the hooks a caller of `train()` gets; `reporting`: the run reported to
experiment trackers (`core.tracking`).

Imports: any other package of `core`, this is the top of the tree: `core.config`, `core.disk`,
`core.process`, `core.objective`, `core.extras`, `core.graders`, `core.tasks`, `core.models`,
`core.budget`, `core.parallel`, `core.rollout`, `core.tracking`. Nothing else in `core` imports it.
"""
