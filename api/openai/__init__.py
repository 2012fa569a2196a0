"""OpenAI's fine-tuning API, spoken by pdppo: `/v1/fine_tuning/...` in the shapes the official
`openai` SDK sends and reads, so that a script written for OpenAI's reinforcement fine-tuning
runs against pdppo with `base_url` changed.

These routes translate; they do not run jobs their own way. A create becomes a pdppo job spec
(`api.openai.translate`) submitted through `api.jobs.submission`, exactly as `POST /v1/jobs` does;
cancel, pause and resume call the native routes; the job, its events and its checkpoints are
read from the same store and shown in OpenAI's objects. Errors on these paths are OpenAI's error
object (`api.openai.errors`).

Imports: `api` (the native routes and schemas), `core.config` (graders), `pdppo`.
"""
