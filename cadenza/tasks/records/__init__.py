"""What a task set is and what is recorded about it: the task record, the SQLite store and
its schema, directory owners, the task pool, exports and the reports of the task commands."""
