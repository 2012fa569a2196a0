"""The training loop and its parts, from a `TrainConfig` to a trained model on disk.

Read in this order: `trainer`: `train()`, the entry point (`pdppo train`, a worker's job);
`run`: `TrainingRun`, the recipe (start or resume, the step loop, the final save; one step:
rollout, advantages, update, metrics) and the run's state; `update`: one step's optimizer updates
over its rollout batch; `callbacks`: the hooks a caller of `train()` gets, and the stop protocol
(`Stop`) the loop, the update and a caller share. Beside them: `warmup` (the steps before
training proper), `reference` (the KL penalty's reference policy), `evaluation` (held-out
evaluations), `checkpoint` (saving and resuming), `schedule` (learning-rate schedules),
`steering` (what a user may change while a job runs), `silence` (telling early that a run learns
nothing), `devices` (the device and its optimizer), `reporting` (the run reported to experiment
trackers, `core.tracking`).

Imports: any other package of `core`, this is the top of the tree: `core.config`, `core.disk`,
`core.process`, `core.objective`, `core.extras`, `core.graders`, `core.tasks`, `core.models`,
`core.budget`, `core.parallel`, `core.rollout`, `core.tracking`, `core.environments` (a
`task.name: environment` run's task). Nothing else in `core` imports it.
"""
