"""One training job on a worker: the task's supervision of it (`runner`), the process it trains in
(`process`, with its events and callback in `events`), the other ranks of a multi-device job
(`ranks`), its lease (`lease`), its steering changes (`config_watch`), its disk (`storage`) and
how it ended (`exits`)."""
