"""What a run leaves behind and shows: the run directory (lock, flags.txt, atomic
files), results.json, rollbacks.json, TensorBoard summaries, progress lines, where
a profiled step's time went, and the export."""
