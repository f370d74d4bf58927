"""What a task must not leak and the proof that it does not: the secret (from gold.patch), the
leak scan and its file reader, and the scrubber that runs before the scan gates a task."""
