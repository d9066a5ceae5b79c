"""What a run hands back: diffs, the text/JSON/GitHub report, the project summary, rule docs and the
atomic writing of output files."""
