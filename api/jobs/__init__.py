"""The write path of a job: admission, submission, publishing its task, revoking it, and the
503 of a write whose answer never came; and the job record as the API shows it."""
