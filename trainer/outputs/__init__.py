"""What a run leaves behind and shows: the run directory (lock, flags.txt, atomic
files), results.json, TensorBoard summaries, progress lines and the export."""
