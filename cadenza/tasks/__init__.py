"""Feature-deletion task factory: source -> env -> features -> delete -> validate -> scrub -> Task."""
