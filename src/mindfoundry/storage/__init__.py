"""Where a path may be a URL: object storage (S3, Huawei OBS, MinIO; any installed fsspec protocol) beside local disk.

``remote.py`` reaches one URL through fsspec (s3fs for ``s3://``) and turns every failure into one line naming the URL
and the fix; ``location.py`` tells a URL from a local path; ``commit.py`` publishes a folder where there is no rename
(objects first, a marker with their sha256 last) and fetches a committed one; ``cache.py`` is the node-local folder
that fetched objects and staged uploads live in.
"""
