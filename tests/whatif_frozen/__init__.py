"""The replay and the fit search as they were before the replay was given its inline hot
loop (commit 29c678e): ``allocator.py``, ``replay.py`` and ``fit.py`` copied unchanged but
for their imports. ``test_whatif_frozen.py`` holds the current model to them, every field of
every replay, on many generated histories. Never edit them to follow a change: a change
that makes them disagree changes what the what-if predicts."""
