"""Where a task's code comes from and how it runs: fetching a source, the bubblewrap isolation of
third-party code, the test runner, dependency discovery and the venvs."""
