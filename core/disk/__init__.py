"""Files on disk: what every writer and reader of the artifact disk shares.

`storage`: the room a write may take and the error a refused write becomes (`Reserve`,
`StorageError`); `atomic_dir`: folders that appear whole or not at all; `safe_files`: opening a
user-named file without following it out of where it may be.

Imports: the standard library only, nothing else from `core`.
"""
