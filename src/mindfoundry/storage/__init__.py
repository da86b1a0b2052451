"""Every place MindFoundry reads or writes, a local path or an object-storage URL (S3, Huawei OBS, MinIO; any installed
fsspec protocol), as one type.

``location.py`` is that type (:class:`~.location.Location`) and what a sealed folder and a claim are; ``resolve.py``
turns a path or a URL into one, the only place that tells them apart; ``local_path.py`` and ``remote.py`` are its two
kinds (a disk, and one URL through fsspec whose every failure is one line, ``failures.py``); ``commit.py`` is the one
commit protocol (a rename, or objects then a marker with their sha256; fetched copies verified); ``claim.py`` is one
writer at a time (an flock, or a lease); ``cache.py`` is the node-local folder that fetched objects and staged uploads
live in.
"""
