"""Whether a deletion makes a task: imports, FAIL_TO_PASS / PASS_TO_PASS and the gold patch
(validate), and the re-check of a published task (verify)."""
