"""From a source to deletion candidates: feature discovery by coverage, the baseline, libcst
deletion, the snippets a deletion leaves behind and the problem statement."""
