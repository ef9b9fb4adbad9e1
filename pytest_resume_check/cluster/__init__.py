"""Running the matrix on a Ray cluster (``--resume-matrix-ray``, docs/cluster.md).

:mod:`.wire` (stdlib only): what a group's pytest on a node reports of each cell, as JSON lines.
:mod:`.node`: a Ray task on a node: the group's own pytest session there, its records streamed back with
a failing cell's kept folders, nothing left behind. :mod:`.executor`: the pytest side: connecting,
refusing a target the cluster cannot run, one task per group of cells, each cell's outcome for its item,
cancelling at the end. :mod:`.testing`: a cluster of several nodes on this machine, for tests and
benchmarks. Importing any of them imports neither Ray nor torch.
"""
