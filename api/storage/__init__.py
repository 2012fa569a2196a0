"""The API's files: the artifact disk, uploads in, downloads out, and the paths a spec may read.

`disk`: room for an upload, `/readyz`'s report and the gauges; `uploads`: a multipart body
streamed to disk, never held whole; `tarstream`: a folder as a streamed .tar; `paths`: which
files on the workers a tenant's job spec may read.

Imports: `core.disk`, `pdppo` (files, settings, spec); nothing else from `api` (the routes use it).
"""
