"""``cadenza tasks build``: candidate ordering, one source's pipeline, its parallel validation, many
sources into one task set (factory), progress bars and the demo task set."""
