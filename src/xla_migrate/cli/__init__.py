"""The command line: arguments, many files (discovery, workers), config, notebooks."""
